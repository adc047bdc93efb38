"""What the trainer checks on every batch before training on it: pure functions of the batch and the config.

Each raises a named error (``errors.py``) that says what is wrong with which sample and how to fix it. The
weight versions are checked against the pipeline's contract (``pipeline.expected_weight_version``).
"""

from __future__ import annotations

import numpy as np
import torch
from verl import DataProto

from recipe.one_step_off_async.errors import OffPolicyCorrectionError, RewardError, WeightVersionError
from recipe.one_step_off_async.rollout.partial import RECOMPUTED_PREFILL, VERSION_RUNS


def check_rewards(step: int, batch: DataProto, scored_by: str) -> None:
    """Raise if a sample's reward is NaN or infinite; ``scored_by`` names what scored them."""
    scores = batch.batch["rm_scores"].sum(-1)
    bad = ~torch.isfinite(scores)
    if bad.any():
        sources = sorted(set(batch.non_tensor_batch["data_source"][bad.numpy()].tolist()))
        raise RewardError(
            f"The reward of {int(bad.sum())} of {len(scores)} samples of the batch for step {step} is NaN or "
            f"infinite (data_source {sources}; scored by {scored_by}). Training on it would corrupt "
            "every advantage of the batch; fix the reward."
        )


def check_correction_inputs(step: int, batch: DataProto, correction_configured: bool, rollout_name: str) -> None:
    """Raise if the correction is configured but the rollout returned no per-token log-probs (verl skips it then)."""
    if correction_configured and "rollout_log_probs" not in batch.batch.keys():
        raise OffPolicyCorrectionError(
            f"algorithm.rollout_correction is configured but the {rollout_name!r} rollout returned no "
            f"rollout_log_probs for the batch of step {step}: the off-policy correction would be skipped silently. "
            "Set actor_rollout_ref.rollout.calculate_log_probs=true, or use a rollout backend that returns "
            "per-token log-probs."
        )


def measured_weight_version(step: int, output: DataProto, expected: int, rollout_name: str, contract: str) -> int:
    """The one weight version every sample of ``output`` was generated with; it must be ``expected``, which the
    settings ``contract`` describes gave."""
    first, last = (output.non_tensor_batch.get(key) for key in ("min_global_steps", "max_global_steps"))
    if first is None or last is None or any(v is None for v in (*first, *last)):
        raise WeightVersionError(
            f"The {rollout_name!r} rollout did not report the weight version of its outputs "
            "(TokenOutput.extra_fields['global_steps']); the pipeline cannot verify its weight syncs."
        )
    first, last = first.astype(np.int64), last.astype(np.int64)
    if np.any(first != last):
        sample = int(np.flatnonzero(first != last)[0])
        raise WeightVersionError(
            f"Sample {sample} of the batch for step {step} was generated across weight versions "
            f"v{first[sample]}..v{last[sample]}: a weight sync reached the rollout mid-generation."
        )
    wrong = np.flatnonzero(first != expected)
    if wrong.size:
        raise WeightVersionError(
            f"The batch for step {step} was generated with weight version(s) {sorted(set(first.tolist()))} "
            f"(first wrong sample: {int(wrong[0])}), expected v{expected} ({contract}): a weight sync did not "
            "reach the rollout replicas."
        )
    return int(first[0])


def check_token_versions(step: int, output: DataProto, lowest: int, highest: int, contract: str) -> dict[str, float]:
    """Every response token of ``output`` (the batch for ``step``) was sampled by a version in [lowest, highest]
    (the bounds the settings ``contract`` describes gave).

    The versions come from the partial-rollout client's runs ``[[version, n_tokens], ...]`` per sample, which must
    cover the sample's response exactly (a token without a stamp could come from any version). Returns the batch's
    version metrics (``async/staleness_*`` weighted by tokens, ``partial_ratio``, ``version_span_max``...).
    """
    runs = output.non_tensor_batch.get(VERSION_RUNS)
    if runs is None or any(sample_runs is None for sample_runs in runs):
        raise WeightVersionError(
            f"The batch for step {step} carries no per-token weight versions ({VERSION_RUNS}): in partial-rollout "
            "mode every generation must go through the recipe's PartialRolloutClient."
        )
    lengths = output.batch["response_mask"].sum(-1).tolist()
    token_staleness: list[np.ndarray] = []
    spans: list[int] = []
    for sample, (sample_runs, length) in enumerate(zip(runs, lengths, strict=True)):
        stamped = sum(n_tokens for _, n_tokens in sample_runs)
        if stamped != length:
            raise WeightVersionError(
                f"Sample {sample} of the batch for step {step} has {int(length)} response tokens but weight versions "
                f"for {stamped} ({VERSION_RUNS}={sample_runs}): its tokens cannot be checked against the contract."
            )
        versions = [version for version, _ in sample_runs]
        outside = [version for version in versions if version is None or not lowest <= version <= highest]
        if outside:
            raise WeightVersionError(
                f"Sample {sample} of the batch for step {step} has tokens sampled by weight version v{outside[0]}, "
                f"outside [v{lowest}, v{highest}] ({contract}; runs {sample_runs}): a weight sync did not reach the "
                "rollout replicas, or reached them out of order."
            )
        token_staleness += [np.full(n_tokens, step - 1 - version) for version, n_tokens in sample_runs]
        spans.append(max(versions) - min(versions) if versions else 0)
    staleness = np.concatenate(token_staleness) if token_staleness else np.zeros(1)
    recomputed = output.non_tensor_batch.get(RECOMPUTED_PREFILL)
    return {
        "async/staleness_min": float(staleness.min()),
        "async/staleness_mean": float(staleness.mean()),
        "async/staleness_max": float(staleness.max()),
        "async/partial_ratio": float(np.mean([span > 0 for span in spans])) if spans else 0.0,
        "async/version_span_max": float(max(spans, default=0)),
        "async/recomputed_prefill_tokens": float(sum(recomputed)) if recomputed is not None else 0.0,
    }
