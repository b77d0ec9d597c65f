"""Batched builds: many kernels in one C file, one compiler call (toolchain.cc), one library.

Each library exports `tuner_count`, `tuner_run(i, args)` and `tuner_time(i, ...)`, a timing
loop in C, so a runner never times a tiny call from a Python loop. When a batch fails to compile
it is bisected so that one bad candidate only costs itself; a batch the compiler does not finish
within its limit (LIMIT_S: 60 s, and 15 s per kernel) is built kernel by kernel, each with its own.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..codegen.c import PRELUDE
from ..target import Target
from ..task import code_hash
from ..toolchain.cc import RAN_PAST, cache_root, compile_library, touch
from ..toolchain.library import verified

LIMIT_S = (60.0, 15.0)     # seconds a compiler call of a batch may take: a base, and per kernel in it

# The one timing rule in C, for kernels (HARNESS) and compiled models (compiler):
# warm up once, pick `number` so that one repeat lasts at least min_repeat_ms (number <= 0), then
# time `repeat` repeats; costs[r] is seconds per call. With flush, each repeat is one cold call.
# TUNER_TIME_LOOP(call) is the body of a function taking those parameters, `call` an expression
# that runs the thing once and gives its return code.
TIMING = r"""
#include <time.h>
static double tuner_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static void tuner_flush(void) {
  static char* junk = 0; const size_t n = 64u << 20;
  if (!junk) junk = (char*)malloc(n);
  if (junk) for (size_t k = 0; k < n; k += 64) junk[k] += 1;
}
static int tuner_number(int number, double once, double min_repeat_ms) {
  if (number > 0) return number;
  return once > 0 && once * 1e3 < min_repeat_ms ? (int)(min_repeat_ms / (once * 1e3)) + 1 : 1;
}
#define TUNER_TIME_LOOP(call) do { \
  double t0 = tuner_now(); \
  int rc = (call); \
  if (rc) return rc; \
  double once = tuner_now() - t0; \
  number = flush ? 1 : tuner_number(number, once, min_repeat_ms); \
  for (int r = 0; r < repeat; ++r) { \
    if (flush) tuner_flush(); \
    double s = tuner_now(); \
    for (int k = 0; k < number; ++k) rc |= (call); \
    costs[r] = (tuner_now() - s) / number; \
  } \
  return rc; \
} while (0)
"""

HARNESS = TIMING + r"""
typedef int (*tuner_fn)(float**);
static const tuner_fn tuner_table[] = { %(table)s };
int tuner_count(void) { return %(count)d; }
int tuner_run(int i, float** args) { return tuner_table[i](args); }
int tuner_time(int i, float** args, int number, int repeat, double min_repeat_ms, int flush, double* costs) {
  tuner_fn f = tuner_table[i];
  TUNER_TIME_LOOP(f(args));
}
#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#include <cpuid.h>
/* clflushopt where the CPU has it (CPUID.7.0:EBX bit 23; Intel since Skylake, every AMD Zen): the
   same lines leave every cache level as with clflush, which waits on each line in turn and took
   15x as long over megabytes of weights; the fence after the loop waits for them all. */
__attribute__((target("clflushopt"))) static void tuner_evict_opt(const char* c, long long n) {
  for (long long k = 0; k < n; k += 64) __builtin_ia32_clflushopt((void*)(c + k));
}
static void tuner_evict(const void* p, long long n) {
  static int opt = -1;
  const char* c = (const char*)p;
  if (opt < 0) { unsigned a, b, cx, d; opt = __get_cpuid_count(7, 0, &a, &b, &cx, &d) && (b >> 23 & 1); }
  if (opt) tuner_evict_opt(c, n);
  else for (long long k = 0; k < n; k += 64) _mm_clflush(c + k);
  _mm_mfence();
}
#else
static void tuner_evict(const void* p, long long n) { (void)p; (void)n; tuner_flush(); }
#endif
/* As tuner_time, but before every call the arguments a with cold[a] > 0 (bytes) are evicted from
   every cache level, as a model's weights arrive from memory (each is read once per inference),
   while the others stay warm; only the calls are timed. */
int tuner_time_cold(int i, float** args, int nargs, const long long* cold, int number, int repeat,
                    double min_repeat_ms, double* costs) {
  tuner_fn f = tuner_table[i];
  double t0 = tuner_now();
  int rc = f(args);
  if (rc) return rc;
  number = tuner_number(number, tuner_now() - t0, min_repeat_ms);
  for (int r = 0; r < repeat; ++r) {
    double total = 0;
    for (int k = 0; k < number; ++k) {
      for (int a = 0; a < nargs; ++a) if (cold[a] > 0) tuner_evict(args[a], cold[a]);
      double s = tuner_now();
      rc |= f(args);
      total += tuner_now() - s;
    }
    costs[r] = total / number;
  }
  return rc;
}
"""


@dataclass
class BuildResult:
    """Where candidate `k` of a batch ended up: a library and index, or a compile error."""
    lib: str | None
    index: int
    error: str | None
    seconds: float


def library_source(functions: list) -> str:
    """One C file holding `functions` ([(name, source)]) plus the run/time harness."""
    body = "\n".join(src for _, src in functions)
    table = ", ".join(name for name, _ in functions)
    return PRELUDE + body + HARNESS % {"table": table, "count": len(functions)}


# The libraries this process built, by kernel (its source under any name) and flags: a kernel
# built once in a session (a tune's trial) is not built again for its second timing (a heat's, a
# cold price's) while its library is there with the bytes its name promises; a library's kernels
# are called by index, not by name. Bounded; the oldest go first.
_BUILT: collections.OrderedDict = collections.OrderedDict()
BUILT_MAX = 4096
_BUILT_LOCK = threading.Lock()


def _built_key(name: str, source: str, flags: list) -> str:
    where = [os.environ.get("CC", "gcc"), str(cache_root())]        # another compiler or cache builds anew
    return "\0".join([code_hash(source, name), *flags, *where])


def build_batch(functions: list, target: Target, openmp: bool = False, jobs: int | None = None) -> list:
    """Compile [(name, source)] into libraries, `jobs` compiler calls at once (one per core); a
    function this process built before keeps its library (_BUILT).

    Returns one BuildResult per function, in order.
    """
    if not functions:
        return []
    flags = list(target.cflags) + (["-fopenmp"] if openmp else [])
    keys = [_built_key(name, src, flags) for name, src in functions]
    with _BUILT_LOCK:
        results: list = [_BUILT.get(k) for k in keys]
    results = [r if r is not None and verified(r.lib) else None for r in results]     # (gone or changed: built anew)
    for r in results:
        if r is not None:
            touch(Path(r.lib))                          # used now, as a cache hit is: not pruned under it
    todo = [i for i, r in enumerate(results) if r is None]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    groups = [todo[k::jobs] for k in range(jobs)]

    def build_group(idx: list):
        start = time.perf_counter()
        _build_range(functions, idx, flags, results, start)

    if todo:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(build_group, groups))
    with _BUILT_LOCK:
        for i in todo:
            if results[i].error is None:
                _BUILT[keys[i]] = results[i]
                _BUILT.move_to_end(keys[i])
        while len(_BUILT) > BUILT_MAX:
            _BUILT.popitem(last=False)
    return results


def _build_range(functions, idx, flags, results, start):
    lib, err = compile_library(library_source([functions[k] for k in idx]), flags, LIMIT_S[0] + LIMIT_S[1] * len(idx))
    if lib is not None:
        per = (time.perf_counter() - start) / len(idx)
        for pos, k in enumerate(idx):
            results[k] = BuildResult(lib, pos, None, per)
        return
    if len(idx) == 1:
        results[idx[0]] = BuildResult(None, 0, err, time.perf_counter() - start)
        return
    if err.startswith(RAN_PAST):    # one kernel the compiler cannot finish: each alone, so only it pays the limit
        for k in idx:
            _build_range(functions, [k], flags, results, time.perf_counter())
        return
    half = len(idx) // 2
    _build_range(functions, idx[:half], flags, results, time.perf_counter())
    _build_range(functions, idx[half:], flags, results, time.perf_counter())
