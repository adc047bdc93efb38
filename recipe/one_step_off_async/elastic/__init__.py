"""Elastic rollout pool (``async_training.elastic.enable=true``): ``pool``, ``client``, ``controller``."""
