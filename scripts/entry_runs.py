"""One run of the recipe's entry point from a script, and its per-step metrics.

The benchmark and measurement scripts (``bench_partial_rollout.py``, ``partial_rollout_learning.py``)
launch ``python -m recipe.one_step_off_async.main_ppo`` in a folder of their own, log its metrics with
verl's ``file`` logger, keep its output in ``output.log`` and read the metrics back by step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_entry_point(directory: Path, config_name: str, overrides: list[str], label: str) -> dict[int, dict]:
    """Run the entry point with ``overrides`` in a new ``directory``; return its metrics by step.

    Exits the script naming ``label`` and the log when the run fails.
    """
    directory.mkdir(parents=True)
    metrics = directory / "metrics.jsonl"
    command = [
        sys.executable,
        "-m",
        "recipe.one_step_off_async.main_ppo",
        f"--config-name={config_name}",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={directory / 'checkpoints'}",
        *overrides,
    ]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics)}
    result = subprocess.run(
        command, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    (directory / "output.log").write_text(result.stdout)
    if result.returncode != 0:
        sys.exit(f"{label} failed (exit {result.returncode}); see {directory / 'output.log'}")
    by_step: dict[int, dict] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step
