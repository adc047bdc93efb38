"""Slot occupancy of the rollout engines, per training step.

Each vLLM server keeps Prometheus counters of its engine's scheduler when ``rollout.disable_log_stats=false``, read
once per step in the server's actor (``vllm_engine_counters``): engine steps, tokens (one per running request per
step) and prefill (a resumed request's prefix again). Their differences over the step give
``rollout/slot_occupancy``, mean sequences sampling per engine step / ``max_num_seqs`` (how full the engines ran,
whatever the hardware), and the sums behind it (``rollout/tokens``, ``slot_steps``, ``prefill_tokens``). A server
that reports none (SGLang, vLLM with its stats off), died or is silent past ``READ_TIMEOUT_S`` is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import ray

from recipe.one_step_off_async.trainer.hooks import StepHooks

# vLLM's Prometheus samples behind each counter (summed over their labels), and those subtracted from it.
VLLM_SAMPLES = {
    "steps": (("vllm:iteration_tokens_total_count",), ()),
    "tokens": (("vllm:generation_tokens_total",), ()),
    "prefill_tokens": (("vllm:prompt_tokens_total",), ("vllm:prompt_tokens_cached_total",)),
}


def vllm_engine_counters(server: Any, registry: Any = None) -> dict[str, float] | None:
    """Run inside a vLLM server actor: its engine's cumulative counters (``VLLM_SAMPLES``, from ``registry``, by
    default the process's own) and ``max_num_seqs``, or None when vLLM keeps no statistics there."""
    from prometheus_client import REGISTRY

    samples: dict[str, float] = {}
    for metric in (registry or REGISTRY).collect():
        for sample in metric.samples:
            if sample.name.startswith("vllm:"):
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    if "vllm:iteration_tokens_total_count" not in samples:
        return None
    counters = {
        key: sum(samples.get(name, 0.0) for name in added) - sum(samples.get(name, 0.0) for name in subtracted)
        for key, (added, subtracted) in VLLM_SAMPLES.items()
    }
    return counters | {"max_num_seqs": server.config.max_num_seqs}


# The servers answer between two engine steps (milliseconds); a server silent this long is left out of the
# step's metrics rather than let the trainer wait on it (the elastic pool's probe deals with hung replicas).
READ_TIMEOUT_S = 10.0


class EngineStatsReader(StepHooks):
    """A trainer feature: differences of the servers' counters since the last ``metrics()`` call."""

    def __init__(self, servers: Callable[[], Iterable[ray.actor.ActorHandle]]) -> None:
        self._servers = servers
        self._last: dict[ray.actor.ActorHandle, dict[str, float]] = {}

    def metrics(self) -> dict[str, float]:
        handles = [handle for handle in self._servers() if hasattr(handle, "__ray_call__")]  # Ray actors
        if not handles:
            return {}
        refs = [handle.__ray_call__.remote(vllm_engine_counters) for handle in handles]
        answered, _ = ray.wait(refs, num_returns=len(refs), timeout=READ_TIMEOUT_S)
        total = dict.fromkeys(VLLM_SAMPLES, 0.0)
        slot_steps, reported = 0.0, False
        last, self._last = self._last, {}  # handles of replicas gone from the pool are forgotten
        for handle, ref in zip(handles, refs, strict=True):
            before = last.get(handle)
            if ref not in answered:  # busy past the bound: its work counts in the next step it answers
                if before is not None:
                    self._last[handle] = before
                continue
            try:
                now = ray.get(ref)
            except ray.exceptions.RayError:  # a replica lost this step (the elastic pool deals with it), no stats
                continue
            if now is None:
                continue
            before = before or dict.fromkeys(now, 0.0)
            reported = True
            for key in VLLM_SAMPLES:
                total[key] += now[key] - before[key]
            slot_steps += (now["steps"] - before["steps"]) * now["max_num_seqs"]
            self._last[handle] = now
        if not reported:
            return {}
        return {
            "rollout/slot_occupancy": total["tokens"] / slot_steps if slot_steps else 0.0,
            "rollout/tokens": total["tokens"],
            "rollout/slot_steps": slot_steps,  # engine steps x max_num_seqs: occupancy's denominator
            "rollout/prefill_tokens": total["prefill_tokens"],
        }
