"""What the trainer checks on every batch before training on it: pure functions of the batch and the config.

Each raises a named error (``errors.py``) that says what is wrong with which sample and how to fix it:

- ``check_rewards``: a NaN or infinite reward would corrupt every advantage of the batch;
- ``check_correction_inputs``: verl skips the off-policy correction without a word when the rollout
  returned no per-token log-probs;
- ``measured_weight_version``: every sample of the batch was generated with the one weight version
  the pipeline's contract gives it (``pipeline.expected_weight_version``); returns that version.
"""

from __future__ import annotations

import numpy as np
import torch
from verl import DataProto

from recipe.one_step_off_async.errors import OffPolicyCorrectionError, RewardError, WeightVersionError


def check_rewards(step: int, batch: DataProto, reward_function: str) -> None:
    scores = batch.batch["rm_scores"].sum(-1)
    bad = ~torch.isfinite(scores)
    if bad.any():
        sources = sorted(set(batch.non_tensor_batch["data_source"][bad.numpy()].tolist()))
        raise RewardError(
            f"The reward of {int(bad.sum())} of {len(scores)} samples of the batch for step {step} is NaN or "
            f"infinite (data_source {sources}; reward function {reward_function}). Training on it would corrupt "
            "every advantage of the batch; fix the reward function."
        )


def check_correction_inputs(step: int, batch: DataProto, correction_configured: bool, rollout_name: str) -> None:
    if correction_configured and "rollout_log_probs" not in batch.batch.keys():
        raise OffPolicyCorrectionError(
            f"algorithm.rollout_correction is configured but the {rollout_name!r} rollout returned no "
            f"rollout_log_probs for the batch of step {step}: the off-policy correction would be skipped silently. "
            "Set actor_rollout_ref.rollout.calculate_log_probs=true, or use a rollout backend that returns "
            "per-token log-probs."
        )


def measured_weight_version(step: int, output: DataProto, expected: int, rollout_name: str, contract: str) -> int:
    """The one weight version every sample of ``output`` was generated with; it must be ``expected``.

    ``contract`` describes the settings that gave ``expected`` (for the error message).
    """
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
