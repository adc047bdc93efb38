"""Fault injection for end-to-end tests of the real entry point: reusable by any future feature's tests.

Two kinds of faults:

- **In-process**, through verl's own extension points: a custom agent loop
  (``rollout.agent.agent_loop_config_path``) that kills a rollout replica (``ray.kill``, while the
  calls before it are still generating) on its N-th call, a tool agent loop that kills the replica of
  a conversation between its turns (``failing_conversation``, which also reports when the replica's vLLM
  engine process ended), and custom reward functions
  (``reward.custom_reward_function``) with a given body (one that raises, say).
- **From outside**, on a run started with ``start_main``: every process of the run (the driver,
  Ray's daemons, every worker) carries a marker in its environment, so a test can find a worker
  by its Ray process title (``ray::vLLMHttpServer``, ``ray::WorkerDict``...), kill or stop it at a
  chosen moment (e.g. once step k's metrics are logged), interrupt the driver, and afterwards
  list whatever the run left behind.

Faults whose whole effect is on the driver's side (a generation error, a validation or weight sync
that never returns, a NaN reward) are injected into the real trainer with stub workers instead
(``stub_trainer.py``): no launch needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import ray
from e2e import CPU_PROFILE, LEAN_RAY, LEAN_RAY_ENV, WHOLE_BATCHES
from ray_cluster import runtime_env_overrides
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from recipe.one_step_off_async import runs
from recipe.one_step_off_async.demo.long_tail import AGENT_LOOP_NAME
from recipe.one_step_off_async.demo.long_tail_agent_loop import BudgetedAgentLoop
from recipe.one_step_off_async.demo.tool_task import AGENT_LOOP_NAME as TOOL_AGENT_LOOP_NAME
from recipe.one_step_off_async.elastic.client import SERVED_BY
from recipe.one_step_off_async.runs import read_metrics
from recipe.one_step_off_async.trainer.agent_loops import VersionedToolAgentLoop

TESTS_DIR = Path(__file__).resolve().parent
KILL_REPLICA_AT_CALL_ENV = "FAULTS_AGENT_LOOP_KILL_REPLICA_AT_CALL"
KILL_REPLICA_NODE_ENV = "FAULTS_AGENT_LOOP_KILL_REPLICA_NODE_REPORT"
KILL_NODE_WHEN_ASKED_ENV = "FAULTS_AGENT_LOOP_KILL_NODE_NAMED_IN"  # a file the test writes a node id to
KILL_AT_TOOL_CALL_ENV = "FAULTS_TOOL_AGENT_LOOP_KILL_REPLICA_AT_TOOL_CALL"
KILLED_CONVERSATION_ENV = "FAULTS_KILLED_CONVERSATION_FILE"
RUN_MARKER_ENV = "FAULTS_RUN_MARKER"

ROLLOUT_SERVER = "ray::vLLMHttpServer"  # verl's vLLM server actor, one per replica
VLLM_ENGINE = "VLLM::EngineCore"  # vLLM's engine process, below verl's server actor
WEIGHT_RECEIVER = "ray::CheckpointEngineWorker"  # verl's weight receiver beside each replica's server
ACTOR_WORKER = "ray::WorkerDict"


# --- in-process faults ---------------------------------------------------------------------------


ROLLOUT_ACTORS = ("vLLMHttpServer", "CheckpointEngineWorker")  # what a replica's node runs of the job


async def _kill_a_replica_on_call(agent_loop) -> None:
    """On this worker process's N-th agent-loop call, kill the replica the load balancer would pick next (with
    ``KILL_REPLICA_NODE_ENV``, a node that runs a replica and nothing else of the job)."""
    _calls[0] += 1
    asked = Path(os.environ.get(KILL_NODE_WHEN_ASKED_ENV, "/nonexistent"))
    if asked.exists() and not _calls[1]:  # the test asked for a node to be lost, during a generation
        _calls[1] = 1
        _kill_node(asked.read_text().strip())
    if _calls[0] == int(os.environ.get(KILL_REPLICA_AT_CALL_ENV, 0)):
        if KILL_REPLICA_NODE_ENV in os.environ:
            _kill_a_rollout_node(Path(os.environ[KILL_REPLICA_NODE_ENV]))
            return
        server_id, server = await agent_loop.server_manager._acquire_server(f"fault-{uuid.uuid4().hex}")
        agent_loop.server_manager._release_server(server_id)
        ray.kill(server)  # its process is killed, as by the OOM killer: requests on it die with it


def _kill_a_rollout_node(report: Path) -> None:
    """Kill every process of a node that runs a replica and nothing else of the job (as a rollout node of a real
    cluster: verl places its load balancer, agent-loop and reward-loop workers on any node), at once, as a machine
    that is lost; first write to ``report`` that node and the node of every live actor of the cluster, by class."""
    actors = [
        (actor["ActorClassName"].rsplit(".", 1)[-1], actor["Address"]["NodeID"])
        for actor in ray._private.state.actors().values()
        if actor["State"] == "ALIVE"
    ]
    replica_nodes = sorted({node for name, node in actors if name == ROLLOUT_ACTORS[0]})
    node = next(n for n in replica_nodes if all(name in ROLLOUT_ACTORS for name, at in actors if at == n))
    report.write_text(json.dumps({"killed_node": node, "actors": actors}))
    _kill_node(node)


def _kill_node(node: str) -> None:
    """Kill every process of the node at once, as a machine that is lost."""
    (raylet,) = (
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "raylet" and f"--node_id={node}" in (p.info["cmdline"] or [])
    )
    for process in [raylet, *raylet.children(recursive=True)]:  # the node's daemons, workers and their children
        with contextlib.suppress(psutil.Error):
            process.kill()


_calls = [0, 0]  # agent-loop calls in this process; whether the asked-for node was killed


class FailingAgentLoop(SingleTurnAgentLoop):
    """The single-turn agent loop, except that its N-th call in a worker process first kills a rollout
    replica (the one the load balancer would pick next) while the calls before it are still generating."""

    async def run(self, sampling_params, **kwargs):
        await _kill_a_replica_on_call(self)
        return await super().run(sampling_params, **kwargs)


class FailingBudgetedAgentLoop(BudgetedAgentLoop):
    """The long-tail task's agent loop with the same fault: long samples are mid-generation when it strikes."""

    async def run(self, sampling_params, **kwargs):
        await _kill_a_replica_on_call(self)
        return await super().run(sampling_params, **kwargs)


_tool_calls = [0, 0]  # agent-loop calls in this process; whether the asked-for node was killed


class FailingToolAgentLoop(VersionedToolAgentLoop):
    """The recipe's tool agent loop, except that the N-th tool call in a worker process first kills the
    replica serving that conversation (the one its turns stick to): the next turn goes to a dead replica.
    When that conversation ends, what it became is written as JSON to ``KILLED_CONVERSATION_ENV``'s file."""

    killed_replica: str | None = None

    async def _handle_processing_tools_state(self, agent_data):
        _tool_calls[0] += 1
        if _tool_calls[0] == int(os.environ.get(KILL_AT_TOOL_CALL_ENV, 0)):
            server_id, server = await self.server_manager._acquire_server(agent_data.request_id)
            self.server_manager._release_server(server_id)
            engines = await server.__ray_call__.remote(_engine_pids)
            ray.kill(server)  # as the recipe drops a silent replica (trainer/engine_health.py)
            self.killed_replica = server_id
            report = Path(os.environ[KILLED_CONVERSATION_ENV]).with_suffix(".engines.json")
            threading.Thread(target=_report_when_gone, args=(engines, report), daemon=True).start()
        return await super()._handle_processing_tools_state(agent_data)

    async def run(self, sampling_params, **kwargs):
        output = await super().run(sampling_params, **kwargs)
        if self.killed_replica is not None:
            record = {
                "killed_replica": self.killed_replica,
                "turn_replicas": [turn.extra_fields.get(SERVED_BY) for turn in self._recorder.turns],
                "prompt": self.tokenizer.decode(output.prompt_ids),
                "response": self.tokenizer.decode(output.response_ids),
                "response_mask": output.response_mask,
                "turns": len(self._recorder.turns),
                "extra_fields": {key: value for key, value in output.extra_fields.items() if key != "turn_scores"},
            }
            Path(os.environ[KILLED_CONVERSATION_ENV]).write_text(json.dumps(record, default=str))
        return output


def _engine_pids(server) -> list[int]:
    """Run inside a replica's server actor: the pids of its vLLM engine processes."""
    return [child.pid for child in psutil.Process().children(recursive=True) if child.name() == VLLM_ENGINE]


def _report_when_gone(pids: list[int], report: Path, wait_s: float = 60) -> None:
    """Write to ``report`` the engine ``pids`` and how long after now the last of them ended (or which still run
    ``wait_s`` later)."""
    began = time.monotonic()
    while (alive := [pid for pid in pids if process_running(pid)]) and time.monotonic() - began < wait_s:
        time.sleep(0.2)
    report.write_text(json.dumps({"engines": pids, "alive": alive, "ended_within_s": time.monotonic() - began}))


def process_running(pid: int) -> bool:
    """Whether the process ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def failing_conversation(directory: Path, kill_at_tool_call: int) -> tuple[list[str], dict[str, str]]:
    """Overrides and env for a run whose N-th tool call kills the replica of that conversation, and the
    long-tail task's rows (if any) run their own loop; the conversation is reported to ``killed_conversation``."""
    config = directory / "failing_tool_agent_loop.yaml"
    config.write_text(
        f"- name: {TOOL_AGENT_LOOP_NAME}\n  _target_: {__name__}.FailingToolAgentLoop\n"
        f"- name: {AGENT_LOOP_NAME}\n  _target_: {BudgetedAgentLoop.__module__}.BudgetedAgentLoop\n"
    )
    env = {
        KILL_AT_TOOL_CALL_ENV: str(kill_at_tool_call),
        KILLED_CONVERSATION_ENV: str(directory / "killed_conversation.json"),
        **_tests_on_python_path(),
    }
    return [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config}"], env


def killed_conversation(directory: Path) -> dict:
    """What ``FailingToolAgentLoop`` reported of the conversation whose replica it killed, with ``engines``: the
    replica's vLLM engine processes, which ones still ran 60 s after the kill and when the last one ended."""
    engines = json.loads((directory / "killed_conversation.engines.json").read_text())
    return {**json.loads((directory / "killed_conversation.json").read_text()), "engines": engines}


def failing_generation(
    directory: Path, kill_replica_at_call: int, long_tail: bool = False, kill_node: bool = False
) -> tuple[list[str], dict[str, str]]:
    """Overrides and env for a run whose generation kills a rollout replica on agent-loop call N.

    ``long_tail``: the run is on the long-tail task, whose rows name their agent loop; the fault takes its name.
    ``kill_node``: it kills a replica's node instead (on a multi-node cluster), reported to ``killed_node``.
    """
    config = directory / "failing_agent_loop.yaml"
    if long_tail:
        config.write_text(f"- name: {AGENT_LOOP_NAME}\n  _target_: {__name__}.FailingBudgetedAgentLoop\n")
        overrides = [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config}"]
    else:
        config.write_text(f"- name: failing_agent\n  _target_: {__name__}.FailingAgentLoop\n")
        overrides = [
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={config}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=failing_agent",
        ]
    env = {KILL_REPLICA_AT_CALL_ENV: str(kill_replica_at_call), **_tests_on_python_path()}
    if kill_node:
        env[KILL_REPLICA_NODE_ENV] = str(directory / "killed_node.json")
    return overrides, env


def node_lost_on_request(directory: Path) -> tuple[list[str], dict[str, str], Path]:
    """Overrides and env for a run whose agent loop kills the node whose id the test writes to the returned file, at
    its next call: a node lost while a batch is generated (never during a weight sync, which waits for generation)."""
    overrides, env = failing_generation(directory, kill_replica_at_call=0)
    request = directory / "kill_node"
    return overrides, {**env, KILL_NODE_WHEN_ASKED_ENV: str(request)}, request


def killed_node(directory: Path) -> dict:
    """What ``failing_generation(kill_node=True)`` reported: the node it killed, and each live actor's node then."""
    return json.loads((directory / "killed_node.json").read_text())


def reward_function(directory: Path, body: str) -> list[str]:
    """Overrides pointing ``reward.custom_reward_function`` at ``compute_score`` with the given body."""
    path = directory / "faulty_reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        + "".join(f"    {line}\n" for line in body.splitlines())
    )
    return [f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=compute_score"]


def _tests_on_python_path() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p)}


# --- faults from outside -------------------------------------------------------------------------


@dataclass
class WatchedRun:
    """A run of the entry point started in the background, observable and killable from the test."""

    process: subprocess.Popen
    directory: Path
    marker: str
    started: float = field(default_factory=time.monotonic)

    @property
    def metrics_path(self) -> Path:
        return self.directory / "metrics.jsonl"

    @property
    def metrics(self) -> dict[int, dict]:
        return read_metrics(self.metrics_path)

    def logged_steps(self) -> list[int]:
        if not self.metrics_path.exists():
            return []
        lines = self.metrics_path.read_text().splitlines()
        return [json.loads(line)["step"] for line in lines if line.strip().endswith("}")]

    def wait_for_step(self, step: int, timeout_s: float = 600) -> None:
        """Block until step ``step``'s metrics are logged (the step, its sync and checkpoint are done).

        The timeout only ends a hung run: a vLLM launch can take minutes to its first step on a loaded machine."""
        deadline = time.monotonic() + timeout_s
        while step not in self.logged_steps():
            if self.process.poll() is not None:
                raise AssertionError(f"the run exited ({self.process.returncode}) before logging step {step}")
            if time.monotonic() > deadline:
                raise AssertionError(f"step {step} was not logged within {timeout_s} s")
            time.sleep(0.05)

    def processes(self, title: str | None = None) -> list[psutil.Process]:
        """Live processes of this run, optionally only those whose command line starts with ``title``."""
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(RUN_MARKER_ENV) != self.marker or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if title is None or " ".join(proc.cmdline()).startswith(title):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def wait_for_task(self, title: str, task: str, timeout_s: float = 600) -> None:
        """Block until a worker of ``title`` runs ``task`` (Ray shows the running task in the process title)."""
        deadline = time.monotonic() + timeout_s
        while not any(task in " ".join(p.cmdline()) for p in self.processes(title)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {title} process ran {task} (exit code {self.process.poll()})")
            time.sleep(0.02)

    def signal_worker(self, title: str, sig: signal.Signals) -> psutil.Process:
        (target,) = self.processes(title)
        target.send_signal(sig)
        return target

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the driver, as a terminal does."""
        self.process.send_signal(signal.SIGINT)

    def wait(self, timeout_s: float) -> tuple[int, float, str]:
        """Exit code, seconds since start, and the run's output."""
        self.process.wait(timeout=timeout_s)
        return self.process.returncode, time.monotonic() - self.started, (self.directory / "output.log").read_text()

    def leftovers(self, grace_s: float = 30) -> list[str]:
        """Processes of the run still alive ``grace_s`` after the driver exited (Ray cleans up async)."""
        deadline = time.monotonic() + grace_s
        while (alive := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return [" ".join(p.cmdline())[:120] for p in alive]

    def kill_everything(self) -> None:
        for proc in self.processes():
            proc.kill()


def start_main(directory: Path, *overrides: str, env: dict | None = None) -> WatchedRun:
    """Start the entry point on the CPU profile with metrics, rollout dumps and checkpoints in ``directory``; with
    ``RAY_ADDRESS`` in ``env``, on that running cluster, whose workers get the run's marker through Ray's runtime env."""
    marker = uuid.uuid4().hex
    joins = runtime_env_overrides({RUN_MARKER_ENV: marker}) if "RAY_ADDRESS" in (env or {}) else []
    launch = runs.start(
        directory,
        runs.dump_rollouts(directory),
        *LEAN_RAY,
        WHOLE_BATCHES,
        *joins,
        *overrides,
        profile=CPU_PROFILE,
        env={**LEAN_RAY_ENV, RUN_MARKER_ENV: marker, **(env or {})},
    )
    return WatchedRun(launch.process, directory, marker)
