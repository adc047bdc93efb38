"""The trainer's view of the rollout pool at step boundaries, and the fixed pool it uses by default.

The rollout pool is one of the trainer's features (``trainer/hooks.py``). A fixed pool (the default) changes
nothing: its replicas serve for the whole run and a lost one fails it. The elastic pool (``elastic/pool.py``,
``async_training.elastic.enable=true``) has the same hooks and changes who serves at those boundaries.
"""

from __future__ import annotations

from typing import Any

from recipe.one_step_off_async.async_config import AsyncTrainingConfig
from recipe.one_step_off_async.trainer.hooks import StepHooks


class FixedRolloutPool(StepHooks):
    """The replicas verl started serve until the run ends: nothing to apply at step boundaries, every hook a no-op."""


def rollout_pool(
    async_config: AsyncTrainingConfig,
    llm_server_manager: Any,
    checkpoint_manager: Any,
    controller: Any,
    experiment: str,
) -> StepHooks:
    """The fixed pool, or the elastic one over verl's started replicas (printing how to scale it)."""
    if not async_config.elastic.enable:
        return FixedRolloutPool()
    from verl.plugin.platform import get_platform

    from recipe.one_step_off_async.elastic.pool import ElasticRolloutPool

    pool = ElasticRolloutPool(
        async_config.elastic,
        llm_server_manager,
        checkpoint_manager,
        controller,
        device_resource=get_platform().ray_resource_name(),
    )
    print(pool.how_to_scale(experiment))
    return pool
