"""A dead rollout engine fails the wait on it within seconds, by name, instead of at the wait's timeout.

vLLM's engine runs in a process below verl's server actor; when it dies, the actor lives on and nothing answers, so
a sync or a generation would wait for its timeout. The trainer's waits call ``EngineWatch.check`` every second
(``deadlines.wait_for``), which asks each server whether its engine is alive, without waiting for the answer: in a
fixed pool a dead engine or server raises ``RolloutEngineDiedError`` naming the replica; in an elastic pool the
server of a dead engine is killed, and the pool loses that replica as it loses any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from recipe.one_step_off_async.errors import RolloutEngineDiedError

_log = logging.getLogger(__name__)


def engine_failure(server: Any) -> str | None:
    """Run inside a replica's server actor: why its engine cannot serve, or None (vLLM's ``AsyncLLM`` says
    ``errored`` once its engine process is gone)."""
    engine = getattr(server, "engine", None)
    if engine is not None and getattr(engine, "errored", False):
        return f"its {type(engine).__name__} engine died ({engine.dead_error!r})"
    return None


class EngineWatch:
    """Checks the rollout replicas' engines while the trainer waits on them, never blocking the wait.

    Each ``check`` asks the servers that have no question in flight and reads the answers that have arrived (a server
    busy generating answers later, not never): a dead engine is found within a check or two of its death.
    """

    def __init__(self, replicas: Callable[[], Iterable[Any]], elastic: bool) -> None:
        self._replicas = replicas
        self._elastic = elastic
        self._probes: dict[ray.ObjectRef, tuple[Any, ray.actor.ActorHandle]] = {}

    def check(self) -> None:
        """Raise ``RolloutEngineDiedError`` for a dead engine of a fixed pool; drop it from an elastic pool."""
        self._ask(skip={server for _, server in self._probes.values()})
        self._read(timeout_s=0)

    def name_a_dead_engine(self, timeout_s: float) -> None:
        """After a generation or sync failed: ask every server afresh, wait up to ``timeout_s`` for the answers, and
        raise ``RolloutEngineDiedError`` if an engine died (an answer asked before the failure may predate it)."""
        self._probes = {}
        self._ask(skip=set())
        self._read(timeout_s)

    def _ask(self, skip: set[ray.actor.ActorHandle]) -> None:
        for replica in list(self._replicas()):
            for server in replica.servers:
                if server not in skip:
                    self._probes[server.__ray_call__.remote(engine_failure)] = (replica, server)

    def _read(self, timeout_s: float) -> None:
        if not self._probes:
            return
        answered, _ = ray.wait(list(self._probes), num_returns=len(self._probes), timeout=timeout_s)
        for probe in answered:
            replica, server = self._probes.pop(probe)
            try:
                failure = ray.get(probe)
            except RayActorError as error:
                if self._elastic:
                    continue  # the elastic pool finds its lost actors itself
                failure = f"its server actor died ({type(error).__name__})"
            except RayError:  # the probe itself failed: no answer, and not the run's error to replace
                _log.warning("Asking %s whether its engine lives failed", server, exc_info=True)
                continue
            if failure is not None:
                self._dead(replica, server, failure)

    def _dead(self, replica: Any, server: ray.actor.ActorHandle, failure: str) -> None:
        name = f"rollout replica {replica.replica_rank} ({getattr(replica, '_server_address', None)})"
        if self._elastic:
            _log.error("%s: %s; the elastic pool drops it", name, failure)
            ray.kill(server)
            return
        raise RolloutEngineDiedError(
            f"{name}: {failure}. Its log (the replica's vLLMHttpServer / EngineCore lines above) has the "
            "cause; async_training.elastic.enable=true keeps a run going on the other replicas."
        )
