"""Training data for cost models: features of logged or proposed schedules, cached by code hash."""
from __future__ import annotations

import numpy as np

from .. import records
from ..schedule.lower import lower
from ..schedule.schedule import ScheduleError
from ..target import TargetError, parse_target
from ..te.workloads import WorkloadError, parse_spec
from .features import extract


class FeatureCache:
    """Features per code hash: a schedule is lowered and featurised once per process."""

    def __init__(self):
        self._cache: dict = {}
        self._tasks: dict = {}

    def of(self, task, steps: list, code_hash: str | None = None) -> np.ndarray:
        if code_hash is not None and code_hash in self._cache:
            return self._cache[code_hash]
        f = extract(lower(task.space.schedule(steps)), task.workload.flops)
        if code_hash is not None:
            self._cache[code_hash] = f
        return f

    def task_for(self, rec: dict):
        """The Task a record belongs to (rebuilt from its spec, layout and target)."""
        from ..task import Task
        key = (rec["workload"]["key"], rec["target"])
        if key not in self._tasks:
            w = rec["workload"]
            self._tasks[key] = Task(parse_spec(w["spec"], w["layout"]), parse_target(rec["target"]))
        return self._tasks[key]


def from_records(recs: list, cache: FeatureCache | None = None) -> tuple:
    """(features, latencies, task keys) of records whose schedules still lower (others are skipped)."""
    cache = cache or FeatureCache()
    feats, lats, groups = [], [], []
    for rec in recs:
        if rec["error"] == "NOT_IN_LOG":
            continue
        try:
            task = cache.task_for(rec)
            f = cache.of(task, rec["steps"], rec.get("code_hash"))
        except (ScheduleError, WorkloadError, TargetError, KeyError, ValueError):
            continue
        feats.append(f)
        lats.append(records.latency(rec))
        groups.append(rec["workload"]["key"])
    return feats, lats, groups
