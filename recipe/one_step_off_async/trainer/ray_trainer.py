"""OneStepOffRayTrainer: verl's PPO step with generation ``staleness`` batches ahead of training.

The actor (FSDP2, verl's engine worker with role ``actor``) lives on the trainer pool; rollout
replicas live on their own pool (verl's standalone replicas: vLLM on GPUs, the recipe's ``hf``
replica on CPU). This class reuses verl's step template (``SeparateRayPPOTrainer.fit_step``:
generate -> reward -> old log-prob -> advantage -> update -> weight sync) and overrides only the seams
that decide where a batch comes from and when weights move:

- the train dataloader becomes a ``RolloutPipeline`` whose items already have their generation in
  flight, so verl's ``fit()`` runs unmodified;
- ``_fit_generate`` waits for the item's generation, then runs verl's own generation step on it;
- ``_fit_update_weights`` lets the in-flight generations finish, then syncs weights v_k (every
  ``sync_interval`` steps, and on validation and checkpoint steps), so no sequence mixes two versions;
  with ``partial_rollout`` it syncs at once: the sync interrupts the running requests, which continue
  under v_k (``rollout/partial.py``), and every token is checked against its version bounds;
- the step ends by launching the generation s+1 steps ahead (``_fit_postprocess_step``);
- checkpoints store the pipeline's resume point, so resuming at step N trains batch N+1 next.

staleness 0 is the synchronous baseline on the same pools and the same code: one queue slot.

    rollout pool:  G1 | G2 ........ | G3 ........ | G4        (staleness 1)
    actor pool:       | T1 | S      | T2 | S      | T3 | S
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import ray
import torch
from omegaconf import DictConfig
from verl import DataProto
from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
from verl.single_controller.ray import RayClassWithInitArgs
from verl.trainer.ppo.metric_utils import compute_throughout_metrics
from verl.trainer.ppo.utils import Role
from verl.utils.debug import marked_timer

from recipe.one_step_off_async.async_config import validate_config
from recipe.one_step_off_async.errors import CheckpointError, RolloutEngineDiedError
from recipe.one_step_off_async.platforms.verl_patches import hybrid_engine_assert_disabled
from recipe.one_step_off_async.trainer.checks import (
    check_correction_inputs,
    check_rewards,
    check_token_versions,
    measured_weight_version,
)
from recipe.one_step_off_async.trainer.clients import rollout_client
from recipe.one_step_off_async.trainer.console import CompactConsole
from recipe.one_step_off_async.trainer.deadlines import BoundedCheckpointManager, BoundedRolloutManager
from recipe.one_step_off_async.trainer.engine_health import EngineWatch
from recipe.one_step_off_async.trainer.engine_stats import EngineStatsReader
from recipe.one_step_off_async.trainer.pipeline import InFlightBatch, RolloutPipeline, expected_weight_version
from recipe.one_step_off_async.trainer.replay import replaying
from recipe.one_step_off_async.trainer.resume import resume_folder
from recipe.one_step_off_async.trainer.rollout_pool import FixedRolloutPool

_log = logging.getLogger(__name__)
# How long a failed generation or sync waits for the replicas to say whether an engine died (to name it).
ENGINE_ANSWER_S = 10.0


def _report_failed_rollout_start(start: Future) -> None:
    """Log a failed replica start-up at once: the trainer raises it only once the actor has started."""
    if start.exception() is not None:
        _log.error("The rollout replicas failed to start", exc_info=start.exception())


class OneStepOffRayTrainer(SeparateRayPPOTrainer):
    """PPO/GRPO on disjoint actor and rollout pools with ``async_training.staleness`` batches in flight.

    The policy worker group is registered under ``Role.ActorRollout`` because verl's step code
    addresses it so; it runs the actor only (``role="actor"``), rollout is on its own pool.
    """

    def __init__(self, config: DictConfig, tokenizer, role_worker_mapping, resource_pool_manager, **kwargs) -> None:
        self.async_config = validate_config(config)
        with hybrid_engine_assert_disabled(config):
            super().__init__(config, tokenizer, role_worker_mapping, resource_pool_manager, **kwargs)
        self.rollout_pool = FixedRolloutPool()
        self.pool_controller = None
        self._rollout_start: Future | None = None  # the replicas' start-up, begun with the actor's
        if self.async_config.elastic.enable:
            from recipe.one_step_off_async.elastic.controller import start_controller

            # Before any replica loads: a second job under the same name fails here, in seconds.
            self.pool_controller = start_controller(self.config.trainer.experiment_name)
        self._clock_origin = time.time()

    # ------------------------------------------------------------------ workers

    def _create_actor_rollout_classes(self) -> None:
        pool = self.resource_pool_manager.get_resource_pool(Role.ActorRollout)
        actor_cls = RayClassWithInitArgs(
            cls=self.role_worker_mapping[Role.ActorRollout], config=self.config.actor_rollout_ref, role="actor"
        )
        self.resource_pool_to_cls[pool][str(Role.ActorRollout)] = actor_cls

    def _create_critic_class(self) -> None:
        """The critic (GAE) as verl's ``RayPPOTrainer.init_workers`` builds it, on the training pool.

        Works around ``verl/experimental/separation/ray_trainer.py`` ``_create_critic_class`` (verl 0.9.1),
        which reads ``critic.model.fsdp_config`` (gone from ``HFModelConfig``: ``AttributeError``) and refuses
        ``fsdp2``; the FSDP engine settings are ``critic.engine``, the critic's ``fsdp`` section.
        """
        if not self.use_critic:
            return
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.engine_workers import TrainingWorkerConfig

        critic = self.orig_critic_cfg = omega_conf_to_dataclass(self.config.critic)  # verl's value loss reads it
        engine = critic.engine
        engine.infer_max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
        engine.max_token_len_per_gpu = critic.ppo_max_token_len_per_gpu
        profiler = self.config.critic.get("profiler")
        worker_config = TrainingWorkerConfig(
            model_type="value_model",
            model_config=critic.model,
            engine_config=engine,
            optimizer_config=critic.optim,
            checkpoint_config=critic.checkpoint,
            profiler_config=omega_conf_to_dataclass(profiler) if profiler else None,
            extra_context=getattr(self, "_critic_extra_context", {}),
        )
        pool = self.resource_pool_manager.get_resource_pool(Role.Critic)
        self.resource_pool_to_cls[pool][str(Role.Critic)] = RayClassWithInitArgs(
            cls=self.role_worker_mapping[Role.Critic], config=worker_config
        )

    def _create_reward_model_class(self) -> None:
        """No worker group: the reward model is served by replicas that verl's ``RewardLoopManager`` starts.

        Works around ``verl/experimental/separation/ray_trainer.py`` (verl 0.9.1), which still builds a legacy
        reward-model worker group (``role_worker_mapping[Role.RewardModel]``, a KeyError with verl's own
        separation mapping); ``RayPPOTrainer.init_workers`` builds none.
        """

    def _init_models(self) -> None:
        use_rm, self.use_rm = self.use_rm, False  # skip the legacy reward-model worker group (see above)
        try:
            super()._init_models()
        finally:
            self.use_rm = use_rm

    def _init_reward_loop(self) -> None:
        """verl's reward loop (``trainer/reward_loop.py``); a reward model gets a pool of its own.

        The pool is ``reward.reward_model.n_gpus_per_node x nnodes`` devices outside the training and rollout pools,
        one standalone replica per ``rollout`` world size of them. The reward loop's workers go to the agent loops
        (``_init_async_rollout_manager``), so each sample is scored as soon as it is generated: the scoring is part
        of generating a batch, which overlaps training, and the step only reads the scores (``rm_scores``).
        """
        from recipe.one_step_off_async.trainer.reward_loop import OneStepOffRewardLoopManager

        self.reward_loop_manager = OneStepOffRewardLoopManager(config=self.config, rm_resource_pool=None)

    def init_workers(self) -> None:
        super().init_workers()
        self._start_pipeline()
        if self.async_config.elastic.enable:
            from verl.plugin.platform import get_platform

            from recipe.one_step_off_async.elastic.pool import ElasticRolloutPool

            self.rollout_pool = ElasticRolloutPool(
                self.async_config.elastic,
                self.llm_server_manager,
                self.checkpoint_manager,
                self.pool_controller,
                device_resource=get_platform().ray_resource_name(),
            )
            print(
                f"[elastic] {len(self.rollout_pool.live)} rollout replica(s). Add or remove replicas while it runs: "
                "python -m recipe.one_step_off_async.scale --add 1 (or --remove 1, --status) --address "
                f"{ray.get_runtime_context().gcs_address} --experiment {self.config.trainer.experiment_name}"
            )

    def _start_pipeline(self) -> None:
        """Bound verl's managers and put the rollout pipeline behind the train-dataloader seam."""
        # verl's fit() syncs v_0 and _validate() generates on this thread with no deadline: bound every call,
        # and end it at once when a replica's engine dies.
        self.engine_watch = EngineWatch(self.llm_server_manager.get_replicas, self.async_config.elastic.enable)
        self.checkpoint_manager = BoundedCheckpointManager(
            self.checkpoint_manager,
            self.async_config.sync_timeout_s,
            self.config.actor_rollout_ref.rollout.checkpoint_engine.backend,
            self.engine_watch.check,
        )
        self.engine_stats = EngineStatsReader(
            lambda: [server for replica in self.llm_server_manager.get_replicas() for server in replica.servers]
        )
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

    def _init_worker_groups(self) -> None:
        """Start the rollout replicas while the training workers start and load the model.

        verl starts the rollout after the actor so that vLLM sees the memory the actor left on a GPU they share;
        here the pools are disjoint (but for ``one_gpu``), so the replicas' start-up (vLLM: loading the weights,
        capturing CUDA graphs) overlaps the actor's instead of following it. ``_init_async_rollout_manager``
        takes the started replicas, or raises the error that stopped them.
        """
        if not self.async_config.one_gpu:
            from verl.workers.rollout.llm_server import LLMServerManager

            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-start")
            # Standalone replicas on their own pool: LLMServerManager gets no worker group.
            self._rollout_start = executor.submit(LLMServerManager.create, config=self.config)
            self._rollout_start.add_done_callback(_report_failed_rollout_start)
            executor.shutdown(wait=False)  # its thread ends with the start; the future keeps the outcome
        super()._init_worker_groups()

    def _started_rollout_servers(self):
        """The replicas begun with the actor (their start-up's error if it failed), else started now."""
        if self._rollout_start is not None:
            return self._rollout_start.result()
        from verl.workers.rollout.llm_server import LLMServerManager

        return LLMServerManager.create(config=self.config)

    def _init_async_rollout_manager(self) -> None:
        from recipe.one_step_off_async.trainer.agent_loops import agent_loop_manager_class

        manager_class = agent_loop_manager_class(self.config)
        self.llm_server_manager = self._started_rollout_servers()
        self.async_rollout_mode = True
        client_cls, client_options = rollout_client(self.async_config, self.pool_controller)
        self.async_rollout_manager = manager_class.create(
            config=self.config,
            llm_client=self.llm_server_manager.get_client(client_cls, **client_options),
            reward_loop_worker_handles=self.reward_loop_manager.reward_loop_workers,
        )

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
                try:
                    self._finish_loggers(exit_code=0 if succeeded else 1)
                except Exception:  # a tracker that cannot flush must not hide the run's own error
                    _log.exception("Finishing the trackers of trainer.logger failed")
            self.train_dataloader.close()
            self.rollout_pool.close()
            if self.progress_bar is not None:
                self.progress_bar.close()

    def _finish_loggers(self, exit_code: int) -> None:
        """wandb & co. flush and mark the run finished (or failed): verl's fit() never finishes them, and the
        process is killed before ``Tracking.__del__`` could."""
        self.logger.finish(exit_code=exit_code)
        if "wandb" in self.logger.logger:
            import wandb

            # Stop wandb's service process now: its atexit teardown would find it killed along with the
            # actor and print a ConnectionResetError traceback after a clean run.
            wandb.teardown(exit_code=exit_code)

    @property
    def logger(self):
        """verl's ``Tracking``, which ``fit()`` creates; its console backend is the recipe's compact line."""
        return self._tracking

    @logger.setter
    def logger(self, tracking) -> None:
        if tracking is not None and "console" in tracking.logger and self.async_config.console == "compact":
            tracking.logger["console"] = CompactConsole(self.total_training_steps)
        self._tracking = tracking

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
        # The pipeline built the batch when it launched its generation.
        self.metrics["timeline/step_start"] = time.time() - self._clock_origin
        return in_flight

    def _fit_generate(self, in_flight: InFlightBatch) -> DataProto:
        step = in_flight.step
        with marked_timer("wait_prev_gen", self.timing_raw), self._failures_named(step):
            generated = in_flight.result(self.async_config.generation_timeout_s, self.engine_watch.check)
        ready_at = time.time()
        # verl's generation step on the output that is already here (trainer/replay.py).
        with replaying(self, generated.output):
            batch = super()._fit_generate(in_flight.prompts)
        self.timing_raw["gen"] = generated.seconds

        rollout, correction = self.config.actor_rollout_ref.rollout, self.config.algorithm.get("rollout_correction")
        # The agent loops scored each sample as it was generated: rm_scores came with the generation.
        check_rewards(step, batch, scored_by=self._reward_source)
        check_correction_inputs(step, batch, correction is not None, rollout.name)
        self.metrics.update(self._weight_version_metrics(step, generated.output))
        self.metrics.update(
            {
                "async/in_flight": self.train_dataloader.in_flight,
                "timeline/gen_start": generated.started_at - self._clock_origin,
                "timeline/gen_end": generated.finished_at - self._clock_origin,
                "timeline/train_start": ready_at - self._clock_origin,
                **self.rollout_pool.batch_metrics(generated.output),
            }
        )
        return batch

    @property
    def _reward_source(self) -> str:
        """What scores the samples (verl's reward loop: the function if one is set, else the reward model)."""
        reward = self.config.reward
        if reward.custom_reward_function.path is None and reward.reward_model.enable:
            return f"reward model {reward.reward_model.model_path}"
        return f"reward function {reward.custom_reward_function.path or 'verl default'}:{reward.custom_reward_function.name}"

    def _weight_version_metrics(self, step: int, output: DataProto) -> dict[str, float]:
        """Check the batch's weight versions against the contract; return what was measured.

        ``async/staleness`` is v_{k-1} minus the oldest version that sampled a token of the batch (the bound
        the contract gives); ``async/staleness_{min,mean,max}`` weigh every response token by its version.
        """
        base, staleness = self.train_dataloader.first_step - 1, self.async_config.staleness
        oldest = expected_weight_version(step, staleness, base, self._syncs_at)
        contract = f"staleness {staleness}, sync_interval {self.async_config.sync_interval}"
        name = self.config.actor_rollout_ref.rollout.name
        if self.async_config.partial_rollout:
            newest = expected_weight_version(step, 0, base, self._syncs_at)  # the last version synced before step k
            metrics = check_token_versions(step, output, oldest, newest, f"partial rollout, {contract}")
            version = step - 1 - int(metrics["async/staleness_max"])
        else:
            version = measured_weight_version(step, output, oldest, name, contract)
            metrics = {f"async/staleness_{stat}": float(step - 1 - version) for stat in ("min", "mean", "max")}
            metrics |= {"async/partial_ratio": 0.0, "async/version_span_max": 0.0}
            metrics["async/recomputed_prefill_tokens"] = 0.0
        return metrics | {"async/staleness": step - 1 - version, "async/weight_version": version}

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
        sync_start = sync_end = train_end = time.time()
        step, pool = self.global_steps, self.rollout_pool
        synced = self._syncs_at(step)
        pool.poll(step)  # losses, scale requests, replicas that came up
        if synced:
            if not self.async_config.partial_rollout:
                # Generations launched with the previous weights finish before the new ones arrive.
                with marked_timer("wait_prev_gen", self.timing_raw), self._failures_named(step + 1):
                    self.train_dataloader.wait_idle(self.async_config.generation_timeout_s, self.engine_watch.check)
            pool.before_sync(step)  # idle, or about to be interrupted (partial): membership may change now
            sync_start = time.time()
            with marked_timer("sync_weights", self.timing_raw), self._failures_named(step):
                self.metrics.update(self.checkpoint_manager.update_weights(step) or {})
            sync_end = time.time()
            pool.after_sync(step)  # replicas that got v_step take requests from now on
        else:
            self.timing_raw["sync_weights"] = 0.0  # between syncs (sync_interval > 1) the rollout keeps its weights
        step_start = self.metrics["timeline/step_start"] + self._clock_origin
        self.metrics.update(
            {
                "timeline/train_end": train_end - self._clock_origin,
                "timeline/sync_start": sync_start - self._clock_origin,
                "timeline/sync_end": sync_end - self._clock_origin,
                "async/synced": float(synced),
                # What the rollout pool generated while this step ran (for s >= 1, the batches ahead).
                "async/gen_in_step_s": self.train_dataloader.busy_seconds(step_start, sync_end),
                **pool.metrics(),
                **self.engine_stats.metrics(),
            }
        )
        pool.publish(step)

    def _fit_postprocess_step(self) -> None:
        super()._fit_postprocess_step()
        # The step is over and its weights are synced: start the batch s+1 steps ahead with them.
        self.train_dataloader.launch_ahead()

    @contextlib.contextmanager
    def _failures_named(self, step: int) -> Iterator[None]:
        """A generation or sync that failed because the rollout pool lost too many replicas, or because a replica's
        engine died, fails by that name."""
        try:
            yield
        except RolloutEngineDiedError:
            raise  # the engine watch named it already
        except Exception as error:
            lost = self.rollout_pool.explain_failure(step)
            if lost is not None:
                raise lost from error
            # Raises RolloutEngineDiedError naming a dead engine, with the error as its context.
            self.engine_watch.name_a_dead_engine(timeout_s=ENGINE_ANSWER_S)
            raise

    def _fit_collect_metrics(self, batch: DataProto) -> None:
        super()._fit_collect_metrics(batch)
        # verl divides by its resource pools, which hold the trainer only: count the rollout pool too
        # (one physical device when both pools share it).
        trainer, rollout = self.config.trainer, self.config.actor_rollout_ref.rollout
        devices = trainer.nnodes * trainer.n_gpus_per_node + rollout.nnodes * rollout.n_gpus_per_node
        reward_model = self.config.reward.reward_model
        devices += reward_model.nnodes * reward_model.n_gpus_per_node if reward_model.enable else 0
        devices = 1 if self.async_config.one_gpu else devices
        self.metrics.update(compute_throughout_metrics(batch=batch, timing_raw=self.timing_raw, n_gpus=devices))
        # (max(gen, train) + sync) / step, with gen = generation that ran during this step: 1.0 when
        # the slower pool never waits for the faster one, (max + sync) / (gen + train + sync) in lockstep.
        timing = self.timing_raw
        sync = timing["sync_weights"]
        train = timing["step"] - timing["wait_prev_gen"] - sync
        self.metrics["timing_s/train"] = train
        gen = self.metrics["async/gen_in_step_s"]
        self.metrics["async/overlap_efficiency"] = (max(gen, train) + sync) / timing["step"]

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
