#!/usr/bin/env bash
# Device, from the project root: the command of EVERY device call of the runbook (README.md), the same each time.
# Moves the bundle chunks this call carried (.gpu/p*) out of the project copy into /root/w ($GPU_CHUNKS), which outlives the
# call while the machine stays warm. The first call also prints what the machine has. The call that carries
# .gpu/bundle.txt (the last) checks that every chunk arrived, unpacks the stack into $GPU_STACK (/root/gpu) and
# runs scripts/gpu_verify.sh with it: verdicts, logs and the JSON summary in $OUT. Once installed, a call run again
# (say with CHECKS=recipe in front) skips the install and runs the checks.
set -uo pipefail
W=${GPU_CHUNKS:-/root/w}
first=0
[[ -d $W ]] || first=1
mkdir -p "$W"
mv .gpu/p[0-9]* .gpu/fa2 .gpu/bundle.txt "$W"/ 2>/dev/null
echo "chunks at hand: $(cd "$W" && ls p[0-9]* fa2 2>/dev/null | tr '\n' ' ')"
if ((first)); then
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
  command -v xz >/dev/null || echo "no xz here: install.sh unpacks with Python's lzma"
  df -h /root | tail -1
fi
[[ -f $W/bundle.txt ]] || exit 0  # more chunks to come
read -r sum chunks <"$W/bundle.txt"
GPU_STACK=${GPU_STACK:-/root/gpu}
if [[ $(cat "$GPU_STACK/.installed" 2>/dev/null) != "$sum" ]]; then  # installed once; a call run again only checks
  have=$(find "$W" -maxdepth 1 -name 'p[0-9]*' | wc -l)
  if ((have < chunks)); then
    echo "install: $have of $chunks chunks in $W so far: the next call carries the others (a fresh machine lost them)"
    exit 0
  fi
  bash scripts/gpu/install.sh || exit 1
fi
source scripts/gpu/env.sh
GPU_VERIFY_OWNS_MACHINE=1 bash scripts/gpu_verify.sh
