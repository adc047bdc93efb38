"""The agent loops' client in partial-rollout mode: a request interrupted by a weight sync continues under the new weights.

verl's ``CheckpointEngineManager.update_weights`` aborts every running request before it loads new
weights and resumes generation after. An aborted request returns the tokens it sampled so far
(``stop_reason="aborted"``; the ``hf`` engine and verl's vLLM server both do). ``PartialRolloutClient``
(handed to verl's ``AgentLoopManager`` by the trainer when ``async_training.partial_rollout=true``)
sends it straight back as prompt + tokens so far, with ``max_tokens`` lowered by what it already has,
so the response budget holds; the replica's KV cache is recomputed from that prefix under the new
weights. No fixed sleep: a resubmission that arrives while the sync runs waits at the replica's
closed admission gate and starts the moment generation resumes.

Each segment's tokens keep the log-probs of the weights that sampled them, and the output records
which version sampled which tokens as runs ``[[version, n_tokens], ...]`` (``VERSION_RUNS``), besides
verl's ``min_global_steps`` / ``max_global_steps``; ``RECOMPUTED_PREFILL`` counts the prefix tokens the
resubmissions made the engine prefill again. verl's agent loop carries every ``extra_fields`` key into
the batch, where the trainer checks the runs against the pipeline's contract.

verl ships ``FullyAsyncLLMServerClient`` for the same job; this client differs where the recipe needs
it: no 1 s sleep before each resubmission, per-segment version runs instead of min/max only, and no
dependence on verl's reading of ``config.async_training.partial_rollout`` (the recipe validates that
key itself and chooses the client from it).
"""

from __future__ import annotations

from typing import Any

from verl.utils.tokenizer import normalize_token_ids
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

VERSION_RUNS = "weight_version_runs"
RECOMPUTED_PREFILL = "recomputed_prefill_tokens"
ABORTED = ("aborted", "abort")


def add_run(runs: list[list[int]], version: int, n_tokens: int) -> None:
    """Append ``n_tokens`` sampled by ``version`` to ``runs``, merging with the last run of the same version."""
    if n_tokens <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1][1] += n_tokens
    else:
        runs.append([version, n_tokens])


class PartialRolloutClient(LLMServerClient):
    """verl's client, plus: a request aborted by a weight sync is resumed from its tokens so far.

    Composes with the elastic client by inheritance (``PartialRolloutClient`` first): each segment then
    goes through the elastic retry, so a replica lost mid-sample costs that segment only. The output's
    ``extra_fields`` are the last segment's, except ``SUMMED_FIELDS``, added up over the segments.
    """

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
        recomputed = 0
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
            token_ids += output.token_ids
            log_probs = None if log_probs is None or output.log_probs is None else log_probs + output.log_probs
            add_run(runs, output.extra_fields.get("global_steps"), len(output.token_ids))
            for key in summed:
                summed[key] += output.extra_fields.get(key, 0)
            if output.stop_reason not in ABORTED or len(token_ids) >= budget:
                break
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
            **summed,
        }
        # Aborted with the budget spent: the request ended by length, as an uninterrupted one would have.
        stop_reason = "length" if output.stop_reason in ABORTED else output.stop_reason
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason=stop_reason,
            num_preempted=output.num_preempted,
            extra_fields=extra_fields,
        )
