"""The ``hf`` rollout backend for verl 0.9.1: ``actor_rollout_ref.rollout.name=hf``.

What: ``HFReplica``, a verl ``RolloutReplica`` whose server is ``HFRolloutServer`` (``server.py``):
a HF-transformers model with continuous batching on CPU, speaking verl's token-in-token-out
protocol. verl's unmodified ``LLMServerManager``, ``AgentLoopManager`` (single-turn agent loop) and
``CheckpointEngineManager`` drive it as they drive vLLM.

Why: verl 0.9.1 rolls out only through server replicas and its engines (vLLM, SGLang, TRT-LLM)
need accelerators; this replica lets the same trainer code run on machines without them.

How: the recipe's verl plugin (``verl_plugin.py``) registers ``hf`` in verl's ``RolloutReplicaRegistry``
in every process that imports verl, so verl's ``LLMServerManager`` finds it by name. The rollout
processes need no registration: the replica hands verl's ``RayWorkerGroup`` its own
server class, which is both the ``CheckpointEngineWorker`` (so verl never looks up a server
adapter by name) and the server. Standalone (and colocated) placement only, one process per
replica: ``rollout.tensor_model_parallel_size=1``; ``rollout.nnodes * rollout.n_gpus_per_node``
replicas, each on one CPU slot of the rollout pool. As a reward model (``reward.reward_model.rollout.name=hf``,
created by verl's ``RewardModelManager``) the replica serves a sequence classifier over HTTP instead
(``reward_server.py``), on the reward model's own pool.
"""

from __future__ import annotations

import asyncio

import ray
from omegaconf import DictConfig
from verl.single_controller.ray import RayClassWithInitArgs
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from recipe.one_step_off_async.rollout.hf import ROLLOUT_NAME
from recipe.one_step_off_async.rollout.hf.reward_server import HFRewardServer
from recipe.one_step_off_async.rollout.hf.server import HFRolloutServer


def check_rollout_config(config: RolloutConfig, key: str = "actor_rollout_ref.rollout") -> None:
    """Raise if ``config`` (at ``key``) asks for a layout the hf rollout cannot serve (one process per replica)."""
    parallel = {
        "tensor_model_parallel_size": config.tensor_model_parallel_size,
        "data_parallel_size": config.data_parallel_size,
        "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
    }
    wrong = {name: size for name, size in parallel.items() if size != 1}
    if wrong:
        fix = " ".join(f"{key}.{name}=1" for name in wrong)
        raise ValueError(f"rollout.name={ROLLOUT_NAME} serves one process per replica, got {wrong}; set {fix}")


class HFReplica(RolloutReplica):
    """A rollout replica served by one ``HFRolloutServer`` actor on one slot of the rollout pool."""

    def __init__(
        self,
        replica_rank: int,
        config: RolloutConfig | DictConfig,
        model_config: HFModelConfig | DictConfig,
        gpus_per_node: int = 8,
        is_reward_model: bool = False,
        is_teacher_model: bool = False,
        name_suffix: str = "",
    ) -> None:
        super().__init__(
            replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model, name_suffix
        )
        check_rollout_config(
            self.config, "reward.reward_model.rollout" if is_reward_model else "actor_rollout_ref.rollout"
        )

    def get_ray_class_with_init_args(self) -> RayClassWithInitArgs:
        """The actor verl's ``RayWorkerGroup`` creates on the pool: our server, which is also the
        replica's ``CheckpointEngineWorker``; for a reward model, the ``/classify`` server."""
        server_cls = RayClassWithInitArgs(
            cls=ray.remote(HFRewardServer if self.is_reward_model else HFRolloutServer),
            rollout_config=self.config,
            model_config=self.model_config,
            replica_rank=self.replica_rank,
        )
        # generate() calls wait inside the actor for their batch; allow as many as the engine admits.
        server_cls.update_options({"max_concurrency": self.max_concurrency})
        return server_cls

    async def launch_servers(self) -> None:
        """Start serving on the actors verl created from ``get_ray_class_with_init_args``."""
        if self.rollout_mode == RolloutMode.HYBRID:
            raise NotImplementedError(
                f"rollout.name={ROLLOUT_NAME} cannot share processes with the actor (hybrid engine); give the "
                "rollout its own pool (standalone: LLMServerManager without a worker group, rollout.nnodes > 0)"
            )
        self.servers = list(self.workers)
        addresses = await asyncio.gather(*[server.launch_server.remote() for server in self.servers])
        self._server_handle = self.servers[0]
        self._server_address = addresses[0]
