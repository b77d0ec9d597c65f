"""Apply-best for one operator: build the best logged schedule into a callable kernel."""
from __future__ import annotations

import warnings

import numpy as np

from .database import records
from .database.union import Database
from .errors import UserError
from .measure.builder import build_batch
from .measure.cuda_build import build_cuda_batch
from .measure.cuda_worker import time_launches
from .ops import Workload, resolve
from .runtime.artifact import SHIPPED
from .target import Target, parse_target
from .task import Task
from .toolchain.library import aligned_copy, aligned_empty, ffi, open_library, pointer_array


class _OpKernel:
    """What a built operator knows of itself, and the checks on the arrays it is called with."""

    def __init__(self, task: Task, steps: list, record: dict | None, source_log: str | None):
        self.workload = task.workload
        self.target = task.target
        self.steps = steps
        self.record = record
        self.source_log = source_log
        self.input_shapes = [t.shape for t in task.space.inputs]
        self.output_shape = task.space.output.shape

    @property
    def tuned(self) -> bool:
        return self.record is not None

    def _check_count(self, arrays) -> None:
        if len(arrays) != len(self.input_shapes):
            raise UserError(f"{self.workload.label} takes {len(self.input_shapes)} arrays "
                            f"with shapes {self.input_shapes}, got {len(arrays)}")

    def _check_shape(self, k, shape) -> None:
        if tuple(shape) != tuple(self.input_shapes[k]):
            raise UserError(f"argument {k} of {self.workload.label} must have shape {self.input_shapes[k]}, "
                            f"got {tuple(shape)}")


class Kernel(_OpKernel):
    """A compiled operator that runs on NumPy arrays in the workload's layout."""

    def __init__(self, task: Task, steps: list, record: dict | None, source_log: str | None):
        super().__init__(task, steps, record, source_log)
        cand = task.candidate(steps, func_name="tuner_kernel")
        self.source = cand.source
        self.code_hash = cand.code_hash
        built = build_batch([(cand.func_name, cand.source)], self.target, openmp=cand.openmp, jobs=1)[0]
        if built.error:
            raise RuntimeError(f"could not compile {self.workload.label}: {built.error}")
        self._lib = open_library(built.lib)
        self._index = built.index

    def __call__(self, *arrays: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        self._check_count(arrays)
        args = []
        for k, a in enumerate(arrays):
            a = np.ascontiguousarray(a, dtype=np.float32)
            self._check_shape(k, a.shape)
            args.append(a)
        if out is None:
            out = np.empty(self.output_shape, np.float32)
        elif out.shape != self.output_shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise UserError(f"out must be a C-contiguous float32 array of shape {self.output_shape}")
        rc = self._lib.tuner_run(self._index, pointer_array(args + [out]))
        if rc:
            raise RuntimeError(f"{self.workload.label} kernel failed with code {rc}")
        return out

    def time(self, *arrays: np.ndarray, repeat: int = 5, min_repeat_ms: float = 50.0, cold: bool = False) -> list:
        """Seconds per call over `repeat` repeats, timed in C; cold: the workload's constant inputs
        evicted from every cache level before each call (RunConfig.cold_weights)."""
        keep = [aligned_copy(np.asarray(a, dtype=np.float32)) for a in arrays] + [aligned_empty(self.output_shape)]
        costs = ffi().new("double[]", repeat)
        evict = self.workload.cold_bytes(keep) if cold else []
        if any(evict):
            rc = self._lib.tuner_time_cold(self._index, pointer_array(keep), len(evict), ffi().new("long long[]", evict),
                                           0, repeat, min_repeat_ms, costs)
        else:
            rc = self._lib.tuner_time(self._index, pointer_array(keep), 0, repeat, min_repeat_ms, 0, costs)
        if rc:
            raise RuntimeError(f"{self.workload.label} kernel failed with code {rc}")
        return list(costs)


class CudaKernel(_OpKernel):
    """A compiled CUDA operator. Called with NumPy arrays it copies them to the GPU and the
    result back; called with pycuda GPUArrays it launches on them and returns a GPUArray."""

    def __init__(self, task: Task, steps: list, record: dict | None, source_log: str | None):
        super().__init__(task, steps, record, source_log)
        cand = task.candidate(steps, func_name="tuner_kernel")
        self.source, self.code_hash, self.launch = cand.source, cand.code_hash, cand.launch
        [built] = build_cuda_batch([cand], self.target)
        if built.error:
            raise RuntimeError(f"could not build {self.workload.label} for {self.target}: {built.error}")
        try:
            try:
                import pycuda.autoprimaryctx  # noqa: F401  (the device's primary context, shared)
            except ImportError as e:
                if e.name != "pycuda.autoprimaryctx":
                    raise
                import pycuda.autoinit  # noqa: F401  (older pycuda)
            import pycuda.driver as drv
        except ImportError:
            raise UserError("running a CUDA kernel needs pycuda, which is not installed: on a machine with an "
                            "NVIDIA driver run pip install -e '.[cuda]'") from None
        self._fn = drv.module_from_file(built.lib).get_function(cand.func_name)

    def __call__(self, *arrays, out=None):
        import pycuda.gpuarray as ga
        self._check_count(arrays)
        on_gpu = all(isinstance(a, ga.GPUArray) for a in arrays)
        args = []
        for k, a in enumerate(arrays):
            if not on_gpu:
                a = ga.to_gpu(np.ascontiguousarray(a, dtype=np.float32))
            elif a.dtype != np.float32 or not a.flags.c_contiguous:
                raise UserError(f"argument {k} of {self.workload.label} must be a C-contiguous float32 GPUArray")
            self._check_shape(k, a.shape)
            args.append(a)
        if out is None:
            out = ga.empty(self.output_shape, np.float32)
        elif not isinstance(out, ga.GPUArray) or out.shape != self.output_shape or out.dtype != np.float32:
            raise UserError(f"out must be a float32 GPUArray of shape {self.output_shape}")
        self._launch(args, out)
        return out if on_gpu else out.get()

    def _launch(self, args: list, out) -> None:
        self._fn(*[a.gpudata for a in args], out.gpudata, block=(self.launch.block, 1, 1),
                 grid=(self.launch.grid, 1, 1))

    def time(self, *arrays, repeat: int = 5, min_repeat_ms: float = 50.0) -> list:
        """Seconds per launch over `repeat` repeats, timed with CUDA events on device copies."""
        import pycuda.driver as drv
        import pycuda.gpuarray as ga

        args = [a if isinstance(a, ga.GPUArray) else ga.to_gpu(np.ascontiguousarray(a, dtype=np.float32))
                for a in arrays]
        out = ga.empty(self.output_shape, np.float32)
        self._launch(args, out)
        return time_launches(drv, lambda: self._launch(args, out), repeat, min_repeat_ms)


# the kernel class of each target kind
KERNELS = {"cpu": Kernel, "cuda": CudaKernel}


def build_op(workload: str | Workload, layout: str | None = None, target: str | Target = "cpu",
             log: str | None = None, threads: int | None = None, use_shipped: bool = True,
             quiet: bool = False) -> _OpKernel:
    """The best schedule for `workload` from `log` (then the shipped database), else the default."""
    wl = workload if isinstance(workload, Workload) else resolve(workload, layout)
    tgt = parse_target(target, threads)
    task = Task(wl, tgt)
    shipped = ", ".join(str(p) for p in records.shipped_databases(tgt)) or str(records.shipped_database(tgt))
    rec, where = Database.open(log, tgt, use_shipped, missing="skip", warn=not quiet).best(wl, tgt)
    if rec is None:
        where = None
        if not quiet:
            searched = ", ".join(str(p) for p in [log, shipped if use_shipped else None] if p) or "no log"
            warnings.warn(f"no tuning record for {wl.label} on '{tgt}' in {searched}; "
                          "using the default (untuned) schedule", stacklevel=2)
    elif where == SHIPPED:
        where = shipped
    steps = rec.steps if rec else task.space.steps(task.space.default())
    return KERNELS[tgt.kind](task, steps, rec, where)
