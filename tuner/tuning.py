"""Tuning sessions: propose, build, check, time, record, for one or many tasks; resumable.

A session tunes a set of workloads (identical ones merged, weights summed) under one global
trial budget. Each round the task scheduler picks a task, its search policy proposes a batch, the
batch is built (one compiler call per core) and measured (or, in replay mode, looked up in a
log), and every result is appended to the log as it arrives. What the log already holds counts
against the budget and is never measured again; Ctrl-C stops with every finished record on disk.
"""
from __future__ import annotations

import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import records
from .errors import UserError
from .measure.replay import ReplayRunner
from .measure.result import OK
from .measure.runner import RunConfig, Runner
from .search import make_policy
from .search.scheduler import SCHEDULERS, TaskProgress
from .target import Target, parse_target
from .task import Candidate, Task
from .te.workloads import Workload, resolve


@dataclass
class TuneSummary:
    """One task of a session."""
    workload: Workload
    target: Target
    log: str
    weight: float = 1.0
    trials: int = 0              # records of this task in the log, old and new
    new: int = 0                 # measured in this session
    errors: dict = field(default_factory=dict)
    first_error: dict = field(default_factory=dict)
    best: dict | None = None
    seconds: float = 0.0
    interrupted: bool = False
    skipped_lines: int = 0
    retired: str = ""

    @property
    def best_latency(self) -> float:
        return records.latency(self.best)

    @property
    def best_gflops(self) -> float:
        return self.workload.flops / self.best_latency / 1e9 if self.best else 0.0

    @property
    def candidates_per_minute(self) -> float:
        return 60.0 * self.new / self.seconds if self.seconds else 0.0

    @property
    def all_failed(self) -> bool:
        return self.trials > 0 and self.errors.get(OK, 0) == 0


@dataclass
class Session:
    tasks: list
    log: str
    seconds: float = 0.0
    search_s: float = 0.0        # proposing: sampling, features, training, prediction
    codegen_s: float = 0.0       # lowering and C generation of the proposed candidates (part of building)
    interrupted: bool = False
    stopped_by: str = ""         # SIGINT or SIGTERM when interrupted

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def new(self) -> int:
        return sum(t.new for t in self.tasks)

    @property
    def search_overhead(self) -> float:
        """Fraction of the wall time spent outside building and running candidates."""
        return self.search_s / self.seconds if self.seconds else 0.0

    @property
    def codegen_fraction(self) -> float:
        return self.codegen_s / self.seconds if self.seconds else 0.0


def default_log(workload: Workload) -> str:
    return str(Path("logs") / f"{(workload.name or workload.op).replace('/', '_')}.{workload.layout}.jsonl")


def _merge(workloads: list) -> list:
    """[(Workload, weight)] with identical workloads merged and their weights summed."""
    merged: dict = {}
    for item in workloads:
        wl, w = item if isinstance(item, tuple) else (item, 1.0)
        if wl.key in merged:
            merged[wl.key] = (merged[wl.key][0], merged[wl.key][1] + w)
        else:
            merged[wl.key] = (wl, w)
    return list(merged.values())


def tune(workloads: list, target: str | Target = "cpu", trials: int = 64, log: str | None = None,
         time_limit: float | None = None, policy: str = "random", seed: int = 0, batch_size: int = 32,
         threads: int | None = None, run_config: RunConfig | None = None, progress: bool = True,
         runner=None, replay: str | None = None, cost_model_from: list | None = None,
         scheduler: str = "gradient", early_stopping: int | None = None, policy_obj=None,
         start_from_default: bool = True) -> Session:
    """Tune `workloads` (Workloads or (Workload, weight) pairs) until `trials` records exist for them.

    start_from_default: measure each task's default schedule first (off to compare pure search).
    """
    tgt = parse_target(target, threads)
    pairs = _merge(workloads)
    log = log or default_log(pairs[0][0])
    records.check_writable(log)
    claims = records.TaskClaims(log, [(wl.key, str(tgt), wl.label) for wl, _ in pairs])
    try:
        return _tune(pairs, tgt, trials, log, time_limit, policy, seed, batch_size, run_config, progress, runner,
                     replay, cost_model_from, scheduler, early_stopping, policy_obj, start_from_default)
    finally:
        claims.release()


def _tune(pairs, tgt, trials, log, time_limit, policy, seed, batch_size, run_config, progress, runner, replay,
          cost_model_from, scheduler, early_stopping, policy_obj, start_from_default) -> Session:
    contents = records.load(log, warn=False)
    shared = None
    if policy == "evolutionary" and policy_obj is None:
        shared = _shared_model(tgt, seed, cost_model_from)
    states, progress_rows = [], []
    for wl, weight in pairs:
        task = Task(wl, tgt)
        previous = contents.for_task(wl.key, str(tgt))
        s = TuneSummary(wl, tgt, log, weight, trials=len(previous), skipped_lines=contents.skipped)
        for r in previous:
            _count(s, r.error, r.message)
        s.best = records.best(contents, wl.key, str(tgt))
        pol = policy_obj if policy_obj is not None else make_policy(policy, task, seed + len(previous), shared)
        if previous and hasattr(pol, "observe"):
            pol.observe(previous)
        states.append(_TaskState(task, pol, {r.code_hash for r in previous}, s, bool(previous)))
        row = TaskProgress(task.name, weight, wl.flops, f"{wl.op}/{wl.layout}")
        if previous:
            row.history.append(s.best_latency)
            row.rounds = 1
        progress_rows.append(row)
    sched = SCHEDULERS[scheduler](progress_rows, early_stopping=early_stopping)
    if shared is not None and shared.pool is None:
        from .cost_model.parallel import FeaturePool
        shared.pool = FeaturePool([st.task for st in states])
    session = Session([st.summary for st in states], log)
    own_runner = runner is None
    bar, stop, start = None, None, time.perf_counter()
    try:        # one cleanup below, also when the runner or the bar fails to start (the pool is up)
        if runner is None:
            runner = ReplayRunner(replay) if replay else Runner(tgt, run_config)
        bar = tqdm(total=trials, initial=min(session.trials, trials), disable=not progress, unit="trial",
                   desc=states[0].task.name if len(states) == 1 else f"{len(states)} tasks", dynamic_ncols=True)
        start = time.perf_counter()
        if shared is not None:
            bar.write(f"cost model: {shared.describe()}")
        _show(bar, session, start)
        stop = _StopSignals()
        while session.trials < trials:
            if stop.requested:
                raise KeyboardInterrupt
            if time_limit is not None and time.perf_counter() - start >= time_limit:
                break
            k, why = sched.next()
            if k is None:
                bar.write(f"stopping early: {why}")
                break
            st = states[k]
            if len(states) > 1:
                bar.write(f"next: {st.task.workload.label} {st.task.workload.spec} — {why}")
            n = min(batch_size, trials - session.trials)
            t0, cg0 = time.perf_counter(), st.task.codegen_s
            batch = st.policy.propose(n, st.seen, first=start_from_default and not st.started)
            codegen = st.task.codegen_s - cg0
            session.search_s += time.perf_counter() - t0 - codegen
            session.codegen_s += codegen
            st.started = True
            if not batch:
                progress_rows[k].retired = st.summary.retired = \
                    f"{getattr(st.policy, 'name', 'the policy')} found no unmeasured candidate (space exhausted or search converged)"
                bar.write(f"{st.task.name}: {st.summary.retired}")
                continue
            ok_in_batch = False
            for cand, result in runner.measure(st.task, batch):
                rec = records.make_record(st.task.workload, tgt, cand.steps, result, cand.code_hash,
                                          getattr(st.policy, "name", "custom"), getattr(st.policy, "seed", seed),
                                          cand.decisions, replay)
                records.append(log, [rec])
                s = st.summary
                s.trials += 1
                s.new += 1
                _count(s, result.error, result.message)
                ok_in_batch |= result.ok
                if result.ok and (s.best is None or result.latency < s.best_latency):
                    s.best = rec
                if hasattr(st.policy, "update"):
                    t0 = time.perf_counter()
                    st.policy.update(cand, result)
                    session.search_s += time.perf_counter() - t0
                bar.update(1)
                _show(bar, session, start)
                if stop.requested:
                    raise KeyboardInterrupt
            sched.record_round(k, st.summary.best_latency, failures_only=not ok_in_batch)
            if progress_rows[k].retired:
                st.summary.retired = progress_rows[k].retired
                bar.write(f"{st.task.workload.label}: retired ({st.summary.retired})")
    except KeyboardInterrupt:
        session.interrupted = True
        session.stopped_by = signal.Signals(stop.signum or signal.SIGINT).name if stop else "SIGINT"
    finally:
        if stop is not None:
            stop.restore()
        session.seconds = time.perf_counter() - start
        for s in session.tasks:
            s.seconds, s.interrupted = session.seconds, session.interrupted
        if bar is not None:
            bar.close()
        if own_runner and runner is not None:
            runner.close()
        if shared is not None and shared.pool is not None:
            shared.pool.close()
            shared.pool = None
    return session


def _shared_model(tgt: Target, seed: int, cost_model_from: list | None):
    """The session's cost model. cost_model_from: None for the shipped pre-trained model of the
    target's ISA (if any), ["none"] for none, else logs (*.jsonl, trained on together with the
    session's records) and at most one saved model (fine-tuned)."""
    from .cost_model.model import XGBModel
    from .cost_model.pretrain import shipped_model
    from .search.evolutionary import SharedModel
    sources = list(cost_model_from) if cost_model_from is not None else None
    if sources is None:
        shipped = shipped_model(tgt)
        sources = [str(shipped)] if shipped else []
    sources = [p for p in sources if str(p).lower() != "none"]
    logs = [p for p in sources if str(p).endswith(".jsonl")]
    models = [p for p in sources if not str(p).endswith(".jsonl")]
    if len(models) > 1:
        raise UserError(f"--cost-model-from names {len(models)} saved models ({', '.join(models)}); "
                         "fine-tuning starts from one")
    shared = SharedModel(XGBModel.pretrained_from(models[0]) if models else XGBModel("pack-sum", seed))
    for other in logs:
        shared.add_records(records.load(other, warn=False).records)
    shared.transfer_logs, shared.transfer_records = logs, len(shared.feats)
    return shared


class _StopSignals:
    """The first Ctrl-C (SIGINT) or SIGTERM asks the loop to stop after the measurement in hand; a
    second one stops at once. A KeyboardInterrupt raised wherever the signal lands can be lost:
    inside a finaliser (xgboost frees boosters in __del__, every round) Python reports it and
    carries on, so the handler only sets a flag that the loop reads."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self):
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous = {}


@dataclass
class _TaskState:
    task: Task
    policy: object
    seen: set
    summary: TuneSummary
    started: bool


def _count(s: TuneSummary, error: str, message: str) -> None:
    s.errors[error] = s.errors.get(error, 0) + 1
    if error != OK:
        s.first_error.setdefault(error, message)


def tune_op(workload: str | Workload, layout: str | None = None, target: str | Target = "cpu", trials: int = 64,
            log: str | None = None, **kwargs) -> TuneSummary:
    """Tune one workload until `trials` records exist for it in `log`; see `tune` for the options."""
    wl = workload if isinstance(workload, Workload) else resolve(workload, layout)
    return tune([wl], target=target, trials=trials, log=log or default_log(wl), **kwargs).tasks[0]


def _show(bar, session: Session, start: float):
    ok = sum(t.errors.get(OK, 0) for t in session.tasks)
    failed = sum(v for t in session.tasks for k, v in t.errors.items() if k != OK)
    elapsed = time.perf_counter() - start
    rate = 60.0 * session.new / elapsed if elapsed > 0 else 0.0
    if len(session.tasks) == 1:
        s = session.tasks[0]
        best = f"{s.best_latency * 1e3:.3f} ms {s.best_gflops:.1f} GFLOPS" if s.best else "-"
    else:
        total = sum(t.weight * t.best_latency for t in session.tasks)
        best = f"weighted total {total * 1e3:.3f} ms" if math.isfinite(total) else "-"
    bar.set_postfix_str(f"valid {ok} failed {failed} best {best} {rate:.0f} cand/min", refresh=False)


__all__ = ["tune", "tune_op", "TuneSummary", "Session", "Candidate", "default_log"]
