"""The elastic rollout pool's parts, without a trainer: membership, failover of requests, the mailbox, the CLI.

``ElasticRolloutPool`` runs against verl's real ``GlobalRequestLoadBalancer`` and the recipe's real
``RolloutPoolController`` (both Ray actors); replicas, the checkpoint manager, starting and killing
replicas are stand-ins that record what the pool asked of them. ``ElasticLLMServerClient`` runs
against real server actors that die. The end-to-end runs are in ``test_elastic_on_cpu.py``.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
from faults import VLLM_ENGINE, process_running
from omegaconf import OmegaConf
from verl import DataProto
from verl.workers.rollout.llm_server import LLMServerClient

from recipe.one_step_off_async.async_config import ElasticConfig
from recipe.one_step_off_async.elastic.client import (
    REGENERATED,
    SERVED_BY,
    ElasticLLMServerClient,
    RolloutPoolLostError,
)
from recipe.one_step_off_async.elastic.controller import RolloutPoolController, ScaleRequest
from recipe.one_step_off_async.elastic.pool import (
    PROBE_RETRY_S,
    ElasticRolloutPool,
    _abandon_start,
    _dead_replicas,
    _shut_down,
    replicas_that_fit,
)
from recipe.one_step_off_async.errors import ConfigError

# --- replicas_that_fit: pure --------------------------------------------------------------------


def test_a_gpu_replica_needs_its_devices_and_verls_two_cpus_per_device_on_one_node():
    nodes = {"a": {"GPU": 4.0, "CPU": 16.0}, "b": {"GPU": 2.0, "CPU": 3.0}, "c": {"CPU": 64.0}}
    assert replicas_that_fit(nodes, "GPU", devices_per_node=2, nodes=1) == 2  # a: 2, b: CPU-bound 0, c: no GPU
    assert replicas_that_fit(nodes, "GPU", devices_per_node=1, nodes=1) == 5  # a: 4, b: 1
    assert replicas_that_fit({}, "GPU", devices_per_node=1, nodes=1) == 0


def test_on_cpu_the_device_is_the_cpu_and_multi_node_replicas_need_that_many_nodes():
    assert replicas_that_fit({"a": {"CPU": 3.5}}, "CPU", devices_per_node=1, nodes=1) == 3
    nodes = {name: {"GPU": 8.0, "CPU": 32.0} for name in "abc"}
    assert replicas_that_fit(nodes, "GPU", devices_per_node=8, nodes=2) == 1


# --- the controller: a plain class, tested without Ray ---------------------------------------------


def test_the_controller_queues_requests_until_the_trainer_takes_them():
    controller = RolloutPoolController()
    first, second = controller.request(add=1), controller.request(remove=2)
    assert controller.outcome(first)["state"] == "queued"
    assert controller.take_requests() == [ScaleRequest(first, 1, 0), ScaleRequest(second, 0, 2)]
    assert controller.take_requests() == []
    controller.resolve(first, "done", "replica 3 joined at step 4 with v4")
    assert controller.status()["requests"][first]["detail"] == "replica 3 joined at step 4 with v4"
    with pytest.raises(ValueError, match="at least one replica"):
        controller.request()
    with pytest.raises(ValueError, match="at least one replica"):
        controller.request(add=-1, remove=1)
    with pytest.raises(KeyError, match="no scale request 99"):
        controller.outcome(99)


def test_the_controller_reports_each_lost_replica_once_however_many_requests_saw_it_die():
    controller = RolloutPoolController()
    for reason in ("ActorDiedError: died", "second", "third"):
        controller.report_lost("server://a", reason)
    assert controller.take_lost() == {"server://a": "ActorDiedError: died"}
    assert controller.take_lost() == {}


# --- the pool against verl's load balancer and the recipe's controller (Ray actors) ----------------


@dataclass(eq=False)
class FakeReplica:
    """What the pool reads of a verl RolloutReplica."""

    replica_rank: int
    server_address: str = ""
    server_handle: str = ""
    workers: list = field(default_factory=list)
    servers: list = field(default_factory=list)
    resource_pool: object = None
    gpus_per_replica_node: int = 1
    nnodes: int = 1

    def __post_init__(self) -> None:
        self.server_address = self.server_address or f"server://replica-{self.replica_rank}"
        self.server_handle = f"handle-{self.replica_rank}"


class FakeReplicaClass(FakeReplica):
    def __init__(self, replica_rank, config, model_config, gpus_per_node):
        super().__init__(replica_rank)


class FakeServerManager:
    rollout_replica_class = FakeReplicaClass

    def __init__(self, replicas, load_balancer):
        self.rollout_replicas = replicas
        self.server_handles = [r.server_handle for r in replicas]
        self.server_addresses = [r.server_address for r in replicas]
        self.global_load_balancer = load_balancer
        self.rollout_config = OmegaConf.create({"n_gpus_per_node": 1})
        self.model_config = OmegaConf.create({})


class FakeCheckpointManager:
    def __init__(self, replicas):
        self.replicas = replicas
        self.calls = []

    def add_replicas(self, replicas):
        self.calls.append(("add", [r.replica_rank for r in replicas]))
        self.replicas.extend(replicas)

    def remove_replicas(self, replicas):
        self.calls.append(("remove", [r.replica_rank for r in replicas]))
        self.replicas = [r for r in self.replicas if r not in replicas]


class InProcessActor:
    """An actor handle whose ``method.remote(...)`` runs the method in this process and returns an ObjectRef.

    The real classes (verl's load balancer, the recipe's controller), without a worker process each.
    """

    def __init__(self, instance) -> None:
        self._instance = instance

    def __getattr__(self, name: str) -> SimpleNamespace:
        import ray

        method = getattr(self._instance, name)
        return SimpleNamespace(remote=lambda *args, **kwargs: ray.put(method(*args, **kwargs)))


def load_balancer(servers: dict) -> InProcessActor:
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    return InProcessActor(GlobalRequestLoadBalancer(servers=servers))


class Harness:
    """An ElasticRolloutPool of ``replicas`` live replicas, with every side effect recorded.

    ``probe=True``: the pool's own liveness probe, on the processes a test gives the replicas; else the
    replicas whose rank is in ``dead`` are found dead.
    """

    def __init__(self, ray, replicas=2, free=None, start=None, probe=False, **settings):
        self.ray = ray
        self.replicas = [FakeReplica(rank) for rank in range(replicas)]
        self.load_balancer = load_balancer({r.server_address: r.server_handle for r in self.replicas})
        self.controller = InProcessActor(RolloutPoolController())
        self.servers = FakeServerManager(self.replicas, self.load_balancer)
        self.checkpoints = FakeCheckpointManager(self.servers.rollout_replicas)  # verl shares the list
        self.free = free if free is not None else {}
        self.dead: dict[int, str] = {}
        self.shut: list[int] = []
        self.pool = ElasticRolloutPool(
            ElasticConfig(enable=True, **settings),
            self.servers,
            self.checkpoints,
            self.controller,
            device_resource="CPU",
            free_resources=lambda: self.free,
            start_replica=start or (lambda replica: replica),
            shut_down=lambda replica: self.shut.append(replica.replica_rank),
            find_dead=None
            if probe
            else lambda replicas: {r.replica_rank: why for r in replicas if (why := self.dead.get(r.replica_rank))},
        )

    def balanced(self) -> list[str]:
        return sorted(self.ray.get(self.load_balancer.get_all_servers.remote()))

    def outcome(self, request_id: int) -> dict:
        return self.ray.get(self.controller.outcome.remote(request_id))

    def request(self, **counts) -> int:
        return self.ray.get(self.controller.request.remote(**counts))

    def poll_until_started(self, step: int, timeout_s: float = 10) -> None:
        self.pool.poll(step)
        deadline = time.monotonic() + timeout_s
        while self.pool._starting and time.monotonic() < deadline:
            time.sleep(0.05)
            self.pool.poll(step)


def test_a_lost_replica_leaves_the_weight_syncs_and_is_shut_down_at_the_next_step_boundary(cpu_ray):
    h = Harness(cpu_ray)
    # What ElasticLLMServerClient does when a request dies with its replica:
    cpu_ray.get(h.load_balancer.remove_servers.remote(["server://replica-1"]))
    cpu_ray.get(h.controller.report_lost.remote("server://replica-1", "ActorDiedError: killed"))
    h.pool.poll(3)
    assert list(h.pool.live) == ["server://replica-0"]
    assert h.checkpoints.calls == [("remove", [1])] and [r.replica_rank for r in h.checkpoints.replicas] == [0]
    assert h.shut == [1]
    assert h.servers.server_addresses == ["server://replica-0"] and h.servers.rollout_replicas == [h.replicas[0]]
    assert str(h.pool.lost[0]) == "replica 1 (server://replica-1) lost at step 3: ActorDiedError: killed"
    assert h.pool.metrics()["async/rollout_replicas"] == 1.0
    assert h.pool.metrics()["async/rollout_replicas_lost"] == 1.0


def test_losing_the_last_replica_fails_naming_every_loss(cpu_ray):
    h = Harness(cpu_ray, replicas=2)
    cpu_ray.get(h.controller.report_lost.remote("server://replica-0", "ActorDiedError: killed"))
    h.pool.poll(2)  # one left: the run goes on
    cpu_ray.get(h.controller.report_lost.remote("server://replica-1", "ActorDiedError: killed"))
    error = h.pool.explain_failure(5)  # the generation of step 5 failed
    assert isinstance(error, RolloutPoolLostError)
    message = str(error)
    assert "down to 0 live replica(s) at step 5" in message and "min_replicas=1" in message
    assert (
        "replica 0 (server://replica-0) lost at step 2" in message
        and "replica 1 (server://replica-1) lost at step 5" in message
    )
    with pytest.raises(RolloutPoolLostError):
        h.pool.poll(6)


def test_a_generation_failure_with_replicas_left_is_not_renamed(cpu_ray):
    assert Harness(cpu_ray).pool.explain_failure(1) is None


def test_min_replicas_fails_the_run_before_the_pool_is_empty(cpu_ray):
    h = Harness(cpu_ray, replicas=3, min_replicas=3)
    cpu_ray.get(h.controller.report_lost.remote("server://replica-2", "ActorDiedError: killed"))
    with pytest.raises(RolloutPoolLostError, match="down to 2 live replica.*min_replicas=3"):
        h.pool.poll(1)


def test_a_replica_that_died_while_the_pool_was_idle_is_dropped_before_the_sync(cpu_ray):
    h = Harness(cpu_ray)
    h.dead[0] = "ActorDiedError: node lost"
    h.pool.before_sync(4)
    assert list(h.pool.live) == ["server://replica-1"] and h.balanced() == ["server://replica-1"]
    assert h.checkpoints.calls == [("remove", [0])] and h.shut == [0]
    assert "found dead before the weight sync (ActorDiedError: node lost)" in str(h.pool.lost[0])


def test_an_added_replica_gets_the_weights_at_the_next_sync_and_only_then_takes_requests(cpu_ray):
    h = Harness(cpu_ray, replicas=1, free={"node": {"CPU": 1.0}})
    request = h.request(add=1)
    h.poll_until_started(2)
    assert h.outcome(request)["state"] == "in progress"
    assert h.balanced() == ["server://replica-0"]  # up, but not serving: it has no weights yet
    assert h.pool.metrics()["async/rollout_replicas_joining"] == 1.0
    h.pool.before_sync(3)
    assert h.checkpoints.calls == [("add", [1])]  # this sync (v3) reaches it
    assert h.balanced() == ["server://replica-0"]
    h.pool.after_sync(3)
    assert h.balanced() == ["server://replica-0", "server://replica-1"]
    assert h.servers.server_addresses == ["server://replica-0", "server://replica-1"]
    outcome = h.outcome(request)
    assert outcome["state"] == "done" and "replica 1 joined at step 3 with v3" in outcome["detail"]
    assert h.pool.metrics()["async/rollout_replicas"] == 2.0
    assert h.pool.metrics()["async/rollout_replicas_joined"] == 1.0


def test_an_add_without_room_in_the_cluster_is_refused(cpu_ray):
    h = Harness(cpu_ray, replicas=1, free={"node": {"CPU": 0.5}})
    request = h.request(add=1)
    h.pool.poll(1)
    outcome = h.outcome(request)
    assert outcome["state"] == "refused" and "free resources for 0 more replica(s)" in outcome["detail"]
    assert not h.pool._starting


def test_an_add_larger_than_the_room_starts_what_fits(cpu_ray):
    h = Harness(cpu_ray, replicas=1, free={"node": {"CPU": 1.0}})
    request = h.request(add=3)
    h.poll_until_started(1)
    assert "for 1 more replica(s)" in h.outcome(request)["detail"]
    h.pool.before_sync(2)
    h.pool.after_sync(2)
    assert h.outcome(request)["state"] == "partial" and len(h.pool.live) == 2
    assert [r.replica_rank for r in h.checkpoints.replicas] == [0, 1]  # the sync manager holds both


def test_a_removed_replica_takes_no_new_requests_and_is_shut_down_at_the_next_sync(cpu_ray):
    h = Harness(cpu_ray, replicas=3)
    request = h.request(remove=1)
    h.pool.poll(5)
    assert h.balanced() == ["server://replica-0", "server://replica-1"]  # the most recently started goes
    assert h.checkpoints.calls == [("remove", [2])] and h.shut == []  # requests on it may still run
    assert h.outcome(request)["state"] == "in progress"
    h.pool.before_sync(6)
    assert h.shut == [2]
    assert h.outcome(request)["state"] == "done"
    refused = h.request(remove=2)
    h.pool.poll(7)
    assert h.outcome(refused)["state"] == "refused" and "min_replicas=1" in h.outcome(refused)["detail"]
    assert len(h.pool.live) == 2


def test_the_pool_grows_into_a_node_that_joins_one_replica_at_a_time_up_to_max_replicas(cpu_ray):
    h = Harness(cpu_ray, replicas=1, max_replicas=3)
    h.pool.poll(1)
    assert not h.pool._starting  # no room yet
    h.free = {"new-node": {"CPU": 4.0}}  # a node joins the cluster
    for step in (2, 3, 4, 5):
        h.poll_until_started(step)
        h.pool.before_sync(step)
        h.pool.after_sync(step)
    assert len(h.pool.live) == 3
    h.poll_until_started(6)
    assert len(h.pool.live) == 3 and not h.pool._starting and not h.pool._joining


def test_a_replica_that_fails_to_start_fails_its_request_and_the_run_goes_on(cpu_ray):
    def broken(replica):
        raise RuntimeError("vLLM could not allocate the KV cache")

    h = Harness(cpu_ray, replicas=1, free={"node": {"CPU": 1.0}}, start=broken)
    request = h.request(add=1)
    h.poll_until_started(1)
    outcome = h.outcome(request)
    assert outcome["state"] == "failed" and "could not allocate the KV cache" in outcome["detail"]
    assert len(h.pool.live) == 1


def test_a_start_slower_than_start_timeout_is_abandoned(cpu_ray):
    release = threading.Event()
    h = Harness(cpu_ray, replicas=1, free={"node": {"CPU": 1.0}}, start=lambda r: release.wait(), start_timeout_s=0.2)
    request = h.request(add=1)
    h.pool.poll(1)
    time.sleep(0.4)
    h.pool.poll(2)
    release.set()
    outcome = h.outcome(request)
    assert (
        outcome["state"] == "failed"
        and "not up within async_training.elastic.start_timeout_s=0.2 s" in outcome["detail"]
    )
    assert not h.pool._starting and not h.pool._joining


def test_a_replica_up_and_waiting_for_its_first_sync_counts_toward_min_replicas(cpu_ray):
    h = Harness(cpu_ray, replicas=1, free={"node": {"CPU": 1.0}})
    h.request(add=1)
    h.poll_until_started(1)
    cpu_ray.get(h.controller.report_lost.remote("server://replica-0", "ActorDiedError: killed"))
    h.pool.before_sync(1)  # the new replica gets v1 in this sync: the run can go on
    h.pool.after_sync(1)
    assert list(h.pool.live) == ["server://replica-1"] and h.balanced() == ["server://replica-1"]


def test_the_elastic_pool_has_every_step_hook_the_trainer_calls():
    """The trainer calls its rollout pool through ``trainer/hooks.py``; the elastic layer cannot import it."""
    from recipe.one_step_off_async.trainer.hooks import StepHooks

    hooks = [name for name, hook in vars(StepHooks).items() if callable(hook) and not name.startswith("_")]
    assert len(hooks) == 8
    for name in hooks:
        expected = list(inspect.signature(getattr(StepHooks, name)).parameters)
        assert list(inspect.signature(getattr(ElasticRolloutPool, name)).parameters) == expected, name


def test_batch_metrics_count_the_requests_each_replica_served_and_those_regenerated(cpu_ray):
    h = Harness(cpu_ray)
    output = DataProto.from_dict(
        non_tensors={
            SERVED_BY: np.array(["server://replica-0"] * 3 + ["server://replica-1"], dtype=object),
            REGENERATED: np.array([0, 1, 2, 0], dtype=object),
        }
    )
    assert h.pool.batch_metrics(1, output) == {
        "async/replica_requests/0": 3.0,
        "async/replica_requests/1": 1.0,
        "async/regenerated_requests": 2.0,
    }


# --- the client: a request whose replica dies is generated again on a survivor ---------------------


@pytest.fixture(scope="module")
def ray_shipping_servers(cpu_ray):
    """The session's Ray, with this module's ``Server`` shipped by value: workers cannot import a test module."""
    cpu_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield cpu_ray
    cpu_ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


class AbortRecorder:
    """A replica's server as the pool's shutdown sees it: records the aborts it gets."""

    def __init__(self) -> None:
        self.aborts = []

    def abort_all_requests(self, reject_request: bool = False) -> None:
        self.aborts.append(reject_request)

    def recorded(self) -> list:
        return self.aborts


def test_requests_still_on_a_removed_replica_are_aborted_before_it_is_shut_down(ray_shipping_servers):
    """With partial rollout, a sync does not wait for idle: what still runs on the leaving replica comes back
    aborted (and its clients resume it on the others) instead of dying with the process."""
    cpu_ray = ray_shipping_servers
    h = Harness(cpu_ray, replicas=2)
    server = cpu_ray.remote(AbortRecorder).options(num_cpus=0).remote()
    h.replicas[1].servers = [server]
    h.request(remove=1)
    h.pool.poll(5)
    h.pool.before_sync(6)
    assert cpu_ray.get(server.recorded.remote()) == [True] and h.shut == [1]
    cpu_ray.kill(server)


class Server:
    """A rollout server that answers every request, stamping its weight version."""

    def __init__(self, behaviour: str = "answer") -> None:
        self.behaviour = behaviour

    async def generate(self, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if self.behaviour == "die":
            os._exit(1)  # the process is gone, as after the OOM killer
        if self.behaviour == "raise":
            raise ValueError("the prompt is longer than the model's context")
        if self.behaviour == "engine_dead":
            raise EngineDeadError("EngineCore encountered an issue.")  # vLLM's server, its engine process gone
        return TokenOutput(token_ids=[7, 8], log_probs=[-0.1, -0.2], extra_fields={"global_steps": 3})


@pytest.fixture(scope="module")
def servers(ray_shipping_servers):
    """Server actors that outlive a test (a dying one is made per test)."""
    ray = ray_shipping_servers
    return {behaviour: ray.remote(Server).remote(behaviour) for behaviour in ("answer", "raise")}


def _client_and_pool(ray, servers, behaviours: dict[str, str]):
    handles = {address: ray.remote(Server).remote(b) if b == "die" else servers[b] for address, b in behaviours.items()}
    first = next(iter(handles))
    balancer = load_balancer({first: handles[first]})
    ray.get(balancer.acquire_server.remote("request-1"))  # "request-1" sticks to the first server
    ray.get(balancer.release_server.remote(first))
    ray.get(balancer.add_servers.remote({a: h for a, h in handles.items() if a != first}))
    controller = InProcessActor(RolloutPoolController())
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    return ElasticLLMServerClient(config, balancer, controller=controller), balancer, controller


def _generate(ray, client):
    import asyncio

    return asyncio.run(client.generate("request-1", prompt_ids=[1, 2, 3], sampling_params={"temperature": 1.0}))


def test_a_request_whose_replica_dies_is_generated_again_on_a_survivor(ray_shipping_servers, servers):
    cpu_ray = ray_shipping_servers
    client, balancer, controller = _client_and_pool(
        cpu_ray, servers, {"server://dying": "die", "server://healthy": "answer"}
    )
    output = _generate(cpu_ray, client)
    assert output.token_ids == [7, 8]
    assert output.extra_fields[SERVED_BY] == "server://healthy" and output.extra_fields[REGENERATED] == 1
    assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 3
    assert cpu_ray.get(balancer.get_all_servers.remote()) == ["server://healthy"]
    lost = cpu_ray.get(controller.take_lost.remote())
    assert list(lost) == ["server://dying"] and lost["server://dying"].startswith("ActorDiedError")


def test_a_request_whose_replica_ray_cannot_reach_is_asked_again_until_ray_declares_it_dead(
    ray_shipping_servers, servers, monkeypatch
):
    """A lost node: Ray first cannot reach its actors (ActorUnavailableError), then declares them dead."""
    cpu_ray = ray_shipping_servers
    client, balancer, controller = _client_and_pool(
        cpu_ray, servers, {"server://on-lost-node": "die", "server://healthy": "answer"}
    )
    monkeypatch.setattr("recipe.one_step_off_async.elastic.client.UNAVAILABLE_RETRY_S", 0.01)
    generate, unreachable = LLMServerClient.generate, [2]

    async def unreachable_twice(self, request_id, **kwargs):
        if unreachable[0]:
            unreachable[0] -= 1
            await self._acquire_server(request_id)
            raise cpu_ray.exceptions.ActorUnavailableError("the actor's node does not answer", None)
        return await generate(self, request_id, **kwargs)

    monkeypatch.setattr(LLMServerClient, "generate", unreachable_twice)
    output = _generate(cpu_ray, client)
    assert unreachable == [0] and output.extra_fields[SERVED_BY] == "server://healthy"
    assert output.extra_fields[REGENERATED] == 1  # the unreachable attempts are not losses; its death is
    assert list(cpu_ray.get(controller.take_lost.remote())) == ["server://on-lost-node"]


def test_a_replica_unreachable_for_longer_than_the_bound_is_lost_and_its_request_generated_again(
    ray_shipping_servers, servers, monkeypatch
):
    """A node cut off, not gone: Ray never declares it dead, the client stops waiting after UNREACHABLE_LOST_S."""
    cpu_ray = ray_shipping_servers
    client, balancer, controller = _client_and_pool(
        cpu_ray,
        servers,
        {"server://cut-off": "die", "server://healthy": "answer"},  # a server of its own: killed
    )
    monkeypatch.setattr("recipe.one_step_off_async.elastic.client.UNAVAILABLE_RETRY_S", 0.01)
    monkeypatch.setattr("recipe.one_step_off_async.elastic.client.UNREACHABLE_LOST_S", 0.1)
    generate = LLMServerClient.generate

    async def cut_off(self, request_id, **kwargs):
        server_id, _ = await self._acquire_server(request_id)
        if server_id == "server://cut-off":
            self._release_server(server_id)
            raise cpu_ray.exceptions.ActorUnavailableError("the actor's node does not answer", None)
        self._release_server(server_id)
        return await generate(self, request_id, **kwargs)

    monkeypatch.setattr(LLMServerClient, "generate", cut_off)
    output = _generate(cpu_ray, client)
    assert output.extra_fields[SERVED_BY] == "server://healthy" and output.extra_fields[REGENERATED] == 1
    lost = cpu_ray.get(controller.take_lost.remote())
    assert list(lost) == ["server://cut-off"] and lost["server://cut-off"].startswith("ActorUnavailableError")


class EngineDeadError(RuntimeError):
    """What vLLM's server raises once its engine process died (``vllm.v1.engine.exceptions``), by name."""


def test_a_request_whose_replicas_engine_died_is_generated_again_and_the_replica_killed(ray_shipping_servers, servers):
    cpu_ray = ray_shipping_servers
    dead_engine = cpu_ray.remote(Server).remote("engine_dead")
    servers = {**servers, "engine_dead": dead_engine}
    client, balancer, controller = _client_and_pool(
        cpu_ray, servers, {"vllm://dead": "engine_dead", "vllm://ok": "answer"}
    )
    output = _generate(cpu_ray, client)
    assert output.extra_fields[SERVED_BY] == "vllm://ok" and output.extra_fields[REGENERATED] == 1
    assert cpu_ray.get(balancer.get_all_servers.remote()) == ["vllm://ok"]
    lost = cpu_ray.get(controller.take_lost.remote())
    assert list(lost) == ["vllm://dead"] and lost["vllm://dead"].startswith("RayTaskError(EngineDeadError)")
    # Its server is killed (ray.kill returns before the actor is gone).
    deadline = time.monotonic() + 30
    with pytest.raises(cpu_ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            cpu_ray.get(dead_engine.__ray_ready__.remote(), timeout=30)
            time.sleep(0.2)


def test_a_request_with_no_replica_left_fails_naming_the_lost_ones(ray_shipping_servers, servers):
    cpu_ray = ray_shipping_servers
    client, balancer, _ = _client_and_pool(cpu_ray, servers, {"server://only": "die"})
    with pytest.raises(RolloutPoolLostError, match="no rollout replica is left.*server://only"):
        _generate(cpu_ray, client)


def test_a_request_that_outlives_three_replicas_is_not_sent_to_a_fourth(ray_shipping_servers, servers):
    cpu_ray = ray_shipping_servers
    behaviours = {"server://a": "die", "server://b": "die", "server://c": "die", "server://healthy": "answer"}
    client, balancer, _ = _client_and_pool(cpu_ray, servers, behaviours)
    cpu_ray.get(balancer.remove_servers.remote(["server://healthy"]))  # the dying ones are picked first
    with pytest.raises(RolloutPoolLostError, match="3 rollout replicas died while generating it"):
        _generate(cpu_ray, client)


def test_an_error_raised_by_a_live_replica_is_not_retried(ray_shipping_servers, servers):
    cpu_ray = ray_shipping_servers
    client, balancer, controller = _client_and_pool(
        cpu_ray, servers, {"server://strict": "raise", "server://healthy": "answer"}
    )
    with pytest.raises(cpu_ray.exceptions.RayTaskError, match="longer than the model's context"):
        _generate(cpu_ray, client)
    assert sorted(cpu_ray.get(balancer.get_all_servers.remote())) == ["server://healthy", "server://strict"]
    assert cpu_ray.get(controller.take_lost.remote()) == {}


# --- the liveness probe and shutting replicas down: real actors and placement groups -----------------


class Process:
    """A replica's process: a sync actor, one call at a time, so a probe waits behind the call it is busy with
    (as behind an engine step on a loaded machine)."""

    def hold(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def process(ray_shipping_servers):
    """Starts replica processes, up and answering; kills them after the test."""
    ray = ray_shipping_servers
    started = []

    def start():
        handle = ray.remote(Process).options(num_cpus=0).remote()
        ray.get(handle.__ray_ready__.remote())  # its start-up is not what a test measures
        started.append(handle)
        return handle

    yield start
    for handle in started:
        ray.kill(handle)


def _kill_and_wait_until_dead(ray, handle) -> None:
    """``ray.kill`` returns before the process is gone: until then the actor still answers probes."""
    ray.kill(handle)
    while True:
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=30)
        except ray.exceptions.ActorDiedError:
            return
        time.sleep(0.05)


def test_a_replica_busy_for_several_probe_rounds_but_less_than_silent_timeout_stays_live(ray_shipping_servers, process):
    ray = ray_shipping_servers
    busy, idle, killed = process(), process(), process()
    _kill_and_wait_until_dead(ray, killed)
    busy.hold.remote(3 * PROBE_RETRY_S)
    started = time.monotonic()
    dead = _dead_replicas(
        [
            FakeReplica(0, servers=[busy]),
            FakeReplica(1, workers=[idle], servers=[idle]),
            FakeReplica(2, servers=[killed]),
        ],
        silent_timeout_s=60,
    )
    assert list(dead) == [2] and dead[2].startswith("ActorDiedError: ")
    assert time.monotonic() - started > 2 * PROBE_RETRY_S  # it waited for the busy one's answer


def _probe_answer(reachable: bool) -> bool:
    import ray

    if not reachable:
        raise ray.exceptions.ActorUnavailableError("the actor's node does not answer", None)
    return True


class Unreachable:
    """An actor handle whose first ``unreachable_probes`` probes fail as Ray fails them while it cannot reach a
    node it has not declared dead yet (``ActorUnavailableError``); later ones are answered."""

    def __init__(self, ray, unreachable_probes: int) -> None:
        self.probes = 0
        self._unreachable_probes = unreachable_probes
        self._answer = ray.remote(_probe_answer)
        self.__ray_ready__ = SimpleNamespace(remote=self._probe)

    def _probe(self):
        self.probes += 1
        return self._answer.remote(self.probes > self._unreachable_probes)


def test_a_replica_ray_cannot_reach_for_a_while_is_asked_again_and_stays_live(ray_shipping_servers):
    flaky = Unreachable(ray_shipping_servers, unreachable_probes=2)
    assert _dead_replicas([FakeReplica(0, servers=[flaky])], silent_timeout_s=60) == {}
    assert flaky.probes == 3


def test_a_replica_silent_past_silent_timeout_is_lost_with_the_bound_in_its_cause(ray_shipping_servers, process):
    hung = process()
    hung.hold.remote(3600)
    started = time.monotonic()
    dead = _dead_replicas([FakeReplica(0, servers=[process()]), FakeReplica(1, servers=[hung])], silent_timeout_s=1.5)
    assert list(dead) == [1]
    assert re.fullmatch(
        r"silent for \d+\.\d s: no answer to a liveness probe within async_training\.elastic\.silent_timeout_s=1\.5 s "
        r"\(Ray reports the actor ALIVE\)",
        dead[1],
    )
    assert 1.5 <= time.monotonic() - started < 30


def test_the_pool_drops_a_hung_replica_before_the_sync_naming_it_and_the_bound(ray_shipping_servers, process):
    h = Harness(ray_shipping_servers, probe=True, silent_timeout_s=1.0)
    hung = process()
    hung.hold.remote(3600)
    h.replicas[0].servers, h.replicas[1].servers = [process()], [hung]
    h.pool.before_sync(4)
    assert list(h.pool.live) == ["server://replica-0"] and h.balanced() == ["server://replica-0"] and h.shut == [1]
    assert re.fullmatch(
        r"replica 1 \(server://replica-1\) lost at step 4: found dead before the weight sync \(silent for \d+\.\d s: no "
        r"answer to a liveness probe within async_training\.elastic\.silent_timeout_s=1 s \(Ray reports the actor "
        r"ALIVE\)\)",
        str(h.pool.lost[0]),
    )


def test_silent_timeout_must_be_a_positive_number_of_seconds():
    with pytest.raises(ConfigError, match=r"async_training.elastic.silent_timeout_s=0 must be a positive number"):
        ElasticConfig(silent_timeout_s=0)
    with pytest.raises(ConfigError, match=r"async_training.elastic.silent_timeout_s='2m' must be a positive number"):
        ElasticConfig(silent_timeout_s="2m")


def test_shutting_down_a_replica_that_is_already_gone_raises_nothing(ray_shipping_servers, process):
    ray = ray_shipping_servers
    died, never_placed = process(), ray.remote(Process).options(num_cpus=0, resources={"absent": 1}).remote()
    ray.kill(died)
    group = ray.util.placement_group([{"CPU": 0.01}])
    ray.get(group.ready())
    ray.util.remove_placement_group(group)
    gone = FakeReplica(5, workers=[died, never_placed], servers=[died], resource_pool=SimpleNamespace(pgs=[group]))
    _shut_down(gone)
    _shut_down(gone)  # the pool may shut a replica down twice (lost, then found dead)


def test_abandoning_a_start_frees_its_group_and_tolerates_one_removed_meanwhile(ray_shipping_servers, monkeypatch):
    ray = ray_shipping_servers
    group = ray.util.placement_group([{"CPU": 0.01}], name="rollout_pool_98verl_group_0")
    ray.get(group.ready())
    stale = ray.util.placement_group_table()
    _abandon_start(98)
    assert ray.util.placement_group_table(group)["state"] == "REMOVED"
    with pytest.raises(ValueError, match="Failed to look up placement group"):
        ray.util.get_placement_group("rollout_pool_98verl_group_0")
    # The start's own thread read the table before the trainer's thread removed the group: Ray's
    # "Failed to look up placement group" ValueError is the expected one.
    monkeypatch.setattr(ray.util, "placement_group_table", lambda: stale)
    _abandon_start(98)


def test_any_other_error_while_shutting_down_or_abandoning_propagates(ray_shipping_servers, monkeypatch):
    ray = ray_shipping_servers

    def control_plane_down(*args, **kwargs):
        raise RuntimeError("the GCS is unreachable")

    monkeypatch.setattr(ray, "kill", control_plane_down)
    with pytest.raises(RuntimeError, match="GCS is unreachable"):
        _shut_down(FakeReplica(6, servers=["handle-6"]))
    monkeypatch.undo()
    group = ray.util.placement_group([{"CPU": 0.01}], name="rollout_pool_99verl_group_0")
    ray.get(group.ready())
    try:
        monkeypatch.setattr(ray.util, "remove_placement_group", control_plane_down)
        with pytest.raises(RuntimeError, match="GCS is unreachable"):
            _shut_down(FakeReplica(7, resource_pool=SimpleNamespace(pgs=[group])))
        with pytest.raises(RuntimeError, match="GCS is unreachable"):
            _abandon_start(99)
        monkeypatch.setattr(ray.util, "get_placement_group", control_plane_down)
        with pytest.raises(RuntimeError, match="GCS is unreachable"):
            _abandon_start(99)
    finally:
        monkeypatch.undo()
        ray.util.remove_placement_group(group)


# --- naming the job's controller, and the scale command -----------------------------------------


def test_two_jobs_cannot_share_an_experiment_name_and_the_scale_command_finds_each(cpu_ray):
    from recipe.one_step_off_async.elastic.controller import find_controller, start_controller

    with pytest.raises(LookupError, match="0 elastic one-step-off jobs"):
        find_controller(None)
    first = start_controller("exp-a")
    cpu_ray.get(first.status.remote())
    with pytest.raises(ValueError, match="already runs an elastic rollout pool named 'rollout_pool:exp-a'"):
        start_controller("exp-a")
    assert find_controller(None)[0] == "exp-a"
    second = start_controller("exp-b")
    cpu_ray.get(second.status.remote())
    with pytest.raises(LookupError, match="2 elastic one-step-off jobs.*exp-a, exp-b.*--experiment"):
        find_controller(None)
    assert find_controller("exp-b")[0] == "exp-b"
    with pytest.raises(LookupError, match="No elastic one-step-off job named 'exp-c'"):
        find_controller("exp-c")
    for actor in (first, second):
        cpu_ray.kill(actor)


def test_the_scale_command_gives_up_on_an_unreachable_cluster_within_its_timeout():
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "recipe.one_step_off_async.scale", "--status", "--address", "127.0.0.1:9"]
        + ["--connect-timeout", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Could not join the Ray cluster at '127.0.0.1:9'" in result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("argv", [["--add", "0"], ["--remove", "-1"], ["--add", "1", "--remove", "1"], []])
def test_the_scale_command_rejects_bad_arguments(argv):
    from recipe.one_step_off_async.scale import _parse

    with pytest.raises(SystemExit):
        _parse(argv)


class VllmEngineHost:
    """A replica's server as far as its engine goes: vLLM's ``AsyncLLM`` on the demo model, whose engine core runs
    in a process of its own below this actor (on a GPU, the process that holds the device's memory)."""

    def start(self, model: str) -> list[int]:
        import psutil
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=model, enforce_eager=True, max_model_len=64, kv_cache_memory_bytes=64 << 20, dtype="float32"
        )
        self.engine = AsyncLLM.from_engine_args(args)
        return [child.pid for child in psutil.Process().children(recursive=True) if child.name() == VLLM_ENGINE]


def test_a_removed_replicas_vllm_engine_process_ends_within_seconds(ray_shipping_servers, demo_assets):
    """What a scale-down runs (``_shut_down``) ends the replica's engine too (a killed or dropped replica:
    ``test_e2e_partial_on_cpu.py``); an engine that outlived it would keep its memory from the next replica."""
    ray = ray_shipping_servers
    server = ray.remote(VllmEngineHost).options(num_cpus=0).remote()
    engines = ray.get(server.start.remote(demo_assets.model_dir), timeout=300)
    assert len(engines) == 1
    _shut_down(SimpleNamespace(workers=[], servers=[server], resource_pool=None))
    deadline = time.monotonic() + 10
    while any(process_running(pid) for pid in engines):
        assert time.monotonic() < deadline, f"vLLM engine {engines} still runs 10 s after its replica was removed"
        time.sleep(0.2)
