"""What verl's generation step talks to when the trainer runs it on a generation that already finished.

The pipeline generated the step's batch ahead of time; the trainer still runs verl's own
``_fit_generate`` on it, so the response mask, batch balancing, token counts and multi-modal lengths
are verl's. Inside that call the rollout manager is ``Replayed`` (it hands back the finished output)
and the weight-sync manager is ``ReplicasStayAwake``: verl puts the replicas to sleep after a
generation to lend colocated GPUs to training, and verl's vLLM replica first waits for its requests to
drain, which here are the batches ahead of this one, generating on a disjoint pool.
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


class ReplicasStayAwake:
    """verl's weight-sync manager, except that ``sleep_replicas`` leaves the rollout pool generating."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)

    def sleep_replicas(self) -> None:
        pass


@contextlib.contextmanager
def replaying(trainer: Any, output: DataProto) -> Iterator[None]:
    """Within the block, ``trainer``'s verl generation step gets ``output`` and leaves the replicas awake.

    Only the driver thread reads these attributes: the pipeline's thread holds its own reference to
    the real rollout manager.
    """
    saved = trainer.async_rollout_manager, trainer.checkpoint_manager
    trainer.async_rollout_manager = Replayed(output)
    trainer.checkpoint_manager = ReplicasStayAwake(trainer.checkpoint_manager)
    try:
        yield
    finally:
        trainer.async_rollout_manager, trainer.checkpoint_manager = saved
