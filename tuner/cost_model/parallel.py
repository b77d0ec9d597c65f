"""Features computed by worker processes as well as the search's own.

Lowering a schedule and extracting its features is pure Python, most of a search round's own
time, and while the search ranks candidates nothing is built or timed: the other cores are idle.

The workers are plain child processes (`python -m tuner.cost_model.feature_worker`), as the
measurement worker is, not forks of the tuning process. A fork copies every lock that one of the
tuner's other threads (the builder's, XGBoost's OpenMP, ONNX Runtime's in a test session) held at
that moment, and a forked worker did wait forever on one, hanging the test suite in CI. A fresh
interpreter holds no such lock; it costs half a second of start-up on another core, once per
session, and the session's tasks are sent to it as (workload, target) pairs, rebuilt on first use.
Every wait on a worker has a deadline, and a worker is only ever killed, never joined, so no
worker can stop the search.
"""
from __future__ import annotations

import time
import warnings

from ..target import host_cores
from ..toolchain.process import spawn
from . import feature_worker
from .dataset import features_or_none


class _Worker:
    """One feature worker process and its channel."""

    def __init__(self):
        self.proc, self.channel = spawn(feature_worker.__name__,
                                        dict(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1"))

    def result(self, deadline: float):
        """The answer to the last request; TimeoutError after `deadline` (time.monotonic())."""
        if not self.channel.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError
        return self.channel.recv()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()            # SIGKILL cannot be ignored: this returns at once
        self.channel.close()


class FeaturePool:
    """Splits a list of schedules between the caller and `workers` worker processes."""

    MIN_SHARE = 8      # schedules per share below which a round trip to a worker is not worth it
    TIMEOUT = 120.0    # seconds a share may take before the workers are given up on

    def __init__(self, tasks: list, workers: int | None = None):
        self.keys = {id(task): i for i, task in enumerate(tasks)}
        if workers is None:
            workers = host_cores() - 1
        self.workers: list = []
        table = {i: (task.workload, task.target) for i, task in enumerate(tasks)}
        try:
            for _ in range(workers):
                self.workers.append(_Worker())
            for w in self.workers:
                w.channel.send(("tasks", table))
        except OSError as e:            # no process, or one that died at start-up
            self._give_up(f"feature workers could not start ({e})")

    def map(self, task, steps_list: list) -> list:
        """[features or None] for each step list; the caller featurises the first share itself."""
        key = self.keys.get(id(task))
        shares = min(len(self.workers) + 1, len(steps_list) // self.MIN_SHARE)
        if key is None or shares < 2:
            return [features_or_none(task, s) for s in steps_list]
        size = -(-len(steps_list) // shares)
        chunks = [steps_list[i:i + size] for i in range(0, len(steps_list), size)]
        busy = self.workers[:len(chunks) - 1]
        try:
            for w, chunk in zip(busy, chunks[1:]):
                w.channel.send(("features", key, chunk))
        except OSError as e:
            self._give_up(f"a feature worker is gone ({e})")
            return [features_or_none(task, s) for s in steps_list]
        mine = [features_or_none(task, s) for s in chunks[0]]
        deadline = time.monotonic() + self.TIMEOUT
        try:
            theirs = [w.result(deadline) for w in busy]
        except TimeoutError:
            self._give_up(f"feature workers gave no answer in {self.TIMEOUT:.0f} s")
            theirs = [[features_or_none(task, s) for s in c] for c in chunks[1:]]
        except (EOFError, OSError) as e:
            self._give_up(f"a feature worker died ({type(e).__name__})")
            theirs = [[features_or_none(task, s) for s in c] for c in chunks[1:]]
        return mine + [f for part in theirs for f in part]

    def _give_up(self, why: str):
        warnings.warn(f"{why}; featurising in the tuning process from now on (slower, same results)",
                      RuntimeWarning, stacklevel=3)
        self.close()

    @property
    def alive(self) -> bool:
        """Whether any worker shares the work (False once given up on or closed)."""
        return bool(self.workers)

    def close(self):
        for w in self.workers:
            w.kill()
        self.workers = []
