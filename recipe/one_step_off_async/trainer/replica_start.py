"""The start-up's waits on Ray, bounded: the rollout replicas (begun while the training workers start), the training
pools' placement and the reward model's replicas.

verl starts the rollout after the actor so that vLLM sees the memory the actor left on a shared GPU. Here the pools
are disjoint (but for ``async_training.one_gpu``), so the replicas' start-up overlaps the actor's: the trainer begins
it in ``_init_worker_groups`` and takes the replicas in ``_init_async_rollout_manager``. verl waits on every
placement group without a timeout; here each wait lasts at most ``async_training.start_timeout_s``, then fails
naming the pool and what Ray reports free (the task runner first refuses pools no placement can fit,
``preflight.pools_unplaceable``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

import ray
from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.trainer.deadlines import call_with_deadline, in_background, wait_for

_log = logging.getLogger(__name__)


def _report_failed_start(start: Future) -> None:
    """Log a failed start-up at once: the trainer raises it only once the actor has started."""
    if start.exception() is not None:
        _log.error("The rollout replicas failed to start", exc_info=start.exception())


class ReplicaStart:
    """Starts verl's standalone replicas (``LLMServerManager.create``) in the background, or on demand; waits for
    them at most ``timeout_s``. ``free_resources`` is what Ray has free (``ray.available_resources``)."""

    def __init__(
        self,
        config: DictConfig,
        overlap: bool,
        timeout_s: float,
        free_resources: Callable[[], dict[str, float]] = ray.available_resources,
    ) -> None:
        self.config, self.overlap, self.timeout_s, self.free_resources = config, overlap, timeout_s, free_resources
        self._start: Future | None = None
        self._began = 0.0

    def begin(self) -> None:
        """Start the replicas on a thread of their own (when the pools are disjoint)."""
        if self.overlap:
            self._start = self._begin()
            self._start.add_done_callback(_report_failed_start)

    def servers(self):
        """The replicas begun with the actor (or their start-up's error), else started now; ``PipelineTimeoutError``
        when they are not up within ``timeout_s`` of the start-up's beginning."""
        start = self._start if self._start is not None else self._begin()
        return wait_for(start, max(0.0, self._began + self.timeout_s - time.monotonic()), self._timed_out)

    def _begin(self) -> Future:
        self._began = time.monotonic()
        return in_background(self._create, name="rollout-start")

    def _create(self):
        from verl.workers.rollout.llm_server import LLMServerManager

        # Standalone replicas on their own pool: LLMServerManager gets no worker group.
        return LLMServerManager.create(config=self.config)

    def _timed_out(self) -> str:
        return not_started(
            "rollout replicas", "actor_rollout_ref.rollout", self.config, self.timeout_s, self.free_resources
        )


def not_started(
    what: str, section: str, config: DictConfig, timeout_s: float, free_resources: Callable | None = None
) -> str:
    """Why a start-up wait ended: the pool of ``section`` (its nnodes x n_gpus_per_node) and what Ray has free."""
    pool, free = OmegaConf.select(config, section), (free_resources or ray.available_resources)()
    shown = ", ".join(f"{free[name]:g} {name}" for name in ("GPU", "NPU", "CPU") if name in free) or "nothing"
    return (
        f"The {what} did not start within {timeout_s:g} s (async_training.start_timeout_s): their pool, "
        f"{section}.nnodes x n_gpus_per_node = {pool.nnodes} x {pool.n_gpus_per_node} devices, is not placed yet or "
        f"its processes are still starting; Ray reports free: {shown}. Free the devices, make the pool smaller, or "
        "raise async_training.start_timeout_s for slow loads."
    )


def place_pools(config: DictConfig, pools: dict, timeout_s: float, device_name: str) -> None:
    """Place verl's training pools (``ResourcePoolManager.resource_pool_dict``) now, each within ``timeout_s``: the
    worker groups then take the groups placed (``RayResourcePool.get_placement_groups`` keeps them)."""
    for name, pool in pools.items():
        call_with_deadline(
            lambda pool=pool: pool.get_placement_groups(device_name=device_name),
            timeout_s,
            lambda name=name: not_started(f"training workers of verl's {name}", "trainer", config, timeout_s),
        )
