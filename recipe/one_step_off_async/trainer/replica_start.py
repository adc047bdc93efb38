"""The rollout replicas' start-up, begun while the training workers start and load the model.

verl starts the rollout after the actor so that vLLM sees the memory the actor left on a GPU they share. Here the
pools are disjoint (but for ``async_training.one_gpu``), so the replicas' start-up (vLLM: loading the weights,
capturing CUDA graphs) overlaps the actor's instead of following it. The trainer begins it in
``_init_worker_groups`` and takes the started replicas in ``_init_async_rollout_manager``.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from omegaconf import DictConfig

_log = logging.getLogger(__name__)


def _report_failed_start(start: Future) -> None:
    """Log a failed start-up at once: the trainer raises it only once the actor has started."""
    if start.exception() is not None:
        _log.error("The rollout replicas failed to start", exc_info=start.exception())


class ReplicaStart:
    """Starts verl's standalone replicas (``LLMServerManager.create``) in the background, or on demand."""

    def __init__(self, config: DictConfig, overlap: bool) -> None:
        self.config, self.overlap = config, overlap
        self._start: Future | None = None

    def begin(self) -> None:
        """Start the replicas on a thread of their own (when the pools are disjoint)."""
        if not self.overlap:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-start")
        # Standalone replicas on their own pool: LLMServerManager gets no worker group.
        self._start = executor.submit(self._create)
        self._start.add_done_callback(_report_failed_start)
        executor.shutdown(wait=False)  # its thread ends with the start; the future keeps the outcome

    def servers(self):
        """The replicas begun with the actor (or their start-up's error), else started now."""
        return self._start.result() if self._start is not None else self._create()

    def _create(self):
        from verl.workers.rollout.llm_server import LLMServerManager

        return LLMServerManager.create(config=self.config)
