"""The database a compile reads: an ordered union of sources (the user's logs, then the shipped
schedules); a workload's best record comes from the first source that has one, else the task's
default schedule. `tuner compile` and `build_op` both apply the best through it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..runtime.artifact import DEFAULT, SHIPPED
from . import records


@dataclass
class Source:
    name: str                        # the log's path, or SHIPPED
    contents: records.LogContents


def shipped_sources(target) -> list:
    """The shipped databases of `target` (records.shipped_databases), first wins, as sources."""
    return [Source(SHIPPED, records.load(p, warn=False)) for p in records.shipped_databases(target)]


@dataclass
class Database:
    sources: list                    # [Source], first wins
    _best: dict = field(default_factory=dict)
    stale: dict = field(default_factory=dict)   # (workload key, target) -> (label, its best record, logged for other code)

    @classmethod
    def open(cls, logs, target, use_shipped: bool = True, missing: str = "error", warn: bool = True) -> "Database":
        """The user's `logs` (a path or a list) in order, then the shipped databases of the target's
        backend (records.shipped_databases: this kind of CPU's first). missing: "error" (a
        UserError naming the log) or "skip" for a log that does not exist."""
        paths = [logs] if isinstance(logs, (str, Path)) else [p for p in logs or [] if p is not None]
        sources = []
        for p in paths:
            if not Path(p).exists():
                if missing == "error":
                    raise UserError(f"log {p} does not exist; give the log `tuner tune --log` wrote")
                continue
            sources.append(Source(str(p), records.load(p, warn=warn)))
        return cls(sources + (shipped_sources(target) if use_shipped else []))

    def best(self, workload, target) -> tuple:
        """(the best record of `workload` on `target` in the first source that has one, that
        source's name), or (None, DEFAULT). A record whose steps still apply but give other code
        than it logged (this version's code generator differs) can be that best: see is_stale."""
        key = (workload.key, str(target))
        if key not in self._best:
            self._best[key] = (None, DEFAULT)
            for s in self.sources:
                rec, stale = records.best_applicable(s.contents.applicable(workload.key, str(target)))
                if rec is not None:
                    self._best[key] = (rec, s.name)
                    if stale:
                        self.stale[key] = (workload.label, rec)
                    break
        return self._best[key]

    def elsewhere(self, workload, target, per_target: int = 2) -> list:
        """`workload`'s fastest records for other targets (another ISA or thread count), per source
        and target, one per step list: seeds for the cost model's pick (search.predict)."""
        want, out = records.code_target(str(target)), {}
        for s in self.sources:
            by_target: dict = {}
            for r in s.contents.records:
                if r.workload.key == workload.key and r.ok and records.code_target(r.target) != want:
                    by_target.setdefault(r.target, []).append(r)
            for recs in by_target.values():
                for r in sorted(recs, key=lambda r: r.latency)[:per_target]:
                    out.setdefault(json.dumps(r.steps), r)
        return list(out.values())

    def other_threads(self, workload, target) -> tuple:
        """(the best record of `workload` for the target's backend and ISA at another thread count
        that holds its decisions, its source's name), or (None, None): the nearest thread count
        first, in the first source that has one. The decisions, not the steps, carry over: the
        target's own space parallelises them for its threads."""
        kind, isa, threads = records.code_target(str(target))
        for s in self.sources:
            by: dict = {}
            for r in s.contents.records:
                ct = records.code_target(r.target) if r.workload.key == workload.key and r.decisions else None
                if ct is not None and ct[:2] == (kind, isa) and ct[2] != threads:
                    by.setdefault(ct[2], []).append(r)
            for n in sorted(by, key=lambda n: (abs(n - threads), n)):
                rec, _ = records.best_applicable(by[n])
                if rec is not None:
                    return rec, s.name
        return None, None

    def is_stale(self, rec) -> bool:
        """Whether `rec`, a best record, was logged for code this version no longer generates."""
        return rec is not None and any(r is rec for _, r in self.stale.values())

    def stale_warning(self) -> str:
        """One line naming the workloads whose best records were logged for other code than their
        steps give today, or ''."""
        if not self.stale:
            return ""
        names = sorted(label for label, _ in self.stale.values())
        shown = "; ".join(names[:4]) + (f"; and {len(names) - 4} more" if len(names) > 4 else "")
        return (f"{len(names)} task(s) use schedules whose code this version generates differently, so their "
                f"logged times are another code's and the report promises none (tune them again to time "
                f"this version's code): {shown}")

    def plan(self, model_hash: str, target, structure: str = "", anonymous=None) -> tuple:
        """(the newest layout plan of the model on `target` in the first source that has one, that
        source's name), else one for another thread count of the target's ISA (a layout costs
        alike on one core or more; the name says so), or (None, None). anonymous: a callable giving
        the graph's layout_plan.anonymous_structure, asked only where no plan matches more closely."""
        for any_threads in (False, True):
            for s in self.sources:
                found = s.contents.plan(model_hash, str(target), structure, any_threads)
                if found is None and anonymous is not None and any(p.anonymous for p in s.contents.plans):
                    found = s.contents.plan(model_hash, str(target), structure, any_threads, anonymous()[0])
                if found is not None:
                    n = records.code_target(found.target)[2]
                    return found, s.name + (f", {n} thread{'s' * (n > 1)}" if any_threads else "")
        return None, None

    def planned_models(self) -> list:
        """The models the user's logs hold layout plans of (the shipped database's are not theirs)."""
        return sorted({p.model for s in self.sources if s.name != SHIPPED for p in s.contents.plans})
