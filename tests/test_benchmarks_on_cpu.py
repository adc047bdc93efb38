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
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks import BENCHMARKS, HELPERS, command_name, gloo_engine, learning
from benchmarks.__main__ import main as benchmarks_main
from recipe.one_step_off_async import runs

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
    ``test_freq`` steps, rising with the step (a little faster for a higher seed)."""
    started = []

    def launch(directory: Path, *overrides: str, profile: str, **_) -> runs.Run:
        started.append(overrides)
        directory.mkdir(parents=True)
        steps, every = override(overrides, "trainer.total_training_steps"), override(overrides, "trainer.test_freq")
        slope = 0.01 * (1 + override(overrides, "data.seed") / 10)
        score = f"val-core/{profile}/acc/mean@1"
        lines = [{"step": step, "data": {score: 0.3 + slope * step}} for step in range(0, steps + 1, every)]
        (directory / runs.METRICS).write_text("".join(json.dumps(line) + "\n" for line in lines))
        return runs.Run(0, 1.0, directory, "")

    monkeypatch.setattr(learning.runs, "run", launch)
    return started


@pytest.mark.parametrize(
    ("grid", "options", "trials", "report"),
    [
        # gain = final - step 0: 0.01 x 35 (seed 0) and 0.011 x 35 (seed 1), the same at staleness 0 and 1
        ("staleness-parity", ["--candidates", "token_is", "kimi15"], 8, "| `kimi15` | 0.368 | 0.368 | 1.00 | +0.000"),
        # gain = mean of steps 20 and 30 - step 0: 0.25 and 0.275, pooled SE sqrt(2 var / 2)
        (
            "partial-rollout",
            ["--tasks", "sort"],
            4,
            "sort: mean gain today +0.263, partial +0.263; partial - today +0.000, "
            "pooled SE 0.018: within 2 SE (2 seeds, 30 steps",
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


def test_a_learning_run_with_other_settings_is_launched_again(launches, tmp_path, capsys):
    command = ["--grid", "loss-table", "--rows", "topr", "--seeds", "0", "--steps", "20", "--out", str(tmp_path)]

    learning.main(command)
    learning.main([*command, "--", "actor_rollout_ref.actor.optim.lr=1e-3"])

    assert len(launches) == 2
    assert launches[1][-1] == "actor_rollout_ref.actor.optim.lr=1e-3"
    assert "measured with other settings" in capsys.readouterr().out


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
