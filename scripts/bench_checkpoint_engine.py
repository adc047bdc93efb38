"""Benchmark the ``checkpoint`` (file) engine against the ``gloo`` engine on the same weights.

What: one sender and N receivers, each in its own process, holding both engines. Each repetition
runs one full sync through each engine, in alternating order, of the same synthetic Qwen2-shaped
bf16 weights as ``scripts/bench_gloo_engine.py`` (~310 MB by default; its helpers do the timing):
from the sender entering ``send_weights`` until the last receiver pulled every tensor. The file
engine writes into a fresh folder under /dev/shm (``--dir`` for another filesystem) and, as in
training, removes the versions every receiver has loaded on the next write. Throughput is payload
bytes / wall time (not multiplied by the number of receivers); the number to watch is the ratio
checkpoint / gloo, taken per repetition from two syncs run back to back, so load on a shared
machine affects both alike. The per-sync setup and teardown (prepare, init_process_group, finalize)
are reported apart. With ``--consumer drop`` the file engine's receivers never touch the payload
(they yield views of the files as safetensors maps them; pages are read on first touch), so only
``--consumer load`` compares the two engines like for like.

Why: the file engine trades the broadcast's pipelining for files (written whole, then read by
every receiver); this shows what that costs where both engines can run, one node.

How:
    python scripts/bench_checkpoint_engine.py --consumer load   # 2 receivers, 64 MiB shards, 5 reps
    python scripts/bench_checkpoint_engine.py                   # receivers drop the tensors unread
    python scripts/bench_checkpoint_engine.py --dir /mnt/nfs/tmp --layers 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from multiprocessing import get_context

import torch.distributed as dist
from bench_gloo_engine import _engine_call, _engine_receive, _engine_send, _gather, _gbps, _setup_rank, _state

from recipe.one_step_off_async.weight_sync.files import FileCheckpointEngine
from recipe.one_step_off_async.weight_sync.gloo import GlooCheckpointEngine

ENGINES = {"gloo": GlooCheckpointEngine, "checkpoint": FileCheckpointEngine}


def _add_file_engine(engine_kwargs: dict) -> None:
    """Next to the gloo engine that ``_setup_rank`` built, the file engine."""
    _state["engines"] = {"gloo": _state["engine"], "checkpoint": FileCheckpointEngine(**engine_kwargs)}


def _use(backend: str) -> None:
    """Point ``bench_gloo_engine``'s timed calls at one engine."""
    _state["engine"] = _state["engines"][backend]


def _sync(ranks: list[ProcessPoolExecutor], backend: str, version: int, load: bool, nbytes: int) -> tuple[float, float]:
    """One sync through ``backend``: (GB/s, seconds of setup and teardown)."""
    _gather([executor.submit(_use, backend) for executor in ranks])
    setup_start = time.monotonic()
    metadata = _gather([executor.submit(_engine_call, "prepare", {}) for executor in ranks])
    actor_kwargs, rollout_kwargs = ENGINES[backend].build_topology(1, len(ranks) - 1, metadata)
    init_kwargs = [{key: values[0] for key, values in actor_kwargs.items()}] + [
        {key: values[i] for key, values in rollout_kwargs.items()} for i in range(len(ranks) - 1)
    ]
    _gather(
        [
            executor.submit(_engine_call, "init_process_group", kwargs)
            for executor, kwargs in zip(ranks, init_kwargs, strict=True)
        ]
    )
    setup = time.monotonic() - setup_start
    sent = ranks[0].submit(_engine_send, version)
    received = _gather([executor.submit(_engine_receive, version, load) for executor in ranks[1:]])
    assert all(got == nbytes for _, got in received), f"a receiver missed bytes ({backend})"
    gbps = _gbps(nbytes, [sent.result(timeout=600)] + [span for span, _ in received])
    finalize_start = time.monotonic()
    _gather([executor.submit(_engine_call, "finalize", {}) for executor in ranks])
    return gbps, setup + time.monotonic() - finalize_start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--bucket-mb", type=int, default=64, help="gloo bucket and checkpoint shard size")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the synthetic model (8: ~310 MB)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--consumer",
        choices=("load", "drop"),
        default="drop",
        help="drop: the engine alone, file engine's tensors unread (default); load: also copy into a model",
    )
    parser.add_argument("--dir", default="/dev/shm", help="where the file engine's folder is made")
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="bench-checkpoint-engine-", dir=args.dir)
    world_size = 1 + args.receivers
    raw_store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=300), wait_for_workers=False)
    ranks = [ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) for _ in range(world_size)]
    try:
        common = {"bucket_size": args.bucket_mb << 20, "timeout_s": 300}
        nbytes = _gather(
            [
                executor.submit(
                    _setup_rank, rank, world_size, raw_store.port, {**common, "is_master": rank == 0}, args.layers
                )
                for rank, executor in enumerate(ranks)
            ]
        )[0]
        _gather(
            [
                executor.submit(_add_file_engine, {**common, "is_master": rank == 0, "dir": folder})
                for rank, executor in enumerate(ranks)
            ]
        )
        print(
            f"{nbytes / 1e6:.0f} MB of bf16 weights in {args.layers}+2 layers of tensors; 1 sender -> "
            f"{args.receivers} receiver(s); bucket/shard {args.bucket_mb} MiB; consumer {args.consumer}; files in "
            f"{args.dir}; {os.cpu_count()} CPU cores; load average {os.getloadavg()[0]:.2f}"
        )

        results: dict[str, list[tuple[float, float]]] = {backend: [] for backend in ENGINES}
        for rep in range(args.reps):
            order = list(ENGINES) if rep % 2 == 0 else list(reversed(ENGINES))
            for backend in order:
                results[backend].append(_sync(ranks, backend, rep + 1, args.consumer == "load", nbytes))
            gloo, checkpoint = results["gloo"][-1], results["checkpoint"][-1]
            print(
                f"rep {rep} ({' then '.join(order)}): gloo {gloo[0]:.2f} GB/s, checkpoint {checkpoint[0]:.2f} GB/s, "
                f"ratio {checkpoint[0] / gloo[0]:.2f}; setup+teardown gloo {gloo[1] * 1e3:.0f} ms, "
                f"checkpoint {checkpoint[1] * 1e3:.0f} ms"
            )

        print(f"median over {args.reps} reps:")
        for backend, runs in results.items():
            print(
                f"  {backend:<10} {statistics.median(g for g, _ in runs):5.2f} GB/s; setup+teardown "
                f"{statistics.median(s for _, s in runs) * 1e3:.0f} ms"
            )
        paired = sorted(c / g for (c, _), (g, _) in zip(results["checkpoint"], results["gloo"], strict=True))
        print(
            f"  checkpoint / gloo per rep: median {statistics.median(paired):.2f}, range {paired[0]:.2f}-{paired[-1]:.2f}"
        )
        print(f"  load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        for executor in ranks:
            executor.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
