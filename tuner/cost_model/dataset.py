"""Training data for cost models: features of logged or proposed schedules, cached per schedule."""
from __future__ import annotations

import json

import numpy as np

from ..ops import WorkloadError, parse_spec
from ..schedule.schedule import ScheduleError
from ..target import TargetError, parse_target
from ..task import Task
from .features import extract_for


def features_or_none(task, steps: list):
    """Features of one step list, or None if it does not lower (what a search skips)."""
    try:
        return extract_for(task.lowered(steps), task.workload.flops, task.target)
    except ScheduleError:
        return None


class FeatureCache:
    """Features per (task, step list): a schedule is lowered and featurised once per process,
    whether it was proposed, measured or read from a log."""

    def __init__(self):
        self._cache: dict = {}
        self._tasks: dict = {}

    @staticmethod
    def _key(task, steps: list) -> tuple:
        return task.workload.key, str(task.target), json.dumps(steps)

    def of(self, task, steps: list) -> np.ndarray:
        key = self._key(task, steps)
        f = self._cache.get(key)
        if f is None:
            f = self._cache[key] = extract_for(task.lowered(steps), task.workload.flops, task.target)
        return f

    def of_many(self, task, steps_list: list, pool=None) -> list:
        """Features of each step list (None where it is None or does not lower); those not cached
        yet are shared out to `pool` (a FeaturePool) when there is one."""
        keys = [None if s is None else self._key(task, s) for s in steps_list]
        todo = {k: s for k, s in zip(keys, steps_list) if k is not None and k not in self._cache}
        if todo:
            new = pool.map(task, list(todo.values())) if pool is not None else \
                [features_or_none(task, s) for s in todo.values()]
            for k, f in zip(todo, new):
                if f is not None:
                    self._cache[k] = f
        return [None if k is None else self._cache.get(k) for k in keys]

    def task_for(self, rec: dict):
        """The Task a record belongs to (rebuilt from its spec, layout and target)."""
        key = rec.task_key
        if key not in self._tasks:
            w = rec.workload
            self._tasks[key] = Task(parse_spec(w.spec, w.layout), parse_target(rec.target, check_host=False))
        return self._tasks[key]


def group_of(workload_key: str, target: str) -> str:
    """Normalisation group of a record: latencies compare only within one workload on one target."""
    return f"{workload_key}|{target}"


def from_records(recs: list, cache: FeatureCache | None = None, progress=None) -> tuple:
    """(features, latencies, groups) of records whose schedules still lower (others are skipped).

    progress: an optional callable told after each record (a progress bar's update)."""
    cache = cache or FeatureCache()
    feats, lats, groups = [], [], []
    for rec in recs:
        if progress is not None:
            progress()
        if rec.error == "NOT_IN_LOG":
            continue
        try:
            task = cache.task_for(rec)
            f = cache.of(task, rec.steps)
        except (ScheduleError, WorkloadError, TargetError, KeyError, ValueError):
            continue
        feats.append(f)
        lats.append(rec.latency)
        groups.append(group_of(*rec.task_key))
    return feats, lats, groups
