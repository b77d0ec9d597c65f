"""The tuning log: one JSON object per line, appended under a file lock, read tolerantly.

A record holds everything needed to rebuild and re-judge a measurement later: the workload
(key and description), the target string, the schedule steps, the repeat costs, the error kind
and message, build/run times, when, by which tool version, policy and seed.

Every line read becomes a `Record` through one parser (`Record.from_json`) that checks every
field's type and that costs are positive finite numbers; a line that fails is skipped and counted
with its reason, so one bad line (hand-edited, from another tool, hostile) cannot break a command.
Whether a record's steps still produce its code is checked where a record is *used* as the best
one (`best_of`, and through it database.union.Database, `distill`, `analyze`): the fastest
record that does not replay is passed over for the next.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import gzip
import hashlib
import json
import math
import os
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from filelock import FileLock

from .. import __version__
from ..errors import SetupError, UserError
from ..ops import parse_spec
from ..schedule.schedule import ScheduleError
from ..target import core_design, host_isa, host_kind, parse_target
from ..task import Task
from .result import ERROR_KINDS, NOT_IN_LOG, OK, WEIGHTS, median_cost

FORMAT = 1
MAX_LINE = 1 << 20          # a record is a few KB; a longer line is damage, skipped without reading it whole
MAX_INPUTS, MAX_RANK, MAX_ELEMENTS = 256, 8, (1 << 31) - 1    # a plan's input shapes: more is damage
MAX_ENDS, MAX_KEY = 100_000, 4096                               # a plan's ends: more is damage
GZIP_MAGIC = b"\x1f\x8b"    # a gzipped log (a shipped corpus) is read as its lines; only plain logs are written


class RecordError(ValueError):
    """Why a logged line is not a usable record."""


@dataclass(frozen=True)
class WorkloadRef:
    """The workload a record measured, as logged (rebuilt into a Workload by parse_spec)."""
    key: str
    spec: str
    layout: str
    name: str = ""
    dtype: str = "float32"

    @property
    def title(self) -> str:
        return self.name or self.spec

    def to_json(self) -> dict:
        return {"key": self.key, "name": self.name, "spec": self.spec, "layout": self.layout, "dtype": self.dtype}


@dataclass(frozen=True)
class Record:
    workload: WorkloadRef
    target: str
    steps: list
    costs: tuple             # seconds per call, one per repeat
    error: str
    code_hash: str | None = None
    message: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: str = ""
    tool: str = ""
    policy: str = ""
    seed: int | None = None
    decisions: dict | None = None
    replayed_from: str | None = None    # costs copied from that log, not measured now
    format: int = FORMAT
    # timed with the weights evicted before every call (RunConfig.cold_weights), as a compiled model
    # meets them; such costs are compared only with each other (LogContents.for_task, fastest)
    cold: bool = False
    host: str = ""           # a cluster worker, or the kind of a host timing a lower ISA ("" : the tuner's own)
    heat: str = ""           # the side-by-side timing it belongs to (heat_winner), "" for none

    @property
    def ok(self) -> bool:
        return self.error == OK and bool(self.costs)

    @property
    def latency(self) -> float:
        """Median repeat cost in seconds; inf for failed records."""
        return median_cost(self.costs) if self.ok else float("inf")

    @property
    def task_key(self) -> tuple:
        return self.workload.key, self.target

    @property
    def trial(self) -> bool:
        """Whether the search measured it: a second timing of a logged kernel (policy CONFIRM,
        model_tuning.confirm_bests) or two buckets' kernels timed between them (HANDOVER,
        model_tuning.handovers) is not a trial, though a best counts it (a handover is no heat)."""
        return self.policy not in (CONFIRM, HANDOVER)

    def to_json(self) -> dict:
        d = {"format": self.format, "tool": self.tool, "workload": self.workload.to_json(), "target": self.target,
             "steps": self.steps, "code_hash": self.code_hash, "costs": list(self.costs), "error": self.error,
             "message": self.message, "build_s": self.build_s, "run_s": self.run_s, "timestamp": self.timestamp,
             "policy": self.policy, "seed": self.seed}
        if self.decisions is not None:
            d["decisions"] = self.decisions
        if self.replayed_from is not None:
            d["replayed_from"] = self.replayed_from
        if self.cold:
            d["weights"] = "cold"
        if self.host:
            d["host"] = self.host
        if self.heat:
            d["heat"] = self.heat
        return d

    @classmethod
    def from_json(cls, obj) -> "Record":
        """The one parser of logged records; raises RecordError naming the first bad field."""
        if not isinstance(obj, dict):
            raise RecordError("not a JSON object")
        w = obj.get("workload")
        if not isinstance(w, dict):
            raise RecordError("workload is not an object")
        for k in ("key", "spec", "layout"):
            _want(isinstance(w.get(k), str) and w[k], f"workload.{k} is not a non-empty string")
        for k in ("name", "dtype"):
            _want(isinstance(w.get(k, ""), str), f"workload.{k} is not a string")
        _want(isinstance(obj.get("target"), str) and obj["target"], "target is not a non-empty string")
        steps = obj.get("steps")
        _want(isinstance(steps, list) and all(isinstance(s, list) and s and isinstance(s[0], str) for s in steps),
              "steps is not a list of [primitive, ...] lists")
        costs = obj.get("costs")
        _want(isinstance(costs, list) and all(_positive(c) for c in costs),
              "costs is not a list of positive finite numbers")
        error = obj.get("error")
        _want(error in ERROR_KINDS, f"error is not one of {', '.join(ERROR_KINDS)}")
        _want(error != OK or costs, "an OK record has no costs")
        for k in ("message", "timestamp", "tool", "policy"):
            _want(isinstance(obj.get(k, ""), str), f"{k} is not a string")
        for k in ("build_s", "run_s"):
            v = obj.get(k, 0.0)
            _want(_number(v) and math.isfinite(v) and v >= 0, f"{k} is not a non-negative number")
        _want(obj.get("code_hash") is None or isinstance(obj["code_hash"], str), "code_hash is not a string")
        _want(obj.get("seed") is None or _integer(obj["seed"]), "seed is not an integer")
        _want(obj.get("decisions") is None or isinstance(obj["decisions"], dict), "decisions is not an object")
        _want(obj.get("replayed_from") is None or isinstance(obj["replayed_from"], str),
              "replayed_from is not a string")
        _want(_integer(obj.get("format", FORMAT)), "format is not an integer")
        _want(obj.get("weights", "warm") in WEIGHTS, "weights is not 'warm' or 'cold'")
        _want(isinstance(obj.get("host", ""), str), "host is not a string")
        _want(isinstance(obj.get("heat", ""), str) and len(obj.get("heat", "")) <= 64, "heat is not a short string")
        return cls(WorkloadRef(w["key"], w["spec"], w["layout"], w.get("name", ""), w.get("dtype", "float32")),
                   obj["target"], steps, tuple(float(c) for c in costs), error, obj.get("code_hash"),
                   obj.get("message", ""), float(obj.get("build_s", 0.0)), float(obj.get("run_s", 0.0)),
                   obj.get("timestamp", ""), obj.get("tool", ""), obj.get("policy", ""), obj.get("seed"),
                   obj.get("decisions"), obj.get("replayed_from"), obj.get("format", FORMAT),
                   obj.get("weights") == "cold", obj.get("host", ""), obj.get("heat", ""))


@dataclass(frozen=True)
class PlanRecord:
    """A layout plan a model tune chose (graph.layout_plan): conv node name -> layout, for one
    model (by its graph hash) and target, with the latency the solver estimated from the log."""
    model: str
    model_hash: str
    target: str
    layouts: dict
    estimate_s: float
    exact: bool = True
    timestamp: str = ""
    tool: str = ""
    format: int = FORMAT
    kind: str = "layout_plan"
    candidates: tuple = ()             # the layouts the tune chose from (--layouts); () in older logs
    peak_gflops: float | None = None   # the FP32 FMA peak of the tuning host at the target's threads
    # workload key -> (code hash, seconds): each task with constant inputs, its best kernel timed
    # with them cold (model_tuning.cold_prices); {} when not measured (replay, an older version)
    cold: dict = field(default_factory=dict)
    cold_estimate_s: float | None = None   # this plan's estimate with those prices
    priced: str = "warm"                   # which prices the plan was solved with: "warm" or "cold"
    structure: str = ""                    # the graph's shapes and operators without its weights (older logs: "")
    # graph choice (graph.passes.GRAPH_CHOICES) -> {"on": chosen, "s": [seconds on, seconds off]}: each
    # choice with a cost either way timed on the whole model, both ways, after the search
    choices: dict = field(default_factory=dict)
    # input name -> shape: the shapes the model was tuned at (older logs: {})
    shapes: dict = field(default_factory=dict)
    # tuned as a bucket of a range of shapes (graph.dynamic.load_at, tune --dynamic): a plan per bucket
    dynamic: bool = False
    # [ONNX value, the node reading it]: what a bucket's import computed at run time (graph.dynamic.load_range)
    run_time: tuple = ()
    # a bucket's workload key -> {"upto": the largest value of the varying dimension its kernel serves,
    # "code", "above": the code hashes at the bucket of that kernel and of the one above it}, measured
    # (model_tuning.handovers); a task not named, or run with other kernels, ends at the bucket
    ends: dict = field(default_factory=dict)
    # the name-free structure of the graph before layouts and its conv and dense nodes in order
    # (layout_plan.anonymous_structure): the plan applies to another export of the same architecture
    anonymous: str = ""
    order: tuple = ()
    # compiled as an untuned compile is (the tune's plan check timed it fastest whole): only its
    # Winograd convs named, the rest in the compile's layout, conv channels padded to whole blocks
    padded: bool = False
    # workload key -> the code hash of its best record, for each task whose default schedule ran
    # faster than that record where it runs in this plan's model (model_tuning.in_model_defaults):
    # the compile runs the default there while the task's best is that record
    defaults: dict = field(default_factory=dict)
    # the tune timed the untuned compile (`tuner compile` with no log) faster whole than this plan with
    # its records (model_tuning.untuned_check): a compile takes neither this plan nor its log's records
    untuned: bool = False

    def to_json(self) -> dict:
        d = {"format": self.format, "kind": self.kind, "tool": self.tool, "model": self.model,
             "model_hash": self.model_hash, "target": self.target, "layouts": self.layouts,
             "estimate_s": self.estimate_s, "exact": self.exact, "timestamp": self.timestamp}
        if self.candidates:
            d["candidates"] = list(self.candidates)
        if self.peak_gflops is not None:
            d["peak_gflops"] = self.peak_gflops
        if self.cold:
            d["cold"] = {k: {"code_hash": h, "s": s} for k, (h, s) in self.cold.items()}
            d["cold_estimate_s"] = self.cold_estimate_s
        d["priced"] = self.priced
        if self.structure:
            d["structure"] = self.structure
        if self.choices:
            d["choices"] = self.choices
        if self.shapes:
            d["shapes"] = self.shapes
        if self.dynamic:
            d["dynamic"] = True
        if self.run_time:
            d["run_time"] = [list(p) for p in self.run_time]
        if self.ends:
            d["ends"] = self.ends
        if self.anonymous:
            d["anonymous"], d["order"] = self.anonymous, list(self.order)
        if self.padded:
            d["padded"] = True
        if self.defaults:
            d["defaults"] = self.defaults
        if self.untuned:
            d["untuned"] = True
        return d

    def renamed(self, order: list) -> "PlanRecord | None":
        """This plan for a graph of the same anonymous structure whose conv and dense nodes, in
        order, are named `order`; None where the counts differ."""
        if len(order) != len(self.order):
            return None
        names = dict(zip(self.order, order))
        return replace(self, layouts={names[k]: v for k, v in self.layouts.items() if k in names})

    @classmethod
    def from_json(cls, obj: dict) -> "PlanRecord":
        for k in ("model", "model_hash", "target"):
            _want(isinstance(obj.get(k), str) and obj[k], f"plan {k} is not a non-empty string")
        lays = obj.get("layouts")
        _want(isinstance(lays, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in lays.items()),
              "plan layouts is not an object of strings")
        _want(_positive(obj.get("estimate_s")), "plan estimate_s is not a positive number")
        _want(isinstance(obj.get("exact", True), bool), "plan exact is not a boolean")
        for k in ("timestamp", "tool"):
            _want(isinstance(obj.get(k, ""), str), f"{k} is not a string")
        cands = obj.get("candidates", [])
        _want(isinstance(cands, list) and all(isinstance(c, str) and c for c in cands),
              "plan candidates is not a list of layouts")
        _want(obj.get("peak_gflops") is None or _positive(obj["peak_gflops"]), "plan peak_gflops is not positive")
        cold = obj.get("cold", {})
        _want(isinstance(cold, dict) and all(isinstance(v, dict) and isinstance(v.get("code_hash"), str)
                                             and _positive(v.get("s")) for v in cold.values()),
              "plan cold is not an object of {code_hash, s} prices")
        _want(obj.get("cold_estimate_s") is None or _positive(obj["cold_estimate_s"]),
              "plan cold_estimate_s is not positive")
        _want(obj.get("priced", "warm") in WEIGHTS, "plan priced is not 'warm' or 'cold'")
        _want(isinstance(obj.get("structure", ""), str), "plan structure is not a string")
        choices = obj.get("choices", {})
        _want(isinstance(choices, dict) and all(
            isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("on"), bool) and isinstance(v.get("s"), list)
            and len(v["s"]) == 2 and all(_positive(t) for t in v["s"]) for k, v in choices.items()),
            "plan choices is not an object of {on, s: [seconds on, seconds off]}")
        shapes = obj.get("shapes", {})
        _want(isinstance(shapes, dict) and len(shapes) <= MAX_INPUTS and all(
            isinstance(k, str) and k and isinstance(v, list) and len(v) <= MAX_RANK
            and all(_integer(n) and 0 < n for n in v) and math.prod(v) <= MAX_ELEMENTS for k, v in shapes.items()),
            "plan shapes is not an object of input shapes (lists of positive integers)")
        _want(isinstance(obj.get("dynamic", False), bool), "plan dynamic is not a boolean")
        run_time = obj.get("run_time", [])
        _want(isinstance(run_time, list) and len(run_time) <= MAX_ENDS and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) and 0 < len(n) <= MAX_KEY for n in p)
            for p in run_time), "plan run_time is not a list of [value, reader] name pairs")
        ends = obj.get("ends", {})
        _want(isinstance(ends, dict) and len(ends) <= MAX_ENDS and all(
            isinstance(k, str) and 0 < len(k) <= MAX_KEY and isinstance(v, dict) and set(v) == {"upto", "code", "above"}
            and _integer(v["upto"]) and 0 < v["upto"] <= MAX_ELEMENTS
            and all(isinstance(v[c], str) and 0 < len(v[c]) <= MAX_KEY for c in ("code", "above"))
            for k, v in ends.items()), "plan ends is not an object of workload keys to {upto, code, above}")
        order = obj.get("order", [])
        _want(isinstance(obj.get("anonymous", ""), str) and len(obj.get("anonymous", "")) <= MAX_KEY
              and isinstance(order, list) and len(order) <= MAX_ENDS and len(set(order)) == len(order)
              and all(isinstance(k, str) and 0 < len(k) <= MAX_KEY for k in order),
              "plan anonymous/order is not a hash and a list of distinct node names")
        for k in ("padded", "untuned"):
            _want(isinstance(obj.get(k, False), bool), f"plan {k} is not a boolean")
        defaults = obj.get("defaults", {})
        _want(isinstance(defaults, dict) and len(defaults) <= MAX_ENDS and all(
            isinstance(k, str) and 0 < len(k) <= MAX_KEY and isinstance(v, str) and 0 < len(v) <= MAX_KEY
            for k, v in defaults.items()), "plan defaults is not an object of workload keys to code hashes")
        return cls(obj["model"], obj["model_hash"], obj["target"], dict(lays), float(obj["estimate_s"]),
                   obj.get("exact", True), obj.get("timestamp", ""), obj.get("tool", ""), obj.get("format", FORMAT),
                   candidates=tuple(cands), peak_gflops=obj.get("peak_gflops"),
                   cold={k: (v["code_hash"], float(v["s"])) for k, v in cold.items()},
                   cold_estimate_s=obj.get("cold_estimate_s"), priced=obj.get("priced", "warm"),
                   structure=obj.get("structure", ""),
                   choices={k: {"on": v["on"], "s": [float(t) for t in v["s"]]} for k, v in choices.items()},
                   shapes={k: list(v) for k, v in shapes.items()}, dynamic=obj.get("dynamic", False),
                   run_time=tuple(tuple(p) for p in run_time),
                   ends={k: dict(v) for k, v in ends.items()}, anonymous=obj.get("anonymous", ""),
                   order=tuple(order), padded=obj.get("padded", False), defaults=dict(defaults),
                   untuned=obj.get("untuned", False))


def make_plan_record(model: str, model_hash: str, target: str, layouts: dict, estimate_s: float,
                     exact: bool, candidates=(), peak_gflops: float | None = None, cold: dict | None = None,
                     cold_estimate_s: float | None = None, priced: str = "warm", structure: str = "",
                     choices: dict | None = None, shapes: dict | None = None, dynamic: bool = False,
                     ends: dict | None = None, anonymous: tuple = ("", ()), padded: bool = False,
                     defaults: dict | None = None, untuned: bool = False, run_time=()) -> PlanRecord:
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return PlanRecord(model, model_hash, str(target), dict(layouts), estimate_s, exact, now, f"tuner {__version__}",
                      candidates=tuple(candidates), peak_gflops=peak_gflops, cold=dict(cold or {}),
                      cold_estimate_s=cold_estimate_s, priced=priced, structure=structure, choices=dict(choices or {}),
                      shapes={k: [int(n) for n in v] for k, v in (shapes or {}).items()}, dynamic=dynamic,
                      ends=dict(ends or {}), anonymous=anonymous[0], order=tuple(anonymous[1]), padded=padded,
                      defaults=dict(defaults or {}), untuned=untuned, run_time=tuple(tuple(p) for p in sorted(run_time)))


def _want(cond, reason: str) -> None:
    if not cond:
        raise RecordError(reason)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(v) -> bool:
    return _number(v) and math.isfinite(v) and v > 0


@dataclass
class LogContents:
    records: list            # [Record]
    path: str
    reasons: Counter = field(default_factory=Counter)   # why lines that are not records were skipped
    plans: list = field(default_factory=list)           # [PlanRecord], in log order

    def plan(self, model_hash: str, target: str, structure: str = "", any_threads: bool = False,
             anonymous: str = "") -> "PlanRecord | None":
        """The newest layout plan that applies on `target` (same rule as applicable; any_threads: for
        its backend and ISA at another thread count) of a model: the same graph, or one of the same
        structure (the same model exported and imported again, or with other weights), or of the
        same `anonymous` structure (another export of the architecture, its nodes named otherwise:
        the caller gives the plan its own names, PlanRecord.renamed)."""
        want = code_target(target)
        here = [p for p in reversed(self.plans) if (ct := code_target(p.target)) is not None and want is not None
                and (ct[:2] == want[:2] and ct[2] != want[2] if any_threads else ct == want)]
        found = next((p for p in here if p.model_hash == model_hash), None) or next(
            (p for p in here if structure and p.structure == structure), None)
        return found or next((p for p in here if anonymous and p.anonymous == anonymous), None)

    @property
    def skipped(self) -> int:
        return sum(self.reasons.values())

    def for_task(self, key: str, target: str, cold: bool = False) -> list:
        """Records of a workload measured on exactly `target`, with its weights cold or not (what a
        tune resumes from: a cold time is not comparable with a warm one)."""
        return [r for r in self.records if r.workload.key == key and r.target == target and r.cold == cold]

    def applicable(self, key: str, target: str) -> list:
        """Records of a workload that apply on `target`: same backend, ISA and thread count
        (see code_target; the core count of the host that measured them does not matter)."""
        want = code_target(target)
        return [r for r in self.records if r.workload.key == key and code_target(r.target) == want]

    def skipped_summary(self) -> str:
        """'3 line(s) skipped (2 not JSON, 1 costs is not ...)', or '' when none were."""
        if not self.skipped:
            return ""
        why = ", ".join(f"{n} {reason}" for reason, n in self.reasons.most_common())
        return f"{self.skipped} line(s) of {self.path} skipped ({why})"


@lru_cache(maxsize=256)
def code_target(target: str) -> tuple | None:
    """(backend, ISA, threads) of a target string: what decides a record's code and how it was timed.

    The core count is left out on purpose: it does not change the generated code (the thread count
    is compiled in, the ISA picks the vectors), so a record measured with `-cores=2 -threads=1`
    applies on a 16-core host running 1 thread. None for a target this version cannot read."""
    try:
        t = parse_target(target, check_host=False)
    except UserError:
        return None
    return t.kind, t.isa, t.threads


CONFIRM = "confirm"     # the policy of a record that times a logged kernel again (model_tuning.confirm_bests)
HANDOVER = "handover"   # a bucket's kernel and the one above it timed at a value between them (model_tuning.handovers)


def make_record(workload, target, steps, result, code_hash: str, policy: str, seed: int,
                decisions: dict | None = None, replayed_from: str | None = None, heat: str = "") -> Record:
    return Record(WorkloadRef(**workload.to_json()), str(target), steps, tuple(float(c) for c in result.costs),
                  result.error, code_hash, result.message, round(result.build_s, 6), round(result.run_s, 6),
                  _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), f"tuner {__version__}",
                  policy, seed, decisions, replayed_from, cold=result.cold, host=result.host, heat=heat)


# ------------------------------------------------------------ paths

def check_readable(path, flag: str = "") -> None:
    """A log given to read must exist and be a regular file (not a directory, a pipe or /dev/full)."""
    where = f" (from {flag})" if flag else ""
    p = Path(path)
    if not p.exists():
        raise UserError(f"no log at {path}{where}")
    if not p.is_file():
        raise UserError(f"{path}{where} is not a regular file; give the path of a .jsonl log")


# ------------------------------------------------------------ who tunes what

class TaskClaims:
    """The tasks of a log that this process is tuning, so that no other tuner measures them too.

    Two tuners on one workload and log would measure every candidate twice (the same seed proposes
    the same code), so each (workload key, target) is claimed by a one-byte POSIX lock at an offset
    of `<log>.tuners` given by its hash. Tuners of different workloads share a log freely; the
    kernel drops the locks of a process that dies, so a killed tuner never leaves a stale claim.
    """

    def __init__(self, log, tasks: list):
        """tasks: [(workload key, target, label)]. Raises UserError if another process holds one."""
        self._file = open(str(log) + ".tuners", "ab")
        for key, target, label in tasks:
            offset = int(hashlib.sha256(f"{key}|{target}".encode()).hexdigest()[:8], 16)
            try:
                fcntl.lockf(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            except OSError:
                self.release()
                raise UserError(f"another tuner is already tuning {label} on '{target}' into {log}; wait for it "
                                "to finish (this command then resumes from its records) or give this one "
                                "another --log") from None

    def release(self):
        if self._file is not None:
            self._file.close()        # closing drops every lock this process holds on the file
            self._file = None


# ------------------------------------------------------------ writing

def check_appendable(path, flag: str = "--log") -> None:
    """A log to append to must be plain text: a gzipped one is only read."""
    if str(path).endswith(".gz") or _gzipped(Path(path)):
        raise UserError(f"{flag} {path} is gzipped, and tuner reads a gzipped log but does not append to one; "
                        f"give a .jsonl path (gunzip it first to add to it)")


def _gzipped(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False


def append(path: str | os.PathLike, recs: list) -> None:
    """Append whole lines under a lock, flushed and synced, so no reader sees half a record.

    A write that fails (disk full, file size limit) is cut back to where it started and raised as
    a SetupError: the log keeps every record that was already in it and gains no torn line. The
    file is written unbuffered, so nothing is left in a buffer to be flushed after the cut.
    """
    if not recs:
        return
    path = Path(path)
    check_appendable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in recs).encode()
    with FileLock(str(path) + ".lock"):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            if size and os.pread(fd, 1, size - 1) != b"\n":
                text = b"\n" + text      # an earlier writer died mid-line: start ours on its own
            try:
                view = memoryview(text)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as e:
                os.ftruncate(fd, size)    # truncating needs no free space
                if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO):
                    raise SetupError(f"cannot append to log {path}: {e.strerror}; every record before this "
                                     "one is in the log (free space and run the same command to resume)") from None
                raise
        finally:
            os.close(fd)


# ------------------------------------------------------------ reading

def _lines(f):
    """Lines of at most MAX_LINE bytes; a longer one yields None (and is not held in memory)."""
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while True:                         # skip the rest of the oversized line
                rest = f.readline(MAX_LINE)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
        else:
            yield line


def _read_lines(f, reasons: Counter):
    """_lines, ending where a gzip stream is damaged or cut short (counted once)."""
    try:
        yield from _lines(f)
    except (gzip.BadGzipFile, EOFError, zlib.error):
        reasons["the gzip stream is damaged or cut short (lines after it not read)"] += 1


def load(path: str | os.PathLike, warn: bool = True) -> LogContents:
    """All valid records of a log, plain or gzipped; other lines are skipped and counted with their
    reasons (a gzipped log whose stream breaks off: the lines before the break)."""
    path = Path(path)
    recs, plans, reasons = [], [], Counter()
    if not path.exists():
        return LogContents([], str(path))
    check_readable(path)
    with (gzip.open if _gzipped(path) else open)(path, "rb") as f:
        for line in _read_lines(f, reasons):
            if line is None:
                reasons[f"longer than {MAX_LINE} bytes"] += 1
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if isinstance(obj, dict) and obj.get("kind") == "layout_plan":
                    plans.append(PlanRecord.from_json(obj))
                else:
                    recs.append(Record.from_json(obj))
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                reasons["not JSON"] += 1
            except RecordError as e:
                reasons[str(e)] += 1
    contents = LogContents(recs, str(path), reasons, plans)
    if contents.skipped and warn:
        warnings.warn(contents.skipped_summary(), stacklevel=2)
    return contents


# ------------------------------------------------------------ best records

def code_of(rec: Record) -> str | None:
    """The hash of the code a record's steps give on its workload today, or None when they no
    longer apply (another workload key, a step the schedule refuses)."""
    try:
        wl = parse_spec(rec.workload.spec, rec.workload.layout)
        if wl.key != rec.workload.key:
            return None
        return Task(wl, parse_target(rec.target, check_host=False)).candidate(rec.steps, func_name="kernel").code_hash
    except (ScheduleError, UserError, RecursionError, OverflowError, MemoryError):
        return None


def replays(rec: Record) -> bool:
    """Whether a record's steps still replay onto its workload and give the code it logged."""
    return _gives_logged(rec, code_of(rec))


def _gives_logged(rec: Record, code: str | None) -> bool:
    return code is not None and (rec.code_hash is None or code == rec.code_hash)


def fastest_that_replay(recs, k: int, stale: list | None = None) -> list:
    """The `k` fastest successful records with distinct code whose steps still replay (junk steps
    with a tiny cost are passed over), fastest first. A code timed more than once counts as its
    slowest timing, and that record stands for it: on a shared machine one timing can come out
    far too fast (docs/history.md), and
    the fastest of thousands of timings is where such luck collects (`confirm` times the
    front-runners again). Faster records passed over because their steps still apply but give
    other code than they logged (the code generator changed since), code the log never timed,
    are appended to `stale`."""
    ok = [r for r in recs if r.ok]
    slowest: dict = {}                       # code hash -> its slowest record
    for r in ok:
        if r.code_hash is not None and (r.code_hash not in slowest or r.latency > slowest[r.code_hash].latency):
            slowest[r.code_hash] = r
    standing = [r for r in ok if r.code_hash is None or slowest[r.code_hash] is r]
    out, seen = [], set()
    for r in sorted(standing, key=lambda r: r.latency):
        if r.code_hash in seen:
            continue
        code = code_of(r)
        if not _gives_logged(r, code):
            if code is not None and code not in slowest and stale is not None:
                stale.append(r)      # (the code its steps give now, when timed, ranks by its own time)
            continue
        seen.add(r.code_hash)
        out.append(r)
        if len(out) == k:
            break
    return out


def first_that_replays(recs, stale: list | None = None):
    """The fastest record that replays, or None."""
    return next(iter(fastest_that_replay(recs, 1, stale)), None)


def heat_winner(recs):
    """The winner of the last heat among `recs` (one workload's, in log order), when the search
    measured nothing after it, else None. A heat (model_tuning.confirm_bests) times a task's
    front-runners and its default schedule side by side, each twice; its winner is the fastest
    code there by its slower timing there. Timings logged minutes apart on a shared host differ
    by up to a third, so the log's fastest can be a kernel timed in a fast minute; side by side
    that luck is gone, and a tuned schedule is kept only where it beat the default."""
    last = next((i for i in range(len(recs) - 1, -1, -1) if recs[i].heat and recs[i].policy == CONFIRM), None)
    if last is None or any(r.trial and r.ok for r in recs[last + 1:]):
        return None
    return first_that_replays([r for r in recs if r.heat == recs[last].heat])


def best_of(recs, stale: list | None = None):
    """The best of one workload's records: the winner of its last heat (heat_winner), else the
    fastest that replays, among those timed with the weights cold (as a compiled model meets
    them), else among the others; a cold time and a warm one are never compared (the same kernel
    is much slower cold: bench/cold.py)."""
    recs = list(recs)
    for group in ([r for r in recs if r.cold], [r for r in recs if not r.cold]):
        best = heat_winner(group) or first_that_replays(group, stale)
        if best is not None:
            return best
    return None


def best_applicable(recs) -> tuple:
    """(record, stale): best_of, unless a record ranked before it (best_of's order: cold first,
    then by latency) has steps that still apply but give other code than it logged; then that
    record, stale=True: its schedule is still the best one known, but its time is another code's."""
    stale: list = []
    best = best_of(recs, stale)
    if stale and (best is None or (not stale[0].cold, stale[0].latency) < (not best.cold, best.latency)):
        return stale[0], True
    return best, False


def latency(rec: Record | None) -> float:
    return rec.latency if rec is not None else float("inf")


def measured(recs) -> list:
    """Records that hold a measurement (replay misses are not measurements)."""
    return [r for r in recs if r.error != NOT_IN_LOG]


def shipped_database(target) -> Path:
    """tuner/schedules/<backend>.jsonl: the best records shipped with tuner (package data)."""
    return Path(str(resources.files("tuner") / "schedules" / f"{str(target).split()[0]}.jsonl"))


def shipped_databases(target) -> list:
    """The shipped record files that exist for `target`, first wins: where it is this host's own
    ISA, those timed on this kind of CPU (<backend>-<vendor>-<family>-<model>.jsonl beside
    shipped_database: this model, then models of its core design (target.CORE_DESIGNS), then the
    family's nearest model), then shipped_database. A schedule tuned on one core design can run
    slower than the default on another of the same ISA (docs/records.md)."""
    general = shipped_database(target)
    tgt = parse_target(str(target), check_host=False) if str(target).startswith("cpu") else None
    kind = host_kind() if tgt is not None and tgt.isa == host_isa() else ""
    ours = []
    if kind:
        vendor_family, model = kind.rsplit("-", 1)
        design = core_design(kind)

        def distance(p):       # this model, then its design's, then the nearest model number
            m = p.stem.rsplit("-", 1)[1]
            if not m.isdigit():
                return (True, True, 1 << 30)
            return (m != model, not design or core_design(f"{vendor_family}-{m}") != design, abs(int(m) - int(model)))
        ours = sorted(general.parent.glob(f"{general.stem}-{vendor_family}-*.jsonl"), key=distance)
    return [p for p in ours + [general] if p.exists()]

