"""vLLM's general plugin for the recipe's CPU runs: linear layers keep their weights, so a weight sync can reload them.

vLLM's CPU platform hands each linear layer's weight to oneDNN when the model loads and drops the parameter
(``vllm/model_executor/layers/utils.py`` ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, vLLM 0.27).
A weight sync then fails inside vLLM's worker (``AttributeError: 'Parameter' object has no attribute
'weight_loader'``), and a weight that stayed would not reach oneDNN's packed copy anyway. With oneDNN off, vLLM
computes those layers with ``torch.nn.functional.linear`` on the parameter itself, which verl's weight update
overwrites in place. vLLM loads the ``vllm.general_plugins`` entry points (``pyproject.toml``) in every engine and
worker process; this one acts only in a CPU run of the recipe (``VERL_PLATFORM=cpu``).
"""

from __future__ import annotations

import os

from recipe.one_step_off_async.platforms.verl_patches import CPU_PLATFORM, PLATFORM_ENV


def keep_linear_weights_reloadable() -> None:
    """Entry point ``vllm.general_plugins``: in a CPU run, vLLM's linear layers compute with torch's linear."""
    if os.environ.get(PLATFORM_ENV, "").strip().lower() != CPU_PLATFORM:
        return
    from vllm import _custom_ops

    _custom_ops._supports_onednn = False
