"""The ``gloo`` checkpoint engine: verl weight sync from the actor to the rollout workers on CPU.

verl's ``nccl`` engine needs CUDA and cupy; this engine is its CPU counterpart with the same topology
(``SingleSourceEngine``'s, in ``weight_sync.common``) and lifecycle, so the trainer runs the same code on both
paths and only the configured backend differs (the recipe's verl plugin registers the engine in every process):

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=300  # optional; +: not in verl's YAML

- The group is a standalone ``ProcessGroupGloo`` over a ``TCPStore`` that actor rank 0 hosts on a port the OS
  picks in its first ``prepare()``. It never touches the default process group (FSDP's).
- The group is kept across syncs (``keep_group``, default true): building it (a full mesh of TCP connections)
  was most of a small model's sync time on CPU. Every rank posts on the store which group it holds; only when
  all ranks hold the same one is it reused, else they all build a new one. So a restarted or added worker, a
  changed world size or a sync that failed on any rank (a failing rank drops its group) lead to a fresh group,
  and no rank waits for a peer that went another way.
- Weights travel in buckets of at most ``update_weights_bucket_megabytes``; larger tensors are split into
  chunks (verl's ``split_weight_chunks``) and reassembled. Both sides double-buffer (the sender packs bucket
  i+1 while bucket i is broadcast; a receiver receives bucket i+1 while its consumer copies bucket i's
  tensors), in two buffers kept between syncs (paging fresh ones in every sync halved the throughput). Each
  bucket is preceded, in-band, by a pickled ``BucketHeader`` carrying the sync's weight version.
- Every collective is bounded by ``timeout_s``: a peer that dies or stalls fails the sync instead of hanging.

``python -m benchmarks gloo-engine`` compares a sync, loaded into a model, with a raw broadcast of the same bytes.
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

logger = logging.getLogger(__name__)

# Bytes: every tensor (chunk) starts at a multiple of this in a bucket, so a receiver can view it in its own dtype.
ALIGNMENT = 64


@dataclass(frozen=True)
class StoreAddress:
    """Where the workers of one sync meet: the ``TCPStore`` that actor rank 0 hosts."""

    host: str
    port: int
    sync: int = 0  # actor rank 0's count of prepare() calls: names this sync's keys on the store


@dataclass(frozen=True)
class BucketHeader:
    """What a receiver needs to unpack one bucket; broadcast right before the bucket's bytes."""

    version: int | None  # the weight version (trainer global_steps) of the sync; the same in every bucket
    index: int
    nbytes: int
    is_last: bool
    tensors: tuple[TensorMeta, ...]  # one per tensor or tensor chunk, at its offset in the bucket


@CheckpointEngineRegistry.register("gloo")
class GlooCheckpointEngine(SingleSourceEngine):
    """Broadcast actor weights to rollout workers over a gloo group on CPU.

    Args (besides ``SingleSourceEngine``'s; actor rank 0 also hosts the group's store):
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
        self._syncs = 0  # joined, for messages
        self._prepared = 0  # actor rank 0's prepare() calls
        self._last_sync = 0  # the latest StoreAddress.sync joined
        self._store: dist.TCPStore | None = None
        self._store_address: tuple[str, int] | None = None
        self._group: dist.ProcessGroupGloo | None = None
        self._group_key: tuple[int, int, int] | None = None  # this rank's seat in it, and the sync that built it
        self._posted: str | None = None  # this rank's key on the store from the latest sync
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._join: dict[str, float] = {}
        self._wire_wait_s = 0.0  # of the send or receive in progress

    def prepare(self) -> StoreAddress | None:
        """Return the store's address on actor rank 0 (opened on first use); other workers return None."""
        if not self.keep_group:
            self._close_group()
        if not self.is_master:
            return None
        if self._store is None:
            host = ray.util.get_node_ip_address().strip("[]")
            # Port 0: the OS picks a free port while binding, so no other process can take it in between.
            self._store = dist.TCPStore(host, 0, is_master=True, timeout=self._timeout, wait_for_workers=False)
            self._store_address = (host, self._store.port)
        self._prepared += 1
        return StoreAddress(*self._store_address, sync=self._prepared)

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
        try:
            reused = self._join_group(rank, world_size, store_address)
        except RuntimeError as error:
            self._close_group()
            raise WeightSyncError(
                f"gloo weight sync #{self._syncs}: rank {rank} could not join the {world_size}-rank group at "
                f"{store_address.host}:{store_address.port} within timeout_s={self.timeout_s}. A peer did not "
                "reach init_process_group (check the other workers' logs), or this host cannot reach that "
                f"address (set GLOO_SOCKET_IFNAME). Cause: {error}"
            ) from error
        allocated = time.perf_counter()
        if self._buffers is None:  # kept across syncs (see the module docstring)
            self._buffers = tuple(torch.empty(self.bucket_size, dtype=torch.uint8) for _ in range(2))
        self._join = {
            "checkpoint_engine/group_s": time.perf_counter() - start,
            "checkpoint_engine/group_reused": float(reused),
            "checkpoint_engine/allocate_s": time.perf_counter() - allocated,
        }

    def _join_group(self, rank: int, world_size: int, address: StoreAddress) -> bool:
        """Reuse the group all ranks of this sync hold (True), or build a new one with them (False)."""
        # A sync number that did not grow: a new actor rank 0 (its count restarted) on the same port.
        if rank != SOURCE_RANK and (
            self._store_address != (address.host, address.port) or address.sync <= self._last_sync
        ):
            self._close_group()
            self._store = dist.TCPStore(address.host, address.port, is_master=False, timeout=self._timeout)
            self._store_address = (address.host, address.port)
        self._last_sync = address.sync
        # Post which group this rank holds for its seat, then read every rank's post for this sync.
        key = self._group_key
        held = key[2] if self._group is not None and key is not None and key[:2] == (rank, world_size) else -1
        posts = [f"sync/{address.sync}/holds/{r}" for r in range(world_size)]
        if self._posted is not None:  # every rank read it before the previous sync's init_process_group returned
            self._store.delete_key(self._posted)
        self._store.set(posts[rank], str(held))
        self._posted = posts[rank]
        self._store.wait(posts, self._timeout)
        if held >= 0 and all(int(value) == held for value in self._store.multi_get(posts)):
            return True
        self._group, self._group_key = None, None  # drop the old one before joining the next
        prefixed = dist.PrefixStore(f"group/{address.sync}", self._store)
        # Uses GLOO_SOCKET_IFNAME when set, like torch's default gloo group.
        self._group = dist.ProcessGroupGloo(prefixed, rank, world_size, self._timeout)
        self._group_key = (rank, world_size, address.sync)
        return False

    def finalize(self) -> None:
        """End this sync. The group stays for the next sync unless ``keep_group`` is false."""
        if not self.keep_group:
            self._close_group()
        self._rank = None

    def close(self) -> None:
        """Release the group and the store (its port, on actor rank 0) now; the next sync builds anew."""
        self._close_group()
        self._rank = None

    @torch.no_grad()
    async def send_weights(self, weights: NamedTensors, global_steps: int | None = None) -> dict[str, float]:
        """Broadcast ``weights`` to the rollout workers and return the sync's metrics (actor rank 0); drain them and
        return ``{}`` (other actor ranks)."""
        if self._sending_rank() != SOURCE_RANK:
            await drain(weights)
            return {}
        start = time.perf_counter()
        self._wire_wait_s = 0.0
        pending: list[_Pending | None] = [None, None]  # the broadcasts from each buffer
        slot, offset, buckets, sent, metas = 0, 0, 0, 0, []

        def post(is_last: bool) -> None:
            """Start broadcasting the bucket packed in the current buffer."""
            header = BucketHeader(global_steps, buckets, offset, is_last, tuple(metas))
            encoded = torch.frombuffer(bytearray(pickle.dumps(header)), dtype=torch.uint8)
            length = torch.tensor([encoded.numel()], dtype=torch.int64)
            payload = self._buffers[slot][:offset]
            pending[slot] = _Pending(buckets, [self._broadcast(t) for t in (length, encoded, payload)])

        def failed(index: int) -> str:
            return (
                f"gloo weight sync #{self._syncs} (weight version {global_steps}): broadcasting bucket {index} to "
                f"{self._world_size - 1} rollout worker(s) failed after {time.perf_counter() - start:.1f}s. A rollout "
                "worker most likely died or stopped receiving (check the rollout workers' logs); a worker that is "
                f"alive but stalled fails the sync after timeout_s={self.timeout_s}."
            )

        produce_s, produce_start = 0.0, time.perf_counter()
        try:
            async for meta, chunk in split_weight_chunks(_contiguous(weights), self.bucket_size):
                produce_s += time.perf_counter() - produce_start
                aligned = -(-offset // ALIGNMENT) * ALIGNMENT
                if aligned + meta.chunk_size > self.bucket_size:
                    post(is_last=False)
                    slot, buckets, sent, aligned, metas = 1 - slot, buckets + 1, sent + offset, 0, []
                    await self._wait(pending[slot], failed)  # the buffer packed next is free once its bucket arrived
                # Copied now, while the generator has not moved on: it may reuse a tensor's memory.
                self._buffers[slot][aligned : aligned + meta.chunk_size].copy_(chunk)
                meta.offset = aligned
                metas.append(meta)
                offset = aligned + meta.chunk_size
                produce_start = time.perf_counter()
            produce_s += time.perf_counter() - produce_start
            post(is_last=True)
            buckets, sent = buckets + 1, sent + offset
            for index in (1 - slot, slot):
                await self._wait(pending[index], failed)
        except BaseException:
            self._abandon(*pending)
            raise
        seconds = time.perf_counter() - start
        logger.info(
            "gloo weight sync #%d (version %s): sent %.1f MiB in %d buckets to %d workers in %.2fs",
            self._syncs,
            global_steps,
            sent / 2**20,
            buckets,
            self._world_size - 1,
            seconds,
        )
        return {
            "checkpoint_engine/payload_mbytes": sent / 2**20,
            "checkpoint_engine/buckets": float(buckets),
            "checkpoint_engine/send_s": seconds,
            "checkpoint_engine/produce_s": produce_s,
            "checkpoint_engine/wire_wait_s": self._wire_wait_s,
            "checkpoint_engine/pack_s": max(0.0, seconds - produce_s - self._wire_wait_s),
            **self._join,
        }

    def receive_weights(self, global_steps: int | None = None) -> ReceivedWeights:
        """The weights the actor broadcasts in this sync (rollout workers); when ``global_steps`` (the version
        the trainer announced) is given, a sync stamped with any other version fails with ``WeightSyncError``."""
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

        def failed(index: int) -> str:
            return (
                f"gloo weight sync #{self._syncs}: rollout rank {self._rank} failed receiving bucket {index} from "
                f"actor rank 0 after {time.perf_counter() - start:.1f}s. The actor most likely died or failed earlier "
                f"in this sync (check actor rank 0's log), or stalled for longer than timeout_s={self.timeout_s}."
            )

        try:
            header = await self._receive_header(0, expected_version, failed)
            stream.version = header.version
            slot = 0
            pending = _Pending(0, [self._broadcast(self._buffers[slot][: header.nbytes])])
            while True:
                await self._wait(pending, failed)
                if not header.is_last:
                    # Post the next bucket before unpacking this one: it arrives meanwhile.
                    following = await self._receive_header(header.index + 1, header.version, failed)
                    payload = self._buffers[1 - slot][: following.nbytes]
                    pending = _Pending(following.index, [self._broadcast(payload)])
                for name, tensor in self._unpack(header, self._buffers[slot], arriving):
                    handed = time.perf_counter()
                    yield name, tensor
                    load_s += time.perf_counter() - handed
                if header.is_last:
                    break
                header, slot = following, 1 - slot
        except BaseException:
            self._abandon(pending)
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

    async def _receive_header(
        self, index: int, expected_version: int | None, failed: Callable[[int], str]
    ) -> BucketHeader:
        length = torch.empty(1, dtype=torch.int64)
        await self._wait(_Pending(index, [self._broadcast(length)]), failed)
        encoded = torch.empty(int(length.item()), dtype=torch.uint8)
        await self._wait(_Pending(index, [self._broadcast(encoded)]), failed)
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

    def _unpack(
        self, header: BucketHeader, buffer: torch.Tensor, arriving: dict[str, torch.Tensor]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield each tensor that a received bucket completes: one that lies whole in the bucket as a view into
        ``buffer`` (as verl's ``merge_weight_chunks``), a larger one copied chunk by chunk into a tensor kept in
        ``arriving`` until its last chunk arrived."""
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

    async def _wait(self, pending: _Pending | None, failed: Callable[[int], str]) -> None:
        """Wait for ``pending``'s broadcasts (counted in ``_wire_wait_s``); on an error, ``WeightSyncError(failed(bucket))``."""
        if pending is None:
            return
        waited = time.perf_counter()
        try:
            await asyncio.to_thread(pending.wait)
        except RuntimeError as error:
            raise WeightSyncError(f"{failed(pending.index)} Cause: {error}") from error
        self._wire_wait_s += time.perf_counter() - waited

    def _abandon(self, *pending: _Pending | None) -> None:
        """Let go of the pending broadcasts and close the group: its sockets close now, so the peers fail at
        once instead of at their timeout."""
        for unfinished in pending:
            if unfinished is not None:
                unfinished.works.clear()
        self._close_group()

    def _close_group(self) -> None:
        # Dropping the last references closes the group's sockets and joins its threads, and closes
        # the store (on actor rank 0 that frees the port).
        self._group, self._group_key, self._store, self._store_address, self._posted = None, None, None, None, None


@dataclass
class _Pending:
    """Broadcasts of one bucket that may not have completed yet."""

    index: int
    works: list[dist.Work]

    def wait(self) -> None:
        # Popped, not iterated: a failed wait must not leave its work (and the group's sockets it
        # holds) referenced from this frame in the error's traceback.
        while self.works:
            self.works.pop(0).wait()


async def _contiguous(weights: NamedTensors) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """``split_weight_chunks`` reinterprets each tensor's memory as bytes, which needs contiguity."""
    async for name, tensor in ensure_async_iterator(weights):
        yield name, tensor.detach().contiguous()
