"""What a run prints and leaves in its trackers: the compact console line, and every logger finished."""

from __future__ import annotations

import pytest
from stub_trainer import EventLog, StubRollout, StubWeightSync, build_trainer, compose_config
from verl.utils.tracking import Tracking

from recipe.one_step_off_async.errors import ConfigError
from recipe.one_step_off_async.trainer.console import MAX_LINE_CHARS, console_line

STEPS = 3
STEP_METRICS = {
    "timing_s/step": 0.482,
    "timing_s/wait_prev_gen": 0.1,
    "timing_s/train": 0.351,
    "timing_s/sync_weights": 0.031,
    "timing_s/gen": 0.41,
    "async/staleness": 1,
    "async/partial_ratio": 0.0,
    "critic/score/mean": 0.5321,
    "response_length/mean": 64.6,
    **{f"actor/metric_{i}": 0.1 * i for i in range(200)},  # what verl's console line would also print
}


def test_the_line_shows_the_step_split_staleness_score_and_validation():
    line = console_line(12, 60, {**STEP_METRICS, "val-core/sort/reward/mean@1": 0.61, "val-aux/sort/x/std@1": 9.0})
    assert line == (
        "step 12/60 | 0.48s: wait 0.10 train 0.35 sync 0.03 | gen 0.41s | staleness 1 | score 0.532 | val 0.610 | len 65"
    )


def test_partial_rollout_shows_token_weighted_staleness_and_the_partial_share():
    partial = {"async/staleness_mean": 1.82, "async/staleness_min": 1, "async/staleness_max": 2}
    line = console_line(5, 30, {**STEP_METRICS, **partial, "async/staleness": 2, "async/partial_ratio": 0.26})
    assert "staleness 1.82 [1-2] partial 26%" in line


def test_the_line_keeps_to_its_width_by_dropping_the_least_important_fields():
    sources = {f"val-core/data_source_with_a_long_name_{i}/acc/mean@4": 0.5 for i in range(6)}
    line = console_line(1000, 100000, {**STEP_METRICS, **sources})
    assert len(line) <= MAX_LINE_CHARS
    assert line.startswith("step 1000/100000 | 0.48s") and "score 0.532" in line
    assert "val " not in line and "len " not in line  # the fields after the score did not fit
    assert console_line(0, 60, {"val-core/sort/reward/mean@1": 0.1}) == "step 0/60 | val 0.100"


def test_an_unknown_console_format_is_refused_by_name():
    from recipe.one_step_off_async.async_config import validate_config

    with pytest.raises(ConfigError, match="async_training.console='short' must be one of compact, verl"):
        validate_config(compose_config("async_training.console=short"))


def fit(*overrides: str, **rollout_kwargs):
    log = EventLog()
    rollout = StubRollout(log, **rollout_kwargs)
    config = compose_config("async_training.staleness=1", f"trainer.total_training_steps={STEPS}", *overrides)
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout))
    trainer.fit()
    return trainer


def test_the_console_backend_prints_one_short_line_per_step(capsys):
    fit("trainer.logger=[console]")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == [f"step {step}/{STEPS}" for step in range(1, STEPS + 1)]
    assert all(len(line) <= MAX_LINE_CHARS for line in lines), lines
    assert all(" | staleness " in line and " | score " in line for line in lines), lines


def test_verl_console_brings_verls_line_with_every_metric_back(capsys):
    fit("trainer.logger=[console]", "async_training.console=verl")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step:")]
    assert len(lines) == STEPS and all("timing_s/update_actor" in line for line in lines)


@pytest.fixture
def finished(monkeypatch) -> list[int]:
    """The exit codes Tracking.finish was called with."""
    exit_codes: list[int] = []
    original = Tracking.finish

    def finish(self, exit_code: int = 0) -> None:
        if not self._finished:
            exit_codes.append(exit_code)
        original(self, exit_code)

    monkeypatch.setattr(Tracking, "finish", finish)
    return exit_codes


def test_trackers_are_finished_when_the_run_ends(finished):
    fit("trainer.logger=[console]")
    assert finished == [0]


def test_trackers_are_finished_as_failed_when_the_run_fails(finished):
    with pytest.raises(ValueError, match="stub generation failed"):
        fit("trainer.logger=[console]", fail_at_step=2)
    assert finished == [1]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])  # Ctrl-C: in this process, in a Ray actor
def test_trackers_are_finished_as_failed_on_ctrl_c(finished, monkeypatch, interrupt):
    from stub_trainer import StubbedTrainer

    def interrupted(self, batch):
        raise interrupt()

    monkeypatch.setattr(StubbedTrainer, "_update_actor", interrupted)
    with pytest.raises(interrupt):
        fit("trainer.logger=[console]")
    assert finished == [1]


def test_a_tracker_that_cannot_finish_hides_neither_the_runs_error_nor_the_cleanup(monkeypatch, caplog):
    def unreachable(self, exit_code: int = 0) -> None:
        raise ConnectionError("wandb: network unreachable")

    monkeypatch.setattr(Tracking, "finish", unreachable)
    with pytest.raises(ValueError, match="stub generation failed"):
        fit("trainer.logger=[console]", fail_at_step=2)
    assert "Finishing the trackers of trainer.logger failed" in caplog.text
    fit("trainer.logger=[console]")  # a clean run ends cleanly too, the tracker's failure logged
