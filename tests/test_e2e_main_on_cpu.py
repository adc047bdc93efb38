"""End-to-end runs of ``python -m recipe.one_step_off_async.main_ppo`` on CPU with the tiny task.

Each run checks several things at once (a run costs ~40 s of start-up on 2 cores): the shared
one-step-off run (conftest.py) is the reference of other tests; the resume test resumes from a
checkpoint in the middle of a sync interval; each carries one of the recipe's policy losses. The runs
of staleness 0 (``sync_interval`` 3, the ``checkpoint`` engine) and 2 are the elastic pool's runs
(test_elastic_on_cpu.py), which check the same contract while replicas are lost and added.
"""

from __future__ import annotations

from collections import Counter

import pytest
from e2e import (
    JOIN_RUN_LOSS,
    KILL_RUN_LOSS,
    ONE_STEP_OFF_LOSS,
    ONE_STEP_OFF_STEPS,
    RESUME_LOSS,
    assert_loss_ran,
    assert_trained_with_staleness,
    contract_version,
    loss_overrides,
    run_main,
)
from faults import failing_generation

from recipe.one_step_off_async.losses import LOSS_MODES

pytestmark = pytest.mark.slow


def test_every_recipe_loss_runs_end_to_end():
    losses = [ONE_STEP_OFF_LOSS, RESUME_LOSS, KILL_RUN_LOSS, JOIN_RUN_LOSS]
    assert sorted(losses) == sorted(LOSS_MODES)


def test_one_step_off_run_trains_with_measured_staleness(one_step_off_run):
    """The default (staleness 1, sync every step), with topr; the elastic tests compare against this run."""
    assert_trained_with_staleness(one_step_off_run, 1, 1, ONE_STEP_OFF_LOSS, ONE_STEP_OFF_STEPS)
    assert all("async/rollout_replicas" not in values for values in one_step_off_run.metrics.values())  # elastic off


def test_resume_in_the_middle_of_a_sync_interval_continues_with_the_next_batch(tmp_path, demo_assets):
    # Syncs after steps 2 and 4 (interval), and after the saves at 3 (mid-interval) and 5 (last step).
    common = (
        "async_training.staleness=1",
        "async_training.sync_interval=2",
        "trainer.save_freq=3",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *loss_overrides(RESUME_LOSS),
    )
    full = run_main(tmp_path / "full", *common, "trainer.total_training_steps=5")
    assert full.returncode == 0, full.output[-5000:]

    # As if the run had stopped right after its save at step 3.
    resumed = run_main(
        tmp_path / "resumed",
        *common,
        "trainer.total_training_steps=5",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / 'full' / 'checkpoints' / 'global_step_3'}",
    )
    assert resumed.returncode == 0, resumed.output[-5000:]

    assert sorted(resumed.metrics) == [4, 5]
    assert [full.metrics[step]["async/synced"] for step in range(1, 6)] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [full.metrics[step]["async/weight_version"] for step in range(1, 6)] == [0, 0, 0, 2, 3]
    for step in (4, 5):
        assert Counter(resumed.prompts(step)) == Counter(full.prompts(step))
        assert resumed.metrics[step]["async/synced"] == full.metrics[step]["async/synced"]
    # The save synced v3, so from step M+1+s = 5 on the versions are the uninterrupted run's; batch 4 was
    # in flight at the save and is regenerated with v3 (the resume contract, as with sync_interval 1).
    assert resumed.metrics[5]["async/weight_version"] == full.metrics[5]["async/weight_version"] == 3
    assert resumed.metrics[4]["async/weight_version"] == contract_version(4, 1, 2, start=3) == 3
    for step in range(1, 6):
        assert_loss_ran(full.metrics[step], RESUME_LOSS)


def test_generation_error_fails_the_run_with_the_original_exception(tmp_path, demo_assets):
    samples_per_batch = 16 * 4  # data.train_batch_size x rollout.n of the CPU profile
    overrides, env = failing_generation(tmp_path, fail_at_call=samples_per_batch + 1)  # batch 2's first sample
    run = run_main(
        tmp_path, *overrides, "trainer.total_training_steps=4", "trainer.val_before_train=false", env=env, timeout_s=300
    )
    assert run.returncode != 0
    assert "InjectedFault: generation failed on agent-loop call 65" in run.output
    assert run.seconds < 300
