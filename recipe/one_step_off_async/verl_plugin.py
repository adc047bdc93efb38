"""The recipe in every process that imports verl: its backends registered, its platform patches applied.

verl imports the modules listed in ``VERL_USE_EXTERNAL_MODULES`` at ``import verl``
(``verl/__init__.py``), in the driver and in every Ray worker. This module is the only one of the
recipe listed there, so it is the one place that decides what of the recipe runs in every process:

- the CPU platform (registered; patched in when ``VERL_PLATFORM=cpu``), the one-GPU patch (when
  ``async_training.one_gpu`` put its variable in the environment) and, on every platform, the critic's
  value model loaded with the attention its config names (``platforms/verl_patches.py``);
- the weight-sync engines ``gloo`` and ``checkpoint`` in verl's ``CheckpointEngineRegistry``, so that
  ``rollout.checkpoint_engine.backend=gloo`` (or ``checkpoint``) works with no ``custom_backend_module``;
- ROLL's off-policy losses in verl's policy-loss registry.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.platforms import verl_patches

verl_patches.skip_the_ascend_checkpoint_engine()  # before anything imports verl's checkpoint engines

from recipe.one_step_off_async import losses  # noqa: E402, F401  (registers the losses)
from recipe.one_step_off_async.platforms import cpu, one_gpu  # noqa: E402
from recipe.one_step_off_async.weight_sync import files, gloo  # noqa: E402, F401  (register the engines)

EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"


def apply() -> None:
    """Patch verl for the selected platform, in this process (idempotent)."""
    verl_patches.apply()
    one_gpu.apply()


def worker_env(config: DictConfig) -> dict[str, str]:
    """The environment every process of this run needs: this module first in verl's list (a platform must be
    registered before verl resolves it), the modules a user listed kept after it, and the platform's variables."""
    listed = OmegaConf.select(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{EXTERNAL_MODULES_ENV}") or ""
    modules = [__name__, *os.environ.get(EXTERNAL_MODULES_ENV, "").split(","), *listed.split(",")]
    env = {EXTERNAL_MODULES_ENV: ",".join(dict.fromkeys(m for m in modules if m))}
    if config.trainer.device == verl_patches.CPU_PLATFORM:
        env.update(cpu.env_vars())
    if config.async_training.one_gpu:
        env.update(one_gpu.env_vars())
    return env


def activate(config: DictConfig) -> dict[str, str]:
    """Set up this process (the driver) as every worker will be; return the env for Ray's runtime env."""
    env = worker_env(config)
    os.environ.update(env)
    apply()
    return env


apply()
