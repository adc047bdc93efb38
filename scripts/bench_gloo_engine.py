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
              preallocated, touched model before pulling the next, as ``HFServerAdapter`` does:
              engine plus the server's own copy.
Throughput is payload bytes / wall time (not multiplied by the number of receivers). CPU time is
summed over all processes and their threads; on a shared machine it varies less than wall time.
The engine's per-sync group setup and teardown (prepare, init_process_group, finalize) are
reported apart.

Why: the engine adds bucketing, per-bucket headers and a copy on each side (into the send bucket;
out of the receive bucket into the model, overlapped with the next bucket) on top of the broadcast;
this shows what that costs. The engine / raw ratio is the number to watch.

How:
    python scripts/bench_gloo_engine.py                      # 2 receivers, 64 MiB buckets, 5 reps
    python scripts/bench_gloo_engine.py --receivers 1 --bucket-mb 16 --layers 12
    python scripts/bench_gloo_engine.py --consumer load      # receivers also load the weights into a model
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import get_context

import torch
import torch.distributed as dist

from recipe.one_step_off_async.weight_sync.gloo import GlooCheckpointEngine

# A spawned benchmark process keeps its rank's state here between calls (one rank per process).
_state: dict = {}


@dataclass(frozen=True)
class Span:
    """One rank's part of one transfer: monotonic start and end (comparable across processes on
    Linux) and the CPU seconds the process spent in between."""

    start: float
    end: float
    cpu_s: float


def qwen2_shapes(layers: int, hidden: int = 1024, intermediate: int = 2816, vocab: int = 32000):
    """Tensor names and shapes of a Qwen2 checkpoint (grouped-query attention, 4 KV heads of 64)."""
    kv = 256
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        prefix = f"model.layers.{i}"
        shapes |= {
            f"{prefix}.self_attn.q_proj.weight": (hidden, hidden),
            f"{prefix}.self_attn.q_proj.bias": (hidden,),
            f"{prefix}.self_attn.k_proj.weight": (kv, hidden),
            f"{prefix}.self_attn.k_proj.bias": (kv,),
            f"{prefix}.self_attn.v_proj.weight": (kv, hidden),
            f"{prefix}.self_attn.v_proj.bias": (kv,),
            f"{prefix}.self_attn.o_proj.weight": (hidden, hidden),
            f"{prefix}.mlp.gate_proj.weight": (intermediate, hidden),
            f"{prefix}.mlp.up_proj.weight": (intermediate, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, intermediate),
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
        }
    shapes |= {"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    return shapes


def _setup_rank(rank: int, world_size: int, raw_port: int, engine_kwargs: dict, layers: int) -> int:
    """Join the raw broadcast group and build the engine; the sender builds random bf16 weights, a
    receiver the model it loads them into (zeros: every page touched, as in a serving model)."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", raw_port, is_master=False, timeout=timedelta(seconds=300))
    _state["raw_group"] = dist.ProcessGroupGloo(store, rank, world_size, timedelta(seconds=300))
    _state["engine"] = GlooCheckpointEngine(**engine_kwargs)
    shapes = qwen2_shapes(layers)
    if rank != 0:
        _state["model"] = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items()}
        return 0
    _state["weights"] = {name: torch.empty(shape, dtype=torch.bfloat16).normal_() for name, shape in shapes.items()}
    nbytes = sum(tensor.nbytes for tensor in _state["weights"].values())
    _state["flat"] = torch.ones(nbytes, dtype=torch.uint8)
    return nbytes


def _allocate_flat(nbytes: int) -> None:
    _state["flat"] = torch.zeros(nbytes, dtype=torch.uint8)  # zeros: every page touched up front


def _span(run) -> Span:
    start, cpu_start = time.monotonic(), time.process_time()
    run()
    return Span(start=start, end=time.monotonic(), cpu_s=time.process_time() - cpu_start)


def _raw_broadcast(fresh: bool) -> Span:
    def run() -> None:
        flat = torch.empty_like(_state["flat"]) if fresh else _state["flat"]
        _state["raw_group"].broadcast([flat], dist.BroadcastOptions()).wait()

    return _span(run)


def _engine_call(method: str, kwargs: dict):
    return getattr(_state["engine"], method)(**kwargs)


def _engine_send(version: int) -> Span:
    weights = _state["weights"]
    return _span(lambda: asyncio.run(_state["engine"].send_weights(iter(weights.items()), global_steps=version)))


def _engine_receive(version: int, load: bool) -> tuple[Span, int]:
    received = 0
    model = _state["model"]

    async def consume() -> None:
        nonlocal received
        async for name, tensor in _state["engine"].receive_weights(global_steps=version):
            if load:
                model[name].copy_(tensor)  # before the next: the engine reuses the tensor's memory
            received += tensor.nbytes

    span = _span(lambda: asyncio.run(consume()))
    return span, received


def _gather(futures: list[Future]) -> list:
    return [future.result(timeout=600) for future in futures]


def _gbps(nbytes: int, spans: list[Span]) -> float:
    """Throughput from the sender's start (spans[0]) to the last receiver's end."""
    return nbytes / (max(span.end for span in spans[1:]) - spans[0].start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the synthetic model (8: ~310 MB)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--consumer",
        choices=("load", "drop"),
        default="drop",
        help="drop: the engine alone, like the raw broadcast (default); load: also copy into the receiver's model",
    )
    args = parser.parse_args()

    world_size = 1 + args.receivers
    raw_store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=300), wait_for_workers=False)
    ranks = [ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) for _ in range(world_size)]
    try:
        nbytes = _gather(
            [
                executor.submit(
                    _setup_rank,
                    rank,
                    world_size,
                    raw_store.port,
                    {"bucket_size": args.bucket_mb << 20, "is_master": rank == 0, "timeout_s": 300},
                    args.layers,
                )
                for rank, executor in enumerate(ranks)
            ]
        )[0]
        _gather([executor.submit(_allocate_flat, nbytes) for executor in ranks[1:]])
        print(
            f"{nbytes / 1e6:.0f} MB of bf16 weights in {args.layers}+2 layers of tensors; 1 sender -> "
            f"{args.receivers} receiver(s); bucket {args.bucket_mb} MiB; consumer {args.consumer}; "
            f"{os.cpu_count()} CPU cores; load average {os.getloadavg()[0]:.2f}"
        )

        results: dict[str, list[tuple[float, float]]] = {"raw": [], "raw, fresh": [], "engine": []}
        setup_s = []
        for rep in range(args.reps):
            for name, fresh in (("raw", False), ("raw, fresh", True)):
                spans = _gather([executor.submit(_raw_broadcast, fresh) for executor in ranks])
                results[name].append((_gbps(nbytes, spans), sum(span.cpu_s for span in spans)))

            setup_start = time.monotonic()
            metadata = _gather([executor.submit(_engine_call, "prepare", {}) for executor in ranks])
            actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(1, args.receivers, metadata)
            init_kwargs = [{key: values[0] for key, values in actor_kwargs.items()}] + [
                {key: values[i] for key, values in rollout_kwargs.items()} for i in range(args.receivers)
            ]
            _gather(
                [
                    executor.submit(_engine_call, "init_process_group", kwargs)
                    for executor, kwargs in zip(ranks, init_kwargs, strict=True)
                ]
            )
            setup = time.monotonic() - setup_start
            sent = ranks[0].submit(_engine_send, rep)
            received = _gather(
                [executor.submit(_engine_receive, rep, args.consumer == "load") for executor in ranks[1:]]
            )
            assert all(got == nbytes for _, got in received), "a receiver missed bytes"
            spans = [sent.result(timeout=600)] + [span for span, _ in received]
            results["engine"].append((_gbps(nbytes, spans), sum(span.cpu_s for span in spans)))
            finalize_start = time.monotonic()
            _gather([executor.submit(_engine_call, "finalize", {}) for executor in ranks])
            setup_s.append(setup + time.monotonic() - finalize_start)
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
        for name, (gbps, cpu_s) in medians.items():
            print(f"  {name:<11} {gbps:5.2f} GB/s  {cpu_s:5.2f} CPU s per transfer")
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
        for executor in ranks:
            executor.shutdown(wait=True, cancel_futures=True)


if __name__ == "__main__":
    main()
