"""Apply-best for one operator: build the best logged schedule into a callable kernel."""
from __future__ import annotations

import numpy as np

from . import records
from .errors import UserError
from .measure.builder import build_batch
from .measure.library import ffi, open_library, pointer_array
from .target import Target, parse_target
from .task import Task
from .te.workloads import Workload, resolve


class Kernel:
    """A compiled operator that runs on NumPy arrays in the workload's layout."""

    def __init__(self, task: Task, steps: list, record: dict | None, source_log: str | None):
        self.workload = task.workload
        self.target = task.target
        self.steps = steps
        self.record = record
        self.source_log = source_log
        cand = task.candidate(steps, func_name="tuner_kernel")
        self.source = cand.source
        self.code_hash = cand.code_hash
        built = build_batch([(cand.func_name, cand.source)], self.target, openmp=cand.openmp, jobs=1)[0]
        if built.error:
            raise RuntimeError(f"could not compile {self.workload.label}: {built.error}")
        self._lib = open_library(built.lib)
        self._index = built.index
        ins, out = task.space.inputs, task.space.output
        self.input_shapes = [t.shape for t in ins]
        self.output_shape = out.shape

    @property
    def tuned(self) -> bool:
        return self.record is not None

    def __call__(self, *arrays: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if len(arrays) != len(self.input_shapes):
            raise UserError(f"{self.workload.label} takes {len(self.input_shapes)} arrays "
                             f"with shapes {self.input_shapes}, got {len(arrays)}")
        args = []
        for k, (a, shape) in enumerate(zip(arrays, self.input_shapes)):
            a = np.ascontiguousarray(a, dtype=np.float32)
            if a.shape != shape:
                raise UserError(f"argument {k} of {self.workload.label} must have shape {shape}, got {a.shape}")
            args.append(a)
        if out is None:
            out = np.empty(self.output_shape, np.float32)
        elif out.shape != self.output_shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise UserError(f"out must be a C-contiguous float32 array of shape {self.output_shape}")
        rc = self._lib.tuner_run(self._index, pointer_array(args + [out]))
        if rc:
            raise RuntimeError(f"{self.workload.label} kernel failed with code {rc}")
        return out

    def time(self, *arrays: np.ndarray, repeat: int = 5, min_repeat_ms: float = 50.0) -> list:
        """Seconds per call over `repeat` repeats, timed in C."""
        keep = [np.ascontiguousarray(a, dtype=np.float32) for a in arrays] + [np.empty(self.output_shape, np.float32)]
        costs = ffi().new("double[]", repeat)
        rc = self._lib.tuner_time(self._index, pointer_array(keep), 0, repeat, min_repeat_ms, 0, costs)
        if rc:
            raise RuntimeError(f"{self.workload.label} kernel failed with code {rc}")
        return list(costs)


def build_op(workload: str | Workload, layout: str | None = None, target: str | Target = "cpu",
             log: str | None = None, threads: int | None = None, use_shipped: bool = True,
             quiet: bool = False) -> Kernel:
    """The best schedule for `workload` from `log` (then the shipped database), else the default."""
    wl = workload if isinstance(workload, Workload) else resolve(workload, layout)
    tgt = parse_target(target, threads)
    task = Task(wl, tgt)
    logs = [log] + ([records.shipped_database(tgt)] if use_shipped else [])
    rec, where = records.apply_best(logs, wl, str(tgt), quiet=quiet)
    steps = rec.steps if rec else task.space.steps(task.space.default())
    return Kernel(task, steps, rec, where)
