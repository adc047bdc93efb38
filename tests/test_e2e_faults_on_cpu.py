"""Faults on the real entry point: a run fails fast and clearly, leaves nothing behind, loses no data.

Six launches of ``python -m recipe.one_step_off_async.main_ppo --config-name=one_step_off_ppo_cpu``
(``faults.start_main`` or ``e2e.run_main``), each checking the exit code, the time to failure, the
message, and that no process of the run survives it:

- a rollout replica's weight receiver lost during a weight sync; a reward function that raises, on an elastic
  pool; vLLM's engine process killed under its live server (one launch each);
- the resume chain (``resume_chain``): three launches sharing one checkpoint folder, with weights
  pushed every 4 steps and at every checkpoint (every 3 steps), so each checkpoint the interrupt can
  leave falls in the middle of a sync interval. Launch 1 is stopped by Ctrl-C; launch 2 resumes and
  its actor worker is SIGKILLed mid-update; launch 3 resumes and finishes. Together they train every
  batch of the shared undisturbed run (``one_step_off_run``, conftest.py) once, in its order, with
  the contract's weight versions, and carry the kimi15 loss end to end. Their checkpoints import no
  recipe module, and a truncated one fails the next launch before Ray starts.

What a launch checks before Ray starts (a truncated checkpoint, an empty dataset) runs the entry
point's body in this process (``e2e.main_until_ray``). Faults whose whole effect is on the driver's
side (a generation error, a validation or first weight sync that never returns, a NaN reward) are
tested with the real trainer and stub workers (test_trainer_loop_on_cpu.py). A server actor that dies is named by
the engine watch (test_engine_health_on_cpu.py, with Ray actors), and ends a run here when it is vLLM's engine, in
the elastic tests when it is the server actor.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e import (
    ELASTIC,
    ONE_STEP_OFF_STEPS,
    RESUME_ESTIMATOR,
    RESUME_LOSS,
    Run,
    assert_estimator_ran,
    assert_loss_ran,
    contract_version,
    estimator_overrides,
    loss_overrides,
    main_until_ray,
    pickled_globals,
    run_main,
)
from faults import ACTOR_WORKER, VLLM_ENGINE, WEIGHT_RECEIVER, WatchedRun, reward_function, start_main

from recipe.one_step_off_async.errors import LaunchProblems
from recipe.one_step_off_async.trainer.pipeline import expected_weight_version
from recipe.one_step_off_async.trainer.resume import verify_checkpoint

pytestmark = pytest.mark.e2e

# Bounded everything: a failure must surface within these, not after verl's hour-long defaults. The first
# batch's generation includes the agent-loop worker's start: over a minute on a loaded machine (the suite runs
# two modules at once). The faults below are detected without waiting for a timeout.
BOUNDED = (
    "async_training.generation_timeout_s=180",
    "async_training.sync_timeout_s=60",
    "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s=20",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)
FAIL_WITHIN_S = 120
# A dead vLLM engine: the next check of the engines (every second of a wait) plus Ray's teardown.
VLLM_ENGINE_FAILS_WITHIN_S = 45

# The resume chain: the shared run's data and staleness, weights pushed every 4th step and at each
# checkpoint (every 3rd step and the last), so the checkpoints an interrupt can leave (3, 6) are mid-interval.
CHAIN_SYNC_INTERVAL, CHAIN_SAVE_FREQ = 4, 3
CHAIN_SYNCED_STEPS = {3, 4, 6, 8}
# Ctrl-C in a step that ends with a weight sync; the trainer may finish a step or two before Ray is torn
# down, so it resumes from 3 (then runs syncs 4 and 6 again) or from 6.
CHAIN_INTERRUPTED_IN_STEP = 4
CHAIN = (
    *BOUNDED,
    "async_training.staleness=1",
    f"async_training.sync_interval={CHAIN_SYNC_INTERVAL}",
    f"trainer.save_freq={CHAIN_SAVE_FREQ}",
    *loss_overrides(RESUME_LOSS),
    *estimator_overrides(RESUME_ESTIMATOR),
)
# Launches 1 and 2 take slow steps (the update is the bulk of each): on an idle machine the trainer would otherwise
# finish the run during the seconds Ctrl-C takes to tear Ray down, leaving launch 2 no update to kill. Launch 3,
# which nothing stops, trains one epoch a step: epochs change neither the batches nor the versions it asserts.
SLOW_STEPS = ("actor_rollout_ref.actor.ppo_epochs=8",)


@dataclass
class Ended:
    """How a disturbed launch ended: its run, seconds from the fault to its exit, processes it left behind."""

    run: Run
    seconds_after_fault: float
    leftovers: list[str]


@contextlib.contextmanager
def watched(directory: Path, *overrides: str) -> Iterator[WatchedRun]:
    """``faults.start_main``; whatever the run still has alive when the block ends (a failed wait) is killed."""
    run = start_main(directory, *overrides)
    try:
        yield run
    finally:
        run.kill_everything()


def end_by(run: WatchedRun, fault: Callable[[], object], timeout_s: float = FAIL_WITHIN_S + 60) -> Ended:
    """Inject ``fault``, then wait for the run to exit and for its processes to go."""
    fault()
    injected_at = time.monotonic()
    returncode, seconds, output = run.wait(timeout_s=timeout_s)
    seconds_after_fault = time.monotonic() - injected_at
    print(f"exited {seconds_after_fault:.1f} s after the fault")  # for the record (pytest -s)
    return Ended(Run(returncode, seconds, run.directory, output), seconds_after_fault, run.leftovers())


def assert_failed_cleanly(ended: Ended) -> None:
    assert ended.run.returncode != 0
    assert ended.seconds_after_fault < FAIL_WITHIN_S, f"took {ended.seconds_after_fault:.0f} s to fail"
    assert ended.leftovers == []
    assert "Traceback" in ended.run.output


def test_a_vllm_engine_dying_fails_the_run_within_seconds_naming_its_replica(tmp_path):
    """vLLM's engine process killed (the server actor above it lives on): the trainer's next check of the engines
    names the replica, long before the generation or sync timeouts (raised to 300 s here) would end the run."""
    timeouts = ("async_training.generation_timeout_s=300", "async_training.sync_timeout_s=300")
    with watched(tmp_path, *BOUNDED, *timeouts, "trainer.total_training_steps=100") as run:
        run.wait_for_step(2)
        ended = end_by(run, lambda: run.signal_worker(VLLM_ENGINE, signal.SIGKILL))
    assert_failed_cleanly(ended)
    assert ended.seconds_after_fault < VLLM_ENGINE_FAILS_WITHIN_S, f"took {ended.seconds_after_fault:.0f} s to fail"
    assert re.search(r"RolloutEngineDiedError: rollout replica 0 \(\S+\): its AsyncLLM engine died", ended.run.output)


def test_rollout_worker_lost_during_weight_sync_fails_the_run(tmp_path):
    # staleness 0: the rollout pool is idle while the actor trains, and the next thing it does is
    # receive weights. Freeze the replica's weight receiver during training, so the sync meets a dead peer.
    overrides = (
        "async_training.staleness=0",
        "trainer.total_training_steps=100",
        "actor_rollout_ref.actor.ppo_epochs=8",
    )
    with watched(tmp_path, *BOUNDED, *overrides) as run:
        run.wait_for_step(1)
        run.wait_for_task(ACTOR_WORKER, "update_actor")  # step 2: generation done, the actor is updating
        receiver = run.signal_worker(WEIGHT_RECEIVER, signal.SIGSTOP)
        frozen_step = max(run.logged_steps()) + 1
        time.sleep(6)  # the update ends and the sync starts, against a frozen receiver
        ended = end_by(run, receiver.kill)
    assert_failed_cleanly(ended)
    assert "CheckpointEngineWorker" in ended.run.output
    assert "_fit_update_weights" in ended.run.output  # the failure surfaced in the weight sync
    assert frozen_step not in run.logged_steps()  # the step whose sync failed is not reported as done


def test_a_reward_function_that_raises_fails_the_run_with_its_exception_not_as_a_lost_replica(tmp_path):
    """On an elastic pool, where a request whose replica fails is generated again on another (and the pool fails
    with ``RolloutPoolLostError`` when none is left): an error of the reward function is the user's, not a
    replica's, and fails the run at once with it."""
    run = run_main(
        tmp_path,
        *BOUNDED,
        "trainer.total_training_steps=3",
        *ELASTIC,
        *reward_function(tmp_path, "raise ZeroDivisionError(f'reward bug on {solution_str!r}')"),
        timeout_s=300,
    )
    assert run.returncode != 0
    assert "ZeroDivisionError: reward bug on" in run.output
    assert "lost at step" not in run.output and "RolloutPoolLostError" not in run.output  # no replica taken for lost
    assert not run.metrics  # the first batch failed: no step trained


# --- the resume chain ----------------------------------------------------------------------------


@dataclass
class ResumeChain:
    checkpoints: Path
    interrupted: Ended  # launch 1: Ctrl-C inside step CHAIN_INTERRUPTED_IN_STEP
    resumed_from: int  # the mid-interval checkpoint launches 2 and 3 resume from (step 3)
    tracked_after_ctrl_c: int  # the step the tracker named once launch 1 was stopped
    crashed: Ended  # launch 2: resumed from it, the actor worker SIGKILLed in its first update
    finished: Run  # launch 3: resumed from it again, to the last step


@pytest.fixture(scope="module")
def resume_chain(tmp_path_factory, demo_assets) -> ResumeChain:
    root = tmp_path_factory.mktemp("resume_chain")
    checkpoints = root / "checkpoints"
    chain = (*CHAIN, *SLOW_STEPS, f"trainer.default_local_dir={checkpoints}")
    # Launches 1 and 2 run for more steps than the chain's, so that an idle machine cannot finish them during
    # the seconds a Ctrl-C or a kill takes to stop them; 2 and 3 resume from the mid-interval checkpoint of
    # step 3 by path, whichever later checkpoint launch 1 managed to write before Ray was torn down.
    beyond_the_end = "trainer.total_training_steps=100"
    resumed_from = CHAIN_INTERRUPTED_IN_STEP - 1
    from_step_3 = (
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={checkpoints / f'global_step_{resumed_from}'}",
    )

    with watched(root / "interrupted", *chain, beyond_the_end) as run:
        run.wait_for_step(resumed_from)
        time.sleep(0.3)  # inside the next step
        interrupted = end_by(run, run.interrupt, timeout_s=FAIL_WITHIN_S)
    tracked_after_ctrl_c = int((checkpoints / "latest_checkpointed_iteration.txt").read_text())

    # The kill lands in the step after the first one the resumed run logs (SLOW_STEPS make the
    # update the bulk of it).
    with watched(root / "crashed", *chain, beyond_the_end, *from_step_3) as run:
        run.wait_for_step(resumed_from + 1)
        crashed = end_by(run, lambda: run.signal_worker(ACTOR_WORKER, signal.SIGKILL))

    to_the_end = f"trainer.total_training_steps={ONE_STEP_OFF_STEPS}"
    finished = run_main(root / "finished", *CHAIN, to_the_end, *from_step_3, checkpoints=checkpoints)
    return ResumeChain(checkpoints, interrupted, resumed_from, tracked_after_ctrl_c, crashed, finished)


def test_chain_ctrl_c_stops_the_run_and_the_tracker_names_a_complete_checkpoint(resume_chain, demo_assets):
    """Launch 1: Ctrl-C stops the run within 60 s, nothing left behind, the last tracked checkpoint loadable."""
    interrupted = resume_chain.interrupted
    assert interrupted.run.returncode != 0
    assert interrupted.seconds_after_fault < 60
    assert interrupted.leftovers == []
    # The trainer may finish a few steps while the interrupt tears Ray down: any saved step is fine, as
    # long as the tracker names a checkpoint that was written completely.
    last = resume_chain.tracked_after_ctrl_c
    assert last % CHAIN_SAVE_FREQ == 0 and last >= resume_chain.resumed_from
    verify_checkpoint(resume_chain.checkpoints / f"global_step_{last}", demo_assets.model_dir, actor_world_size=1)


def test_chain_actor_dying_mid_update_fails_the_resumed_run_naming_it(resume_chain):
    """Launch 2: an actor rank killed in the middle of a step (mostly its update) fails the run quickly, by name."""
    crashed = resume_chain.crashed
    assert_failed_cleanly(crashed)
    assert "ActorDiedError" in crashed.run.output and "WorkerDict" in crashed.run.output


def test_chain_trains_every_batch_once_in_order_with_the_contract_versions(resume_chain, one_step_off_run):
    """Launches 1 and 3: each step trains the undisturbed run's prompts with the contract's weight version.

    The data order does not depend on sync_interval or the loss, so the shared run is the reference. A run
    resumed from step N trains next on batch N+1, regenerated with v_N (the save synced it, though N is
    mid-interval); from step N+1+s on the versions are those of a run never interrupted.
    """
    assert one_step_off_run.returncode == 0, one_step_off_run.output[-3000:]
    finished, last = resume_chain.finished, resume_chain.resumed_from
    assert finished.returncode == 0, finished.output[-3000:]
    assert sorted(finished.metrics) == list(range(last + 1, ONE_STEP_OFF_STEPS + 1))

    def version(step: int, base: int) -> int:
        return expected_weight_version(step, 1, base, CHAIN_SYNCED_STEPS.__contains__)

    assert [version(step, 0) for step in range(1, ONE_STEP_OFF_STEPS + 1)] == [0, 0, 0, 0, 3, 4, 4, 6]
    # Each step from the launch that trained it last: up to the checkpoint launch 1, after it launch 3.
    trained_by = {step: (resume_chain.interrupted.run, 0) for step in range(1, last + 1)}
    trained_by.update({step: (finished, last) for step in finished.metrics})
    for step, (run, resumed_at) in trained_by.items():
        values = run.metrics[step]
        assert Counter(run.prompts(step)) == Counter(one_step_off_run.prompts(step)), f"step {step}"
        assert values["async/weight_version"] == version(step, resumed_at), f"step {step}"
        assert values["async/staleness"] == step - 1 - values["async/weight_version"]
        assert values["async/synced"] == float(step in CHAIN_SYNCED_STEPS), f"step {step}"
        if step not in CHAIN_SYNCED_STEPS:
            assert values["timing_s/sync_weights"] == 0.0
        assert_loss_ran(values, RESUME_LOSS)
    assert_estimator_ran(finished, RESUME_ESTIMATOR)

    assert last % CHAIN_SYNC_INTERVAL != 0  # the resume point is in the middle of a sync interval
    resumed_first = finished.metrics[last + 1]["async/weight_version"]
    assert resumed_first == contract_version(last + 1, 1, CHAIN_SYNC_INTERVAL, start=last) == last
    for step in range(last + 2, ONE_STEP_OFF_STEPS + 1):
        assert finished.metrics[step]["async/weight_version"] == version(step, 0), f"step {step}"


def test_chain_checkpoints_import_no_recipe_module(resume_chain):
    """Every pickle the chain saved loads without the recipe's modules: checkpoints survive modules moving."""
    imported = pickled_globals(resume_chain.checkpoints)
    saved = {path.relative_to(resume_chain.checkpoints).as_posix() for path in imported}
    final = f"global_step_{ONE_STEP_OFF_STEPS}"
    shards = {f"{final}/actor/{kind}_world_size_1_rank_0.pt" for kind in ("model", "optim", "extra_state")}
    assert {f"{final}/data.pt", *shards} <= saved, sorted(saved)
    assert "torch._utils:_rebuild_tensor_v2" in set().union(*imported.values())  # the scan sees torch's own
    from_recipe = {
        str(path): sorted(name for name in names if re.match(r"recipe[.:]", name)) for path, names in imported.items()
    }
    assert not any(from_recipe.values()), from_recipe


def test_chain_truncated_checkpoint_fails_the_next_launch_before_ray_naming_the_file(resume_chain, tmp_path):
    """The last checkpoint, cut short on disk: the next launch fails before Ray starts (it never trains from
    scratch), naming the file."""
    tracker = resume_chain.checkpoints / "latest_checkpointed_iteration.txt"
    last = f"global_step_{tracker.read_text().strip()}"
    checkpoints = tmp_path / "checkpoints"  # a copy: the other chain tests read the original
    shutil.copytree(resume_chain.checkpoints / last, checkpoints / last)
    shutil.copy(tracker, checkpoints / tracker.name)
    resume = ("trainer.resume_mode=auto", f"trainer.default_local_dir={checkpoints}")
    with pytest.raises(AssertionError, match="starting Ray"):  # intact, it passes every check
        main_until_ray(*BOUNDED, *resume)

    shard = checkpoints / last / "actor" / "model_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[:1000])
    # The launch reports it with its other problems (none here), naming the file.
    with pytest.raises(LaunchProblems, match=re.escape(f"Checkpoint file {shard} is truncated or corrupt")) as caught:
        main_until_ray(*BOUNDED, *resume)
    assert len(caught.value.problems) == 1
