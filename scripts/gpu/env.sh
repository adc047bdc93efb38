# Source on the device from the project root (call.sh does): the carried stack first on the path, offline flags.
# The one-GPU profile needs no shim: the recipe's own platforms/one_gpu.py maps both pools to the one device and
# gives every process an NCCL host id; the weight-sync benchmark gives each rank its own.
export GPU_STACK=${GPU_STACK:-/root/gpu}
export PYTHONPATH="$GPU_STACK/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export ONE_STEP_OFF_ASSETS_DIR=$GPU_STACK/assets PYTHONUNBUFFERED=1
# flashinfer is not carried; vLLM's sampler imports it unless told not to.
export VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
