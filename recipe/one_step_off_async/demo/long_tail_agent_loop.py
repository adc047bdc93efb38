"""The long-tail task's agent loop: verl's single-turn loop, generating exactly each problem's budget.

Registered with verl's agent-loop registry by the YAML that the demo asset build writes
(``long_tail.write_agent_loop_config``); the rows of the long-tail dataset name it (``agent_name``).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop


class BudgetedAgentLoop(SingleTurnAgentLoop):
    """``max_tokens`` = the row's ``extra_info.response_budget``, ``ignore_eos`` on: the response is that long."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        budget = int(kwargs["extra_info"]["response_budget"])
        return await super().run({**sampling_params, "max_tokens": budget, "ignore_eos": True}, **kwargs)
