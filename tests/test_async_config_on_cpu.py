"""Every shipped config composes and validates; every bad config fails before any worker starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from recipe.one_step_off_async.async_config import AsyncTrainingConfig, ElasticConfig, validate_config
from recipe.one_step_off_async.errors import ConfigError
from recipe.one_step_off_async.launch import PROFILES
from recipe.one_step_off_async.preflight import data_file_problems
from recipe.one_step_off_async.schema import Problems

CONFIG_DIR = Path(__file__).resolve().parents[1] / "recipe" / "one_step_off_async" / "config"
SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
PARTS = ("one_step_off_base", "one_step_off_cpu", "one_step_off_gpu")  # `# @package _global_` pieces of the profiles
PRIMARY = [name for name in SHIPPED if name not in PARTS]
ELASTIC = ("async_training.elastic.enable=true",)
PARTIAL = ("async_training.partial_rollout=true",)


def compose_config(name: str, *overrides: str):
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def test_the_recipe_ships_a_gpu_a_one_gpu_and_five_cpu_configs():
    assert PRIMARY == [
        "one_step_off_ppo_1gpu",
        "one_step_off_ppo_cpu",
        "one_step_off_ppo_cpu_generation_bound",
        "one_step_off_ppo_cpu_graded",
        "one_step_off_ppo_cpu_long_tail",
        "one_step_off_ppo_cpu_sort_long",
        "one_step_off_ppo_trainer",
    ]


def test_the_launch_names_every_shipped_profile_when_a_config_name_is_wrong():
    assert sorted(PROFILES) == PRIMARY


@pytest.mark.parametrize("name", PRIMARY)
def test_shipped_config_composes_and_validates(name):
    config = compose_config(name)
    assert validate_config(config) == AsyncTrainingConfig(
        staleness=1,
        sync_interval=1,
        partial_rollout=True,  # the profiles' default: partial rollout in bypass mode
        one_gpu=name == "one_step_off_ppo_1gpu",
        generation_timeout_s=3600,
        sync_timeout_s=600,
    )
    assert config.actor_rollout_ref.hybrid_engine is False
    assert config.algorithm.rollout_correction.bypass_mode is True


def test_the_bare_entry_point_composes_to_the_documented_gpu_setup():
    """`python -m recipe.one_step_off_async.main_ppo actor_rollout_ref.model.path=...`: not verl's colocated defaults."""
    config = compose_config("one_step_off_ppo_trainer", "actor_rollout_ref.model.path=/models/any")
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (actor.strategy, config.actor_rollout_ref.ref.strategy, config.critic.strategy) == ("fsdp2",) * 3
    assert (rollout.name, rollout.mode, rollout.checkpoint_engine.backend) == ("vllm", "async", "nccl")
    assert (rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.pipeline_model_parallel_size) == (
        1,
        1,
        1,
    )  # one replica per rollout GPU
    assert (rollout.nnodes, rollout.n_gpus_per_node, config.trainer.nnodes, config.trainer.n_gpus_per_node) == (
        1,
        4,
        1,
        4,
    )
    assert rollout.gpu_memory_utilization == 0.85  # a dedicated rollout GPU, not verl's colocated 0.5
    assert (config.trainer.device, config.actor_rollout_ref.hybrid_engine, rollout.free_cache_engine) == (
        "cuda",
        False,
        False,
    )
    assert config.async_training.staleness == 1 and rollout.calculate_log_probs
    # Runs on `pip install -e ".[gpu]"` alone: no flash-attn (run_qwen2_5_3b.sh selects it).
    model = config.actor_rollout_ref.model
    assert (model.override_config.attn_implementation, model.use_remove_padding) == ("sdpa", False)


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
        (["async_training.start_timeout_s=-1"], r"async_training.start_timeout_s=-1 must be a positive"),
        (["async_training.sync_interval=0"], r"async_training.sync_interval=0 must be an integer >= 1"),
        (["async_training.one_gpu=true"], r"async_training.one_gpu=true .* needs trainer.device=cuda"),
        (
            ["reward.reward_model.enable=true", "reward.reward_model.enable_resource_pool=false"],
            r"enable_resource_pool=false colocates the reward model with the training pool",
        ),
        (["reward.reward_model.enable=true", "reward.reward_model.model_path=null"], r"model_path is not set"),
        (
            ["reward.reward_model.enable=true", "reward.reward_model.nnodes=0"],
            r"reward.reward_model.n_gpus_per_node=1 x reward.reward_model.nnodes=0 leaves the reward model's pool",
        ),
        (
            ["reward.reward_model.enable=true", "reward.reward_model.rollout.name=sglang"],
            r"reward.reward_model.rollout.name='sglang': on trainer.device=cpu .* served by vllm \(",
        ),
        (
            ["reward.reward_model.enable=true", "reward.reward_model.rollout.enable_sleep_mode=true"],
            r"reward.reward_model.rollout.name=vllm on trainer.device=cpu: vLLM's CPU build has no sleep mode.*"
            r"\+\+reward.reward_model.rollout.enable_sleep_mode=false",
        ),
        (["+async_training.stalenes=2"], r"Unknown key\(s\) async_training.stalenes"),
        (["actor_rollout_ref.rollout.nnodes=0"], r"actor_rollout_ref.rollout.nnodes=0 leaves the rollout pool empty"),
        (["actor_rollout_ref.rollout.n_gpus_per_node=0"], r"rollout.n_gpus_per_node=0 leaves the rollout pool empty"),
        (["trainer.n_gpus_per_node=0"], r"trainer.n_gpus_per_node=0 leaves the training pool empty"),
        (
            ["trainer.n_gpus_per_node=3"],
            r"train_batch_size x rollout.n = 16 x 4 = 64 samples per step do not divide across the 3 actor ranks",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=4"],
            r"each actor rank 16 samples .*ppo_micro_batch_size_per_gpu=64 does not divide",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=5"],
            r"train_batch_size=16 is not a multiple of .*ppo_mini_batch_size=5",
        ),
        (
            ["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
            r"backend='nccl' cannot feed weights to the 'vllm' rollout backend on trainer.device=cpu; use .*gloo\.",
        ),
        (
            ["actor_rollout_ref.rollout.name=sglang"],
            r"checkpoint_engine.backend='gloo' cannot feed weights to the 'sglang'",
        ),
        (
            ["actor_rollout_ref.rollout.enable_sleep_mode=true"],
            r"rollout.name=vllm on trainer.device=cpu: vLLM's CPU build has no sleep mode.*"
            r"\+\+actor_rollout_ref.rollout.enable_sleep_mode=false \(the CPU profiles do\)",
        ),
        (
            ["actor_rollout_ref.rollout.name=trtllm"],
            r"rollout.name='trtllm' is not a rollout backend this recipe supports",
        ),
        (["actor_rollout_ref.rollout.mode=sync"], r"rollout.mode='sync'.*Set actor_rollout_ref.rollout.mode=async"),
        (["algorithm.adv_estimator=remax"], r"adv_estimator=remax.*use algorithm.adv_estimator=grpo.*or gae"),
        (["algorithm.adv_estimator=gdpo"], r"adv_estimator=gdpo: GDPO needs per-component rewards"),
        (["algorithm.adv_estimator=optimal_token_baseline"], r"optimal_token_baseline: the optimal-token baseline"),
        (
            ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora.merge=false"],
            r"lora_rank=8 with .*lora.merge=False: the weight sync would send.*Set actor_rollout_ref.model.lora.merge=true",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora.merge=true"]
            + ["actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]"],
            r"save_contents=\['model', 'hf_model'\] with LoRA: verl 0.9.1 writes the Hugging Face export",
        ),
        (
            ["+actor_rollout_ref.model.lora_adapter_path=/a"],
            r"lora_adapter_path=/a with .*lora_rank=0: the fsdp2 actor",
        ),
        (
            ["actor_rollout_ref.model.lora.rank=8"],
            r"lora.rank=8 is Megatron's LoRA key; the fsdp2 actor reads .*lora_rank",
        ),
        (
            ["algorithm.adv_estimator=gae", "critic.enable=false"],
            r"critic.enable=False with algorithm.adv_estimator=gae",
        ),
        (["actor_rollout_ref.rollout.tensor_model_parallel_size=0"], r"tensor_model_parallel_size=0 must be a posi"),
        (["data.train_batch_size=abc"], r"data.train_batch_size='abc' must be a positive integer"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=0"], r"ppo_mini_batch_size=0 must be a positive integer"),
        (["async_training.one_gpu=1"], r"async_training.one_gpu=1 must be true or false"),
        (["global_profiler.steps=[2]"], r"global_profiler.steps=\[2\]: verl profiles the rollout of step k inside"),
        (["actor_rollout_ref.rollout.calculate_log_probs=false"], r"calculate_log_probs=False"),
        (["async_training.elastic.enable=1"], r"async_training.elastic.enable=1 must be true or false"),
        (["async_training.elastic.min_replicas=0"], r"elastic.min_replicas=0 must be an integer >= 1"),
        (["async_training.elastic.max_replicas=0"], r"elastic.max_replicas=0 must be an integer >= 1, or null"),
        (["async_training.elastic.start_timeout_s=0"], r"elastic.start_timeout_s=0 must be a positive"),
        (["+async_training.elastic.max_replica=2"], r"Unknown key\(s\) async_training.elastic.max_replica;"),
        (["async_training.partial_rollout=1"], r"async_training.partial_rollout=1 must be true or false"),
        (
            [*PARTIAL, "actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda"]
            + ["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
            r"partial_rollout=true with actor_rollout_ref.rollout.name='sglang'.*wired here for vllm only",
        ),
        (
            [*PARTIAL, "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"]
            + ["actor_rollout_ref.rollout.checkpoint_engine.backend=nixl"],
            r"partial_rollout=true with checkpoint_engine.backend='nixl'.*supported: gloo, checkpoint, nccl. Use one of them, or turn partial rollout \(on by default\) off: async_training.partial_rollout=false",
        ),
        (
            [*PARTIAL, "actor_rollout_ref.rollout.scheduling_policy=fcfs"],
            r"partial_rollout=true with vLLM and .*scheduling_policy='fcfs'.*scheduling_policy=priority",
        ),
        (
            [*PARTIAL, "actor_rollout_ref.rollout.enable_rollout_routing_replay=true"],
            r"partial_rollout=true with .*enable_rollout_routing_replay=true: the MoE routing",
        ),
        (
            [*PARTIAL, "actor_rollout_ref.rollout.full_determinism=true"],
            r"partial_rollout=true with .*full_determinism=true: a run is reproducible only if",
        ),
        (
            [*ELASTIC, "async_training.elastic.min_replicas=2"],
            r"min_replicas=2 is more than the 1 replica\(s\) the run starts with",
        ),
        (
            [*ELASTIC, "actor_rollout_ref.rollout.n_gpus_per_node=3", "async_training.elastic.max_replicas=2"],
            r"max_replicas=2 is less than the 3 replica\(s\) the run starts with",
        ),
    ],
)
@pytest.mark.usefixtures("demo_assets")  # the reward model's cases compose its path
def test_bad_config_names_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(compose_config("one_step_off_ppo_cpu", *overrides))


def test_every_problem_of_a_config_is_reported_at_once():
    """Independent mistakes come in one error, in the order of the checks; checks that need a refused value
    (replica and batch sizes need the pools) wait until it is fixed."""
    with pytest.raises(ConfigError) as caught:
        validate_config(
            compose_config(
                "one_step_off_ppo_cpu",
                "async_training.staleness=-1",
                "async_training.sync_interval=0",
                "+async_training.elastic.max_replica=2",
                "actor_rollout_ref.hybrid_engine=true",
                "trainer.n_gpus_per_node=0",
                "actor_rollout_ref.actor.ppo_mini_batch_size=5",  # a batch check: skipped, the pool is empty
                "algorithm.adv_estimator=remax",
            )
        )
    starts = [problem.split(" ")[0] for problem in caught.value.problems]
    assert starts == [
        "Unknown",  # key(s) async_training.elastic.max_replica
        "async_training.staleness=-1",
        "async_training.sync_interval=0",
        "actor_rollout_ref.hybrid_engine=True",
        "trainer.n_gpus_per_node=0",
        "algorithm.adv_estimator=remax:",
    ]
    assert str(caught.value) == "\n".join(caught.value.problems)
    assert caught.value.skipped == (
        "the one-GPU, elastic and partial-rollout checks (they need async_training)",
        "the replica and batch sizes (they need both pools)",
    )


def test_every_bad_value_of_the_section_is_reported_at_once():
    """The fields' checks walk the whole section, the elastic one too: an unknown key does not hide the values (each
    section's unknown keys, then its nested sections, then its own values)."""
    with pytest.raises(ConfigError) as caught:
        validate_config(
            compose_config(
                "one_step_off_ppo_cpu",
                "+async_training.stalenes=2",
                "async_training.console=short",
                "async_training.elastic.min_replicas=0",
                "async_training.elastic.start_timeout_s=0",
            )
        )
    assert [problem.split(" must be ")[0].split(";")[0] for problem in caught.value.problems] == [
        "Unknown key(s) async_training.stalenes",
        "async_training.elastic.min_replicas=0",
        "async_training.elastic.start_timeout_s=0",
        "async_training.console='short'",
    ]
    with pytest.raises(ConfigError) as caught:
        ElasticConfig(min_replicas=0, max_replicas=0, silent_timeout_s="2m")
    assert len(caught.value.problems) == 3


def test_elastic_mode_parses_and_is_off_by_default():
    assert validate_config(compose_config("one_step_off_ppo_cpu")).elastic == ElasticConfig(enable=False)
    parsed = validate_config(
        compose_config(
            "one_step_off_ppo_cpu",
            *ELASTIC,
            "actor_rollout_ref.rollout.n_gpus_per_node=2",
            "async_training.elastic.max_replicas=4",
            "async_training.elastic.min_replicas=2",
        )
    )
    assert parsed.elastic == ElasticConfig(enable=True, min_replicas=2, max_replicas=4, start_timeout_s=1800)


def test_elastic_mode_on_gpu_needs_an_nccl_group_rebuilt_when_membership_changes():
    gpu = ("actor_rollout_ref.model.path=/models/any", *ELASTIC)
    with pytest.raises(ConfigError, match=r"rebuild_group=true"):
        validate_config(compose_config("one_step_off_ppo_trainer", *gpu))
    rebuilt = "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group=true"
    assert validate_config(compose_config("one_step_off_ppo_trainer", *gpu, rebuilt)).elastic.enable
    with pytest.raises(ConfigError, match=r"only gloo, checkpoint, nccl are known to follow"):
        validate_config(
            compose_config("one_step_off_ppo_trainer", *gpu, "actor_rollout_ref.rollout.checkpoint_engine.backend=nixl")
        )
    with pytest.raises(ConfigError, match=r"elastic.enable=true with async_training.one_gpu=true"):
        validate_config(compose_config("one_step_off_ppo_1gpu", "actor_rollout_ref.model.path=/models/any", *ELASTIC))


@pytest.mark.parametrize(
    ("name", "batching"),
    [
        ("one_step_off_ppo_1gpu", ()),
        # The multi-GPU profile leaves the actor's batching to the launch, as verl does: either way the critic follows.
        ("one_step_off_ppo_trainer", ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",)),
        ("one_step_off_ppo_trainer", ("actor_rollout_ref.actor.use_dynamic_bsz=true",)),  # run_qwen2_5_3b.sh's
    ],
)
def test_gae_on_a_gpu_profile_gives_verl_a_critic_on_the_actors_model(demo_assets, name, batching):
    from verl.utils.config import omega_conf_to_dataclass

    config = compose_config(
        name, "algorithm.adv_estimator=gae", f"actor_rollout_ref.model.path={demo_assets.model_dir}", *batching
    )
    validate_config(config)
    critic = omega_conf_to_dataclass(config.critic)  # as verl's trainer builds it: refuses a null micro-batch
    critic.validate(config.trainer.nnodes * config.trainer.n_gpus_per_node, config.data.train_batch_size)
    actor = config.actor_rollout_ref.actor
    assert critic.model.path == config.actor_rollout_ref.model.path == str(demo_assets.model_dir)
    assert (critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz) == (
        actor.ppo_micro_batch_size_per_gpu,
        actor.use_dynamic_bsz,
    )


def test_gpu_backends_on_a_cpu_trainer_are_rejected_and_vllms_cpu_build_is_accepted():
    config = compose_config(
        "one_step_off_ppo_cpu",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    )
    with pytest.raises(ConfigError, match="trainer.device='cpu' with actor_rollout_ref.rollout.name='sglang'"):
        validate_config(config)
    # The CPU profile: vLLM's CPU build, fed by the gloo engine, with its settings for it (no sleep mode).
    vllm = compose_config("one_step_off_ppo_cpu")
    rollout = vllm.actor_rollout_ref.rollout
    assert (rollout.name, rollout.checkpoint_engine.backend, rollout.enable_sleep_mode) == ("vllm", "gloo", False)
    validate_config(vllm)


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


@pytest.mark.parametrize("name", PRIMARY)
def test_lora_rank_alone_passes_the_profiles_merge_the_adapters(name):
    """Merged syncs are LoRA's one valid setting here, so the recipe's configs set lora.merge=true."""
    config = compose_config(name, "actor_rollout_ref.model.lora_rank=8")
    assert config.actor_rollout_ref.model.lora.merge is True
    validate_config(config)


@pytest.mark.usefixtures("demo_assets")
def test_a_reward_model_on_a_pool_of_its_own_passes():
    validate_config(
        compose_config(
            "one_step_off_ppo_cpu", "reward.reward_model.enable=true", "reward.custom_reward_function.path=null"
        )
    )
    # A reward function set as well: verl scores with it, so the launch says the model scores nothing by itself.
    with pytest.warns(UserWarning, match=r"verl scores with the function; the reward model is served but scores only"):
        validate_config(compose_config("one_step_off_ppo_cpu", "reward.reward_model.enable=true"))
    gpu = compose_config(
        "one_step_off_ppo_trainer",
        "actor_rollout_ref.model.path=/models/any",
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=/models/rm",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.nnodes=1",
        "reward.reward_model.n_gpus_per_node=2",
    )
    assert gpu.reward.reward_model.enable_resource_pool  # the recipe's default: a pool of its own
    validate_config(gpu)
    # Tensor parallel 4 on nodes of 3 GPUs: verl would place a replica over two nodes unevenly.
    uneven = compose_config(
        "one_step_off_ppo_trainer",
        "actor_rollout_ref.model.path=/models/any",
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=/models/rm",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.nnodes=2",
        "reward.reward_model.n_gpus_per_node=3",
        "reward.reward_model.rollout.tensor_model_parallel_size=4",
    )
    with pytest.raises(ConfigError, match=r"splits a replica unevenly over nodes"):
        validate_config(uneven)


def test_multi_turn_tool_use_passes_the_launch_checks_in_every_mode(demo_assets):
    """verl's tool agent loop runs here (trainer/agent_loops.py): by default loop or by the rows, in any mode."""
    tool_use = (
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={demo_assets.tool_function_path}",
        f"data.train_files={demo_assets.tool_train_file}",
        f"data.val_files={demo_assets.tool_val_file}",
    )
    for mode in ((), PARTIAL, (*PARTIAL, *ELASTIC, "actor_rollout_ref.rollout.n_gpus_per_node=2")):
        config = compose_config("one_step_off_ppo_cpu", *tool_use, *mode)
        validate_config(config)
        assert data_file_problems(config) == Problems()


def test_data_files_are_checked_before_anything_starts(tmp_path, demo_assets):
    def problems(train: str, val: str) -> Problems:
        return data_file_problems(
            compose_config("one_step_off_ppo_cpu", f"data.train_files={train}", f"data.val_files={val}")
        )

    good = demo_assets.train_file
    assert problems(good, f"[{good}]") == Problems()
    missing = tmp_path / "missing.parquet"
    [not_here] = problems(missing, good).not_here
    assert not_here.startswith(f"data.train_files: {missing} is not found on this machine")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet")
    assert problems(good, garbage).problems[0].startswith(f"data.val_files: {garbage} is not a readable parquet file")
    empty = tmp_path / "empty.parquet"
    pd.read_parquet(good).iloc[:0].to_parquet(empty)
    assert problems(empty, good).problems[0].startswith(f"data.train_files: {empty} hold no rows")
    # Every problem at once; a split with a file not read is not counted (its rows are listed as not checked).
    found = problems(f"[{missing},{empty}]", garbage)
    assert [problem.split(" ", 2)[:2] for problem in found.problems] == [["data.val_files:", str(garbage)]]
    assert [problem.split(" ", 2)[:2] for problem in found.not_here] == [["data.train_files:", str(missing)]]
    assert found.skipped == [
        f"whether data.{split} holds rows (one of its files could not be read)"
        for split in ("train_files", "val_files")
    ]
