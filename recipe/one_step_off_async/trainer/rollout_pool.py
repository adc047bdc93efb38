"""The trainer's view of the rollout pool at step boundaries, and the fixed pool it uses by default.

The trainer tells its rollout pool when a step boundary is reached, when the replicas are idle before a
weight sync, and when the sync is done; the pool reports metrics and names a failure it caused. A
fixed pool (the default) changes nothing: its replicas serve for the whole run and a lost one fails
it. The elastic pool (``elastic/pool.py``, ``async_training.elastic.enable=true``) has the same methods
and changes who serves at those boundaries.
"""

from __future__ import annotations

from verl import DataProto


class FixedRolloutPool:
    """The replicas verl started serve until the run ends; nothing to apply at step boundaries."""

    def poll(self, step: int) -> None:
        pass

    def before_sync(self, step: int) -> None:
        pass

    def after_sync(self, step: int) -> None:
        pass

    def explain_failure(self, step: int) -> Exception | None:
        return None

    def batch_metrics(self, output: DataProto) -> dict[str, float]:
        return {}

    def metrics(self) -> dict[str, float]:
        return {}

    def publish(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass
