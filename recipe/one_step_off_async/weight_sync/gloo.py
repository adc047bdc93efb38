"""The ``gloo`` checkpoint engine: verl weight sync from the actor to the rollout workers on CPU.

verl pushes new actor weights to disaggregated rollout workers through a ``CheckpointEngine``
(``verl/checkpoint_engine``). Its ``nccl`` engine needs CUDA and cupy; this engine is the CPU
counterpart with the same topology and lifecycle, so the one-step-off trainer runs the same code on
both paths and only the configured backend differs:

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=300  # optional; the default

(``+`` because verl's default ``engine_kwargs`` is empty; drop it where a YAML already sets the key.) The
recipe's verl plugin registers the engine in every process, so the backend name is all a config needs.

How a sync runs (verl's ``CheckpointEngineManager`` calls prepare, build_topology,
init_process_group, send_weights | receive_weights, finalize on every sync):

- Topology (``SingleSourceEngine``, ``weight_sync.common``, shared with the ``checkpoint`` engine):
  actor rank 0 is rank 0 of a gloo group and the only sender; rollout workers are ranks 1..N. The
  other actor ranks stay out of the group (rank -1) but still walk the weight generator, because
  producing each full tensor is an FSDP all-gather that rank 0 is also running.
- The group is a standalone ``ProcessGroupGloo`` over a ``TCPStore`` that actor rank 0 hosts on a
  port the OS picks in its first ``prepare()``. It never touches the default process group (FSDP's).
- The group is kept across syncs (engine kwarg ``keep_group``, default true): verl calls prepare,
  init_process_group and finalize on every sync, and building a group (a full mesh of TCP
  connections) was most of a small model's sync time on CPU. In ``init_process_group`` every rank
  of the sync posts, on the store, which group it holds (the one it built, if its rank and the world
  size are unchanged); only when all ranks hold the same one is it reused, else every rank drops its
  own and they build a new one under a fresh key. So a restarted or added worker, a changed world
  size or a sync that failed on any rank (a failing rank drops its group and, on actor rank 0, the
  store) all lead to a fresh group, and no rank can wait for a peer that went another way.
  ``finalize()`` keeps the group; ``close()`` (or ``keep_group=false``, for which finalize closes)
  releases its sockets, threads and, on actor rank 0, the store's port.
- Weights travel in buckets of at most ``update_weights_bucket_megabytes``; tensors larger than a
  bucket are split into bucket-sized chunks (verl's ``split_weight_chunks``) and reassembled.
  Double buffering on both sides: the sender packs bucket i+1 into one of two buffers while
  bucket i is broadcast from the other, and a receiver receives bucket i+1 into one of its two
  buffers while its consumer copies bucket i's tensors out of the other. The two buffers are kept
  between syncs (2 x bucket size of RAM on actor rank 0 and on each rollout worker): paging fresh
  ones in every sync halved the throughput. Tensors start at 64-byte aligned offsets in a bucket,
  so that the receiver can view them in their own dtype.
- Each bucket is preceded, in-band on the same group, by a small pickled ``BucketHeader``: its
  index, byte count, tensor layout and the weight version (``global_steps``) of the sync. A
  receiver that was told which version to expect fails on any other; ``ReceivedWeights.version``
  (``weight_sync.common``) tells the rollout's server adapter which version it loaded.
- Every collective is bounded by ``timeout_s`` (engine kwarg): a receiver that dies or stalls makes
  the sender raise ``WeightSyncError`` naming the sync and the bucket, instead of hanging.
- Where the time goes: ``send_weights`` returns, besides payload and ``send_s``, the sender's split
  (``produce_s``: waiting for the weights generator, i.e. the actor's all-gathers; ``wire_wait_s``:
  waiting for broadcasts; ``pack_s``: the rest, mostly copying into buckets) and this sync's
  ``group_s`` / ``group_reused``. A rollout worker keeps its own split of the last sync
  (``recv_wire_wait_s``, ``recv_load_s``: the consumer loading tensors into the model) for
  ``receive_metrics()`` (``weight_sync.common``), which ``weight_sync.timing`` collects.

The receiver yields ``(name, tensor)`` in the dtype and shape the actor sent, under the contract of
verl's ``nccl`` engine (``NCCLCheckpointEngine.receive_weights``): **a yielded tensor is valid only
until the consumer asks for the next item.** A tensor that fits in a bucket is a view into a receive
buffer that a later bucket overwrites; only a tensor larger than a bucket, reassembled from its
chunks, is yielded as memory of its own. So a consumer copies each tensor where it belongs before
it pulls the next one, as verl's vLLM server adapter and ``HFServerAdapter.update_weights``
(``rollout/hf/server.py``) do, and ``.clone()``s whatever it keeps. This spares the receiver a copy and
fresh pages for every tensor; ``python -m benchmarks gloo-engine`` compares a sync, loaded into a model
as a server adapter does, with a raw gloo broadcast of the same bytes.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import ray
import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import CheckpointEngineRegistry, TensorMeta, split_weight_chunks
from verl.workers.rollout.utils import ensure_async_iterator

from recipe.one_step_off_async.errors import WeightSyncError
from recipe.one_step_off_async.weight_sync.common import (
    DRAIN_RANK,
    SOURCE_RANK,
    NamedTensors,
    ReceivedWeights,
    SingleSourceEngine,
    drain,
)

__all__ = ["BucketHeader", "GlooCheckpointEngine", "StoreAddress"]

logger = logging.getLogger(__name__)

ALIGNMENT = 64
"""Bytes: every tensor (chunk) starts at a multiple of this in a bucket, so that the receiver can view
it in any dtype (``Tensor.view(dtype)`` needs an offset divisible by the item size)."""


@dataclass(frozen=True)
class StoreAddress:
    """Where the workers of one sync meet: the ``TCPStore`` that actor rank 0 hosts."""

    host: str
    port: int
    sync: int = 0
    """Actor rank 0's count of ``prepare()`` calls: names this sync's keys on the store."""


@dataclass(frozen=True)
class BucketHeader:
    """What a receiver needs to unpack one bucket; broadcast right before the bucket's bytes."""

    version: int | None
    """The weight version (trainer ``global_steps``) of the sync; the same in every bucket."""
    index: int
    """Position of the bucket in the sync, from 0."""
    nbytes: int
    """Bytes of payload that follow."""
    is_last: bool
    tensors: tuple[TensorMeta, ...]
    """Layout of the payload: one entry per tensor or tensor chunk, at ``offset`` in the bucket."""


@dataclass(frozen=True)
class _GroupKey:
    """Which group an engine holds: its seat in it and the sync that built it (the store key)."""

    rank: int
    world_size: int
    sync: int

    def same_seat(self, other: _GroupKey) -> bool:
        return (self.rank, self.world_size) == (other.rank, other.world_size)


@CheckpointEngineRegistry.register("gloo")
class GlooCheckpointEngine(SingleSourceEngine):
    """Broadcast actor weights to rollout workers over a gloo group on CPU.

    Args:
        bucket_size: Bytes per bucket (verl passes ``update_weights_bucket_megabytes << 20``). Actor
            rank 0 and each rollout worker keep two bucket buffers from their first sync on.
        is_master: True on actor rank 0, which hosts the group's store and sends the weights.
        timeout_s: Upper bound in seconds on joining the group and on every collective of a sync.
        keep_group: Keep the gloo group (and store) from one sync to the next while every rank
            still holds it; False builds a fresh one in every sync and drops it in ``finalize()``.
    """

    backend = "gloo"
    meeting_point = "store_address"
    meeting_type = StoreAddress

    def __init__(
        self, bucket_size: int, is_master: bool = False, timeout_s: float = 300.0, keep_group: bool = True
    ) -> None:
        super().__init__(bucket_size, is_master=is_master, timeout_s=timeout_s)
        self.keep_group = keep_group
        self._timeout = timedelta(seconds=timeout_s)
        self._syncs = 0
        self._prepared = 0
        self._store: dist.TCPStore | None = None
        self._store_address: tuple[str, int] | None = None
        self._group: dist.ProcessGroupGloo | None = None
        self._group_key: _GroupKey | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._join: dict[str, float] = {}
        self._wire_wait_s = 0.0  # of the receive in progress
        self._last_sync = 0  # the latest StoreAddress.sync joined
        self._posted: str | None = None  # this rank's key on the store from the latest sync

    def prepare(self) -> StoreAddress | None:
        """Return the store's address on actor rank 0 (opened on first use); other workers return None."""
        if not self.keep_group:
            self._close_group()
        if not self.is_master:
            return None
        if self._store is None:
            host = ray.util.get_node_ip_address().strip("[]")
            # Port 0: the OS picks a free port while binding, so no other process can take it
            # between choosing and binding.
            self._store = dist.TCPStore(host, 0, is_master=True, timeout=self._timeout, wait_for_workers=False)
            self._store_address = (host, self._store.port)
        self._prepared += 1
        host, port = self._store_address
        return StoreAddress(host=host, port=port, sync=self._prepared)

    def init_process_group(self, rank: int, world_size: int, store_address: StoreAddress) -> None:
        """Join this sync's gloo group: the one every rank still holds, or a new one (blocks until all
        ``world_size`` ranks joined, or timeout)."""
        self._syncs += 1
        self._rank, self._world_size = rank, world_size
        if rank == DRAIN_RANK:
            return
        if rank == SOURCE_RANK and self._store is None:
            raise RuntimeError("init_process_group(rank=0) before prepare(): the sender hosts the store")
        start = time.perf_counter()
        allocate_s = 0.0
        try:
            address = (store_address.host, store_address.port)
            # A sync number that did not grow: a new actor rank 0 (its count restarted) on the same port.
            new_store = self._store_address != address or store_address.sync <= self._last_sync
            if rank != SOURCE_RANK and new_store:
                self._close_group()
                self._store = dist.TCPStore(*address, is_master=False, timeout=self._timeout)
                self._store_address = address
            self._last_sync = store_address.sync
            key = _GroupKey(rank=rank, world_size=world_size, sync=store_address.sync)
            if not self._all_hold_my_group(key):
                self._group, self._group_key = None, None  # drop the old one before joining the next
                prefixed = dist.PrefixStore(f"group/{key.sync}", self._store)
                # Uses GLOO_SOCKET_IFNAME when set, like torch's default gloo group.
                self._group = dist.ProcessGroupGloo(prefixed, rank, world_size, self._timeout)
                self._group_key = key
                reused = False
            else:
                reused = True
        except RuntimeError as error:
            self._close_group()
            raise WeightSyncError(
                f"gloo weight sync #{self._syncs}: rank {rank} could not join the {world_size}-rank group at "
                f"{store_address.host}:{store_address.port} within timeout_s={self.timeout_s}. A peer did not "
                "reach init_process_group (check the other workers' logs), or this host cannot reach that "
                f"address (set GLOO_SOCKET_IFNAME). Cause: {error}"
            ) from error
        if self._buffers is None:
            allocated = time.perf_counter()
            # Kept across syncs: fresh buffers are paged in again on every sync, which halved the
            # throughput of a 300 MB sync in the gloo-engine benchmark.
            self._buffers = (
                torch.empty(self.bucket_size, dtype=torch.uint8),
                torch.empty(self.bucket_size, dtype=torch.uint8),
            )
            allocate_s = time.perf_counter() - allocated
        self._join = {
            "checkpoint_engine/group_s": time.perf_counter() - start,
            "checkpoint_engine/group_reused": float(reused),
            "checkpoint_engine/allocate_s": allocate_s,
        }

    def _all_hold_my_group(self, key: _GroupKey) -> bool:
        """Post which group this rank holds for ``key``'s rank and world size, then read every rank's
        post for this sync: True only if all hold the same group (then it is reused)."""
        mine = self._group_key
        held = mine.sync if self._group is not None and mine is not None and mine.same_seat(key) else -1
        keys = [f"sync/{key.sync}/holds/{rank}" for rank in range(key.world_size)]
        if self._posted is not None:
            # Every rank read it before the previous sync's init_process_group returned.
            self._store.delete_key(self._posted)
        self._store.set(keys[key.rank], str(held))
        self._posted = keys[key.rank]
        self._store.wait(keys, self._timeout)
        return held >= 0 and all(int(value) == held for value in self._store.multi_get(keys))

    def finalize(self) -> None:
        """End this sync. The group stays for the next sync unless ``keep_group`` is false; then its
        sockets, gloo threads and (on actor rank 0) the store's port are released now."""
        if not self.keep_group:
            self._close_group()
        self._rank = None

    def close(self) -> None:
        """Release the group and the store (its port, on actor rank 0) now; the next sync builds anew."""
        self._close_group()
        self._rank = None

    @torch.no_grad()
    async def send_weights(self, weights: NamedTensors, global_steps: int | None = None) -> dict[str, float]:
        """Broadcast ``weights`` to the rollout workers (actor rank 0); drain them (other actor ranks).

        Returns the sync's metrics on the sender, ``{}`` on the other actor ranks.
        """
        if self._sending_rank() != SOURCE_RANK:
            await drain(weights)
            return {}

        pipeline = _SendPipeline(
            self._buffers,
            self._broadcast,
            describe=f"gloo weight sync #{self._syncs} (weight version {global_steps})",
            receivers=self._world_size - 1,
            timeout_s=self.timeout_s,
            version=global_steps,
        )
        offset, metas = 0, []
        produce_s, produce_start = 0.0, time.perf_counter()
        try:
            async for meta, chunk in split_weight_chunks(_contiguous(weights), self.bucket_size):
                produce_s += time.perf_counter() - produce_start
                start = -(-offset // ALIGNMENT) * ALIGNMENT
                if start + meta.chunk_size > self.bucket_size:
                    await pipeline.send(offset, metas, is_last=False)
                    start, metas = 0, []
                # Copied now, while the generator has not moved on: it may reuse a tensor's memory.
                pipeline.buffer[start : start + meta.chunk_size].copy_(chunk)
                meta.offset = start
                metas.append(meta)
                offset = start + meta.chunk_size
                produce_start = time.perf_counter()
            produce_s += time.perf_counter() - produce_start
            await pipeline.send(offset, metas, is_last=True)
            await pipeline.drain()
        except BaseException:
            # Let go of every pending broadcast, so closing the group closes its sockets now and the
            # receivers fail at once instead of at their timeout.
            pipeline.abandon()
            self._close_group()
            raise

        seconds = time.perf_counter() - pipeline.start
        logger.info(
            "gloo weight sync #%d (version %s): sent %.1f MiB in %d buckets to %d workers in %.2fs",
            self._syncs,
            global_steps,
            pipeline.sent_bytes / 2**20,
            pipeline.buckets,
            self._world_size - 1,
            seconds,
        )
        return {
            "checkpoint_engine/payload_mbytes": pipeline.sent_bytes / 2**20,
            "checkpoint_engine/buckets": float(pipeline.buckets),
            "checkpoint_engine/send_s": seconds,
            "checkpoint_engine/produce_s": produce_s,
            "checkpoint_engine/wire_wait_s": pipeline.wait_s,
            "checkpoint_engine/pack_s": max(0.0, seconds - produce_s - pipeline.wait_s),
            **self._join,
        }

    def receive_weights(self, global_steps: int | None = None) -> ReceivedWeights:
        """The weights the actor broadcasts in this sync (rollout workers).

        Same contract as verl's ``NCCLCheckpointEngine.receive_weights``: each yielded tensor is
        valid only until the consumer asks for the next item. Tensors that fit in a bucket are
        views into one of two receive buffers, which later buckets overwrite: while the consumer
        copies bucket i's tensors out of one buffer, bucket i+1 is received into the other, and
        bucket i's buffer is reused (for bucket i+2) once the consumer asked for the item after
        bucket i's last tensor. A tensor larger than a bucket is reassembled into memory of its own.
        Copy each tensor into place, or ``.clone()`` it, before pulling the next.

        Args:
            global_steps: The weight version the trainer announced for this sync. When given, a sync
                stamped with any other version fails with ``WeightSyncError``.
        """
        self._receiving_rank()  # raises on actor ranks
        return ReceivedWeights(lambda stream: self._receive_tensors(global_steps, stream))

    def _broadcast(self, tensor: torch.Tensor) -> dist.Work:
        options = dist.BroadcastOptions()
        options.rootRank = SOURCE_RANK
        return self._group.broadcast([tensor], options)

    async def _receive_tensors(
        self, expected_version: int | None, stream: ReceivedWeights
    ) -> AsyncIterator[tuple[str, torch.Tensor]]:
        start = time.perf_counter()
        self._received, self._wire_wait_s, load_s = {}, 0.0, 0.0
        arriving: dict[str, torch.Tensor] = {}
        pending: _Pending | None = None
        try:
            header = await self._receive_header(0, expected_version, start)
            stream.version = header.version
            slot = 0
            pending = self._receive_payload(header, self._buffers[slot])
            while True:
                await self._wait_received(pending, start)
                if not header.is_last:
                    # Post the next bucket before unpacking this one: it arrives meanwhile.
                    next_header = await self._receive_header(header.index + 1, header.version, start)
                    pending = self._receive_payload(next_header, self._buffers[1 - slot])
                # Views into this buffer: it is posted again (for bucket i+2) only after the
                # consumer asked for the item after this bucket's last tensor.
                for name, tensor in self._unpack(header, self._buffers[slot], arriving):
                    handed = time.perf_counter()
                    yield name, tensor
                    load_s += time.perf_counter() - handed
                if header.is_last:
                    break
                header, slot = next_header, 1 - slot
        except BaseException:
            # Let go of the pending receive, so closing the group closes its sockets now and the
            # sender fails at once instead of at its timeout.
            if pending is not None:
                pending.works.clear()
            self._close_group()
            raise
        seconds = time.perf_counter() - start
        self._received = {
            "checkpoint_engine/recv_s": seconds,
            "checkpoint_engine/recv_wire_wait_s": self._wire_wait_s,
            "checkpoint_engine/recv_load_s": load_s,
            "checkpoint_engine/recv_group_s": self._join.get("checkpoint_engine/group_s", 0.0),
        }
        logger.info(
            "gloo weight sync #%d (version %s): rank %d received %d buckets in %.3fs (%.3fs waiting for "
            "the wire, %.3fs in the consumer loading tensors)",
            self._syncs,
            header.version,
            self._rank,
            header.index + 1,
            seconds,
            self._wire_wait_s,
            load_s,
        )

    async def _receive_header(self, index: int, expected_version: int | None, start: float) -> BucketHeader:
        length = torch.empty(1, dtype=torch.int64)
        await self._wait_received(_Pending(index=index, works=[self._broadcast(length)]), start)
        encoded = torch.empty(int(length.item()), dtype=torch.uint8)
        await self._wait_received(_Pending(index=index, works=[self._broadcast(encoded)]), start)
        header: BucketHeader = pickle.loads(encoded.numpy().tobytes())
        if header.index != index:
            raise WeightSyncError(
                f"gloo weight sync #{self._syncs}: expected bucket {index} but actor rank 0 sent bucket "
                f"{header.index}: the sender and this receiver are out of step"
            )
        if expected_version is not None and header.version != expected_version:
            raise WeightSyncError(
                f"gloo weight sync #{self._syncs}: this rollout worker was told to load weight version "
                f"{expected_version} but actor rank 0 sent version {header.version} (bucket {index}): the "
                "trainer and the rollout disagree on which step's weights are being synced"
            )
        return header

    def _receive_payload(self, header: BucketHeader, buffer: torch.Tensor) -> _Pending:
        return _Pending(index=header.index, works=[self._broadcast(buffer[: header.nbytes])])

    def _unpack(
        self, header: BucketHeader, buffer: torch.Tensor, arriving: dict[str, torch.Tensor]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield each tensor that a received bucket completes.

        A tensor that lies whole in the bucket is a view into ``buffer``, as in verl's
        ``merge_weight_chunks``. The chunks of a larger tensor are copied into one tensor allocated
        at its first chunk and kept in ``arriving`` until its last chunk arrived.
        """
        for meta in header.tensors:
            chunk = buffer[meta.offset : meta.offset + meta.chunk_size]
            if meta.chunk_size == meta.shape.numel() * meta.dtype.itemsize:
                yield meta.name, chunk.view(meta.dtype).view(meta.shape)
                continue
            if meta.chunk_offset == 0:
                arriving[meta.name] = torch.empty(meta.shape, dtype=meta.dtype)
            elif meta.name not in arriving:
                raise WeightSyncError(
                    f"gloo weight sync #{self._syncs}: bucket {header.index} continues {meta.name!r} at byte "
                    f"{meta.chunk_offset}, but its first chunk never arrived: the sender's chunk order is broken"
                )
            tensor = arriving[meta.name]
            tensor.view(-1).view(torch.uint8)[meta.chunk_offset : meta.chunk_offset + meta.chunk_size].copy_(chunk)
            if meta.chunk_offset + meta.chunk_size == tensor.nbytes:
                yield meta.name, arriving.pop(meta.name)

    async def _wait_received(self, pending: _Pending, start: float) -> None:
        waited = time.perf_counter()
        try:
            await asyncio.to_thread(pending.wait)
            self._wire_wait_s += time.perf_counter() - waited
        except RuntimeError as error:
            raise WeightSyncError(
                f"gloo weight sync #{self._syncs}: rollout rank {self._rank} failed receiving bucket {pending.index} "
                f"from actor rank 0 after {time.perf_counter() - start:.1f}s. The actor most likely died or failed "
                f"earlier in this sync (check actor rank 0's log), or stalled for longer than "
                f"timeout_s={self.timeout_s}. Cause: {error}"
            ) from error

    def _close_group(self) -> None:
        # Dropping the last references closes the group's sockets and joins its threads, and closes
        # the store (on actor rank 0 that frees the port).
        self._group, self._group_key, self._store, self._store_address = None, None, None, None
        self._posted = None


@dataclass
class _Pending:
    """Broadcasts of one bucket (header length, header, payload) that may not have completed yet."""

    index: int
    works: list[dist.Work]

    def wait(self) -> None:
        # Popped, not iterated: a failed wait must not leave its work (and the group's sockets it
        # holds) referenced from this frame in the error's traceback.
        while self.works:
            self.works.pop(0).wait()


class _SendPipeline:
    """The sender's side of one sync: buckets are packed into two buffers in turn, and a buffer is
    packed again only once everyone received the bucket last broadcast from it."""

    def __init__(
        self,
        buffers: tuple[torch.Tensor, torch.Tensor],
        broadcast: Callable[[torch.Tensor], dist.Work],
        *,
        describe: str,
        receivers: int,
        timeout_s: float,
        version: int | None,
    ) -> None:
        self._buffers = buffers
        self._broadcast = broadcast
        self._describe = describe
        self._receivers = receivers
        self._timeout_s = timeout_s
        self._version = version
        self.start = time.perf_counter()
        self.buckets = 0
        self.sent_bytes = 0
        self.wait_s = 0.0
        """Seconds spent waiting for broadcasts to complete."""
        self._slot = 0
        self._in_flight: list[_Pending | None] = [None, None]

    @property
    def buffer(self) -> torch.Tensor:
        """Where the next bucket is packed; free to overwrite."""
        return self._buffers[self._slot]

    async def send(self, nbytes: int, metas: list[TensorMeta], *, is_last: bool) -> None:
        """Start broadcasting the bucket packed in ``buffer[:nbytes]``, then wait until the other
        buffer is free to pack the next one."""
        header = BucketHeader(
            version=self._version,
            index=self.buckets,
            nbytes=nbytes,
            is_last=is_last,
            tensors=tuple(metas),
        )
        encoded = torch.frombuffer(bytearray(pickle.dumps(header)), dtype=torch.uint8)
        length = torch.tensor([encoded.numel()], dtype=torch.int64)
        works = [self._broadcast(length), self._broadcast(encoded), self._broadcast(self.buffer[:nbytes])]
        self._in_flight[self._slot] = _Pending(index=header.index, works=works)
        self.buckets += 1
        self.sent_bytes += header.nbytes
        self._slot = 1 - self._slot
        await self._wait(self._in_flight[self._slot])

    async def drain(self) -> None:
        """Wait until every bucket sent has been received."""
        for pending in (self._in_flight[self._slot], self._in_flight[1 - self._slot]):
            await self._wait(pending)

    def abandon(self) -> None:
        """Drop every pending broadcast of a failed sync."""
        for pending in self._in_flight:
            if pending is not None:
                pending.works.clear()

    async def _wait(self, pending: _Pending | None) -> None:
        if pending is None:
            return
        waited = time.perf_counter()
        try:
            await asyncio.to_thread(pending.wait)
            self.wait_s += time.perf_counter() - waited
        except RuntimeError as error:
            raise WeightSyncError(
                f"{self._describe}: broadcasting bucket {pending.index} to {self._receivers} rollout worker(s) "
                f"failed after {time.perf_counter() - self.start:.1f}s. A rollout worker most likely died or "
                "stopped receiving (check the rollout workers' logs); a worker that is alive but stalled fails "
                f"the sync after timeout_s={self._timeout_s}. Cause: {error}"
            ) from error


async def _contiguous(weights: NamedTensors) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """``split_weight_chunks`` reinterprets each tensor's memory as bytes, which needs contiguity."""
    async for name, tensor in ensure_async_iterator(weights):
        yield name, tensor.detach().contiguous()
