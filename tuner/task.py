"""A task: one workload on one target, and the way from a step list to C code."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

from .codegen.c import generate_c
from .codegen.cuda import generate_cuda
from .errors import UserError
from .ops import Workload, make, tensor_bytes
from .schedule.lower import lower
from .schedule.schedule import ScheduleError, replay
from .space.gpu import GpuSearchSpace
from .space.sketch import SearchSpace
from .target import Target
from .te.dynamic import SYMBOL_PREFIX, DynamicDims, DynamicError, evaluate, fit_dims, with_bodies

MEMORY_COPIES = 3      # tensors held at once: here (inputs, reference) and in the worker (copies, output)


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass
class Candidate:
    steps: list
    source: str          # C source of the kernel function (named `func_name`)
    func_name: str
    openmp: bool
    code_hash: str
    decisions: dict | None = None   # the point in the search space the steps came from, if known
    launch: object = None           # CUDA: the codegen.cuda.CudaKernel (grid, block, shared memory)


def _c_code(func, target) -> tuple:
    src, omp = generate_c(func, target.lanes, target.threads)
    return src, omp, None


def _cuda_code(func, target) -> tuple:
    k = generate_cuda(func)
    return k.source, False, k


# per target kind: its search space, and its code generator ((source, openmp, launch) of a loop nest)
SPACES = {"cpu": SearchSpace, "cuda": GpuSearchSpace}
CODEGEN = {"cpu": _c_code, "cuda": _cuda_code}


def _renamed(source: str, func_name: str, name: str) -> str:
    return re.sub(rf"\b{re.escape(func_name)}\b", name, source)


def code_hash(source: str, func_name: str) -> str:
    """Hash of the code with its function name removed: equal code, equal hash."""
    return hashlib.sha256(_renamed(source, func_name, "KERNEL").encode()).hexdigest()[:20]


def by_code(func_name: str, source: str) -> tuple:
    """(name, source) of a kernel named by its code (tk_ and its code hash), as a tune builds it and a
    compiled model links it: one cached object serves both, whatever either called it."""
    name = f"tk_{code_hash(source, func_name)}"
    return name, _renamed(source, func_name, name)


class Task:
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        try:
            self.space = SPACES[target.kind](workload, target)
        except ValueError as e:          # an operator the target's sketches do not cover
            raise UserError(f"{e} (target {target.kind})") from None
        self._counter = 0
        self.seeds: list = []       # decisions measured for another thread count: a tune's first round tries them
        self._lowered: OrderedDict = OrderedDict()
        self.codegen_s = 0.0        # time spent turning step lists into C (the tuning loop reports it)

    LOWERED_MEMO = 4096

    def lowered(self, steps: list):
        """The loop nest of a step list, memoised: the cost model scores a schedule and codegen
        then prints the same one. Raises ScheduleError on an illegal schedule."""
        key = json.dumps(steps)
        func = self._lowered.get(key)
        if func is None:
            func = self._lowered[key] = lower(self.space.schedule(steps))
            if len(self._lowered) > self.LOWERED_MEMO:
                self._lowered.popitem(last=False)
        return func

    def dynamic_dims(self, symbolic: dict, symbols: tuple) -> DynamicDims:
        """The run-time extents of this task's kernel when its parameters `symbolic` (name ->
        te expression of symbol_var(k) for symbols[k]) vary with the symbols, this task's workload
        being the one at their upper bounds. Raises DynamicError where that does not hold."""
        wl = self.workload
        bound = {f"{SYMBOL_PREFIX}{k}": s.hi for k, s in enumerate(symbols)}
        for name, e in symbolic.items():
            if name not in wl.p:
                raise DynamicError(f"{wl.op} has no parameter {name!r}")
            if evaluate(e, bound) != wl.p[name]:
                raise DynamicError(f"{wl.label}: {name}={wl.p[name]} is not its value at the symbols' bounds")

        def build(values):
            return make(wl.op, {**wl.p, **{k: evaluate(e, values) for k, e in symbolic.items()}}, wl.layout).build()

        return fit_dims(build, symbols)

    @property
    def name(self) -> str:
        return self.workload.name or self.workload.spec

    def candidate(self, steps: list, func_name: str | None = None, decisions: dict | None = None,
                  dims: DynamicDims | None = None) -> Candidate:
        """Replay `steps`, lower and generate C (with `dims`, a dynamic kernel: dynamic_dims).
        Raises ScheduleError on an illegal schedule."""
        if func_name is None:
            self._counter += 1
            func_name = f"k{self._counter}"
        start = time.perf_counter()
        try:
            func = (lower(replay(*with_bodies(self.space.inputs, self.space.output, dims.bodies), steps), func_name,
                          dims) if dims is not None and dims.symbols
                    else dataclasses.replace(self.lowered(steps), name=func_name))
            src, omp, launch = CODEGEN[self.target.kind](func, self.target)
        finally:
            self.codegen_s += time.perf_counter() - start
        return Candidate(steps, src, func_name, omp, code_hash(src, func_name), decisions, launch)

    def applied(self, steps: list) -> Candidate | None:
        """candidate(steps), or None where they do not apply to this task (a schedule of another shape)."""
        try:
            return self.candidate(steps)
        except (ScheduleError, ValueError):
            return None

    def code(self, steps: list) -> str | None:
        """The hash of the code `steps` give on this task, or None where they do not apply."""
        cand = self.applied(steps)
        return cand.code_hash if cand is not None else None

    def from_decisions(self, decisions: dict) -> Candidate:
        return self.candidate(self.space.steps(decisions), decisions=decisions)

    def default_candidate(self) -> Candidate:
        return self.from_decisions(self.space.default())

    @cached_property
    def data(self) -> tuple:
        """(random inputs, reference output): the correctness check every candidate faces.

        Refused with a clear message when this process and the measurement process together
        (inputs and reference here, their aligned copies and the output there) would not fit in
        the memory the machine has free."""
        need = MEMORY_COPIES * tensor_bytes(self.workload)
        free = available_memory()
        if free is not None and need > free:
            raise UserError(f"{self.workload.label} needs about {need / 2**30:.1f} GiB to check and time its "
                            f"kernels, and this machine has {free / 2**30:.1f} GiB free; tune a smaller shape")
        inputs = self.workload.random_inputs(seed=0)
        return inputs, self.workload.reference(inputs)
