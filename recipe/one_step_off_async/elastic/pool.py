"""Elastic rollout pool (``async_training.elastic.enable=true``): replicas leave and join a running job.

verl 0.9.1 has the pieces: its load balancer routes requests (``add_servers`` / ``remove_servers``) and its
``CheckpointEngineManager`` syncs the replicas it holds (``add_replicas`` / ``remove_replicas``). ``ElasticRolloutPool``
is the trainer's bookkeeping over both, changed only at step boundaries: a lost replica leaves the syncs (the agent
loops' client, ``elastic/client.py``, took it out of the load balancer); a new one joins the next sync and the load
balancer right after it, so it never serves stale weights; a leaving one is shut down at the next sync. Its step
hooks match ``trainer/hooks.py`` by name (checked by ``tests/test_elastic_pool_on_cpu.py``). Users' view:
"Elastic rollout pool" in docs/advance/one_step_off_async/deployment.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from verl import DataProto
from verl.workers.rollout.replica import RolloutReplica

from recipe.one_step_off_async.async_config import ElasticConfig
from recipe.one_step_off_async.elastic.client import REGENERATED, SERVED_BY, describe
from recipe.one_step_off_async.errors import RolloutPoolLostError

# verl's standalone replicas: one placement-group bundle per device, {"CPU": 2, <device>: 1}
# (RolloutReplica.init_standalone: max_colocate_count=2; RayResourcePool.get_placement_groups).
STANDALONE_CPUS_PER_DEVICE = 2
# How often the liveness probe asks again a process Ray could not reach (ActorUnavailableError: its node
# or connection may be failing, and Ray has not declared it dead yet), within silent_timeout_s.
PROBE_RETRY_S = 1.0


@dataclass
class _Request:
    """A scale request being carried out: how many replicas it asked for, started or removed, and finished."""

    id: int
    asked: int
    acted: int = 0  # replicas started or removed; fewer than asked: the rest was refused
    finished: int = 0  # of those, replicas that joined, shut down or failed to start
    failed: bool = False  # a replica did not start
    notes: list[str] = field(default_factory=list)  # what happened so far

    @property
    def state(self) -> str:
        if self.finished < self.acted:
            return "in progress"
        if self.failed:
            return "failed"
        if self.acted < self.asked:
            return "partial" if self.acted else "refused"  # partial: did what fitted
        return "done"


@dataclass
class _Start:
    """A new replica, from its start on a background thread until it serves (``request``: None if automatic)."""

    replica: RolloutReplica
    request: _Request | None
    future: concurrent.futures.Future | None = None
    began_at: float | None = None  # when its thread took it up (it may wait behind other starts)
    abandoned: bool = False

    @property
    def rank(self) -> int:
        return self.replica.replica_rank

    @property
    def placed(self) -> bool:
        pool = self.replica.resource_pool
        return pool is not None and pool.pgs is not None


def replicas_that_fit(
    available_per_node: dict[str, dict[str, float]], device_resource: str, devices_per_node: int, nodes: int
) -> int:
    """How many more replicas of ``nodes`` x ``devices_per_node`` devices the free resources can place."""
    need = {device_resource: float(devices_per_node)}
    if device_resource != "CPU":
        need["CPU"] = float(STANDALONE_CPUS_PER_DEVICE * devices_per_node)
    per_node = [
        min(int(free.get(key, 0.0) // amount) for key, amount in need.items()) for free in available_per_node.values()
    ]
    if nodes == 1:
        return sum(per_node)
    return sum(1 for fits in per_node if fits >= 1) // nodes


def _start_replica(replica: RolloutReplica) -> None:
    """Runs on a background thread: place the replica on its own placement group and start its server."""
    asyncio.run(replica.init_standalone())


def _shut_down(replica: RolloutReplica) -> None:
    """Kill the replica's processes and free its placement group (a dead node's group would be re-placed).

    Nothing is caught: with Ray 2.60 both calls return quietly for an actor or group already gone; what they raise
    (a GCS call failing, a handle from another Ray session) is not a replica being gone, and fails the run."""
    for handle in {*replica.workers, *replica.servers}:
        ray.kill(handle, no_restart=True)
    pool = replica.resource_pool
    for group in (pool.pgs or []) if pool is not None else []:
        ray.util.remove_placement_group(group)


def node_of(replica: RolloutReplica) -> str:
    """The Ray node id(s) the replica's placement groups are on ("" before it is placed)."""
    pool = replica.resource_pool
    groups = (pool.pgs or []) if pool is not None else []
    nodes = {node for group in groups for node in ray.util.placement_group_table(group)["bundles_to_node_id"].values()}
    return ",".join(sorted(nodes))


def _abandon_start(rank: int) -> None:
    """Free the placement group of a replica start given up on (its actors go with it), found by verl's group name
    in this job's namespace: the start may not have recorded its groups yet."""
    prefix = f"rollout_pool_{rank}verl_group_"
    for group in ray.util.placement_group_table().values():
        if group.get("name", "").startswith(prefix) and group.get("state") != "REMOVED":
            try:
                placed = ray.util.get_placement_group(group["name"])
            except ValueError:  # Ray's "Failed to look up placement group": removed since the table was read
                continue  # (the start's own thread frees it too), or another namespace's group of that name
            ray.util.remove_placement_group(placed)


class ElasticRolloutPool:
    """The trainer's view of which replicas serve, join, leave or were lost, and when each change applies.

    ``device_resource``: the Ray resource one device of a replica takes (``GPU``; ``CPU`` on CPU). Tests inject the
    rest; by default Ray's free resources per node (the view verl's ``ResourcePoolManager`` checks pools against),
    ``_start_replica``, ``_shut_down`` and ``_dead_replicas``.
    """

    def __init__(
        self,
        settings: ElasticConfig,
        llm_server_manager: Any,
        checkpoint_manager: Any,
        controller: ray.actor.ActorHandle,
        device_resource: str,
        free_resources: Callable[[], dict[str, dict[str, float]]] = ray._private.state.available_resources_per_node,
        start_replica: Callable[[RolloutReplica], Any] = _start_replica,
        shut_down: Callable[[RolloutReplica], None] = _shut_down,
        find_dead: Callable[[list[RolloutReplica]], dict[int, str]] | None = None,
    ) -> None:
        self.settings = settings
        self._servers = llm_server_manager
        self._checkpoints = checkpoint_manager
        self._controller = controller
        self._free_resources = free_resources
        self._start_replica = start_replica
        self._shut_down = shut_down
        self._find_dead = find_dead or functools.partial(_dead_replicas, silent_timeout_s=settings.silent_timeout_s)
        self.live: dict[str, RolloutReplica] = {r.server_address: r for r in llm_server_manager.rollout_replicas}
        # verl hands the checkpoint manager the server manager's own list: keep them apart, since the
        # manager's add/remove_replicas updates its list and the pool rebinds the server manager's.
        self._sync_server_manager()
        self._rank_of: dict[str, int] = {address: r.replica_rank for address, r in self.live.items()}
        self._joined_at: dict[str, int] = {address: 0 for address in self.live}
        self._node_of: dict[str, str] = {address: node_of(r) for address, r in self.live.items()}
        self._starting: list[_Start] = []
        self._joining: list[_Start] = []  # up, waiting for their first weight sync
        self._leaving: list[tuple[RolloutReplica, _Request]] = []
        self.lost: list[str] = []  # "replica <rank> (<address>) lost at step <step>: <why>"
        self._next_rank = max(r.replica_rank for r in self.live.values()) + 1
        first = llm_server_manager.rollout_replicas[0]  # every replica has the same layout
        self._shape = (device_resource, first.gpus_per_replica_node, first.nnodes)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="replica-start")
        self.joined = 0

    # ------------------------------------------------------------------ step boundaries

    def poll(self, step: int) -> None:
        """Every step boundary: take in losses, scale requests, finished starts and room to grow."""
        self._take_lost(step)
        for scale in ray.get(self._controller.take_requests.remote()):
            self._apply_request(scale, step)
        self._collect_starts()
        self._grow_into_free_resources()
        if error := self._shortage(step):
            raise error

    def before_sync(self, step: int) -> None:
        """Before a weight sync (no generation runs, or partial rollout's are interrupted): drop the dead, shut the
        leaving down, enrol the joining."""
        self._take_lost(step)
        dead = self._drop_dead(step, "found dead before the weight sync", also=[s.replica for s in self._joining])
        for start in [start for start in self._joining if start.rank in dead]:
            self._joining.remove(start)
            self._give_up(start, f"replica {start.rank} died before its first sync ({dead[start.rank]})")
        if error := self._shortage(step):
            raise error
        for replica, request in self._leaving:
            self._abort_requests_on(replica)
            self._shut_down(replica)
            self._done(request, f"replica {replica.replica_rank} shut down at step {step}")
        self._leaving = []
        if self._joining:
            self._checkpoints.add_replicas([start.replica for start in self._joining])

    def _abort_requests_on(self, replica: RolloutReplica) -> None:
        """With partial rollout, requests may still run on a leaving replica: abort them (their clients resume them on
        the others), bounded by ``silent_timeout_s``; a server that is gone or does not answer is just killed."""
        aborts = [server.abort_all_requests.remote(reject_request=True) for server in replica.servers]
        done, _ = ray.wait(aborts, num_returns=len(aborts), timeout=self.settings.silent_timeout_s)
        for ref in done:
            with contextlib.suppress(ray.exceptions.RayActorError):
                ray.get(ref)

    def after_sync(self, step: int) -> None:
        """Right after the sync that gave them the weights, joining replicas start taking requests."""
        if not self._joining:
            return
        servers = {start.replica.server_address: start.replica.server_handle for start in self._joining}
        ray.get(self._servers.global_load_balancer.add_servers.remote(servers))
        for start in self._joining:
            address = start.replica.server_address
            self.live[address] = start.replica
            self._rank_of[address] = start.rank
            self._joined_at[address] = step
            self._node_of[address] = node_of(start.replica)
            self.joined += 1
            joined = f"replica {start.rank} joined at step {step} with v{step}"
            print(f"[elastic] {joined} ({address}, node {self._node_of[address]}): it takes requests from now on")
            self._done(start.request, joined)
        self._sync_server_manager()
        self._joining = []

    def explain_failure(self, step: int) -> RolloutPoolLostError | None:
        """After a generation or a sync failed: the named error if too few replicas are left to serve."""
        self._take_lost(step)
        self._drop_dead(step, "found dead after the failure")
        return self._shortage(step, count_joining=False)  # the failed batch needed serving replicas

    # ------------------------------------------------------------------ metrics and status

    def batch_metrics(self, step: int, output: DataProto) -> dict[str, float]:
        """Requests per replica and regenerated requests in one generated batch."""
        metrics: dict[str, float] = {}
        served = output.non_tensor_batch.get(SERVED_BY)
        if served is not None:
            for address, count in Counter(served.tolist()).items():
                metrics[f"async/replica_requests/{self._rank_of.get(address, -1)}"] = float(count)
        regenerated = output.non_tensor_batch.get(REGENERATED)
        if regenerated is not None:
            metrics["async/regenerated_requests"] = float(np.count_nonzero(regenerated.astype(np.int64)))
        return metrics

    def metrics(self) -> dict[str, float]:
        return {
            "async/rollout_replicas": float(len(self.live)),
            "async/rollout_replicas_joining": float(len(self._starting) + len(self._joining)),
            "async/rollout_replicas_lost": float(len(self.lost)),
            "async/rollout_replicas_joined": float(self.joined),
        }

    def publish(self, step: int) -> None:
        live = [
            {"rank": r.replica_rank, "address": a, "node": self._node_of[a], "serving_since_step": self._joined_at[a]}
            for a, r in self.live.items()
        ]
        status = {
            "step": step,
            "live": live,
            "starting": [s.rank for s in self._starting],
            "joining": [s.rank for s in self._joining],
            "leaving": [r.replica_rank for r, _ in self._leaving],
            "lost": list(self.lost),
        }
        self._controller.publish.remote(status)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def how_to_scale(self, experiment: str) -> str:
        """The line the trainer prints once the pool is up: how to add or remove replicas while the job runs."""
        return (
            f"[elastic] {len(self.live)} rollout replica(s). Add or remove replicas while it runs: "
            "python -m recipe.one_step_off_async.scale --add 1 (or --remove 1, --status) --address "
            f"{ray.get_runtime_context().gcs_address} --experiment {experiment}"
        )

    # ------------------------------------------------------------------ internals

    def _take_lost(self, step: int) -> None:
        for address, reason in ray.get(self._controller.take_lost.remote()).items():
            if address in self.live:
                self._lose(address, step, reason)

    def _drop_dead(self, step: int, context: str, also: list[RolloutReplica] = ()) -> dict[int, str]:
        """Probe the live replicas (and ``also``); lose the dead live ones. Returns rank -> cause of the dead."""
        dead = self._find_dead([*self.live.values(), *also])
        for address, replica in list(self.live.items()):
            if replica.replica_rank in dead:
                self._lose(address, step, f"{context} ({dead[replica.replica_rank]})")
        return dead

    def _lose(self, address: str, step: int, reason: str) -> None:
        replica = self._take_out(address)
        self.lost.append(f"replica {replica.replica_rank} ({address}) lost at step {step}: {reason}")
        print(f"[elastic] {self.lost[-1]}; {len(self.live)} replica(s) left")
        self._shut_down(replica)

    def _take_out(self, address: str) -> RolloutReplica:
        """Out of the load balancer (again, if a request saw it die), the weight syncs and the server manager."""
        ray.get(self._servers.global_load_balancer.remove_servers.remote([address]))
        replica = self.live.pop(address)
        self._checkpoints.remove_replicas([replica])
        self._sync_server_manager()
        return replica

    def _shortage(self, step: int, count_joining: bool = True) -> RolloutPoolLostError | None:
        """The error that fails the run if fewer than ``min_replicas`` replicas are left."""
        # Replicas up and waiting for their first sync count: they get the weights at this step's sync.
        if len(self.live) + (len(self._joining) if count_joining else 0) >= self.settings.min_replicas:
            return None
        lost = "; ".join(self.lost) or "none reported"
        return RolloutPoolLostError(
            f"The rollout pool is down to {len(self.live)} live replica(s) at step {step}, fewer than "
            f"async_training.elastic.min_replicas={self.settings.min_replicas}. Lost: {lost}. "
            f"{len(self._starting) + len(self._joining)} replica(s) were still starting. Check the rollout "
            "nodes (preemption, OOM, driver faults) and resume from the last checkpoint."
        )

    def _sync_server_manager(self) -> None:
        replicas = list(self.live.values())
        self._servers.rollout_replicas = replicas
        self._servers.server_handles = [r.server_handle for r in replicas]
        self._servers.server_addresses = [r.server_address for r in replicas]

    def _apply_request(self, scale: Any, step: int) -> None:
        request = _Request(scale.id, asked=scale.add + scale.remove)
        if scale.remove:
            request.notes.append(self._remove(scale.remove, request, step))
        if scale.add:
            request.notes.append(self._add(scale.add, request))
        self._report(request)

    def _remove(self, count: int, request: _Request, step: int) -> str:
        keep = self.settings.min_replicas
        if len(self.live) - count < keep:
            return (
                f"refused: removing {count} of {len(self.live)} live replica(s) would leave fewer than "
                f"async_training.elastic.min_replicas={keep}"
            )
        newest = sorted(self.live.values(), key=lambda replica: replica.replica_rank)[-count:]
        for replica in newest:
            self._leaving.append((self._take_out(replica.server_address), request))
            request.acted += 1
        ranks = [replica.replica_rank for replica in newest]
        return f"replica(s) {ranks} take no new requests after step {step}; shut down at the next sync"

    def _room(self) -> int:
        """Replicas the free resources can place, less the starts whose groups are not placed yet."""
        unplaced = sum(1 for start in self._starting if not start.placed)
        return max(0, replicas_that_fit(self._free_resources(), *self._shape) - unplaced)

    def _add(self, count: int, request: _Request) -> str:
        fits = self._room()
        short = fits < count
        if short:
            resource, devices, nodes = self._shape
            room = (
                f"the Ray cluster has free resources for {fits} more replica(s) of {nodes} node(s) x {devices} "
                f"{resource}, {count} requested"
            )
            if fits == 0:
                return f"refused: {room}; add a node to the cluster, or remove a replica first"
            count = fits
        ranks = [self._begin_start(request) for _ in range(count)]
        started = f"starting replica(s) {ranks}; each serves from the first weight sync after it is up"
        return f"{room}: {started}" if short else started

    def _begin_start(self, request: _Request | None) -> int:
        rank, self._next_rank = self._next_rank, self._next_rank + 1
        if request is not None:
            request.acted += 1
        replica = self._servers.rollout_replica_class(
            replica_rank=rank,
            config=self._servers.rollout_config,
            model_config=self._servers.model_config,
            gpus_per_node=self._servers.rollout_config.n_gpus_per_node,
        )
        start = _Start(replica, request)
        start.future = self._executor.submit(self._run_start, start)
        self._starting.append(start)
        print(f"[elastic] starting replica {rank} (request {request.id if request else 'auto'})")
        return rank

    def _run_start(self, start: _Start) -> None:
        start.began_at = time.monotonic()
        try:
            self._start_replica(start.replica)
        finally:
            if start.abandoned:  # given up on while it ran: whatever it placed and started goes now
                self._shut_down(start.replica)
                _abandon_start(start.rank)

    def _collect_starts(self) -> None:
        still = []
        for start in self._starting:
            if start.future.done() and start.future.exception() is None:
                self._joining.append(start)
                print(f"[elastic] replica {start.rank} is up; it gets the weights at the next sync")
            elif start.future.done():
                self._give_up(start, f"replica {start.rank} failed to start: {start.future.exception()!r}")
            elif start.began_at is not None and time.monotonic() - start.began_at > self.settings.start_timeout_s:
                self._give_up(
                    start,
                    f"replica {start.rank} was not up within async_training.elastic.start_timeout_s="
                    f"{self.settings.start_timeout_s:g} s; abandoned",
                )
            else:
                still.append(start)
        self._starting = still

    def _give_up(self, start: _Start, detail: str) -> None:
        """A new replica that will not serve: whatever it placed and started goes, and its request fails."""
        start.abandoned = True
        self._shut_down(start.replica)
        _abandon_start(start.rank)
        print(f"[elastic] {detail}")
        self._done(start.request, detail, failed=True)

    def _grow_into_free_resources(self) -> None:
        target = self.settings.max_replicas
        pending = len(self._starting) + len(self._joining)
        if target is None or pending or len(self.live) >= target:
            return  # one automatic start at a time: its placement group takes the room it saw
        if self._room() >= 1:
            self._begin_start(None)

    def _done(self, request: _Request | None, note: str, failed: bool = False) -> None:
        """One replica of a request joined, shut down or failed to start."""
        if request is None:
            return
        request.finished += 1
        request.notes.append(note)
        request.failed |= failed
        self._report(request)

    def _report(self, request: _Request) -> None:
        self._controller.resolve.remote(request.id, request.state, "; ".join(request.notes))


def _dead_replicas(replicas: list[RolloutReplica], silent_timeout_s: float) -> dict[int, str]:
    """Replica rank -> why, for replicas with a process that died or stays silent for ``silent_timeout_s``.

    Each process gets one probe (Ray's ``__ray_ready__``), answered once the actor is done with the call it is busy
    with, so a slow answer is never taken for a death. A probe Ray could not deliver (``ActorUnavailableError``: Ray
    has not decided yet whether the actor is gone) is sent again every ``PROBE_RETRY_S``.
    """
    rank_of = {handle: replica.replica_rank for replica in replicas for handle in {*replica.workers, *replica.servers}}
    started = time.monotonic()
    deadline = started + silent_timeout_s
    dead: dict[int, str] = {}
    silent = set(rank_of)  # processes that have not answered yet
    in_flight: dict[ray.ObjectRef, ray.actor.ActorHandle] = {}
    announced = False
    while silent:
        round_end = min(time.monotonic() + PROBE_RETRY_S, deadline)
        in_flight.update({handle.__ray_ready__.remote(): handle for handle in silent - set(in_flight.values())})
        ready, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=max(0.0, round_end - time.monotonic()))
        for probe in ready:
            handle = in_flight.pop(probe)
            try:
                ray.get(probe)
            except ray.exceptions.ActorUnavailableError:
                continue  # still silent: asked again next round
            except ray.exceptions.ActorDiedError as error:
                dead.setdefault(rank_of[handle], describe(error))
            silent.discard(handle)
        silent = {handle for handle in silent if rank_of[handle] not in dead}  # one dead process is enough
        in_flight = {probe: handle for probe, handle in in_flight.items() if handle in silent}
        if not silent or time.monotonic() >= deadline:
            break
        if not announced:  # the trainer waits here: say why
            announced = True
            ranks = sorted({rank_of[handle] for handle in silent})
            print(
                f"[elastic] replica(s) {ranks} have not answered a liveness probe yet; waiting up to "
                f"async_training.elastic.silent_timeout_s={silent_timeout_s:g} s"
            )
        # The wait above ran to the round's end, unless only probes Ray could not deliver were left (they fail at once).
        time.sleep(max(0.0, round_end - time.monotonic()))
    for handle in silent:
        dead.setdefault(
            rank_of[handle],
            f"silent for {time.monotonic() - started:.1f} s: no answer to a liveness probe within "
            f"async_training.elastic.silent_timeout_s={silent_timeout_s:g} s (Ray reports the actor "
            f"{_actor_state(handle)})",
        )
    return dead


def _actor_state(handle: ray.actor.ActorHandle) -> str:
    """Ray's own record of an actor (the GCS actor table): ALIVE for a process that is up but hung."""
    return ray._private.state.actors(handle._actor_id.hex()).get("State", "unknown to the GCS")
