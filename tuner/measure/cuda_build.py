"""Batched CUDA builds: a batch's kernels in one .cu file, one nvcc call, one cubin.

Before anything is compiled each candidate is checked against the device's limits (threads per
block, static shared memory, the thread's local arrays against its registers); one over them is
rejected with that reason as its build error, never built. Cubins are cached as the C libraries
are (builder.py): named by a hash of source, flags and nvcc's version and by a hash of their own
bytes, renamed into place, checked before they are loaded. A batch nvcc refuses is compiled
candidate by candidate, so a bad one costs only itself; if a trivial kernel fails too, the
machine is at fault (SetupError).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from ..codegen.cuda import PRELUDE
from ..errors import SetupError
from ..target import MAX_REGS_PER_THREAD
from ..toolchain.cc import cache_dir, cached_library, remove_others, trim_errors
from ..toolchain.library import LIBRARY_DIRS, library_name, source_digest
from .builder import BuildResult

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


def limits_problem(kernel, target) -> str | None:
    """Why `kernel` (codegen.cuda.CudaKernel) cannot run on `target`, or None."""
    if kernel.block > target.max_threads:
        return f"{kernel.block} threads per block, the device allows {target.max_threads}"
    if kernel.shared_bytes > target.smem:
        return f"{kernel.shared_bytes} bytes of shared memory per block, the device allows {target.smem}"
    if kernel.local_floats > MAX_REGS_PER_THREAD:
        return f"{kernel.local_floats} floats of thread-local arrays, over {MAX_REGS_PER_THREAD} registers per thread"
    return None


def cubin_source(kernels: list) -> str:
    """One .cu file of `kernels` ([(name, source)])."""
    return PRELUDE + "\n".join(src for _, src in kernels)


def compile_cubin(source: str, target) -> tuple:
    """(path of the cached cubin, None) or (None, nvcc's message); SetupError when the machine fails."""
    cc, version = nvcc()
    flags = list(target.nvcc_flags)
    digest = source_digest(source, flags, version)
    d = cache_dir(LIBRARY_DIRS[".cubin"])
    cached, others = cached_library(d, digest, ".cubin")
    if cached is not None:
        return str(cached), None
    try:
        with tempfile.TemporaryDirectory(prefix=".build-", dir=d) as tmp:
            cu = Path(tmp) / f"{digest}.cu"
            cu.write_text(source)
            out_tmp = Path(tmp) / f"{digest}.cubin"
            proc = subprocess.run([cc, *flags, "-cubin", "-o", str(out_tmp), str(cu)], capture_output=True, text=True)
            if proc.returncode != 0:
                _check_nvcc_works(cc, flags, Path(tmp))
                return None, trim_errors(proc.stderr or proc.stdout)
            data = out_tmp.read_bytes()
            out = d / library_name(digest, data, ".cubin")
            os.replace(out_tmp, out)
            remove_others(others, out)
    except OSError as e:
        raise SetupError(f"cannot build CUDA kernels in {d}: {e.strerror or e}; free space there or set "
                         "TUNER_CACHE_DIR to another directory") from None
    return str(out), None


def _check_nvcc_works(cc: str, flags: list, tmp: Path) -> None:
    cu = tmp / "canary.cu"
    cu.write_text(CANARY)
    proc = subprocess.run([cc, *flags, "-cubin", "-o", str(tmp / "canary.cubin"), str(cu)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SetupError("nvcc fails on a trivial kernel too, so the machine is at fault, not the candidate: "
                         f"{trim_errors(proc.stderr or proc.stdout, 300)}")


def build_cuda_batch(batch: list, target) -> list:
    """One BuildResult per candidate (task.Candidate with `launch`), in order: `lib` the cubin,
    `index` unused (the kernel is found by its name)."""
    results: list = [None] * len(batch)
    todo = []
    for k, cand in enumerate(batch):
        problem = limits_problem(cand.launch, target)
        if problem:
            results[k] = BuildResult(None, 0, f"over the device's limits: {problem} (not built)", 0.0)
        else:
            todo.append(k)
    if not todo:
        return results
    start = time.perf_counter()
    path, err = compile_cubin(cubin_source([(batch[k].func_name, batch[k].source) for k in todo]), target)
    if path is not None:
        per = (time.perf_counter() - start) / len(todo)
        for k in todo:
            results[k] = BuildResult(path, 0, None, per)
        return results
    for k in todo:                      # find the one(s) nvcc refuses
        start = time.perf_counter()
        path, err = compile_cubin(cubin_source([(batch[k].func_name, batch[k].source)]), target)
        results[k] = BuildResult(path, 0, err, time.perf_counter() - start)
    return results
