"""Loading built kernel libraries (cffi, ABI mode) safely."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import lru_cache

import numpy as np
from cffi import FFI

CDEF = """
int tuner_count(void);
int tuner_run(int i, float** args);
int tuner_time(int i, float** args, int number, int repeat, double min_repeat_ms, int flush, double* costs);
"""


@lru_cache(maxsize=1)
def _pin_openmp_runtime() -> None:
    """Keep libgomp loaded for the life of the process.

    A kernel library that pulled in libgomp and is later closed (cffi closes libraries when they
    are collected, at the latest at exit) would otherwise unload it under its own worker
    threads and crash the process.
    """
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL | getattr(os, "RTLD_NODELETE", 0))
    except OSError:
        pass  # no OpenMP runtime on this host: kernels built with -fopenmp would not load either


@lru_cache(maxsize=1)
def ffi() -> FFI:
    f = FFI()
    f.cdef(CDEF)
    return f


ALIGN_BYTES = 64


def aligned_empty(shape) -> np.ndarray:
    """A float32 array whose data starts on a 64-byte boundary.

    NumPy only promises 16 bytes, so where a kernel's 64-byte vector loads straddle cache lines
    would depend on where the allocator happened to put a buffer in that process. Kernels are
    timed on buffers aligned as PyTorch's allocator and compilers' runtimes align them.
    """
    n = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(n + ALIGN_BYTES // 4, np.float32)
    start = (-buf.ctypes.data % ALIGN_BYTES) // 4
    return buf[start: start + n].reshape(shape)


def aligned_copy(a) -> np.ndarray:
    out = aligned_empty(np.shape(a))
    out[...] = a
    return out


def pointer_array(arrays: list):
    """The `float**` a kernel takes, over C-contiguous float32 arrays that the caller keeps alive."""
    f = ffi()
    ptrs = f.new("float*[]", len(arrays))
    for k, a in enumerate(arrays):
        ptrs[k] = f.cast("float*", f.from_buffer(a))
    return ptrs


def open_library(path: str):
    """dlopen a library built by the builder; returns the cffi library object."""
    _pin_openmp_runtime()
    return ffi().dlopen(path)
