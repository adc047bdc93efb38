"""End-to-end runs of ``python -m recipe.one_step_off_async.main_ppo`` on CPU with the tiny task.

Each run checks several things at once (a run costs ~40 s of start-up on 2 cores), and each carries
one of the recipe's policy losses. Here: the shared one-step-off run (conftest.py, the topr loss and
verl's dapo reward manager), the reference of the runs that are disturbed. The others: the resume chain (test_e2e_faults_on_cpu.py:
Ctrl-C, an actor killed, resumed from a checkpoint in the middle of a sync interval; the kimi15 loss)
and the elastic pool's runs of staleness 0 (``sync_interval`` 3, the ``checkpoint`` engine, reinforce)
and 2 (tis_pg) in test_e2e_elastic_on_cpu.py, which check the same contract while replicas are lost
and added.
"""

from __future__ import annotations

import json
import re

import pytest
from e2e import (
    JOIN_RUN_LOSS,
    KILL_RUN_LOSS,
    ONE_STEP_OFF_LOSS,
    ONE_STEP_OFF_STEPS,
    RESUME_LOSS,
    assert_trained_with_staleness,
    wandb_offline_run,
)

from recipe.one_step_off_async.losses import LOSS_MODES
from recipe.one_step_off_async.trainer.console import MAX_LINE_CHARS

pytestmark = pytest.mark.e2e


def test_every_recipe_loss_runs_end_to_end():
    losses = [ONE_STEP_OFF_LOSS, RESUME_LOSS, KILL_RUN_LOSS, JOIN_RUN_LOSS]
    assert sorted(losses) == sorted(LOSS_MODES)


def test_one_step_off_run_trains_with_measured_staleness(one_step_off_run):
    """The default (staleness 1, sync every step), with topr; the disturbed runs compare against this run."""
    assert_trained_with_staleness(one_step_off_run, 1, 1, ONE_STEP_OFF_LOSS, ONE_STEP_OFF_STEPS)
    assert all("async/rollout_replicas" not in values for values in one_step_off_run.metrics.values())  # elastic off
    # Exact weights through the gloo engine (the CPU profile's): the batch of step 1 was sampled with v0, which the
    # actor holds at step 1; the probabilities differ by the rounding of two fp32 forwards (7e-7 to 1e-6 measured).
    assert one_step_off_run.metrics[1]["training/rollout_probs_diff_max"] < 1e-5


def test_the_dapo_reward_manager_scored_the_batches(one_step_off_run):
    penalties = []
    for step in range(1, ONE_STEP_OFF_STEPS + 1):
        samples = [json.loads(line) for line in (one_step_off_run.directory / "rollouts" / f"{step}.jsonl").open()]
        assert all("overlong_reward" in sample for sample in samples), f"step {step}"
        penalties += [sample["overlong_reward"] for sample in samples]
    # Its overlong penalty: 0 within 4 tokens, down to -1 at the 6-token limit.
    assert all(-1.0 <= penalty <= 0.0 for penalty in penalties) and min(penalties) < 0


def test_one_step_off_run_prints_one_short_console_line_per_step(one_step_off_run):
    # Ray prefixes the actor's output with a colored "(OneStepOffTaskRunner pid=...) ".
    lines = re.findall(r"step \d+/\d+ \| .*", one_step_off_run.output)
    assert [line.split(" | ")[0] for line in lines] == [f"step {k}/{ONE_STEP_OFF_STEPS}" for k in range(1, 9)]
    assert all(len(line) <= MAX_LINE_CHARS and " | staleness " in line for line in lines), lines
    assert "step:1 - " not in one_step_off_run.output  # verl's line with every metric is gone from the console


def test_one_step_off_run_leaves_a_finished_offline_wandb_run_with_every_step(one_step_off_run):
    exit_code, history = wandb_offline_run(one_step_off_run.directory)
    assert exit_code == 0  # wandb recorded the run as finished, not cut off
    assert "Traceback" not in one_step_off_run.output  # nor a teardown error after it
    assert sorted(history) == list(range(1, ONE_STEP_OFF_STEPS + 1))
    for step, row in history.items():
        assert {"async/staleness", "async/overlap_efficiency", "timing_s/step", "timing_s/sync_weights"} <= set(row)
        assert row["async/staleness"] == one_step_off_run.metrics[step]["async/staleness"]
