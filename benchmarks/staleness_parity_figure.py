"""The docs' figure of staleness 0 vs 1 per off-policy correction: mean and range over seeds, one panel per task.

What: reads one or more ``summary.json`` written by ``python -m benchmarks learning --grid staleness-parity``
(each invocation writes its own) and draws, for each task of each summary (columns, titled with the task and
its seeds) and each chosen candidate (rows), the validation curve at staleness 1 and that of its staleness-0
baseline, the mean over seeds as a line and the range over seeds as a band.

Why: the default correction is chosen by this measurement; the figures show what the tables summarise
(docs/advance/staleness_parity.png: the screen; staleness_parity_confirm.png: the confirmation, drawn with
``--summary <graded fresh seeds>.json <binary>.json --candidates token_is bypass no_correction``).

How: ``python -m benchmarks staleness-parity-figure [--summary outputs/staleness_parity/summary.json ...]
[--candidates token_is bypass] [--out docs/advance/staleness_parity.png]``
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import argument_parser

METRIC_NAMES = {"binary": "exact-match accuracy", "graded": "graded reward (share of positions right)"}


def band(curves: dict[str, dict[str, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps, mean, min and max over seeds of the curves (seed -> step -> value, JSON keys)."""
    steps = sorted(set.intersection(*(set(curve) for curve in curves.values())), key=int)
    values = [[curve[step] for curve in curves.values()] for step in steps]
    return (
        [int(step) for step in steps],
        [statistics.mean(v) for v in values],
        [min(v) for v in values],
        [max(v) for v in values],
    )


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--summary", type=Path, nargs="+", default=[Path("outputs/staleness_parity/summary.json")])
    parser.add_argument("--candidates", nargs="+", help="rows to draw (default: every candidate of every task)")
    parser.add_argument("--out", type=Path, default=Path("docs/advance/staleness_parity.png"))
    args = parser.parse_args(argv)
    columns = [
        (task, rows, summary)
        for summary in args.summary
        for task, rows in json.loads(summary.read_text())["tasks"].items()
    ]
    candidates = args.candidates or list(dict.fromkeys(name for _, rows, _ in columns for name in rows))
    missing = [
        f"{name} on {task} ({summary})" for task, rows, summary in columns for name in candidates if name not in rows
    ]
    if missing:
        raise SystemExit(
            f"no rows for {', '.join(missing)}; run python -m benchmarks learning --grid staleness-parity first."
        )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, grid = plt.subplots(
        len(candidates), len(columns), figsize=(4.2 * len(columns), 2.6 * len(candidates)), dpi=110, squeeze=False
    )
    for column, (task, rows, _) in enumerate(columns):
        for line, name in enumerate(candidates):
            axes, row = grid[line][column], rows[name]
            for staleness, color in (("s0", "tab:gray"), ("s1", "tab:blue")):
                steps, mean, low, high = band(row[f"curves_{staleness}"])
                label = "staleness 0" if staleness == "s0" else "staleness 1"
                axes.plot(steps, mean, color=color, marker=".", label=label)
                axes.fill_between(steps, low, high, color=color, alpha=0.15)
            axes.set_title(f"{task}: {name} (s1/s0 gain {row['ratio']:.2f}, n={len(row['seeds'])})", fontsize=9)
            axes.grid(alpha=0.3)
            if line == len(candidates) - 1:
                axes.set_xlabel("training step")
            if column == 0:
                axes.set_ylabel("validation", fontsize=8)
            if line == 0 and column == 0:
                axes.legend(fontsize=8)
        seeds = rows[candidates[0]]["seeds"]
        heading = f"{METRIC_NAMES.get(task, task)}\nseeds {seeds[0]}-{seeds[-1]}"
        grid[0][column].annotate(heading, (0.5, 1.25), xycoords="axes fraction", ha="center", fontsize=9)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out)
    print(f"wrote {args.out}")
