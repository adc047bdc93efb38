"""Partial-rollout benchmark: today's mode against partial rollout where generation bounds the step, side by side.

What: runs the real entry point on the generation-bound profile (``--config-name=
one_step_off_ppo_cpu_generation_bound``: each sample draws its own response budget, median 32 tokens, p99 at
the 480-token cap; 8 samples per step; one cheap update per step) once per mode, in rounds (s1, s1 partial,
s2 partial, s4 partial, then again), with the same settings in every mode, and reads each run's per-step
metrics (verl's ``file`` logger). Steady state is steps ``--warmup``+1..N-1 (the first fill the pipeline,
the last has nothing left to generate). Per mode it prints the median over rounds of:

- steps per minute (wall clock from the first steady step's start to the last one's sync end) and the
  mean split of a step: ``wait`` (the actor idles for its batch), ``train``, ``sync`` and the sync's abort
  of the requests in flight (``abort``), and ``gen``: a batch's generation time, admission to last token;
- slot occupancy (mean sequences sampling per engine step / ``max_num_seqs``) and the running rows per
  engine step; on the ``hf`` engine also its time per engine step, its busy share of a step and its tokens
  per second of busy time (vLLM reports no busy time);
- the versions: token-weighted staleness, share of samples spanning versions, prefill tokens recomputed.

Then the bound. In today's mode a batch is generated within one step window, between two syncs; the actor
does ``A = T - w`` per step (training, the sync ``S``, the trainer's own work) and waits ``w`` for the batch
(``T`` the step). In partial mode at staleness ``s`` the tokens of batch ``k`` may be sampled from the sync
that admits it until step ``k`` starts training: ``s`` steps, less the ``s`` syncs during which the engines
pause, plus the wait ``w'``. Its longest sample still needs ``G`` of engine time (today's generation time of a
batch), so ``s (T' - S) + w' >= G`` with ``T' = A + w'``: the step is at least
``A + max(0, (G - s (A - S)) / (s + 1))``, and today's ``T`` over that is the most steps per minute the mode
can gain, if the actor's own time stays ``A`` and a sample generates no slower beside more batches in flight
(an upper bound: on CPU neither holds exactly). The benchmark computes it per mode from today's measured
split and prints it beside the measured gain, the fraction reached, and its targets (partial s=2 at least
1.3x today's steps per minute and 0.75 of its bound, partial s=4 at least 1.5x). It also prints whether the
workload is generation-bound on this machine: in today's mode the actor waits for at least half of each step.

``--engine vllm`` runs every mode on vLLM's CPU build through verl's vLLM path (``scheduling_policy=priority``,
which partial rollout needs there, in every mode). ``--shape qwen2.5-0.5b`` swaps in a model of
Qwen2.5-0.5B's shape with random weights (config written locally, nothing downloaded) for a run on a GPU
profile (``--config-name one_step_off_ppo_1gpu``, pointed at the heavy-tail task); on CPU only the tiny
demo model is practical. Another CPU profile runs its own task (``--config-name one_step_off_ppo_cpu_long_tail``:
the training-bound long-tail workload).

How (from the repository root, with the project's virtualenv active):
    python -m benchmarks partial-rollout                    # 3 rounds x 4 modes, 70 steps: ~25 min on hf
    python -m benchmarks partial-rollout --engine vllm      # the same on vLLM's CPU build: ~45 min
    python -m benchmarks partial-rollout --rounds 1 --steps 30 -- actor_rollout_ref.rollout.n=8
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks import argument_parser
from recipe.one_step_off_async import runs

PROFILE = "one_step_off_ppo_cpu_generation_bound"
CPU_PROFILE_PREFIX = "one_step_off_ppo_cpu"  # the CPU profiles bring their own task (the long-tail one, for one)
MODES = {
    "s1": ("async_training.staleness=1", "async_training.partial_rollout=false"),
    "s1 partial": ("async_training.staleness=1", "async_training.partial_rollout=true"),
    "s2 partial": ("async_training.staleness=2", "async_training.partial_rollout=true"),
    "s4 partial": ("async_training.staleness=4", "async_training.partial_rollout=true"),
}
BASELINE = "s1"
ENGINES = {
    "hf": (),
    # Priority scheduling, which partial rollout needs on vLLM; the scheduler statistics behind the occupancy.
    "vllm": (
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.scheduling_policy=priority",
        "actor_rollout_ref.rollout.disable_log_stats=false",
    ),
}
GENERATION_BOUND_WAIT_SHARE = 0.5  # today's wait / step at s=1 from which the profile counts as generation-bound
# The benchmark's targets: (mode, least steps-per-minute gain over today's mode, least fraction of its bound)
TARGETS = (("s2 partial", 1.3, 0.75), ("s4 partial", 1.5, None))
# Qwen2.5-0.5B's architecture (its config.json), written locally; the weights are random.
QWEN2_5_0_5B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class StepSplit:
    """Today's mode's steady step: its period ``T``, the actor's wait ``w`` and sync ``S`` in it, and a batch's
    generation time ``G``."""

    period_s: float
    wait_s: float
    sync_s: float
    gen_s: float

    @property
    def actor_s(self) -> float:
        """``A``: what the actor does per step besides waiting (training, sync, the trainer's own work)."""
        return self.period_s - self.wait_s


def partial_gain_bound(today: StepSplit, staleness: int) -> float:
    """The most steps per minute partial rollout at ``staleness`` can gain over today's mode (see the module doc).

    Batch k's longest sample needs ``G`` of engine time within ``s`` steps less their syncs, plus the wait ``w'``
    before step k trains: ``s (A - S + w') + w' >= G``, so the step is at least
    ``A + max(0, (G - s (A - S)) / (s + 1))``.
    """
    wait = max(0.0, (today.gen_s - staleness * (today.actor_s - today.sync_s)) / (staleness + 1))
    return today.period_s / (today.actor_s + wait)


def staleness_of(mode: tuple[str, ...]) -> int:
    (value,) = [override.split("=", 1)[1] for override in mode if override.startswith("async_training.staleness=")]
    return int(value)


def write_shape_model(directory: Path) -> Path:
    """A Qwen2.5-0.5B-shaped model with random weights and the demo tokenizer (its ids fit the vocabulary)."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from recipe.one_step_off_async.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        **QWEN2_5_0_5B,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    path = directory / "qwen2.5-0.5b-shape"
    Qwen2ForCausalLM(config).save_pretrained(path)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def heavy_tail_task() -> list[str]:
    """Overrides that point a GPU profile at the generation-bound profile's task, cheap training and rollout slots
    (a test checks them against that profile)."""
    from recipe.one_step_off_async.demo.assets import ensure_assets
    from recipe.one_step_off_async.demo.long_tail import MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH

    assets = ensure_assets()
    return [
        f"data.train_files={assets.heavy_tail_train_file}",
        f"data.val_files={assets.heavy_tail_val_file}",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={MAX_RESPONSE_LENGTH}",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
        "actor_rollout_ref.rollout.max_num_seqs=32",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={assets.long_tail_agent_loop_config}",
        f"reward.custom_reward_function.path={assets.reward_path}",
    ]


def rollout_slots(config_name: str, overrides: list[str]) -> int:
    """``actor_rollout_ref.rollout.max_num_seqs`` of the composed profile: occupancy's denominator."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        config = compose(config_name=config_name, overrides=overrides)
    return int(config.actor_rollout_ref.rollout.max_num_seqs)


def run_mode(directory: Path, config_name: str, steps: int, mode: tuple[str, ...], extra: list[str]) -> dict[int, dict]:
    overrides = [
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *mode,
        *extra,
    ]
    return runs.run(directory, *overrides, profile=config_name).check(" ".join(mode)).metrics


def summarize(by_step: dict[int, dict], warmup: int, slots: int) -> dict[str, float]:
    steady = [by_step[step] for step in sorted(by_step) if warmup < step < max(by_step)]
    wall = steady[-1]["timeline/sync_end"] - steady[0]["timeline/step_start"]
    total = lambda key: sum(m.get(key, 0.0) for m in steady)  # noqa: E731
    mean = lambda key: total(key) / len(steady)  # noqa: E731
    engine_steps = total("rollout/slot_steps") / slots
    if not engine_steps:
        raise SystemExit(
            "the run logged no rollout/slot_steps: on vLLM set actor_rollout_ref.rollout.disable_log_stats=false "
            "(the CPU profiles do), so that the engines' statistics reach the trainer"
        )
    summary = {
        "steps_per_min": 60 * len(steady) / wall,
        "step_s": wall / len(steady),
        "wait_s": mean("timing_s/wait_prev_gen"),
        "train_s": mean("timing_s/train"),
        "sync_s": mean("timing_s/sync_weights"),
        "abort_s": mean("timing_s/sync/abort"),
        "gen_s": mean("timing_s/gen"),
        "occupancy": total("rollout/tokens") / total("rollout/slot_steps"),
        "rows_per_engine_step": total("rollout/tokens") / engine_steps,
        "staleness_mean": mean("async/staleness_mean"),
        "partial_ratio": mean("async/partial_ratio"),
        "recomputed_prefill": mean("async/recomputed_prefill_tokens"),
    }
    if total("rollout/busy_s"):  # the hf engine counts its busy time; vLLM does not
        summary |= {
            "ms_per_engine_step": 1000 * total("rollout/busy_s") / engine_steps,
            "engine_busy_share": total("rollout/busy_s") / wall,
            "busy_tokens_per_s": total("rollout/tokens") / total("rollout/busy_s"),
        }
    return summary


def report(medians: dict[str, dict[str, float]], engine: str) -> None:
    base = medians[BASELINE]
    today = StepSplit(period_s=base["step_s"], wait_s=base["wait_s"], sync_s=base["sync_s"], gen_s=base["gen_s"])
    wait_share = today.wait_s / today.period_s
    verdict = "generation-bound" if wait_share >= GENERATION_BOUND_WAIT_SHARE else "NOT generation-bound"
    print(
        f"\nToday's mode at s=1 ({engine}): step {today.period_s:.2f} s = actor {today.actor_s:.2f} s + wait "
        f"{today.wait_s:.2f} s ({wait_share:.0%} of the step: {verdict}); a batch generates in {today.gen_s:.2f} s"
    )
    header = (
        f"{'mode':>10} | steps/min | step s | wait s | train s | sync s | abort s | gen s | occupancy | rows/step | "
        "ms/engine step | engine busy | busy tok/s | staleness | spanning | recomputed"
    )
    print(header + "\n" + "-" * len(header))
    for name, m in medians.items():
        hf_only = (
            f"{m['ms_per_engine_step']:14.2f} | {m['engine_busy_share']:11.2f} | {m['busy_tokens_per_s']:10.0f}"
            if "busy_tokens_per_s" in m
            else f"{'-':>14} | {'-':>11} | {'-':>10}"
        )
        print(
            f"{name:>10} | {m['steps_per_min']:9.1f} | {m['step_s']:6.2f} | {m['wait_s']:6.2f} | {m['train_s']:7.2f} | "
            f"{m['sync_s']:6.3f} | {m['abort_s']:7.3f} | {m['gen_s']:5.2f} | {m['occupancy']:9.3f} | "
            f"{m['rows_per_engine_step']:9.1f} | {hf_only} | {m['staleness_mean']:9.2f} | {m['partial_ratio']:8.3f} | "
            f"{m['recomputed_prefill']:10.0f}"
        )
    print(f"\nGains over {BASELINE} (today's mode), and the bound today's split allows:")
    gains = {}
    for name, m in medians.items():
        if name == BASELINE:
            continue
        gains[name] = gain = m["steps_per_min"] / base["steps_per_min"]
        bound = partial_gain_bound(today, staleness_of(MODES[name]))
        print(
            f"{name:>10}: steps/min x{gain:.2f} (bound x{bound:.2f}, {gain / bound:.2f} of it), "
            f"occupancy x{m['occupancy'] / base['occupancy']:.2f}"
        )
    print("\nTargets:")
    for name, least_gain, least_fraction in TARGETS:
        bound = partial_gain_bound(today, staleness_of(MODES[name]))
        checks = [f"x{gains[name]:.2f} >= x{least_gain}: {'met' if gains[name] >= least_gain else 'NOT met'}"]
        if least_fraction is not None:
            fraction = gains[name] / bound
            checks.append(
                f"{fraction:.2f} of the bound >= {least_fraction}: {'met' if fraction >= least_fraction else 'NOT met'}"
            )
        print(f"{name:>10}: " + "; ".join(checks))


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--warmup", type=int, default=9, help="steps left out of the steady state (default: 1-9)")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="hf")
    parser.add_argument("--config-name", default=PROFILE)
    parser.add_argument("--shape", choices=["demo", "qwen2.5-0.5b"], default="demo")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every run (after --)")
    args = parser.parse_args(argv)

    root = args.out or Path(tempfile.mkdtemp(prefix="bench_partial_rollout-"))
    extra = [*ENGINES[args.engine], *args.overrides]
    if args.shape != "demo":
        extra.append(f"actor_rollout_ref.model.path={write_shape_model(root)}")
    if not args.config_name.startswith(CPU_PROFILE_PREFIX):  # a GPU profile (vLLM): point it at this profile's task
        extra = [*heavy_tail_task(), *ENGINES["vllm"], *extra]
    slots = rollout_slots(args.config_name, [override for override in extra if not override.startswith("+")])

    results: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
    for round_index in range(args.rounds):
        for name, mode in MODES.items():
            directory = root / f"round{round_index}" / name.replace(" ", "_")
            summary = summarize(run_mode(directory, args.config_name, args.steps, mode, extra), args.warmup, slots)
            results[name].append(summary)
            print(f"round {round_index + 1} {name:>10}: " + ", ".join(f"{k} {v:.3g}" for k, v in summary.items()))

    medians = {
        name: {key: statistics.median(r[key] for r in runs_) for key in runs_[0]} for name, runs_ in results.items()
    }
    print(
        f"\nMedians over {args.rounds} round(s), steps {args.warmup + 1}..{args.steps - 1} of {args.steps} (runs in {root}):"
    )
    report(medians, args.engine)
