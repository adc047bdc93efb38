"""The real OneStepOffRayTrainer with stub workers: a fake rollout pool, weight sync and actor RPCs.

Everything between the RPC boundaries is the production code (verl's step template, the
pipeline, version checks, metrics); only the remote calls are replaced. Each stub appends to one
shared event log, so tests can check the loop's order: when generation k+s was launched
relative to update k, how many batches were in flight, and that every update is followed by a
sync while no generation runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from hydra import compose, initialize_config_module
from torch.utils.data import Dataset
from verl import DataProto
from verl.trainer.ppo.utils import Role
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.config import CheckpointEngineConfig

from recipe.one_step_off_async.trainer.ray_trainer import OneStepOffRayTrainer
from recipe.one_step_off_async.trainer.step_metrics import job_resource_pool_manager
from recipe.one_step_off_async.trainer.sync_manager import OneStepOffCheckpointManager

PROMPT_LEN, RESPONSE_LEN = 4, 3
LAUNCH_VERSION = "stub_launch_version"  # the rollout's weight version when the trainer launched the batch


@dataclass
class EventLog:
    events: list[tuple] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, *event) -> None:
        with self.lock:
            self.events.append(event)

    def index(self, *event) -> int:
        return self.events.index(event)

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


class PromptDataset(Dataset):
    """Rows shaped like verl's RLHFDataset output; `index` identifies the prompt."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        return {
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "raw_prompt": [{"role": "user", "content": f"prompt {i}"}],
            "index": i,
            "data_source": "stub",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {},
        }


class StubRollout:
    """Stands in for AgentLoopManager: returns padded sequences tagged with its weight version."""

    def __init__(
        self,
        log: EventLog,
        seconds: float = 0.05,
        fail_at_step: int | None = None,
        nan_at_step: int | None = None,
        hang_validation: bool = False,
        log_probs: bool = True,
        partial: bool = False,
    ) -> None:
        self.log, self.seconds, self.fail_at_step, self.nan_at_step = log, seconds, fail_at_step, nan_at_step
        self.hang_validation, self.log_probs, self.partial = hang_validation, log_probs, partial
        self.version = -1
        self.running = 0  # generations running now (several at once in partial-rollout mode)
        self._lock = threading.Lock()

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        step = gen_batch.meta_info["global_steps"]
        if gen_batch.meta_info.get("validate"):
            self.log.add("validate", step, self.version, self.running)
            if self.hang_validation:
                threading.Event().wait()  # a replica that never answers
            return self._output(len(gen_batch))
        with self._lock:
            self.running += 1
        self.log.add("gen_start", step, self.version)
        # The first token is sampled under the version current at the batch's launch (the contract's oldest
        # bound), however late this thread runs, so that the bounds tests are exact. A real replica may start
        # a request after a later sync, under a newer version, which the contract allows.
        first_version = gen_batch.meta_info.get(LAUNCH_VERSION, self.version)
        try:
            time.sleep(self.seconds)
            if step == self.fail_at_step:
                raise ValueError(f"stub generation failed for step {step}")
            output = self._output(len(gen_batch), nan_reward=step == self.nan_at_step)
            if self.partial:  # the first response token sampled at the start, the others at the end
                last_version = self.version  # one reading: a sync may land while this runs
                runs = [[first_version, 1], [last_version, RESPONSE_LEN - 1]]
                if first_version == last_version:
                    runs = [[first_version, RESPONSE_LEN]]
                output.non_tensor_batch["weight_version_runs"] = np.array([runs] * len(gen_batch), dtype=object)
                output.non_tensor_batch["min_global_steps"][:] = first_version
                output.non_tensor_batch["max_global_steps"][:] = last_version
                output.non_tensor_batch["recomputed_prefill_tokens"] = np.full(len(gen_batch), 0, dtype=object)
            return output
        finally:
            self.log.add("gen_end", step, self.version)
            with self._lock:
                self.running -= 1

    def _output(self, size: int, nan_reward: bool = False) -> DataProto:
        prompts = torch.randint(3, 50, (size, PROMPT_LEN))
        responses = torch.randint(3, 50, (size, RESPONSE_LEN))
        attention_mask = torch.ones(size, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
        rm_scores = torch.zeros(size, RESPONSE_LEN)
        rm_scores[:, -1] = torch.rand(size)
        if nan_reward:
            rm_scores[1, -1] = float("nan")
        versions = np.array([self.version] * size, dtype=object)
        log_probs = {"rollout_log_probs": -torch.rand(size, RESPONSE_LEN)} if self.log_probs else {}
        return DataProto.from_dict(
            tensors={
                **log_probs,
                "prompts": prompts,
                "responses": responses,
                "response_mask": torch.ones(size, RESPONSE_LEN, dtype=torch.long),
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": attention_mask,
                "position_ids": torch.arange(PROMPT_LEN + RESPONSE_LEN).expand(size, -1).clone(),
                "rm_scores": rm_scores,
            },
            non_tensors={
                "min_global_steps": versions,
                "max_global_steps": versions.copy(),
                "multi_modal_inputs": np.array([{} for _ in range(size)], dtype=object),  # as verl's agent loop
            },
            meta_info={"timing": {}},
        )


class StubReplica:
    """What verl's weight-sync manager would put to sleep after a generation."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    async def sleep(self) -> None:
        self.log.add("replica_sleep")


class StubWeightSync(OneStepOffCheckpointManager):
    """The trainer's weight-sync manager whose sync (verl's remote calls) sets the stub rollout's weight version."""

    def __init__(
        self, log: EventLog, rollout: StubRollout, skip_version: int | None = None, hang_version: int | None = None
    ) -> None:
        super().__init__(config=CheckpointEngineConfig(backend="naive"), actor_wg=None, replicas=[StubReplica(log)])
        self.log, self.rollout, self.skip_version, self.hang_version = log, rollout, skip_version, hang_version

    def timed_update_weights(self, global_steps: int) -> dict:
        self.log.add("sync", global_steps, self.rollout.running)
        if global_steps == self.hang_version:
            threading.Event().wait()  # a receiver that never answers
        if global_steps != self.skip_version:
            self.rollout.version = global_steps
        return {}


class StubTokenizer:
    eos_token_id, pad_token_id = 1, 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def prompt_ids(batch: DataProto) -> tuple[int, ...]:
    return tuple(int(row["ground_truth"]) for row in batch.non_tensor_batch["reward_model"])


class StubbedTrainer(OneStepOffRayTrainer):
    """Replaces the actor RPCs; records launches, updates and the metrics of every step."""

    log: EventLog

    def _prepare_generation(self, batch_dict, step):
        self.log.add("launch", step)
        batch, gen_batch = super()._prepare_generation(batch_dict, step)
        gen_batch.meta_info[LAUNCH_VERSION] = self.async_rollout_manager.version
        return batch, gen_batch

    def _compute_old_log_prob(self, batch: DataProto):
        shape = batch.batch["responses"].shape
        return DataProto.from_dict(tensors={"old_log_probs": -torch.rand(shape), "entropys": torch.rand(shape)}), 0.0

    def _update_actor(self, batch: DataProto) -> DataProto:
        self.log.add("update", self.global_steps, self.train_dataloader.in_flight, prompt_ids(batch))
        return DataProto.from_single_dict(data={}, meta_info={"metrics": {"actor/pg_loss": 0.0}})

    def _save_checkpoint(self) -> None:
        self.log.add("save", self.global_steps)

    def _fit_postprocess_step(self) -> None:
        self.logged_metrics.append(dict(self.metrics))
        super()._fit_postprocess_step()


def compose_config(*overrides: str):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(
            config_name="one_step_off_ppo_trainer",
            overrides=[
                "trainer.n_gpus_per_node=2",
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.model.path=unused",
                "trainer.logger=[]",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.save_freq=-1",
                "trainer.balance_batch=false",
                "data.dataloader_num_workers=0",
                "trainer.resume_mode=disable",
                # Whole batches, one weight version each (the partial-rollout tests set it true, with a
                # StubRollout(partial=True) that interrupts its requests at a sync).
                "async_training.partial_rollout=false",
                *overrides,
            ],
        )


def build_trainer(config, log: EventLog, rollout: StubRollout, sync: StubWeightSync, dataset_size: int = 16):
    role_worker_mapping = {Role.ActorRollout: object}
    pools = job_resource_pool_manager(config, role_worker_mapping, one_gpu=False)  # trainer_pool: [2]
    dataset = PromptDataset(dataset_size)
    trainer = StubbedTrainer(
        config,
        StubTokenizer(),
        role_worker_mapping,
        pools,
        train_dataset=dataset,
        val_dataset=dataset,
        collate_fn=collate_fn,
    )
    trainer.log, trainer.logged_metrics = log, []
    trainer.async_rollout_manager = rollout
    trainer.checkpoint_manager = sync
    trainer.llm_server_manager = SimpleNamespace(get_replicas=lambda: [])  # no engine reports stats
    trainer.actor_rollout_wg = object()
    trainer._start_pipeline()  # what init_workers does with the real managers
    return trainer
