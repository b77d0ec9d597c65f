"""Replay mode: costs come from an existing log instead of the hardware.

Candidates are matched by workload, target, code hash and how the weights were timed (warm, or
cold under RunConfig.cold_weights), so any policy that proposes code the log measured that way
gets the logged result; anything else gets a NOT_IN_LOG result that policies skip.
This is how search strategies are compared deterministically and tested without measuring.
"""
from __future__ import annotations

from ..database import records
from ..database.result import NOT_IN_LOG, MeasureResult
from ..errors import UserError
from .runner import RunConfig


class ReplayRunner:
    def __init__(self, log: str, config: RunConfig | None = None, ahead: int = 0):
        """ahead: as a cluster's runner, so that a replayed tune proposes as a cluster tune does."""
        self.path = str(log)
        self.ahead = ahead
        self.config = config or RunConfig()
        contents = records.load(log, warn=False)
        if not contents.records:
            raise UserError(f"replay log {log} has no records")
        self._by_code = {(*r.task_key, r.cold, r.code_hash): r for r in contents.records}

    def measure(self, task, batch: list):
        """Yield (candidate, result) with the logged result of the same code, as CpuRunner.measure does."""
        cold = self.config.times_cold(task.workload)
        for cand in batch:
            rec = self._by_code.get((task.workload.key, str(task.target), cold, cand.code_hash))
            if rec is None:
                how = " with its weights cold" if cold else ""
                yield cand, MeasureResult(NOT_IN_LOG, f"code {cand.code_hash} of {task.name} was never measured "
                                          f"in {self.path}{how}", cold=cold)
            else:
                yield cand, MeasureResult(rec.error, rec.message, list(rec.costs), rec.build_s, rec.run_s, cold)

    def status(self) -> str:
        return ""

    def close(self):
        pass
