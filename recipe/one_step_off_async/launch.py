"""Everything a launch does before Ray starts, shared by ``main_ppo`` and ``check_config``.

In order: accept the old layout's module paths (with a warning naming the new setting), validate the
recipe's keys, set up this process as every Ray worker will be (``verl_plugin.activate``: platform,
registered backends, the runtime env), resolve the config in the driver (built-in task paths are
materialised once, before workers start), check the data files, run verl's own config validation,
and verify the checkpoint a resume would load, so a truncated or foreign checkpoint fails in seconds.
"""

from __future__ import annotations

import warnings

from omegaconf import DictConfig, OmegaConf, open_dict

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.async_config import check_data_files, upgrade_module_paths, validate_config
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
