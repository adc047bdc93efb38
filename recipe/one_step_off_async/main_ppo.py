"""Entry point: ``python -m recipe.one_step_off_async.main_ppo [--config-name=...] <hydra overrides>``.

GPU (default config): FSDP2 actor on ``trainer.*`` devices, vLLM replicas on
``actor_rollout_ref.rollout.nnodes x n_gpus_per_node`` devices, NCCL weight sync.
CPU (``--config-name=one_step_off_ppo_cpu``): the same trainer on the CPU platform with the
``hf`` replica and the ``gloo`` engine, on the built-in tiny task (built on first use).

The config is checked before Ray starts (``launch.prepare_config``, then every selected backend is
installed); the trainer runs in a Ray actor as in verl.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from recipe.one_step_off_async.launch import prepare_config
from recipe.one_step_off_async.preflight import check_backends
from recipe.one_step_off_async.trainer.task_runner import OneStepOffTaskRunner


@hydra.main(config_path="config", config_name="one_step_off_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo

    prepare_config(config)
    check_backends(config)
    run_ppo(config, task_runner_class=OneStepOffTaskRunner)


if __name__ == "__main__":
    main()
