"""The weight-sync manager verl builds for the trainer: verl's ``CheckpointEngineManager``, every sync bounded and
timed, the replicas never put to sleep.

verl's ``init_workers`` builds it from ``actor_rollout_ref.rollout.checkpoint_manager_class``: the recipe's
``OneStepOffCheckpointManager``, or a user's subclass of it (``checkpoint_manager_class``; any other class is
refused before Ray starts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
from omegaconf import DictConfig
from verl.checkpoint_engine.base import CheckpointEngineManager
from verl.utils.ray_utils import auto_await

from recipe.one_step_off_async.trainer.configured_class import recipe_subclass
from recipe.one_step_off_async.trainer.deadlines import call_with_deadline

MANAGER_CLASS_KEY = "actor_rollout_ref.rollout.checkpoint_manager_class"

SYNC_TIMING = "timing_s/sync/"


class OneStepOffCheckpointManager(CheckpointEngineManager):
    """verl's weight-sync manager as the trainer uses it: every sync bounded and timed, the replicas never asleep.

    - ``update_weights`` fails with ``PipelineTimeoutError`` after ``async_training.sync_timeout_s``, and at once
      when a rollout engine dies (``trainer/deadlines.py``): verl's ``fit()`` syncs v_0 on the driver unbounded.
    - Its metrics add ``timing_s/sync/<phase>`` for each phase of verl's ``update_weights`` (the phases:
      docs/advance/one_step_off_async/weight_sync.md, "Where a sync's time goes"), measured by overriding the
      methods it calls on ``self`` (``PHASE_METHODS``), so verl's method runs unmodified. verl drops what the
      rollout workers return, so for an engine with ``receive_metrics()`` (the recipe's) it asks them afterwards
      and adds the slowest worker's numbers, timed as ``timing_s/sync/receiver_metrics``.
    - ``sleep_replicas`` does nothing. verl's generation step, which the trainer runs on the pipeline's finished
      output (``trainer/replay.py``), puts the replicas to sleep to lend colocated devices to training; here they
      are on a pool of their own and already generate the batches ahead.
    """

    PHASE_METHODS = (
        "abort_replicas",
        "release_kv_cache_replicas",
        "build_process_group",
        "resume_kv_cache_replicas",
        "resume_generation_replicas",
    )
    """What verl's ``update_weights`` calls on ``self``, in order (``tests/test_trainer_sync_manager_on_cpu.py``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: tuple[float, Callable[[], None]] | None = None
        self._spans: dict[str, tuple[float, float]] | None = None  # phase: (start, end) in the sync in progress
        self._rollout: Any = None  # that sync's rollout worker group (verl builds one per sync)

    def set_deadline(self, timeout_s: float, check: Callable[[], None]) -> None:
        """Bound every ``update_weights`` by ``timeout_s``; ``check`` runs every second while it waits, and may raise."""
        self._deadline = (timeout_s, check)

    def update_weights(self, global_steps: int | None = None) -> dict[str, float]:
        """The timed sync, bounded once the trainer set a deadline; called synchronously, as verl's trainer does."""
        if self._deadline is None:
            return self.timed_update_weights(global_steps)
        timeout_s, check = self._deadline
        return call_with_deadline(
            lambda: self.timed_update_weights(global_steps),
            timeout_s,
            lambda: (
                f"Syncing weights v{global_steps} from the actor to the rollout replicas did not finish within "
                f"{timeout_s:g} s (async_training.sync_timeout_s). A rollout worker or the checkpoint engine "
                f"({self.backend}) is stuck."
            ),
            check,
        )

    def timed_update_weights(self, global_steps: int | None) -> dict[str, float]:
        """verl's ``update_weights``, with the timing of its phases and the slowest receiver's metrics."""
        start = time.perf_counter()
        self._spans, self._rollout = {}, None
        try:
            metrics = super().update_weights(global_steps=global_steps) or {}
        finally:
            end, spans, self._spans = time.perf_counter(), self._spans, None
        return {**metrics, **self._receiver_metrics(), **_phase_metrics(spans, start, end)}

    def sleep_replicas(self) -> None:
        """The replicas stay awake: they generate the batches ahead (see the class docstring)."""

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            if self._spans is not None:  # phases called outside update_weights run untimed
                self._spans[name] = (begin, time.perf_counter())

    @auto_await
    async def abort_replicas(self, reject_request: bool = False) -> None:
        with self._phase("abort"):
            await super().abort_replicas(reject_request=reject_request)

    @auto_await
    async def release_kv_cache_replicas(self) -> None:
        with self._phase("release_kv"):
            await super().release_kv_cache_replicas()

    def build_process_group(self, rollout: Any) -> None:
        with self._phase("build_group"):
            super().build_process_group(rollout)
        self._rollout = rollout

    @auto_await
    async def resume_kv_cache_replicas(self) -> None:
        with self._phase("resume_kv"):
            await super().resume_kv_cache_replicas()

    @auto_await
    async def resume_generation_replicas(self) -> None:
        with self._phase("resume_generation"):
            await super().resume_generation_replicas()

    def _receiver_metrics(self) -> dict[str, float]:
        rollout, self._rollout = self._rollout, None
        if rollout is None or not hasattr(self.backend_cls, "receive_metrics"):
            return {}
        start = time.perf_counter()
        merged: dict[str, float] = {}
        for metrics in ray.get(rollout.execute_checkpoint_engine(["receive_metrics"] * rollout.world_size)):
            for key, value in metrics.items():
                merged[key] = max(value, merged.get(key, value))
        return {**merged, SYNC_TIMING + "receiver_metrics": time.perf_counter() - start}


def _phase_metrics(spans: dict[str, tuple[float, float]], start: float, end: float) -> dict[str, float]:
    seconds = {name: stop - begin for name, (begin, stop) in spans.items()}
    metrics = {name: seconds[name] for name in ("abort", "release_kv", "build_group") if name in seconds}
    resume = [seconds[name] for name in ("resume_kv", "resume_generation") if name in seconds]
    if resume:
        metrics["resume"] = sum(resume)
    # The gaps between phases, which verl fills with work of its own.
    if "abort" in spans and "release_kv" in spans:
        metrics["worker_group"] = spans["release_kv"][0] - spans["abort"][1]
    if "build_group" in spans and "resume_kv" in spans:
        metrics["transfer"] = spans["resume_kv"][0] - spans["build_group"][1]
    metrics["total"] = end - start
    return {SYNC_TIMING + name: value for name, value in metrics.items()}


def checkpoint_manager_class(config: DictConfig) -> type[OneStepOffCheckpointManager]:
    """The manager named by ``MANAGER_CLASS_KEY``: the recipe's, or a user's subclass of it (else ``ConfigError``)."""
    why = "the trainer bounds and times every sync through it, and keeps the replicas awake"
    return recipe_subclass(config, MANAGER_CLASS_KEY, OneStepOffCheckpointManager, why)
