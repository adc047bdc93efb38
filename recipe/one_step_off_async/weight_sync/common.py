"""What the recipe's checkpoint engines share: one topology, the rank checks and the receiver's stream.

``SingleSourceEngine`` is the base of the ``gloo`` engine (``weight_sync.gloo``) and of the ``checkpoint``
engine (``weight_sync.files``). Both sync the same way around: actor rank 0 is the one source (it
broadcasts, or writes files); the other actor ranks only walk the weight generator (rank -1: producing
each full tensor is an FSDP all-gather that rank 0 also runs); rollout workers are ranks 1..N.
``ReceivedWeights`` is what both engines' ``receive_weights`` return.

The backends never import each other (an import-linter ``independence`` contract in ``pyproject.toml``);
what they share lives here. A backend names itself (``backend``), what actor rank 0's ``prepare()`` hands
every worker (``meeting_type``, passed to ``init_process_group`` as the keyword ``meeting_point``), and
implements prepare, init_process_group (setting ``self._rank``), send_weights, receive_weights and finalize.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any, ClassVar

import torch
from verl.checkpoint_engine.base import CheckpointEngine
from verl.workers.rollout.utils import ensure_async_iterator

NamedTensors = Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]]

SOURCE_RANK = 0  # actor rank 0's rank in a sync: the only worker that sends (or writes) the weights
DRAIN_RANK = -1  # every other actor worker's: it walks the weight generator and sends nothing


def engine_kwarg_key(backend: str, name: str) -> str:
    """The config key of an engine argument, for error messages that say what to set."""
    return f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{backend}.{name}"


async def drain(weights: NamedTensors) -> None:
    """Walk ``weights`` to the end, keeping nothing: each item may be an FSDP all-gather that the
    other actor ranks run too, so a rank that stops early leaves them waiting."""
    async for _ in ensure_async_iterator(weights):
        pass


class ReceivedWeights:
    """The weights of one sync as an async iterator of ``(name, tensor)``.

    Each tensor is valid only until the next ``__anext__`` (it may be a view into a reused buffer), as
    with verl's ``nccl`` engine: verl's vLLM server adapter copies it into place before asking for the
    next; ``.clone()`` what you keep. ``version`` is the weight version the actor stamped on the sync,
    set before the first tensor is yielded.
    """

    def __init__(self, receive: Callable[[ReceivedWeights], AsyncIterator[tuple[str, torch.Tensor]]]) -> None:
        self.version: int | None = None
        self._tensors = receive(self)

    def __aiter__(self) -> ReceivedWeights:
        return self

    async def __anext__(self) -> tuple[str, torch.Tensor]:
        return await self._tensors.__anext__()


class SingleSourceEngine(CheckpointEngine):
    """A verl ``CheckpointEngine`` whose one source is actor rank 0 (see the module docstring).

    Args:
        bucket_size: Bytes per bucket (verl passes ``update_weights_bucket_megabytes << 20``).
        is_master: True on actor rank 0, the source; its ``prepare()`` returns the meeting point.
        timeout_s: Upper bound in seconds on the waits of a sync.
    """

    backend: ClassVar[str]
    meeting_point: ClassVar[str]
    meeting_type: ClassVar[type]

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 300.0) -> None:
        if bucket_size <= 0:
            raise ValueError(
                f"bucket_size must be positive, got {bucket_size} bytes: set "
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes >= 1"
            )
        if not timeout_s > 0:
            raise ValueError(
                f"timeout_s must be positive, got {timeout_s!r}: set {engine_kwarg_key(self.backend, 'timeout_s')}"
            )
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.timeout_s = timeout_s
        self._rank: int | None = None  # in the sync joined (None outside a sync), set by init_process_group
        self._world_size = 0
        self._received: dict[str, float] = {}  # a rollout worker's split of its last receive

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[Any]
    ) -> tuple[dict[str, list], dict[str, list]]:
        """Actor rank 0 is the source (rank 0), the other actor ranks only drain (-1), rollout workers are 1..N."""
        meeting = metadata[0]
        if not isinstance(meeting, cls.meeting_type):
            raise ValueError(
                f"actor rank 0 returned {meeting!r} from prepare() instead of a {cls.meeting_type.__name__}: the "
                f"{cls.backend} engine on actor rank 0 must be built with is_master=True"
            )
        world_size = 1 + rollout_world_size

        def seats(ranks: list[int]) -> dict[str, list]:
            return {"rank": ranks, "world_size": [world_size] * len(ranks), cls.meeting_point: [meeting] * len(ranks)}

        return seats([SOURCE_RANK] + [DRAIN_RANK] * (actor_wg_world_size - 1)), seats(list(range(1, world_size)))

    def receive_metrics(self) -> dict[str, float]:
        """A rollout worker's split of its last sync (``{}`` before one completed, and on actor ranks), which the
        trainer's checkpoint manager collects (verl drops what ``receive_weights`` returns)."""
        return dict(self._received)

    def _rank_in_sync(self, method: str) -> int:
        if self._rank is None:
            raise RuntimeError(f"{method} before init_process_group: this {self.backend} engine is in no sync")
        return self._rank

    def _sending_rank(self) -> int:
        """``SOURCE_RANK`` or ``DRAIN_RANK``, the ranks that call ``send_weights``."""
        if self._rank_in_sync("send_weights") > SOURCE_RANK:
            raise RuntimeError(
                f"send_weights on rank {self._rank}: rollout workers receive weights, actor rank 0 sends"
            )
        return self._rank

    def _receiving_rank(self) -> int:
        """A rollout worker's rank (>= 1), the ranks that call ``receive_weights``."""
        if self._rank_in_sync("receive_weights") <= SOURCE_RANK:
            raise RuntimeError(f"receive_weights on actor rank {self._rank}: only rollout workers (ranks >= 1) receive")
        return self._rank
