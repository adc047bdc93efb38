"""The recipe's own config keys (``async_training``) and what a config must keep before a launch starts.

``AsyncTrainingConfig`` and ``ElasticConfig`` declare each key's help and range once, in its metadata
(``schema.Check``), and validate themselves when built. The cross-key checks over verl's keys and ours are plain
functions, one per feature, each returning its problems with the key and the fix; ``config_problems`` adds them up
in the order a launch reports them. It reads only the config (``preflight`` checks the disk and this machine), before
Ray starts; what verl refuses only inside a Ray worker (``RolloutConfig.__post_init__``) is checked here too.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.backends import CHECKPOINT_ENGINES, ROLLOUT_BACKENDS, VLLM, rollout_backends_on
from recipe.one_step_off_async.errors import ConfigError
from recipe.one_step_off_async.schema import Check, Problems, check_fields, parse_section

# The weight-sync engines that follow a rollout pool whose membership changes between syncs, those whose sync
# aborts, loads and resumes the replicas, and the rollout backends whose abort keeps the tokens so far.
ELASTIC_CHECKPOINT_ENGINES = tuple(name for name, engine in CHECKPOINT_ENGINES.items() if engine.follows_membership)
PARTIAL_ROLLOUT_CHECKPOINT_ENGINES = tuple(
    name for name, engine in CHECKPOINT_ENGINES.items() if engine.aborts_and_resumes
)
PARTIAL_ROLLOUT_BACKENDS = tuple(name for name, backend in ROLLOUT_BACKENDS.items() if backend.resumes_aborted)

# The rollout settings partial rollout cannot keep, and why: a sync interrupts requests and resumes them.
PARTIAL_ROLLOUT_EXCLUDES = {
    "enable_rollout_routing_replay": "the MoE routing of a request resumed under new weights is not carried across "
    "its segments",
    "full_determinism": "a run is reproducible only if every request sees the same weights, and here a sync "
    "interrupts requests at a point that depends on timing",
}

CONSOLE_FORMATS = ("compact", "verl")
# verl's decoupled mode with token-level IS (old log-probs recomputed, pi_old / pi_rollout per token): what every
# loss but vanilla needs (losses.py refuses them in the profiles' bypass mode) and what logs the exact-sync check.
DECOUPLED_OVERRIDES = (
    "algorithm.rollout_correction.bypass_mode=false",
    "algorithm.rollout_correction.rollout_is=token",
)
# A replica's devices: the product of these sizes of its rollout config.
PARALLEL_SIZES = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
# verl's advantage estimators the pipeline refuses, with the reason (the others run: the support matrix
# in docs/advance/one_step_off_async/support_matrix.md names the test of each).
_OPTIMAL_BASELINE = (
    "the optimal-token baseline needs the actor's sum of squared probabilities (actor.calculate_sum_pi_squared), "
    "which has not been run through the pipeline"
)
REFUSED_ESTIMATORS = {
    "remax": "REMAX needs an extra greedy generation per batch, which the pipeline does not schedule",
    "optimal_token_baseline": _OPTIMAL_BASELINE,
    "tir_optimal_token_baseline": _OPTIMAL_BASELINE,
    "gdpo": "GDPO needs per-component rewards (algorithm.gdpo_reward_keys), which have not been run through "
    "the pipeline",
}

# A timeout's range.
SECONDS = Check(above=0, unit="seconds")


@dataclass(frozen=True)
class ElasticConfig:
    """``async_training.elastic``: the rollout pool survives lost replicas and takes in new ones (each key's reason
    is in config/one_step_off_base.yaml)."""

    enable: bool = field(
        default=False,
        metadata={
            "help": "Drop a replica that dies and generate its requests on the others; replicas join or "
            "leave a running job (python -m recipe.one_step_off_async.scale). false: a lost replica fails the run."
        },
    )
    min_replicas: int = field(
        default=1,
        metadata={"help": "Fewer live replicas than this fails the run.", "check": Check(at_least=1)},
    )
    max_replicas: int | None = field(
        default=None,
        metadata={
            "help": "Grow up to this many replicas when the cluster has room for one more.",
            "check": Check(at_least=1, null="no automatic growth"),
        },
    )
    start_timeout_s: float = field(
        default=1800.0,
        metadata={"help": "Longest a new replica may take to be placed and load its engine.", "check": SECONDS},
    )
    silent_timeout_s: float = field(
        default=120.0,
        metadata={
            "help": "A replica that does not answer a liveness probe (before each sync, after a failure) this long "
            "is lost, like a dead one; a busy replica answers late and stays.",
            "check": SECONDS,
        },
    )

    def __post_init__(self) -> None:
        check_fields(self, "async_training.elastic.")


@dataclass(frozen=True)
class AsyncTrainingConfig:
    """``async_training``: how far generation runs ahead of training, and how long to wait (each key's reason is in
    config/one_step_off_base.yaml)."""

    staleness: int = field(
        default=1,
        metadata={
            "help": "Generation batches in flight while the actor trains: the batch trained at step k was "
            "generated with the weights after step k-1-staleness.",
            "check": Check(at_least=0, note="0 = synchronous, 1 = one-step-off, s = s batches in flight"),
        },
    )
    sync_interval: int = field(
        default=1,
        metadata={
            "help": "Push the actor's weights to the rollout every N training steps (and on every validation and "
            "checkpoint step; not before trainer.critic_warmup).",
            "check": Check(at_least=1, note="1 = push weights after every step, N = every N steps"),
        },
    )
    partial_rollout: bool = field(
        default=True,
        metadata={
            "help": "The batches in flight generate concurrently (oldest first); a weight sync interrupts "
            "the running requests, which continue under the new weights (their prefix prefilled again). "
            "false: a sync waits for idle and every batch has one weight version."
        },
    )
    one_gpu: bool = field(
        default=False,
        metadata={"help": "Both pools time-share one physical GPU (platforms/one_gpu.py; the 1gpu profile)."},
    )
    generation_timeout_s: float = field(
        default=3600.0,
        metadata={"help": "Longest wait for one generation batch before the run fails.", "check": SECONDS},
    )
    sync_timeout_s: float = field(
        default=600.0,
        metadata={"help": "Longest one actor -> rollout weight sync may take.", "check": SECONDS},
    )
    start_timeout_s: float = field(
        default=1800.0,
        metadata={
            "help": "Longest each start-up wait at launch may take (the training pool placed, the rollout and "
            "reward-model replicas placed and started); the run then fails naming the pool and what Ray has free.",
            "check": SECONDS,
        },
    )
    console: str = field(
        default="compact",
        metadata={
            "help": "The console backend of trainer.logger; the other loggers get every metric either way.",
            "check": Check(
                choices=CONSOLE_FORMATS, note="compact: one short line per step; verl: verl's line with every metric"
            ),
        },
    )
    elastic: ElasticConfig = field(default_factory=ElasticConfig)

    def __post_init__(self) -> None:
        check_fields(self, "async_training.")

    @classmethod
    def from_config(cls, config: DictConfig) -> AsyncTrainingConfig:
        """The ``async_training`` section of ``config`` (defaults where it has none), or one ``ConfigError``
        naming every key or value the fields refuse; no cross-key check (``config_problems`` has them)."""
        section = OmegaConf.select(config, "async_training")
        if section is None:
            return cls()
        if not isinstance(section, DictConfig):
            raise ConfigError(f"async_training={section!r} must be a section (staleness, ...).")
        return parse_section(cls, OmegaConf.to_container(section, resolve=True), "async_training.")


ROLLOUT, MODEL, REWARD_MODEL = "actor_rollout_ref.rollout", "actor_rollout_ref.model", "reward.reward_model"
ELASTIC, PARTIAL = "async_training.elastic", "async_training.partial_rollout"
ENGINE = f"{ROLLOUT}.checkpoint_engine.backend"
# The two pools, and the sizes a replica and a batch are made of: the size arithmetic needs them all.
POOLS = ("trainer.nnodes", "trainer.n_gpus_per_node", f"{ROLLOUT}.nnodes", f"{ROLLOUT}.n_gpus_per_node")
SIZES = (
    *(f"{ROLLOUT}.{size}" for size in PARALLEL_SIZES),
    f"{ROLLOUT}.n",
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
)


def validate_config(config: DictConfig) -> AsyncTrainingConfig:
    """The parsed ``async_training`` section, or one ``ConfigError`` naming every problem of ``config_problems``."""
    config_problems(config).raise_any()
    return AsyncTrainingConfig.from_config(config)


def config_problems(config: DictConfig) -> Problems:
    """Every problem of the keys the recipe relies on, in the order a launch reports them: the ``async_training``
    section, then each feature's cross-key checks, then the size arithmetic (skipped, and listed so, while a pool or
    size it needs is refused)."""
    found = Problems()
    try:
        section = AsyncTrainingConfig.from_config(config)
    except ConfigError as error:
        section = None
        found += Problems.of(error)
        found.skipped.append("the one-GPU, elastic and partial-rollout checks (they need async_training)")
    empty_pools, bad_sizes = _not_positive(config, POOLS), _not_positive(config, SIZES)
    found.problems += _placement_problems(config)
    found.problems += [_empty_pool(config, key) for key in empty_pools]
    found.problems += [f"{key}={_get(config, key)!r} must be a positive integer." for key in bad_sizes]
    if section is not None:
        found.problems += _one_gpu_problems(config, section)
    found.problems += _rollout_backend_problems(config)
    if section is not None:
        found.problems += _elastic_problems(config, section) + _partial_rollout_problems(config, section)
    found.problems += _reward_model_problems(config, section)
    found.problems += _algorithm_problems(config) + _lora_problems(config) + _pipeline_problems(config)
    if empty_pools:
        found.skipped.append("the replica and batch sizes (they need both pools)")
    elif bad_sizes:
        found.skipped.append("the replica and batch sizes against the pools (they need those sizes)")
    else:
        found.problems += _size_problems(config, section.elastic if section is not None else None)
    return found


def _get(config: DictConfig, key: str, default: object = None) -> object:
    """The value of ``key`` (``default`` where the config lacks it)."""
    return OmegaConf.select(config, key, default=default)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _not_positive(config: DictConfig, keys: tuple[str, ...]) -> list[str]:
    return [key for key in keys if not (_is_count(_get(config, key)) and _get(config, key) > 0)]


def _empty_pool(config: DictConfig, key: str) -> str:
    pool = "training" if key.startswith("trainer") else "rollout"
    return (
        f"{key}={_get(config, key)!r} leaves the {pool} pool empty; the actor and the rollout replicas need disjoint "
        f"pools of at least one device each. Set {key} to a positive integer."
    )


def _placement_problems(config: DictConfig) -> list[str]:
    """Disjoint pools, and a rollout through verl's server replicas (verl refuses ``mode=sync`` only inside a Ray
    worker, in ``RolloutConfig.__post_init__``)."""
    problems = []
    if _get(config, "actor_rollout_ref.hybrid_engine"):
        problems.append(
            "actor_rollout_ref.hybrid_engine=True colocates rollout and training on the same GPUs; this recipe needs "
            "disjoint pools. Set actor_rollout_ref.hybrid_engine=False (the recipe's configs do)."
        )
    mode = _get(config, f"{ROLLOUT}.mode")
    if mode != "async":
        problems.append(
            f"{ROLLOUT}.mode={mode!r}: the recipe rolls out through verl's server replicas and AgentLoopManager. "
            f"Set {ROLLOUT}.mode=async."
        )
    return problems


def _one_gpu_problems(config: DictConfig, section: AsyncTrainingConfig) -> list[str]:
    """``async_training.one_gpu``: one actor rank and one single-GPU rollout replica on one CUDA GPU."""
    pools = [_get(config, key) for key in POOLS]
    parallel = [_get(config, f"{ROLLOUT}.{size}") for size in PARALLEL_SIZES]
    device = _get(config, "trainer.device")
    if not section.one_gpu or (device == "cuda" and all(size == 1 for size in (*pools, *parallel))):
        return []
    return [
        "async_training.one_gpu=true runs one actor rank and one single-GPU rollout replica on one GPU: it needs "
        f"trainer.device=cuda, trainer.nnodes=trainer.n_gpus_per_node=1, {ROLLOUT}.nnodes=n_gpus_per_node=1 and "
        f"{ROLLOUT}.tensor_model_parallel_size=1 (got {device}, {pools[0]}x{pools[1]}, {pools[2]}x{pools[3]}, "
        f"tensor x data x pipeline parallel {'x'.join(str(size) for size in parallel)})."
    ]


def _rollout_backend_problems(config: DictConfig) -> list[str]:
    """A rollout backend the recipe supports, fed by a checkpoint engine that can feed it, on a device it runs on."""
    name, engine, device = _get(config, f"{ROLLOUT}.name"), _get(config, ENGINE), _get(config, "trainer.device")
    if name not in ROLLOUT_BACKENDS:
        return [
            f"{ROLLOUT}.name={name!r} is not a rollout backend this recipe supports; use one of "
            f"{sorted(ROLLOUT_BACKENDS)}."
        ]
    problems = []
    engines = [
        e for e in ROLLOUT_BACKENDS[name].checkpoint_engines if device != "cpu" or not CHECKPOINT_ENGINES[e].cuda_only
    ]
    if engine not in engines:
        problems.append(
            f"{ENGINE}={engine!r} cannot feed weights to the {name!r} rollout backend on trainer.device={device}; "
            f"use {' or '.join(engines)}."
        )
    if name not in rollout_backends_on(device):
        problems.append(
            f"trainer.device={device!r} with {ROLLOUT}.name={name!r}: on {device} the rollout runs on "
            f"{' or '.join(rollout_backends_on(device))} (SGLang needs GPUs). Use --config-name=one_step_off_ppo_cpu "
            f"on CPU (vLLM's CPU build), or trainer.device=cuda on GPUs."
        )
    return problems + _vllm_sleep_problems(config, ROLLOUT)


def _vllm_sleep_problems(config: DictConfig, prefix: str) -> list[str]:
    """vLLM's CPU build refuses sleep mode ("Sleep mode is not supported on current platform") at engine start."""
    on_cpu = _get(config, "trainer.device") == "cpu" and _get(config, f"{prefix}.name") == VLLM
    if not (on_cpu and _get(config, f"{prefix}.enable_sleep_mode", True)):
        return []
    return [
        f"{prefix}.name={VLLM} on trainer.device=cpu: vLLM's CPU build has no sleep mode, and verl starts vLLM with "
        f"it unless told otherwise. Set ++{prefix}.enable_sleep_mode=false (the CPU profiles do)."
    ]


def _elastic_problems(config: DictConfig, section: AsyncTrainingConfig) -> list[str]:
    """The elastic pool: room for another replica, and a checkpoint engine that follows a changing membership."""
    if not section.elastic.enable:
        return []
    problems, engine = [], _get(config, ENGINE)
    if section.one_gpu:
        problems.append(
            f"{ELASTIC}.enable=true with async_training.one_gpu=true: both pools share one GPU, so there is no room "
            f"for another replica and nothing to fail over to. Set {ELASTIC}.enable=false."
        )
    if engine not in ELASTIC_CHECKPOINT_ENGINES:
        problems.append(
            f"{ELASTIC}.enable=true with checkpoint_engine.backend={engine!r}: only "
            f"{', '.join(ELASTIC_CHECKPOINT_ENGINES)} are known to follow a rollout pool that changes between syncs. "
            f"Use one of them, or {ELASTIC}.enable=false."
        )
    if engine == "nccl" and not _get(config, f"{ROLLOUT}.checkpoint_engine.engine_kwargs.nccl.rebuild_group", False):
        problems.append(
            f"{ELASTIC}.enable=true with the nccl engine: verl's NCCL engine keeps its group across syncs and "
            "asserts the old world size when a replica leaves or joins. Add "
            f"+{ROLLOUT}.checkpoint_engine.engine_kwargs.nccl.rebuild_group=true (the group is then rebuilt on every "
            "sync: seconds per sync on large pools)."
        )
    return problems


def _partial_rollout_problems(config: DictConfig, section: AsyncTrainingConfig) -> list[str]:
    """Partial rollout (the profiles' default): a backend that resumes aborted requests, a sync that aborts and
    resumes them, oldest first. Each problem names the fix that keeps it and the knob that turns it off."""
    if not section.partial_rollout:
        return []
    problems, name, engine = [], _get(config, f"{ROLLOUT}.name"), _get(config, ENGINE)
    turn_off = f"or turn partial rollout (on by default) off: {PARTIAL}=false, each sync then waits for idle"
    if name in ROLLOUT_BACKENDS and name not in PARTIAL_ROLLOUT_BACKENDS:  # an unknown backend is refused as such
        problems.append(
            f"{PARTIAL}=true with {ROLLOUT}.name={name!r}: a sync interrupts running requests and "
            f"continues them from their tokens so far, which is wired here for {' and '.join(PARTIAL_ROLLOUT_BACKENDS)} "
            f"only. Use {' or '.join(PARTIAL_ROLLOUT_BACKENDS)}, {turn_off}."
        )
    if engine not in PARTIAL_ROLLOUT_CHECKPOINT_ENGINES:
        problems.append(
            f"{PARTIAL}=true with checkpoint_engine.backend={engine!r}: partial rollout needs a sync "
            "that aborts, loads and resumes the replicas (verl's CheckpointEngineManager); supported: "
            f"{', '.join(PARTIAL_ROLLOUT_CHECKPOINT_ENGINES)}. Use one of them, {turn_off}."
        )
    policy = _get(config, f"{ROLLOUT}.scheduling_policy")
    if name == VLLM and policy != "priority":
        problems.append(
            f"{PARTIAL}=true with vLLM and {ROLLOUT}.scheduling_policy={policy!r}: the batches in "
            f"flight share the engine and the oldest must run first. Set {ROLLOUT}.scheduling_policy=priority, "
            f"{turn_off}."
        )
    for key, why in PARTIAL_ROLLOUT_EXCLUDES.items():
        if _get(config, f"{ROLLOUT}.{key}"):
            problems.append(f"{PARTIAL}=true with {ROLLOUT}.{key}=true: {why}. Set {ROLLOUT}.{key}=false, {turn_off}.")
    return problems


def _reward_model_problems(config: DictConfig, section: AsyncTrainingConfig | None) -> list[str]:
    """A reward model runs on a pool of its own, as replicas of a rollout backend verl's reward loop can call."""
    if not _get(config, f"{REWARD_MODEL}.enable"):
        return []
    problems = []
    if not _get(config, f"{REWARD_MODEL}.enable_resource_pool"):
        problems.append(
            f"{REWARD_MODEL}.enable_resource_pool=false colocates the reward model with the training pool, where "
            "verl scores the batch inside the training step (waking the model between the actor's phases); this "
            "recipe gives the reward model a pool of its own, where it scores each sample as soon as it is generated. "
            f"Set {REWARD_MODEL}.enable_resource_pool=true with {REWARD_MODEL}.n_gpus_per_node and "
            f"{REWARD_MODEL}.nnodes."
        )
    if not _get(config, f"{REWARD_MODEL}.model_path"):
        problems.append(
            f"{REWARD_MODEL}.model_path is not set: point it at the reward model (a sequence-classification model, "
            "one label: its logit is the reward)."
        )
    name, device = _get(config, f"{REWARD_MODEL}.rollout.name"), _get(config, "trainer.device")
    served = rollout_backends_on(device)
    if name not in served:
        problems.append(
            f"{REWARD_MODEL}.rollout.name={name!r}: on trainer.device={device} verl's reward loop scores with a "
            f"reward model served by {' or '.join(served)} (TensorRT-LLM serves no reward model in verl 0.9.1). Set "
            f"{REWARD_MODEL}.rollout.name={served[0]}."
        )
    problems += _vllm_sleep_problems(config, f"{REWARD_MODEL}.rollout")
    if section is not None and section.one_gpu:
        problems.append(
            f"{REWARD_MODEL}.enable=true with async_training.one_gpu=true: the reward model needs a device of its "
            "own besides the one GPU the actor and the rollout share. Use a layout with a reward pool (trainer.device"
            "=cuda without one_gpu), or a reward function."
        )
    function = _get(config, "reward.custom_reward_function.path")
    if function is not None:
        warnings.warn(
            f"{REWARD_MODEL}.enable=true with reward.custom_reward_function.path={function}: verl scores with the "
            "function; the reward model is served but scores only what the function sends it. Set "
            "reward.custom_reward_function.path=null to score with the reward model.",
            stacklevel=3,
        )
    return problems + (_reward_model_pool_problems(config) if name in served else [])


def _reward_model_pool_problems(config: DictConfig) -> list[str]:
    """The reward model's pool holds whole replicas, none split unevenly over nodes."""
    per_node, nodes = _get(config, f"{REWARD_MODEL}.n_gpus_per_node"), _get(config, f"{REWARD_MODEL}.nnodes")
    sizes = (_get(config, f"{REWARD_MODEL}.rollout.{size}", 1) for size in PARALLEL_SIZES)
    world = math.prod(size if _is_count(size) else 1 for size in sizes)
    if _is_count(per_node) and _is_count(nodes) and per_node * nodes >= world and world % min(per_node, world) == 0:
        return []
    return [
        f"{REWARD_MODEL}.n_gpus_per_node={per_node} x {REWARD_MODEL}.nnodes={nodes} leaves the reward model's pool "
        f"smaller than one replica ({world} device(s): tensor x data x pipeline parallel) or splits a replica "
        f"unevenly over nodes. Set {REWARD_MODEL}.nnodes and {REWARD_MODEL}.n_gpus_per_node to hold whole replicas."
    ]


def _algorithm_problems(config: DictConfig) -> list[str]:
    """The advantage estimators the pipeline refuses, and GAE without its critic."""
    problems, estimator = [], _get(config, "algorithm.adv_estimator")
    if estimator in REFUSED_ESTIMATORS:
        problems.append(
            f"algorithm.adv_estimator={estimator}: {REFUSED_ESTIMATORS[estimator]}; use algorithm.adv_estimator=grpo, "
            "rloo, reinforce_plus_plus, or gae (PPO with a critic on the training pool)."
        )
    critic = _get(config, "critic.enable")  # verl's need_critic: critic.enable when set, else whether it is gae
    if estimator == "gae" and critic is not None and not critic:
        problems.append(
            "critic.enable=False with algorithm.adv_estimator=gae: GAE needs the critic's values (verl would stop with "
            "a KeyError on 'values' after start-up). Set critic.enable=true (or leave it null), or use a critic-free "
            "estimator such as grpo."
        )
    return problems


def _lora_problems(config: DictConfig) -> list[str]:
    """LoRA reaches the replicas only merged into the weights; verl's FSDP actor reads model.lora_rank."""
    strategy = _get(config, "actor_rollout_ref.actor.strategy")
    rank, megatron_rank = _get(config, f"{MODEL}.lora_rank"), _get(config, f"{MODEL}.lora.rank")
    adapter = _get(config, f"{MODEL}.lora_adapter_path")
    problems = []
    if strategy != "megatron" and megatron_rank:
        problems.append(
            f"{MODEL}.lora.rank={megatron_rank} is Megatron's LoRA key; the {strategy} actor reads {MODEL}.lora_rank "
            f"and would train full weights. Set {MODEL}.lora_rank instead (with {MODEL}.lora.merge=true)."
        )
    if strategy != "megatron" and adapter and not rank:
        problems.append(
            f"{MODEL}.lora_adapter_path={adapter} with {MODEL}.lora_rank={rank or 0}: the {strategy} actor loads an "
            f"adapter only when lora_rank > 0. Set {MODEL}.lora_rank to the adapter's rank (with "
            f"{MODEL}.lora.merge=true)."
        )
    # The LoRA keys the actor reads that are set (none: full weights).
    settings = (("lora_rank", rank), ("lora.rank", megatron_rank if strategy == "megatron" else 0))
    lora = ", ".join(f"{MODEL}.{key}={value}" for key, value in (*settings, ("lora_adapter_path", adapter)) if value)
    if not lora:
        return problems
    merge = _get(config, f"{MODEL}.lora.merge")
    if merge is not True:  # the recipe's configs set lora.merge=true: only a launch that sets it false reaches this
        problems.append(
            f"{lora} with {MODEL}.lora.merge={merge}: the weight sync would send the adapters under peft's names "
            f"(...q_proj.lora_A.weight), which the rollout replicas do not load. Set {MODEL}.lora.merge=true: the "
            "actor merges the adapters into the base weights before each sync, and the replicas receive full weights "
            "under the model's own names."
        )
    save_contents = _get(config, "actor_rollout_ref.actor.checkpoint.save_contents") or []
    if "hf_model" in save_contents:
        problems.append(
            f"actor_rollout_ref.actor.checkpoint.save_contents={list(save_contents)} with LoRA: verl 0.9.1 writes the "
            "Hugging Face export of a LoRA actor from a state dict under peft's names, so the folder holds the "
            "architecture without the trained weights. Drop hf_model from save_contents (the FSDP checkpoint holds "
            "the adapters and resumes), and merge the adapters from it offline."
        )
    return problems


def _pipeline_problems(config: DictConfig) -> list[str]:
    """What verl does per step that a batch generated while earlier steps train cannot do without."""
    problems, steps = [], _get(config, "global_profiler.steps")
    if steps:
        problems.append(
            f"global_profiler.steps={steps}: verl profiles the rollout of step k inside step k, but here the batch of "
            "step k is generated while earlier steps train, so the profile would cover none of its generation. Unset "
            "global_profiler.steps; profile the rollout replicas with the engine's own profiler instead."
        )
    if not _get(config, f"{ROLLOUT}.calculate_log_probs"):
        problems.append(
            f"{ROLLOUT}.calculate_log_probs=False: the off-policy correction needs the rollout's log-probs of every "
            "sampled token. Set it to True."
        )
    return problems


def _size_problems(config: DictConfig, elastic: ElasticConfig | None) -> list[str]:
    """Replica and batch sizes against the pools, and the elastic pool's bounds against the replicas it starts with."""
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    actor = config.actor_rollout_ref.actor
    problems = []
    rollout_world = math.prod(rollout[size] for size in PARALLEL_SIZES)
    rollout_devices = rollout.nnodes * rollout.n_gpus_per_node
    if rollout_devices % rollout_world:
        problems.append(
            f"The rollout pool has {rollout_devices} devices ({ROLLOUT}.nnodes x n_gpus_per_node) but one replica "
            f"needs {rollout_world} (tensor x data x pipeline parallel size); make the pool a multiple of the replica "
            "size."
        )
    actor_world, n = trainer.nnodes * trainer.n_gpus_per_node, rollout.n
    train_batch = config.data.get("gen_batch_size") or config.data.train_batch_size
    if (train_batch * n) % actor_world:
        problems.append(
            f"data.train_batch_size x rollout.n = {train_batch} x {n} = {train_batch * n} samples per step do not "
            f"divide across the {actor_world} actor ranks (trainer.nnodes x trainer.n_gpus_per_node). Make "
            f"data.train_batch_size * {ROLLOUT}.n a multiple of {actor_world}."
        )
    mini_batch, micro = actor.ppo_mini_batch_size, actor.get("ppo_micro_batch_size_per_gpu")
    if train_batch % mini_batch:
        problems.append(
            f"data.train_batch_size={train_batch} is not a multiple of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}."
        )
    if (mini_batch * n) % actor_world:
        problems.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n = {mini_batch * n} samples per mini-batch do "
            f"not divide across the {actor_world} actor ranks; make it a multiple of {actor_world}."
        )
    elif not actor.use_dynamic_bsz and micro and (mini_batch * n // actor_world) % micro:
        problems.append(
            f"A mini-batch gives each actor rank {mini_batch * n // actor_world} samples (ppo_mini_batch_size x "
            f"rollout.n / {actor_world} ranks), which actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} "
            "does not divide (verl would fail in the first update). Make the micro-batch size a divisor of it."
        )
    if elastic is None or not elastic.enable or rollout_devices % rollout_world:
        return problems
    replicas = rollout_devices // rollout_world
    if elastic.min_replicas > replicas:
        problems.append(
            f"{ELASTIC}.min_replicas={elastic.min_replicas} is more than the {replicas} replica(s) the run starts "
            f"with ({ROLLOUT}.nnodes x n_gpus_per_node / replica size); lower it."
        )
    if elastic.max_replicas is not None and elastic.max_replicas < replicas:
        problems.append(
            f"{ELASTIC}.max_replicas={elastic.max_replicas} is less than the {replicas} replica(s) the run starts "
            "with; raise it, or set it to null to grow only on the scale command."
        )
    return problems
