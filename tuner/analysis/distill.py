"""Distil logs into a best-schedule database: one best valid record per workload and target.

The fastest logged record is the minimum over many noisy measurements, so it is biased towards a
schedule that was timed in a lucky moment (the winner's curse; docs/history.md has a case). With
`remeasure=K`, the K fastest
distinct schedules of each task this host can run are timed again, interleaved over `rounds`
rounds, and the one with the lowest median is kept; its record is that new measurement (policy
"remeasure", one cost per round), not the lucky old one.

A task none of whose records replay (code an older version generated differently) keeps its
fastest record as it is, stale, unless `retime_stale`: then, where this host can run it, its
steps are built as this version's code and timed (policy "retimed", the new code's hash).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import statistics

from .. import __version__
from ..build import Kernel
from ..database import records
from ..ops import parse_spec
from ..target import host_cores, host_isa, parse_target
from ..task import Task


def _runnable_here(target: str) -> bool:
    ct = records.code_target(target)
    return ct is not None and ct[0] == "cpu" and ct[1] == host_isa() and ct[2] <= host_cores()


def _timed(recs: list, rounds: int) -> tuple:
    """(this version's kernel of each record's steps (one task), each one's time per round,
    interleaved round by round)."""
    first = recs[0]
    task = Task(parse_spec(first.workload.spec, first.workload.layout), parse_target(first.target, check_host=False))
    kernels = [Kernel(task, r.steps, r, None) for r in recs]
    x = task.workload.random_inputs(seed=1)
    times = [[] for _ in recs]
    for _ in range(rounds):
        for k, t in zip(kernels, times):
            t.append(statistics.median(k.time(*x, repeat=3, min_repeat_ms=20.0)))
    return kernels, times


def _new_record(rec: records.Record, costs: list, policy: str, code_hash: str) -> records.Record:
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return dataclasses.replace(rec, costs=tuple(costs), code_hash=code_hash, timestamp=now, tool=f"tuner {__version__}",
                               policy=policy, replayed_from=None, build_s=0.0, run_s=0.0)


def remeasure(recs: list, rounds: int = 5) -> records.Record:
    """Time `recs` (schedules of one task) again, interleaved round by round; the one with the
    lowest median, as a new record whose costs are its per-round times."""
    _, times = _timed(recs, rounds)
    i = min(range(len(recs)), key=lambda j: statistics.median(times[j]))
    return _new_record(recs[i], times[i], "remeasure", recs[i].code_hash)


def retime(rec: records.Record, rounds: int = 5) -> records.Record:
    """`rec`'s steps built as this version's code and timed over `rounds` rounds: a new record of
    that code (its hash, one cost per round)."""
    (kernel,), (times,) = _timed([rec], rounds)
    return _new_record(rec, times, "retimed", kernel.code_hash)


def distill(logs: list, out: str, remeasure_top: int = 0, rounds: int = 5, progress=None,
            retime_stale: bool = False) -> int:
    """Write the best record of every (workload, target) in `logs` and in `out` itself to `out`,
    and the newest layout plan of every (model, target); with remeasure_top=K, the best of the K
    fastest re-timed on this host where it can run them; a task with no record that replays keeps
    its fastest, re-timed as this version's code where retime_stale and this host can run it.
    Returns the number of records written."""
    by_task: dict = {}
    plans: dict = {}
    for path in list(logs) + [out]:
        contents = records.load(path, warn=False)
        for rec in contents.records:
            by_task.setdefault(rec.task_key, []).append(rec)
        for p in contents.plans:
            key = (p.model_hash, p.target)
            if key not in plans or p.timestamp > plans[key].timestamp:
                plans[key] = p
    best = []
    for n, recs in enumerate(by_task.values(), 1):
        if remeasure_top > 1 and _runnable_here(recs[0].target):
            cands = records.fastest_that_replay(recs, remeasure_top)
            b = remeasure(cands, rounds) if len(cands) > 1 else (cands[0] if cands else None)
            if progress and b is not None:
                was = cands[0].latency
                progress(f"[{n}/{len(by_task)}] {b.workload.title} [{b.workload.layout}] {b.target}: "
                         f"best logged {was * 1e3:.3f} ms, kept {b.latency * 1e3:.3f} ms now "
                         f"(rank {next(k for k, c in enumerate(cands) if c.code_hash == b.code_hash) + 1} "
                         f"of {len(cands)})")
        else:
            b = records.best_of(recs)
        ok = [r for r in recs if r.ok]
        if b is None and ok:            # no record replays: the fastest, stale or re-timed as this code
            b = min(ok, key=lambda r: r.latency)
            if retime_stale and _runnable_here(b.target):
                was, b = b.latency, retime(b, rounds)
                if progress:
                    progress(f"[{n}/{len(by_task)}] {b.workload.title} [{b.workload.layout}] {b.target}: "
                             f"logged {was * 1e3:.3f} ms as older code, {b.latency * 1e3:.3f} ms as this version's")
        if b is not None:
            best.append(b)
    ordered = sorted(best, key=lambda r: (r.target, r.workload.title, r.workload.layout))
    tmp = f"{out}.tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    records.append(tmp, ordered + sorted(plans.values(), key=lambda p: (p.target, p.model, p.timestamp)))
    os.replace(tmp, out)
    return len(ordered)
