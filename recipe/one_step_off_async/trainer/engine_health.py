"""A dead rollout engine fails the wait on it within seconds, by name, instead of at the wait's timeout.

vLLM runs its engine in a process of its own below verl's server actor. When that process dies (a worker error in
a weight update, the OOM killer), the actor lives on and nothing answers: a weight sync waits for the rollout side
until ``async_training.sync_timeout_s`` (verl's sender waits on an acknowledgement the dead worker never sends),
and a generation until ``generation_timeout_s``. The trainer's waits call ``EngineWatch.check`` every second
(``deadlines.wait_for``), which asks each replica's server whether its engine is alive:

- a fixed pool: a dead engine, or a dead server actor, raises ``RolloutEngineDiedError`` naming the replica;
- an elastic pool: the server actor of a dead engine is killed, so the pool loses that replica the way it loses
  any other (its requests are generated again on the others); a dead actor is the pool's to handle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from recipe.one_step_off_async.errors import RolloutEngineDiedError

_log = logging.getLogger(__name__)

# A busy server answers late, not never: a probe that times out counts as alive (the wait's own timeout remains).
PROBE_TIMEOUT_S = 5.0


def engine_failure(server: Any) -> str | None:
    """Run inside a replica's server actor: why its engine cannot serve, or None.

    vLLM's ``AsyncLLM`` says ``errored`` once its engine process is gone; the ``hf`` engine lives in the actor.
    """
    engine = getattr(server, "engine", None)
    if engine is not None and getattr(engine, "errored", False):
        return f"its {type(engine).__name__} engine died ({engine.dead_error!r})"
    return None


class EngineWatch:
    """Checks the rollout replicas' engines while the trainer waits on them."""

    def __init__(self, replicas: Callable[[], Iterable[Any]], elastic: bool) -> None:
        self._replicas = replicas
        self._elastic = elastic

    def check(self) -> None:
        """Raise ``RolloutEngineDiedError`` for a dead engine of a fixed pool; drop it from an elastic pool."""
        probes = [
            (replica, server, server.__ray_call__.remote(engine_failure))
            for replica in list(self._replicas())
            for server in replica.servers
        ]
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        for replica, server, probe in probes:
            try:
                failure = ray.get(probe, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                continue
            except RayActorError as error:
                if self._elastic:
                    continue  # the elastic pool finds its lost actors itself
                failure = f"its server actor died ({type(error).__name__})"
            if failure is None:
                continue
            name = f"rollout replica {replica.replica_rank} ({getattr(replica, '_server_address', None)})"
            if self._elastic:
                _log.error("%s: %s; the elastic pool drops it", name, failure)
                ray.kill(server)
                continue
            raise RolloutEngineDiedError(
                f"{name}: {failure}. Its log (the replica's vLLMHttpServer / EngineCore lines above) has the "
                "cause; async_training.elastic.enable=true keeps a run going on the other replicas."
            )
