"""The ``checkpoint`` checkpoint engine: verl weight sync from the actor to the rollout through files.

What: a verl ``CheckpointEngine`` (Trinity-RFT's ``sync_method: checkpoint``) for pools that share no
collective: other clusters, other jobs, a debugging session that wants to look at the weights. Actor
rank 0 writes each weight version as safetensors files into a folder; every rollout worker reads
them back and yields ``(name, tensor)`` into the same in-place update path as the other engines
(``HFServerAdapter.update_weights`` on CPU, verl's vLLM server adapter on GPUs): no replica restart.

    actor_rollout_ref.rollout.checkpoint_engine.backend=checkpoint
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.one_step_off_async.weight_sync.files
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.dir=/shared/fs/run42/weights  # optional
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.timeout_s=300                  # optional

``dir`` defaults to a fresh folder per run under ``/dev/shm`` (RAM; the system temp dir where there is
no ``/dev/shm``), which both pools see only when they share a node; across nodes point it at a
filesystem every node mounts, as an absolute path, one run per folder. Actor rank 0 creates it.
A default folder is removed when actor rank 0's engine is closed or collected or its process exits;
Ray ends a run by killing its workers, though, so the next run's writer on the node removes it
(a writer holds a lock on its folder while it lives). A given folder is left as it is.

The folder holds, per version (``global_steps``, which verl's ``CheckpointEngineManager`` passes):

    v<version>/manifest.json                  run, sync, version, bytes; per file its size and tensors
    v<version>/shard-00000.safetensors ...    tensors in the dtype and shape the actor sent
    v<version>/loaded-<rank>                  dropped by rollout worker <rank> once it loaded them all

How a sync runs (prepare, build_topology, init_process_group, send_weights | receive_weights,
finalize, as the manager calls them):

- Topology: no group. ``prepare()`` on actor rank 0 returns where this sync's version goes (folder,
  run id, and a fresh sync id); ``build_topology`` hands that to everyone. Actor rank 0 writes (rank
  0); the other actor ranks only walk the weight generator (rank -1), because producing each full
  tensor is an FSDP all-gather that rank 0 also runs; rollout workers are ranks 1..N.
- Writing: tensors are packed into shards of at most ``update_weights_bucket_megabytes`` (a larger
  tensor gets a file of its own), and shard i is written by a thread while shard i+1 is packed
  (two buffers, kept between syncs). All of it goes into ``v<version>.tmp-<random>``, which is
  renamed to ``v<version>`` only once every file and the manifest are written: a version is never
  visible half-written, and a writer that dies leaves only a ``.tmp-`` folder, removed on the next
  write. A write error (``ENOSPC``: full disk) removes the partial folder, still walks the rest of
  the generator (so the other actor ranks are not left in an all-gather) and raises
  ``WeightSyncError`` naming the folder and the fix.
- Reading: a rollout worker polls for ``v<version>/manifest.json`` carrying this sync's id, for at most
  ``timeout_s`` (then ``WeightSyncError`` naming the version and the folder). It checks each file's
  size and its safetensors header against the manifest, reads shard i+1 while its consumer copies
  shard i's tensors, and drops its ``loaded-<rank>`` marker at the end. A ``v<version>`` of another
  run or of an earlier sync (a resumed run, a re-sent version) is never loaded: the writer replaces it.
- Garbage collection: before writing, actor rank 0 removes every version older than the newest one
  of its run that all N rollout workers marked loaded, and leftover ``.tmp-`` folders; the newest
  of the removed versions is renamed to the new ``.tmp-`` folder and its files are overwritten (on
  tmpfs about twice as fast as new files). So the folder holds at most the last loaded version and
  the one being written: budget twice the model's size.

The receiver's contract is that of verl's ``nccl`` engine (and the recipe's ``gloo`` engine, whose
``ReceivedWeights`` and ``WeightSyncError`` it shares): **a yielded tensor is valid only until the
consumer asks for the next item** (it may be a view into a reused read buffer); a server adapter
copies each tensor into place before pulling the next, and ``.clone()``s what it keeps.
``scripts/bench_checkpoint_engine.py`` measures its throughput against the gloo engine's.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import struct
import tempfile
import time
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from recipe.one_step_off_async.errors import WeightSyncError
from recipe.one_step_off_async.weight_sync.gloo import ReceivedWeights

__all__ = ["FileCheckpointEngine", "ReceivedWeights", "WeightSyncError", "WeightsLocation"]

logger = logging.getLogger(__name__)

NamedTensors = Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]]

WRITER_RANK = 0
MANIFEST = "manifest.json"
SHARD_PREFIX = "shard-"
FORMAT = "one_step_off_async.checkpoint/1"
DIR_KEY = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.dir"
TIMEOUT_KEY = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.timeout_s"

DEFAULT_PREFIX = "verl-weights-"
LOCK = ".lock"
"""In a default folder: locked by its writer while it lives, so a later writer can tell an abandoned folder."""

_VERSION = re.compile(r"v(\d+)")
_LEFTOVER = re.compile(r"v\d+\.(tmp|stale)-[0-9a-f]+")
_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_TORCH_DTYPES = {code: dtype for dtype, code in _SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True)
class WeightsLocation:
    """Where one sync's version goes: what actor rank 0's ``prepare()`` tells every worker."""

    dir: str
    run_id: str
    """Actor rank 0's engine: garbage collection only counts the versions of its own run."""
    sync_id: str
    """Fresh per ``prepare()``: a receiver loads only the version written in this sync."""


@CheckpointEngineRegistry.register("checkpoint")
class FileCheckpointEngine(CheckpointEngine):
    """Hand actor weights to rollout workers through safetensors files in a folder both can see.

    Args:
        bucket_size: Bytes per shard file (verl passes ``update_weights_bucket_megabytes << 20``); a
            tensor larger than that gets a file of its own. Actor rank 0 and each rollout worker keep
            two buffers of this size from their first sync on.
        is_master: True on actor rank 0, the writer.
        dir: The folder (absolute; on a filesystem every node mounts when the pools span nodes).
            Default: a fresh folder per run under /dev/shm, else under the system temp dir.
        timeout_s: How long a rollout worker waits for the version of a sync to appear.
    """

    def __init__(
        self, bucket_size: int, is_master: bool = False, dir: str | None = None, timeout_s: float = 300.0
    ) -> None:
        if bucket_size <= 0:
            raise ValueError(
                f"bucket_size must be positive, got {bucket_size} bytes: set "
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes >= 1"
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}: set {TIMEOUT_KEY}")
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.dir = os.path.abspath(dir) if dir else None
        self.timeout_s = timeout_s
        self.run_id = secrets.token_hex(6)
        self._rank: int | None = None
        self._world_size = 0
        self._location: WeightsLocation | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._received: dict[str, float] = {}
        self._remove_dir: weakref.finalize | None = None

    def close(self) -> None:
        """Remove the default folder now (also done when the engine is collected or its process exits)."""
        if self._remove_dir is not None:
            self._remove_dir()

    def prepare(self) -> WeightsLocation | None:
        """On actor rank 0: make sure the folder exists and name this sync; other workers return None."""
        if not self.is_master:
            return None
        if self.dir is None:
            self.dir, lock = _make_default_dir(self.run_id)
            self._remove_dir = weakref.finalize(self, _remove_default_dir, self.dir, lock)
        else:
            try:
                os.makedirs(self.dir, exist_ok=True)
            except OSError as error:
                raise WeightSyncError(f"cannot create the weights folder {self.dir}: {error}; fix {DIR_KEY}") from error
        return WeightsLocation(dir=self.dir, run_id=self.run_id, sync_id=secrets.token_hex(8))

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[WeightsLocation | None]
    ) -> tuple[dict[str, list], dict[str, list]]:
        """Actor rank 0 writes as rank 0, the other actor ranks only drain (-1), rollout workers are 1..N."""
        location = metadata[0]
        if not isinstance(location, WeightsLocation):
            raise ValueError(
                f"actor rank 0 returned {location!r} from prepare() instead of the weights location: the "
                "checkpoint engine on actor rank 0 must be built with is_master=True"
            )
        world_size = 1 + rollout_world_size
        actor_kwargs = {
            "rank": [WRITER_RANK] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "location": [location] * actor_wg_world_size,
        }
        rollout_kwargs = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "location": [location] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, location: WeightsLocation) -> None:
        """Take this sync's seat; a rollout worker checks that it sees the folder actor rank 0 writes to."""
        if rank > WRITER_RANK and not os.path.isdir(location.dir):
            raise WeightSyncError(
                f"checkpoint weight sync: rollout rank {rank} cannot see the weights folder {location.dir} that "
                "actor rank 0 writes to: they run on different machines (or containers with different mounts). "
                f"Set {DIR_KEY} to a folder on a filesystem that every node mounts at the same path."
            )
        self._rank, self._world_size, self._location = rank, world_size, location
        if rank >= WRITER_RANK and self._buffers is None:
            pin = torch.cuda.is_available()  # faster copies from and to the GPU
            self._buffers = tuple(torch.empty(self.bucket_size, dtype=torch.uint8, pin_memory=pin) for _ in range(2))

    def finalize(self) -> None:
        """Leave the sync (the buffers are kept for the next one)."""
        self._rank, self._location = None, None

    def receive_metrics(self) -> dict[str, float]:
        """A rollout worker's split of its last sync (``{}`` before one completed, and on actor ranks)."""
        return dict(self._received)

    @torch.no_grad()
    async def send_weights(self, weights: NamedTensors, global_steps: int | None = None) -> dict[str, float]:
        """Write ``weights`` as version ``global_steps`` (actor rank 0); drain them (other actor ranks).

        Returns the sync's metrics on actor rank 0, ``{}`` on the other actor ranks.
        """
        rank = self._joined_rank("send_weights")
        stream = aiter(ensure_async_iterator(weights))
        if rank < 0:
            async for _ in stream:
                pass
            return {}
        if rank != WRITER_RANK:
            raise RuntimeError(f"send_weights on rank {rank}: rollout workers receive weights, actor rank 0 writes")
        version = _require_version(global_steps, "send_weights")
        start = time.perf_counter()
        root = Path(self._location.dir)
        writer: _VersionWriter | None = None
        try:
            removed, reusable = self._collect_garbage(root)
            writer = _VersionWriter(root, version, self._buffers, reuse=reusable)
            async for name, tensor in stream:
                await writer.add(name, tensor.detach().contiguous())
            await writer.commit(run_id=self.run_id, sync_id=self._location.sync_id)
        except Exception as error:
            if writer is not None:
                await writer.discard()
            async for _ in stream:  # the other actor ranks run the same all-gathers: see them through
                pass
            if isinstance(error, OSError):
                raise WeightSyncError(_write_failed(root, version, writer, error)) from error
            raise
        except BaseException:
            if writer is not None:
                await writer.discard()
            raise
        seconds = time.perf_counter() - start
        logger.info(
            "checkpoint weight sync: wrote version %d (%.1f MiB in %d files) to %s in %.2fs",
            version,
            writer.payload_bytes / 2**20,
            len(writer.files),
            writer.final,
            seconds,
        )
        return {
            "checkpoint_engine/payload_mbytes": writer.payload_bytes / 2**20,
            "checkpoint_engine/files": float(len(writer.files)),
            "checkpoint_engine/versions_removed": float(removed),
            "checkpoint_engine/send_s": seconds,
        }

    def receive_weights(self, global_steps: int | None = None) -> ReceivedWeights:
        """The weights actor rank 0 writes as version ``global_steps`` in this sync (rollout workers).

        Each yielded tensor is valid only until the consumer asks for the next item: copy it into
        place, or ``.clone()`` it, before pulling the next. ``version`` of the returned stream is set
        once the version's manifest was found and checked.
        """
        rank = self._joined_rank("receive_weights")
        if rank <= WRITER_RANK:
            raise RuntimeError(f"receive_weights on actor rank {rank}: only rollout workers (ranks >= 1) receive")
        version = _require_version(global_steps, "receive_weights")
        location = self._location
        return ReceivedWeights(lambda stream: self._receive_tensors(rank, location, version, stream))

    def _joined_rank(self, method: str) -> int:
        if self._rank is None:
            raise RuntimeError(f"{method} before init_process_group: the sync has no location")
        return self._rank

    def _collect_garbage(self, root: Path) -> tuple[int, Path | None]:
        """Remove leftovers and the versions older than the newest one of this run that all rollout
        workers loaded: how many versions, and the newest of them, kept for the next write to reuse."""
        versions = {
            int(match[1]): Path(entry.path) for entry in os.scandir(root) if (match := _VERSION.fullmatch(entry.name))
        }
        newest = max((v for v, path in versions.items() if self._loaded_by_all(path)), default=-1)
        old = [path for version, path in sorted(versions.items()) if version < newest]
        for entry in os.scandir(root):
            if _LEFTOVER.fullmatch(entry.name):
                shutil.rmtree(entry.path)
        for path in old[:-1]:
            shutil.rmtree(path)
        return len(old), old[-1] if old else None

    def _loaded_by_all(self, path: Path) -> bool:
        manifest = _read_manifest(path)
        return (
            manifest is not None
            and manifest.get("run_id") == self.run_id
            and all((path / f"loaded-{rank}").exists() for rank in range(1, self._world_size))
        )

    async def _receive_tensors(
        self, rank: int, location: WeightsLocation, version: int, stream: ReceivedWeights
    ) -> AsyncIterator[tuple[str, torch.Tensor]]:
        start = time.perf_counter()
        path = Path(location.dir) / f"v{version}"
        manifest = await self._wait_for_version(rank, path, location, version)
        stream.version = version
        waited = time.perf_counter() - start
        read_wait_s = load_s = 0.0
        files = manifest["files"]
        reading = None
        try:
            reading = _read_in_thread(path, files[0], self._buffers[0]) if files else None
            for index in range(len(files)):
                began = time.perf_counter()
                tensors = await reading
                read_wait_s += time.perf_counter() - began
                # Read the next file into the other buffer while the consumer copies these tensors out.
                nxt = index + 1
                reading = _read_in_thread(path, files[nxt], self._buffers[nxt % 2]) if nxt < len(files) else None
                for name, tensor in tensors:
                    began = time.perf_counter()
                    yield name, tensor
                    load_s += time.perf_counter() - began
            (path / f"loaded-{rank}").touch()
        except OSError as error:
            raise WeightSyncError(
                f"checkpoint weight sync: rollout rank {rank} failed reading weight version {version} from {path}: "
                f"{error}. Something else changed or removed that folder (one run per {DIR_KEY})."
            ) from error
        finally:
            if reading is not None and not reading.done():
                reading.add_done_callback(_discard_outcome)  # a failed sync: nobody reads that file any more
        self._received = {
            "checkpoint_engine/recv_s": time.perf_counter() - start,
            "checkpoint_engine/recv_wait_s": waited,
            "checkpoint_engine/recv_read_wait_s": read_wait_s,
            "checkpoint_engine/recv_load_s": load_s,
        }

    async def _wait_for_version(self, rank: int, path: Path, location: WeightsLocation, version: int) -> dict:
        deadline = time.monotonic() + self.timeout_s
        delay = 0.001
        other = None
        while True:
            manifest = _read_manifest(path)
            if manifest is not None and manifest.get("sync_id") == location.sync_id:
                if manifest.get("format") != FORMAT or manifest.get("version") != version:
                    raise WeightSyncError(
                        f"checkpoint weight sync: {path / MANIFEST} is {manifest.get('format')!r} version "
                        f"{manifest.get('version')!r}, expected {FORMAT!r} version {version}: another program "
                        f"writes to {location.dir} (one run per {DIR_KEY})"
                    )
                return manifest
            other = manifest or other
            if time.monotonic() >= deadline:
                found = f"; it holds a v{version} of another sync (run {other.get('run_id')})" if other else ""
                raise WeightSyncError(
                    f"checkpoint weight sync: rollout rank {rank} waited timeout_s={self.timeout_s:g} for weight "
                    f"version {version} to appear in {location.dir}, in vain{found}. Actor rank 0 most likely failed "
                    "while writing it (check its log: a full disk is reported there), or needs longer to gather and "
                    f"write the weights: then raise {TIMEOUT_KEY}."
                )
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.01)


class _VersionWriter:
    """One version being written: shards into a hidden ``.tmp-`` folder, renamed into place at the end.

    Tensors are packed into one of two buffers; a full buffer is written by a thread while the next
    is packed, and a buffer is packed again only after its write finished.
    """

    def __init__(
        self, root: Path, version: int, buffers: tuple[torch.Tensor, torch.Tensor], reuse: Path | None = None
    ) -> None:
        self.version = version
        self.final = root / f"v{version}"
        self.tmp = root / f"v{version}.tmp-{secrets.token_hex(4)}"
        if reuse is None:
            os.mkdir(self.tmp)
        else:
            # An old version's folder, its shard files overwritten in place: on tmpfs that is about
            # twice as fast as filling new pages. Renamed first, so it is no version any more.
            os.rename(reuse, self.tmp)
            for entry in os.scandir(self.tmp):
                if not entry.name.startswith(SHARD_PREFIX):
                    os.unlink(entry.path)
        self.files: list[dict[str, Any]] = []
        self.payload_bytes = 0
        self._buffers = buffers
        self._slot = 0
        self._packed: list[tuple[str, torch.Tensor]] = []
        self._offset = 0
        self._writing: asyncio.Future | None = None

    async def add(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"checkpoint weight sync: {name!r} has dtype {tensor.dtype}, which safetensors cannot hold")
        capacity = self._buffers[self._slot].numel()
        if self._offset + tensor.nbytes > capacity:
            await self._flush()
        if tensor.nbytes > capacity:
            # A file of its own, written from the tensor's memory before the generator may reuse it.
            await self._finish_writing()
            path, header = self._next_file([(name, tensor)])
            await asyncio.to_thread(_write_file, path, header, _as_bytes(tensor.cpu()))
            return
        # Copied now, while the generator has not moved on: it may reuse a tensor's memory.
        self._buffers[self._slot][self._offset : self._offset + tensor.nbytes].copy_(_as_bytes(tensor))
        self._packed.append((name, tensor))
        self._offset += tensor.nbytes

    async def commit(self, run_id: str, sync_id: str) -> None:
        """Write the rest and the manifest, then make the version visible in one rename."""
        await self._flush()
        await self._finish_writing()
        written = {file["name"] for file in self.files}
        for entry in os.scandir(self.tmp):  # shards of a reused version beyond this one's
            if entry.name not in written:
                os.unlink(entry.path)
        manifest = {
            "format": FORMAT,
            "run_id": run_id,
            "sync_id": sync_id,
            "version": self.version,
            "payload_bytes": self.payload_bytes,
            "files": self.files,
        }
        with open(self.tmp / MANIFEST, "x") as file:
            json.dump(manifest, file)
        stale = None
        if self.final.exists():  # a version of an earlier sync or run: never loaded by this sync's receivers
            stale = self.final.with_name(f"{self.final.name}.stale-{secrets.token_hex(4)}")
            os.rename(self.final, stale)
        os.rename(self.tmp, self.final)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)  # else a leftover that the next write removes

    async def discard(self) -> None:
        """Remove the partial version (after its last write stopped); it was never visible as a version."""
        if self._writing is not None:
            await asyncio.wait([self._writing])
            self._writing.exception()  # reported by the caller's error already
        shutil.rmtree(self.tmp, ignore_errors=True)  # what is left is a .tmp- folder: the next write removes it

    async def _flush(self) -> None:
        if not self._packed:
            return
        path, header = self._next_file(self._packed)
        await self._finish_writing()
        data = self._buffers[self._slot][: self._offset]
        self._writing = asyncio.ensure_future(asyncio.to_thread(_write_file, path, header, data))
        self._slot, self._packed, self._offset = 1 - self._slot, [], 0

    async def _finish_writing(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            await writing

    def _next_file(self, tensors: list[tuple[str, torch.Tensor]]) -> tuple[Path, bytes]:
        """Name the next shard, record it for the manifest and return its path and safetensors header."""
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, tensor in tensors:
            code = _SAFETENSORS_DTYPES[tensor.dtype]
            header[name] = {
                "dtype": code,
                "shape": list(tensor.shape),
                "data_offsets": [offset, offset + tensor.nbytes],
            }
            offset += tensor.nbytes
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the tensor data starts 8-byte aligned
        encoded = struct.pack("<Q", len(encoded)) + encoded
        path = self.tmp / f"{SHARD_PREFIX}{len(self.files):05d}.safetensors"
        self.files.append(
            {
                "name": path.name,
                "bytes": len(encoded) + offset,
                "tensors": [
                    {"name": name, "dtype": header[name]["dtype"], "shape": header[name]["shape"]}
                    for name, _ in tensors
                ],
            }
        )
        self.payload_bytes += offset
        return path, encoded


def _write_file(path: Path, header: bytes, data: torch.Tensor) -> None:
    """Write a shard, over the file of a reused version if there is one."""
    with open(path, "r+b" if path.exists() else "xb") as file:  # buffered: retries short writes
        file.write(header)
        file.write(memoryview(data.numpy()))
        file.truncate()


def _read_in_thread(path: Path, entry: dict, buffer: torch.Tensor) -> asyncio.Future:
    return asyncio.ensure_future(asyncio.to_thread(_read_file, path / entry["name"], entry, buffer))


def _read_file(path: Path, entry: dict, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Read one safetensors file (into ``buffer`` when it fits) after checking it against the manifest."""
    with open(path, "rb", buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        if size != entry["bytes"]:
            raise WeightSyncError(
                f"checkpoint weight sync: {path} has {size} bytes but its manifest says {entry['bytes']}: it was "
                "changed after it was written (another writer in that folder?) or lost data in a machine crash"
            )
        (header_size,) = struct.unpack("<Q", _read_exactly(file, 8))
        header = json.loads(_read_exactly(file, header_size))
        nbytes = size - 8 - header_size
        data = buffer[:nbytes] if nbytes <= buffer.numel() else torch.empty(nbytes, dtype=torch.uint8)
        _read_exactly(file, nbytes, into=data)
    tensors = []
    for meta in entry["tensors"]:
        name = meta["name"]
        found = header.get(name, {})
        if (found.get("dtype"), found.get("shape")) != (meta["dtype"], meta["shape"]):
            raise WeightSyncError(
                f"checkpoint weight sync: {path} holds {name!r} as {found.get('dtype')} {found.get('shape')}, "
                f"its manifest says {meta['dtype']} {meta['shape']}: the folder was changed after it was written"
            )
        begin, end = found["data_offsets"]
        dtype = _TORCH_DTYPES[meta["dtype"]]
        chunk = data[begin:end]
        if begin % dtype.itemsize:  # after a tensor of odd size in a smaller dtype: view() needs alignment
            chunk = chunk.clone()
        tensors.append((name, chunk.view(dtype).view(meta["shape"])))
    return tensors


def _read_exactly(file, nbytes: int, into: torch.Tensor | None = None) -> bytes | None:
    view = memoryview(bytearray(nbytes) if into is None else into.numpy())
    done = 0
    while done < nbytes:
        got = file.readinto(view[done:])
        if not got:
            raise WeightSyncError(f"checkpoint weight sync: {file.name} ended after {done} of {nbytes} bytes")
        done += got
    return bytes(view) if into is None else None


def _read_manifest(path: Path) -> dict | None:
    """The manifest of a version folder, or None while there is none."""
    try:
        with open(path / MANIFEST) as file:
            return json.load(file)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise WeightSyncError(
            f"checkpoint weight sync: cannot read {path / MANIFEST}: {error}. Manifests are written whole before "
            f"their folder is renamed into place, so something else writes to that folder (one run per {DIR_KEY})."
        ) from error


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _make_default_dir(run_id: str) -> tuple[str, int]:
    """A fresh folder under /dev/shm (else the temp dir), locked by this process while it lives.

    Ray ends a run by killing its workers, so no exit handler of actor rank 0 runs: the folders of
    dead writers (their lock released by the kernel) are removed here, by the next writer on the node.
    """
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    for entry in os.scandir(base):
        if entry.name.startswith(DEFAULT_PREFIX) and _is_abandoned(Path(entry.path)):
            shutil.rmtree(entry.path, ignore_errors=True)
    # Locked under a name no sweep matches, then renamed: a sweep never sees it unlocked.
    creating = tempfile.mkdtemp(prefix=f".creating-{DEFAULT_PREFIX}", dir=base)
    lock = os.open(os.path.join(creating, LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    folder = os.path.join(base, f"{DEFAULT_PREFIX}{run_id}-{secrets.token_hex(4)}")
    os.rename(creating, folder)
    return folder, lock


def _is_abandoned(folder: Path) -> bool:
    try:
        lock = os.open(folder / LOCK, os.O_RDWR)
    except OSError:  # not a writer's folder, or another user's
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:  # its writer is alive
        return False
    finally:
        os.close(lock)


def _remove_default_dir(folder: str, lock: int) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os.close(lock)


def _require_version(global_steps: int | None, method: str) -> int:
    if not isinstance(global_steps, int) or global_steps < 0:
        raise ValueError(
            f"checkpoint weight sync: {method}(global_steps={global_steps!r}): the checkpoint engine names each "
            "version after the trainer's global_steps, which verl's CheckpointEngineManager.update_weights passes"
        )
    return global_steps


def _write_failed(root: Path, version: int, writer: _VersionWriter | None, error: OSError) -> str:
    written = "" if writer is None else f" after {writer.payload_bytes / 2**20:.1f} MiB"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = (
            f"{root} is full: free space there, or set {DIR_KEY} to a filesystem with room for two versions of the "
            "model (the last one loaded and the one being written; /dev/shm is RAM, sized by --shm-size in "
            "containers)"
        )
    else:
        fix = f"check that actor rank 0 can create and write files in {root}, or set {DIR_KEY} to a folder it can"
    return (
        f"checkpoint weight sync: writing weight version {version} to {root} failed{written}: {error}. "
        f"No part of it is visible as a version. Fix: {fix}."
    )


def _discard_outcome(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
