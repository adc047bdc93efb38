"""verl platform plugin for machines without accelerators (device ``cpu``, backend ``gloo``).

verl 0.9.1 routes every device query through ``verl.plugin.platform.get_platform()``; the
built-in platforms are CUDA, NPU and ROCm. Registering ``PlatformCPU`` under the name ``cpu``
and selecting it with ``VERL_PLATFORM=cpu`` lets verl's own workers (FSDP2 engine, Ray worker
groups, checkpoint engines) run unchanged on CPU. ``env_vars()`` is what every process of a CPU run
needs (``verl_plugin.worker_env`` sets it when ``trainer.device=cpu``). Importing this module registers the
platform; the recipe's plugin applies the patches of ``verl_patches`` once it is selected.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from recipe.one_step_off_async.platforms.verl_patches import CPU_PLATFORM, CPU_RAY_RESOURCE, PLATFORM_ENV


class CPUDeviceModule:
    """Stand-in for ``torch.cuda``: verl calls ``get_torch_device().<fn>()`` all over its code.

    ``torch.cpu`` answers most of it (``is_available``, ``synchronize``, ``set_device``, streams); what it lacks is
    here: memory queries report 0 (there is no device memory to account for) and RNG state is the CPU generator's.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(torch.cpu, name)
        except AttributeError:
            raise AttributeError(f"the cpu platform's device module has no attribute {name!r}") from None

    @staticmethod
    def get_device_name(*_args, **_kwargs) -> str:
        return "CPU"

    @staticmethod
    def empty_cache(*_args, **_kwargs) -> None:
        pass

    reset_peak_memory_stats = empty_cache

    @staticmethod
    def get_rng_state(*_args, **_kwargs) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *_args, **_kwargs) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def memory_allocated(*_args, **_kwargs) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(*_args, **_kwargs) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total


@PlatformRegistry.register(platform=CPU_PLATFORM)
class PlatformCPU(PlatformBase):
    """Device ``cpu``, collectives over ``gloo``, one Ray ``CPU`` per "GPU" slot of a pool."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = CPUDeviceModule()

    def _nothing(self, *_args, **_kwargs) -> None:
        """A device call with nothing to do on CPU."""

    set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = cudart = _nothing

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only chosen explicitly through VERL_PLATFORM=cpu.
        return False

    def current_device(self) -> torch.device:
        # verl feeds get_device_id() to `.to(...)` and `torch.device(...)`; an int would mean
        # "accelerator 0" and fail on a CPU-only torch.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # No device isolation on CPU; a name nobody reads keeps verl's env plumbing inert.
        return "VERL_CPU_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str) -> nullcontext:
        return nullcontext()

    def ray_resource_name(self) -> str:
        return CPU_RAY_RESOURCE

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # Ray rejects {"resources": {"CPU": n}}: CPUs are requested through num_cpus.
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False


VLLM_MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def env_vars() -> dict[str, str]:
    """Environment every process of a CPU run needs (the driver's and each Ray worker's)."""
    return {
        PLATFORM_ENV: CPU_PLATFORM,
        # verl registers its FSDP engines for devices cuda/npu only; this verl-provided override
        # (verl/workers/engine/base.py, EngineRegistry.get_engine_cls) selects them on CPU.
        "VERL_ENGINE_DEVICE": "cuda",
        # Offline by construction: the CPU profile only uses assets built locally.
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # One intra-op thread per process: a CPU run already has one process per "GPU" slot.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        # vLLM's CPU build turns the executor a replica asks for (`uni`, one_step_off_cpu.yaml) into a worker process
        # of its own unless this is off: a third process per replica (~10 s of CPU to start).
        VLLM_MULTIPROCESSING_ENV: "0",
    }
