"""The recipe's own config keys (``async_training``) and the rules a config must keep before a launch starts.

What: ``AsyncTrainingConfig`` and ``ElasticConfig`` declare the ``async_training`` keys, each field's help and
range once, in its metadata (``schema.Check``); ``RULES`` is the one table of cross-key rules ("when K1 = v,
K2 must be w") over verl's keys and ours, in the order a launch reports them; the size arithmetic no row can
say (replicas per pool, batches per rank) stays in functions. ``validate_config`` parses the section, walks
the table, runs the functions, and raises one ``ConfigError`` naming every problem, each with the key and the
fix. ``AsyncTrainingConfig.from_config`` only parses (the trainer's call: the launch has validated).

Why: ``launch.check_launch`` runs it before Ray or any worker starts, so a bad config costs seconds, not a
cluster allocation. It reads only the config (no files, no backend imports: ``preflight`` checks the disk
and this machine); tests/test_support_matrix_on_cpu.py reads the table.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from recipe.one_step_off_async.backends import CHECKPOINT_ENGINES, HF, ROLLOUT_BACKENDS, VLLM, rollout_backends_on
from recipe.one_step_off_async.errors import ConfigError, Problems
from recipe.one_step_off_async.schema import Check, Rule, Values, check_fields, check_rules, parse_section

# The weight-sync engines that follow a rollout pool whose membership changes between syncs, those whose sync
# aborts, loads and resumes the replicas, and the rollout backends whose abort keeps the tokens so far.
ELASTIC_CHECKPOINT_ENGINES = tuple(name for name, engine in CHECKPOINT_ENGINES.items() if engine.follows_membership)
PARTIAL_ROLLOUT_CHECKPOINT_ENGINES = tuple(
    name for name, engine in CHECKPOINT_ENGINES.items() if engine.aborts_and_resumes
)
PARTIAL_ROLLOUT_BACKENDS = tuple(name for name, backend in ROLLOUT_BACKENDS.items() if backend.resumes_aborted)

CONSOLE_FORMATS = ("compact", "verl")
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
        metadata={
            "help": "Fewer live replicas than this fails the run, naming the replicas that were lost.",
            "check": Check(at_least=1),
        },
    )
    max_replicas: int | None = field(
        default=None,
        metadata={
            "help": "Grow the pool up to this many replicas whenever the Ray cluster has room for one more (a "
            "node joined). null: only the scale command adds replicas.",
            "check": Check(at_least=1, null="no automatic growth"),
        },
    )
    start_timeout_s: float = field(
        default=1800.0,
        metadata={
            "help": "Longest a new replica may take to be placed and load its engine; then it is abandoned.",
            "check": SECONDS,
        },
    )
    silent_timeout_s: float = field(
        default=120.0,
        metadata={
            "help": "A replica that does not answer a liveness probe for this long is lost, like a dead one. The "
            "probe runs before each weight sync and after a failed generation or sync; a busy replica answers "
            "when it gets to it, so only silence past this bound counts. A hung replica delays that sync by this "
            "much, then is dropped (otherwise the sync would hang on it until sync_timeout_s and fail the run).",
            "check": SECONDS,
        },
    )

    def __post_init__(self) -> None:
        check_fields(self, "async_training.elastic.")


@dataclass(frozen=True)
class AsyncTrainingConfig:
    """``async_training``: how far generation runs ahead of training, and how long to wait."""

    staleness: int = field(
        default=1,
        metadata={
            "help": "Generation batches in flight while the actor trains. The batch trained at step k was "
            "generated with the weights after step k-1-staleness. 0 = synchronous baseline, 1 = one-step-off.",
            "check": Check(at_least=0, note="0 = synchronous, 1 = one-step-off, s = s batches in flight"),
        },
    )
    sync_interval: int = field(
        default=1,
        metadata={
            "help": "Push the actor's weights to the rollout every N training steps (and on every validation "
            "and checkpoint step; not before trainer.critic_warmup, while the actor does not update); in between, "
            "the rollout keeps generating with the last version it received.",
            "check": Check(at_least=1, note="1 = push weights after every step, N = every N steps"),
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
        metadata={
            "help": "Longest the trainer waits for one generation batch before failing the run.",
            "check": SECONDS,
        },
    )
    sync_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "Longest one actor -> rollout weight sync may take before failing the run.",
            "check": SECONDS,
        },
    )
    console: str = field(
        default="compact",
        metadata={
            "help": "compact: the console backend of trainer.logger prints one line of at most 160 characters per "
            "step (step time and its split, staleness, score, validation); verl: verl's line with every metric. "
            "The other loggers get every metric either way.",
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
        naming every key or value the fields refuse; no cross-key rule (``validate_config`` has them)."""
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
# The keys that turn LoRA on for the actor (lora.rank only on Megatron's actor).
LORA = {
    "rank": f"{MODEL}.lora_rank",
    "megatron_rank": f"{MODEL}.lora.rank",
    "adapter": f"{MODEL}.lora_adapter_path",
    "strategy": "actor_rollout_ref.actor.strategy",
}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pool(key: str) -> Rule:
    pool = "training" if key.startswith("trainer") else "rollout"
    return Rule(
        {"devices": key},
        require=lambda v: _is_count(v.devices) and v.devices > 0,
        message=lambda v: (
            f"{key}={v.devices!r} leaves the {pool} pool empty; the actor and the rollout replicas "
            f"need disjoint pools of at least one device each. Set {key} to a positive integer."
        ),
    )


def _size(key: str) -> Rule:
    return Rule(
        {"size": key},
        require=lambda v: _is_count(v.size) and v.size > 0,
        message=lambda v: f"{key}={v.size!r} must be a positive integer.",
    )


def _vllm_on_cpu(prefix: str, **enabled_by: str) -> Rule:
    """vLLM's CPU build refuses sleep mode ("Sleep mode is not supported on current platform") at engine start.
    ``enabled_by``: keys that must all be true for the rule to apply."""
    return Rule(
        {"name": f"{prefix}.name", "device": "trainer.device", "sleep": f"{prefix}.enable_sleep_mode", **enabled_by},
        when=lambda v: v.device == "cpu" and v.name == VLLM and all(v.get(key) for key in enabled_by),
        require=lambda v: not v.get("sleep", True),
        message=f"{prefix}.name={VLLM} on trainer.device=cpu: vLLM's CPU build has no sleep mode, and verl starts "
        f"vLLM with it unless told otherwise. Set ++{prefix}.enable_sleep_mode=false (the CPU profiles do).",
    )


def _lora(v: Values) -> str:
    """The LoRA keys the actor reads that are set, as a message names them (empty: full weights)."""
    megatron_rank = v.megatron_rank if v.strategy == "megatron" else 0
    settings = (("lora_rank", v.rank), ("lora.rank", megatron_rank), ("lora_adapter_path", v.adapter))
    return ", ".join(f"{MODEL}.{key}={value}" for key, value in settings if value)


def _one_gpu_layout(v: Values) -> bool:
    sizes = (v.nodes, v.gpus, v.rollout_nodes, v.rollout_gpus, *(v.get(size) for size in PARALLEL_SIZES))
    return v.device == "cuda" and all(size == 1 for size in sizes)


# The cross-key rules, in the order a launch reports what breaks them. Each reads the keys it names (by a short
# name) and says the fix; the size arithmetic that follows (_check_sizes, ...) needs the pools and sizes the
# first rows check.
RULES: tuple[Rule, ...] = (
    Rule(
        {"hybrid": "actor_rollout_ref.hybrid_engine"},
        require=lambda v: not v.hybrid,
        message="actor_rollout_ref.hybrid_engine=True colocates rollout and training on the same GPUs; this recipe "
        "needs disjoint pools. Set actor_rollout_ref.hybrid_engine=False (the recipe's configs do).",
    ),
    Rule(
        {"mode": f"{ROLLOUT}.mode"},
        require=lambda v: v.mode == "async",
        message=lambda v: (
            f"{ROLLOUT}.mode={v.mode!r}: the recipe rolls out through verl's server replicas and "
            f"AgentLoopManager. Set {ROLLOUT}.mode=async."
        ),
    ),
    *(_pool(key) for key in POOLS),
    *(_size(key) for key in SIZES),
    Rule(
        {
            "one_gpu": "async_training.one_gpu",
            "device": "trainer.device",
            "nodes": "trainer.nnodes",
            "gpus": "trainer.n_gpus_per_node",
            "rollout_nodes": f"{ROLLOUT}.nnodes",
            "rollout_gpus": f"{ROLLOUT}.n_gpus_per_node",
            **{size: f"{ROLLOUT}.{size}" for size in PARALLEL_SIZES},
        },
        when=lambda v: v.one_gpu,
        require=_one_gpu_layout,
        message=lambda v: (
            "async_training.one_gpu=true runs one actor rank and one single-GPU rollout replica on one "
            f"GPU: it needs trainer.device=cuda, trainer.nnodes=trainer.n_gpus_per_node=1, {ROLLOUT}.nnodes="
            f"n_gpus_per_node=1 and {ROLLOUT}.tensor_model_parallel_size=1 (got {v.device}, {v.nodes}x{v.gpus}, "
            f"{v.rollout_nodes}x{v.rollout_gpus}, tensor x data x pipeline parallel "
            f"{'x'.join(str(v.get(size)) for size in PARALLEL_SIZES)})."
        ),
    ),
    Rule(
        {"name": f"{ROLLOUT}.name"},
        require=lambda v: v.name in ROLLOUT_BACKENDS,
        message=lambda v: (
            f"{ROLLOUT}.name={v.name!r} is not a rollout backend this recipe supports; use one of "
            f"{sorted(ROLLOUT_BACKENDS)}."
        ),
    ),
    Rule(
        {"engine": ENGINE, "name": f"{ROLLOUT}.name"},
        when=lambda v: v.name in ROLLOUT_BACKENDS,
        require=lambda v: v.engine in ROLLOUT_BACKENDS[v.name].checkpoint_engines,
        message=lambda v: (
            f"{ENGINE}={v.engine!r} cannot feed weights to the {v.name!r} rollout backend; use "
            f"{' or '.join(ROLLOUT_BACKENDS[v.name].checkpoint_engines)} (GPU: rollout.name={VLLM} with backend=nccl; "
            f"CPU: rollout.name={HF} with backend=gloo)."
        ),
    ),
    Rule(
        {"device": "trainer.device", "name": f"{ROLLOUT}.name"},
        when=lambda v: v.name in ROLLOUT_BACKENDS,
        require=lambda v: v.name in rollout_backends_on(v.device),
        message=lambda v: (
            f"trainer.device={v.device!r} with {ROLLOUT}.name={v.name!r}: on {v.device} the rollout "
            f"runs on {' or '.join(rollout_backends_on(v.device))} (the `{HF}` replica is CPU-only; SGLang needs GPUs). "
            f"Use --config-name=one_step_off_ppo_cpu on CPU (rollout.name={HF}, or {VLLM} with the CPU build of vLLM), "
            f"or trainer.device=cuda with rollout.name={VLLM} on GPUs."
        ),
    ),
    _vllm_on_cpu(ROLLOUT),
    Rule(
        {"enable": f"{ELASTIC}.enable", "one_gpu": "async_training.one_gpu"},
        when=lambda v: v.enable,
        require=lambda v: not v.one_gpu,
        message=f"{ELASTIC}.enable=true with async_training.one_gpu=true: both pools share one GPU, so there is no "
        f"room for another replica and nothing to fail over to. Set {ELASTIC}.enable=false.",
    ),
    Rule(
        {"enable": f"{ELASTIC}.enable", "engine": ENGINE},
        when=lambda v: v.enable,
        require=lambda v: v.engine in ELASTIC_CHECKPOINT_ENGINES,
        message=lambda v: (
            f"{ELASTIC}.enable=true with checkpoint_engine.backend={v.engine!r}: only "
            f"{', '.join(ELASTIC_CHECKPOINT_ENGINES)} are known to follow a rollout pool that changes between syncs. "
            f"Use one of them, or {ELASTIC}.enable=false."
        ),
    ),
    Rule(
        {"enable": f"{ELASTIC}.enable", "engine": ENGINE, "nccl": f"{ROLLOUT}.checkpoint_engine.engine_kwargs.nccl"},
        when=lambda v: v.enable and v.engine == "nccl",
        require=lambda v: bool((v.nccl or {}).get("rebuild_group", False)),
        message=f"{ELASTIC}.enable=true with the nccl engine: verl's NCCL engine keeps its group across syncs and "
        "asserts the old world size when a replica leaves or joins. Add "
        f"+{ROLLOUT}.checkpoint_engine.engine_kwargs.nccl.rebuild_group=true (the group is then rebuilt on every "
        "sync: seconds per sync on large pools).",
    ),
    Rule(
        {"partial": PARTIAL, "name": f"{ROLLOUT}.name"},
        when=lambda v: v.partial,
        require=lambda v: v.name in PARTIAL_ROLLOUT_BACKENDS,
        message=lambda v: (
            f"{PARTIAL}=true with {ROLLOUT}.name={v.name!r}: a sync interrupts running requests and "
            f"continues them from their tokens so far, which only {' and '.join(PARTIAL_ROLLOUT_BACKENDS)} are wired "
            f"for here. Use one of them, or {PARTIAL}=false."
        ),
    ),
    Rule(
        {"partial": PARTIAL, "engine": ENGINE},
        when=lambda v: v.partial,
        require=lambda v: v.engine in PARTIAL_ROLLOUT_CHECKPOINT_ENGINES,
        message=lambda v: (
            f"{PARTIAL}=true with checkpoint_engine.backend={v.engine!r}: partial rollout needs a sync "
            "that aborts, loads and resumes the replicas (verl's CheckpointEngineManager); supported: "
            f"{', '.join(PARTIAL_ROLLOUT_CHECKPOINT_ENGINES)}."
        ),
    ),
    Rule(
        {"partial": PARTIAL, "name": f"{ROLLOUT}.name", "policy": f"{ROLLOUT}.scheduling_policy"},
        when=lambda v: v.partial and v.name == VLLM,
        require=lambda v: v.policy == "priority",
        message=lambda v: (
            f"{PARTIAL}=true with vLLM and {ROLLOUT}.scheduling_policy={v.policy!r}: the batches in "
            f"flight share the engine and the oldest must run first. Set {ROLLOUT}.scheduling_policy=priority."
        ),
    ),
    Rule(
        {"partial": PARTIAL, "replay": f"{ROLLOUT}.enable_rollout_routing_replay"},
        when=lambda v: v.partial,
        require=lambda v: not v.replay,
        message=f"{PARTIAL}=true with {ROLLOUT}.enable_rollout_routing_replay=true: the MoE routing of a request "
        "resumed under new weights is not carried across its segments. Use one of the two.",
    ),
    Rule(
        {"partial": PARTIAL, "determinism": f"{ROLLOUT}.full_determinism"},
        when=lambda v: v.partial,
        require=lambda v: not v.determinism,
        message=f"{PARTIAL}=true with {ROLLOUT}.full_determinism=true: a run is reproducible only if every request "
        "sees the same weights, and here a sync interrupts requests at a point that depends on timing. Use one "
        "of the two.",
    ),
    # A reward model runs on a pool of its own, as replicas of a rollout backend verl's reward loop can call.
    Rule(
        {"pool": f"{REWARD_MODEL}.enable_resource_pool", "enable": f"{REWARD_MODEL}.enable"},
        when=lambda v: v.enable,
        require=lambda v: bool(v.pool),
        message=f"{REWARD_MODEL}.enable_resource_pool=false colocates the reward model with the training pool, where "
        "verl scores the batch inside the training step (waking the model between the actor's phases); this recipe "
        "gives the reward model a pool of its own, where it scores each sample as soon as it is generated. Set "
        f"{REWARD_MODEL}.enable_resource_pool=true with {REWARD_MODEL}.n_gpus_per_node and {REWARD_MODEL}.nnodes.",
    ),
    Rule(
        {"path": f"{REWARD_MODEL}.model_path", "enable": f"{REWARD_MODEL}.enable"},
        when=lambda v: v.enable,
        require=lambda v: bool(v.path),
        message=f"{REWARD_MODEL}.model_path is not set: point it at the reward model (a sequence-classification "
        "model, one label: its logit is the reward).",
    ),
    Rule(
        {"name": f"{REWARD_MODEL}.rollout.name", "enable": f"{REWARD_MODEL}.enable", "device": "trainer.device"},
        when=lambda v: v.enable,
        require=lambda v: v.name in rollout_backends_on(v.device),
        message=lambda v: (
            f"{REWARD_MODEL}.rollout.name={v.name!r}: on trainer.device={v.device} verl's reward loop "
            f"scores with a reward model served by {' or '.join(rollout_backends_on(v.device))} (TensorRT-LLM serves no "
            f"reward model in verl 0.9.1). Set {REWARD_MODEL}.rollout.name={rollout_backends_on(v.device)[0]}."
        ),
    ),
    _vllm_on_cpu(f"{REWARD_MODEL}.rollout", enable=f"{REWARD_MODEL}.enable"),
    Rule(
        {
            "name": f"{REWARD_MODEL}.rollout.name",
            "enable": f"{REWARD_MODEL}.enable",
            **{size: f"{REWARD_MODEL}.rollout.{size}" for size in PARALLEL_SIZES},
        },
        when=lambda v: v.enable and v.name == HF,
        require=lambda v: all(v.get(size) == 1 for size in PARALLEL_SIZES),
        message=lambda v: (
            f"{REWARD_MODEL}.rollout.name={HF} serves one process per replica; set "
            + " ".join(f"{REWARD_MODEL}.rollout.{size}=1" for size in PARALLEL_SIZES if v.get(size) != 1)
            + "."
        ),
    ),
    Rule(
        {"enable": f"{REWARD_MODEL}.enable", "one_gpu": "async_training.one_gpu"},
        when=lambda v: v.enable,
        require=lambda v: not v.one_gpu,
        message=f"{REWARD_MODEL}.enable=true with async_training.one_gpu=true: the reward model needs a device of its "
        "own besides the one GPU the actor and the rollout share. Use a layout with a reward pool (trainer.device="
        "cuda without one_gpu), or a reward function.",
    ),
    Rule(
        {"estimator": "algorithm.adv_estimator"},
        require=lambda v: v.estimator not in REFUSED_ESTIMATORS,
        message=lambda v: (
            f"algorithm.adv_estimator={v.estimator}: {REFUSED_ESTIMATORS.get(v.estimator)}; use "
            "algorithm.adv_estimator=grpo, rloo, reinforce_plus_plus, or gae (PPO with a critic on the training pool)."
        ),
    ),
    Rule(  # verl's need_critic: critic.enable when set, else whether the estimator is gae
        {"critic": "critic.enable", "estimator": "algorithm.adv_estimator"},
        when=lambda v: v.estimator == "gae",
        require=lambda v: v.critic is None or bool(v.critic),
        message="critic.enable=False with algorithm.adv_estimator=gae: GAE needs the critic's values (verl would stop "
        "with a KeyError on 'values' after start-up). Set critic.enable=true (or leave it null), or use a critic-free "
        "estimator such as grpo.",
    ),
    # LoRA reaches the replicas only merged into the weights; verl's FSDP actor reads model.lora_rank.
    Rule(
        {"megatron_rank": f"{MODEL}.lora.rank", "strategy": LORA["strategy"]},
        when=lambda v: v.strategy != "megatron",
        require=lambda v: not v.megatron_rank,
        message=lambda v: (
            f"{MODEL}.lora.rank={v.megatron_rank} is Megatron's LoRA key; the {v.strategy} actor reads "
            f"{MODEL}.lora_rank and would train full weights. Set {MODEL}.lora_rank instead (with {MODEL}.lora.merge=true)."
        ),
    ),
    Rule(
        {"adapter": f"{MODEL}.lora_adapter_path", "rank": f"{MODEL}.lora_rank", "strategy": LORA["strategy"]},
        when=lambda v: v.strategy != "megatron",
        require=lambda v: not v.adapter or bool(v.rank),
        message=lambda v: (
            f"{MODEL}.lora_adapter_path={v.adapter} with {MODEL}.lora_rank={v.rank or 0}: the "
            f"{v.strategy} actor loads an adapter only when lora_rank > 0. Set {MODEL}.lora_rank to the adapter's rank "
            f"(with {MODEL}.lora.merge=true)."
        ),
    ),
    Rule(  # the recipe's configs set lora.merge=true: only a launch that sets it false reaches this
        {**LORA, "merge": f"{MODEL}.lora.merge"},
        when=lambda v: bool(_lora(v)),
        require=lambda v: v.merge is True,
        message=lambda v: (
            f"{_lora(v)} with {MODEL}.lora.merge={v.merge}: the weight sync would send the adapters "
            f"under peft's names (...q_proj.lora_A.weight), which the rollout replicas do not load. Set {MODEL}.lora.merge"
            "=true: the actor merges the adapters into the base weights before each sync, and the replicas receive full "
            "weights under the model's own names."
        ),
    ),
    Rule(
        {"save_contents": "actor_rollout_ref.actor.checkpoint.save_contents", **LORA},
        when=lambda v: bool(_lora(v)),
        require=lambda v: "hf_model" not in (v.save_contents or []),
        message=lambda v: (
            f"actor_rollout_ref.actor.checkpoint.save_contents={list(v.save_contents)} with LoRA: verl "
            "0.9.1 writes the Hugging Face export of a LoRA actor from a state dict under peft's names, so the folder "
            "holds the architecture without the trained weights. Drop hf_model from save_contents (the FSDP checkpoint "
            "holds the adapters and resumes), and merge the adapters from it offline."
        ),
    ),
    Rule(
        {"steps": "global_profiler.steps"},
        require=lambda v: not v.steps,
        message=lambda v: (
            f"global_profiler.steps={v.steps}: verl profiles the rollout of step k inside step k, but "
            "here the batch of step k is generated while earlier steps train, so the profile would cover none of its "
            "generation. Unset global_profiler.steps; profile the rollout replicas with the engine's own profiler "
            "instead."
        ),
    ),
    Rule(
        {"log_probs": f"{ROLLOUT}.calculate_log_probs"},
        require=lambda v: bool(v.log_probs),
        message=f"{ROLLOUT}.calculate_log_probs=False: the off-policy correction needs the rollout's log-probs of "
        "every sampled token. Set it to True.",
    ),
)


def validate_config(config: DictConfig) -> AsyncTrainingConfig:
    """Check everything the recipe relies on; return the parsed ``async_training`` section.

    Raises one ``ConfigError`` carrying every problem found: the section's fields, then ``RULES``, then the
    size arithmetic (checks that need a value an earlier check refused are skipped: their problems show once
    it is fixed).
    """
    problems = Problems()
    async_config = problems.run(AsyncTrainingConfig.from_config, config)
    if async_config is None:
        problems.skipped.append("the one-GPU, elastic and partial-rollout checks (they need async_training)")
    check_rules(RULES, config, problems, skip=() if async_config is not None else ("async_training",))
    replicas = _check_sizes(problems, config)
    if async_config is not None and replicas is not None:
        _check_elastic_replicas(problems, async_config.elastic, replicas)
    _check_reward_model_pool(problems, config)
    problems.raise_any()
    return async_config


def _check_sizes(problems: Problems, config: DictConfig) -> int | None:
    """Replica and batch sizes against the pools; return the number of rollout replicas (None: no whole number)."""
    if problems.refused.intersection(POOLS):
        problems.skipped.append("the replica and batch sizes (they need both pools)")
        return None
    if problems.refused.intersection(SIZES):
        problems.skipped.append("the replica and batch sizes against the pools (they need those sizes)")
        return None
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    actor = config.actor_rollout_ref.actor
    rollout_world = math.prod(rollout[size] for size in PARALLEL_SIZES)
    rollout_devices = rollout.nnodes * rollout.n_gpus_per_node
    whole = problems.require(
        rollout_devices % rollout_world == 0,
        f"The rollout pool has {rollout_devices} devices ({ROLLOUT}.nnodes x n_gpus_per_node) but one replica needs "
        f"{rollout_world} (tensor x data x pipeline parallel size); make the pool a multiple of the replica size.",
    )

    actor_world = trainer.nnodes * trainer.n_gpus_per_node
    n = rollout.n
    train_batch = config.data.get("gen_batch_size") or config.data.train_batch_size
    problems.require(
        (train_batch * n) % actor_world == 0,
        f"data.train_batch_size x rollout.n = {train_batch} x {n} = {train_batch * n} samples per step do not "
        f"divide across the {actor_world} actor ranks (trainer.nnodes x trainer.n_gpus_per_node). "
        f"Make data.train_batch_size * {ROLLOUT}.n a multiple of {actor_world}.",
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


def _check_elastic_replicas(problems: Problems, elastic: ElasticConfig, replicas: int) -> None:
    """The elastic pool's bounds against the replicas the run starts with."""
    if not elastic.enable:
        return
    problems.require(
        elastic.min_replicas <= replicas,
        f"{ELASTIC}.min_replicas={elastic.min_replicas} is more than the {replicas} replica(s) the run starts with "
        f"({ROLLOUT}.nnodes x n_gpus_per_node / replica size); lower it.",
    )
    problems.require(
        elastic.max_replicas is None or elastic.max_replicas >= replicas,
        f"{ELASTIC}.max_replicas={elastic.max_replicas} is less than the {replicas} replica(s) the run starts with; "
        "raise it, or set it to null to grow only on the scale command.",
    )


def _check_reward_model_pool(problems: Problems, config: DictConfig) -> None:
    """The reward model's pool holds whole replicas; a reward function set as well is named (it scores instead)."""
    reward_model = config.reward.reward_model
    if not reward_model.enable or f"{REWARD_MODEL}.rollout.name" in problems.refused:
        return
    if config.reward.custom_reward_function.path is not None:
        warnings.warn(
            f"{REWARD_MODEL}.enable=true with reward.custom_reward_function.path="
            f"{config.reward.custom_reward_function.path}: verl scores with the function; the reward model is served "
            "but scores only what the function sends it. Set reward.custom_reward_function.path=null to score with "
            "the reward model.",
            stacklevel=2,
        )
    rollout, key = reward_model.rollout, REWARD_MODEL
    world = math.prod(rollout[size] if _is_count(rollout[size]) else 1 for size in PARALLEL_SIZES)
    sizes = (reward_model.n_gpus_per_node, reward_model.nnodes)
    problems.require(
        all(_is_count(size) for size in sizes) and sizes[0] * sizes[1] >= world and world % min(sizes[0], world) == 0,
        f"{key}.n_gpus_per_node={reward_model.n_gpus_per_node} x {key}.nnodes={reward_model.nnodes} leaves the "
        f"reward model's pool smaller than one replica ({world} device(s): tensor x data x pipeline parallel) or splits "
        f"a replica unevenly over nodes. Set {key}.nnodes and {key}.n_gpus_per_node to hold whole replicas.",
    )
