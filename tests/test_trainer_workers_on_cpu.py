"""The recipe's actor worker sends each sync at the rollout's precision (``trainer/workers.py``).

Plain calls: the cast against the one vLLM applies when it loads an fp32 tensor into a bf16 model, the model types
it applies to (vLLM's model files read for fp32 parameters), the worker's ``update_weights`` on a stub engine and
checkpoint engine (a test fails when verl's own ``update_weights`` changes what the override repeats), and cupy's pool
freed after the nccl engine's ``finalize``. ``test_e2e_trainer_features_on_cpu.py`` runs a bf16 rollout on vLLM's
CPU build end to end.

    pytest tests/test_trainer_workers_on_cpu.py   # ~5 s
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import verl

from recipe.one_step_off_async.trainer.workers import (
    CAST_MODEL_TYPES,
    SENT_MBYTES,
    OneStepOffActorRolloutRefWorker,
    in_dtype,
    sync_dtype,
)


def _weights() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    # Values at the bf16 rounding ties too: 1 + 2^-8 lies halfway between two bf16 numbers.
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-40])
    return [
        ("model.embed_tokens.weight", torch.randn(300, 64)),
        ("model.layers.0.mlp.up_proj.weight", torch.cat([torch.randn(1000), ties])),
        ("model.rotary.inv_freq_steps", torch.arange(8)),  # an integer buffer travels as it is
    ]


def test_the_cast_is_the_one_vllm_applies_when_it_loads_fp32_into_a_bf16_model():
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    sent = [0]
    cast = dict(in_dtype(_weights(), sync_dtype("bfloat16", "qwen2"), sent))
    for name, fp32 in _weights():
        if not fp32.is_floating_point():
            assert torch.equal(cast[name], fp32) and cast[name].dtype == fp32.dtype
            continue
        loaded = torch.nn.Parameter(torch.empty_like(fp32, dtype=torch.bfloat16), requires_grad=False)
        default_weight_loader(loaded, fp32)  # what vLLM does with a tensor the actor would send as stored
        assert cast[name].dtype == torch.bfloat16 and torch.equal(cast[name], loaded.data), name
    as_stored = sum(tensor.nbytes for _, tensor in _weights())
    integers = _weights()[2][1].nbytes
    assert sent[0] == (as_stored - integers) // 2 + integers  # half the floating-point bytes


@pytest.mark.parametrize(("name", "model_type"), [("float32", "qwen2"), ("auto", "qwen2"), ("bfloat16", "deepseek_v3")])
def test_an_fp32_rollout_vllms_auto_and_a_model_vllm_keeps_partly_in_fp32_get_the_tensors_as_stored(name, model_type):
    sent = [0]
    for (_, ours), (_, stored) in zip(
        in_dtype(_weights(), sync_dtype(name, model_type), sent), _weights(), strict=True
    ):
        assert ours.dtype == stored.dtype and torch.equal(ours, stored)
    assert sent[0] == sum(tensor.nbytes for _, tensor in _weights())


def test_the_cast_model_types_are_those_whose_vllm_model_holds_no_fp32_parameter():
    """vLLM keeps some parameters in fp32 whatever its dtype (DeepSeek's e_score_correction_bias, GLM-4.5's router):
    rounding those to bf16 would change what the rollout computes. A model file that declares fp32 (or uses vLLM's
    fp32 LayerNorm) takes its type off ``CAST_MODEL_TYPES``."""
    import importlib
    import inspect

    for model_type in CAST_MODEL_TYPES:
        source = inspect.getsource(importlib.import_module(f"vllm.model_executor.models.{model_type}"))
        assert "float32" not in source and "torch.float)" not in source, model_type
        assert "import LayerNorm" not in source and " LayerNorm(" not in source, model_type
    deepseek = inspect.getsource(importlib.import_module("vllm.model_executor.models.deepseek_v2"))
    assert "float32" in deepseek and "deepseek_v2" not in CAST_MODEL_TYPES  # the reason for the list
    with pytest.raises(ValueError, match=r"rollout.dtype=bf16 is none of vLLM's"):
        sync_dtype("bf16", "qwen2")
    assert sync_dtype("BFloat16", "llama") is torch.bfloat16 and sync_dtype("half", "qwen3") is torch.float16


class _Engine:
    """A checkpoint engine that keeps what it is sent."""

    def __init__(self):
        self.received: list[tuple[str, torch.Tensor]] = []

    async def send_weights(self, weights, global_steps=None):
        self.received = [(name, tensor) for name, tensor in weights]
        return {"checkpoint_engine/buckets": 1.0}


def _worker(backend: str) -> SimpleNamespace:
    config = SimpleNamespace(
        rollout=SimpleNamespace(dtype="bfloat16", checkpoint_engine=SimpleNamespace(backend=backend))
    )
    engine = SimpleNamespace(
        get_per_tensor_param=lambda: ((item for item in _weights()), None),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type="qwen2")),
    )
    return SimpleNamespace(config=config, actor=SimpleNamespace(engine=engine), checkpoint_engine=_Engine())


def test_a_sync_sends_the_rollouts_dtype_through_the_checkpoint_engine_and_reports_the_bytes():
    worker = _worker("gloo")
    metrics = asyncio.run(OneStepOffActorRolloutRefWorker.update_weights(worker, global_steps=3, mode="gloo"))
    assert [tensor.dtype for _, tensor in worker.checkpoint_engine.received] == [torch.bfloat16] * 2 + [torch.int64]
    sent = sum(tensor.nbytes for _, tensor in worker.checkpoint_engine.received)
    assert metrics == {SENT_MBYTES: sent / 2**20, "checkpoint_engine/buckets": 1.0}


def test_verls_update_weights_still_sends_what_the_engine_produces_as_stored():
    """The override repeats verl's branch for a checkpoint engine, with the cast added; this fails when verl changes
    that branch, so an upgrade cannot leave the override stale."""
    import inspect

    from verl.workers.engine_workers import ActorRolloutRefWorker

    source = inspect.getsource(ActorRolloutRefWorker.update_weights)
    branch = (
        "per_tensor_param, _ = self.actor.engine.get_per_tensor_param()\n"
        "            metrics = await self.checkpoint_engine.send_weights(per_tensor_param, global_steps=global_steps)\n"
        "            return metrics or {}"
    )
    assert branch in source
    assert 'if effective_mode != "naive":' in source and 'if effective_mode == "delta_sharded":' in source


def test_after_finalize_cupys_pooled_buckets_go_back_to_the_device(monkeypatch):
    events = []
    pool = SimpleNamespace(free_all_blocks=lambda: events.append("cupy pool freed"))
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(get_default_memory_pool=lambda: pool))
    engine = SimpleNamespace(finalize=lambda: events.append("finalize"), prepare=lambda: events.append("prepare"))
    worker = object.__new__(OneStepOffActorRolloutRefWorker)  # no Ray worker: only the engine is set
    worker.checkpoint_engine = engine
    OneStepOffActorRolloutRefWorker.execute_checkpoint_engine(worker, "prepare")
    OneStepOffActorRolloutRefWorker.execute_checkpoint_engine(worker, "finalize")
    assert events == ["prepare", "finalize", "cupy pool freed"]


def test_verls_nccl_engine_still_leaves_rank_0s_cupy_buckets_in_cupys_pool():
    """Why the worker frees cupy's pool (read as text: the module imports cupy, which a CPU install lacks)."""
    source = (Path(verl.__file__).parent / "checkpoint_engine" / "nccl_checkpoint_engine.py").read_text()
    assert "self.send_buf = cp.zeros(self.bucket_size, dtype=cp.uint8)" in source
    finalize = source[source.index("    def finalize(self):") :].split("\n    def ")[0]
    assert "self.send_buf = None" in finalize and "free_all_blocks" not in finalize
