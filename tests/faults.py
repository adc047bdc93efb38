"""Fault injection for end-to-end tests: make a real run fail in a chosen place, through verl's own hooks.

Generation fails through a custom agent loop (verl's ``rollout.agent.agent_loop_config_path``
registry) that raises ``InjectedFault`` on its N-th call, so the exception is raised inside the
agent-loop worker exactly where a rollout error would be.
"""

from __future__ import annotations

import os
from pathlib import Path

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

TESTS_DIR = Path(__file__).resolve().parent
FAIL_AT_CALL_ENV = "FAULTS_AGENT_LOOP_FAIL_AT_CALL"


class InjectedFault(RuntimeError):
    """Raised by a fault the test asked for."""


class FailingAgentLoop(SingleTurnAgentLoop):
    """The single-turn agent loop, except that its N-th call in a worker process raises."""

    calls = 0

    async def run(self, sampling_params, **kwargs):
        FailingAgentLoop.calls += 1
        if FailingAgentLoop.calls == int(os.environ[FAIL_AT_CALL_ENV]):
            raise InjectedFault(f"generation failed on agent-loop call {FailingAgentLoop.calls}")
        return await super().run(sampling_params, **kwargs)


def failing_generation(directory: Path, fail_at_call: int) -> tuple[list[str], dict[str, str]]:
    """Overrides and env for a run whose generation raises on agent-loop call ``fail_at_call``."""
    config = directory / "failing_agent_loop.yaml"
    config.write_text(f"- name: failing_agent\n  _target_: {__name__}.FailingAgentLoop\n")
    overrides = [
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=failing_agent",
    ]
    env = {
        FAIL_AT_CALL_ENV: str(fail_at_call),
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    return overrides, env
