"""Distil logs into a best-schedule database: one best valid record per workload and target."""
from __future__ import annotations

import os

from .. import records


def distill(logs: list, out: str) -> int:
    """Write the best record of every (workload, target) in `logs` and in `out` itself to `out`."""
    by_task: dict = {}
    for path in list(logs) + [out]:
        for rec in records.load(path, warn=False).records:
            by_task.setdefault(rec.task_key, []).append(rec)
    best = [b for b in (records.first_that_replays(recs) for recs in by_task.values()) if b is not None]
    ordered = sorted(best, key=lambda r: (r.target, r.workload.title, r.workload.layout))
    tmp = f"{out}.tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    records.append(tmp, ordered)
    os.replace(tmp, out)
    return len(ordered)
