"""Greedy validation accuracy of each policy loss on the built-in task: the table in docs/advance/off_policy_losses.md.

What: the CPU profile's real entry point, STEPS training steps per run, for every (loss, staleness)
in GRID and every seed (data.seed = actor_rollout_ref.rollout.seed = seed); the accuracy of the
128 held-out prompts (``val-core/.../acc/mean@1``) read back at every step all runs validated
(``trainer.test_freq``: every 10 steps on the CPU profile, and the last).

Why: to show how the recipe's off-policy losses (``topr``, ``kimi15``, ``tis_pg``, ``reinforce``)
compare with verl's ``vanilla`` (PPO-clip) and ``cispo`` at staleness 1, and with the synchronous
baseline (``vanilla`` at staleness 0), measured rather than assumed.

How: ``python scripts/loss_table.py [--seeds 0 1 2] [--steps 40] [--out outputs/loss_table] [overrides...]``
(extra hydra overrides go to every run, e.g. ``actor_rollout_ref.actor.ppo_mini_batch_size=4``
for several updates per batch; give such a grid its own ``--out``).
Runs go one at a time (each ~1.5 min on 2 cores); a run whose metrics already reach the last step
is not run again, so an interrupted grid resumes. Prints a markdown table: mean (sd) over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ACCURACY = "val-core/one_step_off_async/sort_letters/acc/mean@1"
# (loss_mode, staleness): the recipe's four losses and verl's two references at staleness 1,
# and the synchronous baseline.
GRID = [
    ("topr", 1),
    ("kimi15", 1),
    ("tis_pg", 1),
    ("reinforce", 1),
    ("vanilla", 1),
    ("cispo", 1),
    ("cispo_unified_mask", 1),
    ("vanilla", 0),
]
# Rows that are a loss_mode with options: (loss_mode, its overrides).
VARIANTS = {
    "cispo_unified_mask": ("cispo", ["+actor_rollout_ref.actor.policy_loss.cispo_use_unified_mask=true"]),
    "topr_by_advantage": ("topr", ["+actor_rollout_ref.actor.policy_loss.topr_split=advantage"]),
}


def validation(metrics_file: Path) -> dict[int, float]:
    """Accuracy by step, from verl's ``file`` logger (one JSON line per step)."""
    accuracy = {}
    for line in metrics_file.read_text().splitlines() if metrics_file.exists() else []:
        record = json.loads(line)
        if ACCURACY in record["data"]:
            accuracy[record["step"]] = record["data"][ACCURACY]
    return accuracy


def run(directory: Path, row: str, staleness: int, seed: int, steps: int, overrides: list[str]) -> dict[int, float]:
    loss, options = VARIANTS.get(row, (row, []))
    metrics_file = directory / "metrics.jsonl"
    if steps in validation(metrics_file):
        return validation(metrics_file)
    directory.mkdir(parents=True, exist_ok=True)
    metrics_file.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "recipe.one_step_off_async.main_ppo",
        "--config-name=one_step_off_ppo_cpu",
        "trainer.logger=[console,file]",
        f"trainer.total_training_steps={steps}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"async_training.staleness={staleness}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}",
        f"trainer.default_local_dir={directory / 'checkpoints'}",
        f"hydra.run.dir={directory / 'hydra'}",
        *options,
        *overrides,
    ]
    started = time.monotonic()
    with open(directory / "output.log", "w") as log:
        result = subprocess.run(
            command,
            cwd=directory,
            env={**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics_file)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    print(f"{row} s{staleness} seed {seed}: exit {result.returncode}, {time.monotonic() - started:.0f} s", flush=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed; see {directory / 'output.log'}")
    return validation(metrics_file)


def cell(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ({statistics.stdev(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("outputs/loss_table"))
    parser.add_argument(
        "--rows",
        nargs="+",
        help=f"only these rows (of {', '.join(dict.fromkeys(row for row, _ in GRID))}, and "
        f"{', '.join(set(VARIANTS) - {row for row, _ in GRID})})",
    )
    parser.add_argument("overrides", nargs="*", help="hydra overrides added to every run")
    args = parser.parse_args()
    grid = [(row, s) for row, s in GRID if not args.rows or row in args.rows]
    grid += [(row, 1) for row in args.rows or () if row not in {row for row, _ in GRID}]
    if not grid or any(row not in VARIANTS and row not in {r for r, _ in GRID} for row, _ in grid):
        parser.error(f"--rows {' '.join(args.rows)}: unknown row")

    results = {}
    for seed in args.seeds:  # seed-major: a grid cut short still has every row for the first seeds
        for loss, staleness in grid:
            directory = (args.out / f"{loss}_s{staleness}_seed{seed}").resolve()
            results[loss, staleness, seed] = run(directory, loss, staleness, seed, args.steps, args.overrides)

    checkpoints = sorted(set.intersection(*(set(steps) for steps in results.values())))
    seeds = ", ".join(map(str, args.seeds))
    extra = f"; overrides: {' '.join(args.overrides)}" if args.overrides else ""
    print(f"\nGreedy validation accuracy, mean (sd) over seeds {seeds}; {args.steps} steps{extra}:\n")
    print("| loss_mode | staleness | " + " | ".join(f"step {step}" for step in checkpoints) + " |")
    print("|---|---|" + "---|" * len(checkpoints))
    for loss, staleness in grid:
        row = [cell([results[loss, staleness, seed][step] for seed in args.seeds]) for step in checkpoints]
        print(f"| `{loss}` | {staleness} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
