"""The demo's tool, for verl's tool agent loop: ``actor_rollout_ref.rollout.multi_turn.function_tool_path``.

verl executes this file in each agent-loop worker (``load_function_tools_from_path``) and registers every
``@function_tool``; the tool's JSON schema comes from the signature and the docstring. The tool-use task
(``tool_task.py``) names it; nothing in the recipe imports this module.
"""

from verl.tools.function_tool import function_tool


@function_tool
def sort_letters(letters: str) -> str:
    """Sort letters alphabetically, duplicates kept.

    Args:
        letters: The letters to sort, e.g. "dbeca".
    """
    return "".join(sorted(letters))
