"""Batched builds: many kernels in one C file, one compiler call, one shared library.

Each library exports `tuner_count`, `tuner_run(i, args)` and `tuner_time(i, ...)`, a timing
loop in C, so a runner never times a tiny call from a Python loop. Libraries are cached by a
hash of source + flags + compiler and of their own bytes (library.library_name), one per source
(a build is deterministic: a second is warned of and removed), built inside the cache directory
(so the final rename never crosses file systems) and renamed into place atomically. The cache
directory is private to the user (0700) and refused when someone else owns it or may write to
it. When a batch fails to compile it is bisected so that one bad candidate only costs itself;
when a single candidate fails, a trivial file is compiled the same way, and if that fails too
the machine is at fault (no space, no compiler), which stops the tune (SetupError) instead of
being recorded against every candidate.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..codegen.c import PRELUDE
from ..errors import SetupError
from ..target import Target
from .library import LIBRARY_DIRS, library_name, source_digest, verified

# The one timing rule in C, for kernels (HARNESS) and compiled models (runtime.compiler):
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
static void tuner_evict(const void* p, long long n) {
  const char* c = (const char*)p;
  for (long long k = 0; k < n; k += 64) _mm_clflush(c + k);
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


def cache_root() -> Path:
    return Path(os.environ.get("TUNER_CACHE_DIR") or Path.home() / ".cache" / "tuner")


def cache_dir(name: str = "kernels") -> Path:
    """A private subdirectory of the cache (created 0700); refused unless it is the user's own."""
    root = cache_root()
    d = root / name
    for p in (root, d):
        private_dir(p)
    return d


def private_dir(p: Path) -> None:
    fix = "set TUNER_CACHE_DIR to a directory of your own"
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = p.stat()
    except (FileExistsError, NotADirectoryError):
        raise SetupError(f"kernel cache {p} is not a directory; {fix}") from None
    except OSError as e:
        raise SetupError(f"kernel cache {p} cannot be created: {e.strerror}; {fix}") from None
    if st.st_uid != os.geteuid():
        raise SetupError(f"kernel cache {p} belongs to another user (uid {st.st_uid}); libraries in it would run "
                         f"in this process; {fix}")
    if st.st_mode & 0o022:
        raise SetupError(f"kernel cache {p} may be written by other users (mode {oct(st.st_mode & 0o777)}); "
                         f"run `chmod go-w {p}` or {fix}")
    if not os.access(p, os.W_OK | os.X_OK):
        raise SetupError(f"kernel cache {p} is not writable; {fix}")


@lru_cache(maxsize=1)
def compiler() -> tuple:
    cc = os.environ.get("CC", "gcc")
    path = shutil.which(cc)
    if not path:
        raise SetupError(f"C compiler {cc!r} not found: install gcc or set CC")
    out = subprocess.run([path, "--version"], capture_output=True, text=True)
    return path, ((out.stdout or out.stderr).splitlines() or ["unknown version"])[0]


def library_source(functions: list) -> str:
    """One C file holding `functions` ([(name, source)]) plus the run/time harness."""
    body = "\n".join(src for _, src in functions)
    table = ", ".join(name for name, _ in functions)
    return PRELUDE + body + HARNESS % {"table": table, "count": len(functions)}


def cached_library(d: Path, digest: str, suffix: str) -> tuple:
    """(the library built from `digest` in cache directory d or None, the others under that
    digest). Files whose bytes do not match their name are removed. A build is deterministic, so
    two that match are one too many: neither is used, with a warning; the caller rebuilds and
    removes the one that is not its build (remove_others)."""
    good = []
    for cached in sorted(d.glob(f"{digest}-*{suffix}")):
        if verified(cached):
            good.append(cached)
        else:
            cached.unlink(missing_ok=True)     # planted, truncated or empty: rebuilt
    if len(good) > 1:
        warnings.warn(f"kernel cache {d} holds {len(good)} libraries built from one source "
                      f"({', '.join(p.name for p in good)}), where a build gives one: rebuilding it and removing "
                      "the others; check who else writes to the kernel cache (TUNER_CACHE_DIR)", stacklevel=3)
        return None, good
    return (good[0] if good else None), []


def remove_others(others: list, built: Path) -> None:
    for p in others:
        if p != built:
            p.unlink(missing_ok=True)


def compile_library(source: str, flags: list) -> tuple:
    """(path of the cached .so, None) or (None, compiler message); SetupError when the machine fails."""
    cc, version = compiler()
    digest = source_digest(source, flags, version)
    d = cache_dir(LIBRARY_DIRS[".so"])
    cached, others = cached_library(d, digest, ".so")
    if cached is not None:
        return str(cached), None
    try:
        with tempfile.TemporaryDirectory(prefix=".build-", dir=d) as tmp:
            c_file = Path(tmp) / f"{digest}.c"
            c_file.write_text(source)
            tmp_so = Path(tmp) / f"{digest}.so"
            proc = subprocess.run([cc, *flags, "-fPIC", "-shared", "-o", str(tmp_so), str(c_file), "-lm"],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                _check_compiler_works(cc, flags, Path(tmp))
                return None, _trim(proc.stderr or proc.stdout)
            out = d / library_name(digest, tmp_so.read_bytes())
            os.replace(tmp_so, out)
            remove_others(others, out)
    except OSError as e:
        raise SetupError(f"cannot build kernels in {d}: {e.strerror or e}; free space there or set "
                         "TUNER_CACHE_DIR to another directory") from None
    return str(out), None


CANARY = "int tuner_canary(void) { return 0; }\n"


def _check_compiler_works(cc: str, flags: list, tmp: Path) -> None:
    """A candidate failed to compile: is it the candidate, or would anything fail (disk full, a
    broken compiler)? The latter raises SetupError, so it is never recorded against the candidate."""
    c_file = tmp / "canary.c"
    try:
        c_file.write_text(CANARY)
        proc = subprocess.run([cc, *flags, "-fPIC", "-shared", "-o", str(tmp / "canary.so"), str(c_file)],
                              capture_output=True, text=True)
    except OSError as e:
        raise SetupError(f"cannot compile: {e.strerror or e}") from None
    if proc.returncode != 0:
        raise SetupError("the C compiler fails on an empty file too, so the machine is at fault, not the "
                         f"candidate: {_trim(proc.stderr or proc.stdout, 300)} (check free space in "
                         f"{tempfile.gettempdir()} and {tmp.parent}, and the compiler)")


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
