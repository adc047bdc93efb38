"""Every named error of the recipe, in one module at the bottom of the layers so any layer may raise one.

Each is named for what went wrong, and its message says which key, file, replica or version is at
fault and how to fix it. A run that fails with one of these exits non-zero with the original
traceback chained (``raise ... from``).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config the recipe cannot run; the message says which key and how to fix it (raised before Ray starts)."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message names the file and the fix."""


class PipelineTimeoutError(TimeoutError):
    """A bounded wait on the rollout pool (generation or weight sync) expired; the message says what was awaited."""


class WeightSyncError(RuntimeError):
    """A weight sync failed, or did not complete within the engine's ``timeout_s``."""


class WeightVersionError(RuntimeError):
    """The rollout generated a batch with another weight version than the pipeline's contract gives it."""


class RewardError(ValueError):
    """The reward function returned something that must not be trained on (NaN, infinite)."""


class OffPolicyCorrectionError(RuntimeError):
    """The off-policy correction is configured but its inputs are missing: it would be skipped silently."""


class RolloutPoolLostError(RuntimeError):
    """Every rollout replica (or more than ``async_training.elastic.min_replicas`` allows) is lost."""
