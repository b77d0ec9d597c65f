"""Batched builds: many kernels in one C file, one compiler call, one shared library.

Each library exports `tuner_count`, `tuner_run(i, args)` and `tuner_time(i, ...)`, a timing
loop in C, so a runner never times a tiny call from a Python loop. Libraries are cached by a
hash of source + flags + compiler, named by that hash, and written atomically. When a batch fails
to compile it is bisected so that one bad candidate only costs itself.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..codegen.c import PRELUDE
from ..target import Target

HARNESS = r"""
#include <time.h>
typedef int (*tuner_fn)(float**);
static const tuner_fn tuner_table[] = { %(table)s };
int tuner_count(void) { return %(count)d; }
int tuner_run(int i, float** args) { return tuner_table[i](args); }
static double tuner_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static void tuner_flush(void) {
  static char* junk = 0; const size_t n = 64u << 20;
  if (!junk) junk = (char*)malloc(n);
  if (junk) for (size_t k = 0; k < n; k += 64) junk[k] += 1;
}
/* Warm up once, pick `number` so that one repeat lasts at least min_repeat_ms, then time
   `repeat` repeats; costs[r] is seconds per call. With flush, each repeat is one cold call. */
int tuner_time(int i, float** args, int number, int repeat, double min_repeat_ms, int flush, double* costs) {
  tuner_fn f = tuner_table[i];
  double t0 = tuner_now();
  int rc = f(args);
  if (rc) return rc;
  double once = tuner_now() - t0;
  if (flush) number = 1;
  else if (number <= 0) {
    number = 1;
    if (once > 0 && once * 1e3 < min_repeat_ms) number = (int)(min_repeat_ms / (once * 1e3)) + 1;
  }
  for (int r = 0; r < repeat; ++r) {
    if (flush) tuner_flush();
    double s = tuner_now();
    for (int k = 0; k < number; ++k) rc |= f(args);
    costs[r] = (tuner_now() - s) / number;
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


def cache_dir() -> Path:
    d = Path(os.environ.get("TUNER_CACHE_DIR", Path.home() / ".cache" / "tuner")) / "kernels"
    d.mkdir(parents=True, exist_ok=True)
    return d


@lru_cache(maxsize=1)
def compiler() -> tuple:
    cc = os.environ.get("CC", "gcc")
    path = shutil.which(cc)
    if not path:
        raise RuntimeError(f"C compiler {cc!r} not found: install gcc or set CC")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return path, version


def library_source(functions: list) -> str:
    """One C file holding `functions` ([(name, source)]) plus the run/time harness."""
    body = "\n".join(src for _, src in functions)
    table = ", ".join(name for name, _ in functions)
    return PRELUDE + body + HARNESS % {"table": table, "count": len(functions)}


def compile_library(source: str, flags: list) -> tuple:
    """(path of the cached .so, None) or (None, compiler message)."""
    cc, version = compiler()
    digest = hashlib.sha256("\0".join([source, " ".join(flags), version]).encode()).hexdigest()[:24]
    out = cache_dir() / f"{digest}.so"
    if out.exists():
        return str(out), None
    with tempfile.TemporaryDirectory(prefix="tuner-build-") as tmp:
        c_file = Path(tmp) / f"{digest}.c"
        c_file.write_text(source)
        tmp_so = Path(tmp) / f"{digest}.so"
        cmd = [cc, *flags, "-fPIC", "-shared", "-o", str(tmp_so), str(c_file), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return None, _trim(proc.stderr or proc.stdout)
        os.replace(tmp_so, out)
    return str(out), None


def _trim(msg: str, limit: int = 2000) -> str:
    errors = [line for line in msg.splitlines() if "error" in line]
    text = "\n".join(errors) if errors else msg
    return text[:limit]


def build_batch(functions: list, target: Target, openmp: bool = False, jobs: int | None = None) -> list:
    """Compile [(name, source)] into libraries, `jobs` compiler calls at once (one per core).

    Returns one BuildResult per function, in order.
    """
    if not functions:
        return []
    flags = list(target.cflags) + (["-fopenmp"] if openmp else [])
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(functions)))
    groups = [list(range(k, len(functions), jobs)) for k in range(jobs)]
    results: list = [None] * len(functions)

    def build_group(idx: list):
        start = time.perf_counter()
        _build_range(functions, idx, flags, results, start)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(build_group, groups))
    return results


def _build_range(functions, idx, flags, results, start):
    lib, err = compile_library(library_source([functions[k] for k in idx]), flags)
    if lib is not None:
        per = (time.perf_counter() - start) / len(idx)
        for pos, k in enumerate(idx):
            results[k] = BuildResult(lib, pos, None, per)
        return
    if len(idx) == 1:
        results[idx[0]] = BuildResult(None, 0, err, time.perf_counter() - start)
        return
    half = len(idx) // 2
    _build_range(functions, idx[:half], flags, results, time.perf_counter())
    _build_range(functions, idx[half:], flags, results, time.perf_counter())
