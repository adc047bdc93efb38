"""The recipe in every process that imports verl: its backends registered, its platform patches applied.

verl imports the modules listed in ``VERL_USE_EXTERNAL_MODULES`` at ``import verl``
(``verl/__init__.py``), in the driver and in every Ray worker. This module is the only one of the
recipe listed there, so it is the one place that decides what of the recipe runs in every process:

- the CPU platform (registered; patched in when ``VERL_PLATFORM=cpu``), the one-GPU patch (when
  ``async_training.one_gpu`` put its variable in the environment) and, on every platform, the critic's
  value model loaded with the attention its config names (``platforms/verl_patches.py``);
- the weight-sync engines ``gloo`` and ``checkpoint`` in verl's ``CheckpointEngineRegistry``, so that
  ``rollout.checkpoint_engine.backend=gloo`` (or ``checkpoint``) works with no ``custom_backend_module``;
- ROLL's off-policy losses in verl's policy-loss registry;
- verl's vLLM rollout and replica with their weight-transfer socket scoped to one Ray cluster
  (``rollout/vllm_ipc.py``: two runs on one host would otherwise take each other's syncs).
"""

from __future__ import annotations

import importlib
import os

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.platforms import verl_patches

verl_patches.skip_the_ascend_checkpoint_engine()  # before anything imports verl's checkpoint engines

from recipe.one_step_off_async import losses  # noqa: E402, F401  (registers the losses)
from recipe.one_step_off_async.platforms import cpu, one_gpu  # noqa: E402
from recipe.one_step_off_async.weight_sync import files, gloo  # noqa: E402, F401  (register the engines)

EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
VLLM_IPC_MODULE = "recipe.one_step_off_async.rollout.vllm_ipc"  # imports vLLM: loaded only when verl asks


def register_cluster_scoped_vllm() -> None:
    """verl's registries resolve vLLM's rollout and replica to ``rollout/vllm_ipc.py``'s (by name: nothing of vLLM
    is imported until verl creates one)."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[("vllm", "async")] = f"{VLLM_IPC_MODULE}.ServerAdapter"
    RolloutReplicaRegistry.register("vllm", lambda: importlib.import_module(VLLM_IPC_MODULE).vLLMReplica)


def apply() -> None:
    """Patch verl for the selected platform, in this process (idempotent)."""
    verl_patches.apply()
    one_gpu.apply()
    register_cluster_scoped_vllm()


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
