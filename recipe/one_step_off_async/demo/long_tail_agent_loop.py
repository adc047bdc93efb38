"""The long-tail tasks' agent loop: verl's single-turn loop, generating exactly each sample's budget.

Registered with verl's agent-loop registry by the YAML that the demo asset build writes
(``long_tail.write_agent_loop_config``); the rows of the long-tail datasets name it (``agent_name``).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from recipe.one_step_off_async.demo.long_tail import SAMPLE_BUDGET_KEY, SampleBudgets

# verl instantiates the loop once per sample: the draws of this agent-loop worker process live here.
_BUDGETS = SampleBudgets()


class BudgetedAgentLoop(SingleTurnAgentLoop):
    """``max_tokens`` = the sample's budget, ``ignore_eos`` on: the response is that long. The budget goes back in
    the output's ``extras``, which verl's reward manager merges into the reward's ``extra_info``."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        budget = _BUDGETS.draw(kwargs["extra_info"])
        output = await super().run({**sampling_params, "max_tokens": budget, "ignore_eos": True}, **kwargs)
        output.extra_fields["extras"] = {SAMPLE_BUDGET_KEY: budget}
        return output
