"""Every named error of the recipe, in one module at the bottom of the layers so any layer may raise one.

Each is named for what went wrong, and its message says which key, file, replica or version is at
fault and how to fix it. A run that fails with one of these exits non-zero with the original
traceback chained (``raise ... from``). ``Problems`` is the one collector of the checks a launch runs
before Ray starts (the config's rules, the disk, this machine): they all report into it, so a launch
lists every problem at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A config the recipe cannot run; each problem names the key and how to fix it (raised before Ray starts).

    A check that finds several problems raises one error carrying them all (``problems``), so a launch
    reports every problem at once (``launch.check_launch``).
    """

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
        for number, problem in enumerate(self.problems, 1):
            lines.append(f"  {number}. " + problem.replace("\n", "\n     "))
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


class RunFailed(RuntimeError):
    """A launch of the entry point (``runs.Run.check``) exited non-zero; the message names the command and its log."""


class Problems:
    """What the launch's checks found: the config's ``problems``, what is missing on this machine (``not_here``:
    another machine may have it) and the checks ``skipped`` because they need a value a problem refused.

    A check adds to it, or raises a ``ConfigError`` that ``run`` collects. ``refused`` holds the keys refused so
    far, for the checks that need them.
    """

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.not_here: list[str] = []
        self.skipped: list[str] = []
        self.refused: set[str] = set()

    def add(self, problem: str, key: str | None = None) -> None:
        """One problem of the config; ``key``: the key it refuses."""
        self.problems.append(problem)
        if key is not None:
            self.refused.add(key)

    def require(self, condition: bool, problem: str, key: str | None = None) -> bool:
        """Add ``problem`` unless ``condition`` holds; return ``condition``."""
        if not condition:
            self.add(problem, key)
        return condition

    def run(self, check: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one check and return what it returns; the problems it raises are collected (then it returns None)."""
        try:
            return check(*args, **kwargs)
        except ConfigError as error:
            (self.not_here if isinstance(error, NotOnThisMachine) else self.problems).extend(error.problems)
            self.skipped.extend(error.skipped)
        except CheckpointError as error:
            self.problems.append(str(error))
        except Exception as error:  # a value no check foresaw: report it with the rest, not as a traceback
            name = getattr(check, "__name__", repr(check))
            self.problems.append(f"{name} could not check this config: {type(error).__name__}: {error}")
        return None

    def raise_any(self) -> None:
        """Raise what was found: a ``ConfigError`` with every problem (then what is missing here), or
        ``NotOnThisMachine`` when all that was found is missing here."""
        if self.problems:
            raise ConfigError(*self.problems, *self.not_here, skipped=tuple(self.skipped))
        if self.not_here:
            raise NotOnThisMachine(*self.not_here, skipped=tuple(self.skipped))

    def error(self, *earlier: str) -> LaunchProblems | None:
        """The launch's error (``earlier`` problems first), or None when nothing is wrong."""
        problems = [*earlier, *self.problems, *self.not_here]
        return LaunchProblems(problems, self.skipped) if problems else None
