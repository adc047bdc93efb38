"""Multi-turn agent loops under the staleness contract: the weight version of every turn, not just the first.

verl's ``ToolAgentLoop`` calls the rollout once per assistant turn and keeps the first turn's ``extra_fields``.
``VersionedToolAgentLoop`` is verl's loop plus a record of each turn, its token versions aligned with the response as
verl aligns log-probs (docs/advance/one_step_off_async/pipeline.md, "Multi-turn tool use"), written over all turns
(``min_global_steps`` / ``max_global_steps``, ``VERSION_RUNS``, the per-request counters). ``OneStepOffAgentLoopWorker``
maps ``tool_agent`` to it; ``OneStepOffAgentLoopManager`` starts those workers; ``agent_loop_manager_class`` is a user's
subclass named by ``rollout.agent.agent_loop_manager_class``, else the recipe's (any other class is refused before Ray
starts). ``tests/test_platforms_verl_compat_on_cpu.py`` fails when verl changes what this relies on.
"""

from __future__ import annotations

import math
from typing import Any

import ray
from omegaconf import DictConfig
from verl.experimental.agent_loop import agent_loop
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopOutput, AgentLoopWorker
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.workers.rollout.replica import TokenOutput

from recipe.one_step_off_async.elastic.client import REGENERATED
from recipe.one_step_off_async.rollout.partial import RECOMPUTED_PREFILL, VERSION_RUNS, add_run
from recipe.one_step_off_async.trainer.configured_class import recipe_subclass

TOOL_AGENT = "tool_agent"
VERL_TOOL_AGENT_TARGET = f"{ToolAgentLoop.__module__}.{ToolAgentLoop.__qualname__}"
# Counters each rollout call reports for itself: a conversation's is the sum over its turns.
SUMMED_OVER_TURNS = (RECOMPUTED_PREFILL, REGENERATED)


def token_versions(output: TokenOutput) -> list[int | None]:
    """The weight version of each token of one rollout call: its ``VERSION_RUNS`` if the client stamped
    them (partial rollout), else the one version the whole call ran under."""
    runs = output.extra_fields.get(VERSION_RUNS)
    if runs is None:
        return [output.extra_fields.get("global_steps")] * len(output.token_ids)
    versions = [version for version, n_tokens in runs for _ in range(n_tokens)]
    if len(versions) != len(output.token_ids):
        raise ValueError(
            f"{VERSION_RUNS}={runs} stamp {len(versions)} tokens of a {len(output.token_ids)}-token output"
        )
    return versions


class _TurnRecorder:
    """One conversation's view of the rollout client: forwards everything, keeps each ``generate`` output."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.turns: list[TokenOutput] = []

    async def generate(self, *args: Any, **kwargs: Any) -> TokenOutput:
        output = await self._client.generate(*args, **kwargs)
        self.turns.append(output)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class VersionedToolAgentLoop(ToolAgentLoop):
    """verl's tool agent loop whose output carries the weight versions of all its turns (module docstring)."""

    def __init__(self, *args: Any, server_manager: Any, **kwargs: Any) -> None:
        self._recorder = _TurnRecorder(server_manager)
        super().__init__(*args, server_manager=self._recorder, **kwargs)
        # Parallel to the conversation's response mask: the version of each model token (NaN elsewhere).
        self._versions: list[float] = []
        self._proposed: tuple[list[int], list[float]] | None = None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        output.extra_fields.update(self._fields_over_turns(output.response_mask))
        return output

    # Each merge into the response is mirrored onto the versions; the state handlers then keep the
    # mirrored versions if the conversation adopted that merge (verl drops a tool response that overflows).
    async def ct_merge_assistant_token(self, *args: Any, **kwargs: Any):
        merge_result, response_mask, response_logprobs = await super().ct_merge_assistant_token(*args, **kwargs)
        turn = [math.nan if version is None else float(version) for version in token_versions(self._recorder.turns[-1])]
        self._propose(merge_result, response_mask, turn)
        return merge_result, response_mask, response_logprobs

    async def ct_merge_context_msg(self, *args: Any, **kwargs: Any):
        merge_result, response_mask, response_logprobs = await super().ct_merge_context_msg(*args, **kwargs)
        self._propose(merge_result, response_mask, None)
        return merge_result, response_mask, response_logprobs

    async def _handle_generating_state(self, agent_data: Any, *args: Any, **kwargs: Any) -> AgentState:
        state = await super()._handle_generating_state(agent_data, *args, **kwargs)
        self._adopt(agent_data.response_mask)
        return state

    async def _handle_processing_tools_state(self, agent_data: Any) -> AgentState:
        state = await super()._handle_processing_tools_state(agent_data)
        self._adopt(agent_data.response_mask)
        return state

    def _propose(self, merge_result: Any, response_mask: list[int], turn: list[float] | None) -> None:
        _, versions = self.continuous_token_builder.align_response_metadata(
            merge_result, [1] * len(self._versions), self._versions, assistant_logprobs=turn
        )
        if len(versions) != len(response_mask):
            raise RuntimeError(f"weight versions of {len(versions)} tokens for a {len(response_mask)}-token response")
        self._proposed = (response_mask, versions)

    def _adopt(self, response_mask: list[int]) -> None:
        if self._proposed is not None and self._proposed[0] is response_mask:
            self._versions = self._proposed[1]
        self._proposed = None

    def _fields_over_turns(self, response_mask: list[int]) -> dict[str, Any]:
        turns = [turn.extra_fields for turn in self._recorder.turns]
        tokens = [version for version, mask in zip(self._versions, response_mask, strict=False) if mask]
        versions = [None if math.isnan(version) else int(version) for version in tokens]
        if not versions:  # no model token kept: the versions the turns ran under
            versions = [turn.get("global_steps") for turn in turns]
        known = bool(versions) and None not in versions
        fields: dict[str, Any] = {
            **(turns[-1] if turns else {}),
            "min_global_steps": min(versions) if known else None,
            "max_global_steps": max(versions) if known else None,
        }
        if any(VERSION_RUNS in turn for turn in turns):
            runs: list[list[int]] = []
            for version in (None if math.isnan(v) else int(v) for v in tokens):
                add_run(runs, version, 1)
            fields[VERSION_RUNS] = runs
        for key in SUMMED_OVER_TURNS:
            if any(key in turn for turn in turns):
                fields[key] = sum(turn.get(key, 0) for turn in turns)
        return fields


def register_versioned_tool_agent(registry: dict[str, dict]) -> None:
    """``tool_agent`` in verl's agent-loop ``registry`` becomes ``VersionedToolAgentLoop``, unless a user's
    ``rollout.agent.agent_loop_config_path`` registered a loop of their own under that name."""
    registered = registry.get(TOOL_AGENT)
    if registered is None or registered.get("_target_") == VERL_TOOL_AGENT_TARGET:
        registry[TOOL_AGENT] = {
            "_target_": f"{VersionedToolAgentLoop.__module__}.{VersionedToolAgentLoop.__qualname__}"
        }


class OneStepOffAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker whose ``tool_agent`` is ``VersionedToolAgentLoop`` (in this process only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # registers the loops of rollout.agent.agent_loop_config_path
        register_versioned_tool_agent(agent_loop._agent_loop_registry)


class OneStepOffAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` over ``OneStepOffAgentLoopWorker`` (the attribute verl reads for it)."""

    agent_loop_workers_class = ray.remote(OneStepOffAgentLoopWorker)


MANAGER_CLASS_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"


def agent_loop_manager_class(config: DictConfig) -> type[OneStepOffAgentLoopManager]:
    """The manager named by ``MANAGER_CLASS_KEY``: the recipe's, or a user's subclass of it (else ``ConfigError``)."""
    why = "its workers record the weight version of every turn, which the trainer checks"
    return recipe_subclass(config, MANAGER_CLASS_KEY, OneStepOffAgentLoopManager, why)
