"""Test helpers around verl's own FSDP2 actor on the CPU platform, shared by several test files.

``actor_group`` puts verl's ``ActorRolloutRefWorker`` (role ``actor``) in a Ray worker group, the
way the trainer does; ``log_probs`` and ``update_actor`` drive it through verl's own calls with the
padding conversions verl's trainer applies (``RayPPOTrainer._compute_old_log_prob`` /
``_update_actor``).
"""

from __future__ import annotations

import uuid

import ray
import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding


def cpu_config(model_dir: str, *overrides: str) -> DictConfig:
    """The recipe's CPU profile pointed at ``model_dir`` (no asset resolver needed), resolved."""
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        config = compose(
            config_name="one_step_off_ppo_cpu",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "data.train_files=unused",
                "data.val_files=unused",
                "reward.custom_reward_function.path=null",
                # Test batches are a few sequences; micro-batches must divide them on every rank.
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                *overrides,
            ],
        )
    OmegaConf.resolve(config)
    return config


def actor_group(config: DictConfig, ranks: int, name: str = "actor", worker_cls=ActorRolloutRefWorker):
    """verl's FSDP2 actor, ``ranks`` processes on a resource pool of its own, initialised.

    Pool names are unique: several tests build actors in one Ray session.
    """
    prefix = f"{name}_{uuid.uuid4().hex[:8]}_pool"
    pool = RayResourcePool(process_on_nodes=[ranks], use_gpu=True, max_colocate_count=1, name_prefix=prefix)
    worker = RayClassWithInitArgs(cls=ray.remote(worker_cls), config=config.actor_rollout_ref, role="actor")
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cpu")
    group.init_model()
    return group


def rollout_batch(
    sequences: list[tuple[list[int], list[int]]], pad_id: int, advantages: torch.Tensor | None = None
) -> DataProto:
    """A batch laid out like the agent loop's output: left-padded prompts, right-padded responses."""
    prompt_len = max(len(p) for p, _ in sequences)
    response_len = max(len(r) for _, r in sequences)
    prompts = torch.full((len(sequences), prompt_len), pad_id)
    responses = torch.full((len(sequences), response_len), pad_id)
    prompt_mask = torch.zeros_like(prompts)
    response_mask = torch.zeros_like(responses)
    for i, (prompt, response) in enumerate(sequences):
        prompts[i, prompt_len - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, prompt_len - len(prompt) :] = 1
        responses[i, : len(response)] = torch.tensor(response)
        response_mask[i, : len(response)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
    }
    if advantages is not None:
        tensors["advantages"] = advantages * response_mask
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0, "multi_turn": False})


def log_probs(group: RayWorkerGroup, batch: DataProto) -> torch.Tensor:
    """Per-token log-probs of the responses under the actor, as verl's trainer computes old_log_probs."""
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False)
    output = group.compute_log_prob(data)
    return no_padding_2_padding(tu.get(output, "log_probs"), data).float()


def update_actor(group: RayWorkerGroup, batch: DataProto, seed: int = 0) -> dict:
    """One PPO update on ``batch`` (which carries ``advantages``), old log-probs from the actor itself."""
    batch = batch.union(DataProto.from_dict(tensors={"old_log_probs": log_probs(group, batch)}))
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        data,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=len(batch),
        mini_batch_size=len(batch),
        epochs=1,
        seed=seed,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    return tu.get(group.update_actor(data), "metrics")
