"""Everything a launch does before Ray starts, shared by ``main_ppo`` and ``check_config``.

In order: accept the old layout's module paths (``upgrade_module_paths``, with a warning naming the new
setting; they live here, above every layer they name), validate the
recipe's keys, set up this process as every Ray worker will be (``verl_plugin.activate``: platform,
registered backends, the runtime env), resolve the config in the driver (built-in task paths are
materialised once, before workers start), check the data files, run verl's own config validation,
and verify the checkpoint a resume would load, so a truncated or foreign checkpoint fails in seconds.
"""

from __future__ import annotations

import warnings

from omegaconf import DictConfig, OmegaConf, open_dict

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.async_config import check_data_files, validate_config
from recipe.one_step_off_async.losses import validate_policy_loss
from recipe.one_step_off_async.platforms import one_gpu
from recipe.one_step_off_async.trainer.resume import verify_resume_checkpoint


def prepare_config(config: DictConfig) -> None:
    """Validate, resolve and set up the platform: everything that must happen before Ray starts."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config as verl_validate_config

    for notice in upgrade_module_paths(config):
        warnings.warn(notice, FutureWarning, stacklevel=2)
    validate_config(config)
    validate_policy_loss(config)
    env = verl_plugin.activate(config)
    with open_dict(config):
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        runtime_env.env_vars = {**(runtime_env.get("env_vars") or {}), **env}
        if config.async_training.one_gpu:
            config.ray_kwargs.ray_init.num_gpus = one_gpu.LOGICAL_GPUS
    OmegaConf.resolve(config)
    check_data_files(config)
    verl_validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    verify_resume_checkpoint(config)


# Module paths of the flat layout before the sub-packages (see "Upgrading" in the docs). A config that
# names one still runs, with a FutureWarning naming the setting to use instead.
_RENAMED_CLASSES = {
    "actor_rollout_ref.rollout.checkpoint_manager_class": {
        "recipe.one_step_off_async.sync_timing.TimedCheckpointEngineManager": (
            "recipe.one_step_off_async.weight_sync.timing.TimedCheckpointEngineManager"
        ),
    },
    "actor_rollout_ref.actor.policy_loss._target_": {
        "recipe.one_step_off_async.policy_losses.OffPolicyLossConfig": "recipe.one_step_off_async.losses.OffPolicyLossConfig",
    },
}
# Engines the recipe now registers by name in every process: their module key is no longer needed.
_REGISTERED_ENGINE_MODULES = {
    "recipe.one_step_off_async.cpu.gloo_checkpoint_engine": "gloo",
    "recipe.one_step_off_async.file_checkpoint_engine": "checkpoint",
}
# Modules that used to be listed in VERL_USE_EXTERNAL_MODULES; the recipe's verl plugin loads what they did.
_OLD_EXTERNAL_MODULES = (
    "recipe.one_step_off_async.cpu",
    "recipe.one_step_off_async.policy_losses",
    "recipe.one_step_off_async.one_gpu",
)


def upgrade_module_paths(config: DictConfig) -> list[str]:
    """Rewrite the old layout's module paths in ``config`` to the new ones; return one notice per rewrite."""
    notices = []
    for key, renamed in _RENAMED_CLASSES.items():
        value = OmegaConf.select(config, key)
        if value in renamed:
            OmegaConf.update(config, key, renamed[value], force_add=True)
            notices.append(f"{key}={value} has moved: set {key}={renamed[value]}.")
    key = "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module"
    value = OmegaConf.select(config, key)
    if value in _REGISTERED_ENGINE_MODULES:
        OmegaConf.update(config, key, None)
        notices.append(
            f"{key}={value} is no longer needed: the recipe registers the "
            f"{_REGISTERED_ENGINE_MODULES[value]!r} engine by name. Remove the override."
        )
    key = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"
    listed = OmegaConf.select(config, key) or ""
    kept = [module for module in listed.split(",") if module and module not in _OLD_EXTERNAL_MODULES]
    if listed and kept != listed.split(","):
        OmegaConf.update(config, key, ",".join(kept))
        notices.append(f"{key} lists modules of the old layout; the recipe loads them itself. Remove them.")
    return notices
