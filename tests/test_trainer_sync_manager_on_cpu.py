"""Tests of the trainer's weight-sync manager (``trainer/sync_manager.py``, ``OneStepOffCheckpointManager``): the
phase timings of a sync, its deadline, and replicas that are never put to sleep.

verl's ``CheckpointEngineManager.update_weights`` runs unmodified on fake replicas and worker
groups (no Ray: verl's module-level ``ray.get`` and ``RayWorkerGroup`` are replaced by stand-ins for
the test). Every fake step advances a fake clock by its own power of two, so each reported
phase must equal exactly the steps it covers, and the total the sum of all of them.

    pytest tests/test_trainer_sync_manager_on_cpu.py -q
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
import threading
import types

import pytest
from omegaconf import OmegaConf
from verl.checkpoint_engine import base as verl_checkpoint_engine
from verl.checkpoint_engine.base import CheckpointEngineManager
from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
from verl.workers.config import CheckpointEngineConfig

from recipe.one_step_off_async.errors import ConfigError, PipelineTimeoutError
from recipe.one_step_off_async.trainer import sync_manager
from recipe.one_step_off_async.trainer.sync_manager import OneStepOffCheckpointManager
from recipe.one_step_off_async.weight_sync.gloo import StoreAddress

PHASE_METHODS = OneStepOffCheckpointManager.PHASE_METHODS

# Fake seconds each step takes; distinct powers of two, so any sum identifies its parts.
COST = {
    "abort": 1,
    "worker_group": 2,
    "release_kv": 4,
    "prepare": 8,
    "init_process_group": 16,
    "send": 32,
    "receive": 64,
    "finalize": 128,
    "resume_kv": 256,
    "resume_generation": 512,
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, step: str) -> None:
        self.now += COST[step]


class FakeReplica:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.workers = [object()]

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        self.clock.advance("abort")

    async def release_kv_cache(self) -> None:
        self.clock.advance("release_kv")

    async def resume_kv_cache(self) -> None:
        self.clock.advance("resume_kv")

    async def resume_generation(self) -> None:
        self.clock.advance("resume_generation")


class FakeWorkerGroup:
    """A worker group whose remote calls return their results directly (``ray.get`` is the identity)."""

    def __init__(self, clock: FakeClock, world_size: int, sends: bool) -> None:
        self.clock, self.world_size, self.sends = clock, world_size, sends

    def execute_checkpoint_engine(self, method: list[str], **kwargs) -> list:
        name = method[0]
        if name in ("prepare", "init_process_group", "finalize"):
            self.clock.advance(name)
            address = [StoreAddress(host="fake", port=1)] if self.sends and name == "prepare" else []
            return address + [None] * (self.world_size - len(address))
        assert name == "receive_metrics" and not self.sends
        return [{"checkpoint_engine/recv_s": 0.5 + rank} for rank in range(self.world_size)]

    def update_weights(self, global_steps: int | None = None, **kwargs) -> list:
        self.clock.advance("send" if self.sends else "receive")
        return [{"checkpoint_engine/send_s": 3.0}] + [{}] * (self.world_size - 1) if self.sends else []


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(sync_manager, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))

    def rollout_group(worker_handles, ray_cls_with_init):
        clock.advance("worker_group")
        return FakeWorkerGroup(clock, world_size=len(worker_handles), sends=False)

    monkeypatch.setattr(verl_checkpoint_engine, "RayWorkerGroup", rollout_group)
    monkeypatch.setattr(verl_checkpoint_engine, "ray", types.SimpleNamespace(get=lambda refs: refs))
    monkeypatch.setattr(sync_manager, "ray", types.SimpleNamespace(get=lambda refs: refs))
    return clock


def _manager(clock: FakeClock, backend: str = "gloo") -> OneStepOffCheckpointManager:
    config = CheckpointEngineConfig(backend=backend, custom_backend_module="recipe.one_step_off_async.weight_sync.gloo")
    return OneStepOffCheckpointManager(
        config=config,
        actor_wg=FakeWorkerGroup(clock, world_size=2, sends=True),
        replicas=[FakeReplica(clock), FakeReplica(clock)],
    )


EXPECTED = {
    "timing_s/sync/abort": COST["abort"] * 2,  # two replicas, one fake clock
    "timing_s/sync/worker_group": COST["worker_group"],
    "timing_s/sync/release_kv": COST["release_kv"] * 2,
    # Actor and rollout worker groups each: prepare and init_process_group; send | receive, finalize.
    "timing_s/sync/build_group": (COST["prepare"] + COST["init_process_group"]) * 2,
    "timing_s/sync/transfer": COST["send"] + COST["receive"] + COST["finalize"] * 2,
    "timing_s/sync/resume": (COST["resume_kv"] + COST["resume_generation"]) * 2,
}


def _assert_sync_metrics(metrics: dict[str, float]) -> None:
    for key, seconds in EXPECTED.items():
        assert metrics[key] == seconds, key
    assert metrics["timing_s/sync/total"] == sum(EXPECTED.values())
    assert metrics["checkpoint_engine/send_s"] == 3.0  # the sender's metrics, merged by verl
    assert metrics["checkpoint_engine/recv_s"] == 1.5  # the slowest rollout worker's
    assert "timing_s/sync/receiver_metrics" in metrics


def test_update_weights_called_from_synchronous_code_reports_every_phase(clock):
    _assert_sync_metrics(_manager(clock).update_weights(global_steps=3))


def test_update_weights_with_a_deadline_reports_every_phase_or_fails_naming_the_key(clock):
    manager = _manager(clock)
    checks = []
    manager.set_deadline(timeout_s=30, check=lambda: checks.append(1))
    _assert_sync_metrics(manager.update_weights(global_steps=3))  # run on the deadline's thread

    stuck = threading.Event()
    manager.actor_wg.update_weights = lambda **kwargs: stuck.wait()  # a receiver that never answers
    manager.set_deadline(timeout_s=0.2, check=lambda: None)
    try:
        with pytest.raises(
            PipelineTimeoutError, match=r"v4 .* within 0.2 s \(async_training.sync_timeout_s\).*\(gloo\)"
        ):
            manager.update_weights(global_steps=4)
    finally:
        stuck.set()


def test_update_weights_called_synchronously_inside_a_running_loop_reports_every_phase(clock):
    def synchronous_helper() -> dict[str, float]:
        return _manager(clock).update_weights(global_steps=3)  # auto_await runs it in a thread

    async def trainer() -> dict[str, float]:
        return synchronous_helper()

    _assert_sync_metrics(asyncio.run(trainer()))


def test_phases_outside_a_sync_run_untimed_and_the_next_sync_starts_clean(clock):
    manager = _manager(clock)
    manager.abort_replicas()
    manager.resume_generation_replicas()
    assert clock.now == 1000.0 + (COST["abort"] + COST["resume_generation"]) * 2
    _assert_sync_metrics(manager.update_weights(global_steps=1))


def test_a_failed_sync_raises_and_the_next_sync_is_timed_afresh(clock):
    manager = _manager(clock)

    def broken(*args, **kwargs):
        raise RuntimeError("engine broke")

    manager.actor_wg.update_weights = broken
    with pytest.raises(RuntimeError, match="engine broke"):
        manager.update_weights(global_steps=1)
    del manager.actor_wg.update_weights  # the healthy method again
    _assert_sync_metrics(manager.update_weights(global_steps=2))


def test_naive_backend_reports_only_the_total(clock):
    manager = _manager(clock, backend="naive")
    manager.actor_wg.update_weights = lambda **kwargs: clock.advance("send") or []
    assert manager.update_weights(global_steps=1) == {"timing_s/sync/total": COST["send"]}


def _self_calls(function) -> list[str]:
    """Names of ``self.<method>(...)`` calls in ``function``'s source, in source order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ]
    return [call.func.attr for call in sorted(calls, key=lambda call: (call.lineno, call.col_offset))]


def test_verl_update_weights_still_calls_exactly_the_timed_phase_methods():
    """Tripwire: the timings are only right while verl's ``update_weights`` calls these methods of
    ``self``, in this order, with the transfer (actor and rollout ``update_weights``) and
    ``finalize`` between ``build_process_group`` and ``resume_kv_cache_replicas``. If this fails,
    re-read verl's ``CheckpointEngineManager.update_weights`` and update ``sync_timing``."""
    update_weights = inspect.unwrap(CheckpointEngineManager.update_weights)
    assert _self_calls(update_weights) == list(PHASE_METHODS)
    source = inspect.getsource(update_weights)
    build, resume = source.index("self.build_process_group("), source.index("self.resume_kv_cache_replicas(")
    between = source[build:resume]
    assert "actor_wg.update_weights(" in between and "rollout.update_weights(" in between
    assert '["finalize"]' in between
    assert "RayWorkerGroup(" in source[source.index("self.abort_replicas(") : source.index("self.release_kv")]
    for name in PHASE_METHODS:  # each is overridden here, so none runs untimed
        assert name in OneStepOffCheckpointManager.__dict__, name


def test_verl_builds_the_manager_the_trainer_names():
    """Tripwire: ``DisjointPoolsTrainer`` chooses the manager through this key, which verl's ``init_workers`` reads."""
    assert '"checkpoint_manager_class"' in inspect.getsource(SeparateRayPPOTrainer.init_workers)


def test_the_replicas_are_never_put_to_sleep(clock):
    """verl's generation step calls ``sleep_replicas``; the rollout pool generates the batches ahead meanwhile."""
    manager = _manager(clock)
    for replica in manager.replicas:
        replica.sleep = None  # verl's manager would call it
    manager.sleep_replicas()
    assert clock.now == 1000.0


class SubclassedManager(OneStepOffCheckpointManager):
    """A user's manager that extends the recipe's."""


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        (None, None),
        (f"{__name__}.SubclassedManager", None),
        ("verl.checkpoint_engine.base.CheckpointEngineManager", "is not a subclass of"),
        ("no_such_module.Manager", "does not import"),
    ],
)
def test_the_sync_manager_is_the_recipes_or_a_subclass_and_any_other_class_is_refused_naming_the_key(name, refused):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"checkpoint_manager_class": name}}})
    if refused is None:
        assert sync_manager.checkpoint_manager_class(config) is (
            SubclassedManager if name else OneStepOffCheckpointManager
        )
        return
    with pytest.raises(ConfigError) as error:
        sync_manager.checkpoint_manager_class(config)
    (problem,) = error.value.problems
    assert problem.startswith(f"actor_rollout_ref.rollout.checkpoint_manager_class={name} {refused}")
    assert "subclass recipe.one_step_off_async.trainer.sync_manager.OneStepOffCheckpointManager" in problem
