#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install the recipe for CPU.
# Sourced by scripts/run_demo.sh and scripts/test.sh; re-installs only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.recipe-install-stamp"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # torch first and pinned: an unpinned torch would pull the CUDA build through verl's deps.
  "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[cpu,dev]"
  echo "$WANT" >"$STAMP"
fi
export PATH="$VENV/bin:$PATH"
