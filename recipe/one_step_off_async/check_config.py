"""Validate a launch without starting it: the same arguments as ``main_ppo``, no Ray, no GPU.

    python -m recipe.one_step_off_async.check_config [--config-name=...] <hydra overrides>

Composes the config exactly as ``main_ppo`` would, runs every check ``main_ppo`` runs before Ray starts
(``launch.check_launch``) and prints the layout it would launch and every problem found. Data files and
backends missing on this machine are listed as such without failing the check (a cluster's launch is
often checked on a laptop); any other problem exits with status 1. ``ENTRY_MODULE=recipe.one_step_off_async.check_config
bash run_qwen2_5_3b.sh`` checks a launch script on any machine.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.launch import check_command_line, check_launch, problems_reported

CONFIG_NAME = "one_step_off_ppo_trainer"


@hydra.main(config_path="config", config_name=CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    check = check_launch(config)
    with problems_reported():
        if check.problems:
            raise check.error()

    def value(key: str) -> object:
        return OmegaConf.select(config, key, throw_on_missing=False)

    rollout = "actor_rollout_ref.rollout"
    print(
        f"config OK: staleness {value('async_training.staleness')}; actor {value('trainer.nnodes')}x"
        f"{value('trainer.n_gpus_per_node')} {value('trainer.device')}; rollout {value(f'{rollout}.name')} "
        f"{value(f'{rollout}.nnodes')}x{value(f'{rollout}.n_gpus_per_node')} (tp "
        f"{value(f'{rollout}.tensor_model_parallel_size')}); weight sync {value(f'{rollout}.checkpoint_engine.backend')}; "
        f"model {value('actor_rollout_ref.model.path')}"
    )
    # Informational only: the launch may be checked on another machine than the one that runs it.
    print("on this machine:", "main_ppo would stop here:" if check.not_here else "every file and backend found")
    for line in check.not_here:
        print(f"  - {line}")


if __name__ == "__main__":
    check_command_line(sys.argv[1:], CONFIG_NAME)
    main()
