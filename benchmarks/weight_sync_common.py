"""What the weight-sync benchmarks share (``gloo-engine``, ``checkpoint-engine``, ``weight-sync``).

Each rank of a benchmark is a ``RankWorker`` in a process of its own (``ProcessRanks``: spawned processes on
CPU; ``weight-sync`` runs the GPU ranks as Ray actors): its checkpoint engines by registered name, the weights
it sends (rank 0) or the model it loads them into (the receivers), and for the raw-broadcast baseline a gloo
group of its own. ``run_sync`` drives one sync the way verl's ``CheckpointEngineManager`` does: ``prepare`` on
every rank, ``build_topology``, ``init_process_group`` on every rank, ``send_weights`` | ``receive_weights``,
``finalize`` on every rank; it returns the driver-side time of each phase and each rank's own span of the
transfer (monotonic clocks compare across the processes of one Linux machine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import get_context

import torch
import torch.distributed as dist

WAIT_S = 600  # the longest a benchmark waits for one call of its ranks


@dataclass(frozen=True)
class Span:
    """One rank's part of one transfer: monotonic start and end, and the CPU seconds its process spent in between."""

    start: float
    end: float
    cpu_s: float


def timed(run: Callable[[], object]) -> Span:
    start, cpu_start = time.monotonic(), time.process_time()
    run()
    return Span(start=start, end=time.monotonic(), cpu_s=time.process_time() - cpu_start)


def gbps(nbytes: int, spans: list[Span]) -> float:
    """Throughput from the sender's start (``spans[0]``) to the last receiver's end (GB/s of payload)."""
    return nbytes / (max(span.end for span in spans[1:]) - spans[0].start) / 1e9


def qwen2_shapes(hidden: int, intermediate: int, layers: int, vocab: int, heads: int, kv_heads: int) -> dict:
    """Tensor names and shapes of a Qwen2ForCausalLM of this config (built on the meta device: no memory)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def synthetic_model(layers: int, hidden: int) -> dict:
    """Tensor names and shapes of a Qwen2 checkpoint: heads of 64, 4 KV heads (as many as the heads if fewer),
    an MLP 2.75x as wide, a vocabulary of 32000 (``--layers 8``, hidden 1024: ~310 MB of bf16)."""
    heads = max(1, hidden // 64)
    return qwen2_shapes(hidden, hidden * 11 // 4, layers, 32000, heads, min(4, heads))


def add_engine_arguments(parser, bucket_help: str | None, drop_help: str) -> None:
    """The options ``gloo-engine`` and ``checkpoint-engine`` share: receivers, bucket size, the synthetic model
    (``synthetic_model``), repetitions, and whether receivers load the weights (``drop_help``: what dropping them
    measures)."""
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--bucket-mb", type=int, default=64, help=bucket_help)
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the synthetic model (8: ~310 MB)")
    parser.add_argument("--hidden-size", type=int, default=1024, help="its hidden size (heads of 64)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--consumer",
        choices=("load", "drop"),
        default="drop",
        help=f"drop: {drop_help} (default); load: also copy into the receiver's model",
    )


class RankWorker:
    """One rank: checkpoint engines by registered name (``use`` picks the one a sync goes through), and the
    weights it sends or the model it loads into."""

    def __init__(self, engines: dict[str, dict], device: str = "cpu") -> None:
        if device == "cuda":
            import verl.checkpoint_engine.nccl_checkpoint_engine  # noqa: F401  (registers "nccl"; needs cupy)

            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        else:
            import recipe.one_step_off_async.weight_sync.files  # noqa: F401  (registers "checkpoint")
            import recipe.one_step_off_async.weight_sync.gloo  # noqa: F401  (registers "gloo")

            torch.set_num_threads(1)
            self.device = torch.device("cpu")
        from verl.checkpoint_engine.base import CheckpointEngineRegistry

        self.engines = {backend: CheckpointEngineRegistry.new(backend, **kwargs) for backend, kwargs in engines.items()}
        self.engine = next(iter(self.engines.values()))
        self.tensors: dict[str, torch.Tensor] = {}

    def invoke(self, method: str, *args):
        return getattr(self, method)(*args)

    def use(self, backend: str) -> None:
        self.engine = self.engines[backend]

    def load(self, shapes: dict, dtype: str, sender: bool) -> int:
        """The sender's random weights, or a receiver's model (zeros: every page touched, as in a serving model)."""
        make = torch.randn if sender else torch.zeros
        self.tensors = {}  # the last size's freed first: at 3B in fp32 each copy is 13.6 GB
        self.tensors = {
            name: make(shape, dtype=getattr(torch, dtype), device=self.device) for name, shape in shapes.items()
        }
        self._synchronize()
        return sum(tensor.nbytes for tensor in self.tensors.values())

    def keep_group(self, keep: bool) -> None:
        """The engine's own switch: gloo ``keep_group``, verl's nccl ``rebuild_group`` (its inverse)."""
        if hasattr(self.engine, "keep_group"):
            self.engine.keep_group = keep
            return
        from ray.util import collective

        # verl's nccl engine destroys its group in finalize only when rebuild_group is set, and
        # with it set it initializes the group without asking whether one exists: drop a kept one.
        if not keep and collective.is_group_initialized(self.engine.group_name):
            collective.destroy_collective_group(self.engine.group_name)
        self.engine.rebuild_group = not keep

    def engine_call(self, method: str, kwargs: dict):
        return getattr(self.engine, method)(**kwargs)

    def topology(self, receivers: int, metadata: list):
        return type(self.engine).build_topology(1, receivers, metadata)

    def send(self, version: int) -> tuple[Span, dict]:
        metrics: dict = {}

        def run() -> None:
            nonlocal metrics
            metrics = asyncio.run(self.engine.send_weights(iter(self.tensors.items()), global_steps=version)) or {}
            self._synchronize()

        return timed(run), metrics

    def receive(self, version: int, load: bool = True) -> tuple[Span, int, dict]:
        """Pull every tensor of ``version``; ``load``: copy each into the model before pulling the next, as a
        rollout server does (else the tensors are dropped: the engine alone)."""
        received = 0

        async def consume() -> None:
            nonlocal received
            async for name, tensor in self.engine.receive_weights(global_steps=version):
                if load:
                    self.tensors[name].copy_(tensor)  # before the next: the engine reuses the tensor's memory
                received += tensor.nbytes
            self._synchronize()

        span = timed(lambda: asyncio.run(consume()))
        metrics = self.engine.receive_metrics() if hasattr(self.engine, "receive_metrics") else {}
        return span, received, metrics

    # The raw broadcast the gloo engine is compared with: one flat buffer over a gloo group of its own.

    def join_raw_group(self, rank: int, world_size: int, port: int) -> None:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
        self.raw_group = dist.ProcessGroupGloo(store, rank, world_size, timedelta(seconds=300))

    def allocate_flat(self, nbytes: int) -> None:
        self.flat = torch.ones(nbytes, dtype=torch.uint8)  # every page touched up front

    def raw_broadcast(self, fresh: bool) -> Span:
        """One broadcast of the flat buffer; ``fresh``: into a buffer allocated just before (pages not touched)."""

        def run() -> None:
            flat = torch.empty_like(self.flat) if fresh else self.flat
            self.raw_group.broadcast([flat], dist.BroadcastOptions()).wait()

        return timed(run)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


_worker: RankWorker | None = None  # the one worker of a spawned rank process


def _start_worker(engines: dict[str, dict]) -> None:
    global _worker
    _worker = RankWorker(engines)


def _invoke(method: str, *args):
    return _worker.invoke(method, *args)


class ProcessRanks:
    """Ranks on CPU: each a spawned process (a ``ProcessPoolExecutor`` of one) holding one ``RankWorker``,
    built with that rank's engines (backend -> keyword arguments)."""

    def __init__(self, engines_by_rank: list[dict[str, dict]]) -> None:
        self._ranks = [
            ProcessPoolExecutor(
                max_workers=1, mp_context=get_context("spawn"), initializer=_start_worker, initargs=(engines,)
            )
            for engines in engines_by_rank
        ]

    def __len__(self) -> int:
        return len(self._ranks)

    def submit(self, rank: int, method: str, *args) -> Future:
        return self._ranks[rank].submit(_invoke, method, *args)

    def get(self, futures: list) -> list:
        return [future.result(timeout=WAIT_S) for future in futures]

    def close(self) -> None:
        for executor in self._ranks:
            executor.shutdown(wait=True, cancel_futures=True)


@dataclass
class Sync:
    """One sync: driver-side seconds of its phases, each rank's span of the transfer (the sender's first), and
    the engine's own metrics (the sender's; the slowest receiver's)."""

    prepare: float
    init: float
    transfer: float
    finalize: float
    spans: list[Span]
    sender: dict
    receiver: dict

    @property
    def total(self) -> float:
        return self.prepare + self.init + self.transfer + self.finalize

    @property
    def setup_s(self) -> float:
        """The group's setup and teardown around the transfer (prepare, init_process_group, finalize)."""
        return self.prepare + self.init + self.finalize


def run_sync(ranks, nbytes: int, version: int, load: bool = True) -> Sync:
    """One sync of ``version`` from rank 0 to the other ranks of ``ranks`` (``ProcessRanks`` or any object with
    its ``submit``/``get``/``len``); raises when a receiver did not get ``nbytes``."""
    everyone, receivers = range(len(ranks)), len(ranks) - 1
    t0 = time.monotonic()
    metadata = ranks.get([ranks.submit(rank, "engine_call", "prepare", {}) for rank in everyone])
    t1 = time.monotonic()
    actor_kwargs, rollout_kwargs = ranks.get([ranks.submit(0, "topology", receivers, metadata)])[0]
    init_kwargs = [{key: values[0] for key, values in actor_kwargs.items()}] + [
        {key: values[i] for key, values in rollout_kwargs.items()} for i in range(receivers)
    ]
    ranks.get([ranks.submit(rank, "engine_call", "init_process_group", init_kwargs[rank]) for rank in everyone])
    t2 = time.monotonic()
    futures = [ranks.submit(0, "send", version)]
    futures += [ranks.submit(rank, "receive", version, load) for rank in everyone[1:]]
    (sent, sender), *received = ranks.get(futures)
    t3 = time.monotonic()
    ranks.get([ranks.submit(rank, "engine_call", "finalize", {}) for rank in everyone])
    t4 = time.monotonic()
    if any(got != nbytes for _, got, _ in received):
        raise RuntimeError(f"a receiver got {[got for _, got, _ in received]} bytes of {nbytes}")
    slowest = {key: max(metrics[key] for _, _, metrics in received) for key in received[0][2]}
    spans = [sent, *(span for span, _, _ in received)]
    return Sync(t1 - t0, t2 - t1, t3 - t2, t4 - t3, spans, sender, slowest)
