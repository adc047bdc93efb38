#!/usr/bin/env bash
# The recipe's GPU features checked on ONE GPU in one command (under 10 minutes), one verdict line each.
#
# What: three sections, each under its own timeout; after each, its verdict line, `PASS|FAIL name: detail`, and
# the JSON summary rewritten with every verdict so far (the per-step metrics, the sync timings, the logs' paths),
# so that a run cut short keeps what ran:
#   stack              the GPU stack imports and starts: torch sees the GPU, cupy's NCCL, vLLM's CUDA kernels
#                      and its FlashAttention (FA3 on Hopper, the version vLLM takes there), Ray, verl, the recipe.
#   weight_sync_nccl   verl's `nccl` checkpoint engine at real model shapes (python -m benchmarks weight-sync:
#                      the Qwen2.5-3B config, random weights, 1 sender -> 1 receiver, both on the GPU), fp32 (what
#                      the FSDP2 actor holds) against bf16 (the rollout's dtype, what a sync sends), side by side
#                      on the same ranks: median sync seconds per dtype, the GB/s it implies, and bf16's time over
#                      fp32's, at most SYNC_RATIO_BOUND.
#   recipe_partial_s1  the entry point on the one-GPU profile (one_step_off_ppo_1gpu: vLLM rollout, nccl weight
#                      sync in the rollout's dtype, FSDP2 actor, both pools time-sharing the GPU) at staleness 1
#                      with partial rollout, for STEPS steps on the demo's long-tail task cut to its responses of
#                      LONG_BUDGET tokens or more (300-480, exactly each prompt's budget), so that every sync lands
#                      while the next batch generates: vLLM aborts the requests in flight, the recipe's client
#                      resumes them under the new weights. From the metrics file: every step synced
#                      (async/synced = 1, timing_s/sync_weights > 0); the contract's versions, which the trainer
#                      checks on every token (in [k-2, k-1]; it fails the run otherwise): async/staleness = 1 from
#                      step 2 (the oldest token of batch k sampled by v(k-2); step 1's batch by v0 by
#                      construction), async/version_span_max <= 1; the abort path: samples sampled by two versions
#                      (async/partial_ratio > 0) and their prefixes prefilled again (async/recomputed_prefill_tokens
#                      > 0) in some step; the syncs exact: training/rollout_probs_diff_max within its bounds (below).
#
# One launch checks both staleness 1's contract and partial rollout: each launch costs ~4-5 minutes of start-up on
# this GPU (below), two would not fit. Whole-batch mode (every sample of batch k from v(k-2) exactly) runs on every
# landing on vLLM's CPU build (`bash scripts/test.sh -m e2e`), as do the other features through verl's vLLM path
# (multi-turn, a reward model, LoRA, GAE, elastic).
#
# The probability bounds: training/rollout_probs_diff_max is max |p_actor - p_rollout| over the batch's response
# tokens (probabilities, not log-probabilities; verl.utils.debug.metrics), logged in decoupled mode (the run sets it:
# the profiles' bypass mode recomputes no log-probs to compare). At step 1 both sides hold v0, which
# vLLM (started with dummy weights) received through the nccl sync: the difference is numerics alone, bf16 on
# both sides with different kernels: 0.006 measured on an H100 over the short task's ~400 tokens; a batch of this
# task holds ~20 times more tokens, whose largest difference is larger: bound PROBS_DIFF_BOUND_SAME (0.05). From
# step 2 the actor is one update (lr 1e-4) ahead of the weights that sampled part of the batch, which moves single
# tokens by more: 0.05-0.12 measured on the short task, bound PROBS_DIFF_BOUND_ONE_UPDATE (0.3). Measured on this
# task on one H200 (2026-11-28): 0.0155 at step 1, 0.19, 0.23, 0.25, 0.27 at steps 2-5 (growing as the policy moves;
# Pearson 0.99-0.97): a run of more STEPS needs a larger second bound. The summary keeps every step's max, mean and
# Pearson correlation.
# Weights that arrive wrong (misnamed, truncated, garbage) sample tokens the actor gives a very different
# probability, O(0.5-1).
#
# Why: one reproducible check of the GPU path and of what a weight sync costs at the sizes the recipe targets,
# on the smallest GPU machine that runs it. Both pools and both sync ranks share the one GPU; NCCL then talks
# over its socket transport (a NCCL_HOSTID per process), so the GB/s is a one-GPU lower bound, not NVLink's.
#
# How (from anywhere; needs one NVIDIA GPU with ~45 GB free and `pip install -e ".[gpu]"`, or the carried stack of
# scripts/gpu/README.md):
#   bash scripts/gpu_verify.sh [SUMMARY.json]    # default: $OUT/gpu_verify.json, else outputs/gpu_verify/
# Logs (stack.log, weight_sync.log/.json, recipe.log, recipe.metrics.jsonl) go next to the summary.
# Exit status: 0 when no verdict is FAIL. Knobs (environment): CHECKS ("stack sync recipe"), STEPS (5),
# LONG_BUDGET (300), ROLLOUT_EAGER (1: vLLM without torch.compile and CUDA graphs, ~1 min less start-up; 0: the
# profile's), PROBS_DIFF_BOUND_SAME (0.05), PROBS_DIFF_BOUND_ONE_UPDATE (0.3), SHAPES (qwen2.5-3b), SYNC_DTYPES
# (float32,bfloat16), SYNC_REPS (3), SYNC_RATIO_BOUND (0.55), TOTAL_S (480), STACK_TIMEOUT_S (60),
# SYNC_TIMEOUT_S (150), RECIPE_TIMEOUT_S (400), PYTHON (python3). On one H100 the recipe section took ~345 s with
# the short task and CUDA graphs (~170 s to the vLLM server's spawn, ~95 s vLLM init, ~40 s for the 5 steps of
# which ~28 s the first generation, ~30 s shutdown), and the sync section ~92 s (three shapes in fp32). This version
# on one H200 (2026-11-28, the carried stack): stack 30 s, sync 83 s, recipe 335 s, 454 s in all
# (scripts/gpu/README.md).
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

CHECKS=${CHECKS:-stack sync recipe}
STEPS=${STEPS:-5}
LONG_BUDGET=${LONG_BUDGET:-300}
ROLLOUT_EAGER=${ROLLOUT_EAGER:-1}
PROBS_DIFF_BOUND_SAME=${PROBS_DIFF_BOUND_SAME:-0.05}
PROBS_DIFF_BOUND_ONE_UPDATE=${PROBS_DIFF_BOUND_ONE_UPDATE:-0.3}
SHAPES=${SHAPES:-qwen2.5-3b}
SYNC_DTYPES=${SYNC_DTYPES:-float32,bfloat16}
SYNC_REPS=${SYNC_REPS:-3}
SYNC_RATIO_BOUND=${SYNC_RATIO_BOUND:-0.55}
TOTAL_S=${TOTAL_S:-480}
STACK_TIMEOUT_S=${STACK_TIMEOUT_S:-60}
SYNC_TIMEOUT_S=${SYNC_TIMEOUT_S:-150}
RECIPE_TIMEOUT_S=${RECIPE_TIMEOUT_S:-400}
START_S=$SECONDS
export LOG_DIR SUMMARY CHECKS STEPS LONG_BUDGET ROLLOUT_EAGER PROBS_DIFF_BOUND_SAME PROBS_DIFF_BOUND_ONE_UPDATE \
  SHAPES SYNC_DTYPES SYNC_RATIO_BOUND TOTAL_S
rm -f "$SUMMARY"

# A section's timeout: its cap, or what is left of TOTAL_S if less (at least 1 s: `timeout 0` would not bound it;
# a section with no time left fails as timed out at once).
section_timeout() {
  local left=$((TOTAL_S - (SECONDS - START_S)))
  left=$((left < $1 ? left : $1))
  echo $((left < 1 ? 1 : left))
}

# A section killed at its timeout can leave its Ray cluster running, which the next section's ray.init would join.
# On the lent machine (scripts/gpu/call.sh sets GPU_VERIFY_OWNS_MACHINE=1) every Ray cluster is this script's; on a
# machine of yours `ray stop` would stop your other clusters too, so it is not run there.
stop_ray() {
  [[ ${GPU_VERIFY_OWNS_MACHINE:-0} == 1 ]] && "$PYTHON" -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
}

# After each section: its verdict printed, the summary rewritten with the verdicts of every section run so far.
summarize() {
  ELAPSED_S=$((SECONDS - START_S)) "$PYTHON" "$ROOT/scripts/gpu_verify.py" "$1"
}

if [[ " $CHECKS " == *" stack "* ]]; then
  timeout_s=$(section_timeout "$STACK_TIMEOUT_S")
  echo "=== stack: the GPU stack's imports (timeout ${timeout_s}s)"
  section_start=$SECONDS
  timeout -k 10 "$timeout_s" "$PYTHON" - >"$LOG_DIR/stack.log" 2>&1 <<'EOF'
import importlib.metadata as metadata
import json

import torch

assert torch.cuda.is_available(), "torch sees no GPU"
from cupy.cuda import nccl

import vllm._C_stable_libtorch  # noqa: F401  (vLLM's CUDA kernels)
from vllm.vllm_flash_attn import flash_attn_interface as fa

import ray  # noqa: F401
import verl.checkpoint_engine.nccl_checkpoint_engine  # noqa: F401
import verl.workers.rollout.vllm_rollout.vllm_async_server  # noqa: F401  (vLLM's server and OpenAI entry points)
import recipe.one_step_off_async.main_ppo  # noqa: F401


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


major, minor = torch.cuda.get_device_capability()
found = {
    "gpu": torch.cuda.get_device_name(),
    "capability": f"{major}.{minor}",
    "torch": torch.__version__,
    "torch_nccl": ".".join(map(str, torch.cuda.nccl.version())),
    "cupy_nccl": nccl.get_version(),
    **{name: version(name) for name in ("vllm", "verl", "ray", "transformers", "cupy-cuda13x")},
    "fa2": fa.FA2_AVAILABLE,
    "fa3": fa.FA3_AVAILABLE,
}
print("STACK " + json.dumps(found))
# vLLM takes FA3 on Hopper (vllm/v1/attention/backends/fa_utils.py), FA2 elsewhere: the one it takes must load.
assert (fa.FA3_AVAILABLE if major == 9 else fa.FA2_AVAILABLE), (
    f"vLLM's FlashAttention for capability {major}.{minor} did not load: "
    f"{fa.FA3_UNAVAILABLE_REASON if major == 9 else fa.FA2_UNAVAILABLE_REASON}"
)
EOF
  export STACK_RC=$? STACK_S=$((SECONDS - section_start))
  summarize stack
fi

if [[ " $CHECKS " == *" sync "* ]]; then
  timeout_s=$(section_timeout "$SYNC_TIMEOUT_S")
  echo "=== weight_sync_nccl: $SHAPES, $SYNC_DTYPES side by side, $SYNC_REPS timed syncs each (timeout ${timeout_s}s)"
  rm -f "$LOG_DIR/weight_sync.json"
  section_start=$SECONDS
  timeout -k 15 "$timeout_s" "$PYTHON" -m benchmarks weight-sync --backend nccl --receivers 1 --dtype "$SYNC_DTYPES" \
    --reps "$SYNC_REPS" --shape "$SHAPES" --json "$LOG_DIR/weight_sync.json" >"$LOG_DIR/weight_sync.log" 2>&1
  export SYNC_RC=$? SYNC_S=$((SECONDS - section_start))
  stop_ray
  summarize sync
fi

if [[ " $CHECKS " == *" recipe "* && " $CHECKS " == *" stack "* && ${STACK_RC:-0} != 0 ]]; then
  echo "=== recipe_partial_s1: skipped, the stack did not import (its verdict above)"
  CHECKS=${CHECKS/recipe/}  # no verdict expected: the stack's FAIL is the run's
  export CHECKS
elif [[ " $CHECKS " == *" recipe "* ]]; then
  timeout_s=$(section_timeout "$RECIPE_TIMEOUT_S")
  echo "=== recipe_partial_s1: $STEPS steps at staleness 1, partial rollout, responses >= $LONG_BUDGET tokens (timeout ${timeout_s}s)"
  rm -f "$LOG_DIR/recipe.metrics.jsonl"
  run_dir=$(mktemp -d)
  section_start=$SECONDS
  (
    cd "$run_dir" || exit 1
    # The long-tail task's rows of LONG_BUDGET tokens or more (the demo assets are built first if missing).
    "$PYTHON" - "$run_dir/long_train.parquet" "$LONG_BUDGET" <<'EOF' || exit 1
import sys

import pyarrow.parquet as pq

from recipe.one_step_off_async.demo.assets import ensure_assets

table = pq.read_table(ensure_assets().long_tail_train_file)
rows = [i for i, row in enumerate(table.column("extra_info").to_pylist()) if row["response_budget"] >= int(sys.argv[2])]
pq.write_table(table.take(rows), sys.argv[1])
print(f"{len(rows)} long-tail rows of {sys.argv[2]}+ tokens")
EOF
    VERL_FILE_LOGGER_PATH="$LOG_DIR/recipe.metrics.jsonl" timeout -k 15 "$timeout_s" \
      "$PYTHON" -m recipe.one_step_off_async.main_ppo --config-name=one_step_off_ppo_1gpu \
      async_training.staleness=1 async_training.partial_rollout=true trainer.total_training_steps="$STEPS" \
      algorithm.rollout_correction.bypass_mode=false algorithm.rollout_correction.rollout_is=token \
      trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 \
      'trainer.logger=[console,file]' trainer.experiment_name=gpu_verify "trainer.default_local_dir=$run_dir/ckpt" \
      async_training.generation_timeout_s=180 async_training.sync_timeout_s=90 \
      "data.train_files=$run_dir/long_train.parquet" 'data.val_files=${demo_asset:long_tail_val_file}' \
      data.max_prompt_length=16 data.max_response_length=480 data.train_batch_size=4 \
      actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
      actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
      'actor_rollout_ref.rollout.agent.agent_loop_config_path=${demo_asset:long_tail_agent_loop_config}' \
      "actor_rollout_ref.rollout.enforce_eager=$([[ $ROLLOUT_EAGER == 1 ]] && echo true || echo false)" \
      +ray_kwargs.ray_init.num_gpus=2
  ) >"$LOG_DIR/recipe.log" 2>&1
  export RECIPE_RC=$? RECIPE_S=$((SECONDS - section_start))
  stop_ray
  rm -rf "$run_dir"
  summarize recipe
fi

ELAPSED_S=$((SECONDS - START_S)) "$PYTHON" "$ROOT/scripts/gpu_verify.py" --final
