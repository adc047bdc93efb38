"""Where a weight sync's time goes: verl's ``CheckpointEngineManager`` with each phase timed.

What: ``TimedCheckpointEngineManager`` is verl's manager (``verl/checkpoint_engine/base.py``) with
the phase methods its ``update_weights`` calls wrapped in timers. It adds to the metrics dict
``update_weights`` returns (the trainer merges that dict into the step's metrics):

    timing_s/sync/abort         abort_replicas: pause generation on every replica
    timing_s/sync/worker_group  verl builds a temporary RayWorkerGroup of the rollout workers
    timing_s/sync/release_kv    release_kv_cache_replicas
    timing_s/sync/build_group   build_process_group: prepare on every worker, build_topology,
                                init_process_group on every worker
    timing_s/sync/transfer      send_weights | receive_weights + load into the rollout model, then
                                finalize on every worker (verl issues both inline, back to back,
                                so finalize is not separable from the driver; the engine reports
                                its own parts, below)
    timing_s/sync/resume        resume_kv_cache_replicas + resume_generation_replicas
    timing_s/sync/total         the whole update_weights call

The engine's own metrics (``checkpoint_engine/*``) come from the sender's ``send_weights``, which
verl merges into the same dict. verl drops what the rollout workers return, so when the engine
class has a ``receive_metrics()`` method (both recipe engines have it, from ``weight_sync.common``)
this manager asks each rollout worker for it after the sync and adds the slowest worker's numbers;
that extra round trip is timed as ``timing_s/sync/receiver_metrics`` and is not part of ``total``.

Why: a sync of a tiny model costs a fixed ~0.4 s on GPUs and ~0.05 s on CPU; this says which
phase it goes to, without copying verl's ``update_weights`` (the phases are methods it calls on
``self``; ``tests/test_weight_sync_timing_on_cpu.py`` fails when verl's call list changes).

How: the recipe's base config selects it
(``actor_rollout_ref.rollout.checkpoint_manager_class=recipe.one_step_off_async.weight_sync.timing.TimedCheckpointEngineManager``);
set that key to null to use verl's manager unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray
from verl.checkpoint_engine.base import CheckpointEngineManager
from verl.utils.ray_utils import auto_await

__all__ = ["PHASE_METHODS", "TimedCheckpointEngineManager"]

PHASE_METHODS = (
    "abort_replicas",
    "release_kv_cache_replicas",
    "build_process_group",
    "resume_kv_cache_replicas",
    "resume_generation_replicas",
)
"""The methods of ``self`` that verl's ``CheckpointEngineManager.update_weights`` calls, in order."""

PREFIX = "timing_s/sync/"


@dataclass
class _SyncClock:
    """``perf_counter`` start and end of each phase of one sync."""

    start: float
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    rollout: Any = None
    """The sync's rollout worker group (verl builds one per sync), to ask for receiver metrics."""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.spans[name] = (begin, time.perf_counter())

    def metrics(self, end: float) -> dict[str, float]:
        spans = self.spans
        seconds = {name: stop - begin for name, (begin, stop) in spans.items()}
        metrics = {
            "abort": seconds.get("abort"),
            "release_kv": seconds.get("release_kv"),
            "build_group": seconds.get("build_group"),
            "resume": _sum(seconds.get("resume_kv"), seconds.get("resume_generation")),
            "total": end - self.start,
        }
        # The gaps between phases that verl fills with work of its own.
        if "abort" in spans and "release_kv" in spans:
            metrics["worker_group"] = spans["release_kv"][0] - spans["abort"][1]
        if "build_group" in spans and "resume_kv" in spans:
            metrics["transfer"] = spans["resume_kv"][0] - spans["build_group"][1]
        return {PREFIX + name: value for name, value in metrics.items() if value is not None}


def _sum(*values: float | None) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


class TimedCheckpointEngineManager(CheckpointEngineManager):
    """verl's ``CheckpointEngineManager`` whose ``update_weights`` also returns its phase timings.

    Phases called outside ``update_weights`` (e.g. a trainer calling ``abort_replicas`` itself) run
    untimed. The overrides keep verl's ``@auto_await`` call styles: awaited, or called from
    synchronous code.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock: _SyncClock | None = None

    @auto_await
    async def update_weights(self, global_steps: int | None = None) -> dict[str, float]:
        clock = self._clock = _SyncClock(start=time.perf_counter())
        try:
            metrics = await super().update_weights(global_steps=global_steps)
        finally:
            self._clock = None
        timings = clock.metrics(end=time.perf_counter())
        return {**(metrics or {}), **self._receiver_metrics(clock.rollout), **timings}

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        if self._clock is None:
            yield
            return
        with self._clock.phase(name):
            yield

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
        if self._clock is not None:
            self._clock.rollout = rollout

    @auto_await
    async def resume_kv_cache_replicas(self) -> None:
        with self._phase("resume_kv"):
            await super().resume_kv_cache_replicas()

    @auto_await
    async def resume_generation_replicas(self) -> None:
        with self._phase("resume_generation"):
            await super().resume_generation_replicas()

    def _receiver_metrics(self, rollout: Any) -> dict[str, float]:
        """The slowest rollout worker's ``receive_metrics()``, for engines that keep them."""
        if rollout is None or not hasattr(self.backend_cls, "receive_metrics"):
            return {}
        start = time.perf_counter()
        per_worker = ray.get(rollout.execute_checkpoint_engine(["receive_metrics"] * rollout.world_size))
        merged: dict[str, float] = {}
        for metrics in per_worker:
            for key, value in metrics.items():
                merged[key] = max(value, merged.get(key, value))
        merged[PREFIX + "receiver_metrics"] = time.perf_counter() - start
        return merged
