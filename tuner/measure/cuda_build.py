"""Batched CUDA builds: a batch's kernels in one .cu file, one nvcc call, one cubin.

Before anything is compiled each candidate is checked against the device's limits (threads per
block, static shared memory, the thread's local arrays against its registers); one over them is
rejected with that reason as its build error, never built. Cubins are cached as the C libraries
are (toolchain.cc.cached_build): named by a hash of source, flags and nvcc's version and by a hash of their own
bytes, renamed into place, checked before they are loaded. A batch nvcc refuses is compiled
candidate by candidate, so a bad one costs only itself; if a trivial kernel fails too, the
machine is at fault (SetupError).
"""
from __future__ import annotations

import time

from ..codegen.cuda import PRELUDE
from ..target import MAX_REGS_PER_THREAD
from ..toolchain.nvcc import compile_cubin
from .builder import BuildResult

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
