"""The long-tail demo tasks: response lengths from a few tokens to hundreds, as in real RL workloads.

What: a prompt ``repeat c`` asks for the letter ``c`` written over a response budget; the reward is the
share of the budget written as ``c`` (partial credit, so it is learnable from the demo model's first
guesses). Budgets are lognormal, capped at ``MAX_RESPONSE_LENGTH``, in two shapes (``TailShape``): ``LONG_TAIL``,
one budget per problem, p99 about ten times the median (profile ``one_step_off_ppo_cpu_long_tail``), and
``HEAVY_TAIL``, where each training sample draws its own budget around its problem's, so lengths vary within a group
too, about 3% of the samples at the cap (``one_step_off_ppo_cpu_generation_bound``).

Why: the sort task's answers are at most 6 tokens, so no batch has a tail; math reasoning and agent rollouts do
(the replicas idle while the longest run). These tasks put that shape through the real entry point, reproducibly,
for the partial-rollout benchmark (``python -m benchmarks partial-rollout``) and its tests.

How: the rows name ``long_tail_agent_loop.BudgetedAgentLoop``, which generates exactly the sample's budget
(``SampleBudgets``) and hands it to the reward (``scored_budget``, ``score_repeat``). This module imports no verl
(the reward loads it).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from recipe.one_step_off_async.demo import task

DATA_SOURCE = "one_step_off_async/long_tail_repeat"
PROMPT_PREFIX = "repeat "
MIN_BUDGET = 2
MAX_RESPONSE_LENGTH = 480  # the demo model has 512 positions; prompts take 16
MAX_PROMPT_LENGTH = 8 + len(PROMPT_PREFIX) + 1  # chat template around the user turn, one token per character
NUM_TRAIN = 4096
NUM_VAL = 128
AGENT_LOOP_NAME = "long_tail_repeat"


@dataclass(frozen=True)
class TailShape:
    """Lognormal response budgets: ``median`` tokens, ``prompt_sigma`` across problems, ``sample_sigma`` within one
    (before the clip, p99 / median = exp(2.326 * sqrt(prompt_sigma**2 + sample_sigma**2)))."""

    name: str  # the files' prefix: <name>_train.parquet, <name>_val.parquet
    median: int
    prompt_sigma: float
    sample_sigma: float = 0.0


LONG_TAIL = TailShape("long_tail", median=48, prompt_sigma=1.0)
HEAVY_TAIL = TailShape("heavy_tail", median=32, prompt_sigma=1.0, sample_sigma=1.0)

ROW_SCHEMA = task.row_schema(("response_budget", pa.int64()), ("budget_sigma", pa.float64())).append(
    task.AGENT_NAME_FIELD
)


def clip_budget(tokens: float) -> int:
    return min(MAX_RESPONSE_LENGTH, max(MIN_BUDGET, round(tokens)))


def response_budgets(count: int, seed: int, shape: TailShape = LONG_TAIL) -> list[int]:
    """``count`` problems' budgets: lognormal around ``shape.median``, clipped to [MIN_BUDGET, MAX_RESPONSE_LENGTH]."""
    rng = random.Random(seed)
    return [clip_budget(rng.lognormvariate(math.log(shape.median), shape.prompt_sigma)) for _ in range(count)]


# The drawn budget, in the sample's ``extras`` (verl's extra field of every sample).
SAMPLE_BUDGET_KEY = "response_budget"


def draws_per_sample(extra_info: dict) -> bool:
    """Whether a row's samples draw budgets of their own: training rows of a task with a spread within groups."""
    return bool(extra_info.get("budget_sigma")) and extra_info.get("split") == "train"


class SampleBudgets:
    """The budgets of one process's samples: a training row's k-th sample here draws from a stream seeded by
    (its problem's index, k), so a group's budgets are the same whatever order its samples arrive in; validation
    rows and rows without a spread keep their problem's budget."""

    def __init__(self) -> None:
        self._draws: Counter[int] = Counter()

    def draw(self, extra_info: dict) -> int:
        budget = int(extra_info["response_budget"])
        if not draws_per_sample(extra_info):
            return budget
        index = int(extra_info["index"])
        rng = random.Random(f"{index}/{self._draws[index]}")
        self._draws[index] += 1
        return clip_budget(budget * rng.lognormvariate(0.0, float(extra_info["budget_sigma"])))


def scored_budget(extra_info: dict) -> int:
    """The budget a response is scored against: its sample's drawn budget, else its problem's (refused for a row
    whose samples draw budgets: its score would be against the wrong length)."""
    drawn = (extra_info.get("extras") or {}).get(SAMPLE_BUDGET_KEY)
    if drawn is not None:
        return int(drawn)
    if draws_per_sample(extra_info):
        raise ValueError(
            f"a heavy-tail sample reached the reward without the budget its agent loop drew (extras.{SAMPLE_BUDGET_KEY}); "
            "verl's `naive` reward manager passes each sample's extra fields on to the reward "
            "(reward.reward_manager.name=naive), verl's `dapo` and `gdpo` do not"
        )
    return int(extra_info["response_budget"])


def to_rows(count: int, split: str, seed: int, shape: TailShape = LONG_TAIL) -> list[dict]:
    budgets = response_budgets(count, seed, shape)
    rng = random.Random(seed + 1)
    letters = [rng.choice(task.ALPHABET) for _ in budgets]
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": PROMPT_PREFIX + letter}],
            "ability": "repetition",
            "reward_model": {"style": "rule", "ground_truth": letter},
            "extra_info": {
                "index": index,
                "split": split,
                "response_budget": budget,
                "budget_sigma": shape.sample_sigma,
            },
            "agent_name": AGENT_LOOP_NAME,
        }
        for index, (letter, budget) in enumerate(zip(letters, budgets, strict=True))
    ]


def write_splits(out_dir: str | Path, seed: int, shape: TailShape = LONG_TAIL) -> dict[str, Path]:
    """Write ``<shape.name>_train.parquet`` and ``<shape.name>_val.parquet``; return the paths by split."""
    rows = {"train": to_rows(NUM_TRAIN, "train", seed, shape), "val": to_rows(NUM_VAL, "val", seed + 10_000, shape)}
    return task.write_rows(rows, out_dir, f"{shape.name}_", ROW_SCHEMA)


def write_agent_loop_config(out_dir: str | Path) -> Path:
    """The YAML for ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` that registers the loop."""
    path = Path(out_dir) / "long_tail_agent_loop.yaml"
    loop = "recipe.one_step_off_async.demo.long_tail_agent_loop.BudgetedAgentLoop"
    path.write_text(f"- name: {AGENT_LOOP_NAME}\n  _target_: {loop}\n")
    return path


def score_repeat(response: str, letter: str, budget: int) -> float:
    """Share of the budget written as ``letter``: 1.0 for ``letter * budget``, partial credit otherwise."""
    return min(response.count(letter), budget) / budget
