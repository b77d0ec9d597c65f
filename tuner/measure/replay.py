"""Replay mode: costs come from an existing log instead of the hardware.

Candidates are matched by workload, target and code hash, so any policy that proposes code the
log measured gets the logged result; anything else gets a NOT_IN_LOG result that policies skip.
This is how search strategies are compared deterministically and tested without measuring.
"""
from __future__ import annotations

from .. import records
from ..errors import UserError
from .result import NOT_IN_LOG, MeasureResult


class ReplayRunner:
    def __init__(self, log: str):
        self.path = str(log)
        contents = records.load(log, warn=False)
        if not contents.records:
            raise UserError(f"replay log {log} has no records")
        self._by_code = {(*r.task_key, r.code_hash): r for r in contents.records}

    def measure(self, task, batch: list):
        """Yield (candidate, result) with the logged result of the same code, as Runner.measure does."""
        for cand in batch:
            rec = self._by_code.get((task.workload.key, str(task.target), cand.code_hash))
            if rec is None:
                yield cand, MeasureResult(NOT_IN_LOG, f"code {cand.code_hash} of {task.name} was never measured "
                                          f"in {self.path}")
            else:
                yield cand, MeasureResult(rec.error, rec.message, list(rec.costs), rec.build_s, rec.run_s)

    def close(self):
        pass
