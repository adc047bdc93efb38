"""The agent loops' client in partial-rollout mode: a request interrupted by a weight sync continues under the new weights.

verl's ``CheckpointEngineManager.update_weights`` aborts every running request before it loads new weights; an
aborted request returns the tokens it sampled so far. ``PartialRolloutClient`` sends it straight back as prompt +
tokens so far, with ``max_tokens`` lowered by what it already has, and records which version sampled which tokens
as runs ``[[version, n_tokens], ...]`` (``VERSION_RUNS``, which the trainer checks) besides verl's
``min_global_steps`` / ``max_global_steps``; ``RECOMPUTED_PREFILL`` counts the prefix tokens prefilled again.
The mode and its contract: docs/advance/one_step_off_async/pipeline.md, "Partial rollout".

Why not verl's ``FullyAsyncLLMServerClient``: it sleeps 1 s before each resubmission, records only min/max
versions, and reads ``config.async_training.partial_rollout`` itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.utils.tokenizer import normalize_token_ids
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

VERSION_RUNS = "weight_version_runs"
RECOMPUTED_PREFILL = "recomputed_prefill_tokens"
ABORTED = ("aborted", "abort")
# An abort with no token (the request queued, or met a replica turning requests away) is resent, from the second in
# a row on after a backoff of 10 ms doubling to 1 s; this many in a row fail it (a replica that never resumes).
MAX_ABORTS_WITHOUT_PROGRESS = 30


def add_run(runs: list[list[int]], version: int, n_tokens: int) -> None:
    """Append ``n_tokens`` sampled by ``version`` to ``runs``, merging with the last run of the same version."""
    if n_tokens <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1][1] += n_tokens
    else:
        runs.append([version, n_tokens])


class PartialRolloutClient(LLMServerClient):
    """verl's client, plus: a request aborted by a weight sync is resumed from its tokens so far. The output's
    ``extra_fields`` are the last segment's, except ``SUMMED_FIELDS``, added up over the segments (composed with the
    elastic client: ``trainer/clients.py``)."""

    SUMMED_FIELDS: tuple[str, ...] = ()

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        prompt_ids = normalize_token_ids(prompt_ids)
        sampling_params = dict(sampling_params)  # the budget is rewritten per segment; the caller reuses its dict
        limit_key = "max_new_tokens" if "max_new_tokens" in sampling_params else "max_tokens"
        budget = sampling_params.get(limit_key) or self.config.actor_rollout_ref.rollout.response_length
        sampling_params[limit_key] = budget  # pinned: a server default would count the resumed tokens as prompt

        token_ids: list[int] = []
        log_probs: list[float] | None = []
        runs: list[list[int]] = []
        recomputed = num_preempted = without_progress = 0
        num_cached_tokens = None
        summed = dict.fromkeys(self.SUMMED_FIELDS, 0)
        while True:
            output = await super().generate(
                request_id, prompt_ids=prompt_ids + token_ids, sampling_params=sampling_params, **kwargs
            )
            if output.routed_experts is not None:
                raise NotImplementedError(
                    "partial rollout does not carry MoE routing replay (routed_experts) across segments; "
                    "set async_training.partial_rollout=false with router replay"
                )
            if output.token_ids:  # an abort with no token may carry log_probs=None (verl's vLLM server)
                log_probs = None if log_probs is None or output.log_probs is None else log_probs + output.log_probs
            token_ids += output.token_ids
            add_run(runs, output.extra_fields.get("global_steps"), len(output.token_ids))
            num_preempted += output.num_preempted or 0
            if num_cached_tokens is None:  # the first prefill's prefix-cache hits, as for one request
                num_cached_tokens = output.extra_fields.get("num_cached_tokens")
            for key in summed:
                summed[key] += output.extra_fields.get(key, 0)
            if output.stop_reason not in ABORTED or len(token_ids) >= budget:
                break
            without_progress = 0 if output.token_ids else without_progress + 1
            if without_progress >= MAX_ABORTS_WITHOUT_PROGRESS:
                raise RuntimeError(
                    f"Request {request_id} was aborted {without_progress} times in a row without a new token "
                    f"({len(token_ids)} of {budget} generated): the rollout replicas abort requests and never "
                    "resume generation; check their logs (a failed weight sync leaves them paused)."
                )
            if without_progress >= 2:
                await asyncio.sleep(min(1.0, 0.01 * 2 ** (without_progress - 2)))
            sampling_params[limit_key] = budget - len(token_ids)
            recomputed += len(prompt_ids) + len(token_ids)  # what the next segment prefills again

        versions = [version for version, _ in runs] or [output.extra_fields.get("global_steps")]
        known = None not in versions  # None: start-up weights, never synced (the trainer's check names it)
        extra_fields = {
            **output.extra_fields,
            "min_global_steps": min(versions) if known else None,
            "max_global_steps": max(versions) if known else None,
            VERSION_RUNS: runs,
            RECOMPUTED_PREFILL: recomputed,
            "num_cached_tokens": num_cached_tokens,
            **summed,
        }
        # Aborted exactly when the budget ran out: it stopped by length (servers report "completed" for that).
        stop_reason = "completed" if output.stop_reason in ABORTED else output.stop_reason
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason=stop_reason,
            num_preempted=num_preempted,
            extra_fields=extra_fields,
        )
