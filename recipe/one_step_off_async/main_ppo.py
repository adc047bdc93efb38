"""Entry point: ``python -m recipe.one_step_off_async.main_ppo [--config-name=...] <hydra overrides>``.

GPU (default config): FSDP2 actor on ``trainer.*`` devices, vLLM replicas on
``actor_rollout_ref.rollout.nnodes x n_gpus_per_node`` devices, NCCL weight sync.
CPU (``--config-name=one_step_off_ppo_cpu``): the same trainer on the CPU platform with the
``hf`` replica and the ``gloo`` engine, on the built-in tiny task (built on first use).

The config is validated here, before Ray starts; the trainer runs in a Ray actor as in verl.
"""

from __future__ import annotations

import os
from pprint import pprint

import hydra
import ray
from omegaconf import DictConfig, OmegaConf, open_dict

from recipe.one_step_off_async.async_config import check_data_files, validate_config
from recipe.one_step_off_async.preflight import check_backends


def _demo_asset(field: str) -> str:
    """``${demo_asset:model_dir}`` in a config: a path of the built-in tiny task, built on first use."""
    from recipe.one_step_off_async.demo.assets import ensure_assets

    return str(getattr(ensure_assets(), field))


OmegaConf.register_new_resolver("demo_asset", _demo_asset, replace=True)


def prepare_config(config: DictConfig) -> None:
    """Validate, resolve and set up the platform; everything that must happen before Ray starts."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config as verl_validate_config

    validate_config(config)
    from recipe.one_step_off_async import policy_losses

    # Each adds itself to VERL_USE_EXTERNAL_MODULES (keeping what is listed) to run in every Ray worker.
    env = policy_losses.enable(config)  # the recipe's losses, registered on every device
    if config.trainer.device == "cpu":
        from recipe.one_step_off_async import cpu

        env.update(cpu.activate())
    if config.async_training.one_gpu:
        from recipe.one_step_off_async import one_gpu

        env.update(one_gpu.activate())
        with open_dict(config):
            config.ray_kwargs.ray_init.num_gpus = one_gpu.LOGICAL_GPUS
    runtime_env = config.ray_kwargs.ray_init.runtime_env
    with open_dict(runtime_env):
        runtime_env.env_vars = {**(runtime_env.get("env_vars") or {}), **env}
    # Resolve in the driver: built-in asset paths are materialised once, before workers start.
    OmegaConf.resolve(config)
    check_data_files(config)
    verl_validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )


@ray.remote(num_cpus=1)
class OneStepOffTaskRunner:
    """Builds datasets, worker mapping and the trainer inside the Ray cluster, then trains."""

    def run(self, config: DictConfig) -> None:
        from verl.experimental.separation.utils import create_resource_pool_manager
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

        from recipe.one_step_off_async.ray_trainer import OneStepOffRayTrainer

        print(f"OneStepOffTaskRunner pid {os.getpid()}")
        pprint(OmegaConf.to_container(config, resolve=True))
        role_worker_mapping = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker)}
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
                raise ValueError(
                    f"The {split} data {config.data[f'{split}_files']} has no usable rows: it is empty, or every "
                    f"prompt is longer than data.max_prompt_length={config.data.max_prompt_length} tokens and was "
                    "filtered out (data.filter_overlong_prompts). Check the files or raise max_prompt_length."
                )
        trainer = OneStepOffRayTrainer(
            config,
            model_config.tokenizer,
            role_worker_mapping,
            create_resource_pool_manager(config, role_worker_mapping.keys()),
            processor=model_config.processor,
            train_dataset=datasets["train"],
            val_dataset=datasets["val"],
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, datasets["train"]),
            device_name=config.trainer.device,
        )
        trainer.init_workers()
        trainer.fit()


@hydra.main(config_path="config", config_name="one_step_off_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo

    prepare_config(config)
    check_backends(config)
    run_ppo(config, task_runner_class=OneStepOffTaskRunner)


if __name__ == "__main__":
    main()
