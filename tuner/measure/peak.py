"""The machine's peak FP32 FMA rate, from a small C microbenchmark built like the kernels."""
from __future__ import annotations

import statistics

from cffi import FFI

from ..target import Target
from ..toolchain.cc import compile_library
from ..toolchain.library import open_library

CHAINS = 12         # independent FMA chains per iteration of the microbenchmark

_SOURCE = r"""
#include <time.h>
typedef float vec __attribute__((vector_size(%(bytes)d), aligned(4)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
/* CHAINS independent accumulator chains hide FMA latency; returns GFLOPS of `threads` threads together */
double peak_gflops(long iters, int threads) {
  double start = now();
  float sink = 0;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    vec a[%(chains)d], x, y;
    for (int k = 0; k < %(chains)d; ++k) a[k] = (vec){0} + (float)k * 1e-3f;
    x = (vec){0} + 0.999999f; y = (vec){0} + 1e-7f;
    for (long i = 0; i < iters; ++i) {
      #pragma GCC unroll %(chains)d
      for (int k = 0; k < %(chains)d; ++k) a[k] = a[k] * x + y;
    }
    for (int k = 0; k < %(chains)d; ++k) sink += a[k][0];
  }
  double secs = now() - start;
  return sink == 12345.f ? 0 : 2.0 * %(chains)d * %(lanes)d * (double)iters * threads / secs / 1e9;
}
"""


def _library(target: Target):
    lanes = target.lanes
    src = _SOURCE % {"bytes": lanes * 4, "lanes": lanes, "chains": CHAINS}
    lib_path, err = compile_library(src, list(target.cflags) + ["-fopenmp"])
    if err:
        raise RuntimeError(f"peak microbenchmark failed to compile: {err}")
    open_library(lib_path)  # pins the OpenMP runtime for this process
    ffi = FFI()
    ffi.cdef("double peak_gflops(long iters, int threads);")
    return ffi.dlopen(lib_path)


def peak_gflops(target: Target, threads: int = 1, iters: int = 20_000_000, repeat: int = 3) -> float:
    lib = _library(target)
    return max(lib.peak_gflops(iters, threads) for _ in range(repeat))


def peak_runner(target: Target, threads: int = 1, iters: int = 2_000_000) -> tuple:
    """(a callable of one argument that runs the microbenchmark once, the FLOPs it does): timed
    beside a model, round by round (measure.interleave), it gives the peak of the moment, which
    on a shared host moves with the model's own speed."""
    lib = _library(target)
    return (lambda _inputs: lib.peak_gflops(iters, threads)), 2.0 * CHAINS * target.lanes * iters * threads


def fraction_of_peak(gflop: float, seconds: list, peaks: list) -> float:
    """The median over rounds of each round's GFLOPS over the peak (GFLOPS) timed in that round."""
    return statistics.median(gflop / s / p for s, p in zip(seconds, peaks, strict=True))


if __name__ == "__main__":
    from tuner.target import parse_target
    t = parse_target("cpu")
    for n in sorted({1, t.cores}):
        print(f"peak FP32 FMA, {n} thread(s): {peak_gflops(t, n):.1f} GFLOPS")
