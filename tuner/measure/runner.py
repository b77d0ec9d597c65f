"""Measures candidates: builds a batch, then checks and times each kernel in a worker process."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..database.result import COMPILE_ERROR, OK, RUNTIME_ERROR, TIMEOUT, MeasureResult
from ..errors import SetupError, check_bound
from ..target import Target
from ..toolchain.process import spawn
from . import plausible, worker
from .builder import build_batch
from .cuda_build import build_cuda_batch


@dataclass
class RunConfig:
    timeout: float = 10.0        # seconds per candidate (check + timing)
    repeat: int = 3
    number: int = 0              # calls per repeat; 0 picks it from min_repeat_ms
    min_repeat_ms: float = 10.0
    flush: bool = False          # flush caches before each (single-call) repeat
    cold_weights: bool = False   # evict the workload's constant inputs (Workload.constant_inputs) before
                                 # every timed call, as a model meets its weights (a model tune's default)
    rtol: float = 1e-3
    atol: float = 1e-4           # scaled by the largest reference magnitude
    pin: bool = True             # single-thread targets: keep the measurement process on one core

    def times_cold(self, workload) -> bool:
        """Whether this config times `workload` with its weights evicted: the condition its records
        carry (Record.cold); a workload without constant inputs has none to evict."""
        return self.cold_weights and bool(workload.constant_inputs)

    def __post_init__(self):
        """A timeout of 0 would record every candidate as TIMEOUT, -1 repeats as RUNTIME_ERROR: refused."""
        for name, least, inclusive in (("timeout", 0, False), ("repeat", 1, True), ("number", 0, True),
                                       ("min_repeat_ms", 0, True), ("rtol", 0, True), ("atol", 0, True)):
            check_bound(f"--{name.replace('_', '-')}", getattr(self, name), least, inclusive)


class CoreClaim:
    """The core a single-thread target's kernels are timed on, held by this process alone.

    On a shared (virtual) machine the cores are not alike (docs/history.md), so a measurement
    process that migrates between cores mixes their speeds into one session's ranking. Two tuners
    pinned to one core time each other, so each core is claimed with a lock on a
    file in a machine-wide directory (whatever the users' caches; the kernel drops the lock of a
    tuner that dies); when every core is claimed, the process is not pinned and a warning says
    the timings will interfere.
    """

    DIR = Path("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()) / "tuner-core-claims"

    def __init__(self, target: Target, config: RunConfig):
        self.cpu, self._fd = None, None
        if not config.pin or target.threads != 1 or not hasattr(os, "sched_getaffinity"):
            return
        for cpu in sorted(os.sched_getaffinity(0), reverse=True):
            fd = self._lock(cpu)
            if fd is not None:
                self.cpu, self._fd = cpu, fd
                return
        warnings.warn("every core this process may use is already timing another tuner's kernels; "
                      "measurements will not be pinned and will disturb each other", stacklevel=3)

    def _lock(self, cpu: int) -> int | None:
        """An fd holding the claim on `cpu`, or None if another process holds it (or it cannot be had)."""
        try:
            self.DIR.mkdir(mode=0o1777, exist_ok=True)        # shared by every user, like /tmp
            if self.DIR.stat().st_uid == os.geteuid():
                os.chmod(self.DIR, 0o1777)
            fd = os.open(self.DIR / f"cpu{cpu}.lock", os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # a read-only fd can hold it: no one writes
        except OSError:
            os.close(fd)
            return None
        return fd

    def release(self):
        if self._fd is not None:
            os.close(self._fd)
        self.cpu, self._fd = None, None


class CpuRunner:
    """A measurement process, restarted whenever a candidate crashes or hangs in it."""

    WORKER = worker.__name__

    def __init__(self, target: Target, config: RunConfig | None = None):
        self.target = target
        self.config = config or RunConfig()
        self._proc = None
        self._conn = None
        self._data_id = None
        self._data = None
        self._cold = []        # per kernel argument: bytes evicted before each timed call (0: kept warm)
        self._core = None      # the core claimed for this runner's measurements (first start)

    # ------------------------------------------------------------ process lifecycle
    def _start(self):
        # In its own session (toolchain.process.spawn), so a Ctrl-C meant for the tuner does not kill a
        # measurement midway. The kernels' OpenMP gets the target's threads and spins only briefly,
        # so it does not starve the tuner's own OpenMP (xgboost) on a small machine; NumPy's BLAS
        # stays single.
        proc, self._conn = spawn(worker.__name__, dict(
            OMP_NUM_THREADS=str(self.target.threads), GOMP_SPINCOUNT="10000", OPENBLAS_NUM_THREADS="1",
            MKL_NUM_THREADS="1"))
        if self._core is None:
            self._core = CoreClaim(self.target, self.config)
        if self._core.cpu is not None:
            os.sched_setaffinity(proc.pid, {self._core.cpu})
        self._proc = proc
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

    def status(self) -> str:
        """What the progress line adds about the measuring (nothing for one local process)."""
        return ""

    def close(self):
        if self._alive():
            try:
                self._conn.send(("stop",))
                self._proc.wait(timeout=2)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        if self._core is not None:
            self._core.release()
            self._core = None

    @property
    def cpu(self) -> int | None:
        """The core measurements are pinned to (None: not pinned, or not started yet)."""
        return self._core.cpu if self._core is not None else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _set_data(self, key: str, inputs: list, reference):
        """Inputs and expected output for the next candidates (sent once per worker)."""
        if self._data is None or self._data[0] != key:
            self._data = (key, inputs, reference)

    def _ensure_ready(self):
        """A live measurement process holding the current data; a process that dies while being set
        up (killed from outside) is replaced twice before the machine is blamed."""
        for _ in range(3):
            if not self._alive():
                self._kill()
                self._start()
            if self._data_id == self._data[0]:
                return
            try:
                self._conn.send(("setup", self._data[1], self._data[2]))
                reply = self._conn.recv() if self._conn.poll(120) else ("",)
                if reply[0] == "ready":
                    self._data_id = self._data[0]
                    return
                if reply[0] == "SETUP":          # it started and says why it cannot measure
                    self._kill()
                    raise SetupError(reply[1])
            except (EOFError, OSError):
                pass
            code = self._proc.poll()
            self._kill()
        raise SetupError(f"the measurement process did not start (exit code {code}); run "
                         f"`{sys.executable} -m {self.WORKER}` to see why")

    # ------------------------------------------------------------ measuring
    peak_here = True   # timings bounded by this host's measured peak (plausible.check); else the target's ceiling
    ahead = 0      # batches the tuning loop may propose before this one's results are in (nothing runs meanwhile)

    def measure(self, task, batch: list):
        """Build the batch (one compiler call per core), then yield (candidate, result) as each is timed."""
        return self.measure_built(task, batch, build(batch, self.target))

    def measure_built(self, task, batch: list, built: list):
        """Yield (candidate, result) as each of `batch` is timed, from its builder.BuildResults
        (built here by `measure`, or elsewhere: a cluster's build workers)."""
        self._set_data(task.workload.key, *task.data)
        cold = self.config.times_cold(task.workload)
        self._cold = (task.workload.cold_bytes(task.data[0]) if cold else [0] * len(task.data[0])) + [0]
        for cand, b in zip(batch, built):
            if b.error is not None:
                yield cand, MeasureResult(COMPILE_ERROR, b.error, build_s=b.seconds, cold=cold)
                continue
            result = self._run(self._message(cand, b))
            result.build_s, result.cold = b.seconds, cold
            yield cand, plausible.check(task.workload, self.target, result, here=self.peak_here)
        self._release()

    def _message(self, cand, built) -> tuple:
        """What the measurement process is sent to check and time one built candidate."""
        cfg = self.config
        return ("measure", built.lib, built.index, cfg.number, cfg.repeat, cfg.min_repeat_ms, cfg.flush,
                cfg.rtol, cfg.atol, self._cold)

    def _run(self, message: tuple) -> MeasureResult:
        """Send one measurement to the worker and wait for its result.

        A candidate that takes the measurement process down is tried once more in a fresh one: a
        process killed from outside (the OOM killer, a user's kill) must not be recorded as the
        candidate's crash. Crashing twice is the candidate's own doing."""
        result, crashed = self._attempt(message)
        if crashed:
            result, crashed = self._attempt(message)
            if crashed:
                result.message += " (twice, each in a fresh process)"
        return result

    def _attempt(self, message: tuple) -> tuple:
        cfg = self.config
        self._ensure_ready()
        start = time.perf_counter()
        try:
            self._conn.send(message)
            if not self._conn.poll(cfg.timeout):
                self._kill()
                return MeasureResult(TIMEOUT, f"no result within {cfg.timeout:g} s (hung or far too slow); "
                                     "the measurement process was restarted", run_s=time.perf_counter() - start), False
            kind, message, costs, run_s = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self._kill()
            how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
            return MeasureResult(RUNTIME_ERROR, f"kernel crashed the measurement process ({how})",
                                 run_s=time.perf_counter() - start), True
        if kind == "SETUP":
            raise SetupError(message)
        return MeasureResult(kind, message, costs if kind == OK else [], run_s=run_s), False

    def _release(self):
        """Unload the libraries the worker holds (between batches)."""
        if self._alive():
            try:
                self._conn.send(("release",))
                if self._conn.poll(30):
                    self._conn.recv()
            except (EOFError, OSError):      # it died meanwhile: the next candidate starts a fresh one
                self._kill()


class CudaRunner(CpuRunner):
    """Measures CUDA candidates: one nvcc call per batch (cuda_build), then each kernel checked
    and timed with CUDA events in a process that owns the GPU (cuda_worker). The crash, hang and
    restart handling is the CPU runner's; no core is claimed (the GPU is the measured device). Its
    builds are runner.build's for kind 'cuda'."""

    WORKER = "tuner.measure.cuda_worker"
    peak_here = False

    def _start(self):
        self._proc, self._conn = spawn(self.WORKER, {})
        self._data_id = None

    def _message(self, cand, built) -> tuple:
        cfg, k = self.config, cand.launch
        return ("measure", built.lib, cand.func_name, k.grid, k.block, cfg.number, cfg.repeat, cfg.min_repeat_ms,
                cfg.flush, cfg.rtol, cfg.atol)


def _build_cpu(batch: list, target: Target, jobs: int | None = None) -> list:
    return build_batch([(c.func_name, c.source) for c in batch], target, openmp=any(c.openmp for c in batch),
                       jobs=jobs)


def _build_cuda(batch: list, target: Target, jobs: int | None = None) -> list:
    return build_cuda_batch(batch, target)          # one nvcc call: `jobs` does not apply


# per target kind: its measurement process, and how a batch of its candidates is built
RUNNERS = {"cpu": CpuRunner, "cuda": CudaRunner}
BUILDERS = {"cpu": _build_cpu, "cuda": _build_cuda}


def build(batch: list, target: Target, jobs: int | None = None) -> list:
    """One builder.BuildResult per candidate of `batch` (task.Candidates) for `target`; `jobs`:
    compiler calls at once (default one per core)."""
    return BUILDERS[target.kind](batch, target, jobs)
