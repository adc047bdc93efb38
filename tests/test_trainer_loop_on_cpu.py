"""Loop order of the real trainer with stub workers: launches, in-flight depth, syncs, resume point."""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from types import SimpleNamespace

import pytest
import ray
from omegaconf import OmegaConf
from stub_trainer import EventLog, StubRollout, StubWeightSync, build_trainer, compose_config
from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
from verl.utils.import_utils import load_class_from_fqn
from verl.workers.rollout.llm_server import LLMServerManager

from recipe.one_step_off_async.async_config import DECOUPLED_OVERRIDES
from recipe.one_step_off_async.errors import (
    OffPolicyCorrectionError,
    PipelineTimeoutError,
    RewardError,
    WeightVersionError,
)
from recipe.one_step_off_async.losses import BYPASS_LOSS_MODE
from recipe.one_step_off_async.trainer.agent_loops import OneStepOffAgentLoopManager
from recipe.one_step_off_async.trainer.replica_start import ReplicaStart
from recipe.one_step_off_async.trainer.reward_loop import OneStepOffRewardLoopManager
from recipe.one_step_off_async.trainer.sync_manager import OneStepOffCheckpointManager

TOTAL_STEPS = 6
FAIL_WITHIN_S = 10  # a failure surfaces at once, or right after its timeout (0.3 s here)


def run(staleness: int, steps: int = TOTAL_STEPS, *overrides: str, **rollout_kwargs):
    log = EventLog()
    rollout = StubRollout(log, **rollout_kwargs)
    sync = StubWeightSync(log, rollout)
    config = compose_config(
        f"async_training.staleness={staleness}", f"trainer.total_training_steps={steps}", *overrides
    )
    trainer = build_trainer(config, log, rollout, sync)
    trainer.fit()
    return trainer, log


@pytest.mark.parametrize("bypass", [True, False], ids=["bypass", "decoupled"])
def test_the_actor_workers_are_built_with_the_loss_of_the_correction_mode(bypass):
    """verl points bypass mode's loss at ``bypass_mode`` in the driver's config only, after the workers exist
    (verl#4912); the trainer does it before (``verl_seams.route_bypass_loss_to_the_actor``), in the config verl's
    ``init_workers`` hands the actor workers."""
    log = EventLog()
    rollout = StubRollout(log)
    config = compose_config(*(() if bypass else DECOUPLED_OVERRIDES))
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout))
    policy_loss = trainer.config.actor_rollout_ref.actor.policy_loss
    assert policy_loss.loss_mode == (BYPASS_LOSS_MODE if bypass else "vanilla")
    assert ("rollout_correction" in policy_loss) is bypass


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_generation_runs_staleness_batches_ahead_of_training(staleness):
    trainer, log = run(staleness)

    updates = log.of("update")
    assert [u[1] for u in updates] == list(range(1, TOTAL_STEPS + 1))
    for _, step, in_flight, _ in updates:
        ahead = step + staleness
        if ahead <= TOTAL_STEPS:
            # Generation k+s was launched before update k ...
            assert log.index("launch", ahead) < log.index("update", step, in_flight, updates[step - 1][3])
        # ... and never more than s batches are in flight while the actor updates.
        assert in_flight == min(staleness, TOTAL_STEPS - step)
    # No generation beyond the last step.
    assert [e[1] for e in log.of("launch")] == list(range(1, TOTAL_STEPS + 1))


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_weights_sync_after_every_update_while_no_generation_runs(staleness):
    trainer, log = run(staleness)

    syncs = log.of("sync")
    assert [s[1] for s in syncs] == list(range(0, TOTAL_STEPS + 1))  # initial v0, then v_k after update k
    assert not any(running for _, _, running in syncs)
    for step in range(1, TOTAL_STEPS + 1):
        update = next(e for e in log.events if e[0] == "update" and e[1] == step)
        assert log.events.index(update) < log.index("sync", step, False)


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_each_batch_is_generated_with_weights_from_step_k_minus_1_minus_s(staleness):
    trainer, log = run(staleness)

    for _, step, version in log.of("gen_start"):
        assert version == max(0, step - 1 - staleness)
    measured = [m["async/staleness"] for m in trainer.logged_metrics]
    assert measured == [min(staleness, step - 1) for step in range(1, TOTAL_STEPS + 1)]
    for metrics in trainer.logged_metrics:
        for key in ("timing_s/step", "timing_s/wait_prev_gen", "timing_s/sync_weights", "timing_s/gen"):
            assert metrics[key] >= 0
        assert 0 < metrics["async/overlap_efficiency"] <= 1.01  # two clocks: timer vs wall time


def test_verl_builds_the_trainers_weight_sync_manager_which_never_puts_the_replicas_to_sleep():
    """verl's init_workers builds the manager its config names, which the trainer sets to its own; verl's generation
    step, run on every step's finished batch, would put the replicas to sleep with verl's manager."""
    trainer, log = run(1)
    fqn = trainer.config.actor_rollout_ref.rollout.checkpoint_manager_class
    assert load_class_from_fqn(fqn, "CheckpointEngineManager") is OneStepOffCheckpointManager
    assert len(log.of("update")) == TOTAL_STEPS and log.of("replica_sleep") == []


def test_data_order_is_the_dataloader_order_for_every_staleness():
    orders = []
    for staleness in (0, 1, 2):
        _, log = run(staleness)
        orders.append([u[3] for u in log.of("update")])
    assert orders[0] == orders[1] == orders[2]
    first_epoch = [index for batch in orders[0][:4] for index in batch]  # 16 prompts, 4 per step
    assert sorted(set(first_epoch)) == list(range(16))


def test_generation_error_reaches_the_driver_with_the_original_exception():
    """The rollout's own exception, type, message and traceback, right away; the failed batch is never trained."""
    log = EventLog()
    rollout = StubRollout(log, fail_at_step=3)
    config = compose_config("async_training.staleness=1", f"trainer.total_training_steps={TOTAL_STEPS}")
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout))
    started = time.monotonic()
    with pytest.raises(ValueError, match="stub generation failed for step 3") as failure:
        trainer.fit()
    assert time.monotonic() - started < FAIL_WITHIN_S
    assert failure.traceback[-1].name == "generate_sequences"  # raised where the rollout raised it
    assert [update[1] for update in log.of("update")] == [1, 2]


def test_a_skipped_weight_sync_is_an_error_not_a_silent_stale_batch():
    log = EventLog()
    rollout = StubRollout(log)
    sync = StubWeightSync(log, rollout, skip_version=2)
    trainer = build_trainer(
        compose_config("async_training.staleness=1", "trainer.total_training_steps=6"), log, rollout, sync
    )
    with pytest.raises(WeightVersionError, match="expected v2"):
        trainer.fit()


def test_generation_timeout_names_what_it_waited_for():
    log = EventLog()
    rollout = StubRollout(log, seconds=5.0)
    sync = StubWeightSync(log, rollout)
    config = compose_config(
        "async_training.staleness=1", "trainer.total_training_steps=2", "async_training.generation_timeout_s=0.2"
    )
    trainer = build_trainer(config, log, rollout, sync)
    with pytest.raises(TimeoutError, match="training step 1 did not finish within 0.2 s"):
        trainer.fit()


def test_a_nan_reward_stops_the_run_before_it_is_trained_on(tmp_path):
    """The error names the step, the samples and the user's reward function file; the batch is never trained."""
    reward_file = tmp_path / "faulty_reward.py"
    log = EventLog()
    rollout = StubRollout(log, nan_at_step=2)
    config = compose_config(
        "async_training.staleness=1",
        f"trainer.total_training_steps={TOTAL_STEPS}",
        f"reward.custom_reward_function.path={reward_file}",
        "reward.custom_reward_function.name=compute_score",
    )
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout))
    with pytest.raises(RewardError, match="reward of 1 of 8 samples of the batch for step 2 is NaN or infinite") as e:
        trainer.fit()
    assert f"reward function {reward_file}:compute_score" in str(e.value)
    assert [update[1] for update in log.of("update")] == [1]
    assert len(trainer.logged_metrics) == 1  # step 1 only: the NaN batch was neither trained nor reported


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_validation_at_step_k_uses_weights_v_k_on_an_idle_rollout_pool(staleness):
    trainer, log = run(staleness, TOTAL_STEPS, "trainer.test_freq=2", "trainer.val_before_train=true")

    validations = log.of("validate")
    assert [(step, version) for _, step, version, _ in validations] == [(0, 0), (2, 2), (4, 4), (6, 6)]
    assert not any(running for *_, running in validations)
    for _, step, _, _ in validations[1:]:
        # After the sync of v_k, before the next generation is launched: nothing in flight is touched.
        validation = log.index("validate", step, step, False)
        assert log.index("sync", step, False) < validation
        if step + 1 + staleness <= TOTAL_STEPS:
            assert validation < log.index("launch", step + 1 + staleness)
    assert [m["async/staleness"] for m in trainer.logged_metrics] == [min(staleness, s - 1) for s in range(1, 7)]


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("interval", [2, 3])
def test_sync_interval_pushes_weights_every_n_steps_and_versions_follow_the_contract(staleness, interval):
    steps = 7
    trainer, log = run(staleness, steps, f"async_training.sync_interval={interval}")

    synced_steps = [k for k in range(1, steps + 1) if k % interval == 0]
    assert [s[1] for s in log.of("sync")] == [0, *synced_steps]
    assert not any(running for _, _, running in log.of("sync"))
    # The contract: batch k carries the last version synced at or before step k-1-s.
    expected = {k: max(0, (k - 1 - staleness) // interval * interval) for k in range(1, steps + 1)}
    assert {step: version for _, step, version in log.of("gen_start")} == expected
    for step, metrics in enumerate(trainer.logged_metrics, start=1):
        assert metrics["async/weight_version"] == expected[step]
        assert metrics["async/staleness"] == step - 1 - expected[step]  # measured, grows within an interval
        assert metrics["async/synced"] == float(step in synced_steps)
        if step not in synced_steps:
            assert metrics["timing_s/sync_weights"] == 0.0


def test_validation_steps_sync_even_between_intervals():
    trainer, log = run(1, 6, "async_training.sync_interval=4", "trainer.test_freq=3")

    assert [s[1] for s in log.of("sync")] == [0, 3, 4, 6]
    assert [(step, version) for _, step, version, _ in log.of("validate")] == [(3, 3), (6, 6)]
    assert [m["async/weight_version"] for m in trainer.logged_metrics] == [0, 0, 0, 0, 3, 4]  # last sync <= k-2


def test_during_the_critics_warm_up_the_unchanged_weights_are_not_pushed_but_on_validation_steps():
    """verl's guard (``_fit_update_weights``): before step ``critic_warmup`` the actor does not update, so its weights
    are v_0's and no sync pushes them; a validation step still syncs, so that it evaluates v_k by its version."""
    trainer, log = run(1, 6, "trainer.critic_warmup=3", "trainer.test_freq=2")

    assert [u[1] for u in log.of("update")] == [3, 4, 5, 6]  # verl's warm-up: the actor trains from step 3
    assert [s[1] for s in log.of("sync")] == [0, 2, 3, 4, 5, 6]  # step 1 pushes nothing; 2 validates
    assert [m["async/synced"] for m in trainer.logged_metrics] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert trainer.logged_metrics[0]["timing_s/sync_weights"] == 0.0
    # The batch of step k carries the last version synced at or before step k-2: none at step 1.
    assert [m["async/weight_version"] for m in trainer.logged_metrics] == [0, 0, 0, 2, 3, 4]


def test_checkpoint_steps_sync_so_the_rollout_holds_the_saved_version():
    trainer, log = run(1, 6, "async_training.sync_interval=4", "trainer.save_freq=3")

    assert [s[1] for s in log.of("sync")] == [0, 3, 4, 6]
    assert [s[1] for s in log.of("save")] == [3, 6]
    for step in (3, 6):
        assert log.index("sync", step, False) < log.index("save", step)


def test_validation_that_never_returns_fails_within_the_generation_timeout():
    """verl's validation generates on the driver thread; the trainer bounds it like every other wait."""
    log = EventLog()
    rollout = StubRollout(log, hang_validation=True)
    config = compose_config(
        "trainer.total_training_steps=2", "trainer.val_before_train=true", "async_training.generation_timeout_s=0.3"
    )
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout))
    started = time.monotonic()
    with pytest.raises(
        PipelineTimeoutError,
        match=r"Generation of the batch for validation step 0 did not finish within 0.3 s "
        r"\(async_training.generation_timeout_s",
    ):
        trainer.fit()
    assert time.monotonic() - started < FAIL_WITHIN_S
    assert log.of("update") == [] and trainer.logged_metrics == []  # nothing trained, no step reported


def test_a_first_weight_sync_that_never_returns_fails_within_the_sync_timeout():
    """verl's fit() syncs v0 before its loop; a receiver that never finishes fails the run after the bound."""
    log = EventLog()
    rollout = StubRollout(log)
    config = compose_config("trainer.total_training_steps=2", "async_training.sync_timeout_s=0.3")
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout, hang_version=0))
    started = time.monotonic()
    with pytest.raises(
        PipelineTimeoutError,
        match=r"Syncing weights v0 from the actor to the rollout replicas did not finish within 0.3 s "
        r"\(async_training.sync_timeout_s\)",
    ):
        trainer.fit()
    assert time.monotonic() - started < FAIL_WITHIN_S
    assert log.of("update") == [] and trainer.logged_metrics == []  # nothing trained, no step reported


def test_missing_rollout_log_probs_fail_the_step_instead_of_skipping_the_correction():
    with pytest.raises(OffPolicyCorrectionError, match="no rollout_log_probs for the batch of step 1"):
        run(staleness=1, log_probs=False)


def test_the_trainer_parses_the_config_the_launch_check_validated_without_checking_it_again():
    """The launch check ran before Ray (launch.prepare_config); a second run in the trainer printed its warnings twice."""
    from recipe.one_step_off_async.async_config import AsyncTrainingConfig, validate_config

    config = compose_config(
        "async_training.staleness=2",
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=unused",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.nnodes=1",
        "reward.custom_reward_function.path=unused.py",
    )
    with pytest.warns(UserWarning, match="verl scores with the function"):
        validated = validate_config(config)
    log = EventLog()
    rollout = StubRollout(log)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout))
    assert not [w for w in caught if "verl scores with the function" in str(w.message)]
    assert trainer.async_config == validated == AsyncTrainingConfig(staleness=2, partial_rollout=False)


def test_throughput_counts_the_devices_of_both_pools():
    trainer, _ = run(1, 2)
    metrics = trainer.logged_metrics[-1]
    devices = 2 + 4  # trainer.n_gpus_per_node=2 (stub config) + the GPU profile's 4 rollout GPUs
    assert metrics["perf/throughput"] == pytest.approx(
        metrics["perf/total_num_tokens"] / (metrics["perf/time_per_step"] * devices)
    )


# --- partial rollout: batches in flight generate together, syncs do not wait for idle -------------------

# The stub trainer's config is the GPU profile's (vLLM), which needs priority scheduling in this mode.
PARTIAL = ("async_training.partial_rollout=true", "actor_rollout_ref.rollout.scheduling_policy=priority")


def test_partial_rollout_overlaps_batches_and_syncs_mid_generation_in_data_order():
    _, today = run(2)
    trainer, log = run(2, TOTAL_STEPS, *PARTIAL, partial=True, seconds=0.3)

    # Data order is unchanged: the batch of step k is dataloader batch k.
    assert [u[3] for u in log.of("update")] == [u[3] for u in today.of("update")]
    # Batches in flight generate at once: a later batch starts before an earlier one ends ...
    starts = {step: log.index("gen_start", step, version) for _, step, version in log.of("gen_start")}
    ends = {step: log.index("gen_end", step, version) for _, step, version in log.of("gen_end")}
    assert any(starts[step + 1] < ends[step] for step in range(1, TOTAL_STEPS))
    # ... and a sync interrupts running generations instead of waiting for them.
    assert any(running for _, step, running in log.of("sync") if step > 0)
    # Every token within [k-1-s, k-1] (the trainer checks it at every step); some samples span versions.
    metrics = trainer.logged_metrics
    assert all(0 <= m["async/staleness_min"] <= m["async/staleness_max"] <= 2 for m in metrics)
    assert any(m["async/partial_ratio"] > 0 for m in metrics)
    assert max(m["async/version_span_max"] for m in metrics) >= 1


def test_partial_rollout_fails_naming_the_sample_with_a_token_outside_the_contract():
    log = EventLog()
    rollout = StubRollout(log, partial=True, seconds=0.05)
    config = compose_config("async_training.staleness=1", "trainer.total_training_steps=3", *PARTIAL)
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout, skip_version=1))
    with pytest.raises(WeightVersionError, match=r"Sample 0 of the batch for step 3 .*outside \[v1, v2\]"):
        trainer.fit()


def test_partial_rollout_bounds_follow_sync_interval_validation_and_checkpoint_syncs():
    from recipe.one_step_off_async.trainer.pipeline import expected_weight_version

    steps, staleness = 8, 2
    trainer, _ = run(
        staleness,
        steps,
        *PARTIAL,
        "async_training.sync_interval=3",
        "trainer.test_freq=4",
        "trainer.save_freq=5",
        partial=True,
        seconds=0.2,
    )

    def syncs_at(j: int) -> bool:
        return j % 3 == 0 or j % 4 == 0 or j % 5 == 0 or j >= steps

    for step, metrics in enumerate(trainer.logged_metrics, start=1):
        oldest = expected_weight_version(step, staleness, 0, syncs_at)
        newest = expected_weight_version(step, 0, 0, syncs_at)
        # The stub samples a batch's first token with the version of its launch: exactly the oldest bound.
        assert metrics["async/staleness_max"] == step - 1 - oldest, f"step {step}"
        assert metrics["async/staleness_min"] >= step - 1 - newest, f"step {step}"


# --- start-up ----------------------------------------------------------------------------------------


def start_up(monkeypatch, one_gpu: bool, create_replicas, start_actor_workers):
    """A trainer whose ``_init_worker_groups`` runs with verl's worker-group start and replica start stubbed."""
    log = EventLog()
    rollout = StubRollout(log)
    trainer = build_trainer(compose_config(), log, rollout, StubWeightSync(log, rollout))
    trainer.async_config = dataclasses.replace(trainer.async_config, one_gpu=one_gpu)
    monkeypatch.setattr(LLMServerManager, "create", lambda config: create_replicas())
    monkeypatch.setattr(SeparateRayPPOTrainer, "_init_worker_groups", lambda self: start_actor_workers())
    trainer._init_worker_groups()
    return trainer


def test_rollout_replicas_start_while_the_actor_workers_start(monkeypatch):
    replicas_starting, actor_started = threading.Event(), threading.Event()
    servers = SimpleNamespace()

    def create_replicas():
        replicas_starting.set()
        assert actor_started.wait(timeout=FAIL_WITHIN_S)
        return servers

    def start_actor_workers():
        assert replicas_starting.wait(timeout=FAIL_WITHIN_S), "the replicas wait for the actor's workers"
        actor_started.set()

    trainer = start_up(monkeypatch, False, create_replicas, start_actor_workers)
    # The rollout manager is built on the replicas started with the actor: none is started again.
    monkeypatch.setattr(OneStepOffAgentLoopManager, "create", lambda **kwargs: kwargs["llm_client"])
    monkeypatch.setattr(LLMServerManager, "create", lambda config: pytest.fail("replicas started twice"))
    servers.get_client = lambda *args, **kwargs: "client"
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_workers=[])
    trainer._init_async_rollout_manager()
    assert trainer.llm_server_manager is servers and trainer.async_rollout_manager == "client"


class ConfiguredManager(OneStepOffAgentLoopManager):
    """A user's manager, named by actor_rollout_ref.rollout.agent.agent_loop_manager_class."""

    @classmethod
    def create(cls, **kwargs):
        return cls


def test_the_rollout_manager_is_the_configured_subclass_of_the_recipes(monkeypatch):
    servers = SimpleNamespace(get_client=lambda *args, **kwargs: "client")
    trainer = start_up(monkeypatch, False, lambda: servers, lambda: None)
    key = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
    OmegaConf.update(trainer.config, key, f"{__name__}.ConfiguredManager", force_add=True)
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_workers=[])
    trainer._init_async_rollout_manager()
    assert trainer.async_rollout_manager is ConfiguredManager


def test_a_replica_that_fails_to_start_fails_the_start_up_with_its_error(monkeypatch):
    def create_replicas():
        raise RuntimeError("vLLM: not enough memory for the KV cache")

    trainer = start_up(monkeypatch, False, create_replicas, lambda: None)
    with pytest.raises(RuntimeError, match="not enough memory for the KV cache"):
        trainer.replica_start.servers()


def test_on_one_gpu_the_replicas_start_after_the_actor_as_in_verl(monkeypatch):
    events = []
    trainer = start_up(monkeypatch, True, lambda: events.append("replicas"), lambda: events.append("actor"))
    assert events == ["actor"]
    trainer.replica_start.servers()
    assert events == ["actor", "replicas"]


@pytest.mark.parametrize("overlap", [True, False])
def test_a_replica_start_that_never_finishes_fails_naming_the_pool_and_what_ray_has_free(monkeypatch, overlap):
    """verl waits on the replicas' placement without a timeout; the trainer waits async_training.start_timeout_s."""
    never = threading.Event()
    monkeypatch.setattr(ReplicaStart, "_create", lambda self: never.wait())
    config = OmegaConf.create(
        {"trainer": {"device": "cuda"}, "actor_rollout_ref": {"rollout": {"nnodes": 1, "n_gpus_per_node": 4}}}
    )
    start = ReplicaStart(
        config, overlap, timeout_s=0.3, free_resources=lambda: {"CPU": 12.0, "GPU": 2.0, "memory": 1e9}
    )
    start.begin()
    began = time.monotonic()
    with pytest.raises(PipelineTimeoutError) as caught:
        start.servers()
    assert 0.25 <= time.monotonic() - began < FAIL_WITHIN_S
    assert str(caught.value).startswith(
        "The rollout replicas did not start within 0.3 s (async_training.start_timeout_s): their pool, "
        "actor_rollout_ref.rollout.nnodes x n_gpus_per_node = 1 x 4 devices, is not placed yet or its processes are "
        "still starting"
    )
    assert "Ray reports free: 2 GPU, 12 CPU." in str(caught.value)
    never.set()


def test_a_training_pool_or_reward_model_that_ray_never_places_fails_the_start_up_naming_its_pool(monkeypatch):
    """verl waits on each placement group without a timeout (``RayResourcePool.get_placement_groups``)."""
    never = threading.Event()
    unplaced = SimpleNamespace(get_placement_groups=lambda device_name: never.wait())
    placed = SimpleNamespace(get_placement_groups=lambda device_name: ["group"])
    trainer = start_up(monkeypatch, False, lambda: None, lambda: None)
    trainer.async_config = dataclasses.replace(trainer.async_config, start_timeout_s=0.2)
    trainer.resource_pool_manager = SimpleNamespace(resource_pool_dict={"global_pool": placed, "critic": unplaced})
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 3.0})
    with pytest.raises(
        PipelineTimeoutError,
        match=r"The training workers of verl's critic did not start within 0.2 s .*: their pool, "
        r"trainer.nnodes x n_gpus_per_node = 1 x 2 devices, is not placed yet .*Ray reports free: 3 CPU",
    ):
        trainer._init_worker_groups()
    monkeypatch.setattr(OneStepOffRewardLoopManager, "__init__", lambda self, **kwargs: never.wait())
    OmegaConf.update(trainer.config, "reward.reward_model.enable", True)
    with pytest.raises(
        PipelineTimeoutError,
        match=r"The reward model replicas did not start within 0.2 s .*: their "
        r"pool, reward.reward_model.nnodes x n_gpus_per_node",
    ):
        trainer._init_reward_loop()
    never.set()


def test_the_replicas_start_time_counts_from_its_beginning_not_from_the_wait(monkeypatch):
    """Begun with the actor's workers, the start has used its time by the trainer's wait: it fails at once."""
    never = threading.Event()
    monkeypatch.setattr(ReplicaStart, "_create", lambda self: never.wait())
    config = OmegaConf.create(
        {"trainer": {"device": "cpu"}, "actor_rollout_ref": {"rollout": {"nnodes": 1, "n_gpus_per_node": 1}}}
    )
    start = ReplicaStart(config, overlap=True, timeout_s=0.2, free_resources=dict)
    start.begin()
    time.sleep(0.3)
    began = time.monotonic()
    with pytest.raises(PipelineTimeoutError, match="Ray reports free: nothing"):
        start.servers()
    assert time.monotonic() - began < 0.2
    never.set()
