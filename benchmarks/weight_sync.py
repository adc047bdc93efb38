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
- ``--dtype float32,bfloat16``: every size synced in each dtype, alternating on the same ranks (side by
  side, as ``--keep-group both`` alternates; the weights of a dtype loaded again at each switch, so that
  one dtype's copy is held at a time), and a line per size and dtype with the median of each sync's time
  over the same repetition's in the first dtype (``bfloat16/float32``): what a sync cast to the rollout's
  dtype (bf16 on the GPU profiles) saves against the FSDP2 actor's fp32. Sender and receivers hold the
  weights in the sync's dtype (the cast itself is not timed).
- ``--json PATH`` also writes every size's syncs, medians and GB/s and the fit per group mode and dtype,
  and each later dtype's time ratio to the first, for scripts (``scripts/gpu_verify.sh``).

Why: a sync of the 0.4M-parameter demo model takes ~0.05 s on CPU and 0.36-0.55 s on an H100, all
of it fixed cost; this separates the fixed part from the per-byte part and shows the phases.

How (from the repository root):
    python -m benchmarks weight-sync                             # gloo, 2 receivers, keep_group off vs on
    python -m benchmarks weight-sync --receivers 1 --reps 3 --max-params 20e6
    python -m benchmarks weight-sync --backend nccl --receivers 1             # on a GPU machine
    python -m benchmarks weight-sync --backend nccl --receivers 1 --bucket-mb 64
    python -m benchmarks weight-sync --backend nccl --receivers 1 --dtype float32 --reps 2 \\
        --shape qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b --json sync.json    # 13.6 GB a copy at 3B: ~40 GB of GPU
    python -m benchmarks weight-sync --receivers 1 --reps 3 --keep-group on \\
        --shape qwen2.5-0.5b --dtype float32,bfloat16                     # fp32 against bf16, side by side
    python -m benchmarks weight-sync --backend nccl --receivers 1 --reps 2 \\
        --shape qwen2.5-3b --dtype float32,bfloat16 --json sync.json      # the same on a GPU
"""

from __future__ import annotations

import argparse
import json
import math
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


def dtype_names(text: str) -> list[str]:
    """``--dtype``: comma-separated torch dtypes, the first the one the others are compared with."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if not isinstance(getattr(torch, name, None), torch.dtype)]
    if unknown or not names or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"dtype(s) {names}: distinct torch dtypes, e.g. float32,bfloat16")
    return names


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
    sizes alone would set the fixed part). Returns (fixed seconds, bytes per second); NaNs from one size."""
    if len({x for x, _ in points}) < 2:
        return float("nan"), float("nan")
    weights = [1 / y**2 for _, y in points]
    total = sum(weights)
    mean_x = sum(w * x for w, (x, _) in zip(weights, points, strict=True)) / total
    mean_y = sum(w * y for w, (_, y) in zip(weights, points, strict=True)) / total
    covariance = sum(w * (x - mean_x) * (y - mean_y) for w, (x, y) in zip(weights, points, strict=True))
    slope = covariance / sum(w * (x - mean_x) ** 2 for w, (x, _) in zip(weights, points, strict=True))
    return mean_y - slope * mean_x, (1 / slope if slope > 0 else float("inf"))


def bench(args, dtypes: list[str], modes: tuple[bool, ...], shapes: list[dict]) -> dict[tuple, list[list[Sync]]]:
    """Every size, each repetition running every dtype and mode (keep the group or not) in turn on the same
    ranks, so that they are compared side by side; a dtype's weights are loaded when a repetition switches to
    it. Each timed sync follows an untimed one in the same dtype and mode (the first sync after switching to a
    kept group builds it). Returns, per (dtype, mode), the timed syncs of each size."""
    receivers = args.receivers
    everyone = range(1 + receivers)
    kwargs = {"bucket_size": args.bucket_mb << 20}
    if args.backend == "gloo":
        ranks = ProcessRanks([{"gloo": {**kwargs, "timeout_s": 300, "is_master": rank == 0}} for rank in everyone])
    else:
        ranks = RayRanks([{**kwargs, "is_master": rank == 0} for rank in everyone])
    results: dict[tuple, list[list[Sync]]] = {(dtype, keep): [] for dtype in dtypes for keep in modes}
    version = 0
    try:
        for shape in shapes:
            for syncs in results.values():
                syncs.append([])
            nbytes, loaded = {}, None
            for _ in range(args.reps):
                for dtype in dtypes:
                    if dtype != loaded:
                        nbytes[dtype] = ranks.get(
                            [ranks.submit(rank, "load", shape, dtype, rank == 0) for rank in everyone]
                        )[0]
                        loaded = dtype
                    for keep in modes:
                        ranks.get([ranks.submit(rank, "keep_group", keep) for rank in everyone])
                        for timed in (False, True):
                            version += 1
                            sync = run_sync(ranks, nbytes[dtype], version)
                            if timed:
                                results[dtype, keep][-1].append(sync)
            params = sum(torch.Size(s).numel() for s in shape.values())
            for dtype in dtypes:
                line = f"  {params / 1e6:7.2f}M params {dtype:<9} {nbytes[dtype] / 1e6:7.1f} MB:"
                for keep in modes:
                    syncs = results[dtype, keep][-1]
                    line += (
                        f"  {MODE[keep]} {statistics.median(s.total for s in syncs) * 1e3:7.1f} ms"
                        f" (transfer {statistics.median(s.transfer for s in syncs) * 1e3:6.1f})"
                    )
                if len(modes) == 2:
                    line += f"  rebuilt/kept {ratio(results[dtype, False][-1], results[dtype, True][-1]):.2f}"
                if dtype != dtypes[0]:
                    baseline = results[dtypes[0], modes[-1]][-1]
                    line += f"  {dtype}/{dtypes[0]} {ratio(results[dtype, modes[-1]][-1], baseline):.2f}"
                print(line, flush=True)
    finally:
        ranks.close()
    return results


def ratio(syncs: list[Sync], baseline: list[Sync]) -> float:
    """The median of each sync's time over the baseline's sync of the same repetition (side by side)."""
    return statistics.median(s.total / b.total for s, b in zip(syncs, baseline, strict=True))


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
    parser.add_argument(
        "--dtype",
        type=dtype_names,
        default=["bfloat16"],
        help="the weights' dtype, or several comma-separated, synced side by side and compared with the first "
        "(float32,bfloat16)",
    )
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
        f"{args.backend}: 1 sender -> {args.receivers} receiver(s), {','.join(args.dtype)}, "
        f"bucket {args.bucket_mb} MiB, "
        f"{args.reps} timed syncs per size, dtype and mode, each after an untimed one; {os.cpu_count()} CPU cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.keep_group]
    nbytes = {dtype: [sizes[i] * getattr(torch, dtype).itemsize for i in chosen] for dtype in args.dtype}
    print("sync time per size, median (rebuilt: a new group every sync; kept: the group kept across syncs):")
    results = bench(args, args.dtype, modes, shapes)
    runs = [(dtype, keep) for dtype in args.dtype for keep in modes]
    print("fit: sync time = fixed + bytes / bandwidth")
    for dtype, keep in runs:
        points = [
            (n, statistics.median(s.total for s in syncs))
            for n, syncs in zip(nbytes[dtype], results[dtype, keep], strict=True)
        ]
        fixed, bandwidth = fit(points)
        print(f"  group {MODE[keep]:<8} {dtype:<9} fixed {fixed * 1e3:7.1f} ms   bandwidth {bandwidth / 1e9:6.2f} GB/s")
    print(f"phases at the smallest size ({sizes[chosen[0]] / 1e6:.2f}M params), driver-side and engine-reported:")
    for dtype, keep in runs:
        print_phases(f"group {MODE[keep]}, {dtype}", results[dtype, keep][0])
    if args.shape:
        print("per shape: median sync (first prepare to last finalize), bytes / sync time")
        first = args.dtype[0]
        for i, label in enumerate(labels):
            for dtype in args.dtype:
                syncs = results[dtype, modes[-1]][i]
                seconds = statistics.median(s.total for s in syncs)
                gigabytes = nbytes[dtype][i] / 1e9
                line = (
                    f"  {label:<14} {dtype:<9} {gigabytes:6.2f} GB  {seconds:7.3f} s  {gigabytes / seconds:6.2f} GB/s"
                )
                if dtype != first:
                    line += f"  {ratio(syncs, results[first, modes[-1]][i]):.2f} of {first}'s time"
                print(line)
    if args.json:
        write_json(args, modes, labels, nbytes, results)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def write_json(args, modes, labels: list[str], nbytes: dict[str, list[int]], results) -> None:
    """Per group mode and dtype: every size's timed syncs (seconds), their medians, the GB/s they imply, and the
    fit; a later dtype's sizes also give their time ratio to the first dtype's (``ratio``: side by side)."""
    summary = {
        "backend": args.backend,
        "receivers": args.receivers,
        "dtypes": args.dtype,
        "bucket_mb": args.bucket_mb,
        "reps": args.reps,
        "groups": {},
    }
    for keep in modes:
        summary["groups"][MODE[keep]] = group = {}
        for dtype in args.dtype:
            sizes = []
            for i, (label, syncs) in enumerate(zip(labels, results[dtype, keep], strict=True)):
                seconds = statistics.median(s.total for s in syncs)
                transfer = statistics.median(s.transfer for s in syncs)
                sizes.append(
                    {
                        "name": label,
                        "bytes": nbytes[dtype][i],
                        "sync_s": [s.total for s in syncs],
                        "median_sync_s": seconds,
                        "median_transfer_s": transfer,
                        "gb_per_s": nbytes[dtype][i] / seconds / 1e9,
                        "transfer_gb_per_s": nbytes[dtype][i] / transfer / 1e9,
                    }
                )
                if dtype != args.dtype[0]:
                    sizes[-1]["time_ratio_to_first_dtype"] = ratio(syncs, results[args.dtype[0], keep][i])
            fixed, bandwidth = fit([(size["bytes"], size["median_sync_s"]) for size in sizes])
            group[dtype] = {
                "sizes": sizes,
                "fit_fixed_s": fixed if math.isfinite(fixed) else None,
                "fit_gb_per_s": bandwidth / 1e9 if math.isfinite(bandwidth) else None,
            }
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
