"""End-to-end runs of ``python -m recipe.one_step_off_async.main_ppo`` on CPU with the tiny task."""

from __future__ import annotations

from collections import Counter

import pytest
from e2e import run_main
from faults import failing_generation

pytestmark = pytest.mark.slow

STEPS = 4
REQUIRED_METRICS = (
    "timing_s/step",
    "timing_s/wait_prev_gen",
    "timing_s/sync_weights",
    "timing_s/update_actor",
    "timing_s/gen",
    "async/staleness",
    "async/overlap_efficiency",
    "critic/score/mean",
    "actor/pg_loss",
)


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_entry_point_trains_with_measured_staleness(tmp_path, demo_assets, staleness):
    run = run_main(
        tmp_path,
        f"async_training.staleness={staleness}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    )
    assert run.returncode == 0, run.output[-5000:]
    metrics = run.metrics
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step, values in metrics.items():
        missing = [key for key in REQUIRED_METRICS if key not in values]
        assert not missing, f"step {step} lacks {missing}"
        assert values["async/staleness"] == min(staleness, step - 1)
    assert metrics[STEPS]["async/staleness"] == staleness


def test_resume_continues_with_the_next_batch(tmp_path, demo_assets):
    common = ("async_training.staleness=1", "trainer.val_before_train=false", "trainer.test_freq=-1")
    full = run_main(tmp_path / "full", *common, "trainer.total_training_steps=5")
    assert full.returncode == 0, full.output[-5000:]

    checkpoints = tmp_path / "checkpoints"
    first = run_main(
        tmp_path / "first", *common, "trainer.total_training_steps=3", "trainer.save_freq=3", checkpoints=checkpoints
    )
    assert first.returncode == 0, first.output[-5000:]
    resumed = run_main(
        tmp_path / "resumed",
        *common,
        "trainer.total_training_steps=5",
        "trainer.resume_mode=auto",
        checkpoints=checkpoints,
    )
    assert resumed.returncode == 0, resumed.output[-5000:]

    assert sorted(resumed.metrics) == [4, 5]
    for step in (1, 2, 3):
        assert Counter(first.prompts(step)) == Counter(full.prompts(step))
    for step in (4, 5):
        assert Counter(resumed.prompts(step)) == Counter(full.prompts(step))


def test_generation_error_fails_the_run_with_the_original_exception(tmp_path, demo_assets):
    samples_per_batch = 16 * 4  # data.train_batch_size x rollout.n of the CPU profile
    overrides, env = failing_generation(tmp_path, fail_at_call=samples_per_batch + 1)  # batch 2's first sample
    run = run_main(
        tmp_path, *overrides, "trainer.total_training_steps=4", "trainer.val_before_train=false", env=env, timeout_s=300
    )
    assert run.returncode != 0
    assert "InjectedFault: generation failed on agent-loop call 65" in run.output
    assert run.seconds < 300
