"""The long-tail tasks' agent loop: verl's single-turn loop, generating exactly each sample's budget.

Registered with verl's agent-loop registry by the YAML that the demo asset build writes
(``long_tail.write_agent_loop_config``); the rows of the long-tail datasets name it (``agent_name``).
"""

from __future__ import annotations

import random
from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from recipe.one_step_off_async.demo.long_tail import sample_budget

# One stream per agent-loop worker process: the same budgets, in arrival order, in every run.
_SAMPLE_BUDGETS = random.Random(0)


class BudgetedAgentLoop(SingleTurnAgentLoop):
    """``max_tokens`` = the sample's budget, ``ignore_eos`` on: the response is that long.

    The budget goes back in the output's extra fields: verl's reward manager merges them into the
    reward's ``extra_info``, so the reward scores a drawn budget, not its problem's.
    """

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        budget = sample_budget(kwargs["extra_info"], _SAMPLE_BUDGETS)
        output = await super().run({**sampling_params, "max_tokens": budget, "ignore_eos": True}, **kwargs)
        output.extra_fields["response_budget"] = budget
        return output
