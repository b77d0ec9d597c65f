"""Loading built kernel libraries (cffi, ABI mode) safely."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import lru_cache

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
