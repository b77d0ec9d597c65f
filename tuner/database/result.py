"""What one measurement produced: costs, or an error kind with its message."""
from __future__ import annotations

from dataclasses import dataclass, field

OK = "OK"
COMPILE_ERROR = "COMPILE_ERROR"
RUNTIME_ERROR = "RUNTIME_ERROR"
TIMEOUT = "TIMEOUT"
WRONG_ANSWER = "WRONG_ANSWER"
NOT_IN_LOG = "NOT_IN_LOG"      # replay mode: the candidate was never measured in the replayed log
ERROR_KINDS = (OK, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, WRONG_ANSWER, NOT_IN_LOG)
# how a kernel's weights are timed: evicted before every call (MeasureResult.cold), or kept in cache
WEIGHTS = ("cold", "warm")      # a model tune's choice (--weights); the first is its default


def median_cost(costs) -> float:
    """The latency a measurement stands for: the median of its repeat costs (inf when there are none)."""
    if not costs:
        return float("inf")
    c = sorted(costs)
    return c[len(c) // 2]


@dataclass
class MeasureResult:
    error: str
    message: str = ""
    costs: list = field(default_factory=list)   # seconds per call, one per repeat
    build_s: float = 0.0
    run_s: float = 0.0
    cold: bool = False      # timed with the workload's weights evicted before every call (RunConfig.times_cold)
    host: str = ""          # the cluster worker's machine that measured it ("": this one)

    @property
    def ok(self) -> bool:
        return self.error == OK

    @property
    def latency(self) -> float:
        """Median repeat cost in seconds (inf for failures)."""
        return median_cost(self.costs) if self.ok else float("inf")
