#!/usr/bin/env bash
# The test command: set up .venv (created or reused), then run the CPU test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast tests only.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec python -m pytest "$@"
