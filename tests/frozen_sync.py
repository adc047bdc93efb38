"""A fault for one run: rollout workers never finish receiving one weight version (the gloo engine).

Loaded into every process of the run through ``VERL_USE_EXTERNAL_MODULES`` (``faults.frozen_weight_sync``
sets it): verl imports it right after itself, before the recipe's gloo engine module is imported as the
checkpoint engine's ``custom_backend_module``, so this subclass stays registered as ``gloo``. For
version ``FAULTS_FREEZE_SYNC_VERSION`` the receiver waits forever, as a frozen rollout worker
would; every other sync is the recipe's engine unchanged. Never imported by the test process itself.
"""

from __future__ import annotations

import asyncio
import os

from verl.checkpoint_engine.base import CheckpointEngineRegistry

from recipe.one_step_off_async.weight_sync.gloo import GlooCheckpointEngine, ReceivedWeights


async def _never():
    await asyncio.Event().wait()
    yield  # an async generator that never produces


@CheckpointEngineRegistry.register("gloo")
class FrozenReceiverGlooEngine(GlooCheckpointEngine):
    def receive_weights(self, global_steps: int | None = None) -> ReceivedWeights:
        from faults import FREEZE_SYNC_ENV  # at sync time: faults imports verl, which imports this module

        if global_steps == int(os.environ[FREEZE_SYNC_ENV]):
            return ReceivedWeights(lambda _: _never())
        return super().receive_weights(global_steps)
