"""Generation running ``staleness`` batches ahead of training, behind the train-dataloader seam.

verl's ``fit()`` loop is ``for batch in self.train_dataloader: self.fit_step(batch)``. The trainer replaces its train
dataloader with a ``RolloutPipeline``: iterating it still yields one item per training step, in data order, but each
item's generation was launched ``staleness`` steps earlier (the contract: docs/advance/one_step_off_async/pipeline.md).
Generation runs on one background thread, so rollout work stays in data order; with ``concurrent_batches`` (partial
rollout) every batch in flight generates at once on a thread of its own. The pipeline also owns resumption: its
``state_dict()`` is the dataloader state from *before* the oldest batch not yet trained was drawn, so a resumed run
regenerates the batches that were in flight (verl's own state is taken after prefetching, which skips them).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto

from recipe.one_step_off_async.trainer.deadlines import wait_for

__all__ = ["Generated", "InFlightBatch", "RolloutPipeline", "expected_weight_version"]


def expected_weight_version(step: int, staleness: int, base: int, syncs_at: Callable[[int], bool]) -> int:
    """The weight version the batch of training step ``step`` is generated with: the contract.

    The batch of step k is launched right after step k-1-s ends, so it carries the last version synced at or before
    step k-1-s. ``base`` is the version the run started from (0, or N after a resume at step N, synced before the
    first step); ``syncs_at(j)`` says whether step j pushes its weights (every step with ``sync_interval`` 1).
    """
    return next((j for j in range(step - 1 - staleness, base, -1) if syncs_at(j)), base)


@dataclass(frozen=True)
class Generated:
    """What the rollout pool returned for one batch, with wall-clock bounds for the timeline."""

    output: DataProto
    started_at: float
    finished_at: float

    @property
    def seconds(self) -> float:
        return self.finished_at - self.started_at


@dataclass
class InFlightBatch:
    """One training step's batch: its prompts now, its generation when ``result()`` returns."""

    step: int
    epoch: int
    prompts: DataProto
    resume_state: dict[str, Any]
    future: concurrent.futures.Future

    def result(self, timeout_s: float, check: Callable[[], None] | None = None) -> Generated:
        """The generation, waited for at most ``timeout_s``; ``check()`` runs every second meanwhile and may raise."""
        return wait_for(
            self.future,
            timeout_s,
            lambda: (
                f"Generation of the batch for training step {self.step} did not finish within "
                f"{timeout_s:g} s (async_training.generation_timeout_s). The rollout replicas may be hung or "
                "overloaded; check their logs, or raise the timeout for very long generations."
            ),
            check,
        )


class RolloutPipeline:
    """A train-dataloader stand-in whose items are batches with generation already in flight.

    Args:
        dataloader: verl's stateful train dataloader (drop_last, sampler seeded for resumption).
        staleness: batches kept in flight while a step trains (0 = generate, then train).
        prepare: turns a collated dataloader dict into ``(batch, gen_batch)`` on the caller's thread.
        generate: runs one generation on the rollout pool (called on the pipeline's thread).
        total_epochs: epochs the training loop will iterate.
        concurrent_batches: generate the batches in flight at once (partial rollout) instead of one after another.
    """

    def __init__(
        self,
        dataloader: StatefulDataLoader,
        staleness: int,
        prepare: Callable[[dict, int], tuple[DataProto, DataProto]],
        generate: Callable[[DataProto], DataProto],
        total_epochs: int,
        concurrent_batches: bool = False,
    ) -> None:
        self.dataloader = dataloader
        self.staleness = staleness
        self._prepare = prepare
        self._generate = generate
        self._total_epochs = total_epochs
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=staleness + 1 if concurrent_batches else 1, thread_name_prefix="rollout-pipeline"
        )
        self._in_flight: deque[InFlightBatch] = deque()
        self._stream: Iterator[tuple[int, dict, dict]] | None = None
        self._start_epoch = self._stream_epoch = 0
        self._next_step = self.first_step = 1
        self._last_step = 0
        self._finished: deque[tuple[float, float]] = deque(maxlen=staleness + 2)  # (started_at, finished_at)
        self._data_exhausted = False

    def __len__(self) -> int:
        return len(self.dataloader)

    def start(self, first_step: int, last_step: int) -> None:
        """Bound the pipeline to training steps ``first_step..last_step`` (called once per ``fit``)."""
        self._next_step = self.first_step = first_step
        self._last_step = last_step

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def __iter__(self) -> Iterator[InFlightBatch]:
        """One epoch of training steps, as the parent's ``for epoch: for batch in dataloader`` expects."""
        self.launch_ahead()  # the first s+1 batches, with the weights synced before the first step
        if not self._in_flight:
            return
        epoch = self._in_flight[0].epoch
        while self._in_flight and self._in_flight[0].epoch == epoch:
            yield self._in_flight.popleft()
            if not self._in_flight and self._next_step <= self._last_step and not self._data_exhausted:
                raise RuntimeError(
                    "RolloutPipeline: nothing in flight for the next step; the trainer must call launch_ahead() "
                    "at the end of every step."
                )

    def launch_ahead(self) -> None:
        """Launch generations until s+1 batches are in flight (the one about to train and s ahead of it)."""
        while len(self._in_flight) < self.staleness + 1 and self._next_step <= self._last_step:
            drawn = next(self._data_stream(), None)
            if drawn is None:
                self._data_exhausted = True
                return
            epoch, resume_state, batch_dict = drawn
            step = self._next_step
            batch, gen_batch = self._prepare(batch_dict, step)
            future = self._executor.submit(self._timed_generate, gen_batch)
            self._in_flight.append(InFlightBatch(step, epoch, batch, resume_state, future))
            self._next_step += 1

    def _timed_generate(self, gen_batch: DataProto) -> Generated:
        started = time.time()
        generated = Generated(output=self._generate(gen_batch), started_at=started, finished_at=time.time())
        self._finished.append((generated.started_at, generated.finished_at))
        return generated

    def _data_stream(self) -> Iterator[tuple[int, dict, dict]]:
        if self._stream is None:
            self._stream = self._batches_across_epochs()
        return self._stream

    def _batches_across_epochs(self) -> Iterator[tuple[int, dict, dict]]:
        for epoch in range(self._start_epoch, self._total_epochs):
            self._stream_epoch = epoch
            iterator = iter(self.dataloader)
            while True:
                # The state *before* drawing is the resume point for a run that has trained
                # every batch up to, but not including, this one.
                state = {"epoch": epoch, "dataloader": self.dataloader.state_dict()}
                try:
                    batch_dict = next(iterator)
                except StopIteration:
                    break
                yield epoch, state, batch_dict

    def wait_idle(self, timeout_s: float, check: Callable[[], None] | None = None) -> None:
        """Block until no generation is running (before a weight sync or validation)."""
        deadline = time.monotonic() + timeout_s
        for batch in list(self._in_flight):
            batch.result(max(0.0, deadline - time.monotonic()), check)

    def busy_seconds(self, start: float, end: float) -> float:
        """Seconds of the window [start, end] in which at least one finished generation was running (generations of
        concurrent batches overlap: their union is counted, so the result never exceeds the window)."""
        clipped = sorted((max(start, s), min(end, f)) for s, f in list(self._finished) if min(end, f) > max(start, s))
        busy, covered_to = 0.0, start
        for begin, finish in clipped:
            busy += max(0.0, finish - max(begin, covered_to))
            covered_to = max(covered_to, finish)
        return busy

    def state_dict(self) -> dict[str, Any]:
        """Resume point: before the oldest batch not yet trained was drawn."""
        if self._in_flight:
            return self._in_flight[0].resume_state
        # Nothing in flight (the last step): resume right after the last batch drawn.
        return {"epoch": self._stream_epoch, "dataloader": self.dataloader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._stream is not None:
            raise RuntimeError("RolloutPipeline.load_state_dict must be called before iterating the pipeline.")
        if set(state) != {"epoch", "dataloader"}:
            raise ValueError(
                f"Dataloader state with keys {sorted(state)} was not written by this recipe's RolloutPipeline "
                "(expected 'epoch' and 'dataloader'); resume from a checkpoint of this recipe."
            )
        self._start_epoch = self._stream_epoch = int(state["epoch"])
        self.dataloader.load_state_dict(state["dataloader"])

    def close(self) -> None:
        """Drop batches not yet trained and stop the generation thread without waiting for it."""
        for batch in self._in_flight:
            batch.future.cancel()
        self._in_flight.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
