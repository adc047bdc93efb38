"""What a launch sets up before Ray starts (``launch.prepare_config``, ``verl_plugin``): backends found by their
registered names in every worker, and every problem reported at once, as one list."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from e2e import main_until_ray
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.errors import ConfigError, LaunchProblems
from recipe.one_step_off_async.launch import check_command_line, prepare_config, problems_reported
from recipe.one_step_off_async.trainer.agent_loops import OneStepOffAgentLoopManager


def compose_cpu(*overrides: str):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(config_name="one_step_off_ppo_cpu", overrides=list(overrides))


PROBE = """
import json, verl
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.trainer.ppo.core_algos import get_policy_loss_fn
print(json.dumps({
    "gloo": CheckpointEngineRegistry.get("gloo").__module__,
    "checkpoint": CheckpointEngineRegistry.get("checkpoint").__module__,
    "topr": get_policy_loss_fn("topr").__module__,
}))
"""


def test_a_worker_importing_verl_finds_every_recipe_backend_by_its_registered_name():
    """What every Ray worker does: ``import verl`` with the env of a CPU launch, nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    env.update(verl_plugin.worker_env(compose_cpu()))
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "gloo": "recipe.one_step_off_async.weight_sync.gloo",
        "checkpoint": "recipe.one_step_off_async.weight_sync.files",
        "topr": "recipe.one_step_off_async.losses",
    }


class OwnAgentLoopManager(OneStepOffAgentLoopManager):
    """A user's manager that extends the recipe's."""


@pytest.mark.usefixtures("demo_assets")
def test_an_agent_loop_or_sync_manager_the_trainer_would_not_run_fails_the_launch_before_ray_starts():
    agent_loops = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
    verls = "verl.experimental.agent_loop.AgentLoopManager"
    with pytest.raises(LaunchProblems, match=re.escape(f"{agent_loops}={verls} is not a subclass of")):
        prepare_config(compose_cpu(f"+{agent_loops}={verls}"))
    prepare_config(compose_cpu(f"+{agent_loops}={__name__}.{OwnAgentLoopManager.__name__}"))
    syncs = "actor_rollout_ref.rollout.checkpoint_manager_class"
    verls = "verl.checkpoint_engine.base.CheckpointEngineManager"
    with pytest.raises(LaunchProblems, match=re.escape(f"{syncs}={verls} is not a subclass of")):
        prepare_config(compose_cpu(f"{syncs}={verls}"))


@pytest.mark.usefixtures("demo_assets")
def test_lora_rank_alone_passes_the_launch_check_and_unmerged_lora_is_refused_with_its_fix():
    """A rule with one valid value is a default of the recipe's configs (lora.merge=true), not a refusal."""
    prepare_config(compose_cpu("actor_rollout_ref.model.lora_rank=8"))
    key = "actor_rollout_ref.model.lora.merge"
    with pytest.raises(LaunchProblems, match=re.escape(f"lora_rank=8 with {key}=False: ") + f".*Set {key}=true"):
        prepare_config(compose_cpu("actor_rollout_ref.model.lora_rank=8", f"{key}=false"))


def test_empty_dataset_fails_the_launch_before_ray_starts(tmp_path, demo_assets):
    empty = tmp_path / "empty.parquet"
    pd.read_parquet(demo_assets.train_file).iloc[:0].to_parquet(empty)
    with pytest.raises(ConfigError, match=re.escape(f"data.train_files: {empty} hold no rows")):
        main_until_ray(f"data.train_files={empty}")


# Modules the plugin imports that import verl themselves: in a worker, importing one of them first starts
# ``import verl``, which imports the plugin while that module is still half imported.
IMPORTED_BY_THE_PLUGIN = ("losses", "platforms.cpu", "weight_sync.common", "weight_sync.gloo", "weight_sync.files")


def test_any_recipe_module_imported_first_in_a_worker_survives_the_plugin_import_cycle():
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    env.update(verl_plugin.worker_env(compose_cpu()))
    script = "import recipe.one_step_off_async.{}; from verl.plugin.platform import get_platform; print(get_platform())"
    probes = {
        module: subprocess.Popen(
            [sys.executable, "-c", script.format(module)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for module in IMPORTED_BY_THE_PLUGIN
    }
    for module, probe in probes.items():
        out, err = probe.communicate(timeout=300)
        assert probe.returncode == 0, f"importing {module} first: {err.decode()[-2000:]}"
        assert b"PlatformCPU" in out, module


def test_launch_problems_print_as_one_list_without_a_traceback_unless_hydra_full_error(monkeypatch, capsys):
    problems = LaunchProblems(["a.b=1: bad. Set a.b=2.", "c: missing on this machine."], ["verl's own validation"])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exited, problems_reported():
        raise problems
    assert exited.value.code == 1 and exited.value.__cause__ is None and exited.value.__suppress_context__
    assert capsys.readouterr().err.splitlines() == [
        "The launch has 2 problems; nothing was started:",
        "  1. a.b=1: bad. Set a.b=2.",
        "  2. c: missing on this machine.",
        "Not checked yet (they run once the problems above are fixed):",
        "  - verl's own validation",
        "Set HYDRA_FULL_ERROR=1 to see the traceback.",
    ]
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(LaunchProblems), problems_reported():
        raise problems


def test_a_command_line_hydra_cannot_compose_reports_its_config_name(monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit):
        check_command_line(["--config-name=one_step_off_ppo_gpu", "trainer.nnodes=1"], "one_step_off_ppo_trainer")
    assert "  1. --config-name=one_step_off_ppo_gpu: no such config. The recipe's are one_step_off_ppo_1gpu, " in (
        capsys.readouterr().err
    )
    # Hydra's own flags and a composable command line are left to hydra.main.
    assert check_command_line(["--cfg", "job", "trainer.foo=1"], "one_step_off_ppo_trainer") is None
    assert check_command_line(["-cn", "one_step_off_ppo_cpu", "trainer.nnodes=1"], "one_step_off_ppo_trainer") is None


def test_a_refused_override_joins_the_other_problems_and_the_rest_resolves_as_under_hydra_main(
    monkeypatch, capsys, demo_assets
):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    OmegaConf.clear_resolver("demo_asset")  # as in a fresh process: the profile's Hydra callback registers it
    with pytest.raises(SystemExit):
        check_command_line(
            [
                "-cn",
                "one_step_off_ppo_cpu",
                "model_engine=megatrn",  # a misspelt config group option
                "trainer.experiment_name='lr=1e-6'",  # '=' in a quoted value: fine
                "trainer.default_local_dir=${hydra:runtime.output_dir}/checkpoints",  # resolves as under hydra.main
                "async_training.staleness=-1",
            ],
            "one_step_off_ppo_trainer",
        )
    report = capsys.readouterr().err
    problems = re.findall(r"^  \d+\. (.*)$", report, flags=re.MULTILINE)
    assert len(problems) == 2, report
    assert problems[0] == (
        "model_engine=megatrn: In 'ppo_trainer': Could not find 'model_engine/megatrn' Available options in "
        "'model_engine': dp megatron torchtitan veomni"
    )
    assert problems[1].startswith("async_training.staleness=-1 must be an integer >= 0")
    assert "  - what depends on the refused override above" in report
