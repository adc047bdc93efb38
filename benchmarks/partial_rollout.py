"""Partial-rollout benchmark: today's mode against partial rollout on a long-tailed workload, side by side.

What: runs the real entry point on the long-tail task (``--config-name=one_step_off_ppo_cpu_long_tail``:
response lengths lognormal, median 48, p99 about ten times that) once per mode, in rounds
(s1, s1 partial, s2 partial, then again), and reads each run's per-step metrics (verl's ``file``
logger). Steady state is steps ``--warmup``+1..N-1 (the first fill the pipeline, the last has nothing
left to generate). Per mode it prints the median over rounds of:

- steps per minute (wall clock from the first steady step's start to the last one's sync end) and the
  mean split of a step: ``wait`` (the actor idles for its batch), ``train`` and ``sync``;
- rollout tokens per second of engine busy time (tokens sampled / seconds the engines had work);
- slot occupancy: mean sequences sampling per engine step / ``max_num_seqs`` (hardware-independent);
- the versions: token-weighted staleness, share of samples spanning versions, prefill tokens recomputed.

then each mode's ratios to today's mode (s1). Targets (from the issue): occupancy of s2 partial at
least 2x today's, busy-time tokens per second at least 1.8x, steps per minute 1.5x (where the step is
bound by generation; where training bounds it, the split shows it).

``--shape qwen2.5-0.5b`` swaps in a model of Qwen2.5-0.5B's shape with random weights (config written
locally, nothing downloaded) for a run on a GPU profile (``--config-name one_step_off_ppo_1gpu``);
on CPU only the tiny demo model is practical.

How (from the repository root, with the project's virtualenv active):
    python -m benchmarks partial-rollout                        # 2 rounds x 3 modes, 16 steps: ~6 min
    python -m benchmarks partial-rollout --rounds 1 --steps 12
    python -m benchmarks partial-rollout -- actor_rollout_ref.rollout.n=8      # hydra overrides for all
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks import argument_parser
from recipe.one_step_off_async import runs

MODES = {
    "s1": ("async_training.staleness=1", "async_training.partial_rollout=false"),
    "s1 partial": ("async_training.staleness=1", "async_training.partial_rollout=true"),
    "s2 partial": ("async_training.staleness=2", "async_training.partial_rollout=true"),
}
BASELINE = "s1"
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


def run_mode(directory: Path, config_name: str, steps: int, mode: tuple[str, ...], extra: list[str]) -> dict[int, dict]:
    overrides = [
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *mode,
        *extra,
    ]
    return runs.run(directory, *overrides, profile=config_name).check(" ".join(mode)).metrics


def summarize(by_step: dict[int, dict], warmup: int) -> dict[str, float]:
    steady = [by_step[step] for step in sorted(by_step) if warmup < step < max(by_step)]
    wall = steady[-1]["timeline/sync_end"] - steady[0]["timeline/step_start"]
    total = lambda key: sum(m.get(key, 0.0) for m in steady)  # noqa: E731
    mean = lambda key: total(key) / len(steady)  # noqa: E731
    return {
        "steps_per_min": 60 * len(steady) / wall,
        "wait_s": mean("timing_s/wait_prev_gen"),
        "train_s": mean("timing_s/train"),
        "sync_s": mean("timing_s/sync_weights"),
        "busy_tokens_per_s": total("rollout/tokens") / total("rollout/busy_s"),
        "occupancy": total("rollout/tokens") / total("rollout/slot_steps"),
        "staleness_mean": mean("async/staleness_mean"),
        "partial_ratio": mean("async/partial_ratio"),
        "recomputed_prefill": mean("async/recomputed_prefill_tokens"),
    }


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--config-name", default="one_step_off_ppo_cpu_long_tail")
    parser.add_argument("--shape", choices=["demo", "qwen2.5-0.5b"], default="demo")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every run (after --)")
    args = parser.parse_args(argv)

    root = args.out or Path(tempfile.mkdtemp(prefix="bench_partial_rollout-"))
    extra = list(args.overrides)
    if args.shape != "demo":
        extra.append(f"actor_rollout_ref.model.path={write_shape_model(root)}")
    if args.config_name != "one_step_off_ppo_cpu_long_tail":  # a GPU profile: point it at the long-tail task
        from recipe.one_step_off_async.demo.assets import ensure_assets
        from recipe.one_step_off_async.demo.long_tail import MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH

        assets = ensure_assets()
        extra = [
            f"data.train_files={assets.long_tail_train_file}",
            f"data.val_files={assets.long_tail_val_file}",
            f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
            f"data.max_response_length={MAX_RESPONSE_LENGTH}",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={assets.long_tail_agent_loop_config}",
            f"reward.custom_reward_function.path={assets.reward_path}",
            *extra,
        ]

    results: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
    for round_index in range(args.rounds):
        for name, mode in MODES.items():
            directory = root / f"round{round_index}" / name.replace(" ", "_")
            summary = summarize(run_mode(directory, args.config_name, args.steps, mode, extra), args.warmup)
            results[name].append(summary)
            print(f"round {round_index + 1} {name:>10}: " + ", ".join(f"{k} {v:.3g}" for k, v in summary.items()))

    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()
    }
    print(
        f"\nMedians over {args.rounds} round(s), steps {args.warmup + 1}..{args.steps - 1} of {args.steps} (runs in {root}):"
    )
    header = f"{'mode':>10} | steps/min | wait s | train s | sync s | busy tok/s | occupancy | staleness | partial | recomputed"
    print(header + "\n" + "-" * len(header))
    for name, m in medians.items():
        print(
            f"{name:>10} | {m['steps_per_min']:9.1f} | {m['wait_s']:6.2f} | {m['train_s']:7.2f} | {m['sync_s']:6.3f} | "
            f"{m['busy_tokens_per_s']:10.0f} | {m['occupancy']:9.3f} | {m['staleness_mean']:9.2f} | "
            f"{m['partial_ratio']:7.3f} | {m['recomputed_prefill']:10.0f}"
        )
    base = medians[BASELINE]
    print(f"\nRatios to {BASELINE} (today's mode):")
    for name, m in medians.items():
        if name != BASELINE:
            print(
                f"{name:>10}: steps/min x{m['steps_per_min'] / base['steps_per_min']:.2f}, busy tokens/s "
                f"x{m['busy_tokens_per_s'] / base['busy_tokens_per_s']:.2f}, occupancy x{m['occupancy'] / base['occupancy']:.2f}"
            )
