#!/usr/bin/env bash
# The main job: set up .venv (created or reused), then train one-step-off GRPO on the built-in
# tiny task on CPU. Extra arguments are hydra overrides, e.g. `async_training.staleness=0`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec python -m recipe.one_step_off_async.demo.run "$@"
