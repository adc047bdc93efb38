"""End-to-end runs of ``python -m recipe.one_step_off_async.main_ppo`` on CPU with the tiny task.

Each run checks several things at once (a run costs ~40 s of start-up on 2 cores): the staleness
runs also cover ``sync_interval``, the ``checkpoint`` weight-sync backend and the recipe's policy
losses; the resume test resumes from a checkpoint in the middle of a sync interval, with ``kimi15``.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from e2e import run_main
from faults import failing_generation

from recipe.one_step_off_async.policy_losses import LOSS_MODES

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
    "rollout_corr/rollout_is_mean",  # the off-policy correction ran (verl skips it silently otherwise)
    "perf/throughput",
)
CHECKPOINT_ENGINE = (
    "actor_rollout_ref.rollout.checkpoint_engine.backend=checkpoint",
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.one_step_off_async.file_checkpoint_engine",
)


# Per recipe loss: extra overrides, a metric only it logs (or None), a metric it must not log (or None):
# proof that the Ray actor worker ran the recipe's loss, not verl's default PPO-clip `vanilla`.
LOSS_SIGNATURES = {
    "reinforce": ((), None, "actor/pg_clipfrac"),
    "topr": ((), "actor/topr_positive_frac", None),
    "tis_pg": ((), "actor/pg_clipfrac_lower", None),
    # The `+` key must survive verl's actor-config instantiation in the worker.
    "kimi15": (("+actor_rollout_ref.actor.policy_loss.kimi15_tau=0.5",), None, "actor/pg_clipfrac"),
}
RESUME_LOSS = "kimi15"


def loss_overrides(loss: str) -> tuple[str, ...]:
    return (f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}", *LOSS_SIGNATURES[loss][0])


def assert_loss_ran(metrics: dict, loss: str) -> None:
    _, logged, not_logged = LOSS_SIGNATURES[loss]
    assert math.isfinite(metrics["actor/pg_loss"]), metrics["actor/pg_loss"]
    assert logged is None or logged in metrics, sorted(metrics)
    assert not_logged is None or not_logged not in metrics, sorted(metrics)


def contract_version(step: int, staleness: int, interval: int, start: int = 0) -> int:
    """The documented contract with no validation in between: floor((k-1-s)/N)*N, at least the start."""
    return max(start, (step - 1 - staleness) // interval * interval)


STALENESS_RUNS = [(0, 3, True, "reinforce"), (1, 1, False, "topr"), (2, 2, False, "tis_pg")]


def test_every_recipe_loss_runs_end_to_end():
    assert sorted([loss for *_, loss in STALENESS_RUNS] + [RESUME_LOSS]) == sorted(LOSS_MODES)


@pytest.mark.parametrize(
    ("staleness", "interval", "through_files", "loss"),
    STALENESS_RUNS,
    ids=["s0-every3-checkpoint-engine-reinforce", "s1-topr", "s2-every2-tis_pg"],
)
def test_entry_point_trains_with_measured_staleness(tmp_path, demo_assets, staleness, interval, through_files, loss):
    weights = tmp_path / "weights"
    extra = (*CHECKPOINT_ENGINE, f"+{CHECKPOINT_ENGINE[0].split('.backend')[0]}.engine_kwargs.checkpoint.dir={weights}")
    run = run_main(
        tmp_path,
        f"async_training.staleness={staleness}",
        f"async_training.sync_interval={interval}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *(extra if through_files else ()),
        *loss_overrides(loss),
    )
    assert run.returncode == 0, run.output[-5000:]
    metrics = run.metrics
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step, values in metrics.items():
        missing = [key for key in REQUIRED_METRICS if key not in values]
        assert not missing, f"step {step} lacks {missing}"
        assert_loss_ran(values, loss)
        version = contract_version(step, staleness, interval)
        assert values["async/weight_version"] == version, f"step {step}"
        assert values["async/staleness"] == step - 1 - version
        assert values["async/synced"] == float(step % interval == 0)
        if step % interval:
            assert values["timing_s/sync_weights"] == 0.0
        elif through_files:
            assert values["checkpoint_engine/files"] >= 1  # the version went through the folder
    if through_files:  # v0 at start-up, v3: the rollout loaded each; nothing older than the last loaded is kept
        assert sorted(p.name for p in weights.glob("v*")) == ["v0", "v3"]
        assert list((weights / "v3").glob("loaded-*"))


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

    checkpoints = tmp_path / "checkpoints"
    first = run_main(tmp_path / "first", *common, "trainer.total_training_steps=3", checkpoints=checkpoints)
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
    assert [full.metrics[step]["async/synced"] for step in range(1, 6)] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [full.metrics[step]["async/weight_version"] for step in range(1, 6)] == [0, 0, 0, 2, 3]
    for step in (1, 2, 3):
        assert Counter(first.prompts(step)) == Counter(full.prompts(step))
        assert first.metrics[step]["async/weight_version"] == full.metrics[step]["async/weight_version"]
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
