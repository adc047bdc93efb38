"""Every shipped config composes and validates; every bad config fails before any worker starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from recipe.one_step_off_async.async_config import (
    AsyncTrainingConfig,
    ConfigError,
    check_data_files,
    validate_config,
)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "recipe" / "one_step_off_async" / "config"
SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
PRIMARY = [name for name in SHIPPED if name != "one_step_off_base"]


def compose_config(name: str, *overrides: str):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def test_the_recipe_ships_a_gpu_and_a_cpu_config():
    assert SHIPPED == ["one_step_off_base", "one_step_off_ppo_cpu", "one_step_off_ppo_trainer"]


@pytest.mark.parametrize("name", PRIMARY)
def test_shipped_config_composes_and_validates(name):
    config = compose_config(name)
    assert validate_config(config) == AsyncTrainingConfig(staleness=1, generation_timeout_s=3600, sync_timeout_s=600)
    assert config.actor_rollout_ref.hybrid_engine is False


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor_rollout_ref.hybrid_engine=true"],
            r"actor_rollout_ref.hybrid_engine=True .* Set actor_rollout_ref.hybrid_engine=False",
        ),
        (["async_training.staleness=-1"], r"async_training.staleness=-1 must be an integer >= 0"),
        (["async_training.staleness=0.5"], r"async_training.staleness=0.5 must be an integer"),
        (["async_training.sync_timeout_s=0"], r"async_training.sync_timeout_s=0 must be a positive"),
        (["+async_training.stalenes=2"], r"Unknown key\(s\) async_training.stalenes"),
        (["actor_rollout_ref.rollout.nnodes=0"], r"actor_rollout_ref.rollout.nnodes=0 leaves the rollout pool empty"),
        (["actor_rollout_ref.rollout.n_gpus_per_node=0"], r"rollout.n_gpus_per_node=0 leaves the rollout pool empty"),
        (["trainer.n_gpus_per_node=0"], r"trainer.n_gpus_per_node=0 leaves the training pool empty"),
        (
            ["trainer.n_gpus_per_node=3"],
            r"train_batch_size x rollout.n = 16 x 4 = 64 samples per step do not divide across the 3 actor ranks",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=5"],
            r"train_batch_size=16 is not a multiple of .*ppo_mini_batch_size=5",
        ),
        (
            ["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
            r"checkpoint_engine.backend='nccl' cannot feed weights to the 'hf' rollout backend; use gloo",
        ),
        (
            ["actor_rollout_ref.rollout.name=vllm"],
            r"checkpoint_engine.backend='gloo' cannot feed weights to the 'vllm'",
        ),
        (
            ["actor_rollout_ref.rollout.name=trtllm"],
            r"rollout.name='trtllm' is not a rollout backend this recipe supports",
        ),
        (["actor_rollout_ref.rollout.mode=sync"], r"rollout.mode='sync'.*Set actor_rollout_ref.rollout.mode=async"),
        (["algorithm.adv_estimator=remax"], r"adv_estimator=remax"),
        (["actor_rollout_ref.rollout.calculate_log_probs=false"], r"calculate_log_probs=False"),
    ],
)
def test_bad_config_names_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(compose_config("one_step_off_ppo_cpu", *overrides))


def test_gpu_backends_on_a_cpu_trainer_are_rejected():
    config = compose_config(
        "one_step_off_ppo_cpu",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    )
    with pytest.raises(ConfigError, match="trainer.device='cpu' with actor_rollout_ref.rollout.name='vllm'"):
        validate_config(config)


def test_entry_point_rejects_a_bad_config_before_ray_starts():
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipe.one_step_off_async.main_ppo",
            "--config-name=one_step_off_ppo_cpu",
            "actor_rollout_ref.hybrid_engine=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "actor_rollout_ref.hybrid_engine=True" in result.stderr
    assert "ray init kwargs" not in result.stdout  # printed by verl's run_ppo just before ray.init
    assert time.monotonic() - started < 60


def test_data_files_are_checked_before_anything_starts(tmp_path, demo_assets):
    good = demo_assets.train_file
    check_data_files(compose_config("one_step_off_ppo_cpu", f"data.train_files={good}", f"data.val_files=[{good}]"))

    missing = tmp_path / "missing.parquet"
    with pytest.raises(ConfigError, match=f"data.train_files: {missing} does not exist"):
        check_data_files(
            compose_config("one_step_off_ppo_cpu", f"data.train_files={missing}", f"data.val_files={good}")
        )
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet")
    with pytest.raises(ConfigError, match=f"data.val_files: {garbage} is not a readable parquet file"):
        check_data_files(
            compose_config("one_step_off_ppo_cpu", f"data.train_files={good}", f"data.val_files={garbage}")
        )
    empty = tmp_path / "empty.parquet"
    pd.read_parquet(good).iloc[:0].to_parquet(empty)
    with pytest.raises(ConfigError, match=f"data.train_files: {empty} hold no rows"):
        check_data_files(compose_config("one_step_off_ppo_cpu", f"data.train_files={empty}", f"data.val_files={good}"))
