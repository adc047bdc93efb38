"""Faults on the real entry point: a run fails fast and clearly, leaves nothing behind, loses no data.

Each test starts ``python -m recipe.one_step_off_async.main_ppo --config-name=one_step_off_ppo_cpu``
with ``faults.start_main`` (or ``e2e.run_main``), injects one fault, and checks the exit code, the
time to failure, the message, and that no process of the run survives it.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

import pandas as pd
import pytest
from e2e import ONE_STEP_OFF_STEPS, run_main
from faults import ACTOR_WORKER, ROLLOUT_SERVER, failing_generation, frozen_weight_sync, reward_function, start_main

from recipe.one_step_off_async.trainer.resume import verify_checkpoint

pytestmark = pytest.mark.slow

# Bounded everything: a failure must surface within these, not after verl's hour-long defaults.
BOUNDED = (
    "async_training.generation_timeout_s=60",
    "async_training.sync_timeout_s=60",
    "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=20",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)
FAIL_WITHIN_S = 120


def assert_failed_cleanly(run, output: str, seconds_after_fault: float) -> None:
    print(f"failed {seconds_after_fault:.1f} s after the fault")  # for the record (pytest -s)
    assert run.process.returncode != 0
    assert seconds_after_fault < FAIL_WITHIN_S, f"took {seconds_after_fault:.0f} s to fail"
    assert run.leftovers() == []
    assert "Traceback" in output


def test_rollout_replica_dying_mid_generation_fails_the_run_naming_it(tmp_path):
    run = start_main(tmp_path, *BOUNDED, "trainer.total_training_steps=100")
    run.wait_for_step(2)
    run.signal_worker(ROLLOUT_SERVER, signal.SIGKILL)
    killed_at = time.monotonic()
    _, _, output = run.wait(timeout_s=FAIL_WITHIN_S + 60)
    assert_failed_cleanly(run, output, time.monotonic() - killed_at)
    assert "HFRolloutServer" in output and "died" in output


def test_actor_dying_mid_update_fails_the_run_naming_it(tmp_path):
    run = start_main(tmp_path, *BOUNDED, "trainer.total_training_steps=100", "actor_rollout_ref.actor.ppo_epochs=8")
    run.wait_for_step(1)
    time.sleep(1.0)  # inside step 2's update: ppo_epochs makes it the bulk of the step
    run.signal_worker(ACTOR_WORKER, signal.SIGKILL)
    killed_at = time.monotonic()
    _, _, output = run.wait(timeout_s=FAIL_WITHIN_S + 60)
    assert_failed_cleanly(run, output, time.monotonic() - killed_at)
    assert "ActorDiedError" in output and "WorkerDict" in output


def test_rollout_worker_lost_during_weight_sync_fails_the_run(tmp_path):
    # staleness 0: the rollout pool is idle while the actor trains, and the next thing it does is
    # receive weights. Freeze the rollout server during training, so the sync meets a dead peer.
    run = start_main(
        tmp_path,
        *BOUNDED,
        "async_training.staleness=0",
        "trainer.total_training_steps=100",
        "actor_rollout_ref.actor.ppo_epochs=8",
    )
    run.wait_for_step(1)
    run.wait_for_task(ACTOR_WORKER, "update_actor")  # step 2: generation done, the actor is updating
    server = run.signal_worker(ROLLOUT_SERVER, signal.SIGSTOP)
    frozen_step = max(run.logged_steps()) + 1
    time.sleep(6)  # the update ends and the sync starts, against a frozen receiver
    server.kill()
    killed_at = time.monotonic()
    _, _, output = run.wait(timeout_s=FAIL_WITHIN_S + 60)
    assert_failed_cleanly(run, output, time.monotonic() - killed_at)
    assert "HFRolloutServer" in output
    assert "_fit_update_weights" in output  # the failure surfaced in the weight sync
    assert frozen_step not in run.logged_steps()  # the step whose sync failed is not reported as done


def test_validation_that_never_returns_fails_within_the_generation_timeout(tmp_path):
    # verl's _validate generates on the driver thread; the trainer bounds it like every other wait.
    overrides, env = failing_generation(tmp_path, hang_at_call=1)  # the first call is validation (step 0)
    run = start_main(
        tmp_path,
        *BOUNDED,
        *overrides,
        "async_training.generation_timeout_s=15",
        "trainer.val_before_train=true",
        "trainer.total_training_steps=3",
        env=env,
    )
    _, seconds, output = run.wait(timeout_s=FAIL_WITHIN_S + 120)
    assert_failed_cleanly(run, output, seconds)
    assert "Generation of the batch for validation step 0 did not finish within 15 s" in output
    assert run.logged_steps() == []


def test_rollout_frozen_in_the_first_weight_sync_fails_within_the_sync_timeout(tmp_path):
    # verl's fit() syncs v0 before its loop; the rollout worker never finishes receiving it. The gloo
    # engine's own timeout is set above the sync bound, so the trainer's bound is what fires.
    run = start_main(
        tmp_path,
        "async_training.sync_timeout_s=15",
        "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=300",
        "trainer.val_before_train=false",
        "trainer.total_training_steps=3",
        env=frozen_weight_sync(version=0),
    )
    _, seconds, output = run.wait(timeout_s=FAIL_WITHIN_S + 180)
    assert_failed_cleanly(run, output, seconds)
    assert "Syncing weights v0 from the actor to the rollout replicas did not finish within 15 s" in output
    assert run.logged_steps() == []


def test_ctrl_c_stops_the_run_the_last_checkpoint_resumes_and_a_truncated_one_is_named(tmp_path, demo_assets):
    checkpoints = tmp_path / "checkpoints"
    run = start_main(
        tmp_path / "interrupted",
        *BOUNDED,
        "trainer.total_training_steps=100",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={checkpoints}",
    )
    run.wait_for_step(3)
    time.sleep(0.3)  # inside step 4
    run.interrupt()
    interrupted_at = time.monotonic()
    code, _, output = run.wait(timeout_s=FAIL_WITHIN_S)
    assert code != 0
    assert time.monotonic() - interrupted_at < 60
    assert run.leftovers() == []

    # The trainer may finish a step or two while the interrupt tears Ray down: any even step is fine,
    # as long as the tracker names a checkpoint that was written completely.
    last = int((checkpoints / "latest_checkpointed_iteration.txt").read_text())
    assert last >= 2 and last % 2 == 0
    verify_checkpoint(checkpoints / f"global_step_{last}", demo_assets.model_dir, actor_world_size=1)
    resumed = run_main(
        tmp_path / "resumed",
        *BOUNDED,
        f"trainer.total_training_steps={last + 2}",
        "trainer.save_freq=2",
        "trainer.resume_mode=auto",
        checkpoints=checkpoints,
    )
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert sorted(resumed.metrics) == [last + 1, last + 2]

    # The resumed run's last checkpoint, cut short on disk: resuming from it fails, naming the file.
    shard = checkpoints / f"global_step_{last + 2}" / "actor" / "model_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[:1000])
    truncated = run_main(
        tmp_path / "truncated",
        *BOUNDED,
        f"trainer.total_training_steps={last + 4}",
        "trainer.resume_mode=auto",
        checkpoints=checkpoints,
    )
    assert truncated.returncode != 0
    assert f"Checkpoint file {shard} is truncated or corrupt" in truncated.output
    assert truncated.metrics == {}  # never trained from scratch


def test_killed_twice_and_resumed_consumes_the_same_data_in_the_same_order(tmp_path, one_step_off_run):
    steps = ONE_STEP_OFF_STEPS  # the reference: the shared undisturbed run (conftest.py)
    common = (*BOUNDED, f"trainer.total_training_steps={steps}")
    assert one_step_off_run.returncode == 0, one_step_off_run.output[-3000:]

    rng = random.Random(0)
    checkpoints = tmp_path / "checkpoints"
    directory = tmp_path / "interrupted"
    for kill_after_step in (rng.randint(1, 3), rng.randint(5, 6)):
        run = start_main(
            directory,
            *common,
            "trainer.save_freq=1",
            "trainer.resume_mode=auto",
            f"trainer.default_local_dir={checkpoints}",
        )
        run.wait_for_step(kill_after_step)
        time.sleep(rng.uniform(0.0, 0.6))  # somewhere in the next step
        run.kill_everything()  # a crash: every process of the run, SIGKILL
        run.process.wait(timeout=30)
        assert run.leftovers(grace_s=10) == []
    final = run_main(directory, *common, "trainer.resume_mode=auto", checkpoints=checkpoints)
    assert final.returncode == 0, final.output[-3000:]

    for step in range(1, steps + 1):  # each step's dump is from the last segment that trained it
        assert Counter(final.prompts(step)) == Counter(one_step_off_run.prompts(step)), f"step {step}"


def test_reward_function_that_raises_fails_the_run_with_its_exception(tmp_path):
    run = run_main(
        tmp_path,
        *BOUNDED,
        "trainer.total_training_steps=3",
        *reward_function(tmp_path, "raise ZeroDivisionError(f'reward bug on {solution_str!r}')"),
        timeout_s=300,
    )
    assert run.returncode != 0
    assert "ZeroDivisionError: reward bug on" in run.output


def test_reward_function_that_returns_nan_fails_the_run_before_training_on_it(tmp_path):
    run = run_main(
        tmp_path,
        *BOUNDED,
        "trainer.total_training_steps=3",
        *reward_function(tmp_path, "return float('nan') if len(solution_str) % 2 else 1.0"),
        timeout_s=300,
    )
    assert run.returncode != 0
    assert "is NaN or infinite" in run.output and "faulty_reward.py" in run.output
    assert run.metrics == {}


def test_empty_dataset_fails_before_any_worker_starts(tmp_path, demo_assets):
    empty = tmp_path / "empty.parquet"
    pd.read_parquet(demo_assets.train_file).iloc[:0].to_parquet(empty)
    started = time.monotonic()
    run = run_main(tmp_path, *BOUNDED, f"data.train_files={empty}", timeout_s=300)
    assert run.returncode != 0
    assert f"data.train_files: {empty} hold no rows" in run.output
    assert "ray init kwargs" not in run.output  # checked before Ray starts
    assert time.monotonic() - started < 90
