"""The verdicts of ``scripts/gpu_verify.sh``, which runs this after each of its sections.

    python scripts/gpu_verify.py SECTION     # stack | sync | recipe: its verdict line, the summary rewritten
    python scripts/gpu_verify.py --final     # the summary's path; exit 1 when a verdict is FAIL

Reads what the script exports (the logs' folder, the summary's path, the knobs, each section's exit status
and seconds as ``<SECTION>_RC`` / ``<SECTION>_S``) and the section's logs; keeps the verdicts of the sections
before it from the summary already written, so a run cut short keeps what ran. The checks are described in
``scripts/gpu_verify.sh``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

env = os.environ
log_dir = Path(env["LOG_DIR"])
summary_path = Path(env["SUMMARY"])

SPLIT = ("timing_s/step", "timing_s/gen", "timing_s/train", "timing_s/sync_weights", "timing_s/wait_prev_gen")
VERSIONS = (
    "async/staleness",
    "async/staleness_mean",
    "async/weight_version",
    "async/partial_ratio",
    "async/version_span_max",
    "async/recomputed_prefill_tokens",
)
KEPT = (
    *SPLIT,
    *VERSIONS,
    "async/synced",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_actor_probs_pearson_corr",
    "response_length/mean",
)


ERROR_WORDS = ("Error", "Exception", "FAILED", "problems")  # a Python error, a launch's refusal (launch.py)


def last_lines(path: Path, count: int = 40) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-count:]
    except OSError:
        return []


def failure(rc: str, seconds: str, log: Path) -> str:
    """Why a section failed: its timeout, or the last error-like line of its log."""
    if rc in ("124", "137"):
        return f"timed out after {seconds} s (log {log.name})"
    lines = [line.strip() for line in last_lines(log) if line.strip() and "Warning" not in line]
    errors = [i for i, line in enumerate(lines) if any(word in line for word in ERROR_WORDS)]
    if not errors:
        return f"exit {rc} after {seconds} s: {(lines or ['no output'])[-1][:300]} (log {log.name})"
    last = errors[-1]
    text = " ".join(lines[last : last + 2]) if lines[last].endswith(":") else lines[last]  # "...problems:" + the first
    return f"exit {rc} after {seconds} s: {text[:400]} (log {log.name})"


def stack_verdict() -> tuple[str, str, dict]:
    log = log_dir / "stack.log"
    found = [line.removeprefix("STACK ") for line in last_lines(log, 200) if line.startswith("STACK ")]
    detail = {"found": json.loads(found[-1]) if found else {}, "seconds": int(env["STACK_S"])}
    if env["STACK_RC"] != "0":
        return "FAIL", failure(env["STACK_RC"], env["STACK_S"], log), detail
    return "PASS", ", ".join(f"{k} {v}" for k, v in detail["found"].items()), detail


def sync_verdict() -> tuple[str, str, dict]:
    path = log_dir / "weight_sync.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    detail = {"results": results, "seconds": int(env["SYNC_S"])}
    if env["SYNC_RC"] != "0" or not results:
        return "FAIL", failure(env["SYNC_RC"], env["SYNC_S"], log_dir / "weight_sync.log"), detail
    group = results["groups"]["kept"]
    dtypes = results["dtypes"]
    bound = float(env["SYNC_RATIO_BOUND"])
    parts, problems = [], []
    for i, name in enumerate(env["SHAPES"].split(",")):
        sizes = [group[dtype]["sizes"][i] if i < len(group[dtype]["sizes"]) else None for dtype in dtypes]
        if any(size is None or size["name"] != name for size in sizes):
            problems.append(f"{name} not measured")
            continue
        line = "; ".join(
            f"{name} {dtype} {s['bytes'] / 1e9:.2f} GB in {s['median_sync_s']:.2f} s = {s['gb_per_s']:.2f} GB/s"
            for dtype, s in zip(dtypes, sizes, strict=True)
        )
        for dtype, size in zip(dtypes[1:], sizes[1:], strict=True):
            ratio = size["time_ratio_to_first_dtype"]
            line += f"; {dtype}/{dtypes[0]} time {ratio:.2f}"
            if not ratio <= bound:
                problems.append(f"{name}: {dtype} took {ratio:.2f} of {dtypes[0]}'s time, above {bound}")
        parts.append(line)
    text = " | ".join(parts)
    return ("FAIL", "; ".join(problems) + f" | {text}", detail) if problems else ("PASS", text, detail)


def recipe_verdict() -> tuple[str, str, dict]:
    steps = int(env["STEPS"])
    # Step 1: both sides hold v0 (numerics alone); later steps: the actor one update ahead (see gpu_verify.sh).
    bound_same, bound_one_update = float(env["PROBS_DIFF_BOUND_SAME"]), float(env["PROBS_DIFF_BOUND_ONE_UPDATE"])
    metrics: dict[int, dict] = {}
    path = log_dir / "recipe.metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            metrics.setdefault(record["step"], {}).update(record["data"])
    trained = {s: m for s, m in sorted(metrics.items()) if "timing_s/step" in m}
    detail = {
        "steps": {s: {k: m[k] for k in KEPT if k in m} for s, m in trained.items()},
        "long_budget": int(env["LONG_BUDGET"]),
        "rollout_eager": env["ROLLOUT_EAGER"] == "1",
        "probs_diff_bound_step_1": bound_same,
        "probs_diff_bound_later_steps": bound_one_update,
        "seconds": int(env["RECIPE_S"]),
    }
    if env["RECIPE_RC"] != "0":
        logged = f"{len(trained)}/{steps} steps logged; "
        return "FAIL", logged + failure(env["RECIPE_RC"], env["RECIPE_S"], log_dir / "recipe.log"), detail

    def number(step: int, key: str, missing: float = math.nan) -> float:
        """A metric of a step; verl's file logger writes NaN as null, read back as NaN."""
        value = trained[step].get(key, missing)
        return math.nan if value is None else value

    def per_step(key: str) -> list:
        value = [number(s, key) for s in trained]
        return [round(v, 4) if isinstance(v, float) else v for v in value]

    problems = []
    if sorted(trained) != list(range(1, steps + 1)):
        problems.append(f"steps logged {sorted(trained)}, expected 1..{steps}")
    unsynced = [s for s in trained if number(s, "async/synced") != 1 or not number(s, "timing_s/sync_weights") > 0]
    if unsynced:
        problems.append(f"steps without a sync {unsynced}")
    if any(number(s, "async/staleness") != 1 for s in trained if s > 1):
        problems.append(f"async/staleness {per_step('async/staleness')}, expected 1 after step 1")
    if not all(number(s, "async/version_span_max") <= 1 for s in trained):
        problems.append(f"async/version_span_max {per_step('async/version_span_max')}, expected at most 1")
    aborted = [s for s in trained if number(s, "async/partial_ratio", 0) > 0]
    if not aborted or not any(number(s, "async/recomputed_prefill_tokens", 0) > 0 for s in aborted):
        problems.append(
            "no sample resumed across a sync (async/partial_ratio "
            f"{per_step('async/partial_ratio')}, recomputed prefill {per_step('async/recomputed_prefill_tokens')}): "
            "the abort path did not run"
        )
    diffs = [number(s, "training/rollout_probs_diff_max") for s in trained]
    bounds = [bound_same if s == 1 else bound_one_update for s in trained]
    if not all(d <= b for d, b in zip(diffs, bounds, strict=True)):  # NaN (no rollout log-probs) fails too
        problems.append(f"rollout_probs_diff_max {[round(d, 4) for d in diffs]} above {bounds}")
    steady = [m for s, m in trained.items() if s > 1] or list(trained.values())
    split = {
        k.removeprefix("timing_s/"): statistics.median(m[k] for m in steady)
        for k in SPLIT
        if steady and all(isinstance(m.get(k), int | float) for m in steady)
    }
    detail["median_split_after_step_1_s"] = split
    summary = (
        f"{len(trained)} steps, synced {per_step('async/synced')}; staleness {per_step('async/staleness')}, version "
        f"{per_step('async/weight_version')}; resumed across a sync: partial_ratio {per_step('async/partial_ratio')}, "
        f"recomputed prefill tokens {per_step('async/recomputed_prefill_tokens')}; rollout_probs_diff_max "
        f"{[round(d, 4) for d in diffs]} (bounds {bound_same} at step 1, {bound_one_update} after), pearson "
        f"{per_step('training/rollout_actor_probs_pearson_corr')}; median step {split.get('step', math.nan):.2f} s: "
        f"gen {split.get('gen', math.nan):.2f} train {split.get('train', math.nan):.2f} "
        f"sync {split.get('sync_weights', math.nan):.3f} wait {split.get('wait_prev_gen', math.nan):.2f}"
    )
    return ("FAIL", "; ".join(problems) + f" | {summary}", detail) if problems else ("PASS", summary, detail)


SECTIONS = {
    "stack": ("stack", stack_verdict),
    "sync": ("weight_sync_nccl", sync_verdict),
    "recipe": ("recipe_partial_s1", recipe_verdict),
}


def gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        )
        return out.stdout.strip()
    except OSError:
        return "unknown"


def main(argv: list[str]) -> int:
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"gpu": gpu_name(), "verdicts": {}}
    summary["elapsed_s"] = int(env["ELAPSED_S"])
    summary["total_budget_s"] = int(env["TOTAL_S"])
    if argv[0] != "--final":
        name, verdict = SECTIONS[argv[0]]
        try:
            status, text, detail = verdict()
        except Exception as error:  # a verdict that cannot be computed is a FAIL, never a missing line
            status, text, detail = "FAIL", f"verdict error: {type(error).__name__}: {error}", {}
        print(f"{status} {name}: {text}", flush=True)
        summary["verdicts"][name] = {"status": status, "detail": text}
        summary[name] = detail
    summary["logs"] = sorted(
        p.name for p in log_dir.iterdir() if p.suffix in (".log", ".jsonl", ".json") and p != summary_path
    )
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    if argv[0] == "--final":
        print(f"summary: {summary_path} ({summary['elapsed_s']} s)")
        missing = [
            SECTIONS[check][0]
            for check in env.get("CHECKS", "").split()
            if SECTIONS[check][0] not in summary["verdicts"]
        ]
        if missing:
            print(f"FAIL no verdict for {', '.join(missing)}")
        return 1 if missing or any(v["status"] == "FAIL" for v in summary["verdicts"].values()) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
