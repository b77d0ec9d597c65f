"""Loading built kernel libraries (cffi, ABI mode) safely.

A library's file name ends in a hash of its own bytes (`<source hash>-<content hash>.so`), and
nothing is loaded whose bytes do not match that name: a planted, replaced, truncated or empty file
in the cache is never dlopened (its constructors would run in our process), it is rebuilt.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
from cffi import FFI

from ..errors import SetupError

CDEF = """
int tuner_count(void);
int tuner_run(int i, float** args);
int tuner_time(int i, float** args, int number, int repeat, double min_repeat_ms, int flush, double* costs);
int tuner_time_cold(int i, float** args, int nargs, const long long* cold, int number, int repeat,
                    double min_repeat_ms, double* costs);
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


def pointer_array(arrays: list, lib_ffi: FFI | None = None):
    """The `float**` a kernel (or a compiled model, with its `lib_ffi`) takes, over C-contiguous
    float32 arrays that the caller keeps alive."""
    f = lib_ffi or ffi()
    ptrs = f.new("float*[]", max(1, len(arrays)))
    for k, a in enumerate(arrays):
        ptrs[k] = f.cast("float*", f.from_buffer(a))
    return ptrs


CONTENT_HASH_CHARS = 16
SOURCE_DIGEST_CHARS = 24
# per kind of built file, by suffix: the kernel cache's subdirectory it is kept in (cc.cache_dir)
LIBRARY_DIRS = {".so": "kernels", ".cubin": "cuda", ".o": "objects"}
# every library name library_name gives (a file sent from elsewhere must have one: cluster build
# workers send libraries, never objects)
LIBRARY_NAME = re.compile(rf"[0-9a-f]{{{SOURCE_DIGEST_CHARS}}}-[0-9a-f]{{{CONTENT_HASH_CHARS}}}"
                          rf"({'|'.join(re.escape(k) for k in LIBRARY_DIRS if k != '.o')})")


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:CONTENT_HASH_CHARS]


def source_digest(source: str, flags: list, compiler_version: str) -> str:
    """What a library is built from: its source, the compiler's flags and version."""
    return hashlib.sha256("\0".join([source, " ".join(flags), compiler_version]).encode()).hexdigest()[
        :SOURCE_DIGEST_CHARS]


def library_name(digest: str, data: bytes, suffix: str = ".so") -> str:
    """The cache file name of a built library: what it was built from, then what it holds."""
    return f"{digest}-{content_hash(data)}{suffix}"


def verified_bytes(path) -> bytes | None:
    """The file's bytes, where they are the ones its name promises; else None."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    stem = Path(path).stem
    return data if data and "-" in stem and stem.rsplit("-", 1)[1] == content_hash(data) else None


def verified(path) -> bool:
    """Whether the file's bytes are the ones its name promises."""
    return verified_bytes(path) is not None


class LibraryError(SetupError):
    """A kernel library changed on disk after it was built."""


def open_library(path: str, lib_ffi: FFI | None = None):
    """dlopen a library built by the builder, after checking its bytes against its name (with
    `lib_ffi`'s declarations; the kernel harness's by default)."""
    if not verified(path):
        raise LibraryError(f"kernel library {path} does not match the content hash in its name (changed or "
                           "truncated after it was built); refusing to load it. Remove it, and check who else "
                           "writes to the kernel cache (TUNER_CACHE_DIR)")
    _pin_openmp_runtime()
    return (lib_ffi or ffi()).dlopen(path)
