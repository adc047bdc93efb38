"""Tests of the ``checkpoint`` engine (``recipe.one_step_off_async.weight_sync.files``), and the one
test that syncs verl's own FSDP2 actor through both recipe engines.

The engine has no collective, so the fast tests run actor rank 0's engine and two rollout workers'
engines in one process, driven the way verl's ``CheckpointEngineManager`` drives them (prepare,
build_topology, init_process_group, send | receive, finalize), on a folder under ``tmp_path``; one
test kills a writer process mid-version. What the engine shares with the ``gloo`` engine is tested
in ``test_weight_sync_common_on_cpu.py``. The ``slow`` test builds verl's FSDP2 actor (2 ranks) once
and, after each update, syncs it through verl's manager to a rollout worker of each engine,
``gloo`` and ``checkpoint``: every tensor must arrive exactly, through both. The real entry point runs
with ``backend=checkpoint`` in ``tests/test_e2e_main_on_cpu.py``.

    pytest tests/test_weight_sync_files_on_cpu.py -m "not slow"   # ~5 s
    pytest tests/test_weight_sync_files_on_cpu.py -m slow         # ~35 s
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from safetensors.torch import load_file
from verl.checkpoint_engine.base import CheckpointEngineRegistry

import recipe.one_step_off_async.weight_sync.files as file_engine
from recipe.one_step_off_async.async_config import validate_config
from recipe.one_step_off_async.errors import WeightSyncError
from recipe.one_step_off_async.weight_sync.files import (
    DEFAULT_PREFIX,
    DIR_KEY,
    LOCK,
    TIMEOUT_KEY,
    FileCheckpointEngine,
    WeightsLocation,
)

ENGINE_MODULE = "recipe.one_step_off_async.weight_sync.files"
BACKEND_OVERRIDES = (
    "actor_rollout_ref.rollout.checkpoint_engine.backend=checkpoint",
    f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={ENGINE_MODULE}",
)
SHARD = 8 << 10  # bytes per shard file in the fast tests: smaller than the largest tensor


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """fp32, bf16 and int64 tensors, one larger than a shard, one not contiguous, one 0-dim, one
    empty, and a bf16 tensor of odd length packed before fp32 ones (misaligned in its shard)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(96, 64, generator=generator),  # 24 KiB: a file of its own
        "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 64, generator=generator).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(63, generator=generator).to(torch.bfloat16),
        "model.layers.0.self_attn.k_proj.bias": torch.randn(16, generator=generator),  # after 126 bytes of bf16
        "model.layers.0.mlp.down_proj.weight": torch.randn(32, 16, generator=generator).t(),
        "model.layers.0.mlp.expert_ids": torch.arange(seed, seed + 300, dtype=torch.int64),
        "model.norm.weight": torch.randn(64, generator=generator).to(torch.bfloat16),
        "model.rotary.inv_freq": torch.empty(0),
        "lm_head.logit_scale": torch.tensor(float(seed)),
    }


def _through_one_staging_tensor(weights: dict[str, torch.Tensor]):
    """Yield every tensor from the same memory, overwritten at the next step, as an actor that
    gathers each weight into one reused buffer would."""
    staging = torch.empty(max(tensor.nbytes for tensor in weights.values()), dtype=torch.uint8)
    for name, tensor in weights.items():
        view = staging[: tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor)
        yield name, view


class _Workers:
    """Actor rank 0 (the writer) and rollout workers, each with its engine, in this process."""

    def __init__(self, folder: Path | None, receivers: int = 2, timeout_s: float = 20) -> None:
        kwargs = {"bucket_size": SHARD, "dir": None if folder is None else str(folder), "timeout_s": timeout_s}
        self.writer = FileCheckpointEngine(is_master=True, **kwargs)
        self.receivers = [FileCheckpointEngine(**kwargs) for _ in range(receivers)]

    def join(self) -> WeightsLocation:
        """Steps 1-3 of verl's manager: prepare, build_topology, init_process_group."""
        engines = [self.writer, *self.receivers]
        actor, rollout = FileCheckpointEngine.build_topology(1, len(self.receivers), [e.prepare() for e in engines])
        self.writer.init_process_group(**{key: values[0] for key, values in actor.items()})
        for i, receiver in enumerate(self.receivers):
            receiver.init_process_group(**{key: values[i] for key, values in rollout.items()})
        return actor["location"][0]

    def finalize(self) -> None:
        for engine in (self.writer, *self.receivers):
            engine.finalize()

    def sync(self, seed: int, version: int, receivers: list[int] | None = None, weights=None) -> list[dict]:
        """A whole sync of ``_weights(seed)`` (or ``weights``); what each (or each listed) receiver got."""
        self.join()
        chosen = [self.receivers[i] for i in (range(len(self.receivers)) if receivers is None else receivers)]
        named = weights if weights is not None else _through_one_staging_tensor(_weights(seed))

        async def run():
            return await asyncio.gather(
                self.writer.send_weights(named, global_steps=version), *[_receive(r, version) for r in chosen]
            )

        try:
            self.metrics, *received = asyncio.run(run())
        finally:
            self.finalize()
        return received


async def _receive(engine: FileCheckpointEngine, version: int) -> dict[str, Any]:
    """Consume a sync as a server adapter does: each tensor copied before the next is pulled."""
    stream = engine.receive_weights(global_steps=version)
    tensors = {name: tensor.clone() async for name, tensor in stream}
    return {"version": stream.version, "tensors": tensors}


def _assert_exactly(received: dict[str, Any], seed: int, version: int) -> None:
    expected = _weights(seed)
    assert received["version"] == version
    assert list(received["tensors"]) == list(expected)
    for name, tensor in expected.items():
        got = received["tensors"][name]
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
        assert torch.equal(got, tensor), name


def _versions(folder: Path) -> list[str]:
    """The version folders, without their sync ids: ``v2``, or ``v2.tmp`` for one a writer did not finish."""
    return sorted(re.sub(r"-[0-9a-f]+", "", entry.name) for entry in folder.iterdir() if entry.name != LOCK)


def _version_folder(folder: Path, version: int) -> Path:
    (found,) = folder.glob(f"v{version}-*")
    return found


# --- fast tests -----------------------------------------------------------------------------------


def test_verl_config_selects_the_engine_and_the_recipe_accepts_it(tmp_path):
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import import_external_libs

    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        overrides = [
            *BACKEND_OVERRIDES,
            f"+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.dir={tmp_path}",
            "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.timeout_s=30",
        ]
        configs = {
            name: compose(config_name=name, overrides=overrides)
            for name in ("one_step_off_ppo_cpu", "one_step_off_ppo_trainer")
        }
    for config in configs.values():  # the CPU and the GPU profile
        validate_config(config)
    engine_config = omega_conf_to_dataclass(configs["one_step_off_ppo_cpu"].actor_rollout_ref.rollout.checkpoint_engine)
    # What verl's ActorRolloutRefWorker and CheckpointEngineWorker do with that config:
    import_external_libs(engine_config.custom_backend_module)
    engine = CheckpointEngineRegistry.new(
        engine_config.backend,
        is_master=True,
        bucket_size=engine_config.update_weights_bucket_megabytes << 20,
        **engine_config.engine_kwargs.get(engine_config.backend, {}),
    )
    assert isinstance(engine, FileCheckpointEngine)
    assert (engine.dir, engine.timeout_s, engine.bucket_size) == (str(tmp_path), 30, 16 << 20)


def test_syncs_deliver_every_tensor_exactly_as_safetensors(tmp_path):
    workers = _Workers(tmp_path)
    for version in (1, 2, 3, 4):  # each write first removes the version before it
        for received in workers.sync(seed=version, version=version):
            _assert_exactly(received, seed=version, version=version)
    assert workers.metrics["checkpoint_engine/files"] > 2
    # A model with fewer tensors (files) than the versions before it.
    fewer = dict(list(_weights(5).items())[1:])
    for received in workers.sync(seed=5, version=5, weights=iter(fewer.items())):
        assert received["version"] == 5
        assert all(torch.equal(received["tensors"][name], t) for name, t in fewer.items())
        assert list(received["tensors"]) == list(fewer)
    # Standard safetensors files: any tool can load a version.
    loaded = {}
    for shard in sorted(_version_folder(tmp_path, 5).glob("*.safetensors")):
        loaded |= load_file(shard)
    assert {name: (t.dtype, t.shape) for name, t in loaded.items()} == {
        name: (t.dtype, t.shape) for name, t in fewer.items()
    }
    assert all(torch.equal(loaded[name], tensor) for name, tensor in fewer.items())


def test_default_folder_is_fresh_per_run_and_removed_with_the_writer():
    workers = _Workers(None)
    _assert_exactly(workers.sync(seed=1, version=1)[0], seed=1, version=1)
    folder = Path(workers.writer.dir)
    assert folder.parent == Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
    assert _versions(folder) == ["v1"]
    assert Path(_Workers(None).join().dir) != folder
    del workers
    assert not folder.exists()


def test_a_new_default_folder_removes_those_of_dead_writers_only():
    """Ray kills its workers at the end of a run, so no exit handler removes a writer's folder; the
    next writer on the node removes the folders whose writer's lock the kernel released."""
    writer = FileCheckpointEngine(bucket_size=SHARD, is_master=True)
    base = Path(writer.prepare().dir).parent
    dead, alive = (base / f"{DEFAULT_PREFIX}test-{name}-{uuid.uuid4().hex[:8]}" for name in ("dead", "alive"))
    for folder in (dead, alive):
        folder.mkdir()
        (folder / LOCK).touch()
        (folder / "v1").mkdir()
    lock = os.open(alive / LOCK, os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a live writer holds it
        next_writer = FileCheckpointEngine(bucket_size=SHARD, is_master=True)
        next_writer.prepare()
        assert not dead.exists()
        assert alive.exists() and Path(writer.dir).exists() and Path(next_writer.dir).exists()
        next_writer.close()
        assert not Path(next_writer.dir).exists()
    finally:
        os.close(lock)
        shutil.rmtree(alive, ignore_errors=True)
        shutil.rmtree(dead, ignore_errors=True)


def test_each_write_first_removes_the_versions_before_it_and_a_killed_writers_leftovers(tmp_path):
    """The previous sync returned, so every receiver loaded its version: the folder holds one version at a time."""
    workers = _Workers(tmp_path)
    workers.sync(seed=1, version=1)
    workers.sync(seed=2, version=2)
    assert _versions(tmp_path) == ["v2"]
    (tmp_path / "v3-0123abcd.tmp").mkdir()  # what a writer killed mid-version leaves
    (tmp_path / "v9-4567cdef").mkdir()  # an earlier run's version
    (tmp_path / "notes").mkdir()  # not the engine's: kept
    workers.sync(seed=4, version=4)
    assert _versions(tmp_path) == ["notes", "v4"]
    assert workers.metrics["checkpoint_engine/versions_removed"] == 2


def _full_disk_at_the_second_shard(real_save):
    written = []

    def save(tensors, path, metadata):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(path)
        real_save(tensors, path, metadata)

    return save, "No space left on device", "is full: free space there"


def _io_error_after_half_a_file(real_save):
    def save(tensors, path, metadata):
        real_save(tensors, path, metadata)
        os.truncate(path, os.path.getsize(path) // 2)
        raise OSError(errno.EIO, "Input/output error", str(path))

    return save, "Input/output error", "check that actor rank 0 can create and write files"


@pytest.mark.parametrize("failure", [_full_disk_at_the_second_shard, _io_error_after_half_a_file])
def test_a_failed_write_is_a_clear_error_and_leaves_no_partial_version(tmp_path, monkeypatch, failure):
    workers = _Workers(tmp_path)
    workers.sync(seed=1, version=1)
    real_save = file_engine.save_file
    failing_save, error, fix = failure(real_save)
    monkeypatch.setattr(file_engine, "save_file", failing_save)
    walked = []

    def weights():
        for name, tensor in _weights(2).items():
            walked.append(name)
            yield name, tensor

    workers.join()
    with pytest.raises(WeightSyncError) as failed:
        asyncio.run(workers.writer.send_weights(weights(), global_steps=2))
    workers.finalize()
    message = str(failed.value)
    assert f"writing weight version 2 to {tmp_path} failed" in message
    assert error in message and fix in message and DIR_KEY in message
    assert walked == list(_weights(2)), "the other actor ranks' all-gathers must be seen through"
    assert _versions(tmp_path) == []
    # Once the disk works again, the next sync does too.
    monkeypatch.setattr(file_engine, "save_file", real_save)
    _assert_exactly(workers.sync(seed=3, version=3)[0], seed=3, version=3)


@pytest.mark.parametrize("damage", ["garbled header", "shard removed"])
def test_a_version_that_cannot_be_read_whole_fails_the_receiver_naming_it(tmp_path, damage):
    workers = _Workers(tmp_path, receivers=1)
    workers.sync(seed=1, version=1)
    folder = _version_folder(tmp_path, 1)
    shards = sorted(folder.glob("shard-*"))
    assert len(shards) > 1
    if damage == "shard removed":  # as by another run writing to the same folder: no tensor of it is loaded
        shards[-1].unlink()
    else:
        with open(shards[0], "r+b") as file:
            file.seek(8)
            file.write(b"#" * 16)
    receiver = workers.receivers[0]
    receiver.init_process_group(
        rank=1, world_size=2, location=WeightsLocation(str(tmp_path), sync_id=folder.name.split("-")[1])
    )
    with pytest.raises(WeightSyncError, match=f"failed reading weight version 1 from {folder}"):
        asyncio.run(_receive(receiver, 1))
    receiver.finalize()


KILLED_WRITER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import torch
    from recipe.one_step_off_async.weight_sync.files import FileCheckpointEngine

    def weights():  # 16 MiB in 1 MiB tensors; SIGKILL while the 9th is being produced
        for i in range(16):
            if i == 8:
                os.kill(os.getpid(), signal.SIGKILL)
            yield f"model.layers.{i}.weight", torch.full((1 << 18,), float(i))

    engine = FileCheckpointEngine(bucket_size=2 << 20, is_master=True, dir=sys.argv[1])
    location = engine.prepare()
    engine.init_process_group(rank=0, world_size=2, location=location)
    asyncio.run(engine.send_weights(weights(), global_steps=2))
    """
)


def test_writer_killed_mid_version_leaves_no_half_version(tmp_path):
    workers = _Workers(tmp_path, receivers=1)
    workers.sync(seed=1, version=1)
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
    assert _versions(tmp_path) == ["v2.tmp"]  # v1 was removed before the write began
    assert list(next(tmp_path.glob("v2-*.tmp")).glob("shard-*")), "it died mid-version"
    # A receiver waiting for v2 from that writer would time out; a restarted writer writes v2 again,
    # removes the dead one's leftovers and the receiver loads the new v2.
    _assert_exactly(workers.sync(seed=2, version=2)[0], seed=2, version=2)
    assert _versions(tmp_path) == ["v2"]


def test_receiver_waiting_for_a_version_that_never_comes_fails_within_its_timeout(tmp_path):
    workers = _Workers(tmp_path, timeout_s=1)
    workers.join()
    start = time.monotonic()
    with pytest.raises(WeightSyncError) as failure:
        asyncio.run(_receive(workers.receivers[0], 7))
    assert time.monotonic() - start < 30, "bounded by timeout_s, not hanging"
    message = str(failure.value)
    assert f"timeout_s=1 for weight version 7 to appear in {tmp_path}" in message
    assert TIMEOUT_KEY in message


def test_a_version_of_another_run_is_replaced_never_loaded(tmp_path):
    earlier = _Workers(tmp_path)
    earlier.sync(seed=1, version=3)  # an earlier run's v3, loaded by its receivers
    workers = _Workers(tmp_path)
    workers.join()

    async def run():
        # The receivers start waiting while the earlier run's v3 is there, before the writer starts.
        received = [asyncio.ensure_future(_receive(r, 3)) for r in workers.receivers]
        await asyncio.sleep(0.2)
        assert not any(r.done() for r in received)
        await workers.writer.send_weights(iter(_weights(9).items()), global_steps=3)
        return await asyncio.gather(*received)

    for received in asyncio.run(run()):
        _assert_exactly(received, seed=9, version=3)
    workers.finalize()
    assert _versions(tmp_path) == ["v3"]


def test_receiver_that_cannot_see_the_folder_names_the_key_to_fix(tmp_path):
    receiver = FileCheckpointEngine(bucket_size=SHARD)
    location = WeightsLocation(dir=str(tmp_path / "on-another-node"), sync_id="s")
    with pytest.raises(WeightSyncError, match=f"cannot see the weights folder .*{DIR_KEY}"):
        receiver.init_process_group(rank=1, world_size=2, location=location)


# --- verl's actor, checkpoint engine workers and manager (Ray), both engines ---------------------


def _build_tiny_qwen2(path: Path) -> None:
    """A 2-layer Qwen2 whose embedding and lm_head (2 MiB each in fp32) exceed a 1 MiB bucket."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from recipe.one_step_off_async.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(path)
    config = Qwen2Config(
        vocab_size=8192,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)


class _KeepingServerAdapter:
    """The rollout server's end of a sync, reduced to keeping what arrived and its version."""

    replica_rank = 0
    is_leader_rank = True

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.version: int | None = None

    async def update_weights(self, weights, global_steps: int | None = None, **kwargs: Any) -> None:
        # A copy of each: the engine's tensors are valid only until the next one is asked for.
        self.weights = {name: tensor.clone() async for name, tensor in weights}
        self.version = weights.version


class _ReplicaOfOneWorker:
    """What verl's ``CheckpointEngineManager`` uses of a rollout replica: its workers and its pauses."""

    def __init__(self, workers: list) -> None:
        self.workers = workers

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        pass

    async def resume_generation(self) -> None:
        pass

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass


@pytest.fixture(scope="module")
def ray_shipping_this_module(cpu_ray):
    """The session's Ray (``cpu_ray``, tests/conftest.py), with this module's helper classes shipped
    by value: Ray workers cannot import a test module."""
    cpu_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield cpu_ray
    cpu_ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.mark.slow
@pytest.mark.usefixtures("demo_assets")
def test_fsdp2_actor_syncs_exactly_and_bit_identically_through_both_engines(ray_shipping_this_module, tmp_path):
    """The same actor, after each of 3 updates, synced by verl's manager through each engine in turn:
    ``gloo`` through the engine verl's actor worker built from its config, ``checkpoint`` through one
    built the same way from the other config."""
    ray = ray_shipping_this_module
    from verl.checkpoint_engine.base import CheckpointEngineManager, CheckpointEngineWorker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import import_external_libs
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl_actor import actor_group, cpu_config, rollout_batch, update_actor

    class ActorWithTwoEngines(ActorRolloutRefWorker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def use_engine(self, engine_config: dict) -> None:
            """Sync through ``engine_config.backend`` from now on (each engine is built once and kept;
            the one of the actor's own config is the engine verl built)."""
            engines = self.__dict__.setdefault(
                "engines", {self.config.rollout.checkpoint_engine.backend: self.checkpoint_engine}
            )
            if engine_config["backend"] not in engines:
                import_external_libs(engine_config["custom_backend_module"])
                engines[engine_config["backend"]] = CheckpointEngineRegistry.new(
                    engine_config["backend"],
                    is_master=self.rank == 0,
                    bucket_size=engine_config["update_weights_bucket_megabytes"] << 20,
                    **engine_config["engine_kwargs"].get(engine_config["backend"], {}),
                )
            self.checkpoint_engine = engines[engine_config["backend"]]

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def full_state(self) -> dict[str, torch.Tensor] | None:
            # Every rank walks the generator (each full tensor is an FSDP all-gather); rank 0 keeps it.
            params, _ = self.actor.engine.get_per_tensor_param()
            state = {name: tensor.clone() for name, tensor in params}
            return state if self.rank == 0 else None

    class RolloutWorkerKeepingWeights(CheckpointEngineWorker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def received(self) -> tuple[int | None, dict[str, torch.Tensor]]:
            return self.server_adapter.version, self.server_adapter.weights

    model_path = tmp_path / "tiny_qwen2"
    _build_tiny_qwen2(model_path)
    bucket = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1"
    gloo_overrides = [
        "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.one_step_off_async.weight_sync.gloo",
        bucket,
        "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=60",
    ]
    file_overrides = [
        *BACKEND_OVERRIDES,
        bucket,
        f"+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.dir={tmp_path / 'weights'}",
    ]
    configs = {
        "gloo": cpu_config(str(model_path), "trainer.n_gpus_per_node=2", *gloo_overrides),
        "checkpoint": cpu_config(str(model_path), "trainer.n_gpus_per_node=2", *file_overrides),
    }
    actor_wg = actor_group(configs["gloo"], ranks=2, worker_cls=ActorWithTwoEngines)
    managers, rollouts = {}, {}
    for backend, config in configs.items():
        rollouts[backend] = RayWorkerGroup(
            resource_pool=RayResourcePool(
                process_on_nodes=[1],
                use_gpu=True,
                max_colocate_count=1,
                name_prefix=f"{backend}_{uuid.uuid4().hex[:8]}",
            ),
            ray_cls_with_init=RayClassWithInitArgs(
                ray.remote(RolloutWorkerKeepingWeights),
                rollout_config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout),
                model_config=omega_conf_to_dataclass(config.actor_rollout_ref.model),
                server_adapter=_KeepingServerAdapter(),
            ),
            device_name="cpu",
        )
        engine_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
        managers[backend] = CheckpointEngineManager(
            config=engine_config, actor_wg=actor_wg, replicas=[_ReplicaOfOneWorker(rollouts[backend].workers)]
        )

    previous = None
    generator = torch.Generator().manual_seed(0)
    for step in (1, 2, 3):
        sequences = [(torch.randint(10, 100, (8,), generator=generator).tolist(),) * 2 for _ in range(4)]
        update_actor(actor_wg, rollout_batch(sequences, pad_id=0, advantages=torch.randn(4, 8, generator=generator)))
        metrics, received = {}, {}
        for backend, manager in managers.items():
            actor_wg.use_engine(OmegaConf.to_container(configs[backend].actor_rollout_ref.rollout.checkpoint_engine))
            metrics[backend] = manager.update_weights(global_steps=step)
            received[backend] = rollouts[backend].received()[0]
        actor_state = actor_wg.full_state()[0]

        assert metrics["gloo"]["checkpoint_engine/buckets"] > 2
        assert metrics["checkpoint"]["checkpoint_engine/files"] > 2
        assert max(tensor.nbytes for tensor in actor_state.values()) > 1 << 20, "a tensor must exceed a bucket"
        for backend, (version, weights) in received.items():
            assert version == step, backend
            assert list(weights) == list(actor_state), backend
        for name, tensor in actor_state.items():
            gloo, checkpoint = received["gloo"][1][name], received["checkpoint"][1][name]
            assert checkpoint.dtype == gloo.dtype == tensor.dtype == torch.float32, name
            assert torch.equal(gloo, tensor) and torch.equal(checkpoint, tensor), name
        if previous is not None:
            assert any(not torch.equal(previous[name], tensor) for name, tensor in actor_state.items())
        previous = actor_state
    assert _versions(tmp_path / "weights") == ["v3"]
