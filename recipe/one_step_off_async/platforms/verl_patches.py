"""The tiny patches of verl 0.9.1 the recipe needs, each named after the verl file it works around.

The two CPU patches are applied only when the CPU platform is selected (``VERL_PLATFORM=cpu``), in
every process that imports verl (by the recipe's plugin, ``verl_plugin.py``); the trainer enters
``hybrid_engine_assert_disabled`` around verl's trainer constructor.
``tests/test_platforms_verl_compat_on_cpu.py`` fails when verl changes the code a patch works around,
so a verl upgrade cannot silently make a patch wrong or unnecessary.

- ``verl/utils/distributed.py`` ``initialize_global_process_group_ray``: with no backend given
  it builds ``"cpu:gloo,{device}:{backend}"``, which is ``"cpu:gloo,cpu:gloo"`` on CPU and
  makes torch raise ``ValueError: Duplicate device type cpu``. Default the backend to ``"gloo"``.
- ``verl/single_controller/ray/base.py`` ``ResourcePoolManager._check_resource_available``:
  counts only the ``GPU``/``NPU`` Ray resources, so every pool looks unsatisfiable on CPU.
  Count the platform's own Ray resource instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from omegaconf import DictConfig, open_dict

VERL_VERSION = "0.9.1"
PLATFORM_ENV = "VERL_PLATFORM"  # verl's own variable: the platform every process resolves
CPU_PLATFORM = "cpu"


def patch_distributed_backend_default() -> None:
    """``verl/utils/distributed.py``: default backend of ``initialize_global_process_group_ray``."""
    import verl.utils.distributed as distributed

    distributed.initialize_global_process_group_ray.__defaults__ = (None, "gloo")


def _check_resource_available(self) -> None:
    """Like verl's, but counts the current platform's Ray resource (``CPU`` here)."""
    import ray
    from verl.plugin.platform import get_platform

    resource = get_platform().ray_resource_name()
    available = sum(node.get(resource, 0) for node in ray._private.state.available_resources_per_node().values())
    required = sum(n for process_on_nodes in self.resource_pool_spec.values() for n in process_on_nodes)
    if available < required:
        raise ValueError(
            f"The Ray cluster has {available:g} {resource} available but the resource pools "
            f"{dict(self.resource_pool_spec)} need {required}. Lower trainer.n_gpus_per_node or "
            f"actor_rollout_ref.rollout.n_gpus_per_node, or start Ray with more {resource}s "
            f"(ray_kwargs.ray_init.num_cpus)."
        )


def patch_resource_pool_check() -> None:
    """``verl/single_controller/ray/base.py``: ``ResourcePoolManager._check_resource_available``."""
    from verl.single_controller.ray import base

    base.ResourcePoolManager._check_resource_available = _check_resource_available


def apply_all() -> None:
    patch_distributed_backend_default()
    patch_resource_pool_check()


def apply_when_cpu_is_selected() -> None:
    """The CPU patches, in this process, when ``VERL_PLATFORM=cpu`` (idempotent); nothing otherwise.

    Reads only the environment: it runs while ``import verl`` imports the recipe's plugin, when the
    platform module itself may be half imported (``platforms/cpu.py`` imports verl).
    """
    if os.environ.get(PLATFORM_ENV, "").strip().lower() == CPU_PLATFORM:
        apply_all()


@contextlib.contextmanager
def hybrid_engine_assert_disabled(config: DictConfig) -> Iterator[None]:
    """verl/trainer/ppo/ray_trainer.py (0.9.1): ``RayPPOTrainer.__init__`` asserts ``hybrid_engine``.

    Nothing else in ``__init__`` depends on it; the flag is restored before any worker exists.
    ``tests/test_platforms_verl_compat_on_cpu.py`` notices when verl drops the assert.
    """
    with open_dict(config):
        config.actor_rollout_ref.hybrid_engine = True
    try:
        yield
    finally:
        with open_dict(config):
            config.actor_rollout_ref.hybrid_engine = False
