"""``python -m benchmarks``: the list of benchmarks; ``python -m benchmarks <name> [args]``: run one.

The list shows each benchmark's name and the first line of its module's docstring, read from the source
(listing imports none of them: some start verl's CPU platform on import). A launch that fails or times out
ends the benchmark with its message (the command, the log to read), not a traceback.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

from benchmarks import BENCHMARKS, command_name


def summary(module: str) -> str:
    """The first line of ``benchmarks.<module>``'s docstring."""
    source = Path(importlib.util.find_spec(f"benchmarks.{module}").origin).read_text()
    return (ast.get_docstring(ast.parse(source)) or "").splitlines()[0]


def listing() -> str:
    names = {command_name(module): module for module in BENCHMARKS}
    width = max(map(len, names))
    lines = ["usage: python -m benchmarks <name> [args]   (<name> --help: what it measures and its options)", ""]
    lines += [f"  {name:<{width}}  {summary(module)}" for name, module in names.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    modules = {command_name(module): module for module in BENCHMARKS}
    name, *args = argv
    if name not in modules:
        print(f"unknown benchmark {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    from recipe.one_step_off_async.errors import RunFailed  # here: in a run's environment the recipe imports verl

    benchmark = importlib.import_module(f"benchmarks.{modules[name]}")
    try:
        benchmark.main(args)
    except (RunFailed, subprocess.TimeoutExpired) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
