"""The layers of ARCHITECTURE.md hold: ``lint-imports`` checks the contracts of ``pyproject.toml``.

A layer imports only the layers below it (commands -> launch -> trainer and the verl plugin ->
backends -> config -> platforms -> errors), nothing outside ``demo/`` imports the demo, the trainer
imports no backend, and the weight-sync backends do not import each other. The negative control
adds one upward import to a copy of the package and expects the contract to name it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        LINT_IMPORTS, cwd=root, env={"PYTHONPATH": str(root), "COLUMNS": "500"}, capture_output=True, text=True
    )


def test_the_layer_contracts_are_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "recipe", tmp_path / "recipe", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    platform = tmp_path / "recipe" / "one_step_off_async" / "platforms" / "cpu.py"
    platform.write_text(platform.read_text() + "\nfrom recipe.one_step_off_async.demo import assets  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "recipe.one_step_off_async.platforms.cpu -> recipe.one_step_off_async.demo.assets" in result.stdout
