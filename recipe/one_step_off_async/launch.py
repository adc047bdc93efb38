"""Everything a launch does before Ray starts, shared by ``main_ppo`` and ``check_config``.

In order: accept the old layout's module paths (``upgrade_module_paths``, with a warning naming the new
setting; they live here, above every layer they name), validate the recipe's keys and its losses', set
up this process as every Ray worker will be (``verl_plugin.activate``: platform, registered backends, the
runtime env), check a user's agent-loop manager class (it must extend the trainer's, which only a layer
above the trainer can import), resolve the config in the driver (built-in task paths are materialised once,
before workers start), check the data files, run verl's own config validation, verify the checkpoint a
resume would load, and check that every backend the config selects is installed here.

``check_launch`` runs all of them and collects what they find in one ``errors.Problems``, so a launch reports
every problem at once (``LaunchProblems.report``: one numbered list, each problem with its fix, no traceback);
a check that needs what an earlier one refused is listed as not checked. ``check_command_line`` does the same for a
command line Hydra cannot compose (an unknown key, a bad override): it composes without the overrides
that fail, so their errors join the list of everything else.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from omegaconf import DictConfig, OmegaConf, open_dict

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.async_config import validate_config
from recipe.one_step_off_async.errors import LaunchProblems, Problems
from recipe.one_step_off_async.losses import validate_policy_loss
from recipe.one_step_off_async.platforms import one_gpu
from recipe.one_step_off_async.preflight import check_data_files, check_machine, check_model_modality
from recipe.one_step_off_async.trainer.agent_loops import agent_loop_manager_class
from recipe.one_step_off_async.trainer.resume import verify_resume_checkpoint

CONFIG_MODULE = "recipe.one_step_off_async.config"
# The configs a launch names with --config-name (the others are parts they include).
PROFILES = (
    "one_step_off_ppo_trainer",
    "one_step_off_ppo_cpu",
    "one_step_off_ppo_cpu_graded",
    "one_step_off_ppo_cpu_long_tail",
    "one_step_off_ppo_cpu_generation_bound",
    "one_step_off_ppo_1gpu",
)


def check_launch(config: DictConfig) -> Problems:
    """Validate, resolve and set up the platform, collecting every problem (``config`` is resolved in place)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config as verl_validate_config

    check = Problems()
    for notice in upgrade_module_paths(config):
        warnings.warn(notice, FutureWarning, stacklevel=3)
    check.run(validate_config, config)
    check.run(validate_policy_loss, config)
    with open_dict(config):
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        runtime_env.env_vars = {**(runtime_env.get("env_vars") or {}), **verl_plugin.activate(config)}
        if OmegaConf.select(config, "async_training.one_gpu", default=False) is True:
            config.ray_kwargs.ray_init.num_gpus = one_gpu.LOGICAL_GPUS
    check.run(agent_loop_manager_class, config)  # imports a user's class: after the platform is set up
    try:
        OmegaConf.resolve(config)
    except Exception as error:  # an interpolation that does not resolve: ${oc.env:...}, a missing key
        check.add(f"The config does not resolve: {type(error).__name__}: {error}")
        check.skipped += ["the data files", "verl's own validation of the config", "the checkpoint to resume from"]
    else:
        check.run(check_data_files, config)
        check.run(check_model_modality, config)
        if check.problems:  # verl's assertions would repeat the recipe's findings, less clearly
            check.skipped.append("verl's own validation of the config (verl.utils.config.validate_config)")
        else:
            try:
                verl_validate_config(
                    config=config,
                    use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config),
                )
            except Exception as error:  # verl asserts; its message names the keys
                check.add(f"verl's validation of the config: {type(error).__name__}: {error}")
        check.run(verify_resume_checkpoint, config)
    check.run(check_machine, config)
    return check


def prepare_config(config: DictConfig) -> None:
    """Everything that must happen before Ray starts; raise ``LaunchProblems`` listing every problem found."""
    error = check_launch(config).error()
    if error:
        raise error


@contextmanager
def problems_reported() -> Iterator[None]:
    """Print a launch's problems as one list and exit with status 1, without a traceback.

    ``HYDRA_FULL_ERROR=1`` (Hydra's own switch) lets the exception through, traceback and all.
    """
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


# Module paths of the flat layout before the sub-packages (see CHANGELOG.md, "Deprecated"). A config that
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
