"""The benchmarks (``python -m benchmarks``) keep working: each parses its options, the list names every one,
and the cheapest one measures end to end.

- ``--help`` of every benchmark (and of every grid of ``learning``) through its module's ``main`` in this
  process: importing the module is the check that it still imports, and a process per benchmark would pay a
  Python start and the recipe's imports each time. It exits 0 with the usage ``python -m benchmarks <name>``
  and the module's docstring.
- ``python -m benchmarks`` as a user runs it, in a subprocess: one line per benchmark.
- Every module of the package is a listed benchmark or a declared helper: a new benchmark cannot be missed
  by the list or by these tests.
- The learning grids end to end with the launch replaced by one that logs a made-up validation curve: each
  grid's trials, options and report fit together, and a cut grid resumes (a finished run with the same
  settings is not launched again; one with other settings is).
- ``gloo-engine`` with the smallest synthetic model (1 layer, hidden 64: 8 MB of bf16), one receiver, 1 MiB
  buckets (several per sync) and one repetition, receivers loading into their model: every line of its
  report, numbers as numbers, not their values (timings on a shared machine say nothing).
- ``weight-sync --dtype float32,bfloat16`` on the two smallest grid sizes, one receiver, one repetition: each
  size synced in both dtypes side by side, a line per size and dtype, the time ratio, and the JSON.
- ``compare-verl``'s settings for verl's V1 ``separate_async`` against what verl's code and config ask for (its
  batch and sync-step rule, the logging call that needs INFO off, the TransferQueue version), and the timers
  and metric keys it reads from V1; both of verl's trainers composed with its overrides roll out as the recipe's
  CPU profile does (vLLM's CPU build, its engine settings, gloo); ``partial-rollout --verl-v1``'s launch of V1 on the generation-bound profile
  (with the launch stubbed) and its summary.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from e2e import main_until_ray

import benchmarks
from benchmarks import (
    BENCHMARKS,
    HELPERS,
    command_name,
    compare_verl,
    gloo_engine,
    learning,
    partial_rollout,
    weight_sync,
)
from benchmarks.__main__ import main as benchmarks_main
from recipe.one_step_off_async import runs
from recipe.one_step_off_async.errors import RunFailed

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(?:-?[\d.]+|nan|inf)"


@pytest.mark.parametrize("module", BENCHMARKS)
def test_every_benchmark_prints_its_help(module, capsys):
    benchmark = importlib.import_module(f"benchmarks.{module}")

    with pytest.raises(SystemExit) as exited:
        benchmark.main(["--help"])

    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: python -m benchmarks {command_name(module)} ")
    assert benchmark.__doc__.splitlines()[0] in shown
    assert "python -m benchmarks " + command_name(module) in benchmark.__doc__  # its "How" names the command


@pytest.mark.parametrize("grid", learning.GRIDS)
def test_every_learning_grid_prints_its_options(grid, capsys):
    with pytest.raises(SystemExit) as exited:
        learning.main(["--grid", grid, "--help"])

    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "--seeds" in shown and "--jobs" in shown and "--out" in shown
    assert f"--grid {grid}" in learning.__doc__


def test_the_list_names_every_benchmark():
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout

    lines = [line.split() for line in listed.splitlines()[2:]]
    assert [line[0] for line in lines] == [command_name(module) for module in BENCHMARKS]
    for module, line in zip(BENCHMARKS, lines, strict=True):
        assert " ".join(line[1:]) == importlib.import_module(f"benchmarks.{module}").__doc__.splitlines()[0]


def test_an_unknown_benchmark_is_refused_with_the_list(capsys):
    assert benchmarks_main(["no-such-benchmark"]) == 2
    assert "overlap" in capsys.readouterr().err


def test_every_module_is_a_listed_benchmark_or_a_declared_helper():
    modules = {info.name for info in pkgutil.iter_modules(benchmarks.__path__)} - {"__main__"}

    assert modules == set(BENCHMARKS) | set(HELPERS)
    assert len(BENCHMARKS) == len(set(BENCHMARKS)) and not set(BENCHMARKS) & set(HELPERS)


def override(overrides: tuple[str, ...], key: str) -> int:
    return int(next(item.split("=", 1)[1] for item in overrides if item.startswith(f"{key}=")))


@pytest.fixture
def launches(monkeypatch) -> list[tuple[str, ...]]:
    """The learning grids' launches, each replaced by a run that logs a validation score at step 0 and every
    ``test_freq`` steps, rising with the step (a little faster for a higher seed), and steps of 2 s (3 s at
    staleness 0; 10 s where it validates)."""
    started = []

    def launch(directory: Path, *overrides: str, profile: str, **_) -> runs.Run:
        started.append(overrides)
        directory.mkdir(parents=True)
        steps, every = override(overrides, "trainer.total_training_steps"), override(overrides, "trainer.test_freq")
        slope = 0.01 * (1 + override(overrides, "data.seed") / 10)
        score = f"val-core/{profile}/acc/mean@1"
        step_s = 3.0 if "async_training.staleness=0" in overrides else 2.0
        lines = [{"step": step, "data": {"timing_s/step": step_s}} for step in range(1, steps + 1)]
        lines += [{"step": step, "data": {score: 0.3 + slope * step}} for step in range(0, steps + 1, every)]
        lines += [{"step": step, "data": {"timing_s/step": 10.0}} for step in range(every, steps + 1, every)]
        (directory / runs.METRICS).write_text("".join(json.dumps(line) + "\n" for line in lines))
        return runs.Run(0, 1.0, directory, "")

    monkeypatch.setattr(learning.runs, "run", launch)
    return started


@pytest.mark.parametrize(
    ("grid", "options", "trials", "report"),
    [
        # gain = final - step 0: 0.01 x 35 (seed 0) and 0.011 x 35 (seed 1), the same at staleness 0 and 1
        # steps/min 30 (s1) and 20 (s0), validating steps left out; gain per minute 0.3675 x 30 / 40 (s1)
        (
            "staleness-parity",
            ["--candidates", "token_is", "kimi15"],
            8,
            "| `kimi15` | 0.368 | 0.368 | 1.00 (0.00) | +0.000 (0.000) | +nan | 30.0 / 20.0 | 0.2756 / 0.1838 |",
        ),
        # gain = mean of steps 20 and 30 - step 0: 0.25 and 0.275, pooled SE sqrt(2 var / 2)
        (
            "partial-rollout",
            ["--tasks", "sort"],
            4,
            "sort: mean gain whole batches (s=1) +0.263, partial (s=1) +0.263; partial - whole +0.000, "
            "pooled SE 0.018: within 2 SE (2 seeds, 30 steps",
        ),
        (
            "partial-rollout",
            ["--tasks", "generation_bound", "--partial-staleness", "2"],
            4,
            "generation_bound: mean gain whole batches (s=1) +0.263, partial (s=2) +0.263",
        ),
        (
            "loss-table",
            ["--rows", "topr", "vanilla", "--steps", "20"],
            6,
            "| `vanilla` | 0 | 0.300 (0.000) | 0.405 (0.007) | 0.510 (0.014) |",
        ),
    ],
)
def test_a_learning_grid_trains_its_trials_and_resumes(grid, options, trials, report, launches, tmp_path, capsys):
    command = ["--grid", grid, "--seeds", "0", "1", "--out", str(tmp_path), *options]

    learning.main(command)
    first = capsys.readouterr().out
    learning.main(command)  # every run is on disk: nothing is launched again, the report is the same
    again = capsys.readouterr().out

    assert len(launches) == trials
    assert report in first
    assert again in first and again.strip()
    assert all(f"hydra.run.dir={tmp_path}" in " ".join(overrides) for overrides in launches)


def test_a_failed_learning_run_is_launched_once_more_and_a_second_failure_stops_the_grid(
    launches, monkeypatch, tmp_path, capsys
):
    fake = learning.runs.run
    failures = iter([True, False, True, True])  # the first run fails once, the second twice

    def failing_once(directory: Path, *overrides: str, **launch) -> runs.Run:
        run = fake(directory, *overrides, **launch)
        return runs.Run(1, 1.0, directory, "") if next(failures) else run

    monkeypatch.setattr(learning.runs, "run", failing_once)
    command = ["--grid", "loss-table", "--rows", "topr", "--steps", "20", "--out", str(tmp_path), "--seeds"]

    learning.main([*command, "0"])
    assert len(launches) == 2 and (tmp_path / "topr_s1_seed0.failed" / runs.METRICS).exists()
    assert "topr s1 seed 0: failed (exit 1" in capsys.readouterr().out
    with pytest.raises(RunFailed, match="topr s1 seed 1 failed with exit code 1"):
        learning.main([*command, "1"])
    assert len(launches) == 4


def test_a_learning_run_with_other_settings_is_launched_again_and_the_old_one_kept(launches, tmp_path, capsys):
    command = ["--grid", "loss-table", "--rows", "topr", "--seeds", "0", "--steps", "20", "--out", str(tmp_path)]

    learning.main(command)
    learning.main([*command, "--", "actor_rollout_ref.actor.optim.lr=1e-3"])

    assert len(launches) == 2
    assert launches[1][-1] == "actor_rollout_ref.actor.optim.lr=1e-3"
    assert "measured with other settings" in capsys.readouterr().out
    kept = json.loads((tmp_path / "topr_s1_seed0.other-settings" / learning.VALIDATION).read_text())
    assert "actor_rollout_ref.actor.optim.lr=1e-3" not in kept["overrides"]


@pytest.mark.slow  # two spawned ranks that import verl: ~15 s on 2 idle cores, more under load
def test_the_gloo_engine_benchmark_reports_every_line(capsys):
    gloo_engine.main(
        ["--receivers", "1", "--layers", "1", "--hidden-size", "64", "--bucket-mb", "1", "--reps", "1"]
        + ["--consumer", "load"]
    )

    lines = capsys.readouterr().out.splitlines()
    n = NUMBER
    expected = [
        rf"8 MB of bf16 weights in 1\+2 layers of tensors; 1 sender -> 1 receiver\(s\); bucket 1 MiB; consumer load; "
        rf"\d+ CPU cores; load average {n}",
        rf"rep 0: raw {n} GB/s \({n} CPU s\), raw, fresh {n} GB/s \({n} CPU s\), engine {n} GB/s "
        rf"\({n} CPU s\); engine group setup\+teardown \d+ ms",
        r"median over 1 reps:",
        rf"  raw +{n} GB/s +{n} CPU s per transfer",
        rf"  raw, fresh +{n} GB/s +{n} CPU s per transfer",
        rf"  engine +{n} GB/s +{n} CPU s per transfer",
        rf"  engine / raw = {n}, engine / raw fresh = {n}; group setup\+teardown \d+ ms",
        rf"  engine / raw per rep: median {n}, range {n}-{n}",
        rf"  engine / raw, fresh per rep: median {n}, range {n}-{n}",
        rf"  load average at the end {n}",
    ]
    assert len(lines) == len(expected), lines
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (pattern, line)


@pytest.mark.slow  # two spawned ranks that import verl: ~20 s on 2 idle cores, more under load
def test_the_weight_sync_benchmark_compares_dtypes_side_by_side(tmp_path, capsys):
    """``--dtype float32,bfloat16`` on the two smallest grid sizes, one repetition: a line per size and dtype, the
    later dtype's with its time ratio to the first, half the bytes; the fit and phases per dtype; the JSON too."""
    out = tmp_path / "sync.json"
    weight_sync.main(
        ["--receivers", "1", "--reps", "1", "--max-params", "0.5e6", "--keep-group", "on"]
        + ["--dtype", "float32,bfloat16", "--json", str(out)]
    )

    lines = capsys.readouterr().out.splitlines()
    n = NUMBER
    sizes = [line for line in lines if re.fullmatch(rf" +{n}M params \w+ +{n} MB:  kept .*", line)]
    assert [line.split()[2] for line in sizes] == ["float32", "bfloat16"] * 2, lines
    for fp32, bf16 in zip(sizes[::2], sizes[1::2], strict=True):
        assert "/" not in fp32 and re.search(rf"  bfloat16/float32 {n}$", bf16), (fp32, bf16)
        assert float(bf16.split()[3]) == pytest.approx(float(fp32.split()[3]) / 2, abs=0.1)  # MB
    assert [line.split()[2] for line in lines if line.startswith("  group kept ")] == ["float32", "bfloat16"]
    assert "  group kept, bfloat16: median of 1 syncs" in lines
    summary = json.loads(out.read_text())
    assert summary["dtypes"] == ["float32", "bfloat16"] and list(summary["groups"]) == ["kept"]
    fp32, bf16 = (summary["groups"]["kept"][dtype]["sizes"] for dtype in summary["dtypes"])
    assert [size["bytes"] for size in bf16] == [size["bytes"] // 2 for size in fp32]
    assert all(size["time_ratio_to_first_dtype"] > 0 for size in bf16)
    assert all("time_ratio_to_first_dtype" not in size for size in fp32)


def test_the_weight_sync_benchmark_refuses_an_unknown_dtype(capsys):
    with pytest.raises(SystemExit):
        weight_sync.main(["--dtype", "float32,bf16"])
    assert "distinct torch dtypes" in capsys.readouterr().err


def test_the_share_of_gain_and_its_paired_standard_error():
    # r = 0.6 / 0.8 = 0.75; residuals g1 - r g0: 0.1 - 0.15, 0.3 - 0.3, 0.2 - 0.15 = -0.05, 0, 0.05
    share, se = learning.share_of_gain([0.1, 0.3, 0.2], [0.2, 0.4, 0.2])
    assert share == pytest.approx(0.75)
    assert se == pytest.approx((0.005 / 6) ** 0.5 / (0.8 / 3))
    assert learning.share_of_gain([0.2, 0.4], [0.1, 0.2]) == pytest.approx((2.0, 0.0))  # s1 exactly twice s0


def test_the_pace_of_a_run_leaves_out_the_pipelines_fill_its_last_step_and_validations():
    metrics = {step: {"timing_s/step": 1.0} for step in range(1, 11)}
    metrics[1]["timing_s/step"] = metrics[2]["timing_s/step"] = metrics[10]["timing_s/step"] = 50.0
    metrics[5] |= {"timing_s/step": 30.0, "val-core/task/acc/mean@1": 0.5}
    metrics[6]["timing_s/step"] = metrics[6]["timing_s/sync_weights"] = 175.0  # a stalled sync: the median holds
    assert learning.steps_per_minute(metrics, 10) == pytest.approx(60.0)
    assert learning.stalled_syncs(metrics) == [6]
    with pytest.raises(ValueError, match="no steady training step"):
        learning.steps_per_minute({1: {"timing_s/step": 1.0}}, 2)


def test_the_parity_grid_runs_a_tasks_own_overrides_in_every_mode(launches, tmp_path):
    learning.main(
        ["--grid", "staleness-parity", "--tasks", "graded_fast", "--candidates", "token_is", "partial"]
        + ["--seeds", "0", "--out", str(tmp_path)]
    )

    assert len(launches) == 3  # s0, s1 and s1 with partial rollout
    assert all("actor_rollout_ref.actor.optim.lr=3e-4" in overrides for overrides in launches)
    modes = {
        (override(overrides, "async_training.staleness"), "async_training.partial_rollout=true" in overrides)
        for overrides in launches
    }
    assert modes == {(0, False), (1, False), (1, True)}


def test_every_trial_of_the_parity_grid_passes_the_launch_checks():
    """Every task in both modes at both stalenesses, and every candidate on one task, pass the launch's config and
    loss checks (a mini-batch its micro-batch does not divide, a loss in bypass mode: refused here, not an hour into
    a grid)."""
    from hydra import compose, initialize_config_module

    from recipe.one_step_off_async.async_config import config_problems
    from recipe.one_step_off_async.losses import policy_loss_problems

    def trials(tasks: list[str], candidates: list[str]) -> dict:
        args = argparse.Namespace(tasks=tasks, candidates=candidates, seeds=[0], out=Path("unused"))
        return learning.StalenessParity().trials(args)

    trials = trials(list(learning.PARITY_TASKS), ["token_is", "partial"]) | trials(
        ["binary"], list(learning.CANDIDATES)
    )
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        for trial in trials.values():
            config = compose(config_name=trial.profile, overrides=list(trial.overrides))
            assert not (config_problems(config) + policy_loss_problems(config)).problems, trial.label
    # A staleness-1 run names its mode and whether it rolls out partially: it keeps its meaning (and the grid its
    # stored runs) whichever the default is.
    for (_, _, staleness, _), trial in trials.items():
        named = {override.split("=")[0] for override in trial.overrides}
        assert staleness == 0 or {"async_training.partial_rollout", f"{learning.CORRECTION}.bypass_mode"} <= named


def test_the_partial_rollout_grid_runs_whole_batches_at_staleness_1_and_partial_at_the_staleness_asked(
    launches, tmp_path
):
    grid = ["--grid", "partial-rollout", "--tasks", "generation_bound", "--partial-staleness", "2"]
    learning.main([*grid, "--seeds", "0", "--out", str(tmp_path)])

    modes = {
        (override(overrides, "async_training.staleness"), "async_training.partial_rollout=true" in overrides)
        for overrides in launches
    }
    assert modes == {(1, False), (2, True)}


# --- the partial-rollout benchmark's arithmetic -------------------------------------------------------------


def test_the_partial_rollout_bound_follows_from_todays_split():
    # T = 1.2 s, w = 0.65 s (A = 0.55 s), S = 0.05 s, G = 1.12 s: the engines sample A - S = 0.5 s per step while
    # the actor works, so at s=1 the wait shrinks to (1.12 - 0.5) / 2, at s=2 to (1.12 - 1.0) / 3, and at s=4 the
    # actor's own time bounds the step.
    today = partial_rollout.StepSplit(period_s=1.2, wait_s=0.65, sync_s=0.05, gen_s=1.12)
    assert today.actor_s == pytest.approx(0.55)
    assert partial_rollout.partial_gain_bound(today, 1) == pytest.approx(1.2 / (0.55 + 0.31))
    assert partial_rollout.partial_gain_bound(today, 2) == pytest.approx(1.2 / (0.55 + 0.04))
    assert partial_rollout.partial_gain_bound(today, 4) == pytest.approx(1.2 / 0.55)
    # Where training bounds the step (no wait), nothing is left to gain.
    training_bound = partial_rollout.StepSplit(period_s=1.0, wait_s=0.0, sync_s=0.05, gen_s=0.9)
    assert partial_rollout.partial_gain_bound(training_bound, 2) == pytest.approx(1.0)


def test_a_batch_gets_its_engine_time_around_the_syncs():
    syncs = [(1.0, 1.5), (3.0, 3.2)]
    assert partial_rollout.engine_time_done(0.0, 0.8, syncs) == pytest.approx(0.8)  # done before the first sync
    assert partial_rollout.engine_time_done(0.0, 2.0, syncs) == pytest.approx(2.5)  # 1.0 before it, 1.0 after
    assert partial_rollout.engine_time_done(0.5, 2.5, syncs) == pytest.approx(3.7)  # 0.5 + 1.5 + 0.5
    assert partial_rollout.engine_time_done(1.2, 0.1, syncs) == pytest.approx(1.6)  # admitted during a sync


def timed_steps(batches: list[tuple[float, float, float]]) -> dict[int, dict]:
    """Metrics of a whole-batch-mode run whose step k trains a batch of generation time G, the actor's own time and
    sync as given (G, own, sync), each step T = max(own, next batch's G) + sync, as the replay assumes."""
    by_step, start = {}, 0.0
    for step, (gen, own, sync) in enumerate(batches, start=1):
        following = batches[step][0] if step < len(batches) else 0.0
        period = max(own, following) + sync
        by_step[step] = {
            "timeline/step_start": start,
            "timeline/sync_start": start + period - sync,
            "timeline/sync_end": start + period,
            "timing_s/wait_prev_gen": period - own - sync,
            "timing_s/gen": gen,
        }
        start += period
    return by_step


def test_the_bound_per_batch_is_the_mean_split_bound_when_every_batch_generates_alike():
    by_step = timed_steps([(1.12, 0.5, 0.05)] * 40)
    bounds = partial_rollout.per_batch_bounds(by_step, warmup=9, staleness_values=[1, 2, 4])
    today = partial_rollout.StepSplit(period_s=1.17, wait_s=0.62, sync_s=0.05, gen_s=1.12)

    assert bounds["measured_step_s"] == pytest.approx(1.17) and bounds["replayed_step_s"] == pytest.approx(1.17)
    for staleness in (1, 2, 4):
        assert bounds[f"bound_s{staleness}"] == pytest.approx(partial_rollout.partial_gain_bound(today, staleness))


def test_the_bound_per_batch_leaves_out_what_the_tail_batches_cannot_give():
    # Batches alternate G = 2.0 s and 0.2 s (mean 1.1 s); the actor's own time is 0.5 s and the sync 0.05 s. Today:
    # steps of 2.05 s and 0.55 s, 1.3 s on average. Partial rollout at s=2: a long batch admitted after steps
    # without waits gets 2 x 0.55 - 2 x 0.05 = 1.0 s of engine time before its step, so the actor waits 1.0 s; the
    # next long batch's window holds that wait and needs none. So one wait of 1.0 s every 4 steps: T' = 0.8 s and
    # the bound is 1.3 / 0.8, where the mean split gives 0.55 + (1.1 - 2 x 0.5) / 3 = 0.583 s (2.23x).
    by_step = timed_steps([(2.0, 0.5, 0.05), (0.2, 0.5, 0.05)] * 21)
    bounds = partial_rollout.per_batch_bounds(by_step, warmup=9, staleness_values=[2])  # steps 10-41: 8 x 4
    today = partial_rollout.StepSplit(period_s=1.3, wait_s=0.75, sync_s=0.05, gen_s=1.1)

    assert bounds["measured_step_s"] == pytest.approx(1.3) and bounds["replayed_step_s"] == pytest.approx(1.3)
    assert bounds["bound_s2"] == pytest.approx(1.3 / 0.8)
    assert partial_rollout.partial_gain_bound(today, 2) == pytest.approx(1.3 / (0.55 + 0.1 / 3))


def test_the_replay_check_shows_a_run_the_replay_does_not_describe():
    by_step = timed_steps([(1.12, 0.5, 0.05)] * 40)
    for step, metrics in by_step.items():  # every step waits 0.1 s more than its next batch needs
        metrics["timeline/step_start"] += 0.1 * (step - 1)
        metrics["timing_s/wait_prev_gen"] += 0.1
        metrics["timeline/sync_start"] += 0.1 * step
        metrics["timeline/sync_end"] += 0.1 * step

    bounds = partial_rollout.per_batch_bounds(by_step, warmup=9, staleness_values=[2])

    assert bounds["measured_step_s"] == pytest.approx(1.27) and bounds["replayed_step_s"] == pytest.approx(1.17)


def test_the_partial_rollout_summary_reads_the_steady_steps():
    def step(start: float, **values: float) -> dict:
        return {
            "timeline/step_start": start,
            "timeline/sync_end": start + 1.0,
            "timing_s/wait_prev_gen": 0.5,
            "timing_s/train": 0.4,
            "timing_s/sync_weights": 0.1,
            "timing_s/sync/abort": 0.01,
            "timing_s/gen": 1.1,
            "rollout/tokens": 320.0,
            "rollout/slot_steps": 3200.0,  # 100 engine steps of 32 slots, 3.2 rows each
            "async/staleness_mean": 1.0,
            "async/partial_ratio": 0.0,
            "async/recomputed_prefill_tokens": 0.0,
            **values,
        }

    by_step = {k: step(float(k)) for k in range(1, 6)}
    summary = partial_rollout.summarize(by_step, warmup=1, slots=32)  # steps 2-4: step 5 has nothing to generate

    assert summary["steps_per_min"] == pytest.approx(60 * 3 / 3.0)
    assert summary["wait_s"] == pytest.approx(0.5) and summary["gen_s"] == pytest.approx(1.1)
    assert summary["occupancy"] == pytest.approx(0.1) and summary["rows_per_engine_step"] == pytest.approx(3.2)
    without_statistics = {k: step(float(k), **{"rollout/slot_steps": 0.0}) for k in range(1, 6)}
    with pytest.raises(SystemExit, match="disable_log_stats=false"):  # vLLM kept no scheduler statistics
        partial_rollout.summarize(without_statistics, warmup=1, slots=32)


def test_the_partial_rollout_report_prints_the_bounds_and_the_targets(capsys):
    today = {
        "steps_per_min": 50.0, "step_s": 1.2, "wait_s": 0.65, "train_s": 0.45, "sync_s": 0.05, "abort_s": 0.004,
        "gen_s": 1.12, "occupancy": 0.09, "rows_per_engine_step": 2.9, "staleness_mean": 1.0, "partial_ratio": 0.0,
        "recomputed_prefill": 0.0,
    }  # fmt: skip
    gains = {"s1 partial": 1.1, "s2 partial": 1.6, "s4 partial": 1.4}
    medians = {"s1": today} | {mode: today | {"steps_per_min": 50.0 * gain} for mode, gain in gains.items()}
    batch_bounds = {"bound_s1": 1.2, "bound_s2": 2.0, "bound_s4": 2.4, "measured_step_s": 1.2, "replayed_step_s": 1.19}
    # Three rounds each: the gain is the median of the rounds' ratios, not the ratio of the medians.
    round_gains = {"s1": [1.0] * 3, "s1 partial": [1.1] * 3, "s2 partial": [1.2, 1.6, 1.7], "s4 partial": [1.4] * 3}

    partial_rollout.report(medians | {"s2 partial": today | {"steps_per_min": 70.0}}, batch_bounds, round_gains)

    shown = capsys.readouterr().out
    assert "step 1.20 s = actor 0.55 s + wait 0.65 s (54% of the step: generation-bound)" in shown
    assert "a 1.19 s step against 1.20 s measured" in shown
    mean_split = 1.2 / 0.59  # s=2, as in the test of the bound
    assert (
        "s2 partial: steps/min x1.60 (rounds: x1.20, x1.60, x1.70; bound per batch x2.00, 0.80 of it; from the mean "
        f"split x{mean_split:.2f}, {1.6 / mean_split:.2f} of it)" in shown
    )
    assert (
        f"s2 partial: x1.60 >= x1.3: met; 0.80 of the bound per batch >= 0.75: met ({1.6 / mean_split:.2f} of the "
        "bound from the mean split)" in shown
    )
    assert "s4 partial: x1.40 >= x1.5: NOT met" in shown


def test_the_generation_bound_profile_passes_the_launch_checks_with_cheap_training_at_8_samples_a_step(demo_assets):
    """What the benchmark compares on ``one_step_off_ppo_cpu_generation_bound``, as the launch composes it: 8 samples
    per step, one optimizer update, no reference model, verl's bypass mode (no recomputation of the old log-probs),
    dynamic micro-batches; its headline mode (partial rollout, s=2) with the benchmark's vLLM settings passes every
    check before Ray starts. Its training settings run end to end in the partial-rollout resume
    (test_e2e_partial_on_cpu.py)."""
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.utils import need_reference_policy

    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        profile = compose(config_name=partial_rollout.PROFILE)
    assert profile.data.train_batch_size * profile.actor_rollout_ref.rollout.n == 8
    actor = profile.actor_rollout_ref.actor
    assert actor.ppo_mini_batch_size == profile.data.train_batch_size and actor.ppo_epochs == 1
    assert actor.use_dynamic_bsz and not need_reference_policy(profile)
    assert profile.algorithm.rollout_correction.bypass_mode
    headline = ("async_training.staleness=2", "async_training.partial_rollout=true")
    with pytest.raises(AssertionError, match="starting Ray"):
        main_until_ray(*headline, *partial_rollout.VLLM_SETTINGS, profile=partial_rollout.PROFILE)


def test_the_heavy_tail_overrides_for_a_gpu_profile_match_the_generation_bound_profile(demo_assets):
    """``heavy_tail_task`` copies the CPU profile's task and training keys for a GPU profile: the copy must not drift."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        profile = compose(config_name=partial_rollout.PROFILE)
    for item in partial_rollout.heavy_tail_task():
        key, value = item.split("=", 1)
        assert str(OmegaConf.select(profile, key)).lower() == value.lower(), item


def test_compare_verl_gives_verls_v1_separate_async_what_its_set_up_asks_for():
    """What the benchmark works around in verl 0.9.1's V1 ``separate_async`` (its module docstring), read from
    verl's own code and config, so that a verl upgrade that changes it shows here."""
    import importlib.metadata

    import verl
    from hydra import compose, initialize_config_module
    from packaging.requirements import Requirement

    # Read, not imported: V1's modules import TransferQueue, which the recipe's environment lacks.
    v1 = Path(verl.__file__).parent / "trainer" / "ppo" / "v1"
    source = (v1 / "trainer_separate_async.py").read_text()
    assert any(  # logging's TypeError wherever INFO is on: why the runs set VERL_LOGGING_LEVEL=WARN
        isinstance(node, ast.Call)
        and ast.unparse(node.func) == "logger.info"
        and any(keyword.arg == "flush" for keyword in node.keywords)
        for node in ast.walk(ast.parse(source))
    )
    assert "assert train_batch_size == parameter_sync_step * ppo_mini_batch_size" in source
    wanted = [Requirement(r) for r in importlib.metadata.requires("verl") if r.startswith("TransferQueue")]
    (pinned,) = Requirement(compare_verl.TRANSFER_QUEUE).specifier
    assert pinned.operator == "==" and [r.specifier.contains(pinned.version) for r in wanted] == [True]
    # The timers and metrics the benchmark reads (verl's file logger prefixes timers with timing_s/).
    timers = {
        f'marked_timer("{key.removeprefix("timing_s/")}"' for key in compare_verl.STEP_PARTS[compare_verl.VERL_V1]
    }
    v1_code = source + (v1 / "trainer_base.py").read_text()
    assert all(timer in v1_code for timer in timers)
    assert all(f'"{key}"' in v1_code for key in compare_verl.STALENESS[compare_verl.VERL_V1])
    assert f'"{compare_verl.V1_EVICTED}"' in (v1 / "utils.py").read_text()  # verl's keys summed over a step

    overrides = [o for o in compare_verl.TRAINERS[compare_verl.VERL_V1][2] if not o.startswith("hydra.")]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert config.trainer.v1.trainer_mode == "separate_async"
    sync_step = config.trainer.v1.separate_async.parameter_sync_step
    assert config.data.train_batch_size == sync_step * config.actor_rollout_ref.actor.ppo_mini_batch_size
    assert config.actor_rollout_ref.hybrid_engine is False  # rollout on its own pool only
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "gloo"


# Where each of verl's trainers compared finds its own config (its module's hydra main): folder in verl, name.
VERL_CONFIGS = {
    compare_verl.VERL_ONE_STEP_OFF: ("experimental/one_step_off_policy/config", "one_step_off_ppo_trainer"),
    compare_verl.VERL_V1: ("trainer/config", "ppo_trainer"),
}


@pytest.mark.parametrize("trainer", list(VERL_CONFIGS))
def test_compare_verl_runs_verls_trainers_on_vllms_cpu_build_as_the_recipes_cpu_layout_does(trainer):
    """verl's trainers compose the benchmark's overrides from their own YAML into the rollout the recipe's CPU
    profile runs: vLLM's CPU build with the same engine settings, fed by gloo, with the same buckets and slots."""
    import verl
    from hydra import compose, initialize_config_dir, initialize_config_module
    from omegaconf import OmegaConf

    folder, name = VERL_CONFIGS[trainer]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / folder), version_base=None):
        config = compose(config_name=name, overrides=compare_verl.TRAINERS[trainer][2])
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        recipe = compose(config_name="one_step_off_ppo_cpu")

    assert config.trainer.device == "cpu" and config.actor_rollout_ref.rollout.name == "vllm"
    keys = [override.lstrip("+").split("=", 1)[0] for override in compare_verl.VLLM_ON_CPU]
    keys += [f"actor_rollout_ref.rollout.{key}" for key in ("checkpoint_engine.backend", "max_num_seqs")]
    keys += ["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"]
    for key in keys:
        assert OmegaConf.select(config, key) == OmegaConf.select(recipe, key), key


def test_partial_rollout_summarizes_verl_v1_from_the_wall_clock():
    v1 = compare_verl.V1_STALENESS
    by_step = {
        step: {
            "timing_s/gen": 0.5, "timing_s/update_actor": 0.3, "timing_s/update_weights": 0.05,
            f"{v1}/mean": 1.0, f"{v1}/max": step % 3, partial_rollout.V1_SPANS: 1.25,
            **({compare_verl.V1_EVICTED: 4.0} if step == 3 else {}),
            **({"timing_s/gen": 2.0} if step == 4 else {}),  # a step that waited one poll of V1's replay buffer
        }
        for step in range(1, 7)
    }  # fmt: skip
    logged_at = {1: 10.0, 2: 11.0, 3: 13.0, 4: 13.5, 5: 15.0, 6: 16.0}

    summary = partial_rollout.summarize_verl_v1(by_step, logged_at, warmup=2)  # steps 3-5: 6 has nothing to generate

    assert summary["step_s"] == pytest.approx((15.0 - 11.0) / 3)  # from the end of step 2 to the end of step 5
    assert summary["steps_per_min"] == pytest.approx(60 * 3 / 4.0)
    assert (summary["wait_s"], summary["update_s"], summary["sync_s"]) == pytest.approx((1.0, 0.3, 0.05))
    assert summary["staleness_max"] == 2 and summary["versions_per_trajectory"] == pytest.approx(1.25)
    assert summary["groups_dropped"] == 4.0
    assert summary["polled_share"] == pytest.approx(1 / 3)  # step 4 waited a poll interval


def test_partial_rollout_launches_verl_v1_on_the_same_profile_as_its_code_asks(demo_assets, tmp_path, monkeypatch):
    """``--verl-v1``: verl's V1 trainer composes the generation-bound profile with its ``separate_async`` settings,
    every demo asset path resolved for its Ray worker, its client told to resume what a sync aborts, the profile's
    folder named last; the wall clock read from when each step's line reaches the metrics file. verl's code is
    read for what the benchmark and the docs say of it."""
    import verl
    from omegaconf import OmegaConf

    verl_root = Path(verl.__file__).parent
    client = (verl_root / "workers" / "rollout" / "llm_server.py").read_text()
    assert "not self.config.async_training.partial_rollout:\n                should_retry = False" in client
    v1 = verl_root / "trainer" / "ppo" / "v1"
    assert f'"{partial_rollout.V1_SPANS}"' in (v1 / "trainer_base.py").read_text()
    assert f"poll_interval: float = {partial_rollout.V1_POLL_S}," in (v1 / "replay_buffer.py").read_text()
    assert "await asyncio.sleep(1)" in client  # the docs: it waits 1 s before it resubmits an aborted request

    extra = list(partial_rollout.VLLM_SETTINGS)
    assets = partial_rollout.resolved_demo_assets(partial_rollout.PROFILE, extra)
    keys = {item.split("=", 1)[0] for item in assets}
    assert {
        "actor_rollout_ref.model.path",
        "data.train_files",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path",
    } <= keys
    assert all(Path(item.split("=", 1)[1]).exists() for item in assets)
    config = partial_rollout.compose_profile(
        partial_rollout.PROFILE, [*assets, *partial_rollout.VERL_V1_OVERRIDES, *extra]
    )
    assert partial_rollout.DEMO_ASSET not in OmegaConf.to_yaml(config)  # nothing left for a Ray worker to resolve
    assert config.trainer.v1.trainer_mode == "separate_async" and config.async_training.partial_rollout
    sync_step = config.trainer.v1.separate_async.parameter_sync_step
    assert config.data.train_batch_size == sync_step * config.actor_rollout_ref.actor.ppo_mini_batch_size

    launched = {}

    class Launch:
        def wait(self, timeout_s=None, while_running=None):
            with (tmp_path / "run" / runs.METRICS).open("w") as metrics:
                for step in (1, 2, 3):
                    line = json.dumps({"step": step, "data": {"timing_s/step": 1.0}}) + "\n"
                    metrics.write(line[:9])  # half a line, as the reader may find it while the logger writes
                    metrics.flush()
                    while_running()
                    metrics.write(line[9:])
                    metrics.flush()
                    while_running()
            return runs.Run(0, 1.0, tmp_path / "run", "")

    def start(directory, *overrides, profile, env, module):
        directory.mkdir(parents=True)
        launched.update(overrides=overrides, profile=profile, env=env, module=module)
        return Launch()

    monkeypatch.setattr(runs, "start", start)
    monkeypatch.setattr(compare_verl, "transfer_queue_path", lambda: tmp_path / "transfer_queue")
    by_step, logged_at = partial_rollout.run_verl_v1(tmp_path / "run", partial_rollout.PROFILE, 60, extra)

    assert launched["module"] == "verl.trainer.main_ppo" and launched["profile"] == partial_rollout.PROFILE
    assert launched["overrides"][-1] == partial_rollout.PROFILES_DIR_OPTION  # after every override, for hydra's parser
    assert "trainer.total_training_steps=60" in launched["overrides"] and set(assets) <= set(launched["overrides"])
    assert launched["env"]["VERL_LOGGING_LEVEL"] == "WARN"
    assert str(tmp_path / "transfer_queue") in launched["env"]["PYTHONPATH"]
    assert sorted(by_step) == sorted(logged_at) == [1, 2, 3]
    assert logged_at[1] <= logged_at[2] <= logged_at[3]


def test_partial_rollout_reports_each_mode_against_verl_v1_round_by_round(capsys):
    v1 = {
        "steps_per_min": 30.0, "step_s": 2.0, "wait_s": 1.2, "update_s": 0.4, "sync_s": 0.1, "staleness_mean": 1.0,
        "staleness_max": 2, "versions_per_trajectory": 1.2, "groups_dropped": 0.0, "polled_share": 0.5,
    }  # fmt: skip
    v1_runs = [v1, v1 | {"steps_per_min": 40.0}, v1 | {"steps_per_min": 20.0}]
    results = {"s1": [{"steps_per_min": 45.0}] * 3, "s2 partial": [{"steps_per_min": 60.0}] * 3}

    partial_rollout.report_verl_v1(v1_runs, results)

    shown = capsys.readouterr().out
    assert f"{compare_verl.VERL_V1} (the same profile): 30.0 steps/min, step 2.00 s" in shown
    assert "s2 partial x2.00 (rounds: x2.00, x1.50, x3.00)" in shown  # each round against V1's run of that round
    assert "50% of its steps waited 2 s or more for their batch" in shown
