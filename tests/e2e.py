"""Run the real entry point (``python -m recipe.one_step_off_async.main_ppo``) on CPU and read what it logged.

Each run gets its own directory: the metrics (verl's ``file`` logger, one JSON line per step),
the rollout dumps (``trainer.rollout_data_dir``: the prompts trained at each step), checkpoints
and the console output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ENTRY = [sys.executable, "-m", "recipe.one_step_off_async.main_ppo", "--config-name=one_step_off_ppo_cpu"]


@dataclass
class Run:
    returncode: int
    seconds: float
    directory: Path
    output: str

    @property
    def metrics(self) -> dict[int, dict]:
        """Training-step metrics by step (validation-only lines at step 0 are merged in)."""
        merged: dict[int, dict] = {}
        path = self.directory / "metrics.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            record = json.loads(line)
            merged.setdefault(record["step"], {}).update(record["data"])
        return merged

    def validation(self, key: str) -> dict[int, float]:
        """The validation metric ``key`` by step, for the steps that validated."""
        return {step: values[key] for step, values in self.metrics.items() if key in values}

    def prompts(self, step: int) -> list[str]:
        """The prompts trained at ``step``, in batch order (one per sample)."""
        lines = (self.directory / "rollouts" / f"{step}.jsonl").read_text().splitlines()
        return [json.loads(line)["input"] for line in lines]


def run_main(
    directory: Path, *overrides: str, checkpoints: Path | None = None, timeout_s: float = 600, env: dict | None = None
) -> Run:
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        *ENTRY,
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={checkpoints or directory / 'checkpoints'}",
        f"trainer.rollout_data_dir={directory / 'rollouts'}",
        *overrides,
    ]
    started = time.monotonic()
    result = subprocess.run(
        command,
        cwd=directory,
        env={**os.environ, "VERL_FILE_LOGGER_PATH": str(directory / "metrics.jsonl"), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )
    (directory / "output.log").write_text(result.stdout)
    return Run(result.returncode, time.monotonic() - started, directory, result.stdout)
