"""Validate a launch without starting it: the same arguments as ``main_ppo``, no Ray, no GPU.

    python -m recipe.one_step_off_async.check_config [--config-name=...] <hydra overrides>

Composes the config exactly as ``main_ppo`` would, runs the recipe's and verl's start-up checks,
and prints the layout it would launch. ``ENTRY_MODULE=recipe.one_step_off_async.check_config
bash run_qwen2_5_3b.sh`` checks a launch script on any machine.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from recipe.one_step_off_async.launch import prepare_config
from recipe.one_step_off_async.preflight import missing_backends


@hydra.main(config_path="config", config_name="one_step_off_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    prepare_config(config)
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    print(
        f"config OK: staleness {config.async_training.staleness}; actor {trainer.nnodes}x{trainer.n_gpus_per_node} "
        f"{trainer.device}; rollout {rollout.name} {rollout.nnodes}x{rollout.n_gpus_per_node} "
        f"(tp {rollout.tensor_model_parallel_size}); weight sync {rollout.checkpoint_engine.backend}; "
        f"model {config.actor_rollout_ref.model.path}"
    )
    # Informational only: the launch may be checked on another machine than the one that runs it.
    missing = missing_backends(config)
    print("preflight on this machine:", "main_ppo would stop here, missing:" if missing else "all backends installed")
    for line in missing:
        print(f"  - {line}")


if __name__ == "__main__":
    main()
