"""``runs``: what a launch of the entry point is given, how its metrics are read back, and that a launch past its
timeout goes with every process it started.

The launches here run a stand-in module (``module=``) written into the test's folder instead of the entry point:
the plumbing (folder, environment, output, exit code, timeout) without a training run. The entry point itself
runs through ``runs`` in every e2e test (``e2e.run_main``) and in ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import psutil
import pytest

from recipe.one_step_off_async import runs
from recipe.one_step_off_async.errors import RunFailed


def write_module(folder, name: str, body: str) -> dict[str, str]:
    """A module ``name`` in ``folder``, and the environment that lets a launch import it."""
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return {"PYTHONPATH": str(folder)}


def test_metrics_are_merged_by_step_and_a_missing_file_is_empty(tmp_path):
    path = tmp_path / runs.METRICS
    records = [(0, {"val": 0.1}), (1, {"loss": 2.0}), (1, {"val": 0.3}), (2, {"loss": 1.0})]
    path.write_text("".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in records))

    assert runs.read_metrics(path) == {0: {"val": 0.1}, 1: {"loss": 2.0, "val": 0.3}, 2: {"loss": 1.0}}
    assert runs.read_metrics(tmp_path / "none.jsonl") == {}


def test_a_launch_runs_in_its_folder_with_the_file_logger_and_keeps_its_output(tmp_path):
    env = write_module(
        tmp_path,
        "stand_in",
        """
        import json, os, sys
        print("argv", json.dumps(sys.argv[1:]))
        with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as log:
            log.write(json.dumps({"step": 1, "data": {"cwd": os.getcwd()}}) + "\\n")
        """,
    )
    folder = tmp_path / "run"

    run = runs.run(folder, "a=1", profile="some_profile", env=env, module="stand_in")

    assert run.check("the stand-in") is run and run.returncode == 0
    assert run.metrics == {1: {"cwd": str(folder)}}
    argv = json.loads(run.output.split("argv ", 1)[1])
    assert argv == [
        "--config-name=some_profile",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={folder / 'checkpoints'}",
        "a=1",
    ]
    assert (folder / runs.OUTPUT).read_text() == run.output


def test_a_failed_launch_is_named_with_its_command_and_the_end_of_its_log(tmp_path):
    env = write_module(tmp_path, "failing", "raise SystemExit('the reason it failed')\n")

    run = runs.run(tmp_path / "run", profile=None, env=env, module="failing")

    with pytest.raises(RunFailed, match=r"(?s)the stand-in failed with exit code 1:.*-m failing.*the reason it failed"):
        run.check("the stand-in")


def test_a_launch_past_its_timeout_is_killed_with_every_process_it_started(tmp_path):
    env = write_module(
        tmp_path,
        "hanging",
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
        time.sleep(600)
        """,
    )
    launch = runs.start(tmp_path / "run", profile=None, env=env, module="hanging")
    watched = []

    with pytest.raises(subprocess.TimeoutExpired) as expired:
        launch.wait(timeout_s=3, while_running=lambda: watched.append(launch.output()))

    child = int(expired.value.output.split("child ", 1)[1].split()[0])
    assert watched, "while_running was never called"
    assert launch.process.poll() is not None
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the launch's child outlived it"
        time.sleep(0.1)
