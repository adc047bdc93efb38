"""verl's reward loop with a reward model on a pool of its own, for every rollout backend the recipe runs.

What: ``OneStepOffRewardLoopManager``, verl's ``RewardLoopManager`` whose workers are
``OneStepOffRewardLoopWorker``: verl's ``RewardLoopWorker`` with ``compute_score_disrm`` changed (verl 0.9.1).

Why: verl's method names ``reward.reward_model.model_path`` in vLLM's ``/classify`` request, which a replica
serving a local copy of that path answers with 404. And it returns no ``reward_extra_info``, which verl's agent
loop reads when a reward model on its own pool scores each sample as it is generated: ``KeyError`` at the first
sample, with any engine (verl issue #7368); here it returns an empty one.
``tests/test_platforms_verl_compat_on_cpu.py`` notices when verl changes either behaviour.
"""

from __future__ import annotations

import ray
from omegaconf import DictConfig
from verl.experimental.reward_loop.reward_loop import RewardLoopManager, RewardLoopWorker

from recipe.one_step_off_async.backends import VLLM


class OneStepOffRewardLoopWorker(RewardLoopWorker):
    async def compute_score_disrm(self, data) -> dict:
        """verl's scoring with vLLM's ``/classify`` request naming no model, with a ``reward_extra_info``.

        A replica serves its one model under the path it loaded it from (a local copy of an ``hdfs://`` path, say),
        and vLLM answers 404 "The model ... does not exist" to any other name, but takes it when the request names
        none."""
        if self.config.reward.reward_model.rollout.name != VLLM:
            result = await super().compute_score_disrm(data)
        else:
            payload = {"input": await self._preprocess_reward_inputs(data), "use_activation": False}
            output = await self._post_request(payload, "classify")
            result = {"reward_score": output["data"][-1]["probs"][-1]}
        return {"reward_extra_info": {}, **result}


class OneStepOffRewardLoopManager(RewardLoopManager):
    def _init_reward_loop_workers(self) -> None:
        self.reward_loop_workers_class = ray.remote(OneStepOffRewardLoopWorker)
        super()._init_reward_loop_workers()


def reward_source(reward: DictConfig) -> str:
    """What scores the samples, for error messages (verl's reward loop: the function if one is set, else the model)."""
    if reward.custom_reward_function.path is None and reward.reward_model.enable:
        return f"reward model {reward.reward_model.model_path}"
    return (
        f"reward function {reward.custom_reward_function.path or 'verl default'}:{reward.custom_reward_function.name}"
    )
