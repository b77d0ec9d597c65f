"""Tuning sessions: propose, build, check, time, record, for one or many tasks; resumable.

A session tunes a set of workloads (identical ones merged, weights summed) under one global
trial budget. Each round the task scheduler picks a task, its search policy proposes a batch, the
batch is built (one compiler call per core) and measured (or, in replay mode, looked up in a
log), and every result is appended to the log as it arrives. What the log already holds counts
against the budget and is never measured again; Ctrl-C stops with every finished record on disk.
"""
from __future__ import annotations

import _thread
import collections
import math
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import records
from .errors import check_output_path
from .measure.replay import ReplayRunner
from .measure.result import OK
from .measure.runner import RUNNERS, RunConfig
from .search import PolicyFactory, policy_factory
from .search.scheduler import SCHEDULERS, TaskProgress, family
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
    curve: list = field(default_factory=list)   # best latency (inf before one is OK) after each trial, in log order

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


def make_runner(target, config: RunConfig, replay: str | None = None, cluster: str | None = None):
    """The runner a tune measures with: on a cluster (the replay looked up by its workers), the
    costs of a replayed log, or this host's measurement process for the target's kind."""
    if cluster:
        from .measure.cluster import ClusterRunner
        return ClusterRunner(cluster, target, config, replay=replay)
    return ReplayRunner(replay, config) if replay else RUNNERS[target.kind](target, config)


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
         time_limit: float | None = None, policy: str | PolicyFactory = "random", seed: int = 0,
         batch_size: int = 32, threads: int | None = None, run_config: RunConfig | None = None,
         progress: bool = True, runner=None, replay: str | None = None, cost_model_from: list | None = None,
         scheduler: str = "gradient", early_stopping: int | None = None,
         start_from_default: bool = True, warmup_batch=None, on_round=None, cluster: str | None = None) -> Session:
    """Tune `workloads` (Workloads or (Workload, weight) pairs) until `trials` records exist for them.

    policy: a name (see tuner.search.POLICIES) or a PolicyFactory. runner: anything with
    `measure(task, batch)` giving a generator of (candidate, result), `status()` (for the progress
    line), `close()` and `ahead` (batches it measures while the loop reads an earlier one's
    results; 0 for one machine); default: this host, or `replay` LOG.
    start_from_default: measure each task's default schedule first (off to compare pure search).
    warmup_batch: the size of each task's first batch (default batch_size), or a function of the
    Workload giving it; a model tune has hundreds of tasks and gives each a short first look
    before the scheduler picks.
    cluster: a Dask scheduler's address, or local:N for a cluster of N measuring workers on this
    machine, or a measure.cluster.Cluster (an address with TLS files): candidates are measured
    there (measure.cluster), the log is written here.
    on_round: called with the session's TuneSummaries after every round; it returns (weights or
    None, a status for the progress line or None); new weights steer the task scheduler (the
    summaries keep their occurrence counts as `weight`).
    """
    tgt = parse_target(target, threads)
    pairs = _merge(workloads)
    log = log or default_log(pairs[0][0])
    check_output_path(log, "--log")
    claims = records.TaskClaims(log, [(wl.key, str(tgt), wl.label) for wl, _ in pairs])
    try:
        factory = policy_factory(policy, tgt, seed, cost_model_from)
        loop = _Loop(pairs, tgt, log, factory, seed, SCHEDULERS[scheduler], early_stopping,
                     warmup_batch if callable(warmup_batch) else lambda wl: warmup_batch or batch_size, on_round,
                     run_config or RunConfig())
        return loop.run(trials, time_limit, batch_size, start_from_default, progress, replay, runner, cluster)
    finally:
        claims.release()


class _Loop:
    """One session: propose -> build and measure -> record, round after round, as the scheduler picks."""

    def __init__(self, pairs, tgt, log, factory, seed, scheduler_cls, early_stopping, warmup_batch, on_round,
                 run_config):
        self.tgt, self.log, self.factory, self.run_config = tgt, log, factory, run_config
        contents = records.load(log, warn=False)
        self.states, self.rows = [], []
        other_way = 0          # records of these tasks timed with the weights the other way: not resumed
        for wl, weight in pairs:
            task = Task(wl, tgt)
            cold = run_config.times_cold(wl)
            previous = contents.for_task(wl.key, str(tgt), cold)
            if wl.constant_inputs:
                other_way += len(contents.for_task(wl.key, str(tgt), not cold))
            best = records.first_that_replays(previous)
            if best is None and any(r.ok for r in previous):
                # measured code this tuner no longer generates (another version): not a head start
                warnings.warn(f"{log}: none of the {len(previous)} records of {wl.label} replays onto the "
                              "schedules this version of tuner generates; tuning it from the start", stacklevel=2)
                previous = []
            # a second timing of a kernel (model_tuning.confirm_bests) is not a trial
            tried = [r for r in previous if r.trial]
            s = TuneSummary(wl, tgt, log, weight, trials=len(tried), skipped_lines=contents.skipped)
            for r in tried:
                _count(s, r.error, r.message)
                s.curve.append(min(s.curve[-1] if s.curve else math.inf, r.latency if r.ok else math.inf))
            s.best = best
            pol = factory.make(task, seed + len(previous))
            pol.observe(previous)
            self.states.append(_TaskState(task, pol, {r.code_hash for r in previous}, s, bool(previous)))
            row = TaskProgress(task.name, weight, wl.flops, family(wl))
            if previous:
                row.history.append(s.best_latency)
                row.rounds = 1
            self.rows.append(row)
        if other_way:
            was, now = ("warm", "cold") if run_config.cold_weights else ("cold", "warm")
            warnings.warn(f"{log}: {other_way} records of these tasks were timed with the weights {was}; this tune "
                          f"times them {now} and does not count those (--weights {was} resumes them)", stacklevel=3)
        self.sched = scheduler_cls(self.rows, early_stopping=early_stopping)
        self.session = Session([st.summary for st in self.states], log)
        self.warmup_batch, self.on_round, self.status = warmup_batch, on_round, None

    def _after_round(self):
        if self.on_round is None:
            return
        weights, self.status = self.on_round(self.session.tasks)
        for row, w in zip(self.rows, weights or ()):
            row.weight = w          # the scheduler's weight; TuneSummary.weight stays the occurrence count

    def run(self, trials, time_limit, batch_size, start_from_default, progress, replay, runner, cluster) -> Session:
        session, own_runner, run_config = self.session, runner is None, self.run_config
        bar, stop, start = None, None, time.perf_counter()
        try:        # one cleanup below, also when the runner or the bar fails to start
            stop = _StopSignals(grace=run_config.timeout + 5.0)
            self.factory.start([st.task for st in self.states])
            if runner is None:
                runner = make_runner(self.tgt, run_config, replay, cluster)
            bar = tqdm(total=trials, initial=min(session.trials, trials), disable=not progress, unit="trial",
                       desc=self.states[0].task.name if len(self.states) == 1 else f"{len(self.states)} tasks",
                       dynamic_ncols=True)
            start = time.perf_counter()
            if self.factory.describe():
                bar.write(self.factory.describe())
            self._after_round()
            _show(bar, session, start, self.status, time_limit, runner.status())
            self._rounds(runner, bar, stop, start, trials, time_limit, batch_size, start_from_default, replay)
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
            self.factory.close()
        return session

    def _rounds(self, runner, bar, stop, start, trials, time_limit, batch_size, start_from_default, replay):
        """Round after round until the budget, the time limit or the scheduler ends the session.

        A round is one batch of the task the scheduler picks; a first look (warmup_batch) may take
        several batches, each proposed after the previous one's results (a pre-trained model's first
        batches are small, each followed by fine-tuning). A runner whose `ahead` is k > 0 (a cluster;
        read before each proposal, as it may grow with the workers) gets up to k batches beyond the
        one whose results are being read: they are proposed without those results, and measured
        meanwhile. Results are recorded in the order batches were proposed, so a replayed tune
        logs the same whatever the runner, for the same `ahead`."""
        session = self.session
        sent = collections.deque()            # (round, batch, its results: a generator), oldest first
        rnd, no_more = None, False

        def out_of_time() -> bool:
            return time_limit is not None and time.perf_counter() - start >= time_limit

        def in_flight(r) -> bool:
            return any(q is r for q, _, _ in sent)

        try:
            while True:
                while len(sent) <= runner.ahead and not no_more and not out_of_time():
                    if stop.requested:
                        raise KeyboardInterrupt
                    left = trials - session.trials - sum(len(b) for _, b, _ in sent)
                    if left <= 0:
                        break
                    if rnd is None or rnd.closed:
                        k, why = self.sched.next(busy={r.k for r, _, _ in sent})
                        if k is None:
                            bar.write(f"stopping early: {why}")
                            no_more = True
                            break
                        st = self.states[k]
                        rnd = _Round(k, st, not st.started,
                                     batch_size if st.started else self.warmup_batch(st.task.workload))
                        self._announce(bar, st, why)
                    batch = self._propose(rnd.state, min(rnd.todo, left), start_from_default)
                    rnd.todo -= len(batch)
                    rnd.closed = not batch or not rnd.first_look or rnd.todo <= 0
                    if batch:
                        rnd.batches += 1
                        sent.append((rnd, batch, runner.measure(rnd.state.task, batch)))
                    elif not in_flight(rnd):
                        self._end_round(bar, rnd)
                if not sent:
                    if rnd is not None and rnd.batches and not rnd.ended:
                        self._end_round(bar, rnd)        # cut short by the time limit between batches
                    return
                r, batch, results = sent[0]
                cut = False
                for cand, result in results:
                    r.ok |= self._record(r.state, cand, result, replay)
                    bar.update(1)
                    _show(bar, session, start, self.status, time_limit, runner.status())
                    if stop.requested:
                        raise KeyboardInterrupt
                    if out_of_time():
                        cut = True       # as strict as --trials: the rest of the batch is not measured
                        break
                sent.popleft()
                results.close()
                if cut:
                    r.closed = True
                if r.closed and not in_flight(r):
                    self._end_round(bar, r)
                if cut:
                    return
        finally:
            for _, _, results in sent:          # stopped midway: what was sent is not waited for
                results.close()

    def _announce(self, bar, st, why: str):
        if len(self.states) > 1:
            wl = st.task.workload
            best = f", best {st.summary.best_latency * 1e3:.4f} ms" if st.summary.best else ""
            bar.write(f"next: {wl.label}{f' {wl.spec}' if wl.name else ''} — {why} "
                      f"({st.summary.trials} trials so far{best})")

    def _end_round(self, bar, rnd):
        """A round's last batch is in: the scheduler hears of it (or of a task with nothing left)."""
        st, rnd.ended = rnd.state, True
        if not rnd.batches:
            self.rows[rnd.k].retired = st.summary.retired = \
                f"{st.policy.name} found no unmeasured candidate (space exhausted or search converged)"
            bar.write(f"{st.task.name}: {st.summary.retired}")
            return
        self.sched.record_round(rnd.k, st.summary.best_latency, failures_only=not rnd.ok)
        self._after_round()
        if self.rows[rnd.k].retired:
            st.summary.retired = self.rows[rnd.k].retired
            bar.write(f"{st.task.workload.label}: retired ({st.summary.retired})")

    def _propose(self, st, n: int, start_from_default: bool) -> list:
        """The policy's next batch; its time counts as search overhead, C generation as building."""
        t0, cg0 = time.perf_counter(), st.task.codegen_s
        batch = st.policy.propose(n, st.seen, first=start_from_default and not st.started)
        codegen = st.task.codegen_s - cg0
        self.session.search_s += time.perf_counter() - t0 - codegen
        self.session.codegen_s += codegen
        st.started = True
        return batch

    def _record(self, st, cand, result, replay) -> bool:
        """Append one result to the log, count it, tell the policy; True if it measured OK."""
        rec = records.make_record(st.task.workload, self.tgt, cand.steps, result, cand.code_hash,
                                  st.policy.name, st.policy.seed, cand.decisions, replay)
        records.append(self.log, [rec])
        s = st.summary
        s.trials += 1
        s.new += 1
        _count(s, result.error, result.message)
        if result.ok and (s.best is None or result.latency < s.best_latency):
            s.best = rec
        s.curve.append(s.best_latency if s.best is not None else math.inf)
        t0 = time.perf_counter()
        st.policy.update(cand, result)
        self.session.search_s += time.perf_counter() - t0
        return result.ok


class _StopSignals:
    """The first Ctrl-C (SIGINT) or SIGTERM asks the loop to stop after the measurement in hand; a
    second one stops at once. A KeyboardInterrupt raised wherever the signal lands can be lost:
    inside a finaliser (xgboost frees boosters in __del__, every round) Python reports it and
    carries on, so the handler only sets a flag that the loop reads."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, grace: float):
        """grace: seconds after the first signal before the loop is interrupted wherever it is (a
        long proposal or reference computation does not reach the loop's check soon enough)."""
        self.signum = None
        self.grace = grace
        self._timer = None
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
        self._timer = threading.Timer(self.grace, _thread.interrupt_main)
        self._timer.daemon = True
        self._timer.start()

    def restore(self):
        if self._timer is not None:
            self._timer.cancel()
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous = {}


@dataclass
class _Round:
    """One round of the scheduler's: its task, and how far its batches have got."""
    k: int
    state: object
    first_look: bool             # a task's first round: as many batches as `todo` takes
    todo: int                    # candidates it still wants
    batches: int = 0             # proposed
    closed: bool = False         # proposes no more batches
    ok: bool = False             # a candidate of it measured OK
    ended: bool = False          # the scheduler has heard of it


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


def _show(bar, session: Session, start: float, status: str | None = None, time_limit: float | None = None,
          measuring: str = ""):
    ok = sum(t.errors.get(OK, 0) for t in session.tasks)
    failed = sum(v for t in session.tasks for k, v in t.errors.items() if k != OK)
    elapsed = time.perf_counter() - start
    rate = 60.0 * session.new / elapsed if elapsed > 0 else 0.0
    if len(session.tasks) == 1:
        s = session.tasks[0]
        best = f"{s.best_latency * 1e3:.3f} ms {s.best_gflops:.1f} GFLOPS" if s.best else "-"
    elif status:
        best = status
    else:
        total = sum(t.weight * t.best_latency for t in session.tasks)
        best = f"weighted total {total * 1e3:.3f} ms" if math.isfinite(total) else "-"
    left = f" time left {_clock(time_limit - elapsed)}" if time_limit is not None else ""
    bar.set_postfix_str(f"valid {ok} failed {failed} best {best} {rate:.0f} cand/min{left}{measuring}", refresh=False)


def _clock(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


__all__ = ["tune", "tune_op", "TuneSummary", "Session", "Candidate", "default_log"]
