#!/usr/bin/env bash
# The recipe's GPU path (vLLM rollout, nccl weight sync, FSDP2 actor) on ONE GPU, on the built-in tiny task:
# staleness 0, then 1, a few steps each; prints the step-time split and the weight-sync time of each.
# Needs one NVIDIA GPU and `pip install -e ".[gpu]"`; the two pools time-share the GPU (one_step_off_ppo_1gpu).
#
#   bash scripts/gpu_smoke.sh [hydra overrides...]          # STEPS=8, STALENESS="0 1" by default
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS=${STEPS:-8}
status=0
for staleness in ${STALENESS:-0 1}; do
  echo "=== one GPU, staleness $staleness, $STEPS steps"
  python3 -m recipe.one_step_off_async.demo.run --config-name=one_step_off_ppo_1gpu \
    async_training.staleness="$staleness" trainer.total_training_steps="$STEPS" trainer.test_freq="$STEPS" \
    trainer.experiment_name="gpu_smoke_s$staleness" "$@" || status=$?
done
exit "$status"
