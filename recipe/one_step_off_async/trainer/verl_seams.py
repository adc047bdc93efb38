"""verl's separation trainer set up for disjoint pools: construction, workers, replicas, reward loop, trackers.

``DisjointPoolsTrainer`` is verl 0.9.1's ``SeparateRayPPOTrainer`` (``verl/experimental/separation/
ray_trainer.py``) with its construction and start-up adapted; it changes nothing of the step (the overlap is
``trainer/ray_trainer.py``). Where an override works around verl, it names the verl code;
``tests/test_platforms_verl_compat_on_cpu.py`` fails when verl changes that code, so an upgrade cannot silently
make a work-around wrong or unneeded.
"""

from __future__ import annotations

from omegaconf import DictConfig, open_dict
from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
from verl.single_controller.ray import RayClassWithInitArgs
from verl.trainer.ppo.utils import Role

from recipe.one_step_off_async.losses import BYPASS_LOSS_MODE
from recipe.one_step_off_async.platforms.verl_patches import hybrid_engine_assert_disabled
from recipe.one_step_off_async.trainer.clients import rollout_client
from recipe.one_step_off_async.trainer.configured_class import qualified_name
from recipe.one_step_off_async.trainer.console import with_compact_console
from recipe.one_step_off_async.trainer.deadlines import call_with_deadline
from recipe.one_step_off_async.trainer.replica_start import ReplicaStart, not_started, place_pools
from recipe.one_step_off_async.trainer.sync_manager import checkpoint_manager_class


def route_bypass_loss_to_the_actor(config: DictConfig) -> None:
    """verl/experimental/separation/ray_trainer.py (0.9.1) ``_fit_compute_log_prob``: in bypass mode
    (``algorithm.rollout_correction.bypass_mode=true``) ``apply_bypass_mode`` points the policy loss at verl's
    ``bypass_mode`` loss, with the ``rollout_correction`` section it reads, in the driver's config, at every step,
    after the actor workers were built from that config (verl#4912). The actor then runs the configured loss with
    pi_old = the rollout's log-probs and never sees ``rollout_rs``, ``loss_type=reinforce`` or the section at all, nor
    logs the sampler's distance (``rollout_corr/*``). Do what ``apply_bypass_mode`` does to the config, before the
    workers exist. (For ``loss_type=ppo_clip`` the loss is the same: vanilla PPO on pi / pi_rollout, no IS weight.)"""
    correction = config.algorithm.get("rollout_correction")
    if correction is None or not correction.get("bypass_mode", False):
        return
    with open_dict(config):
        policy_loss = config.actor_rollout_ref.actor.policy_loss
        policy_loss.loss_mode = BYPASS_LOSS_MODE
        policy_loss.rollout_correction = correction


class DisjointPoolsTrainer(SeparateRayPPOTrainer):
    """verl's separation trainer with an actor-only worker group, replicas started with it, a GAE critic, a reward
    model's pool, the recipe's weight-sync manager and console line. Subclasses set ``async_config`` and
    ``pool_controller``."""

    def __init__(self, config: DictConfig, *args, **kwargs) -> None:
        # verl's init_workers builds the weight-sync manager this key names: the recipe's, or a user's subclass of it.
        with open_dict(config):
            config.actor_rollout_ref.rollout.checkpoint_manager_class = qualified_name(checkpoint_manager_class(config))
        route_bypass_loss_to_the_actor(config)  # verl routes it in the driver only, after building the workers
        # verl/trainer/ppo/ray_trainer.py: RayPPOTrainer.__init__ asserts hybrid_engine; the rollout is on its own pool.
        with hybrid_engine_assert_disabled(config):
            super().__init__(config, *args, **kwargs)

    def _create_actor_rollout_classes(self) -> None:
        """The policy worker group runs the actor only (``role="actor"``); the rollout replicas have a pool of their own.

        verl's step code addresses the actor as ``Role.ActorRollout``, so the group is registered under that role.
        """
        pool = self.resource_pool_manager.get_resource_pool(Role.ActorRollout)
        actor_cls = RayClassWithInitArgs(
            cls=self.role_worker_mapping[Role.ActorRollout], config=self.config.actor_rollout_ref, role="actor"
        )
        self.resource_pool_to_cls[pool][str(Role.ActorRollout)] = actor_cls

    def _create_critic_class(self) -> None:
        """The critic (GAE) as verl's ``RayPPOTrainer.init_workers`` builds it, on the training pool.

        Works around ``_create_critic_class`` of the separation trainer, which reads ``critic.model.fsdp_config``
        (gone from ``HFModelConfig``: ``AttributeError``) and refuses ``fsdp2``; the FSDP engine settings are
        ``critic.engine``, the critic's ``fsdp`` section.
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

        Works around the separation trainer, which still builds a legacy reward-model worker group
        (``role_worker_mapping[Role.RewardModel]``, a KeyError with verl's own separation mapping);
        ``RayPPOTrainer.init_workers`` builds none.
        """

    def _init_models(self) -> None:
        use_rm, self.use_rm = self.use_rm, False  # skip the legacy reward-model worker group (see above)
        try:
            super()._init_models()
        finally:
            self.use_rm = use_rm

    def _init_reward_loop(self) -> None:
        """verl's reward loop with the recipe's workers (``trainer/reward_loop.py``); a reward model gets a pool of its own.

        The pool is ``reward.reward_model.n_gpus_per_node x nnodes`` devices outside the training and rollout pools,
        one standalone replica per ``rollout`` world size of them. The reward loop's workers go to the agent loops
        (``_init_async_rollout_manager``), so each sample is scored as soon as it is generated: the scoring is part
        of generating a batch, which overlaps training, and the step only reads the scores (``rm_scores``).
        """
        from recipe.one_step_off_async.trainer.reward_loop import OneStepOffRewardLoopManager

        def start() -> OneStepOffRewardLoopManager:
            return OneStepOffRewardLoopManager(config=self.config, rm_resource_pool=None)

        if not self.config.reward.reward_model.enable:  # no replicas to place: the loop's workers only
            self.reward_loop_manager = start()
            return
        timeout_s = self.async_config.start_timeout_s
        self.reward_loop_manager = call_with_deadline(
            start,
            timeout_s,
            lambda: not_started("reward model replicas", "reward.reward_model", self.config, timeout_s),
        )

    def _init_worker_groups(self) -> None:
        self.replica_start = ReplicaStart(
            self.config, overlap=not self.async_config.one_gpu, timeout_s=self.async_config.start_timeout_s
        )
        self.replica_start.begin()  # on disjoint pools the replicas start while the actor's workers do (replica_start.py)
        pools = self.resource_pool_manager.resource_pool_dict
        place_pools(self.config, pools, self.async_config.start_timeout_s, self.device_name)
        super()._init_worker_groups()

    def _init_async_rollout_manager(self) -> None:
        from recipe.one_step_off_async.trainer.agent_loops import agent_loop_manager_class

        manager_class = agent_loop_manager_class(self.config)
        self.llm_server_manager = self.replica_start.servers()
        self.async_rollout_mode = True
        client_cls, client_options = rollout_client(self.async_config, self.pool_controller)
        self.async_rollout_manager = manager_class.create(
            config=self.config,
            llm_client=self.llm_server_manager.get_client(client_cls, **client_options),
            reward_loop_worker_handles=self.reward_loop_manager.reward_loop_workers,
        )

    @property
    def logger(self):
        """verl's ``Tracking``, which ``fit()`` creates; its console backend is the recipe's compact line."""
        return self._tracking

    @logger.setter
    def logger(self, tracking) -> None:
        compact = self.async_config.console == "compact"
        self._tracking = with_compact_console(tracking, self.total_training_steps) if compact else tracking
