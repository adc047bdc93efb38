"""OneStepOffRayTrainer: verl's PPO step with generation ``staleness`` batches ahead of training.

The actor (FSDP2, verl's engine worker with role ``actor``) lives on the trainer pool; rollout
replicas live on their own pool (verl's standalone replicas: vLLM on GPUs, the recipe's ``hf``
replica on CPU). This class reuses verl's step template (``SeparateRayPPOTrainer.fit_step``:
reward -> old log-prob -> advantage -> update -> weight sync) and overrides only the seams that
decide where a batch comes from and when weights move:

- the train dataloader becomes a ``RolloutPipeline`` whose items already have their generation
  in flight (launched ``staleness`` steps earlier, after the previous weight sync);
- ``_fit_generate`` waits for the item's generation instead of starting it;
- ``_fit_update_weights`` lets the in-flight generations finish, then syncs weights v_k, so
  no sequence ever mixes two weight versions (every ``sync_interval`` steps, and on validation and
  checkpoint steps);
- checkpoints store the pipeline's resume point, so resuming at step N trains batch N+1 next;
- in elastic mode (``elastic_pool.py``) every step boundary applies the rollout pool's changes (lost,
  added, removed replicas), and the sync steps, when no generation runs, change who gets weights.

staleness 0 is the synchronous baseline on the same pools and the same code: one queue slot.

    rollout pool:  G1 | G2 ........ | G3 ........ | G4        (staleness 1)
    actor pool:       | T1 | S      | T2 | S      | T3 | S
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
import ray
import torch
from omegaconf import DictConfig, open_dict
from verl import DataProto
from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
from verl.single_controller.ray import RayClassWithInitArgs
from verl.trainer.ppo.metric_utils import compute_throughout_metrics
from verl.trainer.ppo.ray_trainer import compute_response_mask
from verl.trainer.ppo.utils import Role
from verl.utils.debug import marked_timer

from recipe.one_step_off_async.async_config import validate_config
from recipe.one_step_off_async.checkpoint_check import CheckpointError, resume_folder, verify_checkpoint
from recipe.one_step_off_async.deadlines import BoundedCheckpointManager, BoundedRolloutManager
from recipe.one_step_off_async.rollout_pipeline import InFlightBatch, RolloutPipeline, expected_weight_version


class WeightSyncError(RuntimeError):
    """The rollout did not generate with the weight version the pipeline synced to it."""


class RewardError(ValueError):
    """The reward function returned something that must not be trained on."""


class OffPolicyCorrectionError(RuntimeError):
    """The off-policy correction is configured but its inputs are missing: it would be skipped silently."""


@contextlib.contextmanager
def _hybrid_engine_assert_disabled(config: DictConfig) -> Iterator[None]:
    """verl/trainer/ppo/ray_trainer.py (0.9.1): ``RayPPOTrainer.__init__`` asserts ``hybrid_engine``.

    Nothing else in ``__init__`` depends on it; the flag is restored before any worker exists.
    ``tests/test_verl_compat_on_cpu.py`` notices when verl drops the assert.
    """
    with open_dict(config):
        config.actor_rollout_ref.hybrid_engine = True
    try:
        yield
    finally:
        with open_dict(config):
            config.actor_rollout_ref.hybrid_engine = False


class OneStepOffRayTrainer(SeparateRayPPOTrainer):
    """PPO/GRPO on disjoint actor and rollout pools with ``async_training.staleness`` batches in flight.

    The policy worker group is registered under ``Role.ActorRollout`` because verl's step code
    addresses it so; it runs the actor only (``role="actor"``), rollout is on its own pool.
    """

    def __init__(self, config: DictConfig, tokenizer, role_worker_mapping, resource_pool_manager, **kwargs) -> None:
        self.async_config = validate_config(config)
        with _hybrid_engine_assert_disabled(config):
            super().__init__(config, tokenizer, role_worker_mapping, resource_pool_manager, **kwargs)
        self.train_dataloader = RolloutPipeline(
            self.train_dataloader,
            staleness=self.async_config.staleness,
            prepare=self._prepare_generation,
            generate=self._generate,
            total_epochs=self.config.trainer.total_epochs,
        )
        self._first_step = 1
        self._clock_origin = time.time()
        self.rollout_pool = None  # ElasticRolloutPool with async_training.elastic.enable

    # ------------------------------------------------------------------ workers

    def _create_actor_rollout_classes(self) -> None:
        pool = self.resource_pool_manager.get_resource_pool(Role.ActorRollout)
        actor_cls = RayClassWithInitArgs(
            cls=self.role_worker_mapping[Role.ActorRollout], config=self.config.actor_rollout_ref, role="actor"
        )
        self.resource_pool_to_cls[pool][str(Role.ActorRollout)] = actor_cls

    def init_workers(self) -> None:
        super().init_workers()
        self._bound_manager_calls()
        if self.async_config.elastic.enable:
            from verl.plugin.platform import get_platform

            from recipe.one_step_off_async.elastic_pool import ElasticRolloutPool

            self.rollout_pool = ElasticRolloutPool(
                self.async_config.elastic,
                self.llm_server_manager,
                self.checkpoint_manager,
                self._pool_controller,
                device_resource=get_platform().ray_resource_name(),
            )
            print(
                f"[elastic] {len(self.rollout_pool.live)} rollout replica(s). Add or remove replicas while it runs: "
                "python -m recipe.one_step_off_async.scale --add 1 (or --remove 1, --status) --address "
                f"{ray.get_runtime_context().gcs_address} --experiment {self.config.trainer.experiment_name}"
            )

    def _bound_manager_calls(self) -> None:
        # verl's fit() syncs v_0 and _validate() generates on this thread with no deadline: bound every call.
        timeouts = self.async_config
        self.checkpoint_manager = BoundedCheckpointManager(
            self.checkpoint_manager,
            timeouts.sync_timeout_s,
            self.config.actor_rollout_ref.rollout.checkpoint_engine.backend,
        )
        self.async_rollout_manager = BoundedRolloutManager(self.async_rollout_manager, timeouts.generation_timeout_s)

    def _init_async_rollout_manager(self) -> None:
        from verl.experimental.agent_loop import AgentLoopManager
        from verl.workers.rollout.llm_server import LLMServerManager

        if self.config.actor_rollout_ref.rollout.name == "hf":
            import recipe.one_step_off_async.cpu.hf_replica  # noqa: F401  (registers "hf" with verl)

        client_options = {}
        if self.async_config.elastic.enable:
            from recipe.one_step_off_async.elastic_client import ElasticLLMServerClient
            from recipe.one_step_off_async.pool_controller import start_controller

            # Before any replica loads: a second job under the same name fails here, in seconds.
            self._pool_controller = start_controller(self.config.trainer.experiment_name)
            client_options = {"client_cls": ElasticLLMServerClient, "controller": self._pool_controller}
        # Standalone replicas on their own pool: LLMServerManager gets no worker group.
        self.llm_server_manager = LLMServerManager.create(config=self.config)
        self.async_rollout_mode = True
        self.async_rollout_manager = AgentLoopManager.create(
            config=self.config,
            llm_client=self.llm_server_manager.get_client(**client_options),
            reward_loop_worker_handles=self.reward_loop_manager.reward_loop_workers,
        )

    # ------------------------------------------------------------------ loop seams

    def fit(self) -> None:
        try:
            super().fit()
            self._shutdown_dump_executor()  # the last step's rollout dump lands before the process ends
        finally:
            self.train_dataloader.close()
            if self.rollout_pool is not None:
                self.rollout_pool.close()
            if self.progress_bar is not None:
                self.progress_bar.close()

    def _prepare_generation(self, batch_dict: dict, step: int) -> tuple[DataProto, DataProto]:
        """Build the step's batch (with uids) and the prompts sent to the rollout pool."""
        batch = super()._fit_get_batch(batch_dict)
        gen_batch = self._get_gen_batch(batch)
        gen_batch.meta_info["global_steps"] = step
        gen_batch = gen_batch.repeat(repeat_times=self.config.actor_rollout_ref.rollout.n, interleave=True)
        return batch, gen_batch

    def _generate(self, gen_batch: DataProto) -> DataProto:
        """Runs on the pipeline's thread while the actor trains; the pipeline bounds its own waits."""
        return self.async_rollout_manager.manager.generate_sequences(gen_batch)

    def _fit_get_batch(self, in_flight: InFlightBatch) -> InFlightBatch:
        # The pipeline already built the batch when it launched its generation.
        self._step_started_at = time.time()
        return in_flight

    def _fit_generate(self, in_flight: InFlightBatch) -> DataProto:
        with marked_timer("wait_prev_gen", self.timing_raw), self._named_pool_loss(in_flight.step):
            generated = in_flight.result(timeout_s=self.async_config.generation_timeout_s)
        ready_at = time.time()
        output = generated.output
        self.timing_raw["gen"] = generated.seconds
        self.timing_raw.update(output.meta_info.pop("timing", {}))
        self._record_weight_version(in_flight.step, output)
        if self.rollout_pool is not None:
            self.metrics.update(self.rollout_pool.batch_metrics(output))
        self.metrics.update(
            {
                "timeline/gen_start": generated.started_at - self._clock_origin,
                "timeline/gen_end": generated.finished_at - self._clock_origin,
                "timeline/train_start": ready_at - self._clock_origin,
                "async/in_flight": self.train_dataloader.in_flight,
            }
        )

        batch = in_flight.prompts.repeat(repeat_times=self.config.actor_rollout_ref.rollout.n, interleave=True)
        batch = batch.union(output)
        self._check_rewards(in_flight.step, batch)
        self._check_correction_inputs(in_flight.step, batch)
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics=self.metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        return batch

    def _check_rewards(self, step: int, batch: DataProto) -> None:
        scores = batch.batch["rm_scores"].sum(-1)
        bad = ~torch.isfinite(scores)
        if bad.any():
            sources = sorted(set(batch.non_tensor_batch["data_source"][bad.numpy()].tolist()))
            reward = self.config.reward.custom_reward_function
            raise RewardError(
                f"The reward of {int(bad.sum())} of {len(scores)} samples of the batch for step {step} is NaN or "
                f"infinite (data_source {sources}; reward function {reward.path or 'verl default'}:{reward.name}). "
                "Training on it would corrupt every advantage of the batch; fix the reward function."
            )

    def _check_correction_inputs(self, step: int, batch: DataProto) -> None:
        # verl skips the rollout correction without a word when the rollout log-probs are missing.
        if (
            self.config.algorithm.get("rollout_correction") is not None
            and "rollout_log_probs" not in batch.batch.keys()
        ):
            raise OffPolicyCorrectionError(
                f"algorithm.rollout_correction is configured but the {self.config.actor_rollout_ref.rollout.name!r} "
                f"rollout returned no rollout_log_probs for the batch of step {step}: the off-policy correction "
                "would be skipped silently. Set actor_rollout_ref.rollout.calculate_log_probs=true, or use a "
                "rollout backend that returns per-token log-probs."
            )

    def _validates_at(self, step: int) -> bool:
        """verl's ``_fit_validate`` condition: validation runs after the sync of this step."""
        test_freq = self.config.trainer.test_freq
        return test_freq > 0 and (step >= self.total_training_steps or step % test_freq == 0)

    def _saves_at(self, step: int) -> bool:
        """verl's ``_fit_save_checkpoint`` condition (less its unpredictable ESI-expiry saves)."""
        save_freq = self.config.trainer.save_freq
        return save_freq > 0 and (step >= self.total_training_steps or step % save_freq == 0)

    def _syncs_at(self, step: int) -> bool:
        # Validation at step k evaluates v_k; a checkpoint at step k leaves the rollout at v_k too, so a
        # run resumed from it continues with the versions of the uninterrupted run.
        return step % self.async_config.sync_interval == 0 or self._validates_at(step) or self._saves_at(step)

    def _fit_update_weights(self) -> None:
        train_end = time.time()
        sync_start = sync_end = train_end
        step, pool = self.global_steps, self.rollout_pool
        synced = self._syncs_at(step)
        if pool is not None:
            pool.poll(step)  # losses, scale requests, replicas that came up
        if synced:
            # Generations launched with the previous weights finish before the new ones arrive.
            with marked_timer("wait_prev_gen", self.timing_raw), self._named_pool_loss(step + 1):
                self.train_dataloader.wait_idle(timeout_s=self.async_config.generation_timeout_s)
            if pool is not None:
                pool.before_sync(step)  # idle: the pool's membership may change now
            sync_start = time.time()
            with marked_timer("sync_weights", self.timing_raw), self._named_pool_loss(step):
                self.metrics.update(self.checkpoint_manager.update_weights(step) or {})
            sync_end = time.time()
            if pool is not None:
                pool.after_sync(step)  # replicas that got v_step take requests from now on
        else:
            self.timing_raw["sync_weights"] = 0.0  # between syncs (sync_interval > 1) the rollout keeps its weights
        self.metrics.update(
            {
                "timeline/train_end": train_end - self._clock_origin,
                "timeline/sync_start": sync_start - self._clock_origin,
                "timeline/sync_end": sync_end - self._clock_origin,
                "async/synced": float(synced),
                # What the rollout pool generated while this step ran (for s >= 1, the batches ahead).
                "async/gen_in_step_s": self.train_dataloader.busy_seconds(self._step_started_at, sync_end),
            }
        )
        if pool is not None:
            self.metrics.update(pool.metrics())
            pool.publish(step)

    @contextlib.contextmanager
    def _named_pool_loss(self, step: int) -> Iterator[None]:
        """In elastic mode, a generation or sync that failed because too few replicas are left fails by that name."""
        try:
            yield
        except Exception as error:
            lost = self.rollout_pool.explain_failure(step) if self.rollout_pool is not None else None
            if lost is not None:
                raise lost from error
            raise

    def _record_weight_version(self, step: int, output: DataProto) -> None:
        """Check the versions the rollout reports against the contract; log the measured staleness."""
        first, last = (output.non_tensor_batch.get(key) for key in ("min_global_steps", "max_global_steps"))
        if first is None or any(v is None for v in first) or any(v is None for v in last):
            raise WeightSyncError(
                f"The {self.config.actor_rollout_ref.rollout.name!r} rollout did not report the weight version of "
                "its outputs (TokenOutput.extra_fields['global_steps']); the pipeline cannot verify its weight syncs."
            )
        first, last = first.astype(np.int64), last.astype(np.int64)
        if np.any(first != last):
            raise WeightSyncError(
                f"Samples of the batch for step {step} were generated across weight versions "
                f"{sorted(set(first) | set(last))}: a weight sync reached the rollout mid-generation."
            )
        expected = expected_weight_version(step, self.async_config.staleness, self._first_step - 1, self._syncs_at)
        versions = sorted(set(first.tolist()))
        if versions != [expected]:
            raise WeightSyncError(
                f"The batch for step {step} was generated with weight version(s) {versions}, expected v{expected} "
                f"(staleness {self.async_config.staleness}, sync_interval {self.async_config.sync_interval}): a "
                "weight sync did not reach the rollout replicas."
            )
        (version,) = versions
        self.metrics["async/staleness"] = (step - 1) - version  # measured: v_{k-1} minus the rollout's version
        self.metrics["async/weight_version"] = version

    def _fit_collect_metrics(self, batch: DataProto) -> None:
        super()._fit_collect_metrics(batch)
        # verl divides by its resource pools, which hold the trainer only: count the rollout pool too
        # (one physical device when both pools share it).
        trainer, rollout = self.config.trainer, self.config.actor_rollout_ref.rollout
        devices = trainer.nnodes * trainer.n_gpus_per_node + rollout.nnodes * rollout.n_gpus_per_node
        devices = 1 if self.async_config.one_gpu else devices
        self.metrics.update(compute_throughout_metrics(batch=batch, timing_raw=self.timing_raw, n_gpus=devices))
        # (max(gen, train) + sync) / step, with gen = generation that ran during this step: 1.0 when
        # the slower pool never waits for the faster one, (max + sync) / (gen + train + sync) in lockstep.
        timing = self.timing_raw
        sync = timing["sync_weights"]
        train = timing["step"] - timing["wait_prev_gen"] - sync
        self.metrics["timing_s/train"] = train
        self.metrics["async/overlap_efficiency"] = (max(self.metrics["async/gen_in_step_s"], train) + sync) / timing[
            "step"
        ]

    # ------------------------------------------------------------------ checkpoints

    def _load_checkpoint(self) -> None:
        folder = resume_folder(self.config.trainer)
        if folder is not None:
            trainer = self.config.trainer
            verify_checkpoint(
                folder, self.config.actor_rollout_ref.model.path, trainer.nnodes * trainer.n_gpus_per_node
            )
            try:
                super()._load_checkpoint()
            except Exception as error:
                raise CheckpointError(f"Resuming from {folder} failed: {error}") from error
            # verl skips the dataloader state at epoch boundaries and restarts the sampler, which
            # reshuffles differently from an uninterrupted run; the pipeline always restores it.
            self.train_dataloader.load_state_dict(torch.load(folder / "data.pt", weights_only=False))
        self._first_step = self.global_steps + 1
        self.train_dataloader.start(first_step=self._first_step, last_step=self.total_training_steps)
