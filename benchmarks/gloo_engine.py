"""Benchmark the ``gloo`` checkpoint engine against a raw gloo broadcast of the same bytes.

What: one sender and N receivers, each in its own process. Each repetition times, in turn,
- raw:        one ``ProcessGroupGloo.broadcast`` of a flat buffer holding all the bytes, into a
              buffer each receiver allocated and touched beforehand (the brief's baseline);
- raw, fresh: the same broadcast into a buffer each receiver allocates just before (pages not yet
              touched), the least any receiver does that hands out memory of its own;
- engine:     a full engine sync of synthetic Qwen2-shaped bf16 weights (~310 MB by default), from
              the sender entering ``send_weights`` until the last receiver pulled every tensor
              (the engine alone, like for like with the raw broadcast: its tensors are mostly
              views into its buffers). ``--consumer load`` also copies each tensor into a
              preallocated, touched model before pulling the next, as a rollout server's weight update
              does (vLLM loads each tensor into its model): engine plus the server's own copy.
Throughput is payload bytes / wall time (not multiplied by the number of receivers). CPU time is
summed over all processes and their threads; on a shared machine it varies less than wall time.
The engine's per-sync group setup and teardown (prepare, init_process_group, finalize) are
reported apart.

Why: the engine adds bucketing, per-bucket headers and a copy on each side (into the send bucket;
out of the receive bucket into the model, overlapped with the next bucket) on top of the broadcast;
this shows what that costs. The engine / raw ratio is the number to watch.

How:
    python -m benchmarks gloo-engine                         # 2 receivers, 64 MiB buckets, 5 reps
    python -m benchmarks gloo-engine --receivers 1 --bucket-mb 16 --layers 12
    python -m benchmarks gloo-engine --consumer load         # receivers also load the weights into a model
    python -m benchmarks gloo-engine --receivers 1 --layers 1 --hidden-size 64 --reps 1   # seconds: a smoke test
"""

from __future__ import annotations

import os
import statistics
from datetime import timedelta

import torch.distributed as dist

from benchmarks import argument_parser
from benchmarks.weight_sync_common import ProcessRanks, add_engine_arguments, gbps, run_sync, synthetic_model


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    add_engine_arguments(parser, bucket_help=None, drop_help="the engine alone, like the raw broadcast")
    args = parser.parse_args(argv)

    world_size = 1 + args.receivers
    raw_store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=300), wait_for_workers=False)
    engine = {"bucket_size": args.bucket_mb << 20, "timeout_s": 300}
    ranks = ProcessRanks([{"gloo": {**engine, "is_master": rank == 0}} for rank in range(world_size)])
    everyone = range(world_size)
    try:
        shapes = synthetic_model(args.layers, args.hidden_size)
        nbytes = ranks.get([ranks.submit(rank, "load", shapes, "bfloat16", rank == 0) for rank in everyone])[0]
        ranks.get([ranks.submit(rank, "join_raw_group", rank, world_size, raw_store.port) for rank in everyone])
        ranks.get([ranks.submit(rank, "allocate_flat", nbytes) for rank in everyone])
        print(
            f"{nbytes / 1e6:.0f} MB of bf16 weights in {args.layers}+2 layers of tensors; 1 sender -> "
            f"{args.receivers} receiver(s); bucket {args.bucket_mb} MiB; consumer {args.consumer}; "
            f"{os.cpu_count()} CPU cores; load average {os.getloadavg()[0]:.2f}"
        )

        results: dict[str, list[tuple[float, float]]] = {"raw": [], "raw, fresh": [], "engine": []}
        setup_s = []
        for rep in range(args.reps):
            for name, fresh in (("raw", False), ("raw, fresh", True)):
                spans = ranks.get([ranks.submit(rank, "raw_broadcast", fresh) for rank in everyone])
                results[name].append((gbps(nbytes, spans), sum(span.cpu_s for span in spans)))

            sync = run_sync(ranks, nbytes, rep, load=args.consumer == "load")
            results["engine"].append((gbps(nbytes, sync.spans), sum(span.cpu_s for span in sync.spans)))
            setup_s.append(sync.setup_s)
            print(
                f"rep {rep}: "
                + ", ".join(
                    f"{name} {runs[-1][0]:.2f} GB/s ({runs[-1][1]:.2f} CPU s)" for name, runs in results.items()
                )
                + f"; engine group setup+teardown {setup_s[-1] * 1e3:.0f} ms"
            )

        medians = {
            name: (statistics.median(g for g, _ in runs), statistics.median(c for _, c in runs))
            for name, runs in results.items()
        }
        print(f"median over {args.reps} reps:")
        for name, (throughput, cpu_s) in medians.items():
            print(f"  {name:<11} {throughput:5.2f} GB/s  {cpu_s:5.2f} CPU s per transfer")
        engine = medians["engine"][0]
        print(
            f"  engine / raw = {engine / medians['raw'][0]:.2f}, engine / raw fresh = "
            f"{engine / medians['raw, fresh'][0]:.2f}; group setup+teardown {statistics.median(setup_s) * 1e3:.0f} ms"
        )
        # Each rep's engine run against the raw runs just before it: steadier on a shared machine.
        for name in ("raw", "raw, fresh"):
            paired = sorted(e / r for (e, _), (r, _) in zip(results["engine"], results[name], strict=True))
            print(
                f"  engine / {name} per rep: median {statistics.median(paired):.2f}, "
                f"range {paired[0]:.2f}-{paired[-1]:.2f}"
            )
        print(f"  load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        ranks.close()
