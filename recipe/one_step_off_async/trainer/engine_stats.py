"""Slot occupancy and busy-time throughput of the rollout engines, per training step.

A rollout server that defines ``engine_stats()`` (the ``hf`` server: cumulative ``EngineStats`` counters
and its ``max_num_seqs``) is read once per step; the differences give, over the step:

- ``rollout/slot_occupancy``: mean sequences sampling per engine step / ``max_num_seqs``: how full the
  engines ran, whatever the hardware (1.0: every slot busy every step);
- ``rollout/busy_tokens_per_s``: tokens sampled per second of engine busy time (idle time excluded);
- ``rollout/busy_s``: engine busy seconds, summed over servers; ``rollout/tokens``, ``rollout/slot_steps``
  and ``rollout/prefill_tokens``: the sums behind them, so a reader can aggregate over many steps.

Servers without the method (vLLM, SGLang) are skipped: no metric rather than a made-up one; so is a
server whose process died or that does not answer within ``READ_TIMEOUT_S`` (the read never holds up
the trainer for longer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import ray

COUNTERS = ("steps", "rows", "tokens", "prefill_tokens", "busy_s")
# The servers answer between two engine steps (milliseconds); a server silent this long is left out of the
# step's metrics rather than let the trainer wait on it (the elastic pool's probe deals with hung replicas).
READ_TIMEOUT_S = 10.0


class EngineStatsReader:
    """Differences of the servers' counters since the last ``metrics()`` call."""

    def __init__(self, servers: Callable[[], Iterable[ray.actor.ActorHandle]]) -> None:
        self._servers = servers
        self._last: dict[ray.actor.ActorHandle, dict[str, float]] = {}

    def metrics(self) -> dict[str, float]:
        readers = [(h, method) for h in self._servers() if (method := getattr(h, "engine_stats", None)) is not None]
        if not readers:
            return {}
        refs = [method.remote() for _, method in readers]
        answered, _ = ray.wait(refs, num_returns=len(refs), timeout=READ_TIMEOUT_S)
        total = dict.fromkeys(COUNTERS, 0.0)
        slot_steps = 0.0
        last, self._last = self._last, {}  # handles of replicas gone from the pool are forgotten
        for (handle, _), ref in zip(readers, refs, strict=True):
            before = last.get(handle, dict.fromkeys(COUNTERS, 0.0))
            if ref not in answered:  # busy past the bound: its work counts in the next step it answers
                self._last[handle] = before
                continue
            try:
                now = ray.get(ref)
            except ray.exceptions.RayActorError:  # a replica lost this step: the elastic pool deals with it
                continue
            delta = {key: now[key] - before[key] for key in COUNTERS}
            for key in COUNTERS:
                total[key] += delta[key]
            slot_steps += delta["steps"] * now["max_num_seqs"]
            self._last[handle] = now
        return {
            "rollout/slot_occupancy": total["rows"] / slot_steps if slot_steps else 0.0,
            "rollout/busy_tokens_per_s": total["tokens"] / total["busy_s"] if total["busy_s"] else 0.0,
            "rollout/busy_s": total["busy_s"],
            "rollout/tokens": total["tokens"],
            "rollout/slot_steps": slot_steps,  # engine steps x max_num_seqs: occupancy's denominator
            "rollout/prefill_tokens": total["prefill_tokens"],
        }
