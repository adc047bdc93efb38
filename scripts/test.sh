#!/usr/bin/env bash
# The test command: set up .venv (created or reused), then run the CPU test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast tests only.
# Two pytest-xdist workers by default (tests/conftest.py: one runs the main, fault and elastic launches back to back,
# the other the rest): a launch of the entry point leaves about a third of two cores idle.
# PYTEST_WORKERS=0 runs in one process (for -x, --pdb).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
WORKERS="${PYTEST_WORKERS:-2}"
if [ "$WORKERS" = 0 ]; then
  exec python -m pytest "$@"
fi
exec python -m pytest -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"
