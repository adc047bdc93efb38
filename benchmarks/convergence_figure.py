"""The convergence figure of the docs: staleness 0 vs 1 vs the best other loss, mean and spread over seeds.

What: reads the runs of the loss table (``python -m benchmarks learning --grid loss-table``: one folder per row
and seed, verl's ``file`` logger in each) and draws greedy validation accuracy against the training step for
three curves: PPO-clip (``vanilla``) at staleness 0 (the synchronous baseline) and at staleness 1 (the recipe's
default), and the other staleness-1 row with the highest mean final accuracy; the mean over seeds as a line,
the range over seeds as a band. Prints the numbers it drew.

Why: verl's reviewers asked for the convergence curve as a figure; it is drawn from measured runs only.

How: ``python -m benchmarks learning --grid loss-table --rows vanilla reinforce topr ... --out DIR
[-- overrides]``, then ``python -m benchmarks convergence-figure --runs DIR --out docs/advance/convergence.png``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import argument_parser
from benchmarks.learning import loss_table_folder, validation_curve
from recipe.one_step_off_async.runs import METRICS, read_metrics

BASELINES = (("vanilla", 0), ("vanilla", 1))


def curves(folders: Path, seeds: list[int]) -> dict[tuple[str, int], dict[int, list[float]]]:
    """Accuracy by step, one value per seed, for every (row, staleness) with a run for each seed."""
    found: dict[tuple[str, int], dict[int, list[float]]] = {}
    for folder in sorted(folders.glob("*_s[0-9]*_seed0")):
        row, staleness = folder.name.removesuffix("_seed0").rsplit("_s", 1)
        by_seed = [
            validation_curve(read_metrics(loss_table_folder(folders, row, int(staleness), seed) / METRICS))
            for seed in seeds
        ]
        steps = set.intersection(*(set(accuracy) for accuracy in by_seed))
        if steps:
            found[row, int(staleness)] = {step: [accuracy[step] for accuracy in by_seed] for step in sorted(steps)}
    return found


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--runs", type=Path, required=True, help="the --out folder of the loss-table grid")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("docs/advance/convergence.png"))
    args = parser.parse_args(argv)

    found = curves(args.runs, args.seeds)
    missing = [f"{row} at staleness {staleness}" for row, staleness in BASELINES if (row, staleness) not in found]
    if missing:
        raise SystemExit(f"{args.runs} has no complete runs of {', '.join(missing)} for seeds {args.seeds}.")
    final = {key: statistics.mean(by_step[max(by_step)]) for key, by_step in found.items()}
    others = [key for key in found if key not in BASELINES and key[1] == 1]
    shown = [*BASELINES, *([max(others, key=final.get)] if others else [])]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for row, staleness in shown:
        by_step = found[row, staleness]
        steps = list(by_step)
        means = [statistics.mean(values) for values in by_step.values()]
        label = f"{row}, staleness {staleness}" + (" (synchronous)" if staleness == 0 else "")
        (line,) = axes.plot(steps, means, marker="o", label=label)
        axes.fill_between(
            steps,
            [min(values) for values in by_step.values()],
            [max(values) for values in by_step.values()],
            color=line.get_color(),
            alpha=0.15,
        )
        print(f"{label}: " + ", ".join(f"step {step} {mean:.3f}" for step, mean in zip(steps, means, strict=True)))
    axes.set_xlabel("training step")
    axes.set_ylabel("greedy validation accuracy")
    axes.set_title(f"Sort letters (CPU profile), mean and range over seeds {', '.join(map(str, args.seeds))}")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out)
    print(f"wrote {args.out}")
