"""Tests of the ``gloo`` checkpoint engine (``recipe.one_step_off_async.weight_sync.gloo``).

The tests run one engine per process and drive them the way verl's ``CheckpointEngineManager``
does (prepare, build_topology, init_process_group, send | receive, finalize), without Ray. What the
engine shares with the ``checkpoint`` engine (its topology, rank checks and argument checks) is
tested in ``test_weight_sync_common_on_cpu.py``; the sync of verl's own FSDP2 actor through verl's
manager, for both engines at once, in ``test_weight_sync_files_on_cpu.py`` (``-m slow``).

    pytest tests/test_weight_sync_gloo_on_cpu.py   # ~15 s
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pytest
import torch
from verl.checkpoint_engine.base import CheckpointEngineRegistry

from recipe.one_step_off_async.errors import WeightSyncError
from recipe.one_step_off_async.weight_sync.gloo import (
    GlooCheckpointEngine,
    StoreAddress,
)

ENGINE_MODULE = "recipe.one_step_off_async.weight_sync.gloo"
STEP_TIMEOUT_S = 60  # for each step of a healthy sync in these tests

# --- what runs inside an engine's process ------------------------------------------------------

_engine: GlooCheckpointEngine | None = None  # the one engine of an engine process


def _start_engine(engine_kwargs: dict[str, Any]) -> None:
    global _engine
    _engine = GlooCheckpointEngine(**engine_kwargs)


def _call(method: str, kwargs: dict[str, Any]) -> Any:
    return getattr(_engine, method)(**kwargs)


def _model_weights(seed: int) -> dict[str, torch.Tensor]:
    """Transformer-like weights in fp32, bf16 and int64, with a tensor three buckets (8 KiB) long."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(96, 64, generator=generator),  # 24 KiB: split in 3 chunks
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=generator).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(63, generator=generator).to(torch.bfloat16),  # odd size
        "model.layers.0.mlp.down_proj.weight": torch.randn(64, 32, generator=generator).t(),  # not contiguous
        "model.layers.0.mlp.expert_ids": torch.arange(seed, seed + 300, dtype=torch.int64),
        "model.norm.weight": torch.randn(64, generator=generator).to(torch.bfloat16),
        "lm_head.logit_scale": torch.tensor(float(seed)),  # 0-dim
    }


def _large_weights() -> dict[str, torch.Tensor]:
    """64 MiB in 4 MiB tensors: far more than the socket buffers, so a sync takes many round trips."""
    return {f"model.layers.{i}.weight": torch.full((1 << 20,), float(i)) for i in range(16)}


def _through_one_staging_tensor(weights: dict[str, torch.Tensor]):
    """Yield every tensor from the same memory, overwritten at the next step, as a producer that
    gathers each weight into one reused buffer would."""
    staging = torch.empty(max(tensor.nbytes for tensor in weights.values()), dtype=torch.uint8)
    for name, tensor in weights.items():
        view = staging[: tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor)
        yield name, view


def _weights(seed: int | None) -> dict[str, torch.Tensor]:
    return _model_weights(seed) if seed is not None else _large_weights()


def _send(seed: int | None, version: int | None, reuse_memory: bool = False) -> dict[str, float]:
    weights = _weights(seed)
    named = _through_one_staging_tensor(weights) if reuse_memory else iter(weights.items())
    return asyncio.run(_engine.send_weights(named, global_steps=version))


def _receive(
    seed: int | None, version: int | None, signal_after_first_tensor: int | None = None, dawdle_s: float = 0.0
) -> dict[str, Any]:
    """Consume a sync as a server adapter does: each tensor is used (compared with what the actor
    sent, then cloned) before the next is pulled, after ``dawdle_s`` of doing something else."""
    expected = _weights(seed)

    async def receive() -> dict[str, Any]:
        stream = _engine.receive_weights(global_steps=version)
        tensors, wrong_when_yielded, wrong_before_next = {}, [], []
        async for name, tensor in stream:
            if signal_after_first_tensor is not None:
                os.kill(os.getpid(), signal_after_first_tensor)
            if not torch.equal(tensor, expected[name]):
                wrong_when_yielded.append(name)
            await asyncio.sleep(dawdle_s)  # while the engine receives the next bucket in the background
            if not torch.equal(tensor, expected[name]):
                wrong_before_next.append(name)
            tensors[name] = tensor.clone()  # valid only until the next item is asked for: keep a copy
        return {
            "version": stream.version,
            "tensors": tensors,
            "wrong_when_yielded": wrong_when_yielded,
            "wrong_before_next": wrong_before_next,
        }

    return asyncio.run(receive())


def _open_files_and_threads() -> tuple[int, int]:
    # What the process still holds once unreachable objects are collected: without the collection, garbage from an
    # earlier test that the cycle collector has not reached yet (CI once saw 3 such descriptors) reads as a leak.
    gc.collect()
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


# --- the test's side: engines in processes, driven like verl's CheckpointEngineManager -----------


def _forkserver():
    # Engine processes are forked from one clean server process that imported torch and verl once,
    # rather than each importing them again (seconds apiece on a small machine).
    context = get_context("forkserver")
    context.set_forkserver_preload([ENGINE_MODULE, "pytest"])
    return context


class _EngineProcess:
    """One ``GlooCheckpointEngine`` in a process of its own; ``submit`` runs a function there."""

    def __init__(self, **engine_kwargs: Any) -> None:
        self._executor = ProcessPoolExecutor(
            max_workers=1, mp_context=_forkserver(), initializer=_start_engine, initargs=(engine_kwargs,)
        )
        self.pid = self._executor.submit(os.getpid).result(timeout=STEP_TIMEOUT_S)

    def submit(self, fn, *args: Any) -> Future:
        return self._executor.submit(fn, *args)

    def call(self, method: str, **kwargs: Any) -> Future:
        return self._executor.submit(_call, method, kwargs)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone: killed by the test
            os.kill(self.pid, signal.SIGKILL)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _results(futures: list[Future]) -> list[Any]:
    return [future.result(timeout=STEP_TIMEOUT_S) for future in futures]


def _start_sync(
    sender: _EngineProcess, receivers: list[_EngineProcess], send_args: tuple, receive_args: list[tuple]
) -> tuple[Future, list[Future]]:
    """Steps 1-5 of verl's manager: prepare, build_topology, init_process_group, send | receive."""
    metadata = _results([worker.call("prepare") for worker in (sender, *receivers)])
    actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(1, len(receivers), metadata)
    _results(
        [sender.call("init_process_group", **{key: values[0] for key, values in actor_kwargs.items()})]
        + [
            receiver.call("init_process_group", **{key: values[i] for key, values in rollout_kwargs.items()})
            for i, receiver in enumerate(receivers)
        ]
    )
    return sender.submit(_send, *send_args), [
        r.submit(_receive, *args) for r, args in zip(receivers, receive_args, strict=True)
    ]


def _sync(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """A whole healthy sync of ``_model_weights(seed)`` (``_sync_with_metrics``' arguments); what each receiver got."""
    return _sync_with_metrics(*args, **kwargs)[1]


def _sync_with_metrics(
    sender: _EngineProcess,
    receivers: list[_EngineProcess],
    seed: int,
    version: int,
    reuse_memory: bool = False,
    dawdle_s: float = 0.0,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``_sync``, also returning the sender's metrics."""
    sent, received = _start_sync(
        sender, receivers, (seed, version, reuse_memory), [(seed, version, None, dawdle_s)] * len(receivers)
    )
    metrics, *received = _results([sent, *received])
    assert metrics["checkpoint_engine/buckets"] > 2, "the test must reuse both buffers"
    _results([worker.call("finalize") for worker in (sender, *receivers)])
    return metrics, received


@pytest.fixture(scope="module")
def engines() -> tuple[_EngineProcess, list[_EngineProcess]]:
    """Actor rank 0 and two rollout workers, with buckets smaller than the largest tensor."""
    sender = _EngineProcess(bucket_size=8 << 10, is_master=True, timeout_s=20)
    receivers = [_EngineProcess(bucket_size=8 << 10, timeout_s=20) for _ in range(2)]
    yield sender, receivers
    for worker in (sender, *receivers):
        worker.close()


def _assert_received_exactly(received: dict[str, Any], seed: int, version: int) -> None:
    expected = _model_weights(seed)
    assert received["version"] == version
    assert list(received["tensors"]) == list(expected)
    assert received["wrong_when_yielded"] == [] and received["wrong_before_next"] == []
    for name, tensor in expected.items():
        got = received["tensors"][name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got, tensor), name


# --- fast tests -----------------------------------------------------------------------------------


def test_drain_rank_walks_the_whole_generator_without_a_group():
    engine = GlooCheckpointEngine(bucket_size=1 << 10)
    engine.init_process_group(rank=-1, world_size=3, store_address=StoreAddress(host="unused", port=0))
    walked = []

    def weights():
        for name, tensor in _model_weights(0).items():
            walked.append(name)
            yield name, tensor

    assert asyncio.run(engine.send_weights(weights(), global_steps=3)) == {}
    assert walked == list(_model_weights(0))
    engine.finalize()


def _checkpoint_engine_overrides(bucket_megabytes: int) -> list[str]:
    return [
        "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
        f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={ENGINE_MODULE}",
        f"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={bucket_megabytes}",
        "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=60",
    ]


def test_verl_config_selects_and_configures_the_engine():
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import import_external_libs

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=_checkpoint_engine_overrides(bucket_megabytes=64))
    engine_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
    # What verl's ActorRolloutRefWorker and CheckpointEngineWorker do with that config:
    import_external_libs(engine_config.custom_backend_module)
    engine = CheckpointEngineRegistry.new(
        engine_config.backend,
        is_master=True,
        bucket_size=engine_config.update_weights_bucket_megabytes << 20,
        **engine_config.engine_kwargs.get(engine_config.backend, {}),
    )
    assert isinstance(engine, GlooCheckpointEngine)
    assert (engine.bucket_size, engine.timeout_s, engine.is_master) == (64 << 20, 60, True)


def test_two_syncs_deliver_every_tensor_exactly_with_its_version(engines):
    sender, receivers = engines
    # The second sync runs on a fresh store and group, from a producer that reuses its memory.
    for seed, version, reuse_memory in ((1, 1, False), (2, 2, True)):
        for received in _sync(sender, receivers, seed=seed, version=version, reuse_memory=reuse_memory):
            _assert_received_exactly(received, seed=seed, version=version)


def test_yielded_tensor_stays_valid_until_the_consumer_asks_for_the_next(engines):
    """The receive contract (verl's nccl engine's): a yielded tensor, possibly a view into a reused
    receive buffer, holds the sent values from when it is yielded until the consumer asks for the
    next item, however long the consumer takes meanwhile; the engine receives ahead into the other
    buffer, never into the one the consumer is reading."""
    sender, receivers = engines
    for received in _sync(sender, receivers, seed=8, version=8, dawdle_s=0.02):
        _assert_received_exactly(received, seed=8, version=8)


def test_many_syncs_leak_no_sockets_or_threads(engines):
    sender, receivers = engines
    workers = (sender, *receivers)
    _sync(sender, receivers, seed=3, version=3)
    before = _results([worker.submit(_open_files_and_threads) for worker in workers])
    for version in range(4, 14):
        _sync(sender, receivers, seed=version, version=version)
    assert _results([worker.submit(_open_files_and_threads) for worker in workers]) == before


def test_receiver_rejects_a_version_it_was_not_told(engines):
    sender, receivers = engines
    sent, received = _start_sync(sender, receivers, (5, 6), [(5, 6), (5, 5)])
    with pytest.raises(WeightSyncError, match="told to load weight version 5 but actor rank 0 sent version 6"):
        received[1].result(timeout=STEP_TIMEOUT_S)
    # The sender, and with it the other receiver, fail at once rather than at their timeout.
    with pytest.raises(WeightSyncError, match="rollout worker most likely died"):
        sent.result(timeout=STEP_TIMEOUT_S)
    with pytest.raises(WeightSyncError):
        received[0].result(timeout=STEP_TIMEOUT_S)
    for received in _sync(sender, receivers, seed=7, version=7):  # and the next sync is healthy again
        _assert_received_exactly(received, seed=7, version=7)


def test_group_is_kept_across_syncs_and_rebuilt_when_a_rank_comes_back_new(engines):
    sender, receivers = engines
    _sync(sender, receivers, seed=20, version=20)  # whatever the earlier tests left, all now hold one group
    metrics, received = _sync_with_metrics(sender, receivers, seed=21, version=21)
    assert metrics["checkpoint_engine/group_reused"] == 1.0
    for got in received:
        _assert_received_exactly(got, seed=21, version=21)
    # The receivers' own split of that sync, for the manager to collect.
    for split in _results([receiver.call("receive_metrics") for receiver in receivers]):
        assert split["checkpoint_engine/recv_s"] >= split["checkpoint_engine/recv_wire_wait_s"] > 0
        assert split["checkpoint_engine/recv_load_s"] > 0
    for key in ("produce_s", "wire_wait_s", "pack_s", "group_s", "allocate_s"):
        assert metrics[f"checkpoint_engine/{key}"] >= 0, key
    assert metrics["checkpoint_engine/send_s"] >= metrics["checkpoint_engine/wire_wait_s"]

    # A rollout worker restarted (a new engine, holding no group): every rank builds a new group,
    # the sender included, instead of waiting on the old one.
    replacement = _EngineProcess(bucket_size=8 << 10, timeout_s=20)
    try:
        metrics, received = _sync_with_metrics(sender, [receivers[0], replacement], seed=22, version=22)
        assert metrics["checkpoint_engine/group_reused"] == 0.0
        for got in received:
            _assert_received_exactly(got, seed=22, version=22)
    finally:
        replacement.close()
    # Back to the old membership: the world size is the same, but the seats' group differs: rebuilt.
    metrics, received = _sync_with_metrics(sender, receivers, seed=23, version=23)
    assert metrics["checkpoint_engine/group_reused"] == 0.0
    for got in received:
        _assert_received_exactly(got, seed=23, version=23)


def test_membership_change_rebuilds_the_group(engines):
    sender, receivers = engines
    _sync(sender, receivers, seed=30, version=30)
    metrics, received = _sync_with_metrics(sender, receivers[:1], seed=31, version=31)  # one replica removed
    assert metrics["checkpoint_engine/group_reused"] == 0.0
    _assert_received_exactly(received[0], seed=31, version=31)
    metrics, received = _sync_with_metrics(sender, receivers, seed=32, version=32)  # and added back
    assert metrics["checkpoint_engine/group_reused"] == 0.0
    for got in received:
        _assert_received_exactly(got, seed=32, version=32)


def test_without_keep_group_finalize_releases_every_socket_and_thread():
    sender = _EngineProcess(bucket_size=8 << 10, is_master=True, timeout_s=20, keep_group=False)
    receivers = [_EngineProcess(bucket_size=8 << 10, timeout_s=20, keep_group=False) for _ in range(2)]
    workers = (sender, *receivers)
    try:
        _sync(sender, receivers, seed=0, version=0)  # the first sync also sets up what a process keeps
        before = _results([worker.submit(_open_files_and_threads) for worker in workers])
        for version in (1, 2):
            metrics, received = _sync_with_metrics(sender, receivers, seed=version, version=version)
            assert metrics["checkpoint_engine/group_reused"] == 0.0
            for got in received:
                _assert_received_exactly(got, seed=version, version=version)
        # Buffers stay (memory, not descriptors); sockets, gloo threads and the store are gone.
        assert _results([worker.submit(_open_files_and_threads) for worker in workers]) == before
    finally:
        for worker in workers:
            worker.close()


def test_close_releases_a_kept_group(engines):
    sender, receivers = engines
    workers = (sender, *receivers)
    _results([worker.call("close") for worker in workers])
    before = _results([worker.submit(_open_files_and_threads) for worker in workers])
    metrics, _ = _sync_with_metrics(sender, receivers, seed=40, version=40)
    assert metrics["checkpoint_engine/group_reused"] == 0.0
    holding = _results([worker.submit(_open_files_and_threads) for worker in workers])
    assert all(held[0] > free[0] for held, free in zip(holding, before, strict=True)), "kept sockets"
    _results([worker.call("close") for worker in workers])
    assert _results([worker.submit(_open_files_and_threads) for worker in workers]) == before


@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGSTOP], ids=["died", "stalled"])
def test_lost_receiver_fails_the_sender_clearly_within_the_timeout(stop_signal):
    timeout_s = 5
    sender = _EngineProcess(bucket_size=1 << 20, is_master=True, timeout_s=timeout_s)
    receivers = [_EngineProcess(bucket_size=1 << 20, timeout_s=timeout_s) for _ in range(2)]
    try:
        start = time.monotonic()
        sent, received = _start_sync(sender, receivers, (None, 42), [(None, 42), (None, 42, stop_signal)])
        with pytest.raises(WeightSyncError) as failure:
            sent.result(timeout=timeout_s + 30)
        assert time.monotonic() - start < timeout_s + 30
        message = str(failure.value)
        assert "gloo weight sync #1 (weight version 42): broadcasting bucket" in message
        assert "A rollout worker most likely died or stopped receiving" in message
        assert f"timeout_s={timeout_s}" in message
        # The surviving receiver is not left hanging either.
        done, _ = wait_futures([received[0]], timeout=timeout_s + 30)
        assert done and isinstance(received[0].exception(), WeightSyncError)
    finally:
        for worker in (sender, *receivers):
            worker.close()
