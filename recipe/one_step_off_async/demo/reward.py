"""Rule-based reward of the demo task, for verl's ``reward.custom_reward_function``.

What: ``compute_score`` returns 1.0 when the decoded response is exactly the sorted letters
(surrounding whitespace ignored), else 0.0; for the graded sort task the share of positions holding
the right letter (``task.score_positions``); for the long-tail task (``long_tail.py``) the share of
the response budget written as the asked letter; for the tool-use task (``tool_task.py``) the sort
task's score of the final answer. verl's reward managers decode the response with
``skip_special_tokens=True``, so a response that never emits ``<|im_end|>`` carries the tokens
sampled after the answer and scores 0.0.

Why a file of its own: verl loads the function from a file path (``custom_reward_function.path``),
so this module holds only the function and a helper that returns that path.

How::

    reward.custom_reward_function.path=$(python -c "from recipe.one_step_off_async.demo.reward \\
        import reward_function_path; print(reward_function_path())")
    reward.custom_reward_function.name=compute_score
"""

from pathlib import Path
from typing import Any

from recipe.one_step_off_async.demo import long_tail, tool_task
from recipe.one_step_off_async.demo.task import DATA_SOURCE, GRADED_DATA_SOURCE, score_answer, score_positions


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """Score one response; garbage text scores 0.0, a row of another dataset raises ``ValueError``."""
    if data_source == long_tail.DATA_SOURCE:
        return long_tail.score_repeat(solution_str, ground_truth, long_tail.scored_budget(extra_info))
    if data_source == tool_task.DATA_SOURCE:
        return tool_task.score_final_answer(solution_str, ground_truth)
    if data_source == GRADED_DATA_SOURCE:
        return score_positions(solution_str, ground_truth)
    if data_source != DATA_SOURCE:
        known = ", ".join(
            repr(source) for source in (DATA_SOURCE, GRADED_DATA_SOURCE, long_tail.DATA_SOURCE, tool_task.DATA_SOURCE)
        )
        raise ValueError(
            f"compute_score of {__name__} scores only data_source {known}, got {data_source!r}; "
            "point reward.custom_reward_function.path at the reward function of that dataset"
        )
    return score_answer(solution_str, ground_truth)


def reward_function_path() -> str:
    """Absolute path of this file, the value for ``reward.custom_reward_function.path``."""
    return str(Path(__file__).resolve())
