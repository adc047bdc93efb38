#!/usr/bin/env bash
# One-step-off GRPO: Qwen2.5-3B-Instruct on GSM8K, one node of 8 GPUs split 4 train (FSDP2) / 4 rollout
# (vLLM, one replica per GPU), NCCL weight sync after every step, staleness 1, partial rollout (a sync interrupts
# the requests in flight, which continue under the new weights; PARTIAL_ROLLOUT=false: each sync waits for idle).
#
#   pip install -e ".[gpu]"
#   pip install --no-build-isolation -e ".[gpu,flash]"   # flash-attn: compiles ~1 h against torch, needs nvcc
#   MODEL_PATH=/models/Qwen2.5-3B-Instruct DATA_DIR=~/data/gsm8k bash run_qwen2_5_3b.sh [hydra overrides]
#
# Without flash-attn: ATTN=sdpa bash run_qwen2_5_3b.sh (padded micro-batches; main_ppo names what is missing).
#
# The GSM8K parquet files are prepared on first use (GSM8K_SOURCE: a local copy; else downloaded).
# Check the launch without GPUs: ENTRY_MODULE=recipe.one_step_off_async.check_config bash run_qwen2_5_3b.sh
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
STALENESS=${STALENESS:-1}
PARTIAL_ROLLOUT=${PARTIAL_ROLLOUT:-true}
TRAIN_GPUS=${TRAIN_GPUS:-4}
ROLLOUT_GPUS=${ROLLOUT_GPUS:-4}
PROJECT=${PROJECT:-one_step_off_async}
EXPERIMENT=${EXPERIMENT:-qwen2_5_3b_gsm8k_grpo_s${STALENESS}$([ "$PARTIAL_ROLLOUT" != false ] || echo _whole_batches)}
ENTRY_MODULE=${ENTRY_MODULE:-recipe.one_step_off_async.main_ppo}
# flash_attention_2 packs sequences without padding (use_remove_padding); sdpa runs on `.[gpu]` alone.
ATTN=${ATTN:-flash_attention_2}
REMOVE_PADDING=$([ "$ATTN" = flash_attention_2 ] && echo true || echo false)

# check_config reports missing data files as "not found on this machine" instead of downloading them.
if [ "$ENTRY_MODULE" != recipe.one_step_off_async.check_config ] \
  && { [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; }; then
  python3 -m recipe.one_step_off_async.data.gsm8k --output-dir "$DATA_DIR" ${GSM8K_SOURCE:+--source "$GSM8K_SOURCE"}
fi

python3 -m "$ENTRY_MODULE" \
  async_training.staleness="$STALENESS" \
  async_training.partial_rollout="$PARTIAL_ROLLOUT" \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=512 \
  data.max_response_length=1024 \
  data.filter_overlong_prompts=true \
  data.truncation=error \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.override_config.attn_implementation="$ATTN" \
  actor_rollout_ref.model.use_remove_padding="$REMOVE_PADDING" \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.strategy=fsdp2 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.use_dynamic_bsz=true \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.85 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true \
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768 \
  actor_rollout_ref.rollout.nnodes=1 \
  actor_rollout_ref.rollout.n_gpus_per_node="$ROLLOUT_GPUS" \
  actor_rollout_ref.rollout.checkpoint_engine.backend=nccl \
  actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1024 \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node="$TRAIN_GPUS" \
  trainer.critic_warmup=0 \
  trainer.logger='[console,wandb]' \
  trainer.project_name="$PROJECT" \
  trainer.experiment_name="$EXPERIMENT" \
  trainer.val_before_train=true \
  trainer.test_freq=10 \
  trainer.save_freq=50 \
  trainer.total_epochs=15 \
  "$@"
