"""The native C toolchain: the system compiler, and the private cache of what it built.

Libraries are cached by a hash of source + flags + compiler and of their own bytes
(library.library_name), one per source (a build is deterministic: a second is warned of and
removed), built inside the cache directory (so the final rename never crosses file systems) and
renamed into place atomically. The cache directory is private to the user (0700) and refused when
someone else owns it or may write to it. It is kept under its size limit (TUNER_CACHE_SIZE, default
CACHE_SIZE): a process looks at the cache's size on its first build and every PRUNE_EVERY builds
after, and removes the least recently used files (a cached file is touched when it is used) down
to PRUNE_TO of the limit, never one used within IN_USE_S (another process may be about to load
it); a compiled model keeps its own copy of its library. When a source fails to compile, a trivial file is
compiled the same way, and if that fails too the machine is at fault (no space, no compiler):
SetupError, never a compile error charged to the source. A compiler call is stopped past its
time limit (BUILD_S unless its caller gives one) and its address space capped (memory_cap()): a
schedule whose code the compiler cannot finish (one took gcc 11 minutes and 21 GB before it was
killed) fails to build like any other, rather than hanging the tune or swapping the host.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from ..errors import SetupError, UserError
from ..target import host_cores
from .library import LIBRARY_DIRS, library_name, source_digest, verified, verified_bytes


CACHE_SIZE = 2 << 30     # bytes of built files the cache keeps unless TUNER_CACHE_SIZE says otherwise
PRUNE_TO = 0.8           # a prune removes files down to this fraction of the limit
PRUNE_EVERY = 256        # builds of one process between two looks at the cache's size
IN_USE_S = 3600          # a file used this recently is never removed
BUILD_S = 600            # seconds a compiler call may run before it is stopped
BUILD_MEMORY = 4 << 30   # bytes of address space a C compiler call may take, at most a core's share of memory
RAN_PAST = "the compiler ran past"   # how a stopped call's message begins
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", re.IGNORECASE)
_builds = 0


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


def cache_limit() -> int:
    """Bytes the cache may hold: TUNER_CACHE_SIZE (a number of bytes, or with K, M, G or T), else CACHE_SIZE."""
    text = os.environ.get("TUNER_CACHE_SIZE", "").strip()
    if not text:
        return CACHE_SIZE
    m = _SIZE.fullmatch(text)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"TUNER_CACHE_SIZE={text!r} is not a size; give bytes or a size such as 500M or 4G")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def _build_dirs() -> list:
    """The cache's build directories (LIBRARY_DIRS) that exist."""
    return [d for d in (cache_root() / name for name in sorted(set(LIBRARY_DIRS.values()))) if d.is_dir()]


def built_files() -> list:
    """(path, size, last use) of every file in the cache's build directories."""
    out = []
    for d in _build_dirs():
        for p in d.iterdir():
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_file() and not p.is_symlink():
                out.append((p, st.st_size, st.st_mtime))
    return out


def prune_cache(limit: int | None = None, keep_s: float = IN_USE_S) -> tuple:
    """Remove the least recently used built files until the cache holds at most PRUNE_TO of
    `limit` (cache_limit()), none used within `keep_s` seconds, and the build directories that a
    killed process left behind IN_USE_S ago or more. Returns (files removed, bytes freed)."""
    limit = cache_limit() if limit is None else limit
    now, removed, freed = time.time(), 0, 0
    for d in _build_dirs():
        for tmp in d.glob(".build-*"):
            try:
                if now - tmp.stat().st_mtime > IN_USE_S:      # a running build's is younger
                    shutil.rmtree(tmp, ignore_errors=True)
            except OSError:
                pass
    files = built_files()
    total = sum(size for _, size, _ in files)
    if total <= limit:
        return 0, 0
    for p, size, used in sorted(files, key=lambda f: f[2]):
        if total <= PRUNE_TO * limit or now - used <= keep_s:
            break
        try:
            p.unlink()
        except FileNotFoundError:       # another process pruned it
            pass
        except OSError:
            continue
        total, removed, freed = total - size, removed + 1, freed + size
    return removed, freed


def touch(p: Path) -> None:
    """Mark a cached file used now (the prune keeps what was used within IN_USE_S)."""
    try:
        os.utime(p)
    except OSError:
        pass


def _built_one() -> None:
    """Count a build of this process; on its first and every PRUNE_EVERY-th, prune the cache."""
    global _builds
    _builds += 1
    if _builds % PRUNE_EVERY == 1:
        prune_cache()


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
                      "the others; check who else writes to the kernel cache (TUNER_CACHE_DIR)", stacklevel=4)
        return None, good
    return (good[0] if good else None), []


def remove_others(others: list, built: Path) -> None:
    for p in others:
        if p != built:
            p.unlink(missing_ok=True)


def memory_cap() -> int:
    """Bytes of address space one C compiler call may take: BUILD_MEMORY, or a core's share of the
    host's memory where that is less (one compiler runs per core), never under 1 GiB."""
    try:
        share = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // host_cores()
    except (AttributeError, ValueError, OSError):
        share = BUILD_MEMORY
    return max(1 << 30, min(BUILD_MEMORY, share))


def compile_library(source: str, flags: list, limit_s: float = BUILD_S) -> tuple:
    """(path of the cached .so, None) or (None, compiler message); SetupError when the machine fails."""
    return cached_build(source, flags, compiler(), ".c", ".so", _check_compiler_works, "kernels",
                        lambda cc, fl, out, src: [cc, *fl, "-fPIC", "-shared", "-o", str(out), str(src), "-lm"],
                        limit_s, memory_cap())


def compile_object(source: str, flags: list, limit_s: float = BUILD_S) -> tuple:
    """(path of the cached .o, None) or (None, compiler message); SetupError when the machine fails."""
    return cached_build(source, flags, compiler(), ".c", ".o", _check_compiler_works, "kernel objects",
                        lambda cc, fl, out, c_file: [cc, *fl, "-fPIC", "-c", "-o", str(out), str(c_file)],
                        limit_s, memory_cap())


def link_objects(objects: list, flags: list) -> tuple:
    """(path of the cached .so linked from `objects` (cached .o paths), None) or (None, linker
    message). Each object's bytes are checked against its name as they are copied into the link's
    own directory, so the link reads what was checked."""
    objects = [Path(o) for o in objects]

    def link(cc, fl, out, listing):
        copies = []
        for k, obj in enumerate(objects):
            if (data := verified_bytes(obj)) is None:
                raise SetupError(f"kernel cache object {obj} changed while a library was linked from it; check who "
                                 "else writes to the kernel cache (TUNER_CACHE_DIR) and build again")
            (copy := Path(listing).parent / f"{k}.o").write_bytes(data)
            copies.append(str(copy))
        return [cc, *fl, "-shared", "-o", str(out), *copies, "-lm"]
    # the link's "source" names its objects, whose names hold their bytes' hash
    return cached_build("\n".join(o.name for o in objects), flags, compiler(), ".txt", ".so", _check_compiler_works,
                        "kernels", link, BUILD_S, memory_cap())


def compile_objects(parts: list, flags: list, limit_s: float = BUILD_S, jobs: int | None = None) -> list:
    """[(path of the cached .o or None, compiler message or None, seconds)] of each of `parts`
    ([(C source, its own extra flags)]), each compiled alone, `jobs` compiler calls at once
    (default one per core), taken in order by whichever is free."""
    def one(part):
        start = time.perf_counter()
        path, err = compile_object(part[0], flags + part[1], limit_s)
        return path, err, time.perf_counter() - start
    with ThreadPoolExecutor(max(1, min(len(parts), jobs or host_cores()))) as pool:
        return list(pool.map(one, parts))


def compile_parts(parts: list, flags: list) -> tuple:
    """(path of the cached .so, None) or (None, compiler message) of a library linked from `parts`
    ([(C source, its own extra flags)]), each compiled alone into a cached object: a library that
    differs from one built before in a few parts compiles only those (a model's kernels between
    the compiles of a tune, whose candidates are these objects)."""
    built = compile_objects(parts, flags)
    errors = [err for _, err, _ in built if err is not None]
    if errors:
        return None, errors[0]
    return link_objects([path for path, _, _ in built], flags + sorted({f for _, fl in parts for f in fl}))


def cached_build(source: str, flags: list, tool: tuple, src_suffix: str, suffix: str, check_works, what: str,
                 command, limit_s: float = BUILD_S, memory: int | None = None) -> tuple:
    """(path of the `suffix` file `tool` (path, version) builds from `source` with `flags`, None), or
    (None, the tool's message): from the cache when it was built before, else built by
    `command(tool path, flags, out, src)` in a temporary directory inside the cache and renamed
    into place, stopped past `limit_s` seconds (the message then begins with RAN_PAST) and held to
    `memory` bytes of address space (None: no cap). A failed build calls `check_works(tool path,
    flags, that directory)`, which raises SetupError when a trivial source fails too (the machine,
    not the source, is at fault)."""
    path, version = tool
    digest = source_digest(source, flags, version)
    d = cache_dir(LIBRARY_DIRS[suffix])
    cached, others = cached_library(d, digest, suffix)
    if cached is not None:
        touch(cached)                  # its last use, which the prune goes by
        return str(cached), None
    try:
        with tempfile.TemporaryDirectory(prefix=".build-", dir=d) as tmp:
            src = Path(tmp) / f"{digest}{src_suffix}"
            src.write_text(source)
            built = Path(tmp) / f"{digest}{suffix}"
            done = run_limited(command(path, flags, built, src), limit_s, memory)
            if done is None:
                return None, f"{RAN_PAST} {limit_s:g} s and was stopped: code it cannot finish"
            code, out_text, err_text = done
            if code != 0:
                check_works(path, flags, Path(tmp))
                return None, trim_errors(err_text or out_text)
            out = d / library_name(digest, built.read_bytes(), suffix)
            os.replace(built, out)
            remove_others(others, out)
    except OSError as e:
        raise SetupError(f"cannot build {what} in {d}: {e.strerror or e}; free space there or set "
                         "TUNER_CACHE_DIR to another directory") from None
    _built_one()
    return str(out), None


def run_limited(cmd: list, limit_s: float, memory: int | None) -> tuple | None:
    """(exit code, stdout, stderr) of `cmd` run in a process group of its own, which is killed
    whole (the compiler driver and the passes it started) past `limit_s` seconds, returning None,
    or when this process is interrupted; on Linux its address space capped at `memory` bytes."""
    if memory and sys.platform.startswith("linux"):
        cmd = ["/bin/sh", "-c", f'ulimit -v {memory >> 10} 2>/dev/null; exec "$@"', "sh", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
    except BaseException as e:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            return None
        raise
    return proc.returncode, out, err


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
                         f"candidate: {trim_errors(proc.stderr or proc.stdout, 300)} (check free space in "
                         f"{tempfile.gettempdir()} and {tmp.parent}, and the compiler)")


def trim_errors(msg: str, limit: int = 2000) -> str:
    errors = [line for line in msg.splitlines() if "error" in line]
    text = "\n".join(errors) if errors else msg
    return text[:limit]
