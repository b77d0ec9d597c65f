"""Measures candidates: builds a batch, then checks and times each kernel in a worker process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from ..target import Target
from . import worker
from .builder import build_batch
from .result import COMPILE_ERROR, OK, RUNTIME_ERROR, TIMEOUT, MeasureResult


@dataclass
class RunConfig:
    timeout: float = 10.0        # seconds per candidate (check + timing)
    repeat: int = 3
    number: int = 0              # calls per repeat; 0 picks it from min_repeat_ms
    min_repeat_ms: float = 10.0
    flush: bool = False          # flush caches before each (single-call) repeat
    rtol: float = 1e-3
    atol: float = 1e-4           # scaled by the largest reference magnitude
    pin: bool = True             # single-thread targets: keep the measurement process on one core


def measurement_cpu(target: Target, config: RunConfig) -> int | None:
    """The core a single-thread target's kernels are timed on, or None to let the OS place them.

    On a shared (virtual) machine the cores are not alike: one kernel timed 70 GFLOPS on one core
    and 114 on the other of this project's machine in the same minute, so a measurement process
    that migrates between cores mixes the two speeds into one session's ranking.
    """
    if not config.pin or target.threads != 1 or not hasattr(os, "sched_getaffinity"):
        return None
    return max(os.sched_getaffinity(0))


class Runner:
    """A measurement process, restarted whenever a candidate crashes or hangs in it."""

    def __init__(self, target: Target, config: RunConfig | None = None):
        self.target = target
        self.config = config or RunConfig()
        self._proc = None
        self._conn = None
        self._data_id = None
        self._data = None

    # ------------------------------------------------------------ process lifecycle
    def _start(self):
        # A plain child process (not multiprocessing), so the caller's script is never re-imported;
        # in its own session, so a Ctrl-C meant for the tuner does not kill a measurement midway.
        # The kernels' OpenMP gets the target's threads and spins only briefly, so it does not
        # starve the tuner's own OpenMP (xgboost) on a small machine; NumPy's BLAS stays single.
        env = dict(os.environ, OMP_NUM_THREADS=str(self.target.threads), GOMP_SPINCOUNT="10000",
                   OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        proc = subprocess.Popen([sys.executable, "-m", worker.__name__], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, start_new_session=True)
        cpu = measurement_cpu(self.target, self.config)
        if cpu is not None:
            os.sched_setaffinity(proc.pid, {cpu})
        self._proc = proc
        self._conn = worker.Channel(proc.stdout.fileno(), proc.stdin.fileno())
        proc.stdin.close()
        proc.stdout.close()
        self._data_id = None

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _kill(self):
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = self._data_id = None

    def close(self):
        if self._alive():
            try:
                self._conn.send(("stop",))
                self._proc.wait(timeout=2)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _set_data(self, key: str, inputs: list, reference):
        """Inputs and expected output for the next candidates (sent once per worker)."""
        if self._data is None or self._data[0] != key:
            self._data = (key, inputs, reference)

    def _ensure_ready(self):
        if not self._alive():
            self._kill()
            self._start()
        if self._data_id != self._data[0]:
            self._conn.send(("setup", self._data[1], self._data[2]))
            if not self._conn.poll(120) or self._conn.recv()[0] != "ready":
                raise RuntimeError("measurement process did not start")
            self._data_id = self._data[0]

    # ------------------------------------------------------------ measuring
    def measure(self, task, batch: list):
        """Build the batch (one compiler call per core), then yield (candidate, result) as each is timed."""
        self._set_data(task.workload.key, *task.data)
        built = build_batch([(c.func_name, c.source) for c in batch], task.target,
                            openmp=any(c.openmp for c in batch))
        for cand, b in zip(batch, built):
            if b.error is not None:
                yield cand, MeasureResult(COMPILE_ERROR, b.error, build_s=b.seconds)
                continue
            result = self.run(b.lib, b.index)
            result.build_s = b.seconds
            yield cand, result
        self._release()

    def run(self, lib: str, index: int) -> MeasureResult:
        """Check and time kernel `index` of library `lib`."""
        cfg = self.config
        self._ensure_ready()
        start = time.perf_counter()
        try:
            self._conn.send(("measure", lib, index, cfg.number, cfg.repeat, cfg.min_repeat_ms, cfg.flush,
                             cfg.rtol, cfg.atol))
            if not self._conn.poll(cfg.timeout):
                self._kill()
                return MeasureResult(TIMEOUT, f"no result within {cfg.timeout:g} s (hung or far too slow); "
                                     "the measurement process was restarted", run_s=time.perf_counter() - start)
            kind, message, costs, run_s = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self._kill()
            how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
            return MeasureResult(RUNTIME_ERROR, f"kernel crashed the measurement process ({how})",
                                 run_s=time.perf_counter() - start)
        return MeasureResult(kind, message, costs if kind == OK else [], run_s=run_s)

    def _release(self):
        """Unload the libraries the worker holds (between batches)."""
        if self._alive():
            self._conn.send(("release",))
            if self._conn.poll(30):
                self._conn.recv()
