#!/usr/bin/env bash
# The recipe's GPU features checked on ONE GPU in one command (under 10 minutes), one verdict line each.
#
# What: two sections, each under its own timeout, then one line per feature, `PASS|FAIL|SKIP name: detail`,
# and a JSON summary (the verdicts, the per-step metrics, the sync timings, the logs' paths):
#   recipe_one_gpu     the entry point on the one-GPU profile (one_step_off_ppo_1gpu: vLLM rollout, nccl weight
#                      sync, FSDP2 actor, both pools time-sharing the GPU) at staleness 1 for STEPS steps. From
#                      the metrics file: every step synced (async/synced = 1, timing_s/sync_weights > 0),
#                      async/staleness = 1 from step 2 (step 1's batch is sampled with v0 by construction), and
#                      training/rollout_probs_diff_max within its bounds (below).
#   weight_sync_nccl   verl's `nccl` checkpoint engine at real model shapes (python -m benchmarks weight-sync:
#                      Qwen2.5-0.5B/1.5B/3B configs, random fp32 weights as the FSDP2 actor sends, 1 sender -> 1
#                      receiver, both on the GPU): median sync seconds per shape and the GB/s it implies.
#
# The features through verl's vLLM path (partial rollout, multi-turn, a reward model, LoRA, GAE, elastic) are the
# e2e tests, which run on vLLM's CPU build with every landing (`bash scripts/test.sh -m e2e`); each
# launch on this GPU would cost ~5 minutes of start-up (see below), more than this command's budget allows.
#
# The probability bounds: training/rollout_probs_diff_max is max |p_actor - p_rollout| over the batch's response
# tokens (probabilities, not log-probabilities; verl.utils.debug.metrics). At step 1 both sides hold v0, which
# vLLM (started with dummy weights) received through the nccl sync: the difference is numerics alone, bf16 on
# both sides with different kernels: 0.006 measured on an H100, bound PROBS_DIFF_BOUND_SAME (0.02). From step 2
# the actor is one update (lr 1e-4) ahead of the weights that sampled the batch, which moves single tokens by
# more: 0.05-0.12 measured, bound PROBS_DIFF_BOUND_ONE_UPDATE (0.25). Weights that arrive wrong (misnamed,
# truncated, garbage) sample tokens the actor gives a very different probability, O(0.5-1). A rollout left a
# few versions behind is the version check's to catch (async/staleness, from every sample's weight version).
#
# Why: one reproducible check of the GPU path and of what a weight sync costs at the sizes the recipe targets,
# on the smallest GPU machine that runs it. Both pools and both sync ranks share the one GPU; NCCL then talks
# over its socket transport (a NCCL_HOSTID per process), so the GB/s is a one-GPU lower bound, not NVLink's.
#
# How (from anywhere; needs one NVIDIA GPU with ~40 GB free and `pip install -e ".[gpu]"`):
#   bash scripts/gpu_verify.sh [SUMMARY.json]    # default: $OUT/gpu_verify.json, else outputs/gpu_verify/
# Logs (recipe.log, recipe.metrics.jsonl, weight_sync.log/.json) go next to the summary.
# Exit status: 0 when no verdict is FAIL. Knobs (environment): STEPS (5), PROBS_DIFF_BOUND_SAME (0.02),
# PROBS_DIFF_BOUND_ONE_UPDATE (0.25), SHAPES (qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b), SYNC_REPS (2), TOTAL_S (570),
# RECIPE_TIMEOUT_S (400), SYNC_TIMEOUT_S (150), PYTHON (python3). On one H100 the recipe section took ~345 s
# (~170 s to the vLLM server's spawn, ~95 s vLLM init, ~40 s for the 5 steps of which ~28 s the first generation,
# ~30 s shutdown) and the sync section ~92 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
SUMMARY=${1:-${OUT:+$OUT/gpu_verify.json}}
SUMMARY=${SUMMARY:-outputs/gpu_verify/gpu_verify.json}
mkdir -p "$(dirname "$SUMMARY")"
LOG_DIR=$(cd "$(dirname "$SUMMARY")" && pwd)
SUMMARY="$LOG_DIR/$(basename "$SUMMARY")"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

STEPS=${STEPS:-5}
PROBS_DIFF_BOUND_SAME=${PROBS_DIFF_BOUND_SAME:-0.02}
PROBS_DIFF_BOUND_ONE_UPDATE=${PROBS_DIFF_BOUND_ONE_UPDATE:-0.25}
SHAPES=${SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b}
SYNC_REPS=${SYNC_REPS:-2}
TOTAL_S=${TOTAL_S:-570}
RECIPE_TIMEOUT_S=${RECIPE_TIMEOUT_S:-400}
SYNC_TIMEOUT_S=${SYNC_TIMEOUT_S:-150}
START_S=$SECONDS

# A section's timeout: its cap, or what is left of TOTAL_S if less.
section_timeout() {
  local left=$((TOTAL_S - (SECONDS - START_S)))
  echo $((left < $1 ? left : $1))
}

stop_ray() { "$PYTHON" -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true; }

# --- recipe_one_gpu: the entry point on the one-GPU profile, staleness 1
timeout_s=$(section_timeout "$RECIPE_TIMEOUT_S")
echo "=== recipe_one_gpu: $STEPS steps at staleness 1 (timeout ${timeout_s}s)"
rm -f "$LOG_DIR/recipe.metrics.jsonl"
run_dir=$(mktemp -d)
section_start=$SECONDS
(
  cd "$run_dir" || exit 1
  VERL_FILE_LOGGER_PATH="$LOG_DIR/recipe.metrics.jsonl" timeout -k 15 "$timeout_s" \
    "$PYTHON" -m recipe.one_step_off_async.main_ppo --config-name=one_step_off_ppo_1gpu \
    async_training.staleness=1 trainer.total_training_steps="$STEPS" \
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 \
    'trainer.logger=[console,file]' trainer.experiment_name=gpu_verify "trainer.default_local_dir=$run_dir/ckpt" \
    async_training.generation_timeout_s=180 async_training.sync_timeout_s=90 \
    +ray_kwargs.ray_init.num_gpus=2
) >"$LOG_DIR/recipe.log" 2>&1
RECIPE_RC=$? RECIPE_S=$((SECONDS - section_start))
stop_ray
rm -rf "$run_dir"

# --- weight_sync_nccl: verl's nccl engine at the Qwen2.5 shapes, fp32
timeout_s=$(section_timeout "$SYNC_TIMEOUT_S")
echo "=== weight_sync_nccl: $SHAPES, float32, $SYNC_REPS timed syncs each (timeout ${timeout_s}s)"
rm -f "$LOG_DIR/weight_sync.json"
section_start=$SECONDS
timeout -k 15 "$timeout_s" "$PYTHON" -m benchmarks weight-sync --backend nccl --receivers 1 --dtype float32 \
  --reps "$SYNC_REPS" --shape "$SHAPES" --json "$LOG_DIR/weight_sync.json" >"$LOG_DIR/weight_sync.log" 2>&1
SYNC_RC=$? SYNC_S=$((SECONDS - section_start))
stop_ray

# --- verdicts and the summary
export LOG_DIR SUMMARY STEPS PROBS_DIFF_BOUND_SAME PROBS_DIFF_BOUND_ONE_UPDATE SHAPES TOTAL_S RECIPE_RC RECIPE_S SYNC_RC SYNC_S
export ELAPSED_S=$((SECONDS - START_S))
"$PYTHON" - <<'EOF'
import json
import os
import statistics
import subprocess
from pathlib import Path

env = os.environ
log_dir = Path(env["LOG_DIR"])
steps = int(env["STEPS"])
# Step 1: both sides hold v0 (numerics alone); later steps: the actor one update ahead (see the header).
bound_same, bound_one_update = float(env["PROBS_DIFF_BOUND_SAME"]), float(env["PROBS_DIFF_BOUND_ONE_UPDATE"])
SPLIT = ("timing_s/step", "timing_s/gen", "timing_s/train", "timing_s/sync_weights", "timing_s/wait_prev_gen")
KEPT = (*SPLIT, "async/staleness", "async/synced", "async/weight_version", "training/rollout_probs_diff_max",
        "training/rollout_probs_diff_mean", "training/rollout_actor_probs_pearson_corr")


def last_lines(path: Path, count: int = 40) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-count:]
    except OSError:
        return []


def failure(rc: str, seconds: str, log: Path) -> str:
    """Why a section failed: its timeout, or the last error-like line of its log."""
    if rc in ("124", "137"):
        return f"timed out after {seconds} s (log {log.name})"
    lines = [line.strip() for line in last_lines(log) if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line or "FAILED" in line]
    return f"exit {rc} after {seconds} s: {(errors or lines or ['no output'])[-1][:300]} (log {log.name})"


def recipe_verdict() -> tuple[str, str, dict]:
    metrics: dict[int, dict] = {}
    path = log_dir / "recipe.metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            metrics.setdefault(record["step"], {}).update(record["data"])
    trained = {s: m for s, m in sorted(metrics.items()) if "timing_s/step" in m}
    per_step = {s: {k: m[k] for k in KEPT if k in m} for s, m in trained.items()}
    detail = {
        "steps": per_step,
        "probs_diff_bound_step_1": bound_same,
        "probs_diff_bound_later_steps": bound_one_update,
        "seconds": int(env["RECIPE_S"]),
    }
    if env["RECIPE_RC"] != "0":
        logged = f"{len(trained)}/{steps} steps logged; "
        return "FAIL", logged + failure(env["RECIPE_RC"], env["RECIPE_S"], log_dir / "recipe.log"), detail
    problems = []
    if sorted(trained) != list(range(1, steps + 1)):
        problems.append(f"steps logged {sorted(trained)}, expected 1..{steps}")
    unsynced = [s for s, m in trained.items() if m.get("async/synced") != 1 or not m.get("timing_s/sync_weights", 0) > 0]
    staleness = [trained[s].get("async/staleness") for s in trained]
    diffs = [trained[s].get("training/rollout_probs_diff_max", float("nan")) for s in trained]
    if unsynced:
        problems.append(f"steps without a sync {unsynced}")
    if any(trained[s].get("async/staleness") != 1 for s in trained if s > 1):
        problems.append(f"async/staleness {staleness}, expected 1 after step 1")
    bounds = [bound_same if s == 1 else bound_one_update for s in trained]
    if not all(d <= b for d, b in zip(diffs, bounds)):  # NaN (no rollout log-probs) fails too
        problems.append(f"rollout_probs_diff_max {[round(d, 4) for d in diffs]} above {bounds}")
    steady = [m for s, m in trained.items() if s > 1] or list(trained.values())
    split = {k.removeprefix("timing_s/"): statistics.median(m[k] for m in steady) for k in SPLIT if all(k in m for m in steady)}
    detail["median_split_after_step_1_s"] = split
    summary = (
        f"{len(trained)} steps, staleness {staleness}, every step synced; rollout_probs_diff_max "
        f"{[round(d, 4) for d in diffs]} (bounds {bound_same} at step 1, {bound_one_update} after); median step {split.get('step', float('nan')):.2f} s: "
        f"gen {split.get('gen', float('nan')):.2f} (overlapped) train {split.get('train', float('nan')):.2f} "
        f"sync {split.get('sync_weights', float('nan')):.3f} wait {split.get('wait_prev_gen', float('nan')):.2f}"
    )
    return ("FAIL", "; ".join(problems) + f" | {summary}", detail) if problems else ("PASS", summary, detail)


def sync_verdict() -> tuple[str, str, dict]:
    path = log_dir / "weight_sync.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    detail = {"results": results, "seconds": int(env["SYNC_S"])}
    if env["SYNC_RC"] != "0" or not results:
        return "FAIL", failure(env["SYNC_RC"], env["SYNC_S"], log_dir / "weight_sync.log"), detail
    group = results["groups"]["kept"]
    sizes = "; ".join(
        f"{s['name']} {s['bytes'] / 1e9:.2f} GB in {s['median_sync_s']:.2f} s = {s['gb_per_s']:.2f} GB/s" for s in group["sizes"]
    )
    if [s["name"] for s in group["sizes"]] != env["SHAPES"].split(","):
        return "FAIL", f"shapes measured: {sizes}", detail
    return "PASS", f"{sizes} (fit: fixed {group['fit_fixed_s']:.2f} s, {group['fit_gb_per_s']:.2f} GB/s)", detail


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        return out.stdout.strip()
    except OSError:
        return "unknown"


verdicts = {"recipe_one_gpu": recipe_verdict(), "weight_sync_nccl": sync_verdict()}
for name, (status, text, _) in verdicts.items():
    print(f"{status} {name}: {text}")
summary = {
    "gpu": gpu_name(),
    "elapsed_s": int(env["ELAPSED_S"]),
    "total_budget_s": int(env["TOTAL_S"]),
    "verdicts": {name: {"status": status, "detail": text} for name, (status, text, _) in verdicts.items()},
    **{name: detail for name, (_, _, detail) in verdicts.items()},
    "logs": sorted(p.name for p in log_dir.iterdir() if p.suffix in (".log", ".jsonl") or p.name == "weight_sync.json"),
}
Path(env["SUMMARY"]).write_text(json.dumps(summary, indent=2) + "\n")
print(f"summary: {env['SUMMARY']} ({summary['elapsed_s']} s)")
raise SystemExit(1 if any(status == "FAIL" for status, _, _ in verdicts.values()) else 0)
EOF
