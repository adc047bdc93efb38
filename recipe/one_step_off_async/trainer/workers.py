"""The recipe's actor worker: verl's ``ActorRolloutRefWorker``, its loss given each sample's score and its weight
syncs sent at the rollout's precision.

``topr`` splits samples by their score, which verl's policy-loss functions do not receive: after verl builds the
actor's loss in ``init_model``, this worker wraps it in ``losses.with_sample_scores``; ``tests/test_losses_on_cpu.py``
fails if verl stops building the loss that way.

verl's ``update_weights`` hands a checkpoint engine the FSDP actor's tensors as stored: fp32 on the GPU profiles,
twice the bytes a bf16 rollout loads (vLLM casts each one on load). Here each floating-point tensor is cast to
``rollout.dtype`` as it is produced, the same round-to-nearest cast vLLM's loader applies, so every backend sends
half the bytes and the rollout holds bit-for-bit what it would have loaded from fp32.

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

SENT_MBYTES = "checkpoint_engine/tensor_mbytes"  # the tensors a sync sends, in rollout.dtype, with every backend
ENGINE_DRIVEN_SYNCS = ("naive", "delta_sharded")  # verl's colocated sync, and the engine that produces its own deltas


def in_dtype(weights: Iterable[tuple[str, torch.Tensor]], dtype_name: str, sent: list[int]):
    """``weights`` with each floating-point tensor cast to the torch dtype named ``dtype_name`` (integer buffers as
    they are; all as they are for vLLM's ``auto``, the model's own dtype); ``sent[0]`` counts the bytes produced."""
    dtype = getattr(torch, dtype_name, None)
    for name, tensor in weights:
        if isinstance(dtype, torch.dtype) and tensor.is_floating_point() and tensor.dtype != dtype:
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
        if backend in ENGINE_DRIVEN_SYNCS:
            return await super().update_weights(global_steps=global_steps, mode=mode)
        weights, _ = self.actor.engine.get_per_tensor_param()
        sent = [0]
        weights = in_dtype(weights, self.config.rollout.dtype, sent)
        metrics = await self.checkpoint_engine.send_weights(weights, global_steps=global_steps) or {}
        return {SENT_MBYTES: sent[0] / 2**20, **metrics}

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args, **kwargs):
        result = super().execute_checkpoint_engine(method, *args, **kwargs)
        if method == "finalize" and (cupy := sys.modules.get("cupy")) is not None:  # imported by the nccl engine
            cupy.get_default_memory_pool().free_all_blocks()
        return result
