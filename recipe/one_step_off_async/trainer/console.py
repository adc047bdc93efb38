"""The console logger of a run: one line per step with what this recipe's users watch.

verl's ``console`` backend prints every metric of a step on one line, over 1,000 characters here, so the step
time, its split between generation, training and weight sync, and the staleness are lost in it. ``CompactConsole``
takes its place in verl's ``Tracking`` when ``async_training.console=compact`` (the default; ``verl`` brings verl's
line back) and prints at most ``MAX_LINE_CHARS``; every metric still goes to the other loggers (file, wandb, ...):

    step 12/60 | 0.48s: wait 0.10 train 0.35 sync 0.03 | gen 0.41s | staleness 1 | score 0.532 | val 0.610 | len 65
"""

from __future__ import annotations

import logging
import re
import sys

_log = logging.getLogger(__name__)
MAX_LINE_CHARS = 160
# verl's validation metrics: val-core/<data source>/<reward key>/mean@<samples per prompt>
_VALIDATION_MEAN = re.compile(r"^val-core/(?P<source>[^/]+)/(?P<key>[^/]+)/mean@\d+$")


def console_line(step: int, total_steps: int, metrics: dict[str, float]) -> str:
    """The step's line: its fields in order of importance, the least important dropped to fit."""
    fields = [f"step {step}/{total_steps}"]
    if "timing_s/step" in metrics:
        fields.append(
            f"{metrics['timing_s/step']:.2f}s: wait {metrics.get('timing_s/wait_prev_gen', 0.0):.2f} "
            f"train {metrics.get('timing_s/train', 0.0):.2f} sync {metrics.get('timing_s/sync_weights', 0.0):.2f}"
        )
    if "timing_s/gen" in metrics:
        fields.append(f"gen {metrics['timing_s/gen']:.2f}s")
    if metrics.get("async/partial_ratio", 0.0) > 0 and "async/staleness_mean" in metrics:
        # Partial rollout: token-weighted staleness and the share of samples spanning versions.
        fields.append(
            f"staleness {metrics['async/staleness_mean']:.2f} [{metrics.get('async/staleness_min', 0):.0f}-"
            f"{metrics.get('async/staleness_max', 0):.0f}] partial {metrics['async/partial_ratio']:.0%}"
        )
    elif "async/staleness" in metrics:
        fields.append(f"staleness {metrics['async/staleness']:.0f}")
    if "critic/score/mean" in metrics:
        fields.append(f"score {metrics['critic/score/mean']:.3f}")
    validation = {match["source"]: value for key, value in metrics.items() if (match := _VALIDATION_MEAN.match(key))}
    if len(validation) == 1:
        fields.append(f"val {next(iter(validation.values())):.3f}")
    elif validation:
        fields.append("val " + " ".join(f"{source}={value:.3f}" for source, value in sorted(validation.items())))
    if "response_length/mean" in metrics:
        fields.append(f"len {metrics['response_length/mean']:.0f}")

    line = " | ".join(fields)
    while len(line) > MAX_LINE_CHARS and len(fields) > 1:
        fields.pop()
        line = " | ".join(fields)
    return line[:MAX_LINE_CHARS]


class CompactConsole:
    """A backend of verl's ``Tracking`` (``log`` / ``finish``) printing ``console_line`` per call."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps

    def log(self, data: dict, step: int) -> None:
        # One write, newline included: print() writes the line and its newline separately, and the trainer's
        # data-dump thread prints between them ("... len 6Dumped generations to ...").
        sys.stdout.write(console_line(step, self.total_steps, data) + "\n")
        sys.stdout.flush()

    def finish(self) -> None:
        pass


def with_compact_console(tracking, total_steps: int):
    """verl's ``Tracking`` with ``CompactConsole`` as its console backend (when ``trainer.logger`` has one)."""
    if tracking is not None and "console" in tracking.logger:
        tracking.logger["console"] = CompactConsole(total_steps)
    return tracking


def finish_trackers(tracking, succeeded: bool) -> None:
    """wandb & co. flush and mark the run finished (or failed), which verl's ``fit()`` never does (and the process is
    killed before ``Tracking.__del__`` could); a tracker that cannot is logged, never raised over the run's error."""
    exit_code = 0 if succeeded else 1
    try:
        tracking.finish(exit_code=exit_code)
        if "wandb" in tracking.logger:
            import wandb

            # Stop wandb's service process now: its atexit teardown would find it killed along with the
            # actor and print a ConnectionResetError traceback after a clean run.
            wandb.teardown(exit_code=exit_code)
    except Exception:
        _log.exception("Finishing the trackers of trainer.logger failed")
