"""The CPU demo: one-step-off GRPO on the built-in task, then a summary and a picture of the overlap.

    python -m recipe.one_step_off_async.demo.run [hydra overrides]     # or: bash scripts/run_demo.sh
    python -m recipe.one_step_off_async.demo.run --config-name=one_step_off_ppo_1gpu   # one GPU (gpu_smoke.sh)

Trains with the CPU profile (``config/one_step_off_ppo_cpu.yaml``: 1 core trains, 1 core
generates), logs every step's metrics to ``outputs/demo/<experiment>/metrics.jsonl`` and ends with
validation reward before/after, the mean step time split into generation / training / sync / wait,
the overlap efficiency, and ``timeline.png``: reward per step, and per step when each pool was busy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_module
from omegaconf import DictConfig, open_dict

from recipe.one_step_off_async.demo.assets import register_resolver
from recipe.one_step_off_async.runs import read_metrics

VAL_REWARD_PREFIX = "val-core/"
SYNC_PHASE_PREFIX = "timing_s/sync/"


def compose_demo_config(overrides: list[str], config_name: str = "one_step_off_ppo_cpu") -> DictConfig:
    register_resolver()  # what the profile's Hydra callback does for the commands; compose() runs no callbacks
    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        config = compose(config_name=config_name, overrides=overrides)
    with open_dict(config):
        if "file" not in config.trainer.logger:
            config.trainer.logger = [*config.trainer.logger, "file"]
    return config


def train(config: DictConfig, metrics_path: Path) -> None:
    from verl.trainer.main_ppo import run_ppo

    from recipe.one_step_off_async.launch import prepare_config, problems_reported
    from recipe.one_step_off_async.trainer.task_runner import OneStepOffTaskRunner

    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    with problems_reported():
        prepare_config(config)
    run_ppo(config, task_runner_class=OneStepOffTaskRunner)


def val_reward(metrics: dict) -> float | None:
    values = [v for k, v in metrics.items() if k.startswith(VAL_REWARD_PREFIX) and k.endswith("/mean@1")]
    return sum(values) / len(values) if values else None


def summarize(steps: dict[int, dict]) -> str:
    train_steps = sorted(s for s in steps if s > 0 and "timing_s/step" in steps[s])
    # The first step also waits for the pipeline to fill; steady state starts at step 2.
    steady = [steps[s] for s in train_steps[1:]] or [steps[s] for s in train_steps]

    def mean(key: str) -> float:  # over the steps that logged it (sync phases: the steps that synced)
        values = [m[key] for m in steady if key in m]
        return sum(values) / len(values)

    validated = [(s, val_reward(steps[s])) for s in sorted(steps) if val_reward(steps[s]) is not None]
    lines = [f"trained {len(train_steps)} steps, staleness {steady[-1]['async/staleness']:.0f} (measured)"]
    if validated:
        (first_step, first), (last_step, last) = validated[0], validated[-1]
        lines.append(f"validation reward: {first:.3f} at step {first_step} -> {last:.3f} at step {last_step}")
    lines.append(
        f"mean step {mean('timing_s/step'):.2f} s: generation {mean('timing_s/gen'):.2f} s (overlapped), "
        f"training {mean('timing_s/train'):.2f} s, sync {mean('timing_s/sync_weights'):.3f} s, "
        f"waiting for generation {mean('timing_s/wait_prev_gen'):.2f} s"
    )
    lines.append(f"overlap efficiency {mean('async/overlap_efficiency'):.2f} (1.0 = the slower pool never waits)")
    phases = sorted({key for m in steady for key in m if key.startswith(SYNC_PHASE_PREFIX)})
    if phases:
        split = ", ".join(f"{key.removeprefix(SYNC_PHASE_PREFIX)} {mean(key) * 1000:.1f}" for key in phases)
        lines.append(f"weight sync (ms, mean per sync): {split}")
    first = steps[train_steps[0]]
    lines.append(f"first step {first['timing_s/step']:.2f} s (generation {first['timing_s/gen']:.2f} s)")
    return "\n".join(lines)


def plot(steps: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train_steps = sorted(s for s in steps if s > 0 and "timeline/gen_start" in steps[s])
    figure, (rewards, timeline) = plt.subplots(2, 1, figsize=(11, 7), gridspec_kw={"height_ratios": [1, 1]})

    rewards.plot(train_steps, [steps[s]["critic/score/mean"] for s in train_steps], label="train reward (sampled)")
    validated = [(s, val_reward(steps[s])) for s in sorted(steps) if val_reward(steps[s]) is not None]
    rewards.plot([s for s, _ in validated], [v for _, v in validated], "o-", label="validation reward (greedy)")
    rewards.set(xlabel="training step", ylabel="reward", title="Reward per step")
    rewards.legend(loc="lower right")
    rewards.grid(alpha=0.3)

    shown = train_steps[:12]
    origin = steps[shown[0]]["timeline/gen_start"]
    for s in shown:
        m = steps[s]
        bars = [
            (1, m["timeline/gen_start"], m["timeline/gen_end"], "tab:blue", f"G{s}"),
            (0, m["timeline/train_start"], m["timeline/train_end"], "tab:orange", f"T{s}"),
            (0, m["timeline/sync_start"], m["timeline/sync_end"], "tab:red", ""),
        ]
        for row, start, end, color, label in bars:
            timeline.barh(row, end - start, left=start - origin, color=color, edgecolor="white", height=0.6)
            if label:
                timeline.text((start + end) / 2 - origin, row, label, ha="center", va="center", fontsize=7)
    timeline.set_yticks([0, 1], ["actor pool\n(train, sync)", "rollout pool\n(generate)"])
    timeline.set(
        xlabel="seconds", title="Timeline: G = generation of batch k, T = training on batch k, red = weight sync"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str]) -> None:
    names = [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config-name=")]
    config = compose_demo_config([arg for arg in argv if not arg.startswith("--config-name=")], *names[-1:])
    output_dir = Path("outputs", "demo", config.trainer.experiment_name).resolve()
    metrics_path = output_dir / "metrics.jsonl"
    train(config, metrics_path)
    steps = read_metrics(metrics_path)
    print("\n" + summarize(steps))
    picture = output_dir / "timeline.png"
    try:
        plot(steps, picture)
    except ImportError as error:  # matplotlib is a project dependency, but a bare GPU image may lack it
        print(f"timeline plot skipped: {error}")
    else:
        print(f"reward and timeline plot: {picture}")


if __name__ == "__main__":
    main(sys.argv[1:])
