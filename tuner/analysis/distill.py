"""Distil logs into a best-schedule database: one best valid record per workload and target."""
from __future__ import annotations

import os

from .. import records


def distill(logs: list, out: str) -> int:
    """Write the best record of every (workload, target) in `logs` and in `out` itself to `out`."""
    best: dict = {}
    for path in list(logs) + [out]:
        for rec in records.load(path, warn=False).records:
            if rec["error"] != "OK":
                continue
            key = (rec["workload"]["key"], rec["target"])
            if key not in best or records.latency(rec) < records.latency(best[key]):
                best[key] = rec
    ordered = sorted(best.values(), key=lambda r: (r["target"], r["workload"].get("name") or r["workload"]["spec"],
                                                   r["workload"]["layout"]))
    tmp = f"{out}.tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    records.append(tmp, ordered)
    os.replace(tmp, out)
    return len(ordered)
