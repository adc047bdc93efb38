"""The Ray actor that builds the datasets, the worker mapping and the trainer inside the cluster, then trains.

``main_ppo`` hands it to verl's ``run_ppo`` (``task_runner_class``), as verl's own entry point does
with its ``TaskRunner``: the actor and the critic train on verl's engine workers, the rollout runs on
the replicas of ``actor_rollout_ref.rollout.name``.
"""

from __future__ import annotations

import os
from pprint import pprint

import ray
from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.cluster import node_local_problem
from recipe.one_step_off_async.errors import ConfigError, WorkerLostError
from recipe.one_step_off_async.preflight import pools_unplaceable


@ray.remote(num_cpus=1)
class OneStepOffTaskRunner:
    def run(self, config: DictConfig) -> None:
        from verl.plugin.platform import get_platform
        from verl.trainer.ppo.utils import (
            Role,
            create_rl_dataset,
            create_rl_sampler,
            need_critic,
            need_reference_policy,
        )
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig
        from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

        from recipe.one_step_off_async.trainer.ray_trainer import OneStepOffRayTrainer
        from recipe.one_step_off_async.trainer.step_metrics import job_resource_pool_manager
        from recipe.one_step_off_async.trainer.workers import OneStepOffActorRolloutRefWorker

        print(f"OneStepOffTaskRunner pid {os.getpid()}")
        if problem := node_local_problem(config, {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}):
            raise ConfigError(problem)
        free = ray._private.state.available_resources_per_node()
        if problem := pools_unplaceable(config, free, get_platform().ray_resource_name()):
            raise ConfigError(problem)  # before any model loads (verl's own check counts the total only)
        pprint(OmegaConf.to_container(config, resolve=True))
        role_worker_mapping = {Role.ActorRollout: ray.remote(OneStepOffActorRolloutRefWorker)}
        if need_critic(config):
            role_worker_mapping[Role.Critic] = ray.remote(TrainingWorker)
        if need_reference_policy(config):
            role_worker_mapping[Role.RefPolicy] = ray.remote(ActorRolloutRefWorker)

        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        datasets = {
            split: create_rl_dataset(
                files,
                config.data,
                model_config.tokenizer,
                model_config.processor,
                is_train=split == "train",
                max_samples=config.data.get(f"{split}_max_samples", -1),
            )
            for split, files in (("train", config.data.train_files), ("val", config.data.val_files))
        }
        for split, dataset in datasets.items():
            if len(dataset) == 0:
                raise ConfigError(
                    f"The {split} data {config.data[f'{split}_files']} has no usable rows: every prompt is longer "
                    f"than data.max_prompt_length={config.data.max_prompt_length} tokens and was filtered out "
                    "(data.filter_overlong_prompts). Check the files or raise max_prompt_length."
                )
        trainer = OneStepOffRayTrainer(
            config,
            model_config.tokenizer,
            role_worker_mapping,
            job_resource_pool_manager(config, role_worker_mapping, OmegaConf.select(config, "async_training.one_gpu")),
            processor=model_config.processor,
            train_dataset=datasets["train"],
            val_dataset=datasets["val"],
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, datasets["train"]),
            device_name=config.trainer.device,
        )
        try:
            trainer.init_workers()
            trainer.fit()
        except ray.exceptions.RayActorError as error:  # not a replica's: the elastic pool and engine checks take those
            raise WorkerLostError(lost_worker(error)) from error


def lost_worker(error: ray.exceptions.RayActorError) -> str:
    """Which worker is gone and on which node (Ray's error names neither until it declares the node dead)."""
    try:
        actor = ray._private.state.actors(error.actor_id) if error.actor_id else {}
    except Exception:  # the GCS may not answer either: name what the error names
        actor = {}
    where = actor.get("Address") or {}
    state = "unreachable" if isinstance(error, ray.exceptions.ActorUnavailableError) else "gone"
    return (
        f"{actor.get('ActorClassName', 'A worker').rsplit('.', 1)[-1]} (actor {error.actor_id}) on node "
        f"{where.get('NodeID')} ({where.get('IPAddress')}) is {state}: {str(error).splitlines()[0]} -- The run cannot "
        "go on without it; if its node was lost, resume on the nodes left (trainer.resume_mode=auto)."
    )
