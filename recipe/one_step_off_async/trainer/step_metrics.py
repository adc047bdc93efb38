"""What a step reports about its own time: its timeline, its split between the pools, and the devices it used.

``StepTimeline`` records wall-clock marks of each step (``timeline/*``, seconds since the trainer started);
``overlap_metrics`` turns verl's timing into ``timing_s/train`` and ``async/overlap_efficiency``.
``JobResourcePoolManager`` answers verl's ``get_n_gpus()`` with every device of the job, not only the training
pool's: verl divides ``perf/throughput`` by it, its only use in the separation trainer (verl 0.9.1;
``tests/test_platforms_verl_compat_on_cpu.py`` notices a new reader).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from omegaconf import DictConfig
from verl.experimental.separation.utils import create_resource_pool_manager
from verl.single_controller.ray.base import ResourcePoolManager


def job_devices(config: DictConfig, one_gpu: bool) -> int:
    """The job's devices: training pool, rollout pool and the reward model's pool (one when both pools share it)."""
    if one_gpu:
        return 1
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    devices = trainer.nnodes * trainer.n_gpus_per_node + rollout.nnodes * rollout.n_gpus_per_node
    reward_model = config.reward.reward_model
    return devices + (reward_model.nnodes * reward_model.n_gpus_per_node if reward_model.enable else 0)


@dataclass
class JobResourcePoolManager(ResourcePoolManager):
    """verl's pools for the training workers; ``get_n_gpus()`` counts the devices of the whole job."""

    devices: int = 0

    def get_n_gpus(self) -> int:
        return self.devices


def job_resource_pool_manager(config: DictConfig, roles: Iterable, one_gpu: bool) -> JobResourcePoolManager:
    """verl's ``create_resource_pool_manager`` for ``roles``, counting the job's devices."""
    pools = create_resource_pool_manager(config, list(roles))
    return JobResourcePoolManager(
        resource_pool_spec=pools.resource_pool_spec, mapping=pools.mapping, devices=job_devices(config, one_gpu)
    )


class StepTimeline:
    """Wall-clock marks of the current step, reported as ``timeline/<mark>`` relative to the trainer's start."""

    def __init__(self) -> None:
        self.origin = time.time()
        self.marks: dict[str, float] = {}

    def mark(self, **times: float) -> dict[str, float]:
        """Record the given marks (``time.time()`` values) and return them as metrics."""
        self.marks.update(times)
        return {f"timeline/{name}": at - self.origin for name, at in times.items()}

    def step_started(self) -> dict[str, float]:
        self.marks.clear()
        return self.mark(step_start=time.time())


def overlap_metrics(timing_raw: dict[str, float], gen_in_step_s: float) -> dict[str, float]:
    """The step's training time and how well the pools overlapped.

    ``async/overlap_efficiency`` = (max(gen, train) + sync) / step, with gen the generation that ran during this
    step: 1.0 when the slower pool never waits for the faster one, (max + sync) / (gen + train + sync) in lockstep.
    """
    sync = timing_raw["sync_weights"]
    train = timing_raw["step"] - timing_raw["wait_prev_gen"] - sync
    return {
        "timing_s/train": train,
        "async/overlap_efficiency": (max(gen_in_step_s, train) + sync) / timing_raw["step"],
    }
