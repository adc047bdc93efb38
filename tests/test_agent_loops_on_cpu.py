"""The multi-turn agent loop under the staleness contract (trainer/agent_loops.py), with a scripted rollout.

verl's tool agent loop runs for real (the demo tokenizer, verl's Qwen continuous-token builder, the demo's
tool); only the rollout client is a script of what each turn returns, weight versions included.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.function_tool import load_function_tools_from_path
from verl.workers.rollout.replica import TokenOutput

from recipe.one_step_off_async.demo import tool_task
from recipe.one_step_off_async.demo.task import Problem
from recipe.one_step_off_async.demo.tokenizer import build_tokenizer
from recipe.one_step_off_async.demo.warm_start import encode_conversation
from recipe.one_step_off_async.elastic.client import REGENERATED
from recipe.one_step_off_async.errors import ConfigError, WeightVersionError
from recipe.one_step_off_async.rollout.partial import RECOMPUTED_PREFILL, VERSION_RUNS
from recipe.one_step_off_async.trainer.agent_loops import (
    TOOL_AGENT,
    VERL_TOOL_AGENT_TARGET,
    OneStepOffAgentLoopManager,
    VersionedToolAgentLoop,
    agent_loop_manager_class,
    register_versioned_tool_agent,
    token_versions,
)
from recipe.one_step_off_async.trainer.checks import check_token_versions, measured_weight_version

PROBLEM = Problem("dbeca")
TOKENIZER = build_tokenizer()
CALL = TOKENIZER.encode(tool_task.tool_call(PROBLEM.letters), add_special_tokens=False) + [TOKENIZER.eos_token_id]
ANSWER = TOKENIZER.encode(PROBLEM.answer, add_special_tokens=False) + [TOKENIZER.eos_token_id]


class ScriptedClient:
    """Returns the scripted turns in order, each with its extra fields; records the prompts it was sent."""

    def __init__(self, *turns: tuple[list[int], dict]) -> None:
        self.turns = list(turns)
        self.prompts: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        token_ids, extra_fields = self.turns.pop(0)
        return TokenOutput(
            token_ids=token_ids, log_probs=[-0.5] * len(token_ids), stop_reason="completed", extra_fields=extra_fields
        )


def converse(client: ScriptedClient, loop_cls=VersionedToolAgentLoop, response_length: int = 128):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        config = compose(
            config_name="one_step_off_ppo_cpu",
            overrides=[
                "actor_rollout_ref.rollout.multi_turn.enable=true",
                f"data.max_response_length={response_length}",
            ],
        )
    tools = load_function_tools_from_path(str(Path(tool_task.__file__).with_name("tools.py")))

    async def conversation():  # verl's loop binds the event loop it is created in
        loop = loop_cls(
            trainer_config=DictConfigWrap(config),
            server_manager=client,
            tokenizer=TOKENIZER,
            processor=None,
            dataset_cls=None,
            data_config=DictConfigWrap(config.data),
            hf_model_type="qwen2",
            tools=ToolListWrap(tools),
        )
        return await loop.run({"temperature": 1.0}, raw_prompt=PROBLEM.messages, extra_info={})

    return asyncio.run(conversation())


def partial(version_runs, recomputed=0, regenerated=0) -> dict:
    """The extra fields of one turn through the elastic partial-rollout client."""
    last = version_runs[-1][0]
    return {"global_steps": last, VERSION_RUNS: version_runs, RECOMPUTED_PREFILL: recomputed, REGENERATED: regenerated}


def test_the_tool_is_called_and_the_prompt_of_each_turn_is_the_warm_starts_conversation():
    client = ScriptedClient((CALL, {"global_steps": 2}), (ANSWER, {"global_steps": 2}))
    output = converse(client)
    conversation = [
        *PROBLEM.messages,
        {"role": "assistant", "content": tool_task.tool_call(PROBLEM.letters)},
        {"role": "tool", "content": PROBLEM.answer},
        {"role": "assistant", "content": PROBLEM.answer},
    ]
    ids, labels = encode_conversation(TOKENIZER, conversation)
    # What the model was trained on is exactly what verl's loop sends it, turn by turn.
    assert client.prompts[1] == ids[: len(ids) - len(ANSWER)]
    assert output.prompt_ids + output.response_ids == ids
    assert [m for m, label in zip(output.response_mask, labels[len(output.prompt_ids) :], strict=True)] == [
        int(label != -100) for label in labels[len(output.prompt_ids) :]
    ]
    assert output.num_turns == 4  # user, assistant, tool, assistant
    decoded = TOKENIZER.decode(output.response_ids, skip_special_tokens=True)
    assert tool_task.score_final_answer(decoded, PROBLEM.answer) == 1.0
    assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (2, 2)
    assert VERSION_RUNS not in output.extra_fields  # not a partial rollout: nothing to stamp per token


def test_partial_rollout_stamps_every_model_token_of_every_turn_and_sums_the_counters():
    client = ScriptedClient(
        (CALL, partial([[3, 10], [4, len(CALL) - 10]], recomputed=28, regenerated=1)),
        (ANSWER, partial([[5, len(ANSWER)]])),
    )
    output = converse(client)
    runs = output.extra_fields[VERSION_RUNS]
    assert runs == [[3, 10], [4, len(CALL) - 10], [5, len(ANSWER)]]
    assert sum(n for _, n in runs) == sum(output.response_mask) == len(CALL) + len(ANSWER)
    fields = output.extra_fields
    assert (fields["min_global_steps"], fields["max_global_steps"]) == (3, 5)
    assert (fields[RECOMPUTED_PREFILL], fields[REGENERATED]) == (28, 1)
    # The trainer's per-token check passes within [3, 5] and names the first turn's tokens outside [4, 5].
    batch = DataProto.from_dict(
        tensors={"response_mask": torch.tensor([output.response_mask])},
        non_tensors={VERSION_RUNS: np.array([runs], dtype=object), RECOMPUTED_PREFILL: np.array([28])},
    )
    assert check_token_versions(6, batch, 3, 5, "test")["async/version_span_max"] == 2
    with pytest.raises(WeightVersionError, match="tokens sampled by weight version v3, outside"):
        check_token_versions(6, batch, 4, 5, "test")


def test_verl_alone_stamps_the_first_turn_only_which_the_trainer_refuses():
    """Why the recipe's loop exists: verl's keeps the first turn's fields (and a truthy max_global_steps)."""
    client = ScriptedClient((CALL, partial([[0, len(CALL)]])), (ANSWER, partial([[1, len(ANSWER)]])))
    output = converse(client, loop_cls=ToolAgentLoop)
    assert output.extra_fields[VERSION_RUNS] == [[0, len(CALL)]]
    batch = DataProto.from_dict(
        tensors={"response_mask": torch.tensor([output.response_mask])},
        non_tensors={VERSION_RUNS: np.array([output.extra_fields[VERSION_RUNS]], dtype=object)},
    )
    with pytest.raises(
        WeightVersionError, match=f"has {len(CALL) + len(ANSWER)} response tokens but weight versions for {len(CALL)}"
    ):
        check_token_versions(2, batch, 0, 1, "test")


def test_a_sync_between_turns_is_caught_in_synchronous_mode_even_from_version_0():
    """Without partial rollout every sample must run under one version: the lowest and highest over turns."""
    client = ScriptedClient((CALL, {"global_steps": 0}), (ANSWER, {"global_steps": 1}))
    output = converse(client)
    fields = output.extra_fields
    assert (fields["min_global_steps"], fields["max_global_steps"]) == (0, 1)
    batch = DataProto.from_dict(
        tensors={"response_mask": torch.tensor([output.response_mask])},
        non_tensors={key: np.array([fields[key]], dtype=object) for key in ("min_global_steps", "max_global_steps")},
    )
    with pytest.raises(WeightVersionError, match="across weight versions v0..v1"):
        measured_weight_version(1, batch, 0, "vllm", "test")


@pytest.mark.parametrize("response_length", [90, len(CALL) + 17 + 3])
def test_truncated_conversations_stamp_exactly_the_tokens_kept(response_length):
    # 90: the tool response overflows and is dropped (verl ends the conversation after the call);
    # the other: the answer is cut to 3 tokens by the response length.
    client = ScriptedClient((CALL, partial([[1, len(CALL)]])), (ANSWER, partial([[2, len(ANSWER)]])))
    output = converse(client, response_length=response_length)
    runs = output.extra_fields[VERSION_RUNS]
    assert sum(n for _, n in runs) == sum(output.response_mask)
    assert runs[0] == [1, len(CALL)]
    assert len(output.response_mask) <= response_length


def test_token_versions_expand_the_runs_and_refuse_a_mismatch():
    output = TokenOutput(token_ids=[1, 2, 3], extra_fields={VERSION_RUNS: [[4, 1], [5, 2]], "global_steps": 5})
    assert token_versions(output) == [4, 5, 5]
    assert token_versions(TokenOutput(token_ids=[1, 2], extra_fields={"global_steps": 7})) == [7, 7]
    with pytest.raises(ValueError, match="stamp 2 tokens of a 3-token output"):
        token_versions(TokenOutput(token_ids=[1, 2, 3], extra_fields={VERSION_RUNS: [[4, 2]]}))


def test_tool_agent_becomes_the_versioned_loop_unless_a_user_registered_their_own():
    registry = {TOOL_AGENT: {"_target_": VERL_TOOL_AGENT_TARGET}}
    register_versioned_tool_agent(registry)
    assert registry[TOOL_AGENT]["_target_"].endswith("agent_loops.VersionedToolAgentLoop")
    own = {TOOL_AGENT: {"_target_": "my.ToolLoop"}}
    register_versioned_tool_agent(own)
    assert own == {TOOL_AGENT: {"_target_": "my.ToolLoop"}}


class SubclassedManager(OneStepOffAgentLoopManager):
    """A user's manager that extends the recipe's."""


def with_manager_class(name: str | None):
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"agent": {"agent_loop_manager_class": name}}}})


def test_the_agent_loop_manager_is_the_recipes_unless_a_subclass_is_configured():
    assert agent_loop_manager_class(OmegaConf.create({"actor_rollout_ref": {"rollout": {}}})) is (
        OneStepOffAgentLoopManager
    )
    assert agent_loop_manager_class(with_manager_class(None)) is OneStepOffAgentLoopManager
    assert agent_loop_manager_class(with_manager_class(f"{__name__}.SubclassedManager")) is SubclassedManager


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("verl.experimental.agent_loop.AgentLoopManager", "is not a subclass of"),
        (f"{__name__}.NoSuchManager", "does not import"),
        ("no_such_module.Manager", "does not import"),
        ("AgentLoopManager", "does not import"),
    ],
)
def test_any_other_agent_loop_manager_is_refused_naming_the_key_the_class_and_the_fix(name, why):
    with pytest.raises(ConfigError) as refused:
        agent_loop_manager_class(with_manager_class(name))
    (problem,) = refused.value.problems
    assert problem.startswith(f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={name} {why}")
    assert "subclass recipe.one_step_off_async.trainer.agent_loops.OneStepOffAgentLoopManager" in problem
    assert "or unset the key" in problem
