"""Deadlines on the driver's waits: every wait fails with a named error instead of hanging.

verl's ``fit()`` waits forever on a hung rollout replica in its first weight sync and in validation. The trainer's
weight-sync manager bounds its syncs with ``call_with_deadline``, the rollout manager is wrapped once
(``BoundedRolloutManager``), the pipeline bounds its own waits with ``wait_for`` and so does the replicas' start-up
(``replica_start.ReplicaStart``): each fails after ``async_training``'s timeouts naming what was awaited, or at once
when a rollout engine dies (checked every ``CHECK_EVERY_S``). A call that times out keeps running on its daemon thread
until the process exits (a Ray call cannot be cancelled from the caller); the run fails right away and Ray tears the
workers down.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from recipe.one_step_off_async.errors import PipelineTimeoutError

T = TypeVar("T")
CHECK_EVERY_S = 1.0  # how often a wait checks the rollout engines (engine_health.EngineWatch)


def wait_for(
    future: concurrent.futures.Future,
    timeout_s: float,
    describe: Callable[[], str],
    check: Callable[[], None] | None = None,
) -> Any:
    """``future``'s result or exception, or ``PipelineTimeoutError(describe())`` after ``timeout_s``; ``check()``
    runs every ``CHECK_EVERY_S`` while waiting and may raise (a dead rollout engine ends the wait at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        poll = remaining if check is None else min(remaining, CHECK_EVERY_S)
        try:
            return future.result(timeout=max(0.0, poll))
        except concurrent.futures.TimeoutError:
            if poll >= remaining:
                raise PipelineTimeoutError(describe()) from None
        check()


def in_background(fn: Callable[[], T], name: str = "deadline-call") -> concurrent.futures.Future:
    """``fn()`` begun on a daemon thread (a call that hangs never holds the process at exit); its future."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as error:  # handed to the caller, not swallowed
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def call_with_deadline(
    fn: Callable[[], T], timeout_s: float, describe: Callable[[], str], check: Callable[[], None] | None = None
) -> T:
    """``fn()`` on a daemon thread; its result or exception, or ``PipelineTimeoutError(describe())``."""
    return wait_for(in_background(fn), timeout_s, describe, check)


class BoundedRolloutManager:
    """verl's ``AgentLoopManager`` whose ``generate_sequences`` fails after ``generation_timeout_s``; every other
    attribute is the wrapped manager's."""

    def __init__(self, manager: Any, timeout_s: float, check: Callable[[], None] | None = None) -> None:
        self.manager, self.timeout_s, self.check = manager, timeout_s, check

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)

    def generate_sequences(self, prompts: Any) -> Any:
        purpose = "validation" if prompts.meta_info.get("validate") else "training"
        step = prompts.meta_info.get("global_steps")
        return call_with_deadline(
            lambda: self.manager.generate_sequences(prompts),
            self.timeout_s,
            lambda: (
                f"Generation of the batch for {purpose} step {step} did not finish within {self.timeout_s:g} s "
                f"(async_training.generation_timeout_s; {len(prompts)} samples). The rollout replicas may be hung "
                "or overloaded; check their logs, or raise the timeout for very long generations."
            ),
            self.check,
        )
