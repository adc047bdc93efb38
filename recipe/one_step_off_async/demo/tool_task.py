"""The tool-use demo task: sort five letters by calling a tool, over several turns of verl's tool agent loop.

What: the sort task's problems, in rows that name verl's ``tool_agent`` loop (``agent_name``); the tool
``sort_letters`` (``tools.py``, loaded by ``rollout.multi_turn.function_tool_path``) returns the letters
sorted, called in hermes' format (a conversation: docs/advance/one_step_off_async/pipeline.md, "Multi-turn tool
use"). The reward (``score_final_answer``) is the sort task's, on the text after the last ``assistant`` header of
the whole decoded multi-turn response.

Why: multi-turn agentic rollouts are where uneven, long generations make asynchronous training pay
most, and where each turn may run under different weights. This task puts verl's tool agent loop
through the pipeline with a model that really calls a tool, within the tiny model's budget.

How: ``warm_start_tool_use`` fine-tunes the sort model on a teacher that calls the tool (reward 1) or answers
directly with the sort task's flawed teacher (about 0.3), so RL has a reason to call it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from recipe.one_step_off_async.demo import task, warm_start
from recipe.one_step_off_async.demo.task import Problem, score_answer

DATA_SOURCE = "one_step_off_async/sort_letters_tool"
AGENT_LOOP_NAME = "tool_agent"  # verl's tool agent loop
TOOL_NAME = "sort_letters"  # tools.py
ASSISTANT_HEADER = "assistant\n"  # how a later assistant turn starts in the decoded response
TOOL_USE_RATE = 0.75
SFT_STEPS = 300
BATCH_SIZE = 32
LEARNING_RATE = 1e-3
# The longest conversation: the tool call and its eos (82 tokens), the tool turn around the result
# (18), the answer and its eos (6); one token per character under the demo tokenizer.
MAX_RESPONSE_LENGTH = 128

ROW_SCHEMA = task.ROW_SCHEMA.append(task.AGENT_NAME_FIELD)


def tool_call(letters: str) -> str:
    """The assistant turn that calls the tool on ``letters``, in hermes' format."""
    return f"<tool_call>{json.dumps({'name': TOOL_NAME, 'arguments': {'letters': letters}})}</tool_call>"


def teacher_conversation(problem: Problem, rng: random.Random) -> list[dict[str, str]]:
    """The teacher's conversation for ``problem``: the tool called (``TOOL_USE_RATE``), or a direct answer."""
    if rng.random() < TOOL_USE_RATE:
        return [
            *problem.messages,
            {"role": "assistant", "content": tool_call(problem.letters)},
            {"role": "tool", "content": problem.answer},
            {"role": "assistant", "content": problem.answer},
        ]
    return warm_start.teacher_conversation(problem, rng)


def score_final_answer(response: str, ground_truth: str) -> float:
    """The sort task's score of the text after the last assistant header (all of a one-turn response)."""
    return score_answer(response.rsplit(ASSISTANT_HEADER, 1)[-1], ground_truth)


def write_splits(splits: dict[str, list[Problem]], out_dir: str | Path) -> dict[str, Path]:
    """``tool_<split>.parquet``: the sort task's rows, under this task's data source, naming verl's tool agent loop."""
    rows = {
        split: [row | {"agent_name": AGENT_LOOP_NAME} for row in task.to_rows(problems, split, DATA_SOURCE)]
        for split, problems in splits.items()
    }
    return task.write_rows(rows, out_dir, "tool_", ROW_SCHEMA)


def warm_start_tool_use(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    seed: int,
    steps: int = SFT_STEPS,
) -> None:
    """Fine-tune ``model`` in place on the teacher's conversations about ``problems`` (with replacement)."""
    warm_start.supervised_fit(model, tokenizer, problems, teacher_conversation, seed, steps, BATCH_SIZE, LEARNING_RATE)
