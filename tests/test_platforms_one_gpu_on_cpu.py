"""The one-GPU layout (``platforms/one_gpu.py``): what it changes in every process, and tripwires on the verl code it relies on.

The layout itself runs only on a GPU (``scripts/gpu_smoke.sh``); these tests check, on CPU, that a
fresh process importing verl with the recipe's env gets the patch and an NCCL host id of its own,
and that verl 0.9.1 still reads Ray's accelerator ids where the patch expects.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import verl
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.async_config import validate_config
from recipe.one_step_off_async.platforms import one_gpu

VERL_DIR = Path(verl.__file__).parent


def test_every_logical_gpu_is_reported_as_device_zero():
    ids = {"GPU": ["1"], "CPU": [], "neuron_cores": ["3"]}
    assert one_gpu.every_gpu_is_device_zero(ids) == {"GPU": ["0"], "CPU": [], "neuron_cores": ["3"]}
    assert one_gpu.every_gpu_is_device_zero({"GPU": []}) == {"GPU": []}
    assert one_gpu.every_gpu_is_device_zero({"CPU": ["0"]}) == {"CPU": ["0"]}


def _probe(env: dict[str, str]) -> tuple[str, str]:
    script = (
        "import os, verl\n"
        "from ray.runtime_context import RuntimeContext\n"
        "print(getattr(RuntimeContext.get_accelerator_ids, 'one_gpu_patched', False), os.environ.get('NCCL_HOSTID'))"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("NCCL_HOSTID", one_gpu.ACTIVE_ENV)}
    out = subprocess.run([sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    patched, host_id = out.stdout.split()[-2:]
    return patched, host_id


def test_a_fresh_process_importing_verl_is_patched_with_a_host_id_of_its_own():
    env = verl_plugin.worker_env(OmegaConf.create({"trainer": {"device": "cuda"}, "async_training": {"one_gpu": True}}))
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert env["VERL_USE_EXTERNAL_MODULES"].split(",")[0] == verl_plugin.__name__
    (patched_a, host_a), (patched_b, host_b) = _probe(env), _probe(env)
    assert patched_a == patched_b == "True"
    assert host_a.startswith("one-gpu-") and host_b.startswith("one-gpu-") and host_a != host_b


def test_without_the_layout_nothing_is_patched():
    assert _probe({}) == ("False", "None")


def _calls_get_accelerator_ids(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.Attribute) and node.attr == "get_accelerator_ids" for node in ast.walk(tree))


def test_verl_still_reads_the_accelerator_ids_the_patch_rewrites():
    """verl 0.9.1 sets the actor's device and the vLLM server's CUDA_VISIBLE_DEVICES from these ids."""
    assert _calls_get_accelerator_ids(VERL_DIR / "single_controller" / "base" / "worker.py")
    assert _calls_get_accelerator_ids(VERL_DIR / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py")


def test_one_gpu_profile_composes_to_one_device_per_pool():
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        config = compose(config_name="one_step_off_ppo_1gpu")
    assert validate_config(config).one_gpu
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.name, rollout.checkpoint_engine.backend, config.actor_rollout_ref.actor.strategy) == (
        "vllm",
        "nccl",
        "fsdp2",
    )
    assert (config.trainer.n_gpus_per_node, rollout.n_gpus_per_node, rollout.tensor_model_parallel_size) == (1, 1, 1)
    assert rollout.gpu_memory_utilization <= 0.5  # the actor shares the device
