"""The agent loops' client to the rollout replicas in elastic mode: a lost replica costs a retry, not the run.

``ElasticLLMServerClient`` catches the error of a request whose replica's process died (or whose engine died under
a live server, or whose node Ray cannot reach and then declares dead), takes that replica out of the load balancer,
reports it to the job's ``RolloutPoolController`` and sends the request again to a survivor. Each output is stamped
with the replica that produced it and the attempts lost with a replica, which the trainer counts per batch. Why a
regenerated request keeps its weight version: the "Elastic rollout pool" section of
docs/advance/one_step_off_async/deployment.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

import ray
from omegaconf import DictConfig
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from recipe.one_step_off_async.errors import RolloutPoolLostError

SERVED_BY = "rollout_replica"
REGENERATED = "rollout_regenerated"
# A request whose replica died this many times is the likely killer (a prompt that OOMs the engine): fail naming it.
MAX_REPLICAS_LOST_PER_REQUEST = 3
UNAVAILABLE_RETRY_S = 1.0  # between attempts at a replica Ray cannot reach
UNREACHABLE_LOST_S = 60.0  # then it is lost, though Ray has not declared it dead yet (a node cut off, not gone)

# The replica the current request (an asyncio task) was routed to, and its server; set by _acquire_server.
_routed_to: contextvars.ContextVar[str | None] = contextvars.ContextVar("routed_to", default=None)
_routed_handle: contextvars.ContextVar[ray.actor.ActorHandle | None] = contextvars.ContextVar(
    "routed_handle", default=None
)


def engine_died(error: ray.exceptions.RayTaskError) -> bool:
    """vLLM's ``EngineDeadError``: its engine process died under a server actor that lives on (and fails every call)."""
    return type(error.cause).__name__ == "EngineDeadError"


def describe(error: Exception) -> str:
    """An error's type and the first line of its message (Ray's errors carry whole tracebacks)."""
    return f"{type(error).__name__}: {next(iter(str(error).splitlines()), '')}"


class ElasticLLMServerClient(LLMServerClient):
    """verl's client, plus: a request whose replica died is sent again to a surviving replica, and the job's
    ``RolloutPoolController`` (``controller``) is told of the replica lost."""

    def __init__(
        self,
        config: DictConfig,
        load_balancer_handle: ray.actor.ActorHandle = None,
        *,
        controller: ray.actor.ActorHandle,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, load_balancer_handle, **kwargs)
        self._controller = controller

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, ray.actor.ActorHandle]:
        server_id, handle = await super()._acquire_server(request_id, **extra)
        _routed_to.set(server_id)
        _routed_handle.set(handle)
        return server_id, handle

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        lost: list[str] = []
        unreachable_since: float | None = None
        while True:
            _routed_to.set(None)
            try:
                output = await super().generate(request_id, **kwargs)
                break
            except ray.exceptions.ActorUnavailableError as error:
                unreachable_since = unreachable_since or time.monotonic()  # its node is going, or a blip: ask again
                if time.monotonic() - unreachable_since < UNREACHABLE_LOST_S:
                    await asyncio.sleep(UNAVAILABLE_RETRY_S)
                    continue
                failure = error
            except (ray.exceptions.ActorDiedError, ray.exceptions.RayTaskError) as error:
                failure = error
            unreachable_since, server_id = None, _routed_to.get()
            if server_id is None:  # the load balancer itself is gone: nothing to fail over to
                raise failure
            if isinstance(failure, ray.exceptions.RayTaskError) and not engine_died(failure):
                raise failure  # a live replica's own error (bad input...): not retried
            if not isinstance(failure, ray.exceptions.ActorDiedError):
                ray.kill(_routed_handle.get())  # what is left of the replica serves nothing more
            lost.append(server_id)
            # Idempotent on both actors: every request that was on the replica reports it.
            await self._load_balancer.remove_servers.remote([server_id])
            await self._controller.report_lost.remote(server_id, describe(failure))
            if len(lost) >= MAX_REPLICAS_LOST_PER_REQUEST:
                raise RolloutPoolLostError(
                    f"Request {request_id}: {len(lost)} rollout replicas died while generating it "
                    f"({', '.join(lost)}); the request itself may be what kills them (e.g. an engine OOM on "
                    f"this prompt), so it is not sent to another. Last error: {failure}"
                ) from failure
            if not await self._load_balancer.get_all_servers.remote():
                raise RolloutPoolLostError(
                    f"Request {request_id}: no rollout replica is left to generate it; lost while it was "
                    f"waiting on them: {', '.join(lost)}. Last error: {type(failure).__name__}: {failure}"
                ) from failure
        output.extra_fields[SERVED_BY] = _routed_to.get()
        output.extra_fields[REGENERATED] = len(lost)
        return output
