"""Run verl 0.9.1 without accelerators: the CPU platform plugin and how it is switched on.

This package is verl's external module for the CPU path: ``activate()`` lists it in
``VERL_USE_EXTERNAL_MODULES`` (read by ``verl/__init__.py``), so every process that imports verl,
the driver and every Ray worker, registers ``PlatformCPU`` and, when the CPU platform is selected,
applies the two patches in ``verl_patches``. The recipe calls ``activate()`` when
``trainer.device=cpu`` (the CPU profile sets it); nothing has to be exported by hand.

The heavier CPU backends (``gloo`` checkpoint engine, ``hf`` rollout replica) live in their own
modules and are registered through verl's registries where verl looks them up.
"""

from __future__ import annotations

import os

from recipe.one_step_off_async import external_modules
from recipe.one_step_off_async.cpu import verl_patches
from recipe.one_step_off_async.cpu.cpu_platform import PLATFORM_NAME, PlatformCPU

__all__ = ["PLATFORM_NAME", "PlatformCPU", "activate", "cpu_env_vars", "is_active"]

PLUGIN_MODULE = __name__


def is_active() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def cpu_env_vars() -> dict[str, str]:
    """Environment every process of a CPU run needs (the driver's and each Ray worker's)."""
    return {
        "VERL_PLATFORM": PLATFORM_NAME,
        external_modules.ENV: external_modules.listing_with(PLUGIN_MODULE, first=True),
        # verl registers its FSDP engines for devices cuda/npu only; this verl-provided override
        # (verl/workers/engine/base.py, EngineRegistry.get_engine_cls) selects them on CPU.
        "VERL_ENGINE_DEVICE": "cuda",
        # Offline by construction: the CPU profile only uses assets built locally.
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # One intra-op thread per process: a CPU run already has one process per "GPU" slot.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def activate() -> dict[str, str]:
    """Select the CPU platform in this process and return the env vars for the Ray runtime env.

    Must run before verl first resolves its platform (``get_platform()`` caches it).
    """
    env = cpu_env_vars()
    os.environ.update(env)
    verl_patches.apply_all()
    return env


if is_active():
    verl_patches.apply_all()
