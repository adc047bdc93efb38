"""Partial-rollout benchmark: whole-batch mode against partial rollout where generation bounds the step, side by side.

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
  engine step, from vLLM's scheduler statistics;
- the versions: token-weighted staleness, share of samples spanning versions, prefill tokens recomputed.

Then the bound. In whole-batch mode a batch is generated within one step window, between two syncs; the actor
does ``A = T - w`` per step (training, the sync ``S``, the trainer's own work) and waits ``w`` for the batch
(``T`` the step). In partial mode at staleness ``s`` the tokens of batch ``k`` may be sampled from the sync
that admits it until step ``k`` starts training: ``s`` steps, less the ``s`` syncs during which the engines
pause, plus the wait ``w'``. Its longest sample still needs ``G`` of engine time (whole-batch mode's generation time of a
batch), so ``s (T' - S) + w' >= G`` with ``T' = A + w'``: the step is at least
``A + max(0, (G - s (A - S)) / (s + 1))``, and whole-batch mode's ``T`` over that is the most steps per minute the mode
can gain, if the actor's own time stays ``A`` and a sample generates no slower beside more batches in flight
(an upper bound: on CPU neither holds exactly).

With one ``G`` for every batch (the mean split) that bound is loose where ``G`` varies: a batch that holds a
sample at the cap needs more than ``s`` steps of engine time and the actor waits for it, while a short batch
cannot bank the spare time for later (the actor's own time is a floor). So the benchmark also computes the bound
per batch: it replays the whole-batch run step by step under the same assumptions (each step's own time and sync as
measured, each batch's measured ``G_k`` of engine time from the sync that admits it, the engines paused during
syncs) and reads the period it gives each staleness; the same replay of whole-batch mode gives its measured period
back (printed, as a check). The targets (partial s=2 at least 1.3x whole-batch mode's steps per minute and 0.75 of its bound
per batch, partial s=4 at least 1.5x) are printed with both bounds and the fraction of each reached. It also
prints whether the workload is generation-bound on this machine: in whole-batch mode the actor waits for at least
half of each step.

``--verl-v1`` adds verl 0.9.1's V1 trainer in its ``separate_async`` mode, the peer with partial rollout, on the
same composed profile and settings (``python -m benchmarks compare-verl`` says what it needs and how the
benchmark provides it), as a mode of its own in each round: its steps per minute from the wall clock (when each
step's metrics reach the file), its split (wait, update, sync), the staleness it trained (``(step - 1) -
min_global_steps`` per trajectory: the oldest weights in it) and the versions per trajectory, and the groups its
bound dropped. It runs with ``async_training.partial_rollout=true``, which its client reads: with false it ends a
request at the first sync that aborts it and trains what was sampled so far as the whole response. Its replay
buffer looks for a ready batch every 2 s (``poll_interval``, not in its config): a step that does not find one at
once waits 2 s or more (the report counts those steps).

Every mode runs on vLLM (its CPU build on the CPU profiles) with ``scheduling_policy=priority``, which partial
rollout needs there, so that the modes differ in nothing else. ``--shape qwen2.5-0.5b`` swaps in a model of
Qwen2.5-0.5B's shape with random weights (config written locally, nothing downloaded) for a run on a GPU
profile (``--config-name one_step_off_ppo_1gpu``, pointed at the heavy-tail task); on CPU only the tiny
demo model is practical. Another CPU profile runs its own task (``--config-name one_step_off_ppo_cpu_long_tail``:
the training-bound long-tail workload).

How (from the repository root, with the project's virtualenv active):
    python -m benchmarks partial-rollout --steps 60             # 3 rounds x 4 modes: ~34 min
    python -m benchmarks partial-rollout --steps 60 --verl-v1   # and verl's V1 in each round: ~44 min
    python -m benchmarks partial-rollout --rounds 1 --steps 30 -- actor_rollout_ref.rollout.n=8
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks import argument_parser, compare_verl
from recipe.one_step_off_async import config as config_package
from recipe.one_step_off_async import runs

if TYPE_CHECKING:
    from omegaconf import DictConfig

PROFILE = "one_step_off_ppo_cpu_generation_bound"
CPU_PROFILE_PREFIX = "one_step_off_ppo_cpu"  # the CPU profiles bring their own task (the long-tail one, for one)
MODES = {
    "s1": ("async_training.staleness=1", "async_training.partial_rollout=false"),
    "s1 partial": ("async_training.staleness=1", "async_training.partial_rollout=true"),
    "s2 partial": ("async_training.staleness=2", "async_training.partial_rollout=true"),
    "s4 partial": ("async_training.staleness=4", "async_training.partial_rollout=true"),
}
BASELINE = "s1"
# Every run, in every mode: priority scheduling, which partial rollout needs on vLLM (whole-batch mode too, so that the
# modes differ in nothing else), and vLLM's scheduler statistics behind the occupancy (the CPU profiles keep them,
# the GPU profiles do not).
VLLM_SETTINGS = (
    "actor_rollout_ref.rollout.scheduling_policy=priority",
    "actor_rollout_ref.rollout.disable_log_stats=false",
)
GENERATION_BOUND_WAIT_SHARE = (
    0.5  # whole-batch mode's wait / step at s=1 from which the profile counts as generation-bound
)
# The benchmark's targets: (mode, least steps-per-minute gain over whole-batch mode, least fraction of its bound per batch)
TARGETS = (("s2 partial", 1.3, 0.75), ("s4 partial", 1.5, None))
# verl's V1 separate_async on the same composed profile (--verl-v1).
VERL_V1_OVERRIDES = (
    *compare_verl.V1_SEPARATE_ASYNC,
    # verl's client resumes a request that a sync aborted only when this reads true (verl/workers/rollout/llm_server.py)
    "async_training.partial_rollout=true",
    "ray_kwargs.ray_init.num_cpus=32",  # its task runner asks for 10 of Ray's CPUs
)
# Where verl's main_ppo finds the recipe's profile: hydra looks for the primary config there, not in hydra.searchpath.
# An option, so it goes after the overrides (hydra's parser takes them as one run of positional arguments).
PROFILES_DIR_OPTION = f"--config-dir={Path(config_package.__file__).parent}"
V1_WAIT, V1_SYNC = compare_verl.STEP_PARTS[compare_verl.VERL_V1]
V1_STEP_PARTS = {"wait_s": V1_WAIT, "update_s": "timing_s/update_actor", "sync_s": V1_SYNC}
V1_STALENESS_MEAN, V1_STALENESS_MAX = compare_verl.STALENESS[compare_verl.VERL_V1]
V1_SPANS = "training/off_policy/trajectory_spans/mean"  # versions that sampled a trajectory's tokens, mean per step
V1_POLL_S = 2.0  # how often V1's replay buffer looks for a ready batch (ReplayBuffer.poll_interval's default)
DEMO_ASSET = "${demo_asset:"
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
    """Whole-batch mode's steady step: its period ``T``, the actor's wait ``w`` and sync ``S`` in it, and a batch's
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
    """The most steps per minute partial rollout at ``staleness`` can gain over whole-batch mode (see the module doc).

    Batch k's longest sample needs ``G`` of engine time within ``s`` steps less their syncs, plus the wait ``w'``
    before step k trains: ``s (A - S + w') + w' >= G``, so the step is at least
    ``A + max(0, (G - s (A - S)) / (s + 1))``.
    """
    wait = max(0.0, (today.gen_s - staleness * (today.actor_s - today.sync_s)) / (staleness + 1))
    return today.period_s / (today.actor_s + wait)


def steady_steps(by_step: dict[int, dict], warmup: int) -> list[int]:
    """Steps ``warmup``+1 .. N-1 of a run of N: the first fill the pipeline, the last has nothing left to generate."""
    return [step for step in sorted(by_step) if warmup < step < max(by_step)]


@dataclass(frozen=True)
class BatchStep:
    """One step of whole-batch mode, as the per-batch bound replays it: the generation time of the batch it trains
    (``G_k``, admission to last token, alone in the engine) and of the next one (generated during this step), the
    actor's own time besides the sync, the sync."""

    gen_s: float
    next_gen_s: float
    own_s: float
    sync_s: float


def batch_steps(by_step: dict[int, dict]) -> dict[int, BatchStep]:
    """Whole-batch mode's steps, each but the last (its period ends where the next step starts)."""
    steps = sorted(step for step in by_step if "timeline/step_start" in by_step[step])
    series = {}
    for step, following in itertools.pairwise(steps):
        m = by_step[step]
        sync = m["timeline/sync_end"] - m["timeline/sync_start"]
        period = by_step[following]["timeline/step_start"] - m["timeline/step_start"]
        own = period - m["timing_s/wait_prev_gen"] - sync
        series[step] = BatchStep(m["timing_s/gen"], by_step[following]["timing_s/gen"], own, sync)
    return series


def engine_time_done(start: float, needed: float, pauses: list[tuple[float, float]]) -> float:
    """When a batch admitted at ``start`` has had ``needed`` seconds of engine time, the engine paused in ``pauses``
    (ordered intervals: the syncs)."""
    now, left = start, needed
    for pause_start, pause_end in pauses:
        if pause_end <= now:
            continue
        if pause_start >= now + left:
            break
        left -= max(0.0, pause_start - now)
        now = pause_end
    return now + left


def replay_step_ends(series: dict[int, BatchStep], staleness: int | None) -> dict[int, float]:
    """When each step of ``series`` ends (its sync and the trainer's own work done: the next step can start),
    replayed under the bound's assumptions: every step's own time and sync as measured, every batch needing its
    measured engine time ``G_k`` however many batches share the engine (a decode step flat in rows), the engine
    paused during syncs.

    ``staleness=None`` replays whole-batch mode at s=1: batch k+1 starts when step k-1 ends, and step k syncs once its
    own work is done and batch k+1 has finished. Partial rollout at ``staleness`` s: batch k starts when step
    k-s-1 ends, runs across syncs, and step k trains once step k-1 has ended and batch k has finished.
    """
    first = min(series)
    ends = {first - 1: 0.0}
    pauses: list[tuple[float, float]] = []
    for step, batch in sorted(series.items()):
        if staleness is None:
            ends[step] = ends[step - 1] + max(batch.own_s, batch.next_gen_s) + batch.sync_s
        else:
            done = engine_time_done(ends.get(step - staleness - 1, 0.0), batch.gen_s, pauses)
            ends[step] = max(ends[step - 1], done) + batch.own_s + batch.sync_s
            pauses.append((ends[step] - batch.sync_s, ends[step]))
    return ends


def per_batch_bounds(by_step: dict[int, dict], warmup: int, staleness_values: list[int]) -> dict[str, float]:
    """The bound per batch from one run of whole-batch mode (one round's draw of batches): the period the replay gives
    whole-batch mode over its steady steps against the period it gives partial rollout at each staleness
    (``bound_s<s>``; a time the replay leaves out is left out of both), and the measured period beside the
    replayed one (``measured_step_s``, ``replayed_step_s``: the check that the replay is the whole-batch run)."""
    series = batch_steps(by_step)
    steady = steady_steps(by_step, warmup)
    measured = statistics.fmean(
        by_step[step + 1]["timeline/step_start"] - by_step[step]["timeline/step_start"] for step in steady
    )

    def period(ends: dict[int, float]) -> float:
        return (ends[steady[-1]] - ends[steady[0] - 1]) / len(steady)

    replayed = period(replay_step_ends(series, None))
    bounds = {f"bound_s{s}": replayed / period(replay_step_ends(series, s)) for s in staleness_values}
    return bounds | {"measured_step_s": measured, "replayed_step_s": replayed}


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


def compose_profile(config_name: str, overrides: list[str]) -> DictConfig:
    """The profile as the launch composes it, the demo's asset paths resolvable."""
    from hydra import compose, initialize_config_module

    from recipe.one_step_off_async.demo.assets import register_resolver

    register_resolver()
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        return compose(config_name=config_name, overrides=[o for o in overrides if not o.startswith("+")])


def rollout_slots(config_name: str, overrides: list[str]) -> int:
    """``actor_rollout_ref.rollout.max_num_seqs`` of the composed profile: occupancy's denominator."""
    return int(compose_profile(config_name, overrides).actor_rollout_ref.rollout.max_num_seqs)


def resolved_demo_assets(config_name: str, overrides: list[str]) -> list[str]:
    """Each ``${demo_asset:...}`` path of the composed profile as an override with its value. verl's V1 trainer
    resolves its config in a Ray worker, where the resolver that the profile's hydra callback registers in the
    driver does not exist."""
    from omegaconf import OmegaConf

    config = compose_profile(config_name, overrides)
    found: list[str] = []

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, str) and DEMO_ASSET in node:  # none sits in a list (a test checks the composed config)
            key = prefix.removesuffix(".")
            found.append(f"{key}={OmegaConf.select(config, key)}")

    walk(OmegaConf.to_container(config, resolve=False), "")
    return found


def run_mode(directory: Path, config_name: str, steps: int, mode: tuple[str, ...], extra: list[str]) -> dict[int, dict]:
    overrides = [
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *mode,
        *extra,
    ]
    return runs.run(directory, *overrides, profile=config_name).check(" ".join(mode)).metrics


def run_verl_v1(
    directory: Path, config_name: str, steps: int, extra: list[str]
) -> tuple[dict[int, dict], dict[int, float]]:
    """verl's V1 separate_async on the composed profile: its metrics by step, and when each step's first line reached
    the metrics file (``time.monotonic``; its loop logs a step once it is done, so the gaps are its wall-clock steps)."""
    overrides = [
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *resolved_demo_assets(config_name, extra),
        *VERL_V1_OVERRIDES,
        *extra,
        PROFILES_DIR_OPTION,
    ]
    launch = runs.start(
        directory,
        *overrides,
        profile=config_name,
        env=compare_verl.verl_env(compare_verl.VERL_V1),
        module="verl.trainer.main_ppo",
    )
    logged_at: dict[int, float] = {}
    metrics_file = directory / runs.METRICS
    lines_read = 0

    def stamp() -> None:
        nonlocal lines_read
        lines = metrics_file.read_bytes().split(b"\n")[:-1] if metrics_file.exists() else []  # whole lines only
        for line in lines[lines_read:]:
            logged_at.setdefault(json.loads(line)["step"], time.monotonic())  # a step may log more than one line
        lines_read = len(lines)

    run = launch.wait(while_running=stamp).check(compare_verl.VERL_V1)
    return run.metrics, logged_at


def summarize(by_step: dict[int, dict], warmup: int, slots: int) -> dict[str, float]:
    steady = [by_step[step] for step in steady_steps(by_step, warmup)]
    wall = steady[-1]["timeline/sync_end"] - steady[0]["timeline/step_start"]
    total = lambda key: sum(m.get(key, 0.0) for m in steady)  # noqa: E731
    mean = lambda key: total(key) / len(steady)  # noqa: E731
    engine_steps = total("rollout/slot_steps") / slots
    if not engine_steps:
        raise SystemExit(
            "the run logged no rollout/slot_steps: keep actor_rollout_ref.rollout.disable_log_stats=false (the "
            "benchmark sets it), so that vLLM's scheduler statistics reach the trainer"
        )
    return {
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


def summarize_verl_v1(by_step: dict[int, dict], logged_at: dict[int, float], warmup: int) -> dict[str, float]:
    """V1's steady steps (as ``summarize``): steps per minute from the wall clock, its split, the staleness trained."""
    steady = steady_steps(by_step, warmup)
    unseen = [step for step in (steady[0] - 1, steady[-1]) if step not in logged_at]
    if unseen:
        raise RuntimeError(
            f"the benchmark saw no metrics line of verl V1's steps {unseen} while the run was going, so it cannot time "
            "its steady steps; run more steps than --warmup + 2"
        )
    wall = logged_at[steady[-1]] - logged_at[steady[0] - 1]  # from the end of the step before the first steady one
    mean = lambda key: statistics.fmean(by_step[step].get(key, 0.0) for step in steady)  # noqa: E731
    return {
        "steps_per_min": 60 * len(steady) / wall,
        "step_s": wall / len(steady),
        **{name: mean(key) for name, key in V1_STEP_PARTS.items()},
        "staleness_mean": mean(V1_STALENESS_MEAN),
        "staleness_max": max(by_step[step][V1_STALENESS_MAX] for step in steady),
        "versions_per_trajectory": mean(V1_SPANS),
        "groups_dropped": sum(by_step[step].get(compare_verl.V1_EVICTED, 0.0) for step in steady),
        "polled_share": statistics.fmean(by_step[step][V1_WAIT] >= V1_POLL_S for step in steady),
    }


def report_verl_v1(v1_runs: list[dict[str, float]], results: dict[str, list[dict[str, float]]]) -> None:
    """V1's medians over rounds, and each mode's steps per minute over V1's: the median of the rounds' ratios."""
    v1 = {key: statistics.median(run[key] for run in v1_runs) for key in v1_runs[0]}
    print(
        f"\n{compare_verl.VERL_V1} (the same profile): {v1['steps_per_min']:.1f} steps/min, step "
        f"{v1['step_s']:.2f} s (wait {v1['wait_s']:.2f} s, update {v1['update_s']:.2f} s, sync {v1['sync_s']:.3f} s); "
        f"staleness trained (oldest weights per trajectory) mean {v1['staleness_mean']:.2f}, max "
        f"{v1['staleness_max']:g}; {v1['versions_per_trajectory']:.2f} versions per trajectory; "
        f"{v1['groups_dropped']:g} groups dropped as too stale; {v1['polled_share']:.0%} of its steps waited "
        f"{V1_POLL_S:g} s or more for their batch (its replay buffer looks for a ready one every {V1_POLL_S:g} s)"
    )
    ratios = {
        name: [run["steps_per_min"] / v1_run["steps_per_min"] for run, v1_run in zip(runs_, v1_runs, strict=True)]
        for name, runs_ in results.items()
    }
    print(
        "  each mode's steps per minute over V1's: "
        + ", ".join(
            f"{name} x{statistics.median(r):.2f} (rounds: {', '.join(f'x{x:.2f}' for x in r)})"
            for name, r in ratios.items()
        )
    )


def report(
    medians: dict[str, dict[str, float]],
    batch_bounds: dict[str, float],
    round_gains: dict[str, list[float]],
) -> None:
    """The tables, the bounds and the targets. A mode's gain is the median over rounds of its steps per minute over
    whole-batch mode's in the same round (``round_gains``: the rounds interleave the modes, so a pair shares the
    machine's state)."""
    base = medians[BASELINE]
    today = StepSplit(period_s=base["step_s"], wait_s=base["wait_s"], sync_s=base["sync_s"], gen_s=base["gen_s"])
    wait_share = today.wait_s / today.period_s
    verdict = "generation-bound" if wait_share >= GENERATION_BOUND_WAIT_SHARE else "NOT generation-bound"
    print(
        f"\nWhole-batch mode at s=1: step {today.period_s:.2f} s = actor {today.actor_s:.2f} s + wait "
        f"{today.wait_s:.2f} s ({wait_share:.0%} of the step: {verdict}); a batch generates in {today.gen_s:.2f} s"
    )
    header = (
        f"{'mode':>10} | steps/min | step s | wait s | train s | sync s | abort s | gen s | occupancy | rows/step | "
        "staleness | spanning | recomputed"
    )
    print(header + "\n" + "-" * len(header))
    for name, m in medians.items():
        print(
            f"{name:>10} | {m['steps_per_min']:9.1f} | {m['step_s']:6.2f} | {m['wait_s']:6.2f} | {m['train_s']:7.2f} | "
            f"{m['sync_s']:6.3f} | {m['abort_s']:7.3f} | {m['gen_s']:5.2f} | {m['occupancy']:9.3f} | "
            f"{m['rows_per_engine_step']:9.1f} | {m['staleness_mean']:9.2f} | {m['partial_ratio']:8.3f} | "
            f"{m['recomputed_prefill']:10.0f}"
        )
    print(
        f"\nThe bounds from whole-batch mode: per batch (each round's run replayed step by step with its measured G, own "
        f"time and sync; the replay gives whole-batch mode a {batch_bounds['replayed_step_s']:.2f} s step against "
        f"{batch_bounds['measured_step_s']:.2f} s measured; medians over rounds), and from the mean split (the median "
        "split above, one G for every batch: looser where G varies)."
    )
    print(f"Gains over {BASELINE} (whole-batch mode), the median over rounds of each round's ratio:")
    gains = {}
    for name, m in medians.items():
        if name == BASELINE:
            continue
        gains[name] = gain = statistics.median(round_gains[name])
        staleness = staleness_of(MODES[name])
        per_batch, mean_split = batch_bounds[f"bound_s{staleness}"], partial_gain_bound(today, staleness)
        print(
            f"{name:>10}: steps/min x{gain:.2f} (rounds: {', '.join(f'x{g:.2f}' for g in round_gains[name])}; bound "
            f"per batch x{per_batch:.2f}, {gain / per_batch:.2f} of it; from the mean split x{mean_split:.2f}, "
            f"{gain / mean_split:.2f} of it), occupancy x{m['occupancy'] / base['occupancy']:.2f}"
        )
    print("\nTargets:")
    for name, least_gain, least_fraction in TARGETS:
        checks = [f"x{gains[name]:.2f} >= x{least_gain}: {'met' if gains[name] >= least_gain else 'NOT met'}"]
        if least_fraction is not None:
            staleness = staleness_of(MODES[name])
            fraction = gains[name] / batch_bounds[f"bound_s{staleness}"]
            met = "met" if fraction >= least_fraction else "NOT met"
            mean_split = gains[name] / partial_gain_bound(today, staleness)
            checks.append(
                f"{fraction:.2f} of the bound per batch >= {least_fraction}: {met} ({mean_split:.2f} of the bound "
                "from the mean split)"
            )
        print(f"{name:>10}: " + "; ".join(checks))


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--warmup", type=int, default=9, help="steps left out of the steady state (default: 1-9)")
    parser.add_argument("--config-name", default=PROFILE)
    parser.add_argument("--shape", choices=["demo", "qwen2.5-0.5b"], default="demo")
    parser.add_argument("--verl-v1", action="store_true", help="also run verl's V1 separate_async (CPU profiles)")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for every run (after --)")
    args = parser.parse_args(argv)

    if args.verl_v1 and not args.config_name.startswith(CPU_PROFILE_PREFIX):
        parser.error("--verl-v1 runs verl's V1 trainer on a CPU profile only (the environment compare-verl gives it)")
    root = args.out or Path(tempfile.mkdtemp(prefix="bench_partial_rollout-"))
    extra = [*VLLM_SETTINGS, *args.overrides]
    if args.shape != "demo":
        extra.append(f"actor_rollout_ref.model.path={write_shape_model(root)}")
    if not args.config_name.startswith(CPU_PROFILE_PREFIX):  # a GPU profile: point it at this profile's task
        extra = [*heavy_tail_task(), *extra]
    slots = rollout_slots(args.config_name, extra)

    results: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
    v1_runs: list[dict[str, float]] = []
    bounds: list[dict[str, float]] = []  # per round, from whole-batch mode
    partial_staleness = sorted({staleness_of(mode) for name, mode in MODES.items() if name != BASELINE})
    for round_index in range(args.rounds):
        for name, mode in MODES.items():
            directory = root / f"round{round_index}" / name.replace(" ", "_")
            by_step = run_mode(directory, args.config_name, args.steps, mode, extra)
            results[name].append(summary := summarize(by_step, args.warmup, slots))
            if name == BASELINE:
                bounds.append(per_batch_bounds(by_step, args.warmup, partial_staleness))
            print(f"round {round_index + 1} {name:>10}: " + ", ".join(f"{k} {v:.3g}" for k, v in summary.items()))
        if args.verl_v1:
            by_step, logged_at = run_verl_v1(
                root / f"round{round_index}" / "verl_v1", args.config_name, args.steps, extra
            )
            v1_runs.append(summary := summarize_verl_v1(by_step, logged_at, args.warmup))
            print(
                f"round {round_index + 1} {compare_verl.VERL_V1}: "
                + ", ".join(f"{k} {v:.3g}" for k, v in summary.items())
            )

    medians = {
        name: {key: statistics.median(r[key] for r in runs_) for key in runs_[0]} for name, runs_ in results.items()
    }
    print(
        f"\nMedians over {args.rounds} round(s), steps {args.warmup + 1}..{args.steps - 1} of {args.steps} (runs in {root}):"
    )
    round_gains = {
        name: [
            run["steps_per_min"] / today["steps_per_min"] for run, today in zip(runs_, results[BASELINE], strict=True)
        ]
        for name, runs_ in results.items()
    }
    report(medians, {key: statistics.median(b[key] for b in bounds) for key in bounds[0]}, round_gains)
    if v1_runs:
        report_verl_v1(v1_runs, results)
