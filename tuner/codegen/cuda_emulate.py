"""Runs generated CUDA C on the CPU, block by block and thread by thread, as a GPU would be
obliged to: a check of kernels that needs no GPU.

The kernel's own source is compiled as C++ (toolchain.cc.compile_library) against a small runtime:
every CUDA thread of a block is a coroutine (ucontext) with its own stack, and `__syncthreads()`
hands control back to a scheduler that runs each thread of the block up to its next barrier
before any passes it. So what the barriers promise holds and nothing more: a thread runs its whole stretch between two
barriers before the next thread starts its own, in thread order or (reverse=True) the other
way, and a barrier left out shows as a wrong result in one of the two orders. On top of the
serial emulation of the loop nest (codegen.cuda.serial_copy) this checks the source nvcc gets:
that shared tiles are filled by the threads that bind the fill and read only after a barrier,
that every thread reaches the same barriers, that every index of a global or shared buffer is
in bounds, and that every float4 access is 16-byte aligned. Shared buffers start each block
filled with NaN, so a read of what no thread wrote shows in the output.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
from cffi import FFI

from ..ops import make
from ..toolchain.cc import compile_library
from ..toolchain.library import aligned_copy, aligned_empty, open_library, pointer_array
from .cuda import PRELUDE

RUNTIME = r"""
#include <ucontext.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __align__(n)
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }

struct tuner_dim { int x; };
static tuner_dim threadIdx, blockIdx;
static int tuner_error;                 /* the first problem met; the emulation stops at it */
static char tuner_message[512];

static void tuner_fail(const char* fmt, const char* what, long long a, long long b) {
  if (!tuner_error) {
    tuner_error = 1;
    char text[400];
    snprintf(text, sizeof text, fmt, what, a, b);
    snprintf(tuner_message, sizeof tuner_message, "block %d thread %d: %s", blockIdx.x, threadIdx.x, text);
  }
}

/* a buffer whose every index is checked: kernel arguments and shared tiles */
struct tuner_buf {
  float* p; long long n; const char* name;
  float& operator[](long long i) const {
    static float sink;
    if (i < 0 || i >= n) { tuner_fail("%s[%lld] is out of bounds (%lld elements)", name, i, n); return sink; }
    return p[i];
  }
};

struct alignas(16) float4 {
  float x, y, z, w;
  float4& operator=(const float4& o) {
    uintptr_t a = (uintptr_t)this, b = (uintptr_t)&o;
    if (a % 16 || b % 16) tuner_fail("%s: float4 access %lld and %lld bytes past a 16-byte boundary",
                                     "misaligned", (long long)(b % 16), (long long)(a % 16));
    x = o.x; y = o.y; z = o.z; w = o.w;
    return *this;
  }
};

/* shared buffers: one per declaration, the same for every thread of a block, NaN at its start */
#define TUNER_MAX_SHARED 16
static struct { float* p; long long n; int block; } tuner_shared_tab[TUNER_MAX_SHARED];
static int tuner_block_serial;
static tuner_buf tuner_shared(int k, long long n, const char* name) {
  if (tuner_shared_tab[k].block != tuner_block_serial) {
    if (tuner_shared_tab[k].n < n) {
      free(tuner_shared_tab[k].p);
      tuner_shared_tab[k].p = (float*)aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
      tuner_shared_tab[k].n = n;
    }
    for (long long i = 0; i < n; ++i) tuner_shared_tab[k].p[i] = NAN;
    tuner_shared_tab[k].block = tuner_block_serial;
  }
  tuner_buf b = {tuner_shared_tab[k].p, n, name};
  return b;
}

/* the threads of a block, as coroutines */
enum { TUNER_RUN, TUNER_AT_BARRIER, TUNER_DONE };
static ucontext_t tuner_main, *tuner_ctx;
static int *tuner_state, *tuner_passed, tuner_current;
static void __syncthreads(void) {
  tuner_state[tuner_current] = TUNER_AT_BARRIER;
  tuner_passed[tuner_current] += 1;
  swapcontext(&tuner_ctx[tuner_current], &tuner_main);
}

typedef void (*tuner_launch_fn)(float**, const long long*);
static tuner_launch_fn tuner_fn;
static float** tuner_args;
static const long long* tuner_lens;
static void tuner_entry(void) {
  tuner_fn(tuner_args, tuner_lens);
  tuner_state[tuner_current] = TUNER_DONE;
}

#define TUNER_STACK (128 * 1024)
static int tuner_run(tuner_launch_fn fn, float** args, const long long* lens, int grid, int block, int reverse,
                     char* message, int message_size) {
  tuner_fn = fn; tuner_args = args; tuner_lens = lens; tuner_error = 0; tuner_message[0] = 0;
  tuner_ctx = (ucontext_t*)calloc(block, sizeof(ucontext_t));
  tuner_state = (int*)calloc(block, sizeof(int));
  tuner_passed = (int*)calloc(block, sizeof(int));
  char* stacks = (char*)malloc((size_t)block * TUNER_STACK);
  for (int b = 0; b < grid && !tuner_error; ++b) {
    blockIdx.x = b;
    ++tuner_block_serial;
    for (int t = 0; t < block; ++t) {
      getcontext(&tuner_ctx[t]);
      tuner_ctx[t].uc_stack.ss_sp = stacks + (size_t)t * TUNER_STACK;
      tuner_ctx[t].uc_stack.ss_size = TUNER_STACK;
      tuner_ctx[t].uc_link = &tuner_main;
      makecontext(&tuner_ctx[t], tuner_entry, 0);
      tuner_state[t] = TUNER_RUN;
      tuner_passed[t] = 0;
    }
    for (;;) {
      for (int j = 0; j < block && !tuner_error; ++j) {
        int t = reverse ? block - 1 - j : j;
        if (tuner_state[t] == TUNER_DONE) continue;
        tuner_state[t] = TUNER_RUN;
        tuner_current = t;
        threadIdx.x = t;
        swapcontext(&tuner_main, &tuner_ctx[t]);
      }
      if (tuner_error) break;
      int done = 0, first_waiting = -1;
      for (int t = 0; t < block; ++t) {
        if (tuner_state[t] == TUNER_DONE) ++done;
        else if (first_waiting < 0) first_waiting = t;
      }
      if (done == block) break;
      threadIdx.x = first_waiting;
      if (done) {
        tuner_fail("%s: %lld of the block's threads finished while thread %lld waits at a barrier",
                   "barrier divergence", done, first_waiting);
        break;
      }
      for (int t = 0; t < block; ++t)
        if (tuner_passed[t] != tuner_passed[first_waiting]) {
          tuner_fail("%s: thread %lld waits at its barrier %lld", "barrier divergence", t, tuner_passed[t]);
          break;
        }
      if (tuner_error) break;
    }
  }
  free(stacks); free(tuner_ctx); free(tuner_state); free(tuner_passed);
  if (tuner_error) snprintf(message, message_size, "%s", tuner_message);
  return tuner_error;
}
"""

_SHARED = re.compile(r"__shared__ __align__\(16\) float (\w+)\[(\d+)\];")
_IN = re.compile(r"const float\* __restrict__ (\w+)")
_OUT = re.compile(r"float\* __restrict__ (\w+)")


def emulation_source(kernels: list) -> str:
    """One C++ file running `kernels` (codegen.cuda.CudaKernel, names unique) on the CPU."""
    parts, table = [RUNTIME, PRELUDE], []
    for k in kernels:
        name = f"tuner_kernel_{len(table)}"
        src = k.source.replace('extern "C" ', "static ").replace(f" {k.name}(", f" {name}(", 1)
        shared = iter(range(10 ** 6))
        src = _SHARED.sub(lambda m: f'const tuner_buf {m[1]} = tuner_shared({next(shared)}, {m[2]}, "{m[1]}");', src)
        header, sep, body = src.partition("{\n")
        nargs = header.count("__restrict__")
        header = _IN.sub(r"tuner_buf \1", header)
        header = _OUT.sub(r"tuner_buf \1", header)
        parts.append(header + sep + body)
        params = re.findall(r"tuner_buf (\w+)", header)
        assert len(params) == nargs, header
        call = ", ".join(f'tuner_buf{{args[{a}], lens[{a}], "{n}"}}' for a, n in enumerate(params))
        parts.append(f"static void tuner_launch_{len(table)}(float** args, const long long* lens) "
                     f"{{ {name}({call}); }}")
        table.append(f"tuner_launch_{len(table)}")
    parts.append(f"static const tuner_launch_fn tuner_table[] = {{ {', '.join(table)} }};")
    parts.append('extern "C" int tuner_emulate(int i, float** args, const long long* lens, int grid, int block, '
                 "int reverse, char* message, int size) { return tuner_run(tuner_table[i], args, lens, grid, block, "
                 "reverse, message, size); }")
    return "\n".join(parts) + "\n"


# g++'s front end through the kernel builder's compiler: the runtime needs no C++ library
FLAGS = ["-x", "c++", "-std=c++17", "-fno-exceptions", "-fno-rtti", "-fno-threadsafe-statics", "-O1", "-w"]
CDEF = "int tuner_emulate(int i, float** args, const long long* lens, int grid, int block, int reverse, " \
       "char* message, int size);"


def small_workloads() -> list:
    """Every operator and layout the CUDA sketch covers, small enough to emulate on a CPU quickly:
    the tests' set, and the start of bench/cuda_emulation.py's."""
    return [
        make("conv2d", dict(C=8, H=10, W=10, K=16, R=3, S=3, pad=1), "NCHW"),
        make("conv2d", dict(C=8, H=10, W=10, K=16, R=3, S=3, pad=1), "NHWC"),
        make("conv2d", dict(C=8, H=11, W=11, K=16, R=3, S=3, stride=2, pad=1, bias=1, relu=1), "NCHW"),
        make("conv2d", dict(N=2, C=16, H=8, W=8, K=16, R=3, S=3, pad=1, groups=16, residual=1), "NHWC"),
        make("conv2d", dict(C=16, H=8, W=8, K=32, R=3, S=3, pad=1, groups=4, bias=1), "NCHW"),
        make("conv2d", dict(C=16, H=6, W=6, K=16, R=1, S=1), "NCHW8c"),
        make("dense", dict(N=8, C=32, K=24, bias=1, relu=1)),
        make("max_pool2d", dict(C=8, H=9, W=9, R=3, S=3, stride=2, pad=1), "NCHW"),
        make("avg_pool2d", dict(C=8, H=8, W=8, R=3, S=3, pad=1), "NHWC"),
        make("global_avg_pool2d", dict(C=16, H=5, W=5), "NCHW"),
    ]


def build_emulation(kernels: list) -> str:
    """The path of a shared library emulating `kernels`, built and cached as the kernel
    libraries are (toolchain.cc.compile_library: named by what it holds, checked before loading)."""
    path, error = compile_library(emulation_source(kernels), FLAGS)
    if path is None:
        raise RuntimeError(f"the emulation of {len(kernels)} CUDA kernels did not compile:\n{error}")
    return path


@lru_cache(maxsize=1)
def _ffi() -> FFI:
    f = FFI()
    f.cdef(CDEF)
    return f


@lru_cache(maxsize=8)
def _open(lib: str):
    return open_library(lib, _ffi())


def emulate(lib: str, index: int, kernel, inputs: list, out_shape, reverse: bool = False):
    """Run kernel `index` of an emulation library on `inputs` (float32 arrays) with `kernel`'s
    launch (grid x block). Returns (output, None), or (None, what went wrong) when an index was
    out of bounds, a float4 misaligned or the block's threads met different barriers."""
    f = _ffi()
    arrays = [aligned_copy(np.asarray(a, dtype=np.float32)) for a in inputs]   # as a GPU allocation is
    out = aligned_empty(out_shape)
    out[...] = np.nan
    arrays.append(out)
    message = f.new("char[]", 512)
    rc = _open(lib).tuner_emulate(index, pointer_array(arrays, f), f.new("long long[]", [a.size for a in arrays]),
                                  kernel.grid, kernel.block, int(reverse), message, 512)
    return (None, f.string(message).decode()) if rc else (out, None)
