"""Whether the two cores a 2-thread run uses share a cache: one cache line bounced between them.

A VM's host may place its two vCPUs on one die (a shared L3: about 30 ns a hop on the Zen 4 of
docs/history.md) or on two (about 170 ns), and move them while a benchmark runs; a step that reads
what the other thread wrote then waits on the other die. A 2-thread time holds for the placement it
met, so bench.artifacts and bench.untuned sample the hop after every interleaved round
(`rounds_core_ns` in their results) and, where a run met both, give the paired ratios of each apart.
"""
from __future__ import annotations

import ctypes
import functools
import os
import statistics
from pathlib import Path

from bench.common import c_library

HOPS = 100_000
FAR = 2.0           # a placement counts as far where its hop takes this many times the nearest one's


@functools.cache
def _probe():
    lib, err = c_library(Path(__file__).with_name("cores.c"), ["-O2", "-pthread"])
    if lib is None:
        raise RuntimeError(f"bench/cores.c does not build: {err}")
    fn = lib.core_to_core_ns
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int], ctypes.c_double
    return fn


def core_to_core_ns(hops: int = HOPS) -> float | None:
    """Nanoseconds per hop of a cache line between the first two CPUs this process may run on;
    None with fewer than two, or where a thread could not be pinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    ns = _probe()(cpus[0], cpus[1], hops)
    return ns if ns > 0 else None


class Placements:
    """The hop sampled after each round of an interleaved timing (wrap its progress callback)."""

    def __init__(self):
        self.samples: list = []

    def after(self, progress):
        def call(msg):
            self.samples.append(core_to_core_ns())
            ns = self.samples[-1]
            progress(f"{msg} [cores {f'{ns:.0f} ns a hop' if ns else 'not sampled'}]")
        return call

    def split(self, ratios: list) -> dict:
        """{"near": median, "far": median} of per-round `ratios` where the rounds met both
        placements (a hop FAR times the nearest or more counts as far), else {}."""
        known = [(r, ns) for r, ns in zip(ratios, self.samples) if ns is not None]
        if not known:
            return {}
        near = min(ns for _, ns in known)
        far = [r for r, ns in known if ns >= FAR * near]
        close = [r for r, ns in known if ns < FAR * near]
        return {"near": statistics.median(close), "far": statistics.median(far), "far_rounds": len(far)} if far else {}


def placed(by: dict) -> str:
    """A printed row's tail: its paired ratios apart by placement (Placements.split), if the host moved the cores."""
    return f"; cores near {by['near']:.3f}x, far {by['far']:.3f}x ({by['far_rounds']} rounds)" if by else ""
