"""Targets: which backend and which hardware facts change the generated code.

`cpu` alone means this host: its ISA, core count and thread count are resolved once and the
resulting string (e.g. `cpu -isa=avx512 -cores=2 -threads=1`) goes into every record, because a
1-thread and a 2-thread measurement are different facts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from .errors import UserError

ISAS = {"avx512": (16, "x86-64-v4"), "avx2": (8, "x86-64-v3"), "sse": (4, "x86-64-v2")}


class TargetError(UserError):
    pass


@dataclass(frozen=True)
class Target:
    kind: str
    isa: str
    cores: int
    threads: int

    def __str__(self) -> str:
        return f"{self.kind} -isa={self.isa} -cores={self.cores} -threads={self.threads}"

    @property
    def lanes(self) -> int:
        """float32 lanes of the widest vector register."""
        return ISAS[self.isa][0]

    @property
    def cflags(self) -> list:
        flags = ["-O3", f"-march={ISAS[self.isa][1]}", "-fno-math-errno", "-fopenmp-simd"]
        if self.isa == host_isa():
            flags.append("-mtune=native")
        return flags


@lru_cache(maxsize=1)
def host_isa() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    if "avx512f" in flags and "avx512bw" in flags and "avx512vl" in flags and "avx512dq" in flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "sse"


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def parse_target(text: str | Target = "cpu", threads: int | None = None, check_host: bool = True) -> Target:
    """Parse `cpu [-isa=avx512|avx2|sse] [-cores=N] [-threads=N]`; `threads` overrides.

    check_host=False reads a logged target of another machine (to re-lower its records, not run them)."""
    if isinstance(text, Target):
        return text if threads is None else Target(text.kind, text.isa, text.cores, threads)
    parts = text.split()
    if not parts:
        raise TargetError("empty target: use 'cpu' (this host) or e.g. 'cpu -isa=avx2 -threads=1'")
    kind = parts[0]
    if kind != "cpu":
        hint = " (CUDA kernels are planned but not built by this version)" if kind == "cuda" else ""
        raise TargetError(f"unknown target {kind!r}{hint}: use 'cpu', e.g. 'cpu -threads=1'")
    opts = {}
    for p in parts[1:]:
        key, eq, val = p.lstrip("-").partition("=")
        if not eq or key not in ("isa", "cores", "threads"):
            raise TargetError(f"cannot read target option {p!r}: options are -isa=, -cores=, -threads=")
        opts[key] = val
    isa = opts.get("isa", host_isa())
    if isa not in ISAS:
        raise TargetError(f"unknown ISA {isa!r}: use one of {', '.join(ISAS)}")
    if check_host and ISAS[isa][0] > ISAS[host_isa()][0]:
        raise TargetError(f"this host supports {host_isa()}, not {isa}; kernels for it could not run here")
    try:
        cores = int(opts.get("cores", host_cores()))
        nthreads = int(threads if threads is not None else opts.get("threads", cores))
    except ValueError:
        raise TargetError(f"cores and threads must be integers in {text!r}") from None
    if cores < 1 or nthreads < 1:
        raise TargetError("cores and threads must be at least 1")
    return Target("cpu", isa, cores, nthreads)
