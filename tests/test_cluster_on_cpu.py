"""The cluster a launch runs on (``recipe.one_step_off_async.cluster``): what it drops from ``ray_init`` when it joins a
running cluster, what it sends every node, and the shared folders it refuses on storage one node sees. The launch onto
a real multi-node cluster is in ``test_e2e_elastic_on_cpu.py``."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from recipe.one_step_off_async import cluster
from recipe.one_step_off_async.cluster import RECIPE_PACKAGE, node_local_problem, prepare_ray_init


def compose_profile(name: str, *overrides: str):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.fixture
def no_cluster_here(monkeypatch, tmp_path):
    """No RAY_ADDRESS and no address left by `ray start` (Ray's temp dir is an empty folder)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))


@pytest.mark.parametrize("profile", ["one_step_off_ppo_cpu", "one_step_off_ppo_trainer"])
def test_joining_a_running_cluster_drops_the_keys_ray_refuses_with_a_notice_and_ships_the_recipe(
    profile, monkeypatch, capsys, no_cluster_here
):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", "/shared/metrics.jsonl")
    for own in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "VLLM_API_KEY"):  # each node's own, and a secret: not sent
        monkeypatch.setenv(own, "x")
    config = compose_profile(
        profile,
        "+ray_kwargs.ray_init.num_gpus=2",
        "+ray_kwargs.ray_init.resources={}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.GLOO_SOCKET_IFNAME=eth1",  # set for every node by the user: kept
        "+ray_kwargs.ray_init.runtime_env.py_modules=[/shared/reward_fns]",
    )

    assert prepare_ray_init(config).problems == []

    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init)
    assert [ray_init.get(key) for key in cluster.SIZING_KEYS] == [None] * len(cluster.SIZING_KEYS)
    notices = capsys.readouterr().err.splitlines()
    joins = "dropped: the launch joins the running Ray cluster at 10.0.0.9:6379, whose nodes declare their own"
    assert all(joins in line for line in notices), notices
    assert any(line.startswith("[launch] ray_kwargs.ray_init.num_gpus=2 dropped") for line in notices)
    assert any(line.endswith("(ray start --resources).") and "resources={}" in line for line in notices)
    assert ray_init["runtime_env"]["py_modules"] == ["/shared/reward_fns", str(RECIPE_PACKAGE)]
    env_vars = ray_init["runtime_env"]["env_vars"]
    assert env_vars["VERL_FILE_LOGGER_PATH"] == "/shared/metrics.jsonl" and env_vars["GLOO_SOCKET_IFNAME"] == "eth1"
    assert not {"VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "VLLM_API_KEY"} & set(env_vars)


def test_a_cluster_the_launch_starts_is_left_as_the_profile_sets_it(monkeypatch, capsys, no_cluster_here):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", "/tmp/metrics.jsonl")  # its workers inherit the launch's environment
    config = compose_profile("one_step_off_ppo_cpu")
    before = OmegaConf.to_container(config.ray_kwargs.ray_init)
    assert prepare_ray_init(config).problems == []
    assert OmegaConf.to_container(config.ray_kwargs.ray_init) == before
    assert capsys.readouterr().err == ""


def test_under_ray_job_submit_the_jobs_runtime_env_is_left_to_ray(monkeypatch, no_cluster_here):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"env_vars": {"VERL_FILE_LOGGER_PATH": "/m"}}}')
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", "/m")
    config = compose_profile("one_step_off_ppo_cpu")
    assert prepare_ray_init(config).problems == []
    assert config.ray_kwargs.ray_init.num_cpus is None  # still sized by the cluster
    assert "py_modules" not in config.ray_kwargs.ray_init.runtime_env
    assert "VERL_FILE_LOGGER_PATH" not in (config.ray_kwargs.ray_init.runtime_env.get("env_vars") or {})


def test_one_gpu_onto_a_running_cluster_is_refused(monkeypatch, no_cluster_here):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    (problem,) = prepare_ray_init(compose_profile("one_step_off_ppo_1gpu")).problems
    assert problem.startswith("async_training.one_gpu=true shares one GPU") and "Unset RAY_ADDRESS" in problem


def test_code_a_runtime_env_already_ships_is_not_replaced(monkeypatch, no_cluster_here):
    config = compose_profile("one_step_off_ppo_cpu", "+ray_kwargs.ray_init.address=10.0.0.9:6379")
    with open_dict(config):
        config.ray_kwargs.ray_init.runtime_env.working_dir = "/shared/code"
    prepare_ray_init(config)
    assert "py_modules" not in config.ray_kwargs.ray_init.runtime_env


def test_address_auto_with_no_cluster_to_join_is_a_launch_problem(monkeypatch, no_cluster_here):
    monkeypatch.setattr("ray._private.services.find_gcs_addresses", lambda: [])
    config = compose_profile("one_step_off_ppo_cpu", "+ray_kwargs.ray_init.address=auto")
    (problem,) = prepare_ray_init(config).problems
    assert problem.startswith("ray_kwargs.ray_init.address='auto'")
    assert "ray start --head" in problem


def test_shared_folders_on_storage_one_node_sees_are_refused_once_the_cluster_spans_hosts(tmp_path):
    config = compose_profile(
        "one_step_off_ppo_cpu",
        "data.train_files=/dev/shm/train.parquet",
        f"data.val_files=[{tmp_path}/val.parquet,gs://bucket/val.parquet]",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=checkpoint",
    )
    assert node_local_problem(config, {"10.0.0.1"}) is None  # one host: every process sees its /dev/shm
    problem = node_local_problem(config, {"10.0.0.1", "10.0.0.2"})
    assert problem.startswith("The Ray cluster spans 2 hosts (10.0.0.1, 10.0.0.2)")
    assert "data.train_files=/dev/shm/train.parquet (tmpfs)" in problem
    assert "data.val_files" not in problem
    assert "checkpoint_engine.engine_kwargs.checkpoint.dir unset (a fresh folder under /dev/shm)" in problem
