"""The recipe's actor worker: verl's ``ActorRolloutRefWorker``, its loss given each sample's score and its weight
syncs sent at the rollout's precision.

``topr`` splits samples by their score, which verl's policy-loss functions do not receive: after verl builds the
actor's loss in ``init_model``, this worker wraps it in ``losses.with_sample_scores``; ``tests/test_losses_on_cpu.py``
fails if verl stops building the loss that way.

verl's ``update_weights`` hands a checkpoint engine the FSDP actor's tensors as stored: fp32 on the GPU profiles,
twice the bytes a bf16 rollout loads (vLLM casts each one on load). Here each floating-point tensor is cast to
``rollout.dtype`` as it is produced, the same round-to-nearest cast vLLM's loader applies, so every backend sends
half the bytes and the rollout holds bit-for-bit what it would have loaded from fp32. Only for the model types of
``CAST_MODEL_TYPES``, whose vLLM models hold every parameter in the model's dtype; others (many MoE routers, kept in
fp32 by vLLM) are sent as stored.

verl's ``nccl`` engine allocates actor rank 0's two buckets with cupy (2 x ``update_weights_bucket_megabytes``, 4 GiB
by default) and its ``finalize`` drops them but empties only torch's cache: cupy keeps the memory in its pool through
the training step. After ``finalize`` this worker returns cupy's free blocks to the device.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from recipe.one_step_off_async.losses import with_sample_scores

SENT_MBYTES = "checkpoint_engine/tensor_mbytes"  # the tensors a sync sends, with every backend
SYNCS_LEFT_TO_VERL = ("naive", "delta_sharded")  # verl's colocated sync, and the engine that produces its own deltas
# Model types whose vLLM model file (vllm/model_executor/models/<type>.py) declares no fp32 parameter, so that vLLM
# holds every weight in rollout.dtype (tests/test_trainer_workers_on_cpu.py reads each file).
CAST_MODEL_TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral", "phi3")
# rollout.dtype as vLLM reads it (case-insensitive); "auto" is the model's own dtype: the tensors go as stored.
VLLM_DTYPES = {"auto": None, "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16}
VLLM_DTYPES |= {"float": torch.float32, "float32": torch.float32}


def sync_dtype(rollout_dtype: str, model_type: str) -> torch.dtype | None:
    """The dtype a sync sends floating-point tensors in, or None to send them as stored."""
    if rollout_dtype.lower() not in VLLM_DTYPES:
        raise ValueError(f"actor_rollout_ref.rollout.dtype={rollout_dtype} is none of vLLM's {sorted(VLLM_DTYPES)}")
    return VLLM_DTYPES[rollout_dtype.lower()] if model_type in CAST_MODEL_TYPES else None


def in_dtype(weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None, sent: list[int]):
    """``weights`` with each floating-point tensor cast to ``dtype`` (integer buffers, and all for None, as they
    are); ``sent[0]`` counts the bytes produced."""
    for name, tensor in weights:
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        sent[0] += tensor.nbytes
        yield name, tensor


class OneStepOffActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker whose actor loss publishes each micro-batch's sample scores and whose syncs
    send ``rollout.dtype``."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        if getattr(self, "loss_fn", None) is not None:
            self.loss_fn = with_sample_scores(self.loss_fn)
            self.actor.set_loss_fn(self.loss_fn)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto"):
        backend = self.config.rollout.checkpoint_engine.backend if mode == "auto" else mode
        if backend in SYNCS_LEFT_TO_VERL:
            return await super().update_weights(global_steps=global_steps, mode=mode)
        engine, sent = self.actor.engine, [0]
        dtype = sync_dtype(self.config.rollout.dtype, engine.model_config.hf_config.model_type)
        weights = in_dtype(engine.get_per_tensor_param()[0], dtype, sent)
        metrics = await self.checkpoint_engine.send_weights(weights, global_steps=global_steps) or {}
        return {SENT_MBYTES: sent[0] / 2**20, **metrics}

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args, **kwargs):
        result = super().execute_checkpoint_engine(method, *args, **kwargs)
        if method == "finalize" and (cupy := sys.modules.get("cupy")) is not None:  # imported by the nccl engine
            cupy.get_default_memory_pool().free_all_blocks()
        return result
