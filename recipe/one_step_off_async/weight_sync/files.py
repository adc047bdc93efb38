"""The ``checkpoint`` checkpoint engine: verl weight sync from the actor to the rollout through files.

What: a verl ``CheckpointEngine`` (Trinity-RFT's ``sync_method: checkpoint``) for pools that share no
collective: other clusters, other jobs, a debugging session that wants to look at the weights. Actor
rank 0 writes each weight version as safetensors files into a folder; every rollout worker reads them
back and yields ``(name, tensor)`` into the same in-place update path as the other engines (verl's vLLM
server adapter): no replica restart. The recipe's verl plugin registers it by name in every process:

    actor_rollout_ref.rollout.checkpoint_engine.backend=checkpoint

The contract (layout, atomic versions, garbage collection, errors, the default folder's cleanup, ``dir`` and
``timeout_s``) is docs/advance/one_step_off_async/weight_sync.md. ``python -m benchmarks checkpoint-engine``
measures its throughput against the gloo engine's.
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
import tempfile
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from recipe.one_step_off_async.errors import WeightSyncError
from recipe.one_step_off_async.weight_sync.common import (
    SOURCE_RANK,
    NamedTensors,
    ReceivedWeights,
    SingleSourceEngine,
    drain,
    engine_kwarg_key,
)

logger = logging.getLogger(__name__)

DIR_KEY = engine_kwarg_key("checkpoint", "dir")
TIMEOUT_KEY = engine_kwarg_key("checkpoint", "timeout_s")
DEFAULT_PREFIX = "verl-weights-"
LOCK = ".lock"  # in a default folder: locked by its writer while it lives, so a later writer can tell it abandoned
_WRITTEN = re.compile(r"v\d+-[0-9a-f]+(\.tmp)?")  # a version folder, or one a writer did not finish
SHARD_COUNT = "shards"  # in a version folder: how many shard files the writer wrote, so a reader can tell


@dataclass(frozen=True)
class WeightsLocation:
    """Where one sync's version goes: what actor rank 0's ``prepare()`` tells every worker."""

    dir: str
    sync_id: str  # fresh per prepare(): a receiver loads only the version written in this sync

    def version_folder(self, version: int) -> Path:
        return Path(self.dir) / f"v{version}-{self.sync_id}"


@CheckpointEngineRegistry.register("checkpoint")
class FileCheckpointEngine(SingleSourceEngine):
    """Hand actor weights to rollout workers through safetensors files in a folder both can see.

    Args (besides ``SingleSourceEngine``'s; a bucket is a shard file, a larger tensor gets one of its own):
        dir: The folder (on a filesystem every node mounts when the pools span nodes). Default: a fresh
            folder per run under /dev/shm, else under the system temp dir.
        timeout_s: How long a rollout worker waits for the version of a sync to appear.
    """

    backend = "checkpoint"
    meeting_point = "location"
    meeting_type = WeightsLocation

    def __init__(
        self, bucket_size: int, is_master: bool = False, dir: str | None = None, timeout_s: float = 300.0
    ) -> None:
        super().__init__(bucket_size, is_master=is_master, timeout_s=timeout_s)
        self.dir = os.path.abspath(dir) if dir else None
        self._location: WeightsLocation | None = None
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
            self.dir, lock = _make_default_dir()
            self._remove_dir = weakref.finalize(self, _remove_default_dir, self.dir, lock)
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as error:
            raise WeightSyncError(f"cannot create the weights folder {self.dir}: {error}; fix {DIR_KEY}") from error
        return WeightsLocation(dir=self.dir, sync_id=secrets.token_hex(8))

    def init_process_group(self, rank: int, world_size: int, location: WeightsLocation) -> None:
        """Take this sync's seat; a rollout worker checks that it sees the folder actor rank 0 writes to."""
        if rank > SOURCE_RANK and not os.path.isdir(location.dir):
            raise WeightSyncError(
                f"checkpoint weight sync: rollout rank {rank} cannot see the weights folder {location.dir} that "
                "actor rank 0 writes to: they run on different machines (or containers with different mounts). "
                f"Set {DIR_KEY} to a folder on a filesystem that every node mounts at the same path."
            )
        self._rank, self._world_size, self._location = rank, world_size, location

    def finalize(self) -> None:
        self._rank, self._location = None, None

    @torch.no_grad()
    async def send_weights(self, weights: NamedTensors, global_steps: int | None = None) -> dict[str, float]:
        """Write ``weights`` as version ``global_steps`` and return the sync's metrics (actor rank 0); drain them and
        return ``{}`` (other actor ranks)."""
        if self._sending_rank() != SOURCE_RANK:
            await drain(weights)
            return {}
        version = _require_version(global_steps, "send_weights")
        start = time.perf_counter()
        final = self._location.version_folder(version)
        shards = _ShardWriter(final.with_name(f"{final.name}.tmp"), self.bucket_size)
        stream = aiter(ensure_async_iterator(weights))
        try:
            removed = _remove_written(final.parent)
            shards.folder.mkdir()
            async for name, tensor in stream:
                await shards.add(name, tensor)
            await shards.finish()
            os.rename(shards.folder, final)
        except BaseException as error:
            if not isinstance(error, Exception):  # cancelled, interrupted: no partial version left behind
                shutil.rmtree(shards.folder, ignore_errors=True)
                raise
            await shards.discard()
            await drain(stream)  # the other actor ranks run the same all-gathers: see them through
            if isinstance(error, OSError):
                raise WeightSyncError(_write_failed(final.parent, version, shards, error)) from error
            raise
        seconds = time.perf_counter() - start
        logger.info(
            "checkpoint weight sync: wrote version %d (%.1f MiB in %d files) to %s in %.2fs",
            version,
            shards.payload_bytes / 2**20,
            shards.files,
            final,
            seconds,
        )
        return {
            "checkpoint_engine/payload_mbytes": shards.payload_bytes / 2**20,
            "checkpoint_engine/files": float(shards.files),
            "checkpoint_engine/versions_removed": float(removed),
            "checkpoint_engine/send_s": seconds,
        }

    def receive_weights(self, global_steps: int | None = None) -> ReceivedWeights:
        """The weights actor rank 0 writes as version ``global_steps`` in this sync (rollout workers)."""
        rank = self._receiving_rank()
        version = _require_version(global_steps, "receive_weights")
        location = self._location
        return ReceivedWeights(lambda stream: self._receive_tensors(rank, location, version, stream))

    async def _receive_tensors(
        self, rank: int, location: WeightsLocation, version: int, stream: ReceivedWeights
    ) -> AsyncIterator[tuple[str, torch.Tensor]]:
        start = time.perf_counter()
        path = location.version_folder(version)
        delay, deadline = 0.001, time.monotonic() + self.timeout_s
        while not path.is_dir():
            if time.monotonic() >= deadline:
                raise WeightSyncError(
                    f"checkpoint weight sync: rollout rank {rank} waited timeout_s={self.timeout_s:g} for weight "
                    f"version {version} to appear in {location.dir}, in vain. Actor rank 0 most likely failed while "
                    "writing it (check its log: a full disk is reported there), or needs longer to gather and write "
                    f"the weights: then raise {TIMEOUT_KEY}."
                )
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.01)
        stream.version = version
        waited, load_s = time.perf_counter() - start, 0.0
        try:
            expected, found = int((path / SHARD_COUNT).read_text()), sorted(path.glob("shard-*.safetensors"))
            if len(found) != expected:
                raise OSError(f"{len(found)} of its {expected} shard files are there")
            for shard in found:
                with safe_open(shard, framework="pt") as file:
                    for name in json.loads(file.metadata()["names"]):
                        tensor = file.get_tensor(name)
                        handed = time.perf_counter()
                        yield name, tensor
                        load_s += time.perf_counter() - handed
        except (OSError, ValueError, SafetensorError) as error:
            raise WeightSyncError(
                f"checkpoint weight sync: rollout rank {rank} failed reading weight version {version} from {path}: "
                f"{error}. Something else changed or removed that folder (one run per {DIR_KEY})."
            ) from error
        self._received = {
            "checkpoint_engine/recv_s": time.perf_counter() - start,
            "checkpoint_engine/recv_wait_s": waited,
            "checkpoint_engine/recv_load_s": load_s,
        }


class _ShardWriter:
    """Tensors packed into shards of at most ``bucket_size`` bytes (a larger tensor gets one of its own), each
    written by safetensors in a thread while the next is packed."""

    def __init__(self, folder: Path, bucket_size: int) -> None:
        self.folder, self.bucket_size = folder, bucket_size
        self.files, self.payload_bytes = 0, 0
        self._shard: dict[str, torch.Tensor] = {}
        self._shard_bytes = 0
        self._writing: asyncio.Future | None = None

    async def add(self, name: str, tensor: torch.Tensor) -> None:
        if self._shard and self._shard_bytes + tensor.nbytes > self.bucket_size:
            await self._flush()
        # A copy on the CPU now: the generator may reuse the tensor's memory once it moves on.
        self._shard[name] = torch.empty_like(tensor, device="cpu", memory_format=torch.contiguous_format).copy_(tensor)
        self._shard_bytes += tensor.nbytes
        self.payload_bytes += tensor.nbytes

    async def finish(self) -> None:
        await self._flush()
        await self._wait()
        (self.folder / SHARD_COUNT).write_text(str(self.files))

    async def discard(self) -> None:
        """Let the write in flight end (its error is the caller's already), then remove the partial folder."""
        if self._writing is not None:
            await asyncio.wait([self._writing])
            self._writing.exception()
        shutil.rmtree(self.folder, ignore_errors=True)

    async def _flush(self) -> None:
        await self._wait()  # one shard being written while the next is packed
        if self._shard:
            path = self.folder / f"shard-{self.files:05d}.safetensors"
            # The names in the safetensors metadata keep the order the actor sent them in.
            metadata = {"format": "pt", "names": json.dumps(list(self._shard))}
            self._writing = asyncio.ensure_future(asyncio.to_thread(save_file, self._shard, path, metadata))
            self.files += 1
            self._shard, self._shard_bytes = {}, 0

    async def _wait(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            await writing


def _remove_written(root: Path) -> int:
    """Remove the versions of earlier syncs and the folders a killed writer left; how many versions."""
    removed = [entry.path for entry in os.scandir(root) if _WRITTEN.fullmatch(entry.name)]
    for path in removed:
        shutil.rmtree(path)
    return sum(not path.endswith(".tmp") for path in removed)


def _make_default_dir() -> tuple[str, int]:
    """A fresh folder under /dev/shm (else the temp dir), locked by this process while it lives; first removes the
    folders of dead writers (their lock released by the kernel), which no exit handler of theirs removed."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    for entry in os.scandir(base):
        if entry.name.startswith(DEFAULT_PREFIX) and _is_abandoned(Path(entry.path)):
            shutil.rmtree(entry.path, ignore_errors=True)
    # Locked under a name no sweep matches, then renamed: a sweep never sees it unlocked.
    creating = tempfile.mkdtemp(prefix=f".creating-{DEFAULT_PREFIX}", dir=base)
    lock = os.open(os.path.join(creating, LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    folder = os.path.join(base, f"{DEFAULT_PREFIX}{secrets.token_hex(6)}")
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


def _write_failed(root: Path, version: int, shards: _ShardWriter, error: OSError) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = (
            f"{root} is full: free space there, or set {DIR_KEY} to a filesystem with room for a version of the "
            "model (/dev/shm is RAM, sized by --shm-size in containers)"
        )
    else:
        fix = f"check that actor rank 0 can create and write files in {root}, or set {DIR_KEY} to a folder it can"
    return (
        f"checkpoint weight sync: writing weight version {version} to {root} failed after "
        f"{shards.payload_bytes / 2**20:.1f} MiB: {error}. No part of it is visible as a version. Fix: {fix}."
    )
