"""The running job's rollout-pool mailbox: a named Ray actor between the trainer and the outside.

In elastic mode the trainer starts one ``RolloutPoolController`` per job, named after ``trainer.experiment_name``.
The scale command (``python -m recipe.one_step_off_async.scale``) queues requests and reads their outcome and the
pool's status; the agent loops' ``ElasticLLMServerClient`` reports replicas whose process died; the trainer takes
both at every step boundary (the only place where it changes the pool) and writes back outcomes and status.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

NAMESPACE = "one_step_off_async"
NAME_PREFIX = "rollout_pool:"


def controller_name(experiment_name: str) -> str:
    return f"{NAME_PREFIX}{experiment_name}"


@dataclass(frozen=True)
class ScaleRequest:
    """Add ``add`` replicas and/or remove ``remove`` replicas (the most recently added serving ones)."""

    id: int
    add: int
    remove: int


class RolloutPoolController:
    """Mailbox of one job's rollout pool: scale requests in, outcomes, lost replicas and status out."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._queued: list[ScaleRequest] = []
        self._outcomes: dict[int, dict[str, Any]] = {}
        self._lost: dict[str, str] = {}  # server address -> reason, not yet taken by the trainer
        self._status: dict[str, Any] = {}

    # --- the scale command
    def request(self, add: int = 0, remove: int = 0) -> int:
        if add < 0 or remove < 0 or add + remove == 0:
            raise ValueError(f"a scale request adds or removes at least one replica (got add={add}, remove={remove})")
        request = ScaleRequest(next(self._ids), add, remove)
        self._queued.append(request)
        self._outcomes[request.id] = {"state": "queued", "detail": "waiting for the next training step boundary"}
        return request.id

    def outcome(self, request_id: int) -> dict[str, Any]:
        if request_id not in self._outcomes:
            raise KeyError(f"no scale request {request_id}")
        return self._outcomes[request_id]

    def status(self) -> dict[str, Any]:
        return {**self._status, "requests": self._outcomes}

    # --- the agent loops
    def report_lost(self, server_id: str, reason: str) -> None:
        # Every request that was on the replica reports it: keep the first reason (the trainer ignores
        # addresses it no longer serves from).
        self._lost.setdefault(server_id, reason)

    # --- the trainer
    def take_requests(self) -> list[ScaleRequest]:
        taken, self._queued = self._queued, []
        return taken

    def take_lost(self) -> dict[str, str]:
        taken, self._lost = self._lost, {}
        return taken

    def resolve(self, request_id: int, state: str, detail: str) -> None:
        self._outcomes[request_id] = {"state": state, "detail": detail, "at": time.time()}

    def publish(self, status: dict[str, Any]) -> None:
        self._status = status


def start_controller(experiment_name: str) -> ray.actor.ActorHandle:
    """The job's controller, registered under its name; fails if another job on the cluster holds it."""
    name = controller_name(experiment_name)
    try:
        # One call at a time (every method is a few dict operations), on the trainer's node: it lives
        # and dies with the trainer, never with a rollout node.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        return (
            ray.remote(RolloutPoolController)
            .options(name=name, namespace=NAMESPACE, num_cpus=0, scheduling_strategy=here)
            .remote()
        )
    except ValueError as error:
        raise ValueError(
            f"Another job on this Ray cluster already runs an elastic rollout pool named {name!r} (namespace "
            f"{NAMESPACE}); scale commands could not tell the two apart. Give this run its own "
            f"trainer.experiment_name. ({error})"
        ) from error


def find_controller(experiment_name: str | None) -> tuple[str, ray.actor.ActorHandle]:
    """The controller of the job ``experiment_name``, or of the only elastic job on the connected cluster."""
    running = sorted(
        actor["name"][len(NAME_PREFIX) :]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == NAMESPACE and actor["name"].startswith(NAME_PREFIX)
    )
    if experiment_name is None:
        if len(running) != 1:
            raise LookupError(
                f"{len(running)} elastic one-step-off jobs run on this Ray cluster ({', '.join(running) or 'none'}); "
                "name one with --experiment (its trainer.experiment_name), or start the job with "
                "async_training.elastic.enable=true."
            )
        (experiment_name,) = running
    elif experiment_name not in running:
        raise LookupError(
            f"No elastic one-step-off job named {experiment_name!r} runs on this Ray cluster (running: "
            f"{', '.join(running) or 'none'}); is async_training.elastic.enable=true?"
        )
    return experiment_name, ray.get_actor(controller_name(experiment_name), namespace=NAMESPACE)
