"""What verl's generation step talks to when the trainer runs it on a generation that already finished.

The pipeline generated the step's batch ahead of time; the trainer still runs verl's own ``_fit_generate`` on
it, so the response mask, batch balancing, token counts and multi-modal lengths are verl's. Inside that call
the rollout manager is ``Replayed``: it hands back the finished output (verl's step then asks the weight-sync
manager to put the replicas to sleep, which the trainer's leaves generating: ``sync_manager``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from verl import DataProto


class Replayed:
    """Stands in for verl's ``AgentLoopManager``: returns the pipeline's output for the step's batch."""

    def __init__(self, output: DataProto) -> None:
        self.output = output

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if len(prompts) != len(self.output):
            raise ValueError(f"verl asked for {len(prompts)} samples; the pipeline generated {len(self.output)}")
        self.output.meta_info.setdefault("timing", {})  # verl's step reads it; an engine may report none
        return self.output


@contextlib.contextmanager
def replaying(trainer: Any, output: DataProto) -> Iterator[None]:
    """Within the block, ``trainer``'s verl generation step gets ``output`` (only the driver thread reads this
    attribute: the pipeline's thread holds its own reference to the real rollout manager)."""
    saved, trainer.async_rollout_manager = trainer.async_rollout_manager, Replayed(output)
    try:
        yield
    finally:
        trainer.async_rollout_manager = saved
