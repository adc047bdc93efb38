"""OneStepOffRayTrainer: verl's PPO step with generation ``staleness`` batches ahead of training.

The actor trains on its own pool while the rollout replicas generate on theirs. This class keeps verl's step template
(``SeparateRayPPOTrainer.fit_step``: generate -> reward -> old log-prob -> advantage -> update -> weight sync) and its
``fit()`` unmodified, and overrides only the seams that decide where a batch comes from (a ``RolloutPipeline`` behind
the train-dataloader seam, its generation already in flight) and when weights move (``SyncSchedule``). The contract and
the modes (staleness 0 is the synchronous baseline; partial rollout): docs/advance/one_step_off_async/pipeline.md.

    rollout pool:  G1 | G2 ........ | G3 ........ | G4        (staleness 1)
    actor pool:       | T1 | S      | T2 | S      | T3 | S

Everything else is a feature the trainer calls at the named points of a step (``trainer/hooks.py``): the rollout
pool (fixed, or elastic), the weight-version contract, the engines' statistics; ``_features`` registers them.
verl's set-up (workers, replicas, reward loop, trackers) for disjoint pools is ``trainer/verl_seams.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
import torch
from omegaconf import DictConfig
from verl import DataProto
from verl.utils.debug import marked_timer

from recipe.one_step_off_async.async_config import AsyncTrainingConfig
from recipe.one_step_off_async.errors import CheckpointError, RolloutEngineDiedError
from recipe.one_step_off_async.trainer.checks import check_correction_inputs, check_rewards
from recipe.one_step_off_async.trainer.console import finish_trackers
from recipe.one_step_off_async.trainer.deadlines import BoundedRolloutManager
from recipe.one_step_off_async.trainer.engine_health import EngineWatch
from recipe.one_step_off_async.trainer.engine_stats import EngineStatsReader
from recipe.one_step_off_async.trainer.hooks import StepHookList, StepHooks
from recipe.one_step_off_async.trainer.pipeline import InFlightBatch, RolloutPipeline
from recipe.one_step_off_async.trainer.replay import replaying
from recipe.one_step_off_async.trainer.resume import resume_folder
from recipe.one_step_off_async.trainer.reward_loop import reward_source
from recipe.one_step_off_async.trainer.rollout_pool import rollout_pool
from recipe.one_step_off_async.trainer.schedule import SyncSchedule, VersionContract
from recipe.one_step_off_async.trainer.step_metrics import StepTimeline, overlap_metrics
from recipe.one_step_off_async.trainer.verl_seams import DisjointPoolsTrainer

# How long a failed generation or sync waits for the replicas to say whether an engine died (to name it).
ENGINE_ANSWER_S = 10.0


class OneStepOffRayTrainer(DisjointPoolsTrainer):
    """PPO/GRPO on disjoint actor and rollout pools with ``async_training.staleness`` batches in flight."""

    def __init__(self, config: DictConfig, tokenizer, role_worker_mapping, resource_pool_manager, **kwargs) -> None:
        # The launch check validated the config before Ray started (launch.prepare_config): parse it, once.
        self.async_config = AsyncTrainingConfig.from_config(config)
        super().__init__(config, tokenizer, role_worker_mapping, resource_pool_manager, **kwargs)
        self.schedule = SyncSchedule(config.trainer, self.async_config.sync_interval, self.total_training_steps)
        self.timeline = StepTimeline()
        self.pool_controller = None
        if self.async_config.elastic.enable:
            from recipe.one_step_off_async.elastic.controller import start_controller

            # Before any replica loads: a second job under the same name fails here, in seconds.
            self.pool_controller = start_controller(self.config.trainer.experiment_name)

    # ------------------------------------------------------------------ start-up

    def init_workers(self) -> None:
        super().init_workers()
        self._start_pipeline()

    def _start_pipeline(self) -> None:
        """Bound verl's managers, put the rollout pipeline behind the train-dataloader seam, register the features."""
        # verl's fit() syncs v_0 and _validate() generates on this thread with no deadline: bound every call,
        # and end it at once when a replica's engine dies.
        self.engine_watch = EngineWatch(self.llm_server_manager.get_replicas, self.async_config.elastic.enable)
        self.checkpoint_manager.set_deadline(self.async_config.sync_timeout_s, self.engine_watch.check)
        rollout = self.async_rollout_manager
        self.async_rollout_manager = BoundedRolloutManager(
            rollout, self.async_config.generation_timeout_s, self.engine_watch.check
        )
        self.train_dataloader = RolloutPipeline(
            self.train_dataloader,
            staleness=self.async_config.staleness,
            prepare=self._prepare_generation,
            generate=rollout.generate_sequences,  # the pipeline bounds its own waits
            total_epochs=self.config.trainer.total_epochs,
            concurrent_batches=self.async_config.partial_rollout,
        )
        self.features = StepHookList(self._features())

    def _features(self) -> list[StepHooks]:
        """What the trainer calls at the named points of a step (``trainer/hooks.py``), in this order."""
        servers, experiment = self.llm_server_manager.get_replicas, self.config.trainer.experiment_name
        return [
            rollout_pool(
                self.async_config, self.llm_server_manager, self.checkpoint_manager, self.pool_controller, experiment
            ),
            VersionContract(
                self.async_config,
                self.schedule,
                self.config.actor_rollout_ref.rollout.name,
                lambda: self.train_dataloader.first_step,
            ),
            EngineStatsReader(lambda: [server for replica in servers() for server in replica.servers]),
        ]

    # ------------------------------------------------------------------ the step's seams

    def fit(self) -> None:
        succeeded = False
        try:
            super().fit()
            self._shutdown_dump_executor()  # the last step's rollout dump lands before the process ends
            succeeded = True
        finally:
            # Ctrl-C reaches this thread as SystemExit (Ray stops the actor of a driver that exits).
            if self.logger is not None:
                finish_trackers(self.logger, succeeded)
            self.train_dataloader.close()
            self.features.close()
            if self.progress_bar is not None:
                self.progress_bar.close()

    def _prepare_generation(self, batch_dict: dict, step: int) -> tuple[DataProto, DataProto]:
        """Build the step's batch (with uids) and the prompts sent to the rollout pool."""
        batch = super()._fit_get_batch(batch_dict)
        gen_batch = self._get_gen_batch(batch)
        gen_batch.meta_info["global_steps"] = step
        gen_batch = gen_batch.repeat(repeat_times=self.config.actor_rollout_ref.rollout.n, interleave=True)
        if self.async_config.partial_rollout:
            # The batches in flight share the replicas: the older one first (lower is earlier, as in vLLM);
            # unique per sample, as verl's own arange (single_turn_agent_loop builds request ids from it).
            size = len(gen_batch)
            gen_batch.non_tensor_batch["priority"] = step * size + np.arange(size, dtype=np.int64)
        return batch, gen_batch

    def _fit_get_batch(self, in_flight: InFlightBatch) -> InFlightBatch:
        self.metrics.update(self.timeline.step_started())
        return in_flight  # the pipeline built the batch when it launched its generation

    def _fit_generate(self, in_flight: InFlightBatch) -> DataProto:
        step = in_flight.step
        with marked_timer("wait_prev_gen", self.timing_raw), self._failures_named(step):
            generated = in_flight.result(self.async_config.generation_timeout_s, self.engine_watch.check)
        ready_at = time.time()
        with replaying(self, generated.output):  # verl's generation step on the output already here (replay.py)
            batch = super()._fit_generate(in_flight.prompts)
        self.timing_raw["gen"] = generated.seconds
        # The agent loops scored each sample as it was generated: rm_scores came with the generation.
        check_rewards(step, batch, scored_by=reward_source(self.config.reward))
        correction = self.config.algorithm.get("rollout_correction") is not None
        check_correction_inputs(step, batch, correction, self.config.actor_rollout_ref.rollout.name)
        self.metrics.update(self.features.batch_metrics(step, generated.output))
        self.metrics["async/in_flight"] = self.train_dataloader.in_flight
        self.metrics.update(
            self.timeline.mark(gen_start=generated.started_at, gen_end=generated.finished_at, train_start=ready_at)
        )
        return batch

    def _fit_update_weights(self) -> None:
        step, train_end = self.global_steps, time.time()
        synced = self.schedule.syncs_at(step)
        self.features.poll(step)  # e.g. the elastic pool's losses, scale requests, replicas that came up
        sync_start = sync_end = train_end
        if synced:
            if not self.async_config.partial_rollout:
                # Generations launched with the previous weights finish before the new ones arrive.
                with marked_timer("wait_prev_gen", self.timing_raw), self._failures_named(step + 1):
                    self.train_dataloader.wait_idle(self.async_config.generation_timeout_s, self.engine_watch.check)
            self.features.before_sync(step)  # idle, or about to be interrupted (partial): membership may change
            sync_start = time.time()
            with marked_timer("sync_weights", self.timing_raw), self._failures_named(step):
                self.metrics.update(self.checkpoint_manager.update_weights(step) or {})
            sync_end = time.time()
            self.features.after_sync(step)  # replicas that got v_step take requests from now on
        else:
            self.timing_raw["sync_weights"] = 0.0  # the rollout keeps its weights (sync_interval, critic warm-up)
        self.metrics.update(self.timeline.mark(train_end=train_end, sync_start=sync_start, sync_end=sync_end))
        self.metrics["async/synced"] = float(synced)
        # What the rollout pool generated while this step ran (for s >= 1, the batches ahead).
        step_start = self.timeline.marks["step_start"]
        self.metrics["async/gen_in_step_s"] = self.train_dataloader.busy_seconds(step_start, sync_end)
        self.metrics.update(self.features.metrics())
        self.features.publish(step)

    def _fit_postprocess_step(self) -> None:
        super()._fit_postprocess_step()
        # The step is over and its weights are synced: start the batch s+1 steps ahead with them.
        self.train_dataloader.launch_ahead()

    def _fit_collect_metrics(self, batch: DataProto) -> None:
        super()._fit_collect_metrics(batch)  # throughput per device of the job (step_metrics.JobResourcePoolManager)
        self.metrics.update(overlap_metrics(self.timing_raw, self.metrics["async/gen_in_step_s"]))

    @contextlib.contextmanager
    def _failures_named(self, step: int) -> Iterator[None]:
        """A generation or sync that failed because a feature caused it (the rollout pool lost too many replicas), or
        because a replica's engine died, fails by that name."""
        try:
            yield
        except RolloutEngineDiedError:
            raise  # the engine watch named it already
        except Exception as error:
            cause = self.features.explain_failure(step)
            if cause is not None:
                raise cause from error
            # Raises RolloutEngineDiedError naming a dead engine, with the error as its context.
            self.engine_watch.name_a_dead_engine(timeout_s=ENGINE_ANSWER_S)
            raise

    # ------------------------------------------------------------------ checkpoints

    def _load_checkpoint(self) -> None:
        # The folder was verified before Ray started (launch.prepare_config).
        folder = resume_folder(self.config.trainer)
        if folder is not None:
            try:
                super()._load_checkpoint()
            except Exception as error:
                raise CheckpointError(f"Resuming from {folder} failed: {error}") from error
            # verl skips the dataloader state at epoch boundaries and restarts the sampler, which
            # reshuffles differently from an uninterrupted run; the pipeline always restores it.
            self.train_dataloader.load_state_dict(torch.load(folder / "data.pt", weights_only=False))
        self.train_dataloader.start(first_step=self.global_steps + 1, last_step=self.total_training_steps)
