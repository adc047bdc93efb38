"""Rule-based reward of the demo task, for verl's ``reward.custom_reward_function``.

What: ``compute_score`` scores a decoded response with the scorer of its row's task (by ``data_source``):
the sort task's, exact or graded, five letters or eight (``task.py``), the long-tail tasks' (``long_tail.py``), the tool-use
task's (``tool_task.py``), the vision task's (``vision_task.py``). verl's reward managers decode the response
with ``skip_special_tokens=True``, so a sort answer that never emits ``<|im_end|>`` carries the tokens sampled after it and scores 0.0.

Why a file of its own: verl loads the function from a file path (``custom_reward_function.path``, which
``reward_function_path`` returns; ``custom_reward_function.name=compute_score``).
"""

from pathlib import Path
from typing import Any

from recipe.one_step_off_async.demo import long_tail, tool_task, vision_task
from recipe.one_step_off_async.demo.task import (
    DATA_SOURCE,
    GRADED_DATA_SOURCE,
    LONG_DATA_SOURCE,
    score_answer,
    score_positions,
)


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """Score one response; garbage text scores 0.0, a row of another dataset raises ``ValueError``."""
    if data_source == DATA_SOURCE:
        return score_answer(solution_str, ground_truth)
    if data_source in (GRADED_DATA_SOURCE, LONG_DATA_SOURCE):
        return score_positions(solution_str, ground_truth)
    if data_source == long_tail.DATA_SOURCE:
        return long_tail.score_repeat(solution_str, ground_truth, long_tail.scored_budget(extra_info))
    if data_source == tool_task.DATA_SOURCE:
        return tool_task.score_final_answer(solution_str, ground_truth)
    if data_source == vision_task.DATA_SOURCE:
        return vision_task.score_colour(solution_str, ground_truth)
    raise ValueError(
        f"compute_score of {__name__} scores only the rows of the demo's tasks, got data_source {data_source!r}; "
        "point reward.custom_reward_function.path at the reward function of that dataset"
    )


def reward_function_path() -> str:
    """Absolute path of this file, the value for ``reward.custom_reward_function.path``."""
    return str(Path(__file__).resolve())
