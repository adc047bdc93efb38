"""``scripts/gpu_verify.sh`` decides its verdicts from its sections' logs (``scripts/gpu_verify.py``); these run that
on made-up logs, since the sections themselves need a GPU.

- A summary is written after each section and keeps the verdicts before it: a run cut after the sync keeps the sync.
- The partial-rollout launch at staleness 1 passes with every step synced, staleness 1 from step 2, a sample resumed
  across a sync and the probability bounds; a run whose syncs never aborted a request fails naming the abort path.
- The sync benchmark's fp32-vs-bf16 JSON (``weight-sync --dtype float32,bfloat16``) passes under the ratio bound and
  fails above it.
- A verdict that cannot be computed (a NaN logged as null, nothing logged, a bad input) is a FAIL, and so is a
  requested section that left no verdict.
- The device runbook's shell scripts parse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_verify.py"


def step_metrics(step: int, **values: float) -> dict:
    return {
        "timing_s/step": 2.0, "timing_s/gen": 1.5, "timing_s/train": 0.8, "timing_s/sync_weights": 0.4,
        "timing_s/wait_prev_gen": 0.1, "async/synced": 1.0, "async/staleness": 0 if step == 1 else 1,
        "async/weight_version": 0 if step == 1 else step - 2, "async/partial_ratio": 0.0 if step == 1 else 0.5,
        "async/version_span_max": 0.0 if step == 1 else 1.0,
        "async/recomputed_prefill_tokens": 0.0 if step == 1 else 300.0,
        "training/rollout_probs_diff_max": 0.01 if step == 1 else 0.1, "training/rollout_probs_diff_mean": 0.001,
        "training/rollout_actor_probs_pearson_corr": 0.999, **values,
    }  # fmt: skip


def sync_json(ratio: float) -> dict:
    def size(nbytes: int, seconds: float) -> dict:
        return {"name": "qwen2.5-3b", "bytes": nbytes, "median_sync_s": seconds, "gb_per_s": nbytes / seconds / 1e9}

    return {
        "dtypes": ["float32", "bfloat16"],
        "groups": {
            "kept": {
                "float32": {"sizes": [size(13_600_000_000, 4.0)]},
                "bfloat16": {"sizes": [size(6_800_000_000, 4.0 * ratio) | {"time_ratio_to_first_dtype": ratio}]},
            }
        },
    }


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    knobs = {
        "LOG_DIR": str(tmp_path), "SUMMARY": str(tmp_path / "gpu_verify.json"), "STEPS": "5", "LONG_BUDGET": "300",
        "ROLLOUT_EAGER": "1", "PROBS_DIFF_BOUND_SAME": "0.05", "PROBS_DIFF_BOUND_ONE_UPDATE": "0.3",
        "SHAPES": "qwen2.5-3b", "SYNC_RATIO_BOUND": "0.55", "TOTAL_S": "480", "ELAPSED_S": "100", "PATH": os.environ["PATH"],
        "CHECKS": "sync recipe",
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=knobs | env, capture_output=True, text=True, timeout=60
    )


def write_recipe_metrics(tmp_path: Path, **values: float) -> None:
    lines = [json.dumps({"step": step, "data": step_metrics(step, **values)}) for step in range(1, 6)]
    (tmp_path / "recipe.metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_each_section_rewrites_the_summary_and_keeps_the_verdicts_before_it(tmp_path):
    (tmp_path / "weight_sync.json").write_text(json.dumps(sync_json(0.52)))
    synced = run(tmp_path, "sync", SYNC_RC="0", SYNC_S="80")
    assert synced.returncode == 0, synced.stderr
    assert synced.stdout.startswith("PASS weight_sync_nccl: qwen2.5-3b float32 13.60 GB in 4.00 s")
    assert "bfloat16/float32 time 0.52" in synced.stdout
    summary = json.loads((tmp_path / "gpu_verify.json").read_text())
    assert summary["verdicts"]["weight_sync_nccl"]["status"] == "PASS"  # written before the recipe runs

    write_recipe_metrics(tmp_path)
    recipe = run(tmp_path, "recipe", RECIPE_RC="0", RECIPE_S="300")
    assert recipe.stdout.startswith(
        "PASS recipe_partial_s1: 5 steps, synced [1.0, 1.0, 1.0, 1.0, 1.0]; staleness [0, 1, 1, 1, 1]"
    )
    final = run(tmp_path, "--final", ELAPSED_S="400")
    assert final.returncode == 0 and "summary:" in final.stdout
    summary = json.loads((tmp_path / "gpu_verify.json").read_text())
    assert [v["status"] for v in summary["verdicts"].values()] == ["PASS", "PASS"]
    assert summary["elapsed_s"] == 400 and summary["recipe_partial_s1"]["steps"]["2"]["async/partial_ratio"] == 0.5


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"async/partial_ratio": 0.0, "async/recomputed_prefill_tokens": 0.0}, "the abort path did not run"),
        ({"async/staleness": 0}, "expected 1 after step 1"),
        ({"training/rollout_probs_diff_max": 0.6}, "rollout_probs_diff_max"),
        ({"async/synced": 0.0}, "steps without a sync"),
    ],
)
def test_a_recipe_run_that_misses_a_check_fails_naming_it(tmp_path, values, named):
    write_recipe_metrics(tmp_path, **values)
    (tmp_path / "recipe.log").write_text("done\n")

    recipe = run(tmp_path, "recipe", RECIPE_RC="0", RECIPE_S="300")

    assert recipe.stdout.startswith("FAIL recipe_partial_s1: ") and named in recipe.stdout
    assert run(tmp_path, "--final").returncode == 1


def test_a_cut_recipe_run_fails_as_timed_out_and_a_slow_bf16_sync_fails(tmp_path):
    (tmp_path / "recipe.log").write_text("starting\n")
    cut = run(tmp_path, "recipe", RECIPE_RC="124", RECIPE_S="400")
    assert "FAIL recipe_partial_s1: 0/5 steps logged; timed out after 400 s" in cut.stdout

    (tmp_path / "weight_sync.json").write_text(json.dumps(sync_json(0.8)))
    slow = run(tmp_path, "sync", SYNC_RC="0", SYNC_S="80")
    assert slow.stdout.startswith("FAIL weight_sync_nccl: qwen2.5-3b: bfloat16 took 0.80 of float32's time, above 0.55")


def test_a_verdict_that_cannot_be_computed_and_a_section_without_one_fail_the_run(tmp_path):
    """verl's file logger writes NaN as null; a run that exits 0 but logged nothing; a requested section that left no
    verdict (cut before it ran): each is a FAIL, never a PASS by omission."""
    write_recipe_metrics(tmp_path, **{"training/rollout_probs_diff_max": None})
    (tmp_path / "recipe.log").write_text("done\n")
    nan = run(tmp_path, "recipe", RECIPE_RC="0", RECIPE_S="300")
    assert nan.returncode == 0 and nan.stdout.startswith("FAIL recipe_partial_s1: ") and "nan" in nan.stdout
    (tmp_path / "recipe.metrics.jsonl").write_text("")
    empty = run(tmp_path, "recipe", RECIPE_RC="0", RECIPE_S="300")
    assert empty.stdout.startswith("FAIL recipe_partial_s1: steps logged [], expected 1..5")

    (tmp_path / "gpu_verify.json").unlink()
    (tmp_path / "weight_sync.json").write_text(json.dumps(sync_json(0.5)))
    assert run(tmp_path, "sync", SYNC_RC="0", SYNC_S="80").stdout.startswith("PASS")
    final = run(tmp_path, "--final")
    assert final.returncode == 1 and "FAIL no verdict for recipe_partial_s1" in final.stdout
    broken = run(tmp_path, "sync", SYNC_RC="0", SYNC_S="not a number")
    assert broken.stdout.startswith("FAIL weight_sync_nccl: verdict error: ValueError")


@pytest.mark.parametrize(
    "script",
    [
        "scripts/gpu_verify.sh",
        *(f"scripts/gpu/{name}" for name in ("build_bundle.sh", "call.sh", "install.sh", "env.sh")),
    ],
)
def test_the_device_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True).returncode == 0
