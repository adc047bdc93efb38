"""The long-tail demo task: response lengths from tens to hundreds of tokens, as in real RL workloads.

What: a prompt ``repeat c`` asks for the letter ``c`` written over a response budget that comes with
the problem (``extra_info.response_budget``); the reward is the share of the budget written as ``c``
(partial credit, so it is learnable from the demo model's first guesses). Budgets are lognormal:
median ``MEDIAN_BUDGET`` tokens, p99 about ten times that (``BUDGET_SIGMA``), capped at
``MAX_RESPONSE_LENGTH``; so a batch of 64 waits for a sample about eight times its median.

Why: the built-in sort task's answers are at most 6 tokens, so no batch has a tail. Math reasoning and
agent rollouts do: most samples finish early and the replicas idle while the longest run. This task
puts that shape through the real entry point at a controlled, reproducible length distribution, for
the partial-rollout benchmark (``scripts/bench_partial_rollout.py``) and its tests.

How: ``long_tail_agent_loop.BudgetedAgentLoop`` (registered by the YAML the asset build writes, named in
the ``one_step_off_ppo_cpu_long_tail`` profile) is verl's single-turn agent loop with ``max_tokens`` set to
the problem's budget and ``ignore_eos`` on, so every response is exactly its budget long; the demo
reward (``reward.py``) scores it with ``score_repeat``. This module imports no verl (the reward loads it).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "one_step_off_async/long_tail_repeat"
ALPHABET = "abcdefghij"
PROMPT_PREFIX = "repeat "
MEDIAN_BUDGET = 48
BUDGET_SIGMA = 1.0  # p99 / median = exp(2.326 * sigma), about 10
MIN_BUDGET = 2
MAX_RESPONSE_LENGTH = 480  # the demo model has 512 positions; prompts take 16
MAX_PROMPT_LENGTH = 8 + len(PROMPT_PREFIX) + 1  # chat template around the user turn, one token per character
NUM_TRAIN = 4096
NUM_VAL = 128
AGENT_LOOP_NAME = "long_tail_repeat"

ROW_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string()), ("response_budget", pa.int64())])),
        ("agent_name", pa.string()),
    ]
)


def response_budgets(count: int, seed: int) -> list[int]:
    """``count`` lognormal budgets (median ``MEDIAN_BUDGET``), clipped to [MIN_BUDGET, MAX_RESPONSE_LENGTH]."""
    rng = random.Random(seed)
    return [
        min(MAX_RESPONSE_LENGTH, max(MIN_BUDGET, round(rng.lognormvariate(math.log(MEDIAN_BUDGET), BUDGET_SIGMA))))
        for _ in range(count)
    ]


def to_rows(count: int, split: str, seed: int) -> list[dict]:
    rng = random.Random(seed + 1)
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": PROMPT_PREFIX + letter}],
            "ability": "repetition",
            "reward_model": {"style": "rule", "ground_truth": letter},
            "extra_info": {"index": index, "split": split, "response_budget": budget},
            "agent_name": AGENT_LOOP_NAME,
        }
        for index, (letter, budget) in enumerate(
            (rng.choice(ALPHABET), budget) for budget in response_budgets(count, seed)
        )
    ]


def write_splits(out_dir: str | Path, seed: int) -> dict[str, Path]:
    """Write ``long_tail_train.parquet`` and ``long_tail_val.parquet``; return the paths by split."""
    paths = {}
    for split, count, split_seed in (("train", NUM_TRAIN, seed), ("val", NUM_VAL, seed + 10_000)):
        paths[split] = Path(out_dir) / f"long_tail_{split}.parquet"
        pq.write_table(pa.Table.from_pylist(to_rows(count, split, split_seed), schema=ROW_SCHEMA), paths[split])
    return paths


def write_agent_loop_config(out_dir: str | Path) -> Path:
    """The YAML for ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` that registers the loop."""
    path = Path(out_dir) / "long_tail_agent_loop.yaml"
    loop = "recipe.one_step_off_async.demo.long_tail_agent_loop.BudgetedAgentLoop"
    path.write_text(f"- name: {AGENT_LOOP_NAME}\n  _target_: {loop}\n")
    return path


def score_repeat(response: str, letter: str, budget: int) -> float:
    """Share of the budget written as ``letter``: 1.0 for ``letter * budget``, partial credit otherwise."""
    return min(response.count(letter), budget) / budget
