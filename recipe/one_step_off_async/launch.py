"""Everything a launch does before Ray starts, shared by ``main_ppo`` and ``check_config``.

``check_launch`` resolves the config, checks it (the recipe's keys, the data files, verl's own validation, the
checkpoint a resume would load, the backends installed here...), sets up this process as every Ray worker will be and
fits ``ray_init`` to the cluster; it adds up the ``Problems`` each check returns, so a launch reports every problem at
once, each with its fix, no traceback. ``check_command_line`` does the same for a command line Hydra cannot compose.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.async_config import config_problems
from recipe.one_step_off_async.cluster import prepare_ray_init
from recipe.one_step_off_async.errors import CheckpointError, ConfigError, LaunchProblems
from recipe.one_step_off_async.losses import policy_loss_problems
from recipe.one_step_off_async.platforms import one_gpu
from recipe.one_step_off_async.preflight import data_file_problems, machine_problems
from recipe.one_step_off_async.schema import Problems
from recipe.one_step_off_async.trainer.agent_loops import agent_loop_manager_class
from recipe.one_step_off_async.trainer.resume import verify_resume_checkpoint
from recipe.one_step_off_async.trainer.sync_manager import checkpoint_manager_class

CONFIG_MODULE = "recipe.one_step_off_async.config"
# The configs a launch names with --config-name (the others are parts they include).
PROFILES = tuple(sorted(path.stem for path in (Path(__file__).parent / "config").glob("one_step_off_ppo*.yaml")))


def check_launch(config: DictConfig) -> Problems:
    """Resolve, validate and set up the platform; return every problem found (``config`` is resolved in place)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config as verl_validate_config

    try:
        OmegaConf.resolve(config)
    except Exception as error:  # an interpolation that does not resolve: ${oc.env:...}, a missing key
        return Problems(
            [f"The config does not resolve: {type(error).__name__}: {error}"],
            skipped=["every other check (they read the resolved config)"],
        )
    found = config_problems(config) + policy_loss_problems(config)
    with open_dict(config):
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        runtime_env.env_vars = {**(runtime_env.get("env_vars") or {}), **verl_plugin.activate(config)}
        if OmegaConf.select(config, "async_training.one_gpu", default=False) is True:
            config.ray_kwargs.ray_init.num_gpus = one_gpu.LOGICAL_GPUS
    found += prepare_ray_init(config)  # after the one-GPU layout sized the cluster it would start
    for manager_class in (agent_loop_manager_class, checkpoint_manager_class):
        try:
            manager_class(config)  # imports a user's class: after the platform is set up
        except ConfigError as error:
            found += Problems.of(error)
    found += data_file_problems(config)
    if found.problems:  # verl's assertions would repeat the recipe's findings, less clearly
        found.skipped.append("verl's own validation of the config (verl.utils.config.validate_config)")
    else:
        try:
            verl_validate_config(
                config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
            )
        except Exception as error:  # verl asserts; its message names the keys
            found.problems.append(f"verl's validation of the config: {type(error).__name__}: {error}")
    try:
        verify_resume_checkpoint(config)
    except CheckpointError as error:
        found.problems.append(str(error))
    return found + machine_problems(config)


def prepare_config(config: DictConfig) -> None:
    """Everything that must happen before Ray starts; raise ``LaunchProblems`` listing every problem found."""
    error = check_launch(config).error()
    if error:
        raise error


@contextmanager
def problems_reported() -> Iterator[None]:
    """Print a launch's problems as one list and exit with status 1, without a traceback (``HYDRA_FULL_ERROR=1``,
    Hydra's own switch, lets the exception through, traceback and all)."""
    try:
        yield
    except LaunchProblems as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(error.report(), file=sys.stderr)
        raise SystemExit(1) from None


def check_command_line(argv: list[str], config_name: str) -> None:
    """Report every problem of a command line whose overrides Hydra cannot compose, then exit with status 1.

    Returns (and ``hydra.main`` takes over) when the command line composes, or names a Hydra flag other than
    ``--config-name``/``-cn`` (``--help``, ``--cfg``, ``-m``...: Hydra handles those itself), or when
    ``HYDRA_FULL_ERROR=1`` asks for Hydra's traceback.
    """
    parsed = _split_command_line(argv, config_name)
    if parsed is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException, MissingConfigException
    from hydra.utils import instantiate

    name, overrides = parsed
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        try:
            compose(config_name=name, overrides=overrides)
            return
        except HydraException as error:
            failure = error
        refused, kept = [], []
        if not (isinstance(failure, MissingConfigException) and failure.missing_cfg_file == name):
            for override in overrides:  # about 0.3 s each, only for a command line that fails
                try:
                    compose(config_name=name, overrides=[*kept, override])
                    kept.append(override)
                except HydraException as error:
                    refused.append(f"{override}: {_hydra_message(error)}")
        if refused:
            # As hydra.main prepares it, so that ${hydra:runtime.output_dir} and the resolvers its callbacks
            # register (the CPU profile's ${demo_asset:...}) resolve.
            config = compose(config_name=name, overrides=kept, return_hydra_config=True)
            HydraConfig.instance().set_config(config)
            for callback in (config.hydra.get("callbacks") or {}).values():
                instantiate(callback).on_job_start(config=config)
            with open_dict(config):
                del config["hydra"]
    with problems_reported():
        if not refused:  # the config name itself (no config to check the rest against)
            message = _hydra_message(failure)
            if isinstance(failure, MissingConfigException) and failure.missing_cfg_file == name:
                message = f"--config-name={name}: no such config. The recipe's are {', '.join(PROFILES)}."
            raise LaunchProblems([message], ["everything else: it needs a config to check"])
        check = check_launch(config)
        check.skipped.append(f"what depends on the refused override{'s' if len(refused) > 1 else ''} above")
        raise check.error(*refused)


def _split_command_line(argv: list[str], config_name: str) -> tuple[str, list[str]] | None:
    """(config name, overrides) of a ``main_ppo`` command line, or None when it uses other Hydra flags."""
    overrides, arguments = [], iter(argv)
    for argument in arguments:
        if argument in ("--config-name", "-cn"):
            config_name = next(arguments, config_name)
        elif argument.startswith("--config-name="):
            config_name = argument.split("=", 1)[1]
        elif argument.startswith("-"):
            return None
        else:
            overrides.append(argument)
    return config_name, overrides


def _hydra_message(error: Exception) -> str:
    """Hydra's message on one line, with the cause it chains (OmegaConf's ``Key 'x' is not in struct``)."""
    text = str(error).split("Config search path:")[0]  # the search path is the same for every problem
    message = " ".join(line.strip() for line in text.splitlines() if line.strip())
    cause = error.__cause__
    if cause is not None and str(cause).strip():
        message += f" ({str(cause).strip().splitlines()[0]})"
    return message
