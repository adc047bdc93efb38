"""Does staleness 1 learn as much per step as staleness 0? The off-policy corrections, measured side by side.

What: the CPU profile's real entry point, STEPS steps per run, on the built-in sort task (``binary``:
all or nothing) and its graded variant (``graded``: partial credit per position), for each candidate
correction at staleness 1 and its staleness-0 baseline, over paired seeds (data.seed = rollout.seed =
seed: the s1 and s0 runs of a seed train on the same prompts in the same order). Validation every
TEST_FREQ steps on the 128 held-out prompts (greedy). Printed per task and candidate:

- gain: the mean validation over the final window (steps FINAL_WINDOW) minus step 0 (every run starts
  from the same weights, so step 0 is the same in all runs), mean over seeds;
- s1/s0: the ratio of the mean gains;
- s1 - s0: the paired difference of the final scores, mean, its standard error over seeds, and t;
- the curve: mean validation per validated step, s1 and s0.

At staleness 0 the rollout samples with the actor's exact weights, so the candidates that differ only
in ``algorithm.rollout_correction`` (and partial rollout, which at staleness 0 has nothing in flight
to interrupt) share one staleness-0 baseline; a policy loss gets its own.

Why: the recipe promises faster steps with the same learning. The default correction must be the
one that keeps staleness 1's gain closest to staleness 0's, measured on a task where advantages are
graded as well as on the binary one (docs/advance/one_step_off_async/configuration.md, "Off-policy
correction: the default and why"). The s1/s0 ratio is unstable when a baseline gains little: read it with the paired
difference. ``partial`` depends on timing (where a sync interrupts a request), so its runs vary with
the load of the machine more than the others.

How (runs go JOBS at a time in the background; a finished run with the same overrides, steps and
profile is not run again, so a cut grid resumes)::

    # screen: every candidate, graded task, 4 seeds
    python scripts/staleness_parity.py --tasks graded --seeds 0 1 2 3
    # confirm: today's default and the best candidates on fresh seeds (not those the screen picked on)
    python scripts/staleness_parity.py --tasks graded binary --seeds 4 5 6 7 8 9 10 11 \\
        --candidates token_is bypass no_correction

A summary (per-seed finals, curves, the table) goes to ``<out>/summary.json`` for
``scripts/staleness_parity_figure.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from entry_runs import run_entry_point  # noqa: E402

STEPS = 40
TEST_FREQ = 5
FINAL_WINDOW = (30, 35, 40)
TASKS = {
    # task: (config name, validation metric)
    "binary": ("one_step_off_ppo_cpu", "val-core/one_step_off_async/sort_letters/acc/mean@1"),
    "graded": ("one_step_off_ppo_cpu_graded", "val-core/one_step_off_async/sort_letters_graded/acc/mean@1"),
}
CORRECTION = "algorithm.rollout_correction"
LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"
# candidate: (overrides at both stalenesses, name of its staleness-0 baseline)
CANDIDATES: dict[str, tuple[list[str], str]] = {
    # The recipe's default today: decoupled PPO, token-level truncated IS (pi_old / pi_rollout, capped at 2).
    "token_is": ([], "ppo"),
    # verl's bypass mode: no recomputed old log-prob, PPO clip on pi / pi_rollout.
    "bypass": ([f"{CORRECTION}.bypass_mode=true", f"{CORRECTION}.rollout_is=null"], "ppo"),
    # Sequence-level truncated IS (product of token ratios, capped at 2).
    "seq_is": ([f"{CORRECTION}.rollout_is=sequence"], "ppo"),
    # Decoupled PPO with no IS weight: the stale samples taken as if on-policy.
    "no_correction": ([f"{CORRECTION}.rollout_is=null"], "ppo"),
    # Token-level IS with a looser cap.
    "token_is_cap5": ([f"{CORRECTION}.rollout_is_threshold=5.0"], "ppo"),
    # Partial rollout (today's correction): requests in flight continue under the new weights.
    "partial": (["async_training.partial_rollout=true"], "ppo"),
    # The off-policy losses (with today's correction); each has its own staleness-0 baseline.
    "kimi15": ([f"{LOSS}=kimi15"], "kimi15"),
    "topr": ([f"{LOSS}=topr"], "topr"),
    "cispo": ([f"{LOSS}=cispo"], "cispo"),
}


def baseline_overrides(baseline: str) -> list[str]:
    return [] if baseline == "ppo" else [f"{LOSS}={baseline}"]


def validation(metrics: dict[int, dict], metric: str) -> dict[int, float]:
    return {step: data[metric] for step, data in sorted(metrics.items()) if metric in data}


def run(out: Path, task: str, name: str, staleness: int, seed: int, overrides: list[str]) -> dict[int, float]:
    """Validation by step of one run, run now unless a finished one with the same settings is on disk."""
    directory = out / task / f"{name}_s{staleness}_seed{seed}"
    config_name, metric = TASKS[task]
    settings = {"overrides": overrides, "steps": STEPS, "test_freq": TEST_FREQ, "config": config_name}
    done = directory / "validation.json"
    if done.exists():
        saved = json.loads(done.read_text())
        if "curve" not in saved:  # written before the settings were recorded (same grid)
            return {int(step): value for step, value in saved.items()}
        if {key: saved[key] for key in settings} == settings:
            return {int(step): value for step, value in saved["curve"].items()}
        print(f"{directory}: measured with other settings ({saved['overrides']}); running it again", flush=True)
    if directory.exists():  # an interrupted run, or other settings: start it again
        shutil.rmtree(directory)
    started = time.monotonic()
    metrics = run_entry_point(
        directory,
        config_name,
        [
            f"trainer.total_training_steps={STEPS}",
            f"trainer.test_freq={TEST_FREQ}",
            "trainer.val_before_train=true",
            f"data.seed={seed}",
            f"actor_rollout_ref.rollout.seed={seed}",
            f"async_training.staleness={staleness}",
            f"hydra.run.dir={directory / 'hydra'}",
            *overrides,
        ],
        label=f"{task} {name} s{staleness} seed {seed}",
    )
    curve = validation(metrics, metric)
    if STEPS not in curve:
        sys.exit(f"{directory}: no validation at step {STEPS}; see {directory / 'output.log'}")
    done.write_text(json.dumps({**settings, "curve": curve}))
    print(f"{task} {name} s{staleness} seed {seed}: {time.monotonic() - started:.0f} s", flush=True)
    return curve


def final(curve: dict[int, float]) -> float:
    return statistics.mean(curve[step] for step in FINAL_WINDOW)


def compare(s1: dict[int, dict[int, float]], s0: dict[int, dict[int, float]]) -> dict:
    """The table's row for one candidate: s1 and s0 curves by seed."""
    seeds = sorted(s1)
    gain1 = [final(s1[seed]) - s1[seed][0] for seed in seeds]
    gain0 = [final(s0[seed]) - s0[seed][0] for seed in seeds]
    diffs = [final(s1[seed]) - final(s0[seed]) for seed in seeds]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    steps = sorted(set.intersection(*(set(curve) for curve in [*s1.values(), *s0.values()])))
    return {
        "seeds": seeds,
        "gain_s1": statistics.mean(gain1),
        "gain_s0": statistics.mean(gain0),
        "ratio": statistics.mean(gain1) / statistics.mean(gain0),
        "diff": statistics.mean(diffs),
        "diff_se": se,
        "diffs": diffs,
        "final_s1": [final(s1[seed]) for seed in seeds],
        "final_s0": [final(s0[seed]) for seed in seeds],
        "curve_s1": {step: statistics.mean(s1[seed][step] for seed in seeds) for step in steps},
        "curve_s0": {step: statistics.mean(s0[seed][step] for seed in seeds) for step in steps},
        "curves_s1": {seed: s1[seed] for seed in seeds},
        "curves_s0": {seed: s0[seed] for seed in seeds},
    }


def print_table(task: str, rows: dict[str, dict]) -> None:
    first = next(iter(rows.values()))
    print(
        f"\n{task} task, {STEPS} steps, seeds {', '.join(map(str, first['seeds']))}; final = mean of steps "
        f"{', '.join(map(str, FINAL_WINDOW))}; gain = final - step 0\n"
    )
    print("| candidate | gain s1 | gain s0 | s1/s0 | s1 - s0 (SE) | t |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        t = row["diff"] / row["diff_se"] if row["diff_se"] else float("nan")
        print(
            f"| `{name}` | {row['gain_s1']:.3f} | {row['gain_s0']:.3f} | {row['ratio']:.2f} | "
            f"{row['diff']:+.3f} ({row['diff_se']:.3f}) | {t:+.1f} |"
        )
    print("\nMean validation per step, s1 / s0:\n")
    steps = list(first["curve_s1"])
    print("| candidate | " + " | ".join(f"{step}" for step in steps) + " |")
    print("|---|" + "---|" * len(steps))
    for name, row in rows.items():
        cells = [f"{row['curve_s1'][step]:.3f} / {row['curve_s0'][step]:.3f}" for step in steps]
        print(f"| `{name}` | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["graded"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (two share 2 cores well)")
    parser.add_argument("--out", type=Path, default=Path("outputs/staleness_parity"))
    args = parser.parse_args()
    out = args.out.resolve()

    # Every (task, candidate or baseline, staleness, seed) once; seed-major, so a cut grid has whole seeds.
    runs = {}
    for seed in args.seeds:
        for task in args.tasks:
            for name in args.candidates:
                overrides, baseline = CANDIDATES[name]
                runs[task, name, 1, seed] = overrides
                runs[task, baseline, 0, seed] = baseline_overrides(baseline)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {key: pool.submit(run, out, *key, overrides) for key, overrides in runs.items()}
        try:
            curves = {key: future.result() for key, future in futures.items()}
        except BaseException:  # a failed run (SystemExit) or Ctrl-C: start no more runs
            for future in futures.values():
                future.cancel()
            raise

    summary = {"steps": STEPS, "test_freq": TEST_FREQ, "final_window": FINAL_WINDOW, "tasks": {}}
    for task in args.tasks:
        rows = {}
        for name in args.candidates:
            baseline = CANDIDATES[name][1]
            rows[name] = compare(
                {seed: curves[task, name, 1, seed] for seed in args.seeds},
                {seed: curves[task, baseline, 0, seed] for seed in args.seeds},
            )
        print_table(task, rows)
        summary["tasks"][task] = rows
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nsummary: {out / 'summary.json'}")


if __name__ == "__main__":
    main()
