"""The tuning log: one JSON object per line, appended under a file lock, read tolerantly.

A record holds everything needed to rebuild and re-judge a measurement later: the workload
(key and description), the target string, the schedule steps, the repeat costs, the error kind
and message, build/run times, when, by which tool version, policy and seed.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from . import __version__
from .measure.result import ERROR_KINDS, OK

FORMAT = 1
REQUIRED = ("workload", "target", "steps", "costs", "error")


@dataclass
class LogContents:
    records: list
    skipped: int          # malformed or truncated lines
    path: str

    def for_task(self, key: str, target: str) -> list:
        return [r for r in self.records if r["workload"]["key"] == key and r["target"] == target]


def make_record(workload, target, steps, result, code_hash: str, policy: str, seed: int,
                decisions: dict | None = None, replayed_from: str | None = None) -> dict:
    rec = {
        "format": FORMAT,
        "tool": f"tuner {__version__}",
        "workload": workload.to_json(),
        "target": str(target),
        "steps": steps,
        "code_hash": code_hash,
        "costs": [float(c) for c in result.costs],
        "error": result.error,
        "message": result.message,
        "build_s": round(result.build_s, 6),
        "run_s": round(result.run_s, 6),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "policy": policy,
        "seed": seed,
    }
    if decisions is not None:
        rec["decisions"] = decisions
    if replayed_from is not None:
        rec["replayed_from"] = replayed_from   # costs copied from that log, not measured now
    return rec


def append(path: str | os.PathLike, records: list) -> None:
    """Append whole lines under a lock, flushed and synced, so no reader sees half a record."""
    if not records:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    with FileLock(str(path) + ".lock"):
        _repair_tail(path)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def _repair_tail(path: Path) -> None:
    """If an earlier writer died mid-line, end that line so our record starts on its own."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
    except FileNotFoundError:
        return
    if last != b"\n":
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n")


def _valid(rec) -> bool:
    return (isinstance(rec, dict) and all(k in rec for k in REQUIRED) and isinstance(rec["workload"], dict)
            and "key" in rec["workload"] and isinstance(rec["steps"], list) and isinstance(rec["costs"], list)
            and rec["error"] in ERROR_KINDS)


def load(path: str | os.PathLike, warn: bool = True) -> LogContents:
    """All well-formed records of a log; malformed lines are skipped and counted."""
    path = Path(path)
    records, skipped = [], 0
    if not path.exists():
        return LogContents([], 0, str(path))
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if _valid(rec):
                records.append(rec)
            else:
                skipped += 1
    if skipped and warn:
        warnings.warn(f"{path}: skipped {skipped} malformed line(s)", stacklevel=2)
    return LogContents(records, skipped, str(path))


def latency(rec: dict) -> float:
    """Median repeat cost of a record in seconds; inf for failed ones."""
    if rec["error"] != OK or not rec["costs"]:
        return float("inf")
    c = sorted(rec["costs"])
    return c[len(c) // 2]


def best(log: str | os.PathLike | LogContents, key: str, target: str):
    """The fastest successful record of a workload on a target, or None."""
    contents = log if isinstance(log, LogContents) else load(log)
    ok = [r for r in contents.for_task(key, target) if r["error"] == OK and r["costs"]]
    return min(ok, key=latency) if ok else None


def apply_best(logs: list, workload, target: str, quiet: bool = False):
    """The best record for `workload` over `logs` (user logs first, then shipped databases).

    Returns (record or None, where it came from). Says loudly, by workload name, when nothing
    matched and the default schedule will be used.
    """
    for log in logs:
        if log is None or not Path(log).exists():
            continue
        rec = best(load(log, warn=not quiet), workload.key, str(target))
        if rec is not None:
            return rec, str(log)
    if not quiet:
        searched = ", ".join(str(p) for p in logs if p) or "no log"
        warnings.warn(f"no tuning record for {workload.label} on '{target}' in {searched}; "
                      "using the default (untuned) schedule", stacklevel=2)
    return None, None


def shipped_database(target) -> Path:
    """schedules/<backend>.jsonl: the best records shipped with tuner."""
    return Path(__file__).resolve().parent.parent / "schedules" / f"{str(target).split()[0]}.jsonl"
