"""Batched builds: each kernel compiled alone into a cached object, a batch linked into one library.

A kernel is named by its code (task.by_code), as a compiled model names it, so the object a tune
built and timed is the one the model links, and a kernel a tune, a heat or a model compiled before
is not compiled again; one this process linked keeps its library (a heat links nothing). Each
library exports `tuner_count`, `tuner_run(i, args)` and `tuner_time(i, ...)`, a timing loop in C,
so a runner never times a tiny call from a Python loop: a harness object built once and a table of
the batch's kernels. A kernel that fails to compile, or that the compiler does not finish within
LIMIT_S, fails alone.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..codegen.c import PRELUDE
from ..target import Target
from ..task import by_code
from ..toolchain.cc import cache_root, compile_object, compile_objects, link_objects, touch
from ..toolchain.library import verified

LIMIT_S = 75.0     # seconds a compiler call of one kernel may take

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
extern const tuner_fn tuner_table[];
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


# a batch's own part of its library: its kernels, in the order tuner_run calls them by index
TABLE = "typedef int (*tuner_fn)(float**);\n%(prototypes)sconst tuner_fn tuner_table[] = { %(table)s };\n" \
        "int tuner_count(void) { return %(count)d; }\n"


# The libraries this process linked, by kernel (its code's name) and what builds it: a heat's second
# timing of a tune's kernel neither compiles nor links it again while that library holds the bytes its
# name promises. Bounded; the oldest go first.
_LINKED: collections.OrderedDict = collections.OrderedDict()
LINKED_MAX = 4096
_LINKED_LOCK = threading.Lock()


def build_batch(functions: list, target: Target, openmp: bool = False, jobs: int | None = None) -> list:
    """Build [(name, source)] or [(name, source, openmp)] (`openmp` where not given) for `target`:
    each kernel an object (`jobs` compiler calls at once, default one per core), the batch one
    library. Returns one BuildResult per function, in order."""
    if not functions:
        return []
    flags = list(target.cflags)
    kernels = [(*by_code(f[0], f[1]), bool(f[2] if len(f) > 2 else openmp)) for f in functions]
    unique = list({name: (name, src, omp) for name, src, omp in kernels}.values())
    where = (os.environ.get("CC", "gcc"), str(cache_root()), *flags)
    with _LINKED_LOCK:
        done = {k[0]: b for k in unique if (b := _LINKED.get((k[0], where))) is not None}
    done = {name: b for name, b in done.items() if verified(b.lib)}       # (gone or changed: built anew)
    for b in done.values():
        touch(Path(b.lib))                          # used now, as a cache hit is: not pruned under it
    todo = [k for k in unique if k[0] not in done]
    if todo:
        done.update(_build(todo, flags, jobs))
        with _LINKED_LOCK:
            for k in todo:
                if done[k[0]].error is None:
                    _LINKED[(k[0], where)] = done[k[0]]
                    _LINKED.move_to_end((k[0], where))
            while len(_LINKED) > LINKED_MAX:
                _LINKED.popitem(last=False)
    return [done[name] for name, _, _ in kernels]


def _build(kernels: list, flags: list, jobs: int | None) -> dict:
    """{kernel name: BuildResult} of `kernels` [(name, source, openmp)], each compiled alone, linked
    together; their table is compiled beside them and serves unless one fails."""
    parts = [(_table(kernels), [])] + [(PRELUDE + src, ["-fopenmp"] if omp else []) for _, src, omp in kernels]
    (table, _, _), *built = compile_objects(parts, flags, LIMIT_S, jobs)
    objects = dict(zip((k[0] for k in kernels), built))
    ok = [k for k in kernels if objects[k[0]][1] is None]
    libs = _link(ok, objects, flags, table if len(ok) == len(kernels) else None) if ok else {}
    out = {}
    for name, _, _ in kernels:
        _, err, seconds = objects[name]
        lib, index, link_err, link_s = libs.get(name, (None, 0, err, 0.0))
        out[name] = BuildResult(lib, index, link_err, seconds + link_s)
    return out


def _table(kernels: list) -> str:
    return TABLE % {"prototypes": "".join(f"int {k[0]}(float**);\n" for k in kernels),
                    "table": ", ".join(k[0] for k in kernels), "count": len(kernels)}


def _link(kernels: list, objects: dict, flags: list, table: str | None = None) -> dict:
    """{kernel name: (library, index, error, seconds)}: one library of `kernels` (their objects
    compiled; `table`: the object of their table, when compiled), else, where the link fails,
    each kernel in a library of its own."""
    start = time.perf_counter()
    omp = ["-fopenmp"] if any(k[2] for k in kernels) else []
    harness, err = compile_object(PRELUDE + HARNESS, flags)
    if err is not None:        # the machine works (compile_object checked): a bug of ours
        raise RuntimeError(f"the timing harness does not compile: {err}")
    if table is None:
        table, err = compile_object(_table(kernels), flags)
    if err is None:
        lib, err = link_objects([harness, table, *(objects[k[0]][0] for k in kernels)], flags + omp)
    if err is None:
        share = (time.perf_counter() - start) / len(kernels)
        return {k[0]: (lib, i, None, share) for i, k in enumerate(kernels)}
    if len(kernels) == 1:
        return {kernels[0][0]: (None, 0, err, time.perf_counter() - start)}
    return {name: v for k in kernels for name, v in _link([k], objects, flags).items()}
