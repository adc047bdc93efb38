"""Weight-sync time against model size: a checkpoint engine's fixed cost and its bandwidth.

What: Qwen2 configs from ~0.1M to ~120M parameters (built locally on the meta device for their
tensor names and shapes; the weights are random), synced from one sender to ``--receivers``
receivers, each rank in its own process, driven the way verl's ``CheckpointEngineManager`` drives
a sync: ``prepare`` on every rank, ``build_topology``, ``init_process_group`` on every rank,
``send_weights`` | ``receive_weights`` (each receiver copies every tensor into its model before
pulling the next, as a rollout server does), ``finalize`` on every rank. A sync's time runs from the
first ``prepare`` to the last ``finalize``. A least-squares fit of time = fixed + bytes / bandwidth
over all sizes prints the two numbers; the smallest size also gets its split by phase.

- ``--backend gloo`` (default): the recipe's engine on CPU, ranks in spawned processes (helpers in
  ``benchmarks/weight_sync_common.py``, shared with ``gloo-engine``). ``--keep-group both`` (default)
  syncs every size with the group rebuilt in every sync (``keep_group=False``, the engine before the
  group was kept) and with the group kept across syncs, alternating on the same ranks (side by side),
  and prints the ratio per size.
- ``--backend nccl``: verl's ``NCCLCheckpointEngine`` (cupy + CUDA) on one GPU. Its rendezvous
  goes through ``ray.util.collective``, so the ranks are local Ray actors (``num_gpus=0``: they all
  use ``cuda:0`` of what ``CUDA_VISIBLE_DEVICES`` shows the driver) and each gets its own
  ``NCCL_HOSTID``, without which NCCL refuses two ranks on one GPU. ``--bucket-mb`` defaults to
  verl's 2048 (the engine allocates two buckets per rank in every ``prepare``); compare with a
  smaller one to see what that allocation costs. ``--keep-group`` maps to the engine's
  ``rebuild_group``; it defaults to ``on``, verl's default. ``both`` switches the engine's
  ``rebuild_group`` between syncs on the same actors; that switching has not run on a GPU yet (a
  rebuilt NCCL group cost ~3 s a sync on one H100, measured with one set of actors per mode).
- ``--shape qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b``: real model shapes instead of the size grid (the
  public Qwen2.5 configs, ``QWEN2_5_SHAPES``; ``--max-params`` does not apply). Qwen2.5 ties
  ``lm_head`` to the embedding, but ``module.state_dict()``, which verl's FSDP actor sends, holds both,
  so the bytes include ``lm_head.weight``. ``--dtype float32`` sends what the FSDP2 actor holds; a
  line per shape gives the median sync time and the GB/s it implies (bytes / sync time).
- ``--json PATH`` also writes every size's syncs, medians and GB/s and the fit, for scripts
  (``scripts/gpu_verify.sh``).

Why: a sync of the 0.4M-parameter demo model takes ~0.05 s on CPU and 0.36-0.55 s on an H100, all
of it fixed cost; this separates the fixed part from the per-byte part and shows the phases.

How (from the repository root):
    python -m benchmarks weight-sync                             # gloo, 2 receivers, keep_group off vs on
    python -m benchmarks weight-sync --receivers 1 --reps 3 --max-params 20e6
    python -m benchmarks weight-sync --backend nccl --receivers 1             # on a GPU machine
    python -m benchmarks weight-sync --backend nccl --receivers 1 --bucket-mb 64
    python -m benchmarks weight-sync --backend nccl --receivers 1 --dtype float32 --reps 2 \\
        --shape qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b --json sync.json    # 13.6 GB a copy at 3B: ~40 GB of GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

from benchmarks import argument_parser
from benchmarks.weight_sync_common import WAIT_S, ProcessRanks, RankWorker, Sync, qwen2_shapes, run_sync

# (hidden, intermediate, layers, vocab, attention heads, kv heads): ~0.1M, 0.4M, 2M, 10M, 40M, 120M params.
CONFIGS = (
    (32, 64, 2, 1024, 4, 2),
    (64, 128, 2, 2048, 4, 2),
    (128, 384, 4, 4096, 4, 2),
    (256, 768, 8, 8192, 8, 4),
    (512, 1408, 8, 16384, 8, 4),
    (768, 2048, 12, 32000, 12, 4),
)

# The public Qwen2.5 configs (config.json of each), in the order of CONFIGS' fields.
QWEN2_5_SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 151936, 14, 2),
    "qwen2.5-1.5b": (1536, 8960, 28, 151936, 12, 2),
    "qwen2.5-3b": (2048, 11008, 36, 151936, 16, 2),
}


def shape_names(text: str) -> list[str]:
    """``--shape``: comma-separated names from ``QWEN2_5_SHAPES``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in QWEN2_5_SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown shape(s) {unknown}: choose from {', '.join(QWEN2_5_SHAPES)}")
    return names


class RayRanks:
    """nccl: each rank a local Ray actor with no Ray GPU (all share ``cuda:0``) and its own NCCL_HOSTID."""

    def __init__(self, engine_kwargs: list[dict]) -> None:
        import ray

        self._ray = ray
        env = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}  # leave CUDA_VISIBLE_DEVICES as the driver has it
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        ray.init(num_cpus=len(engine_kwargs) + 1, num_gpus=0, include_dashboard=False, runtime_env={"env_vars": env})
        actor = ray.remote(num_gpus=0, num_cpus=1)(RankWorker)
        self._ranks = [
            actor.options(runtime_env={"env_vars": {"NCCL_HOSTID": f"bench-weight-sync-rank{rank}"}}).remote(
                {"nccl": kwargs}, "cuda"
            )
            for rank, kwargs in enumerate(engine_kwargs)
        ]

    def __len__(self) -> int:
        return len(self._ranks)

    def submit(self, rank: int, method: str, *args):
        return self._ranks[rank].invoke.remote(method, *args)

    def get(self, futures: list) -> list:
        return self._ray.get(futures, timeout=WAIT_S)

    def close(self) -> None:
        self._ray.shutdown()


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of seconds = fixed + bytes / bandwidth, each point weighted by 1 / seconds^2
    (relative errors: on a busy machine the noise grows with the time, and unweighted the largest
    sizes alone would set the fixed part). Returns (fixed seconds, bytes per second)."""
    weights = [1 / y**2 for _, y in points]
    total = sum(weights)
    mean_x = sum(w * x for w, (x, _) in zip(weights, points, strict=True)) / total
    mean_y = sum(w * y for w, (_, y) in zip(weights, points, strict=True)) / total
    covariance = sum(w * (x - mean_x) * (y - mean_y) for w, (x, y) in zip(weights, points, strict=True))
    slope = covariance / sum(w * (x - mean_x) ** 2 for w, (x, _) in zip(weights, points, strict=True))
    return mean_y - slope * mean_x, (1 / slope if slope > 0 else float("inf"))


def bench(args, modes: tuple[bool, ...], shapes: list[dict]) -> dict[bool, list[list[Sync]]]:
    """Every size, each repetition running every mode (keep the group or not) in turn on the same
    ranks, so that the modes are compared side by side. Each timed sync follows an untimed one in
    the same mode (the first sync after switching to a kept group builds it). Returns, per mode,
    the timed syncs of each size."""
    receivers = args.receivers
    everyone = range(1 + receivers)
    kwargs = {"bucket_size": args.bucket_mb << 20}
    if args.backend == "gloo":
        ranks = ProcessRanks([{"gloo": {**kwargs, "timeout_s": 300, "is_master": rank == 0}} for rank in everyone])
    else:
        ranks = RayRanks([{**kwargs, "is_master": rank == 0} for rank in everyone])
    results: dict[bool, list[list[Sync]]] = {keep: [] for keep in modes}
    version = 0
    try:
        for shape in shapes:
            nbytes = ranks.get([ranks.submit(rank, "load", shape, args.dtype, rank == 0) for rank in everyone])[0]
            for keep in modes:
                results[keep].append([])
            for _ in range(args.reps):
                for keep in modes:
                    ranks.get([ranks.submit(rank, "keep_group", keep) for rank in everyone])
                    for timed in (False, True):
                        version += 1
                        sync = run_sync(ranks, nbytes, version)
                        if timed:
                            results[keep][-1].append(sync)
            params = sum(torch.Size(s).numel() for s in shape.values())
            line = f"  {params / 1e6:7.2f}M params {nbytes / 1e6:7.1f} MB:"
            for keep in modes:
                syncs = results[keep][-1]
                line += (
                    f"  {MODE[keep]} {statistics.median(s.total for s in syncs) * 1e3:7.1f} ms"
                    f" (transfer {statistics.median(s.transfer for s in syncs) * 1e3:6.1f})"
                )
            if len(modes) == 2:
                ratios = [off.total / on.total for off, on in zip(results[False][-1], results[True][-1], strict=True)]
                line += f"  rebuilt/kept {statistics.median(ratios):.2f}"
            print(line, flush=True)
    finally:
        ranks.close()
    return results


MODE = {False: "rebuilt", True: "kept"}


def print_phases(label: str, syncs: list[Sync]) -> None:
    def ms(values) -> str:
        return f"{statistics.median(values) * 1e3:7.2f} ms"

    print(f"  {label}: median of {len(syncs)} syncs")
    for phase in ("prepare", "init", "transfer", "finalize", "total"):
        print(f"    {phase:<28} {ms([getattr(sync, phase) for sync in syncs])}")
    for side, key in (("sender", "sender"), ("receiver", "receiver")):
        for metric in sorted(getattr(syncs[0], key)):
            if metric.endswith("_s"):
                label = f"{side} {metric.removeprefix('checkpoint_engine/')}"
                print(f"    {label:<28} {ms([getattr(sync, key)[metric] for sync in syncs])}")


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument(
        "--bucket-mb", type=int, default=None, help="default: 16 for gloo (the CPU profile), 2048 for nccl (verl's)"
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--reps", type=int, default=5, help="timed syncs per size, after one warm-up sync")
    parser.add_argument("--max-params", type=float, default=200e6, help="skip grid configs larger than this")
    parser.add_argument(
        "--shape",
        type=shape_names,
        default=None,
        help=f"real model shapes instead of the size grid, comma-separated: {','.join(QWEN2_5_SHAPES)}",
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument(
        "--keep-group",
        choices=("both", "on", "off"),
        default=None,
        help="keep the engine's group across syncs (gloo keep_group, nccl not rebuild_group), or compare both "
        "(default: both for gloo; on for nccl, verl's default)",
    )
    args = parser.parse_args(argv)
    if args.bucket_mb is None:
        args.bucket_mb = 16 if args.backend == "gloo" else 2048
    if args.keep_group is None:
        args.keep_group = "both" if args.backend == "gloo" else "on"

    configs = [QWEN2_5_SHAPES[name] for name in args.shape] if args.shape else list(CONFIGS)
    shapes = [qwen2_shapes(*config) for config in configs]
    sizes = [sum(torch.Size(s).numel() for s in shape.values()) for shape in shapes]
    chosen = [i for i, params in enumerate(sizes) if args.shape or params <= args.max_params]
    shapes = [shapes[i] for i in chosen]
    labels = [args.shape[i] if args.shape else f"{sizes[i] / 1e6:.2f}M" for i in chosen]
    print(
        f"{args.backend}: 1 sender -> {args.receivers} receiver(s), {args.dtype}, bucket {args.bucket_mb} MiB, "
        f"{args.reps} timed syncs per size and mode, each after an untimed one; {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.keep_group]
    itemsize = getattr(torch, args.dtype).itemsize
    nbytes_per_size = [sum(torch.Size(s).numel() for s in shape.values()) * itemsize for shape in shapes]
    print("sync time per size, median (rebuilt: a new group every sync; kept: the group kept across syncs):")
    results = bench(args, modes, shapes)
    print("fit: sync time = fixed + bytes / bandwidth")
    for keep in modes:
        points = [
            (nbytes, statistics.median(s.total for s in syncs))
            for nbytes, syncs in zip(nbytes_per_size, results[keep], strict=True)
        ]
        fixed, bandwidth = fit(points)
        print(f"  group {MODE[keep]:<8} fixed {fixed * 1e3:7.1f} ms   bandwidth {bandwidth / 1e9:6.2f} GB/s")
    print(f"phases at the smallest size ({sizes[chosen[0]] / 1e6:.2f}M params), driver-side and engine-reported:")
    for keep in modes:
        print_phases(f"group {MODE[keep]}", results[keep][0])
    if args.shape:
        print("per shape: median sync (first prepare to last finalize), bytes / sync time")
        for label, nbytes, syncs in zip(labels, nbytes_per_size, results[modes[-1]], strict=True):
            seconds = statistics.median(s.total for s in syncs)
            print(f"  {label:<14} {nbytes / 1e9:6.2f} GB  {seconds:7.3f} s  {nbytes / seconds / 1e9:6.2f} GB/s")
    if args.json:
        write_json(args, modes, labels, nbytes_per_size, results)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def write_json(args, modes, labels: list[str], nbytes_per_size: list[int], results) -> None:
    """Every size's timed syncs (seconds), their medians, the GB/s they imply, and the fit, per group mode."""
    summary = {
        "backend": args.backend,
        "receivers": args.receivers,
        "dtype": args.dtype,
        "bucket_mb": args.bucket_mb,
        "reps": args.reps,
        "groups": {},
    }
    for keep in modes:
        sizes = []
        for label, nbytes, syncs in zip(labels, nbytes_per_size, results[keep], strict=True):
            seconds = statistics.median(s.total for s in syncs)
            transfer = statistics.median(s.transfer for s in syncs)
            sizes.append(
                {
                    "name": label,
                    "bytes": nbytes,
                    "sync_s": [s.total for s in syncs],
                    "median_sync_s": seconds,
                    "median_transfer_s": transfer,
                    "gb_per_s": nbytes / seconds / 1e9,
                    "transfer_gb_per_s": nbytes / transfer / 1e9,
                }
            )
        fixed, bandwidth = fit([(size["bytes"], size["median_sync_s"]) for size in sizes])
        summary["groups"][MODE[keep]] = {"sizes": sizes, "fit_fixed_s": fixed, "fit_gb_per_s": bandwidth / 1e9}
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
