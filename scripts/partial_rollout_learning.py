"""Does partial rollout learn as well as today's mode? Validation gain at staleness 1, both modes, per task.

What: for each task (the built-in sort task, ``one_step_off_ppo_cpu``; the long-tail task,
``one_step_off_ppo_cpu_long_tail``) and each seed (``data.seed`` = ``rollout.seed``), runs the real entry
point at staleness 1 with ``async_training.partial_rollout`` false and true side by side (the two runs
share the machine), validating at step 0 and every 10 steps. A run's gain is the mean of its last two
validations minus its step-0 validation (the method of ``tests/test_e2e_convergence_on_cpu.py``). Per
task it prints every seed's gains, the mean gain per mode, their difference, the pooled standard error
sqrt(sd_a^2 / n + sd_b^2 / n), and whether the difference is within 2 of them.

How (from the repository root, with the project's virtualenv active; about 3 min per seed and task):
    python scripts/partial_rollout_learning.py                       # 3 seeds, 30 steps, both tasks
    python scripts/partial_rollout_learning.py --seeds 0 1 2 3 --steps 40 --tasks long_tail
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from entry_runs import run_entry_point

TASKS = {"sort": "one_step_off_ppo_cpu", "long_tail": "one_step_off_ppo_cpu_long_tail"}
MODES = {"today": "async_training.partial_rollout=false", "partial": "async_training.partial_rollout=true"}
TEST_FREQ = 10


def run(directory: Path, profile: str, seed: int, steps: int, mode: str) -> dict[int, float]:
    """The run's validation score by step (the task's ``val-core/.../mean@1`` metric)."""
    overrides = [
        "async_training.staleness=1",
        mode,
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={TEST_FREQ}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
    ]
    by_step = run_entry_point(directory, profile, overrides, label=f"{profile} seed {seed} {mode}")
    scores: dict[int, float] = {}
    for step, metrics in by_step.items():
        keys = [key for key in metrics if key.startswith("val-core/") and key.endswith("/mean@1")]
        if keys:
            scores[step] = metrics[keys[0]]
    return scores


def gain(scores: dict[int, float], steps: int) -> float:
    final = [scores[step] for step in (steps - TEST_FREQ, steps)]
    return sum(final) / len(final) - scores[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="partial_rollout_learning-"))

    for task in args.tasks:
        gains: dict[str, list[float]] = {mode: [] for mode in MODES}
        for seed in args.seeds:
            with ThreadPoolExecutor(len(MODES)) as pool:
                futures = {
                    mode: pool.submit(run, root / task / f"seed{seed}_{mode}", TASKS[task], seed, args.steps, override)
                    for mode, override in MODES.items()
                }
                for mode, future in futures.items():
                    gains[mode].append(gain(future.result(), args.steps))
            print(
                f"{task} seed {seed}: " + ", ".join(f"{mode} gain {values[-1]:+.3f}" for mode, values in gains.items())
            )
        means = {mode: statistics.mean(values) for mode, values in gains.items()}
        pooled = math.sqrt(sum(statistics.variance(values) / len(values) for values in gains.values()))
        difference = means["partial"] - means["today"]
        print(
            f"{task}: mean gain today {means['today']:+.3f}, partial {means['partial']:+.3f}; partial - today "
            f"{difference:+.3f}, pooled SE {pooled:.3f}: {'within' if abs(difference) <= 2 * pooled else 'OUTSIDE'} "
            f"2 SE ({len(args.seeds)} seeds, {args.steps} steps, runs in {root})"
        )


if __name__ == "__main__":
    main()
