"""Elastic rollout pool (``async_training.elastic.enable=true``): which replicas serve, join, leave or were
lost, applied at step boundaries (``pool``); the agent loops' client that sends a lost replica's requests
again (``client``); the job's named controller actor behind ``python -m recipe.one_step_off_async.scale``
(``controller``)."""
