"""Every named error of the recipe, in one module at the bottom of the layers so any layer may raise one.

Each is named for what went wrong, and its message says which key, file, replica or version is at
fault and how to fix it. A run that fails with one of these exits non-zero with the original
traceback chained (``raise ... from``).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config the recipe cannot run (raised before Ray starts); it carries every problem a check found
    (``problems``), each naming the key and how to fix it, so a launch reports them all at once."""

    def __init__(self, *problems: str, skipped: tuple[str, ...] = ()) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        # Checks not run because they need a value one of the problems refused.
        self.skipped = tuple(skipped)


class NotOnThisMachine(ConfigError):
    """Files or packages the launch needs are missing here; the machine that runs it may have them."""


class LaunchProblems(ConfigError):
    """Every problem a launch's checks found before Ray starts, printed as one list (``launch.check_launch``)."""

    def __init__(self, problems: list[str], skipped: list[str] = ()) -> None:
        super().__init__(*problems, skipped=tuple(skipped))

    def report(self) -> str:
        """The list a user reads: each problem with its fix, then the checks that could not run."""
        count = len(self.problems)
        lines = [f"The launch has {count} problem{'s' if count != 1 else ''}; nothing was started:"]
        lines += [f"  {number}. " + problem.replace("\n", "\n     ") for number, problem in enumerate(self.problems, 1)]
        if self.skipped:
            lines.append("Not checked yet (they run once the problems above are fixed):")
            lines.extend(f"  - {check}" for check in self.skipped)
        lines.append("Set HYDRA_FULL_ERROR=1 to see the traceback.")
        return "\n".join(lines)


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


class RolloutEngineDiedError(RuntimeError):
    """A rollout replica's engine died (vLLM's engine process, or the replica's server actor) while the run waited."""


class WorkerLostError(RuntimeError):
    """A worker the run cannot go on without (the actor's, the critic's...) died or its node was lost."""


class RunFailed(RuntimeError):
    """A launch of the entry point (``runs.Run.check``) exited non-zero; the message names the command and its log."""
