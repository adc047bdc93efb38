"""Which client the agent loops reach the rollout replicas through: verl's, or the recipe's, by mode.

- default: verl's ``LLMServerClient``;
- ``async_training.partial_rollout``: ``PartialRolloutClient`` (a request interrupted by a weight sync continues);
- ``async_training.elastic.enable``: ``ElasticLLMServerClient`` (a request whose replica died is sent to another);
- both: ``ElasticPartialRolloutClient``, partial outermost, so a replica lost mid-sample costs that segment
  only, resent from the prompt plus the tokens already returned.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.workers.rollout.llm_server import LLMServerClient

from recipe.one_step_off_async.async_config import AsyncTrainingConfig
from recipe.one_step_off_async.elastic.client import REGENERATED, ElasticLLMServerClient
from recipe.one_step_off_async.rollout.partial import PartialRolloutClient


class ElasticPartialRolloutClient(PartialRolloutClient, ElasticLLMServerClient):
    """Partial rollout over an elastic pool (see the module docstring); replicas lost count over all segments."""

    SUMMED_FIELDS = (REGENERATED,)


def rollout_client(
    async_config: AsyncTrainingConfig, controller: ray.actor.ActorHandle | None
) -> tuple[type[LLMServerClient], dict[str, Any]]:
    """The client class for ``LLMServerManager.get_client`` and the keyword arguments it takes."""
    elastic, partial = async_config.elastic.enable, async_config.partial_rollout
    if elastic:
        options = {"controller": controller}
        return (ElasticPartialRolloutClient if partial else ElasticLLMServerClient), options
    return (PartialRolloutClient if partial else LLMServerClient), {}
