"""The tool-use demo task: sort five letters by calling a tool, over several turns of verl's tool agent loop.

What: the sort task's problems, in rows that name verl's ``tool_agent`` loop (``agent_name``); the tool
``sort_letters`` (``tools.py``, loaded by ``rollout.multi_turn.function_tool_path``) returns the letters
sorted. A conversation, in hermes' tool-call format (``rollout.multi_turn.format=hermes``)::

    user       sort dbeca
    assistant  <tool_call>{"name": "sort_letters", "arguments": {"letters": "dbeca"}}</tool_call>
    tool       abcde
    assistant  abcde

The reward (``score_final_answer``) is the sort task's, on the final answer: verl's reward managers
decode the whole multi-turn response (tool turns included, special tokens skipped), and the final answer
follows the last ``assistant`` header.

Why: multi-turn agentic rollouts are where uneven, long generations make asynchronous training pay
most, and where each turn may run under different weights. This task puts verl's tool agent loop
through the pipeline with a model that really calls a tool, within the tiny model's budget.

How: ``warm_start_tool_use`` fine-tunes the warm-started sort model on a teacher's conversations: in
``TOOL_USE_RATE`` of them it calls the tool and answers with the tool's result; otherwise it answers
directly, with the sort task's flawed teacher (``warm_start.teacher_answer``). Calling the tool earns
reward 1, answering directly about 0.3: RL has a reason to call it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from recipe.one_step_off_async.demo import task
from recipe.one_step_off_async.demo.task import Problem, score_answer
from recipe.one_step_off_async.demo.warm_start import IGNORE_INDEX, pad_batch, supervised_fit, teacher_answer

DATA_SOURCE = "one_step_off_async/sort_letters_tool"
AGENT_LOOP_NAME = "tool_agent"  # verl's tool agent loop
TOOL_NAME = "sort_letters"  # tools.py
TOOL_CALL_FORMAT = "hermes"
ASSISTANT_HEADER = "assistant\n"  # how a later assistant turn starts in the decoded response
TOOL_USE_RATE = 0.75
SFT_STEPS = 300
BATCH_SIZE = 32
LEARNING_RATE = 1e-3
# The longest conversation: the tool call and its eos (82 tokens), the tool turn around the result
# (18), the answer and its eos (6); one token per character under the demo tokenizer.
MAX_RESPONSE_LENGTH = 128

ROW_SCHEMA = task.ROW_SCHEMA.append(pa.field("agent_name", pa.string()))


def tool_call(letters: str) -> str:
    """The assistant turn that calls the tool on ``letters``, in hermes' format."""
    return f"<tool_call>{json.dumps({'name': TOOL_NAME, 'arguments': {'letters': letters}})}</tool_call>"


def conversation(problem: Problem, rng: random.Random) -> list[dict[str, str]]:
    """The teacher's conversation for ``problem``: the tool called (``TOOL_USE_RATE``), or a direct answer."""
    if rng.random() < TOOL_USE_RATE:
        return [
            *problem.messages,
            {"role": "assistant", "content": tool_call(problem.letters)},
            {"role": "tool", "content": problem.answer},
            {"role": "assistant", "content": problem.answer},
        ]
    return [*problem.messages, {"role": "assistant", "content": teacher_answer(problem, rng)}]


def final_answer(response: str) -> str:
    """The text after the last assistant header of a decoded multi-turn response (all of it for one turn)."""
    return response.rsplit(ASSISTANT_HEADER, 1)[-1]


def score_final_answer(response: str, ground_truth: str) -> float:
    return score_answer(final_answer(response), ground_truth)


def to_rows(problems: list[Problem], split: str) -> list[dict]:
    """The sort task's rows, under this task's data source, naming verl's tool agent loop."""
    return [row | {"data_source": DATA_SOURCE, "agent_name": AGENT_LOOP_NAME} for row in task.to_rows(problems, split)]


def write_splits(splits: dict[str, list[Problem]], out_dir: str | Path) -> dict[str, Path]:
    """Write ``tool_<split>.parquet`` for each split; return the paths by split."""
    paths = {}
    for split, problems in splits.items():
        paths[split] = Path(out_dir) / f"tool_{split}.parquet"
        pq.write_table(pa.Table.from_pylist(to_rows(problems, split), schema=ROW_SCHEMA), paths[split])
    return paths


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation as verl's tool agent loop builds them, and labels on the assistant turns.

    Each assistant turn is its content and eos, as sampled; every other turn is the chat template's
    rendering of it, followed by the assistant generation prompt (what verl's continuous-token builder
    appends after a tool response).
    """
    ids = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
    labels = [IGNORE_INDEX] * len(ids)
    for index, message in enumerate(messages[1:], start=1):
        if message["role"] == "assistant":
            turn = tokenizer.encode(message["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
            ids, labels = ids + turn, labels + turn
            continue
        before = tokenizer.apply_chat_template(messages[:index], tokenize=True, return_dict=False)
        after = tokenizer.apply_chat_template(
            messages[: index + 1], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        # The rendered history ends with eos + "\n"; the sampled turn ended at eos.
        delta = after[len(before) - 1 :]
        ids, labels = ids + delta, labels + [IGNORE_INDEX] * len(delta)
    return ids, labels


def warm_start_tool_use(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    seed: int,
    steps: int = SFT_STEPS,
) -> None:
    """Fine-tune ``model`` in place on the teacher's conversations about ``problems`` (with replacement)."""
    rng = random.Random(seed)

    def next_batch() -> dict[str, torch.Tensor]:
        encoded = [encode_conversation(tokenizer, conversation(p, rng)) for p in rng.choices(problems, k=BATCH_SIZE)]
        return pad_batch([ids for ids, _ in encoded], [labels for _, labels in encoded], tokenizer.pad_token_id)

    supervised_fit(model, next_batch, steps, LEARNING_RATE)
