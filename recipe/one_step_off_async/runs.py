"""One launch of the entry point in a folder of its own, and the metrics it logged, read back by step.

``run(directory, *overrides, profile=...)`` launches the entry point in ``directory``, where verl's ``file``
logger writes ``metrics.jsonl``, its checkpoints go to ``checkpoints/`` and its console output to ``output.log``.
The demo, the end-to-end tests and every benchmark launch the entry point and read its metrics this one way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from recipe.one_step_off_async.errors import RunFailed

ENTRY_MODULE = "recipe.one_step_off_async.main_ppo"
METRICS = "metrics.jsonl"
OUTPUT = "output.log"
ROLLOUTS = "rollouts"  # where ``dump_rollouts`` has verl write the batches a run trained on
POLL_S = 0.2  # how often ``Launch.wait`` looks at a run it watches


def read_metrics(path: Path) -> dict[int, dict]:
    """What verl's ``file`` logger wrote (one JSON line per log call; a step may have several), merged by step; {}
    when there is no file."""
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step


def dump_rollouts(directory: Path) -> str:
    """The override that dumps every trained batch into ``directory`` (``Run.prompts``, ``Run.responses``)."""
    return f"trainer.rollout_data_dir={directory / ROLLOUTS}"


@dataclass
class Run:
    """A finished launch: its exit code, seconds from start to exit, its folder and its console output."""

    returncode: int
    seconds: float
    directory: Path
    output: str
    command: tuple[str, ...] = ()

    @property
    def metrics(self) -> dict[int, dict]:
        return read_metrics(self.directory / METRICS)

    def validation(self, key: str) -> dict[int, float]:
        """The validation metric ``key`` by step, for the steps that validated."""
        return {step: values[key] for step, values in self.metrics.items() if key in values}

    def dumped(self, step: int, folder: str = ROLLOUTS) -> list[dict]:
        """The rows verl dumped for ``step`` into ``folder`` of the run's directory (``trainer.rollout_data_dir``
        or ``trainer.validation_data_dir``), in batch order."""
        lines = (self.directory / folder / f"{step}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def prompts(self, step: int) -> list[str]:
        """The prompts trained at ``step``, in batch order (one per sample)."""
        return [row["input"] for row in self.dumped(step)]

    def responses(self, step: int) -> list[str]:
        """The responses trained at ``step``, as verl dumps them (special tokens skipped), in batch order."""
        return [row["output"] for row in self.dumped(step)]

    def check(self, label: str) -> Run:
        """This run, if it succeeded; else ``RunFailed`` naming ``label``, the command and the end of its log."""
        if self.returncode != 0:
            tail = "\n".join(self.output.splitlines()[-40:])
            raise RunFailed(
                f"{label} failed with exit code {self.returncode}:\n  {shlex.join(self.command)}\n"
                f"last lines of {self.directory / OUTPUT}:\n{tail}"
            )
        return self


@dataclass
class Launch:
    """A launch of the entry point that is still running."""

    process: subprocess.Popen
    directory: Path
    command: tuple[str, ...]
    started: float

    def wait(self, timeout_s: float | None = None, while_running: Callable[[], None] | None = None) -> Run:
        """The run once it exited. Past ``timeout_s`` (from the start) it is killed with every process it started
        and ``subprocess.TimeoutExpired`` is raised; ``while_running`` is called every ``POLL_S`` until it exits."""
        while self.process.poll() is None:
            if timeout_s is not None and time.monotonic() - self.started >= timeout_s:
                self.kill()
                raise subprocess.TimeoutExpired(list(self.command), timeout_s, output=self.output())
            if while_running:
                while_running()
            time.sleep(POLL_S)
        return Run(
            self.process.returncode, time.monotonic() - self.started, self.directory, self.output(), self.command
        )

    def output(self) -> str:
        return (self.directory / OUTPUT).read_text(errors="replace")

    def kill(self) -> None:
        """Kill the driver and every process it started (Ray's daemons and workers outlive a killed driver)."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        self.process.kill()
        self.process.wait()


def command(
    directory: Path,
    overrides: tuple[str, ...],
    profile: str | None,
    checkpoints: Path | None = None,
    module: str = ENTRY_MODULE,
) -> tuple[str, ...]:
    """The command line of a launch in ``directory``: ``module`` with the profile (None: the module's own default
    config), the ``file`` logger on, checkpoints in ``checkpoints`` (default: the folder's), then ``overrides``."""
    return (
        sys.executable,
        "-m",
        module,
        *([f"--config-name={profile}"] if profile else []),
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={checkpoints or directory / 'checkpoints'}",
        *overrides,
    )


def start(
    directory: Path,
    *overrides: str,
    profile: str | None,
    checkpoints: Path | None = None,
    env: dict[str, str] | None = None,
    module: str = ENTRY_MODULE,
) -> Launch:
    """Launch ``module`` in ``directory`` (made if missing) with ``overrides``; ``env`` adds to this process's."""
    directory.mkdir(parents=True, exist_ok=True)
    line = command(directory, overrides, profile, checkpoints, module)
    environment = {**os.environ, "VERL_FILE_LOGGER_PATH": str(directory / METRICS), **(env or {})}
    # Output to a file: a pipe nobody reads until the end would fill up and block the run.
    with (directory / OUTPUT).open("w") as log:
        process = subprocess.Popen(line, cwd=directory, env=environment, stdout=log, stderr=subprocess.STDOUT)
    return Launch(process, directory, line, time.monotonic())


def run(directory: Path, *overrides: str, timeout_s: float | None = None, **launch: Any) -> Run:
    """``start(directory, *overrides, **launch)``, then wait for the run to exit (``Launch.wait``)."""
    return start(directory, *overrides, **launch).wait(timeout_s)
