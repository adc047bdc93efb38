"""Does a setting learn as much per step as another? One experiment, in named grids (``--grid``).

What: a grid trains every one of its settings with a few seeds through the real entry point (``data.seed`` =
``actor_rollout_ref.rollout.seed`` = seed: the settings of a seed train on the same prompts in the same
order), validates greedily on the held-out prompts at step 0 and every ``test_freq`` steps, reads each run's
validation score by step (the task's ``val-core/<data source>/<score>/mean@1``) and compares the settings'
gains. Runs go ``--jobs`` at a time, seed-major (a grid cut short has whole seeds). A run's folder keeps
its metrics, its log and ``validation.json``; a finished run with the same profile, overrides, steps and
validation period is not run again, so a cut grid resumes (an interrupted run starts again; a run with other
settings too, its folder kept as ``<run>.other-settings``). A run that fails is launched once more (its folder
kept as ``<run>.failed``); a second failure stops the grid. Hydra overrides after ``--`` go to every run of the grid (give such a grid its own
``--out``).

--grid staleness-parity: does staleness 1 learn as much per step as staleness 0, and as much per minute? The
modes and off-policy corrections, measured side by side. The CPU profile's real entry point, STEPS steps per run,
on the built-in sort task (``binary``: all or nothing), its graded variant (``graded``: partial credit per
position), the eight-letter graded sort (``sort_long``: answers half again as long, a warm start further from
the answer), the graded task at three, five and ten times the learning rate (``graded_fast``, ``graded_lr5e-4``,
``graded_lr1e-3``: a policy that moves faster per step, up to where staleness 0 itself stops learning) and with
four optimizer updates per step (``graded_updates4``), and the generation-bound task at three times the learning
rate (``generation_bound_fast``: generation longer than training, so partial rollout's tokens are fresher), for
each candidate at staleness 1 and its staleness-0 baseline, over paired seeds (the s1 and s0 runs
of a seed train on the same prompts in the same order). Validation every PARITY_TEST_FREQ steps on the 128
held-out prompts (greedy). Printed per task and candidate:

- gain: the mean validation over the final window (steps FINAL_WINDOW) minus step 0 (every run starts
  from the same weights, so step 0 is the same in all runs), mean over seeds;
- share of s0's gain: the ratio of the mean gains, and its standard error over the paired seeds;
- s1 - s0: the paired difference of the final scores, mean, its standard error over seeds, and t;
- steps/min: each mode's own pace, 60 / the median step time of its steady steps that did not validate (the
  runs of a seed go side by side, ``--jobs`` at a time, so they share the machine's load), and the gain per
  minute, gain x steps/min / STEPS;
- what the s1 runs trained on: the sampler's distance from the trainer (verl's ``rollout_corr/kl``: the driver's
  against the weights before the update in decoupled mode, the actor's against the weights it updates in bypass
  mode, the same with one update per step, as the CPU profiles make) and the mean staleness of the tokens (below
  1 where partial rollout resumed samples);
- the curve: mean validation per validated step, s1 and s0.

At staleness 0 the rollout samples with the actor's exact weights, so the candidates that differ only
in ``algorithm.rollout_correction`` (and partial rollout, which at staleness 0 has nothing in flight
to interrupt) share one staleness-0 baseline; a policy loss gets its own. Why: the recipe promises faster
steps with the same learning. The default mode and correction must keep staleness 1's gain closest to
staleness 0's on every task, a fast-moving policy's included (docs/advance/one_step_off_async/configuration.md,
"Off-policy correction: the default and why"). The
s1/s0 ratio is unstable when a baseline gains little: read it with the paired difference. ``partial``
depends on timing (where a sync interrupts a request), so its runs vary with the load of the machine
more than the others. A summary (per-seed finals, curves, the table) goes to ``<out>/summary.json`` for
``python -m benchmarks staleness-parity-figure``.

--grid partial-rollout: does partial rollout learn as well as whole-batch mode? Validation gain of whole-batch
mode at staleness 1 and of partial rollout at ``--partial-staleness`` (1 unless given), per task. For each
task (the built-in sort task, ``one_step_off_ppo_cpu``; the long-tail task, ``one_step_off_ppo_cpu_long_tail``;
on request the generation-bound one, ``one_step_off_ppo_cpu_generation_bound``) and each seed, runs the
real entry point with ``async_training.partial_rollout`` false and true side by side (the two runs share the
machine), validating at step 0 and every PARTIAL_TEST_FREQ steps. A run's gain is the mean of its last
two validations minus its step-0 validation (the method of ``tests/test_e2e_convergence_on_cpu.py``).
Per task it prints every seed's gains, the mean gain per mode, their difference, the pooled standard
error sqrt(sd_a^2 / n + sd_b^2 / n), and whether the difference is within 2 of them. About 3 min per
seed and task.

--grid loss-table: greedy validation accuracy of each policy loss on the built-in task, the table in
docs/advance/off_policy_losses.md. The CPU profile's real entry point, ``--steps`` training steps per
run, for every (loss, staleness) in LOSS_GRID and every seed; the accuracy of the 128 held-out prompts
read back at every step all runs validated (every LOSS_TEST_FREQ steps, and the last). Why: to show how
the recipe's off-policy losses (``topr``, ``kimi15``, ``tis_pg``, ``reinforce``) compare with verl's
``vanilla`` (PPO-clip) and ``cispo`` at staleness 1, and with the synchronous baseline (``vanilla`` at
staleness 0), measured rather than assumed. Extra hydra overrides, e.g.
``actor_rollout_ref.actor.ppo_mini_batch_size=4`` for several updates per batch. Runs go one at a
time (each ~1.5 min on 2 cores). Prints a markdown table: mean (sd) over seeds.

How (from the repository root, with the project's virtualenv active)::

    # staleness parity, screen: every candidate, graded task, 4 seeds
    python -m benchmarks learning --grid staleness-parity --tasks graded --seeds 0 1 2 3
    # the default's decision: partial rollout in bypass mode (the default) and whole batches against staleness 0
    python -m benchmarks learning --grid staleness-parity --tasks binary graded sort_long graded_fast graded_lr5e-4 \
        generation_bound_fast long_tail --candidates partial_bypass bypass --seeds 0 1 2 3 4 5 6 7
    # confirm: the default and the best candidates on fresh seeds (not those the screen picked on)
    python -m benchmarks learning --grid staleness-parity --tasks graded binary --seeds 4 5 6 7 8 9 10 11 \\
        --candidates token_is bypass no_correction
    python -m benchmarks learning --grid partial-rollout                 # 3 seeds, 30 steps, both tasks
    python -m benchmarks learning --grid partial-rollout --seeds 0 1 2 3 --steps 40 --tasks long_tail
    python -m benchmarks learning --grid partial-rollout --tasks generation_bound --partial-staleness 2 --seeds 0 1 2 3
    python -m benchmarks learning --grid loss-table [--seeds 0 1 2] [--steps 40] [--out outputs/loss_table] \\
        [--rows topr vanilla] [-- overrides...]
    python -m benchmarks learning --grid loss-table --help             # a grid's own options
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from benchmarks import argument_parser
from recipe.one_step_off_async import runs
from recipe.one_step_off_async.async_config import DECOUPLED_OVERRIDES
from recipe.one_step_off_async.errors import RunFailed

VALIDATION = "validation.json"  # in a finished run's folder: its settings and validation curve

Curve = dict[int, float]  # validation score by step


@dataclass(frozen=True)
class Measured:
    """What a grid reads of a finished run: its validation curve and how fast it stepped."""

    curve: Curve
    steps_per_minute: float  # over its steady training steps
    stalled_syncs: list[int]  # steps whose sync took STALLED_SYNC_S or more
    # Means over steps 2 on: how far the sampling policy was from the one that trained on its tokens (verl's
    # rollout_corr/kl per token, the driver's in decoupled mode, the actor's in bypass mode; 0 at staleness 0 up to
    # numerics with one update per step), the response length in tokens, and the mean staleness of the tokens
    # trained on (async/staleness_mean: below the staleness where partial rollout resumed samples under newer
    # weights).
    mismatch_kl: float
    response_length: float
    token_staleness: float


@dataclass(frozen=True)
class Trial:
    """One run of a grid: a setting trained with one seed."""

    label: str  # names it in progress lines and errors, e.g. "graded token_is s1 seed 0"
    folder: Path
    profile: str
    seed: int
    overrides: tuple[str, ...]  # the setting's


def validation_curve(metrics: dict[int, dict]) -> Curve:
    """The task's validation score by step, for the steps that validated: its one ``val-core/.../mean@1`` metric
    (verl logs one per data source; a grid's profiles have one data source)."""
    curve = {}
    for step, values in sorted(metrics.items()):
        scores = [key for key in values if key.startswith("val-core/") and key.endswith("/mean@1")]
        if len(scores) > 1:
            raise ValueError(f"step {step} logged {len(scores)} validation scores, expected one: {scores}")
        if scores:
            curve[step] = values[scores[0]]
    return curve


def steps_per_minute(metrics: dict[int, dict], steps: int) -> float:
    """60 / the median ``timing_s/step`` of steps 3..steps-1 that did not validate: steps 1-2 fill the pipeline and
    warm up, the last has nothing left to generate (as ``python -m benchmarks overlap`` reads them); the median, so
    that one stalled sync (``stalled_syncs``) does not set a mode's pace."""
    times = [
        values["timing_s/step"]
        for step, values in metrics.items()
        if 3 <= step < steps and "timing_s/step" in values and not any(key.startswith("val-core/") for key in values)
    ]
    if not times:
        raise ValueError(f"no steady training step among steps 3..{steps - 1} logged timing_s/step")
    return 60.0 / statistics.median(times)


STALLED_SYNC_S = 5.0  # a sync of the CPU profiles takes ~0.1 s; one this long waited on something else


def stalled_syncs(metrics: dict[int, dict]) -> list[int]:
    """The steps whose weight sync took STALLED_SYNC_S or more."""
    return [
        step for step, values in sorted(metrics.items()) if values.get("timing_s/sync_weights", 0) >= STALLED_SYNC_S
    ]


def say(line: str) -> None:
    """Print a progress line in one write: the lines of runs that end together do not interleave."""
    print(line + "\n", end="", flush=True)


def read_run(folder: Path, curve: Curve, steps: int) -> Measured:
    """What a finished run's folder holds beyond its curve: its pace, stalls, sampler mismatch and lengths."""
    metrics = runs.read_metrics(folder / runs.METRICS)

    def mean_of(*keys: str) -> float:
        """The mean over steps 2 on of the first of ``keys`` the run logged."""
        for key in keys:
            values = [step_values[key] for step, step_values in metrics.items() if step >= 2 and key in step_values]
            if values:
                return statistics.mean(values)
        return float("nan")

    return Measured(
        curve,
        steps_per_minute(metrics, steps),
        stalled_syncs(metrics),
        mean_of("rollout_corr/kl", "actor/rollout_corr/kl"),  # the driver's in decoupled mode, the actor's in bypass
        mean_of("response_length/mean"),
        mean_of("async/staleness_mean"),
    )


def set_aside(folder: Path, suffix: str) -> Path:
    """Move ``folder`` to ``<folder><suffix>`` (replacing an earlier one) and return where it went."""
    kept = folder.with_name(folder.name + suffix)
    shutil.rmtree(kept, ignore_errors=True)
    folder.rename(kept)
    return kept


def train(trial: Trial, steps: int, test_freq: int, extra: tuple[str, ...]) -> Measured:
    """What ``trial`` measured, run now unless its folder holds a finished run with the same settings. A run that
    fails is launched once more, so that one transient failure does not end a grid of hours; a second failure stops
    the grid."""
    overrides = (f"data.seed={trial.seed}", f"actor_rollout_ref.rollout.seed={trial.seed}", *trial.overrides, *extra)
    settings = {"overrides": list(overrides), "steps": steps, "test_freq": test_freq, "config": trial.profile}
    done = trial.folder / VALIDATION
    if done.exists():
        saved = json.loads(done.read_text())
        if {key: saved.get(key) for key in settings} == settings:
            return read_run(trial.folder, {int(step): value for step, value in saved["curve"].items()}, steps)
        kept = set_aside(trial.folder, ".other-settings")
        say(
            f"{trial.folder}: measured with other settings ({saved.get('overrides')}), kept as {kept}; running it again"
        )
    for attempt in (1, 2):
        if trial.folder.exists():  # an interrupted run: start it again
            shutil.rmtree(trial.folder)
        run = runs.run(
            trial.folder,
            f"trainer.total_training_steps={steps}",
            f"trainer.test_freq={test_freq}",
            "trainer.val_before_train=true",
            f"hydra.run.dir={trial.folder / 'hydra'}",
            *overrides,
            profile=trial.profile,
        )
        if run.returncode == 0 or attempt == 2:
            break
        kept = set_aside(trial.folder, ".failed")
        say(f"{trial.label}: failed (exit {run.returncode}, its folder kept as {kept}); launching it once more")
    run.check(trial.label)
    curve = validation_curve(run.metrics)
    if steps not in curve or 0 not in curve:
        raise RunFailed(f"{trial.label}: no validation at step 0 and {steps}; see {trial.folder / runs.OUTPUT}")
    done.write_text(json.dumps({**settings, "curve": curve}))
    result = read_run(trial.folder, curve, steps)
    stalls = f", syncs stalled at steps {result.stalled_syncs}" if result.stalled_syncs else ""
    say(f"{trial.label}: {run.seconds:.0f} s, {result.steps_per_minute:.1f} steps/min{stalls}")
    return result


def train_all(
    trials: dict[Hashable, Trial], steps: int, test_freq: int, jobs: int, extra: tuple[str, ...]
) -> dict[Hashable, Measured]:
    """What every trial measured; ``jobs`` runs at a time, started in the order of ``trials``."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {key: pool.submit(train, trial, steps, test_freq, extra) for key, trial in trials.items()}
        try:
            return {key: future.result() for key, future in futures.items()}
        except BaseException:  # a failed run or Ctrl-C: start no more runs
            for future in futures.values():
                future.cancel()
            raise


class Grid(Protocol):
    """A named grid: its options, its trials, the steps and validation period of its runs, and its report."""

    jobs: int  # runs at a time, by default
    out: str | None  # where its runs go, by default (None: a temporary folder)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def schedule(self, args: argparse.Namespace) -> tuple[int, int]:
        """(training steps, validation period) of every run."""
        ...

    def trials(self, args: argparse.Namespace) -> dict[Hashable, Trial]:
        """The runs, in the order they start; raises ``ValueError`` for options it cannot run."""
        ...

    def report(self, args: argparse.Namespace, measured: dict[Hashable, Measured]) -> None:
        """Print what the runs show (and write what the grid keeps)."""
        ...


# --- staleness-parity ------------------------------------------------------------------------------------------

STEPS = 40
PARITY_TEST_FREQ = 5
FINAL_WINDOW = (30, 35, 40)
# task: (config name, its overrides)
PARITY_TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "binary": ("one_step_off_ppo_cpu", ()),  # the sort task, all or nothing
    "graded": ("one_step_off_ppo_cpu_graded", ()),  # partial credit per position
    "sort_long": ("one_step_off_ppo_cpu_sort_long", ()),  # eight letters, partial credit: longer answers
    # The long-tail task (answers of 2-480 tokens, one budget per problem): a batch's longest answers idle the rollout.
    "long_tail": ("one_step_off_ppo_cpu_long_tail", ()),
    # The graded task with a policy that moves three times as fast per step.
    "graded_fast": ("one_step_off_ppo_cpu_graded", ("actor_rollout_ref.actor.optim.lr=3e-4",)),
    # The graded task at five and ten times the learning rate: near and past the step size at which staleness 0
    # itself stops learning.
    "graded_lr5e-4": ("one_step_off_ppo_cpu_graded", ("actor_rollout_ref.actor.optim.lr=5e-4",)),
    "graded_lr1e-3": ("one_step_off_ppo_cpu_graded", ("actor_rollout_ref.actor.optim.lr=1e-3",)),
    # The graded task with four optimizer updates per step (mini-batches of 4 prompts), as verl's defaults split a
    # batch: the policy moves four updates between a batch's sampling and its training.
    "graded_updates4": (
        "one_step_off_ppo_cpu_graded",
        ("actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"),
    ),
    # The generation-bound task (answers of 2-480 tokens, generation longer than training) at three times the
    # learning rate: where partial rollout's tokens are fresher (about 0.7 of a version stale at staleness 1).
    "generation_bound_fast": (
        "one_step_off_ppo_cpu_generation_bound",
        ("actor_rollout_ref.actor.optim.lr=3e-4",),
    ),
}
CORRECTION = "algorithm.rollout_correction"
LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"
# verl's bypass mode (the profiles' default): PPO clip on pi / pi_rollout, no recomputed old log-prob. Decoupled
# mode: the actor recomputes old log-probs (PPO's anchor), IS weights pi_old / pi_rollout; the recipe's losses and
# verl's other loss modes need it. Partial rollout (the profiles' default) or whole batches (one weight version
# each): a staleness-1 run names its correction mode and rolls out in whole batches unless its candidate names
# PARTIAL (``staleness_1_overrides``), so that its runs keep their meaning (and a grid resumes) whichever the
# default is; at staleness 0 nothing is in flight at a sync, and partial rollout changes nothing.
BYPASS = [f"{CORRECTION}.bypass_mode=true", f"{CORRECTION}.rollout_is=null"]
DECOUPLED_MODE = [f"{CORRECTION}.bypass_mode=false"]
TOKEN_IS = list(DECOUPLED_OVERRIDES)  # pi_old / pi_rollout per token, capped at 2
PARTIAL, WHOLE_BATCHES = "async_training.partial_rollout=true", "async_training.partial_rollout=false"
# candidate: (overrides at staleness 1, whole batches unless PARTIAL is one; name of its staleness-0 baseline)
CANDIDATES: dict[str, tuple[list[str], str]] = {
    # Bypass mode in whole batches: the default before partial rollout.
    "bypass": (BYPASS, "ppo"),
    # Decoupled PPO with token-level truncated IS: the default before bypass.
    "token_is": (TOKEN_IS, "ppo"),
    # Sequence-level truncated IS (product of token ratios, capped at 2).
    "seq_is": ([*DECOUPLED_MODE, f"{CORRECTION}.rollout_is=sequence"], "ppo"),
    # Decoupled PPO with no IS weight: the stale samples taken as if on-policy.
    "no_correction": ([*DECOUPLED_MODE, f"{CORRECTION}.rollout_is=null"], "ppo"),
    # Token-level IS with a looser cap.
    "token_is_cap5": ([*TOKEN_IS, f"{CORRECTION}.rollout_is_threshold=5.0"], "ppo"),
    # Partial rollout, requests in flight continuing under the new weights, with decoupled token-level IS and in
    # bypass mode (the profiles' default).
    "partial": ([PARTIAL, *TOKEN_IS], "ppo"),
    "partial_bypass": ([PARTIAL, *BYPASS], "ppo"),
    # The off-policy losses (decoupled, token-level IS, whole batches); each has its own staleness-0 baseline.
    "kimi15": ([f"{LOSS}=kimi15", *TOKEN_IS], "kimi15"),
    "topr": ([f"{LOSS}=topr", *TOKEN_IS], "topr"),
    "cispo": ([f"{LOSS}=cispo", *TOKEN_IS], "cispo"),
}


def staleness_1_overrides(candidate: str) -> list[str]:
    """A candidate's overrides at staleness 1: its own, in whole batches unless it rolls out partially."""
    overrides = CANDIDATES[candidate][0]
    return overrides if PARTIAL in overrides else [*overrides, WHOLE_BATCHES]


def baseline_overrides(baseline: str) -> list[str]:
    """A staleness-0 baseline's overrides: at staleness 0 the rollout samples with the actor's exact weights, so bypass
    and decoupled mode, with or without IS, train alike (up to 1e-6; decoupled mode's steps are slower by its
    log-prob pass); a loss needs decoupled mode."""
    return BYPASS if baseline == "ppo" else [f"{LOSS}={baseline}", *TOKEN_IS]


def final(curve: Curve) -> float:
    return statistics.mean(curve[step] for step in FINAL_WINDOW)


def share_of_gain(gain1: list[float], gain0: list[float]) -> tuple[float, float]:
    """mean(gain1) / mean(gain0) over paired seeds, and its standard error (the ratio estimator's, first order:
    sqrt(sum (g1 - r g0)^2 / (n (n - 1))) / mean(g0))."""
    ratio = statistics.mean(gain1) / statistics.mean(gain0)
    n = len(gain1)
    if n < 2:
        return ratio, float("nan")
    residual = sum((g1 - ratio * g0) ** 2 for g1, g0 in zip(gain1, gain0, strict=True))
    return ratio, math.sqrt(residual / (n * (n - 1))) / abs(statistics.mean(gain0))


def mean_pace(runs: list[Measured]) -> float:
    return statistics.mean(run.steps_per_minute for run in runs)


def compare(s1: dict[int, Measured], s0: dict[int, Measured]) -> dict:
    """The table's row for one candidate: what its s1 runs and their s0 baselines measured, by seed."""
    seeds = sorted(s1)
    c1, c0 = ({seed: runs[seed].curve for seed in seeds} for runs in (s1, s0))
    gain1 = [final(c1[seed]) - c1[seed][0] for seed in seeds]
    gain0 = [final(c0[seed]) - c0[seed][0] for seed in seeds]
    diffs = [final(c1[seed]) - final(c0[seed]) for seed in seeds]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    share, share_se = share_of_gain(gain1, gain0)
    pace1, pace0 = (mean_pace([runs[seed] for seed in seeds]) for runs in (s1, s0))
    steps = sorted(set.intersection(*(set(curve) for curve in [*c1.values(), *c0.values()])))
    return {
        "seeds": seeds,
        "gain_s1": statistics.mean(gain1),
        "gain_s0": statistics.mean(gain0),
        "ratio": share,
        "ratio_se": share_se,
        "diff": statistics.mean(diffs),
        "diff_se": se,
        "diffs": diffs,
        # Gain per minute: the mean gain over the minutes its STEPS steps take at the mode's own pace.
        "steps_per_minute_s1": pace1,
        "steps_per_minute_s0": pace0,
        "gain_per_minute_s1": statistics.mean(gain1) * pace1 / STEPS,
        "gain_per_minute_s0": statistics.mean(gain0) * pace0 / STEPS,
        "mismatch_kl_s1": statistics.mean(s1[seed].mismatch_kl for seed in seeds),
        "response_length_s1": statistics.mean(s1[seed].response_length for seed in seeds),
        "token_staleness_s1": statistics.mean(s1[seed].token_staleness for seed in seeds),
        "stalled_syncs_s1": sum(len(s1[seed].stalled_syncs) for seed in seeds),
        "stalled_syncs_s0": sum(len(s0[seed].stalled_syncs) for seed in seeds),
        "final_s1": [final(c1[seed]) for seed in seeds],
        "final_s0": [final(c0[seed]) for seed in seeds],
        "curve_s1": {step: statistics.mean(c1[seed][step] for seed in seeds) for step in steps},
        "curve_s0": {step: statistics.mean(c0[seed][step] for seed in seeds) for step in steps},
        "curves_s1": c1,
        "curves_s0": c0,
    }


def mismatch(row: dict) -> str:
    """The s1 runs' KL(sampler || trainer) per token and per response."""
    kl, length = row["mismatch_kl_s1"], row["response_length_s1"]
    if math.isnan(kl):
        return "not logged (bypass-mode runs from before the actor ran verl's bypass loss)"
    return f"{kl:.2e} per token x {length:.1f} tokens = {kl * length:.2e} per response"


def print_parity_table(task: str, rows: dict[str, dict]) -> None:
    first = next(iter(rows.values()))
    print(
        f"\n{task} task, {STEPS} steps, seeds {', '.join(map(str, first['seeds']))}; final = mean of steps "
        f"{', '.join(map(str, FINAL_WINDOW))}; gain = final - step 0; share = gain s1 / gain s0 (SE over the paired "
        "seeds); steps/min over steps 3-39 that did not validate, the runs of a round side by side\n"
    )
    print(
        "| candidate | gain s1 | gain s0 | share of s0's gain (SE) | s1 - s0 (SE) | t | steps/min s1 / s0 | gain/min s1 / s0 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        t = row["diff"] / row["diff_se"] if row["diff_se"] else float("nan")
        print(
            f"| `{name}` | {row['gain_s1']:.3f} | {row['gain_s0']:.3f} | {row['ratio']:.2f} ({row['ratio_se']:.2f}) | "
            f"{row['diff']:+.3f} ({row['diff_se']:.3f}) | {t:+.1f} | "
            f"{row['steps_per_minute_s1']:.1f} / {row['steps_per_minute_s0']:.1f} | "
            f"{row['gain_per_minute_s1']:.4f} / {row['gain_per_minute_s0']:.4f} |"
        )
    print(
        "\nWhat the s1 runs trained on: "
        + "; ".join(
            f"`{name}` KL(sampler || trainer) {mismatch(row)}, mean token staleness "
            f"{row['token_staleness_s1']:.2f}, syncs of "
            f"{STALLED_SYNC_S:g} s or more s1 / s0: {row['stalled_syncs_s1']} / {row['stalled_syncs_s0']}"
            for name, row in rows.items()
        )
    )
    print("\nMean validation per step, s1 / s0:\n")
    steps = list(first["curve_s1"])
    print("| candidate | " + " | ".join(f"{step}" for step in steps) + " |")
    print("|---|" + "---|" * len(steps))
    for name, row in rows.items():
        cells = [f"{row['curve_s1'][step]:.3f} / {row['curve_s0'][step]:.3f}" for step in steps]
        print(f"| `{name}` | " + " | ".join(cells) + " |")


class StalenessParity:
    jobs = 2  # two runs share 2 cores well
    out = "outputs/staleness_parity"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tasks", nargs="+", choices=sorted(PARITY_TASKS), default=["graded"])
        parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
        parser.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))

    def schedule(self, args: argparse.Namespace) -> tuple[int, int]:
        return STEPS, PARITY_TEST_FREQ

    def trials(self, args: argparse.Namespace) -> dict[Hashable, Trial]:
        """Every (task, candidate or baseline, staleness, seed) once."""
        trials = {}
        for seed in args.seeds:
            for task in args.tasks:
                for name in args.candidates:
                    baseline = CANDIDATES[name][1]
                    for setting, staleness, extra in (
                        (name, 1, staleness_1_overrides(name)),
                        (baseline, 0, baseline_overrides(baseline)),
                    ):
                        profile, task_overrides = PARITY_TASKS[task]
                        trials[task, setting, staleness, seed] = Trial(
                            f"{task} {setting} s{staleness} seed {seed}",
                            args.out / task / f"{setting}_s{staleness}_seed{seed}",
                            profile,
                            seed,
                            (*task_overrides, f"async_training.staleness={staleness}", *extra),
                        )
        return trials

    def report(self, args: argparse.Namespace, measured: dict[Hashable, Measured]) -> None:
        summary = {"steps": STEPS, "test_freq": PARITY_TEST_FREQ, "final_window": FINAL_WINDOW, "tasks": {}}
        for task in args.tasks:
            rows = {}
            for name in args.candidates:
                baseline = CANDIDATES[name][1]
                rows[name] = compare(
                    {seed: measured[task, name, 1, seed] for seed in args.seeds},
                    {seed: measured[task, baseline, 0, seed] for seed in args.seeds},
                )
            print_parity_table(task, rows)
            summary["tasks"][task] = rows
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"\nsummary: {args.out / 'summary.json'}")


# --- partial-rollout -------------------------------------------------------------------------------------------

PARTIAL_TASKS = {
    "sort": "one_step_off_ppo_cpu",
    "long_tail": "one_step_off_ppo_cpu_long_tail",
    "generation_bound": "one_step_off_ppo_cpu_generation_bound",
}
MODES = {"whole": WHOLE_BATCHES, "partial": PARTIAL}
PARTIAL_TEST_FREQ = 10


class PartialRolloutLearning:
    jobs = 2  # a seed's two modes side by side
    out = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        parser.add_argument("--steps", type=int, default=30)
        parser.add_argument("--tasks", nargs="+", choices=list(PARTIAL_TASKS), default=["sort", "long_tail"])
        parser.add_argument(
            "--partial-staleness", type=int, default=1, help="the partial mode's staleness (whole-batch mode runs at 1)"
        )

    def schedule(self, args: argparse.Namespace) -> tuple[int, int]:
        return args.steps, PARTIAL_TEST_FREQ

    def trials(self, args: argparse.Namespace) -> dict[Hashable, Trial]:
        return {
            (task, seed, mode): Trial(
                f"{task} seed {seed} {mode}",
                args.out / task / f"seed{seed}_{mode}{self.suffix(args, mode)}",
                PARTIAL_TASKS[task],
                seed,
                (f"async_training.staleness={self.staleness(args, mode)}", override),
            )
            for task in args.tasks
            for seed in args.seeds
            for mode, override in MODES.items()
        }

    @staticmethod
    def staleness(args: argparse.Namespace, mode: str) -> int:
        return args.partial_staleness if mode == "partial" else 1

    @staticmethod
    def suffix(args: argparse.Namespace, mode: str) -> str:
        """The run folder's suffix: the staleness, where it is not whole-batch mode's 1."""
        staleness = PartialRolloutLearning.staleness(args, mode)
        return "" if staleness == 1 else f"_s{staleness}"

    def report(self, args: argparse.Namespace, measured: dict[Hashable, Measured]) -> None:
        curves = {key: run.curve for key, run in measured.items()}
        for task in args.tasks:
            gains: dict[str, list[float]] = {mode: [] for mode in MODES}
            for seed in args.seeds:
                for mode in MODES:
                    gains[mode].append(self.gain(curves[task, seed, mode], args.steps))
                print(
                    f"{task} seed {seed}: "
                    + ", ".join(f"{mode} gain {values[-1]:+.3f}" for mode, values in gains.items())
                )
            means = {mode: statistics.mean(values) for mode, values in gains.items()}
            difference = means["partial"] - means["whole"]
            if len(args.seeds) > 1:
                pooled = math.sqrt(sum(statistics.variance(values) / len(values) for values in gains.values()))
                within = "within" if abs(difference) <= 2 * pooled else "OUTSIDE"
                spread = f"pooled SE {pooled:.3f}: {within} 2 SE"
            else:
                spread = "no standard error from one seed"
            print(
                f"{task}: mean gain whole batches (s=1) {means['whole']:+.3f}, partial (s={args.partial_staleness}) "
                f"{means['partial']:+.3f}; partial - whole {difference:+.3f}, {spread} ({len(args.seeds)} seeds, "
                f"{args.steps} steps, runs in {args.out})"
            )

    @staticmethod
    def gain(scores: Curve, steps: int) -> float:
        last = [scores[step] for step in (steps - PARTIAL_TEST_FREQ, steps)]
        return sum(last) / len(last) - scores[0]


# --- loss-table ------------------------------------------------------------------------------------------------

# (loss_mode, staleness): the recipe's four losses and verl's two references at staleness 1,
# and the synchronous baseline.
LOSS_GRID = [
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
LOSS_TEST_FREQ = 10  # the CPU profile's


def loss_table_folder(out: Path, row: str, staleness: int, seed: int) -> Path:
    """Where the loss table keeps a run (``python -m benchmarks convergence-figure`` reads these folders)."""
    return out / f"{row}_s{staleness}_seed{seed}"


def cell(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ({statistics.stdev(values):.3f})"


class LossTable:
    jobs = 1
    out = "outputs/loss_table"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        parser.add_argument("--steps", type=int, default=40)
        parser.add_argument(
            "--rows",
            nargs="+",
            help=f"only these rows (of {', '.join(dict.fromkeys(row for row, _ in LOSS_GRID))}, and "
            f"{', '.join(set(VARIANTS) - {row for row, _ in LOSS_GRID})})",
        )

    def schedule(self, args: argparse.Namespace) -> tuple[int, int]:
        return args.steps, LOSS_TEST_FREQ

    def rows(self, args: argparse.Namespace) -> list[tuple[str, int]]:
        grid = [(row, s) for row, s in LOSS_GRID if not args.rows or row in args.rows]
        grid += [(row, 1) for row in args.rows or () if row not in {row for row, _ in LOSS_GRID}]
        if not grid or any(row not in VARIANTS and row not in {r for r, _ in LOSS_GRID} for row, _ in grid):
            raise ValueError(f"--rows {' '.join(args.rows)}: unknown row")
        return grid

    def trials(self, args: argparse.Namespace) -> dict[Hashable, Trial]:
        trials = {}
        for seed in args.seeds:
            for row, staleness in self.rows(args):
                loss, options = VARIANTS.get(row, (row, []))
                trials[row, staleness, seed] = Trial(
                    f"{row} s{staleness} seed {seed}",
                    loss_table_folder(args.out, row, staleness, seed),
                    "one_step_off_ppo_cpu",
                    seed,
                    (f"async_training.staleness={staleness}", f"{LOSS}={loss}", *options, *TOKEN_IS, WHOLE_BATCHES),
                )
        return trials

    def report(self, args: argparse.Namespace, measured: dict[Hashable, Measured]) -> None:
        curves = {key: run.curve for key, run in measured.items()}
        checkpoints = sorted(set.intersection(*(set(steps) for steps in curves.values())))
        seeds = ", ".join(map(str, args.seeds))
        extra = f"; overrides: {' '.join(args.overrides)}" if args.overrides else ""
        print(f"\nGreedy validation accuracy, mean (sd) over seeds {seeds}; {args.steps} steps{extra}:\n")
        print("| loss_mode | staleness | " + " | ".join(f"step {step}" for step in checkpoints) + " |")
        print("|---|---|" + "---|" * len(checkpoints))
        for loss, staleness in self.rows(args):
            row = [cell([curves[loss, staleness, seed][step] for seed in args.seeds]) for step in checkpoints]
            print(f"| `{loss}` | {staleness} | " + " | ".join(row) + " |")


GRIDS: dict[str, Grid] = {
    "staleness-parity": StalenessParity(),
    "partial-rollout": PartialRolloutLearning(),
    "loss-table": LossTable(),
}


def main(argv: list[str]) -> None:
    # The grid first: its own options join the parser (``--grid NAME --help`` lists them).
    chosen = argparse.ArgumentParser(add_help=False)
    chosen.add_argument("--grid")
    grid = GRIDS.get(chosen.parse_known_args(argv)[0].grid)
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--grid", choices=list(GRIDS), required=True, help="the grid to run")
    if grid is not None:
        grid.add_arguments(parser)
        parser.add_argument("--jobs", type=int, default=grid.jobs, help="runs at a time")
        parser.add_argument(
            "--out",
            type=Path,
            default=grid.out and Path(grid.out),
            help=f"a folder per run here (default: {grid.out or 'a temporary folder'})",
        )
    parser.add_argument("overrides", nargs="*", help="hydra overrides added to every run (after --)")
    args = parser.parse_args(argv)
    args.out = (args.out or Path(tempfile.mkdtemp(prefix=f"{args.grid}-"))).resolve()
    try:
        trials = grid.trials(args)
    except ValueError as error:
        parser.error(str(error))
    steps, test_freq = grid.schedule(args)
    grid.report(args, train_all(trials, steps, test_freq, args.jobs, tuple(args.overrides)))
