"""A task: one workload on one target, and the way from a step list to C code."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

from .codegen.c import generate_c
from .schedule.lower import lower
from .space.sketch import SearchSpace
from .target import Target
from .te.workloads import Workload


@dataclass
class Candidate:
    steps: list
    source: str          # C source of the kernel function (named `func_name`)
    func_name: str
    openmp: bool
    code_hash: str
    decisions: dict | None = None   # the point in the search space the steps came from, if known


def code_hash(source: str, func_name: str) -> str:
    """Hash of the code with its function name removed: equal code, equal hash."""
    body = re.sub(rf"\b{re.escape(func_name)}\b", "KERNEL", source)
    return hashlib.sha256(body.encode()).hexdigest()[:20]


class Task:
    def __init__(self, workload: Workload, target: Target):
        self.workload = workload
        self.target = target
        self.space = SearchSpace(workload, target)
        self._counter = 0

    @property
    def name(self) -> str:
        return self.workload.name or self.workload.spec

    def candidate(self, steps: list, func_name: str | None = None, decisions: dict | None = None) -> Candidate:
        """Replay `steps`, lower and generate C. Raises ScheduleError on an illegal schedule."""
        if func_name is None:
            self._counter += 1
            func_name = f"k{self._counter}"
        sch = self.space.schedule(steps)
        src, omp = generate_c(lower(sch, func_name), self.target.lanes, self.target.threads)
        return Candidate(steps, src, func_name, omp, code_hash(src, func_name), decisions)

    def from_decisions(self, decisions: dict) -> Candidate:
        return self.candidate(self.space.steps(decisions), decisions=decisions)

    def default_candidate(self) -> Candidate:
        return self.from_decisions(self.space.default())

    @cached_property
    def data(self) -> tuple:
        """(random inputs, reference output): the correctness check every candidate faces."""
        inputs = self.workload.random_inputs(seed=0)
        return inputs, self.workload.reference(inputs)
