"""Check, without a GPU, that ``pip install -e ".[gpu]"`` installs every module the GPU path imports.

    python scripts/check_gpu_deps.py    # needs the package index; a few minutes; installs nothing

It imports the recipe: run it in the project's environment (``scripts/setup_env.sh`` installs the project).

What: pip's own resolver (``pip install --dry-run --report``, binary wheels only, ``--ignore-installed``)
resolves the project's ``gpu`` extra for Linux x86-64, CPython 3.12, glibc up to 2.35 (the CUDA images'
Ubuntu 22.04; vLLM's dependencies need more than manylinux_2_28). Then every module the GPU path
imports must come from a resolved distribution:

- the modules the preflight (recipe/one_step_off_async/preflight.py) requires for the GPU profile's
  backends (vLLM rollout, nccl weight sync), with the distributions its table names;
- the module-level imports of verl's modules on the GPU path (VERL_GPU_PATH) and every import of the
  recipe's own code, read from the source; module -> distribution from the preflight table, else
  from this environment's installed metadata.

flash-attn (the ``flash`` extra, for flash_attention_2) has no wheels on PyPI: the script checks that
the version verl pins exists there, and says whether a binary wheel for the target appeared.
Prints the resolved versions of the key packages; exits 1 naming every module nothing provides.
pip uses its own cache (``pip cache dir``): this index serves no separate metadata files, so the first
check downloads the resolved wheels (about 1.5 GB, a few minutes); later checks on the machine resolve
from the cache.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from recipe.one_step_off_async.preflight import REQUIREMENTS, required_modules

ROOT = Path(__file__).resolve().parents[1]

PYTHON_VERSION = "3.12"
GLIBC_MINOR = 35  # manylinux_2_35 and older
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
TARGET = ["--python-version", PYTHON_VERSION, "--implementation", "cp"] + [
    arg for platform in PLATFORMS for arg in ("--platform", platform)
]
# Pure-Python dependencies published only as sdists (omegaconf pins antlr4 4.9.*): a resolve for another
# platform takes wheels only, so they are built here into a local wheel folder first.
SDIST_ONLY = ["antlr4-python3-runtime==4.9.3"]
# verl modules the GPU path runs (trainer, FSDP engine, vLLM server, nccl engine, agent loop).
VERL_GPU_PATH = [
    "verl/trainer/main_ppo.py",
    "verl/trainer/ppo/ray_trainer.py",
    "verl/experimental/separation/ray_trainer.py",
    "verl/workers/engine_workers.py",
    "verl/workers/engine/fsdp/transformer_impl.py",
    "verl/workers/rollout/replica.py",
    "verl/workers/rollout/vllm_rollout/vllm_async_server.py",
    "verl/checkpoint_engine/nccl_checkpoint_engine.py",
    "verl/experimental/agent_loop/agent_loop.py",
]
KEY_PACKAGES = ["torch", "vllm", "verl", "cupy-cuda13x", "transformers", "ray", "tensordict", "flash-attn"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env)


def third_party_imports(path: Path, module_level_only: bool) -> set[str]:
    """Top-level names ``path`` imports, minus the stdlib, the recipe and imports guarded by ``except ImportError``."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue  # annotations only
            if isinstance(node, ast.Try):
                caught = {getattr(handler.type, "id", None) for handler in node.handlers}
                if caught & {"ImportError", "ModuleNotFoundError", "Exception", None}:
                    continue  # an optional import
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit([child for child in getattr(node, field, []) if isinstance(child, ast.AST)])

    visit(ast.parse(path.read_text()).body)
    return {name for name in found if name not in sys.stdlib_module_names and name not in ("__future__", "recipe")}


def gpu_path_modules() -> dict[str, list[str]]:
    """Module -> who imports it: the preflight's needs for the GPU profile, verl's GPU path, the recipe."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        config = compose(config_name="one_step_off_ppo_trainer")
    modules: dict[str, list[str]] = {}
    for need in required_modules(config):
        modules.setdefault(need.requirement.module, []).append(f"preflight: {', '.join(need.selected_by)}")
    verl_root = Path(importlib.util.find_spec("verl").origin).parents[1]
    for relative in VERL_GPU_PATH:
        for name in third_party_imports(verl_root / relative, module_level_only=True):
            modules.setdefault(name, []).append(relative)
    for path in sorted((ROOT / "recipe").rglob("*.py")):
        for name in third_party_imports(path, module_level_only=False):
            modules.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return modules


@functools.cache
def installed_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    """The distributions that provide ``module``: the preflight table's, else this environment's metadata."""
    top = module.split(".")[0]
    named = {canonical(r.distribution) for r in REQUIREMENTS.values() if r.module.split(".")[0] == top}
    return named or {canonical(d) for d in installed_distributions().get(top, [])}


def resolve_gpu_extra(work: Path, env: dict[str, str]) -> dict[str, str]:
    """Resolve ``.[gpu]`` for the target with pip's resolver; return {distribution: version}."""
    wheels = work / "wheels"
    built = pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), *SDIST_ONLY, env=env)
    if built.returncode:
        sys.exit(f"Building {SDIST_ONLY} failed:\n{built.stderr[-3000:]}")
    report = work / "report.json"
    resolved = pip(
        "install", "--dry-run", "--quiet", "--ignore-installed", "--only-binary=:all:", *TARGET,
        "--find-links", str(wheels), "--report", str(report), "-e", f"{ROOT}[gpu]",
        env=env,
    )  # fmt: skip
    if resolved.returncode:
        sys.exit(
            f"pip could not resolve .[gpu] for CPython {PYTHON_VERSION} / {PLATFORMS[0]}:\n{resolved.stderr[-5000:]}"
        )
    install = json.loads(report.read_text())["install"]
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in install}


def flash_attn_pin(env: dict[str, str]) -> tuple[str, str]:
    """(version verl pins for the ``flash`` extra, what the index offers for it)."""
    verl = importlib.metadata.distribution("verl")
    pins = [r for r in verl.requires or [] if r.startswith("flash-attn==") and "flash-attn-cu130torch211" in r]
    if not pins:
        sys.exit(
            "verl's metadata has no flash-attn pin under extra flash-attn-cu130torch211: update the `flash` extra."
        )
    version = pins[0].split(";")[0].removeprefix("flash-attn==").strip()
    listed = pip("index", "versions", "flash-attn", env=env)
    if version not in re.split(r"[,\s]+", listed.stdout):
        sys.exit(f"flash-attn {version} (verl's pin) is not on the index:\n{listed.stdout}{listed.stderr[-2000:]}")
    wheels = pip("index", "versions", "--only-binary=:all:", *TARGET, "flash-attn", env=env)
    in_wheels = version in re.split(r"[,\s]+", wheels.stdout)
    offered = "a binary wheel for the target exists" if in_wheels else "sdist only: compiled at install time"
    return version, offered


def unprovided(resolved: dict[str, str]) -> list[str]:
    """One line per module the GPU path imports that no distribution in ``resolved`` provides."""
    missing = []
    for module, importers in sorted(gpu_path_modules().items()):
        wanted = distributions_of(module)
        if not wanted & set(resolved):
            why = f"from {sorted(wanted)}" if wanted else "no known distribution: add it to preflight.REQUIREMENTS"
            missing.append(f"{module} ({why}), imported by {', '.join(importers[:3])}")
    return missing


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="check_gpu_deps-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        resolved = resolve_gpu_extra(work, env)
        flash_version, flash_offered = flash_attn_pin(env)

    missing = unprovided(resolved)
    print(
        f"resolved .[gpu] for CPython {PYTHON_VERSION} / x86-64 / glibc 2.{GLIBC_MINOR}: {len(resolved)} distributions"
    )
    for name in KEY_PACKAGES:
        if name == "flash-attn":
            print(f"  flash-attn {flash_version} (the `flash` extra, verl's pin; {flash_offered})")
        else:
            print(f"  {name} {resolved.get(name, 'NOT RESOLVED')}")
    if missing:
        print("Modules the GPU path imports that .[gpu] does not provide:\n" + "\n".join(f"  - {m}" for m in missing))
        return 1
    print("every module the GPU path imports is provided by the resolved set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
