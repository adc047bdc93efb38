"""Benchmark the ``checkpoint`` (file) engine against the ``gloo`` engine on the same weights.

What: one sender and N receivers, each in its own process, holding both engines. Each repetition
runs one full sync through each engine, in alternating order, of the same synthetic Qwen2-shaped
bf16 weights as ``python -m benchmarks gloo-engine`` (~310 MB by default; ``weight_sync_common`` times both):
from the sender entering ``send_weights`` until the last receiver pulled every tensor. The file
engine writes into a fresh folder under /dev/shm (``--dir`` for another filesystem) and, as in
training, removes the versions every receiver has loaded on the next write. Throughput is payload
bytes / wall time (not multiplied by the number of receivers); the number to watch is the ratio
checkpoint / gloo, taken per repetition from two syncs run back to back, so load on a shared
machine affects both alike. The per-sync setup and teardown (prepare, init_process_group, finalize)
are reported apart. With ``--consumer drop`` the receivers discard what the engine yields (the file engine
has read each tensor from its file by then); ``--consumer load`` also copies it into a model, as a rollout
worker does.

Why: the file engine trades the broadcast's pipelining for files (written whole, then read by
every receiver); this shows what that costs where both engines can run, one node.

How:
    python -m benchmarks checkpoint-engine --consumer load      # 2 receivers, 64 MiB shards, 5 reps
    python -m benchmarks checkpoint-engine                      # receivers discard the tensors
    python -m benchmarks checkpoint-engine --dir /mnt/nfs/tmp --layers 4
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile

from benchmarks import argument_parser
from benchmarks.weight_sync_common import ProcessRanks, add_engine_arguments, gbps, run_sync, synthetic_model

ENGINES = ("gloo", "checkpoint")


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    add_engine_arguments(
        parser,
        bucket_help="gloo bucket and checkpoint shard size",
        drop_help="the engines alone, nothing loaded into a model",
    )
    parser.add_argument("--dir", default="/dev/shm", help="where the file engine's folder is made")
    args = parser.parse_args(argv)

    folder = tempfile.mkdtemp(prefix="bench-checkpoint-engine-", dir=args.dir)
    world_size = 1 + args.receivers
    common = {"bucket_size": args.bucket_mb << 20, "timeout_s": 300}
    engines = [
        {"gloo": {**common, "is_master": rank == 0}, "checkpoint": {**common, "is_master": rank == 0, "dir": folder}}
        for rank in range(world_size)
    ]
    ranks = ProcessRanks(engines)
    everyone = range(world_size)
    try:
        shapes = synthetic_model(args.layers, args.hidden_size)
        nbytes = ranks.get([ranks.submit(rank, "load", shapes, "bfloat16", rank == 0) for rank in everyone])[0]
        print(
            f"{nbytes / 1e6:.0f} MB of bf16 weights in {args.layers}+2 layers of tensors; 1 sender -> "
            f"{args.receivers} receiver(s); bucket/shard {args.bucket_mb} MiB; consumer {args.consumer}; files in "
            f"{args.dir}; {os.cpu_count()} CPU cores; load average {os.getloadavg()[0]:.2f}"
        )

        # backend: (GB/s, seconds of setup and teardown) of each sync
        results: dict[str, list[tuple[float, float]]] = {backend: [] for backend in ENGINES}
        for rep in range(args.reps):
            order = list(ENGINES) if rep % 2 == 0 else list(reversed(ENGINES))
            for backend in order:
                ranks.get([ranks.submit(rank, "use", backend) for rank in everyone])
                sync = run_sync(ranks, nbytes, rep + 1, load=args.consumer == "load")
                results[backend].append((gbps(nbytes, sync.spans), sync.setup_s))
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
        ranks.close()
        shutil.rmtree(folder, ignore_errors=True)
