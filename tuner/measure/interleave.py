"""Interleaved timing of callables on one machine: each round times every runner once, in turn,
so that a slow spell of a shared machine hits every runner alike (compare.peers, the model
tune's graph choices)."""
from __future__ import annotations

import statistics
import time

import numpy as np


def time_call(fn, inputs, min_seconds: float = 0.2, max_calls: int = 50) -> float:
    """Median seconds per call over calls filling `min_seconds` (at least 3 calls)."""
    fn(inputs)
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < min_seconds and len(times) < max_calls):
        t = time.perf_counter()
        fn(inputs)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# Idle seconds before each turn: a runtime's threads spin for a while after its last call (ONNX
# Runtime's intra-op pool for tens of milliseconds), holding a core the next runner needs.
SETTLE_S = 0.25


def interleaved(runners: dict, inputs, rounds: int = 5, min_seconds: float = 0.2, progress=None,
                settle: float = SETTLE_S) -> dict:
    """{name: [median seconds per round]} timing every runner once per round, in turn, the turn
    rotated by one each round: a runner's place in the round (what ran just before it, which
    caches it finds warm) moved a model's time by 4-5% on a shared host, and rotating spreads
    that over every runner alike. Each turn starts after `settle` idle seconds, so that it does
    not share the cores with the last runner's spinning threads (0: runners of one thread pool)."""
    out = {name: [] for name in runners}
    names = list(runners)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(settle)
            out[name].append(time_call(runners[name], inputs, min_seconds))
        if progress:
            progress(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {statistics.median(v) * 1e3:.2f} ms"
                                                            for n, v in out.items()))
    return out


def interleaved_profiles(models: dict, inputs, rounds: int, runs: int, progress=None) -> tuple:
    """({name: array (rounds, steps) of each step's median seconds where it runs}, {name: [median
    seconds of a whole run, per round]}): compiled models of one plan ({name: CompiledModel}), each
    run whole `runs` times with every step timed (CompiledModel.profile), in turn, the turn rotated
    by one each round as in `interleaved` (no pause: they share one OpenMP pool)."""
    steps, whole = {name: [] for name in models}, {name: [] for name in models}
    names = list(models)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            per, run = models[name].profile(inputs, runs=runs)
            steps[name].append(np.median(per, axis=0))
            whole[name].append(float(np.median(run)))
        if progress:
            progress(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1] * 1e3:.2f} ms" for n, v in whole.items()))
    return {name: np.array(v) for name, v in steps.items()}, whole


def paired_ratios(a: list, b: list) -> list:
    """Each round's a / b (from `interleaved`): paired samples, whose median is steadier on a
    shared machine whose speed drifts than a ratio of medians."""
    return [x / y for x, y in zip(a, b)]
