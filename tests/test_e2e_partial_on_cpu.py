"""Partial rollout on the real entry point: the long-tail task at staleness 2, a replica lost mid-sample, a resume.

Two launches (about a minute each on 2 cores), on ``one_step_off_ppo_cpu_long_tail`` (responses of 2 to
480 tokens, so syncs land while the long samples are still generating):

- 6 steps, partial rollout, staleness 2, two ``hf`` replicas in an elastic pool, one killed while the
  first batches generate (agent-loop call 26: 9 requests of batch 2 and the long tail of batch 1 are
  running), a checkpoint at step 3. The run finishes; every step trains its dataloader batch, the trainer
  checked every token's version against [k-1-s, k-1]; some samples span versions;
- resumed from that step-3 checkpoint by path, weights moving through files (the ``checkpoint`` engine, the
  other weight-sync backend partial rollout supports on CPU): steps 4-6 train the same prompts as the first
  run (the batches in flight at the checkpoint are regenerated from their prompts), within the same bounds.
"""

from __future__ import annotations

from collections import Counter

import pytest
from e2e import checkpoint_engine, contract_version, run_main
from faults import failing_generation

pytestmark = pytest.mark.e2e

PROFILE = "one_step_off_ppo_cpu_long_tail"
STEPS, STALENESS, SAVED_AT = 6, 2, 3
SAMPLES_PER_BATCH = 4 * 4  # data.train_batch_size x rollout.n of the long-tail profile
PARTIAL = (
    f"async_training.staleness={STALENESS}",
    "async_training.partial_rollout=true",
    f"trainer.total_training_steps={STEPS}",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    f"trainer.save_freq={SAVED_AT}",
)


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory, demo_assets):
    directory = tmp_path_factory.mktemp("partial")
    overrides, env = failing_generation(directory, kill_replica_at_call=SAMPLES_PER_BATCH + 10, long_tail=True)
    return run_main(
        directory,
        *PARTIAL,
        "async_training.elastic.enable=true",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        *overrides,
        env=env,
        profile=PROFILE,
    )


def assert_tokens_within_the_contract(metrics: dict[int, dict], steps: range, start: int = 0) -> None:
    assert sorted(metrics) == list(steps), sorted(metrics)
    for step, values in metrics.items():
        # The trainer failed the run on any token outside [w(k), k-1]; what it measured agrees.
        bound = step - 1 - contract_version(step, STALENESS, 1, start)
        assert 0 <= values["async/staleness_min"] <= values["async/staleness_mean"] <= values["async/staleness_max"]
        assert values["async/staleness_max"] <= bound, f"step {step}"
        assert values["async/version_span_max"] <= bound
        assert values["async/staleness"] == values["async/staleness_max"]


def test_partial_run_spans_versions_within_the_contract_and_survives_a_lost_replica(partial_run):
    assert partial_run.returncode == 0, partial_run.output[-5000:]
    metrics = partial_run.metrics
    assert_tokens_within_the_contract(metrics, range(1, STEPS + 1))
    # Syncs interrupted running samples, which continued under the new weights.
    assert max(values["async/partial_ratio"] for values in metrics.values()) > 0
    assert sum(values["async/recomputed_prefill_tokens"] for values in metrics.values()) > 0
    # The replica killed mid-generation: its requests were generated again, every sample of every batch served.
    assert sum(values["async/regenerated_requests"] for values in metrics.values()) > 0
    assert metrics[STEPS]["async/rollout_replicas_lost"] == 1.0
    for step, values in metrics.items():
        served = sum(count for key, count in values.items() if key.startswith("async/replica_requests/"))
        assert served == SAMPLES_PER_BATCH, f"step {step}"
    # The engines' own counters reached the trainer.
    occupancy = [values["rollout/slot_occupancy"] for values in metrics.values()]
    assert all(0 <= value <= 1 for value in occupancy) and max(occupancy) > 0


def test_partial_run_resumed_from_a_checkpoint_trains_the_same_prompts_per_step(partial_run, tmp_path):
    checkpoint = partial_run.directory / "checkpoints" / f"global_step_{SAVED_AT}"
    resume = ("trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}")
    resumed = run_main(tmp_path, *PARTIAL, *resume, *checkpoint_engine(tmp_path / "weights"), profile=PROFILE)
    assert resumed.returncode == 0, resumed.output[-5000:]
    assert_tokens_within_the_contract(resumed.metrics, range(SAVED_AT + 1, STEPS + 1), start=SAVED_AT)
    assert all(values["checkpoint_engine/files"] >= 1 for values in resumed.metrics.values())
    for step in range(SAVED_AT + 1, STEPS + 1):
        assert Counter(resumed.prompts(step)) == Counter(partial_run.prompts(step)), f"step {step}"
