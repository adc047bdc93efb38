"""The recipe's benchmarks and measurements, one command each: ``python -m benchmarks <name> [args]``.

What: each benchmark is a module of this package with a ``main(argv)`` and an argparse ``--help`` whose
description is the module's docstring (what it measures, why, how to run it). ``python -m benchmarks``
lists them. The ones that train launch the real entry point through ``recipe.one_step_off_async.runs``
and read its metrics back by step.

Why: one place, one way to run them, and a smoke test (``tests/test_benchmarks_on_cpu.py``) that every
benchmark still parses its arguments; ``scripts/`` keeps set-up, demo and test commands.

How (from the repository root, with the project's virtualenv active)::

    python -m benchmarks                        # the list, one line each
    python -m benchmarks overlap --help
"""

from __future__ import annotations

import argparse

# The benchmarks, by module, in the order the list shows them; a command's name is its module's with dashes.
BENCHMARKS = (
    "overlap",
    "partial_rollout",
    "learning",
    "compare_verl",
    "weight_sync",
    "gloo_engine",
    "checkpoint_engine",
    "convergence_figure",
    "staleness_parity_figure",
)
# Modules that are not commands: what the weight-sync benchmarks share, and the patch compare_verl loads into verl.
HELPERS = ("weight_sync_common", "verl_one_step_off_dumps")


def command_name(module: str) -> str:
    """``benchmarks.partial_rollout`` or ``partial_rollout`` -> ``partial-rollout``."""
    return module.rpartition(".")[2].replace("_", "-")


def argument_parser(module: str, docstring: str) -> argparse.ArgumentParser:
    """A benchmark's parser: usage ``python -m benchmarks <name>``, the module's docstring as its description."""
    return argparse.ArgumentParser(
        prog=f"python -m benchmarks {command_name(module)}",
        description=docstring,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
