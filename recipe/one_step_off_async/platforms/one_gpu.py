"""Both pools on ONE physical GPU: the recipe's GPU path (vLLM, nccl, FSDP2) on a workstation.

The actor and the rollout replica stay on disjoint Ray pools of one logical GPU each, time-sharing the physical
device: for trying the GPU path before renting a node (docs/advance/one_step_off_async/deployment.md, "On one GPU").
Switched on by ``async_training.one_gpu=true`` (``--config-name=one_step_off_ppo_1gpu`` sets it); three things make
it work:

- Ray gets two logical GPUs (``ray_init.num_gpus=2``) and ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``,
  so no worker has the device hidden from it.
- verl 0.9.1 turns Ray's accelerator ids into ``LOCAL_RANK`` / ``set_device`` and into the vLLM server's
  ``CUDA_VISIBLE_DEVICES``. The second logical GPU, "1", does not exist, so ``RuntimeContext.get_accelerator_ids``
  reports every GPU id as "0".
- NCCL refuses two ranks on one GPU ("Duplicate GPU detected"). A ``NCCL_HOSTID`` of its own in
  every process makes NCCL treat them as two hosts, which talk over its socket transport.

The recipe's verl plugin applies it in every process whose environment has ``env_vars()``.
``tests/test_platforms_one_gpu_on_cpu.py`` notices when verl stops reading the accelerator ids where expected.
"""

from __future__ import annotations

import os

from recipe.one_step_off_async.platforms.verl_patches import rewrite_accelerator_ids

ACTIVE_ENV = "ONE_STEP_OFF_ONE_GPU"
LOGICAL_GPUS = 2  # one per pool


def env_vars() -> dict[str, str]:
    """Environment every process of a one-GPU run needs (the driver's and each Ray worker's)."""
    return {ACTIVE_ENV: "1", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


def every_gpu_is_device_zero(ids: dict[str, list[str]]) -> dict[str, list[str]]:
    """Ray's accelerator ids of this process, every GPU id "0" (the one device there is)."""
    return {**ids, "GPU": ["0"] * len(ids["GPU"])} if "GPU" in ids else ids


def apply() -> None:
    """When selected: patch Ray's accelerator ids and give this process its own NCCL host id (idempotent)."""
    if os.environ.get(ACTIVE_ENV) != "1":
        return
    # Overwritten, not setdefault: Ray workers inherit the driver's value.
    os.environ["NCCL_HOSTID"] = f"one-gpu-{os.getpid()}"
    rewrite_accelerator_ids(every_gpu_is_device_zero, marker="one_gpu_patched")
