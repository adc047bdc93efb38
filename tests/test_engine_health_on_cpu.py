"""A dead rollout engine ends the trainer's waits at once, by name (``trainer/engine_health.py``, ``deadlines.wait_for``).

The waits are checked with a pending future and a check that raises; the watch with Ray actors standing in for
verl's server actors: one whose engine says ``errored`` as vLLM's ``AsyncLLM`` does when its process died, one
healthy, one killed.
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
from types import SimpleNamespace

import pytest

from recipe.one_step_off_async.errors import PipelineTimeoutError, RolloutEngineDiedError
from recipe.one_step_off_async.trainer.deadlines import wait_for
from recipe.one_step_off_async.trainer.engine_health import EngineWatch, engine_failure


class DeadError(Exception):
    pass


def test_a_check_that_raises_ends_the_wait_long_before_its_timeout():
    calls = []

    def check():
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise DeadError("replica 0 died")

    started = time.monotonic()
    with pytest.raises(DeadError, match="replica 0 died"):
        wait_for(concurrent.futures.Future(), 600, lambda: "never", check)
    assert len(calls) == 2  # the wait checked every CHECK_EVERY_S and ended at the first check that raised
    assert time.monotonic() - started < 60  # a tenth of the timeout: bounded by the checks, not the wait


def test_a_wait_returns_the_result_and_times_out_by_name_with_or_without_a_check():
    done: concurrent.futures.Future = concurrent.futures.Future()
    done.set_result(7)
    assert wait_for(done, 1, lambda: "never", lambda: None) == 7
    for check in (None, lambda: None):
        with pytest.raises(PipelineTimeoutError, match="the batch of step 3"):
            wait_for(concurrent.futures.Future(), 0.3, lambda: "the batch of step 3", check)


def test_engine_failure_reads_what_vllm_says_of_its_engine():
    class AsyncLLM:
        errored = True
        dead_error = RuntimeError("EngineCore died")

    assert "AsyncLLM engine died" in engine_failure(SimpleNamespace(engine=AsyncLLM()))
    assert engine_failure(SimpleNamespace(engine=SimpleNamespace(errored=False))) is None
    assert engine_failure(SimpleNamespace(engine=object())) is None  # an engine without the flag
    assert engine_failure(object()) is None


class _Engine:
    def __init__(self, errored: bool) -> None:
        self.errored = errored
        self.dead_error = RuntimeError("EngineCore died")


class _Server:
    def __init__(self, errored: bool) -> None:
        self.engine = _Engine(errored)

    def ping(self) -> bool:
        return True

    def kill_engine(self) -> None:
        self.engine.errored = True

    def block(self, seconds: float) -> None:
        time.sleep(seconds)  # a server busy generating: a question waits until it is done


@pytest.fixture
def ray_with_this_module(cpu_ray):
    """Ray actors of this module's classes (the workers cannot import the tests)."""
    cpu_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield cpu_ray
    cpu_ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def make_replicas(ray_with_this_module):
    """``make_replicas(*errored)``: stand-ins for verl's replicas, one server actor each, killed after the test (the
    Ray cluster is the session's)."""
    ray, actors = ray_with_this_module, []

    def make(*errored: bool):
        server = ray.remote(num_cpus=0)(_Server)
        replicas = [
            SimpleNamespace(
                replica_rank=rank, _server_address=f"127.0.0.1:{8000 + rank}", servers=[server.remote(dead)]
            )
            for rank, dead in enumerate(errored)
        ]
        actors.extend(replica.servers[0] for replica in replicas)
        # Started and probed once (the first probe imports the recipe's trainer in the actor), as verl's replicas
        # are long before the trainer waits on them: a probe that times out counts as alive.
        ray.get([replica.servers[0].__ray_call__.remote(engine_failure) for replica in replicas])
        return replicas

    yield make
    for actor in actors:
        ray.kill(actor)


def _died_within(ray, actor, seconds: float) -> bool:
    """Whether ``actor`` stops answering within ``seconds`` (``ray.kill`` returns before the actor is gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=seconds)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def _kill(ray, actor) -> None:
    ray.kill(actor)
    assert _died_within(ray, actor, 30)


def test_a_fixed_pool_fails_naming_the_replica_whose_engine_or_actor_died(ray_with_this_module, make_replicas):
    cpu_ray = ray_with_this_module
    healthy, dead = make_replicas(False, True)
    EngineWatch(lambda: [healthy], elastic=False).name_a_dead_engine(timeout_s=30)
    with pytest.raises(RolloutEngineDiedError, match=r"rollout replica 1 \(127.0.0.1:8001\): its _Engine engine died"):
        EngineWatch(lambda: [healthy, dead], elastic=False).name_a_dead_engine(timeout_s=30)
    _kill(cpu_ray, healthy.servers[0])
    with pytest.raises(RolloutEngineDiedError, match="rollout replica 0 .* its server actor died"):
        EngineWatch(lambda: [healthy], elastic=False).name_a_dead_engine(timeout_s=30)


def test_an_elastic_pool_loses_the_replica_whose_engine_died(ray_with_this_module, make_replicas):
    cpu_ray = ray_with_this_module
    healthy, dead = make_replicas(False, True)
    EngineWatch(lambda: [healthy, dead], elastic=True).name_a_dead_engine(timeout_s=30)  # raises nothing
    assert cpu_ray.get(healthy.servers[0].ping.remote())
    # Its server actor is killed: the pool sees the loss the way it sees any other.
    assert _died_within(cpu_ray, dead.servers[0], 30)
    EngineWatch(lambda: [healthy, dead], elastic=True).name_a_dead_engine(
        timeout_s=30
    )  # a dead actor is the pool's to handle


def test_a_check_never_waits_on_a_busy_server_and_a_later_check_finds_the_dead_engine(
    ray_with_this_module, make_replicas
):
    busy, dead = make_replicas(False, True)
    busy_for_s = 120
    still_busy = busy.servers[0].block.remote(busy_for_s)
    watch = EngineWatch(lambda: [busy, dead], elastic=False)
    started = time.monotonic()
    with pytest.raises(RolloutEngineDiedError, match="rollout replica 1"):
        while time.monotonic() - started < busy_for_s / 2:
            watch.check()
            time.sleep(0.1)
    # Found while the busy server still had not answered: no check waited for it.
    assert ray_with_this_module.wait([still_busy], timeout=0)[0] == []


def test_after_a_failure_the_watch_asks_afresh_not_trusting_an_answer_from_before_the_engine_died(
    ray_with_this_module, make_replicas
):
    cpu_ray = ray_with_this_module
    (replica,) = make_replicas(False)
    watch = EngineWatch(lambda: [replica], elastic=False)
    watch.check()
    time.sleep(1)  # the answer "alive" arrives, and is still unread
    cpu_ray.get(replica.servers[0].kill_engine.remote())
    with pytest.raises(RolloutEngineDiedError, match="rollout replica 0"):
        watch.name_a_dead_engine(timeout_s=30)
