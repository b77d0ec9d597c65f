"""Features computed by worker processes as well as the search's own.

Lowering a schedule and extracting its features is pure Python, most of a search round's own
time, and while the search ranks candidates nothing is built or timed: the other cores are idle.
Workers are forked once per tuning session, so they hold the session's tasks without pickling them.
"""
from __future__ import annotations

import itertools
import multiprocessing
import signal
import sys
import warnings

from ..target import host_cores
from .dataset import features_or_none

_TASKS: dict = {}              # filled before the fork; the workers inherit it
_NEXT_KEY = itertools.count()


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the tuning loop's to handle


def _featurise(job):
    key, steps_list = job
    task = _TASKS[key]
    return [features_or_none(task, steps) for steps in steps_list]


class FeaturePool:
    """Splits a list of schedules between the caller and `workers` forked processes."""

    MIN_SHARE = 8      # schedules per share below which a round trip to a worker is not worth it
    TIMEOUT = 120.0    # seconds a share may take before the workers are given up on

    def __init__(self, tasks: list, workers: int | None = None):
        self.keys = {}
        for task in tasks:
            key = next(_NEXT_KEY)
            _TASKS[key] = task
            self.keys[id(task)] = key
        if workers is None:
            workers = host_cores() - 1
        # fork is what lets workers share the tasks; it is safe on Linux only
        self.workers = workers if sys.platform.startswith("linux") else 0
        self.pool = multiprocessing.get_context("fork").Pool(self.workers, initializer=_ignore_sigint) \
            if self.workers > 0 else None

    def map(self, task, steps_list: list) -> list:
        """[features or None] for each step list; the caller featurises the first share itself."""
        key = self.keys.get(id(task))
        shares = min(self.workers + 1, len(steps_list) // self.MIN_SHARE)
        if self.pool is None or key is None or shares < 2:
            return [features_or_none(task, s) for s in steps_list]
        size = -(-len(steps_list) // shares)
        chunks = [steps_list[i:i + size] for i in range(0, len(steps_list), size)]
        pending = self.pool.map_async(_featurise, [(key, c) for c in chunks[1:]])
        mine = [features_or_none(task, s) for s in chunks[0]]
        try:
            theirs = pending.get(self.TIMEOUT)
        except multiprocessing.TimeoutError:
            # a forked worker can hang on a lock another thread held at the fork (seen once, a
            # futex wait); the search must not: drop the workers and featurise here from now on
            warnings.warn(f"feature workers gave no answer in {self.TIMEOUT:.0f} s; featurising in "
                          "the tuning process from now on (slower, same results)", RuntimeWarning, stacklevel=2)
            self._stop_workers()
            theirs = [[features_or_none(task, s) for s in c] for c in chunks[1:]]
        return mine + [f for part in theirs for f in part]

    def _stop_workers(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def close(self):
        self._stop_workers()
        for key in self.keys.values():
            _TASKS.pop(key, None)
