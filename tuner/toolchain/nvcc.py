"""nvcc, and the cubins it builds, cached as the C toolchain caches its libraries (cc.cached_build)."""
from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from ..errors import SetupError
from .cc import cached_build, trim_errors

CANARY = 'extern "C" __global__ void tuner_canary(float* x) { x[threadIdx.x] = 0.0f; }\n'


@lru_cache(maxsize=1)
def nvcc() -> tuple:
    """(path, version line) of nvcc: $NVCC, else on PATH, else the toolkit's usual place."""
    cand = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
        raise SetupError("nvcc not found: install the CUDA toolkit and put its bin/ on PATH, or set NVCC")
    out = subprocess.run([cand, "--version"], capture_output=True, text=True)
    lines = [ln for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    return cand, (lines[-1] if lines else "unknown version")


def compile_cubin(source: str, target) -> tuple:
    """(path of the cached cubin, None) or (None, nvcc's message); SetupError when the machine fails."""
    return cached_build(source, list(target.nvcc_flags), nvcc(), ".cu", ".cubin", _check_nvcc_works, "CUDA kernels",
                        lambda cc, fl, out, src: [cc, *fl, "-cubin", "-o", str(out), str(src)])


def _check_nvcc_works(cc: str, flags: list, tmp: Path) -> None:
    cu = tmp / "canary.cu"
    cu.write_text(CANARY)
    proc = subprocess.run([cc, *flags, "-cubin", "-o", str(tmp / "canary.cubin"), str(cu)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SetupError("nvcc fails on a trivial kernel too, so the machine is at fault, not the candidate: "
                         f"{trim_errors(proc.stderr or proc.stdout, 300)}")
