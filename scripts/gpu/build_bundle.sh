#!/usr/bin/env bash
# Run HERE, on any x86-64 or Arm machine with pip, xz and the project's environment (no GPU): the stack the GPU
# machine lacks, packed into chunks that each travel in one device call (scripts/gpu/README.md).
#
# What: downloads wheels.txt (vLLM, Ray, verl and what they import on the recipe's GPU path, pinned) for CPython
# 3.12 / manylinux x86-64, installs them into a staging tree, prunes what the recipe's GPU path on a Hopper GPU
# never loads (below), adds the demo assets built here (the device then skips their ~1 min build), and
# compresses it all into one xz stream split into N equal chunks under CHUNK_MIB each.
# Output, git-ignored, under .gpu/ at the project root: p0..p{N-1}, bundle.txt (the joined stream's sha256 and N)
# and fa2 (the pruned FlashAttention-2 kernels, an optional extra chunk: see the README).
#
# Pruned (each one's loader catches its absence): Ray's Java jars, vLLM's Rust front end, vLLM's MoE kernels
# (vllm/platforms/cuda.py imports them in a try; a dense Qwen2 calls none), FlashAttention-2 (vLLM takes FA3 on
# Hopper: vllm/v1/attention/backends/fa_utils.py), extension modules built for other Pythons, type stubs.
#
#   bash scripts/gpu/build_bundle.sh        # ~12 min on 2 cores (xz -9); CHUNK_MIB=61 by default
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
G="$ROOT/scripts/gpu"
OUT_DIR="$ROOT/.gpu"
PYTHON=${PYTHON:-python3}
CHUNK_MIB=${CHUNK_MIB:-61}  # a call carries at most 64 MiB, the project's tracked files included
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --only-binary=:all:)
for t in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_31 manylinux_2_27 manylinux_2_24 manylinux_2_26 manylinux_2_5 manylinux1; do
  plat+=(--platform "${t}_x86_64")
done
mkdir -p "$work/wheels" "$work/gpu/assets" "$OUT_DIR"
# antlr4-python3-runtime 4.9.3 (omegaconf's pin) is an sdist only: its pure-Python wheel is built here.
grep -v '^antlr4' "$G/wheels.txt" | xargs "$PYTHON" -m pip download -q --no-deps "${plat[@]}" -d "$work/wheels"
"$PYTHON" -m pip wheel -q --no-deps -w "$work/wheels" "$(grep '^antlr4' "$G/wheels.txt")"
"$PYTHON" -m pip install -q --no-deps --no-compile --no-index --target "$work/gpu/site" "${plat[@]}" "$work"/wheels/*.whl
site="$work/gpu/site"
tar -C "$site" -cf - vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so | xz -9 -T2 >"$OUT_DIR/fa2"
rm -rf "$site/ray/jars" "$site/vllm/vllm-rs" "$site/vllm/_moe_C_stable_libtorch.abi3.so" \
  "$site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
find "$site" -name '*.pyi' -delete
find "$site" -name '*.cpython-3*.so' ! -name '*.cpython-312-*' -delete
# The demo assets (tiny model, tokenizer, task files), as ensure_assets keeps them: ONE_STEP_OFF_ASSETS_DIR.
assets=$(cd "$ROOT" && PYTHONPATH="$ROOT" "$PYTHON" -c \
  'from recipe.one_step_off_async.demo.assets import ensure_assets; print(ensure_assets().root)' | tail -1)
cp -r "$assets" "$work/gpu/assets/"
du -sh "$site" "$work/gpu/assets"
tar -C "$work/gpu" --sort=name -cf - site assets | xz -9 -T2 >"$work/bundle.tar.xz"
size=$(stat -c %s "$work/bundle.tar.xz")
chunks=$(((size + (CHUNK_MIB << 20) - 1) / (CHUNK_MIB << 20)))
echo "$(sha256sum "$work/bundle.tar.xz" | cut -d' ' -f1) $chunks" >"$OUT_DIR/bundle.txt"
rm -f "$OUT_DIR"/p[0-9]*
split -n "$chunks" -d -a 1 "$work/bundle.tar.xz" "$OUT_DIR/p"
tracked=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
echo "bundle $size bytes in $chunks chunks; the project's files that travel with each: $tracked bytes"
ls -l "$OUT_DIR"
largest=$(stat -c %s "$OUT_DIR"/p[0-9]* "$OUT_DIR/fa2" | sort -n | tail -1)
if ((largest + tracked + 4096 > 64 << 20)); then
  echo "a chunk and the project's files exceed a call's 64 MiB: lower CHUNK_MIB" >&2
  exit 1
fi
