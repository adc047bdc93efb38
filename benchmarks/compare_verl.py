"""verl's own one-step-off trainer and this recipe side by side on CPU: validation, resume, steps per minute.

What validation scores, what a resume trains next, and steps per minute: the measurements behind "Why this
recipe" in the docs.

What: runs verl 0.9.1's ``verl.experimental.one_step_off_policy.main_ppo`` and the recipe's ``main_ppo`` on
the built-in task with the same settings (the CPU profile's model, data, batch, learning rate; both on the
recipe's CPU platform, ``hf`` replica and ``gloo`` weight sync, which is the only way verl's trainer runs on
CPU), three runs each:

1. four steps at a learning rate high enough that one update changes greedy answers (``BIG_LR``), greedy
   validation before training and after every step, a checkpoint at step 2: after each step, are the
   validation answers those of the weights before training? With the weights just trained they change at the
   first step whose update is not zero (grad norm > 0; a batch whose every group has one reward has none);
   with the rollout's weights, one update later.
2. a resume from that step-2 checkpoint: does it train at step 3 the prompts the run trained at step 3?
3. ``--steps`` steps without validation: steps per minute, with the median step time after step 2.

Why: claims about verl's trainers are measured, not read off their code.

How: ``python -m benchmarks compare-verl [--steps 20] [--out outputs/compare_verl]`` (about ten minutes on 2
cores; an idle machine for the timing). verl's trainer fails at its first data dump in 0.9.1
(``_dump_executor`` never created); ``benchmarks/verl_one_step_off_dumps.py``, loaded into its processes,
creates it. verl's V1 ``separate_async`` trainer is not part of it: it needs the TransferQueue package (verl's
``verl-core`` extra) and a GPU weight-sync backend.
"""

from __future__ import annotations

import os
import shutil
import statistics
from pathlib import Path

from benchmarks import argument_parser
from recipe.one_step_off_async import runs
from recipe.one_step_off_async.demo.assets import ensure_assets
from recipe.one_step_off_async.platforms import cpu

TASK = "val-core/one_step_off_async/sort_letters/acc/mean@1"
# The first run's learning rate: one update at the profile's 1e-4 changes no greedy answer of the tiny model,
# one at 1e-2 changes many, so the answers show which weights a validation used.
BIG_LR = 1e-2
# What the recipe's CPU profile sets and verl's one-step-off config lacks (its defaults are GPU's).
VERL_ON_CPU = [
    "hydra.searchpath=[pkg://verl.trainer.config]",  # its yaml finds ppo_trainer relative to the working dir
    "trainer.device=cpu",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.name=hf",
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
# trainer: (module, config name (None: the module's own), overrides)
TRAINERS = {
    "verl one_step_off_policy": ("verl.experimental.one_step_off_policy.main_ppo", None, VERL_ON_CPU),
    "recipe": (runs.ENTRY_MODULE, "one_step_off_ppo_cpu", []),
}
# Loaded into every process of verl's run (its Ray workers too): starts the data-dump executor verl never starts.
DUMPS_PATCH = "benchmarks.verl_one_step_off_dumps"


def run(trainer: str, directory: Path, overrides: list[str]) -> runs.Run:
    """One run in a new ``directory``, its batches and validations dumped there."""
    module, profile, own = TRAINERS[trainer]
    directory.mkdir(parents=True)
    env = {}
    if profile is None:  # verl's trainer: the task's files, what the recipe's launch gives its workers (the
        # plugin, the CPU platform), and the patch without which it fails at its first data dump
        own = [*own, *ensure_assets().verl_overrides()]
        env.update(cpu.env_vars())
        env["VERL_USE_EXTERNAL_MODULES"] = f"recipe.one_step_off_async.verl_plugin,{DUMPS_PATCH}"
        # The runs start in folders of their own: the repository root (where this package is) on their path.
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
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
    parser.add_argument("--out", type=Path, default=Path("outputs/compare_verl"))
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # the runs start in folders of their own
    if args.out.exists():
        shutil.rmtree(args.out)

    for trainer in TRAINERS:
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
        steps = [timed[step]["timing_s/step"] for step in sorted(timed) if step > 2 and "timing_s/step" in timed[step]]
        median = statistics.median(steps)
        print(f"  steps {3}-{args.steps}: median step {median:.2f} s, {60 / median:.1f} steps/min")
