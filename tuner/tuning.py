"""Tuning sessions: propose, build, check, time, record, for one or many tasks; resumable.

A session tunes a set of workloads (identical ones merged, weights summed) under one global
trial budget. Each round the task scheduler picks a task, its search policy proposes a batch, the
batch is built (one compiler call per core) and measured (or, in replay mode, looked up in a
log), and every result is appended to the log as it arrives. What the log already holds counts
against the budget and is never measured again; Ctrl-C stops with every finished record on disk.

The loop (_Loop) proposes, keeps the runner's pipeline full and watches the time limit and stop
signals; what follows a result or a round is the MeasureCallbacks' (as TVM meta_schedule's):
AppendToLog, UpdateSummary, UpdatePolicy, then the caller's (a model tune's RoundHook), then
ShowProgress, each called in that order.
"""
from __future__ import annotations

import _thread
import collections
import dataclasses
import inspect
import math
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from tqdm import tqdm

from .database import records
from .database.result import OK
from .database.union import Database, Source, shipped_sources
from .errors import check_output_path
from .measure.runners import Runner, make_runner
from .measure.runner import RunConfig
from .ops import Workload, resolve
from .search import PolicyFactory, policy_factory
from .search.scheduler import SCHEDULERS, TaskProgress, family
from .target import Target, parse_target
from .task import Candidate, Task

if TYPE_CHECKING:
    from .database.result import MeasureResult
    from .measure.cluster import Cluster


@dataclass(frozen=True)
class TuneOptions:
    """How a session searches and measures. tune() and tune_op() also take each field as a keyword:
    `tune(wls, trials=8)` tunes with `dataclasses.replace(options or TuneOptions(), trials=8)`."""
    # the session ends once the log holds this many trials of its tasks, those of earlier sessions included
    trials: int = 64
    # seconds of wall time; the session ends within one measurement of it (None: no limit)
    time_limit: float | None = None
    # a search policy's name (tuner.search.POLICIES) or a PolicyFactory
    policy: str | PolicyFactory = "random"
    # each task's policy is seeded with seed + the number of that task's records in the log
    seed: int = 0
    # candidates per round once a task has had its first look
    batch_size: int = 32
    # a task's first look, in candidates (None: batch_size) or a function of its Workload giving them
    warmup_batch: int | Callable[[Workload], int] | None = None
    # a task's first batch starts with its default schedule (off to compare pure search)
    start_from_default: bool = True
    # which task gets the next round: a name of tuner.search.scheduler.SCHEDULERS
    scheduler: str = "gradient"
    # the scheduler retires a task after this many rounds without a better best (None: never)
    early_stopping: int | None = None
    # a cost model's start: None the shipped model, ["none"] none, else logs and at most one saved model
    cost_model_from: Sequence[str] | None = None
    # how each candidate is checked and timed (None: RunConfig())
    run_config: RunConfig | None = None
    # a log whose costs are looked up instead of measuring (a replayed tune)
    replay: str | None = None
    # measure on a Dask cluster: a scheduler's address, local:N (N workers here) or a Cluster; the log stays here
    cluster: str | Cluster | None = None
    # which first looks stop after their first candidates (FirstLookCut; None: every look whole)
    first_look_cut: FirstLookCut | None = None
    # a progress bar on stderr (the session's messages, on stdout, print either way)
    progress: bool = True

    def __post_init__(self):
        if self.run_config is None:
            object.__setattr__(self, "run_config", RunConfig())

    def first_look(self, workload: Workload) -> int:
        """The size of `workload`'s first round."""
        if callable(self.warmup_batch):
            return self.warmup_batch(workload)
        return self.warmup_batch or self.batch_size


_OPTION_NAMES = tuple(f.name for f in dataclasses.fields(TuneOptions))


def _options(options: TuneOptions | None, changes: dict, caller: str) -> TuneOptions:
    """`options` (default TuneOptions()) with the fields named in `changes` replaced."""
    for name in changes:
        if name not in _OPTION_NAMES:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    return dataclasses.replace(options or TuneOptions(), **changes)


def _takes_options(fn):
    """Show TuneOptions' fields as `fn`'s keyword-only parameters in place of its **changes (what
    it accepts there), for help() and inspect.signature."""
    sig = inspect.signature(fn)
    kept = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fields = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
              for f in dataclasses.fields(TuneOptions)]
    fn.__signature__ = sig.replace(parameters=kept + fields)
    return fn


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
        return self.workload.live_flops / self.best_latency / 1e9 if self.best else 0.0

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
    return str(Path("logs") / f"{(workload.name or workload.logged_op).replace('/', '_')}.{workload.layout}.jsonl")


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


@_takes_options
def tune(workloads: list, target: str | Target = "cpu", *, log: str | None = None, options: TuneOptions | None = None,
         threads: int | None = None, runner: Runner | None = None, callbacks: Sequence[MeasureCallback] = (),
         **changes) -> Session:
    """Tune `workloads` (Workloads or (Workload, weight) pairs) until `trials` records exist for them.

    target: a Target or its text, its thread count replaced by `threads` if given. log: default
    logs/NAME.LAYOUT.jsonl of the first workload. options: a TuneOptions (see its fields), and the
    keywords named as its fields replace them. runner: a tuner.measure.runners.Runner to measure with
    (default: this host, the replay log or the cluster that the options name); not closed here.
    callbacks: MeasureCallbacks called after the session's own (log, summary, policy), before the
    progress bar's (a model tune's RoundHook steers the scheduler).
    """
    opts = _options(options, changes, "tune")
    tgt = parse_target(target, threads)
    pairs = _merge(workloads)
    log = log or default_log(pairs[0][0])
    check_output_path(log, "--log")
    records.check_appendable(log, "--log")
    claims = records.TaskClaims(log, [(wl.key, str(tgt), wl.label) for wl, _ in pairs])
    try:
        factory = policy_factory(opts.policy, tgt, opts.seed, opts.cost_model_from)
        loop = _Loop(pairs, tgt, log, factory, SCHEDULERS[opts.scheduler], opts, callbacks)
        return loop.run(runner)
    finally:
        claims.release()


@_takes_options
def tune_op(workload: str | Workload, layout: str | None = None, target: str | Target = "cpu", *,
            log: str | None = None, options: TuneOptions | None = None, threads: int | None = None,
            runner: Runner | None = None, callbacks: Sequence[MeasureCallback] = (), **changes) -> TuneSummary:
    """Tune one workload (a Workload, or a name or spec resolved with `layout`) until `trials`
    records exist for it in `log`; the other parameters and options as `tune`."""
    wl = workload if isinstance(workload, Workload) else resolve(workload, layout)
    return tune([wl], target, log=log or default_log(wl), options=_options(options, changes, "tune_op"),
                threads=threads, runner=runner, callbacks=callbacks).tasks[0]


class FirstLookCut(Protocol):
    """A first look in two parts: the task's first `probe` candidates (its default first) are
    measured, and the rest of the look only where `go_on` says so, asked once those are in (a
    runner that measures ahead, a cluster's, is sent the rest before: no look is cut there). What
    a look does not measure leaves the session's budget: the session ends sooner rather than
    spending it on other rounds. `tasks` are the session's TuneSummaries, `k` the task's index."""

    def probe(self, tasks: list, k: int) -> int:
        """Candidates measured before `go_on` is asked (0: the look is measured whole)."""

    def go_on(self, tasks: list, k: int) -> bool:
        """Whether the task's look measures the rest of its candidates."""


class MeasureCallback(Protocol):
    """What a session does after each result and each round, besides proposing and measuring. A
    class that subclasses it keeps the no-op methods it does not define. `loop` is the session's:
    callbacks read `loop.session` (the TuneSummaries, the time spent searching), `loop.rows` (the
    scheduler's TaskProgress of each task) and `loop.status` (the progress line's text)."""

    def on_start(self, loop: _Loop) -> None:
        """Before the first round, the tasks' summaries holding what the log had."""

    def on_result(self, loop: _Loop, state: _TaskState, cand: Candidate, result: MeasureResult,
                  record: records.Record) -> None:
        """One candidate of `state`'s task measured, `record` its log record."""

    def on_round_end(self, loop: _Loop, rnd: _Round) -> None:
        """A round's last result is in and the scheduler has heard of it."""


class AppendToLog(MeasureCallback):
    """Each record is appended to the log as it arrives (Ctrl-C loses no finished one)."""

    def __init__(self, log: str):
        self.log = log

    def on_result(self, loop, state, cand, result, record):
        records.append(self.log, [record])


class UpdateSummary(MeasureCallback):
    """The task's TuneSummary counts the trial, its error kind, its best and its curve."""

    def on_result(self, loop, state, cand, result, record):
        s = state.summary
        s.trials += 1
        s.new += 1
        _count(s, result.error, result.message)
        if result.ok and (s.best is None or result.latency < s.best_latency):
            s.best = record
        s.curve.append(s.best_latency if s.best is not None else math.inf)


class UpdatePolicy(MeasureCallback):
    """The task's policy hears of the result; its time counts as search overhead."""

    def on_result(self, loop, state, cand, result, record):
        t0 = time.perf_counter()
        state.policy.update(cand, result)
        loop.session.search_s += time.perf_counter() - t0


class RoundHook(MeasureCallback):
    """A model tune's steering: `fn(summaries)`, at the start and after every round, returns (new
    scheduler weights or None, the progress line's status or None). The weights replace the
    scheduler's alone; TuneSummary.weight stays the occurrence count."""

    def __init__(self, fn: Callable[[list], tuple]):
        self.fn = fn

    def on_start(self, loop):
        self._steer(loop)

    def on_round_end(self, loop, rnd):
        self._steer(loop)

    def _steer(self, loop):
        weights, loop.status = self.fn(loop.session.tasks)
        for row, w in zip(loop.rows, weights or ()):
            row.weight = w


class ShowProgress(MeasureCallback):
    """The progress bar counts each trial; its line shows the counts, the best, the rate, the time
    left and the runner's status."""

    def __init__(self, bar, start: float, time_limit: float | None, runner: Runner):
        self.bar, self.start, self.time_limit, self.runner = bar, start, time_limit, runner

    def on_start(self, loop):
        self._show(loop)

    def on_result(self, loop, state, cand, result, record):
        self.bar.update(1)
        self._show(loop)

    def _show(self, loop):
        _show(self.bar, loop.session, self.start, loop.status, self.time_limit, self.runner.status())


class _Loop:
    """One session: propose -> build and measure -> record, round after round, as the scheduler picks."""

    def __init__(self, pairs, tgt, log, factory, scheduler_cls, options: TuneOptions, callbacks=()):
        self.tgt, self.log, self.factory, self.options = tgt, log, factory, options
        self.extra_callbacks = list(callbacks)
        self.states, self.rows = [], []
        contents = records.load(log, warn=False)
        # where a fresh task's first round finds its records of another thread count
        self.others = Database([Source(str(log), contents)] + shipped_sources(tgt))
        other_way = 0          # records of these tasks timed with the weights the other way: not resumed
        for wl, weight in pairs:
            other_way += self._resume(wl, weight, contents)
        if other_way:
            was, now = ("warm", "cold") if options.run_config.cold_weights else ("cold", "warm")
            warnings.warn(f"{log}: {other_way} records of these tasks were timed with the weights {was}; this tune "
                          f"times them {now} and does not count those (--weights {was} resumes them)", stacklevel=3)
        self.sched = scheduler_cls(self.rows, early_stopping=options.early_stopping)
        self.session = Session([st.summary for st in self.states], log)
        self.status = None               # the progress line's text in place of the weighted total (RoundHook)
        self.callbacks: list = []        # set by run()
        self.runner = self.bar = self.stop = None     # set by run()
        self.start = 0.0
        self.rnd, self.no_more = None, False     # the round being proposed; the scheduler has ended the session
        self.cut = 0                     # candidates of first looks that options.first_look_cut left out

    def _resume(self, wl, weight, contents) -> int:
        """Add `wl`'s task, with what the log holds of it; the number of its records timed with the
        weights the other way (not resumed)."""
        tgt, log, run_config = self.tgt, self.log, self.options.run_config
        task = Task(wl, tgt)
        cold = run_config.times_cold(wl)
        previous = contents.for_task(wl.key, str(tgt), cold)
        other_way = len(contents.for_task(wl.key, str(tgt), not cold)) if wl.constant_inputs else 0
        best = records.first_that_replays(previous)
        if best is None and any(r.ok for r in previous):
            # measured code this tuner no longer generates (another version): not a head start
            warnings.warn(f"{log}: none of the {len(previous)} records of {wl.label} replays onto the "
                          "schedules this version of tuner generates; tuning it from the start", stacklevel=3)
            previous = []
        # a second timing of a kernel (model_tuning.confirm_bests) is not a trial
        tried = [r for r in previous if r.trial]
        s = TuneSummary(wl, tgt, log, weight, trials=len(tried), skipped_lines=contents.skipped)
        for r in tried:
            _count(s, r.error, r.message)
            s.curve.append(min(s.curve[-1] if s.curve else math.inf, r.latency if r.ok else math.inf))
        s.best = best
        if not previous:
            rec, _ = self.others.other_threads(wl, tgt)
            task.seeds = [rec.decisions] if rec is not None else []
        pol = self.factory.make(task, self.options.seed + len(previous))
        pol.observe(previous)
        self.states.append(_TaskState(task, pol, {r.code_hash for r in previous}, s, bool(previous)))
        row = TaskProgress(task.name, weight, wl.flops, family(wl))
        if previous:
            row.history.append(s.best_latency)
            row.rounds = 1
        self.rows.append(row)
        return other_way

    def run(self, runner: Runner | None) -> Session:
        session, own_runner, opts = self.session, runner is None, self.options
        self.start = time.perf_counter()
        try:        # one cleanup below, also when the runner or the bar fails to start
            self.stop = _StopSignals(grace=opts.run_config.timeout + 5.0)
            self.factory.start([st.task for st in self.states])
            self.runner = make_runner(self.tgt, opts.run_config, opts.replay, opts.cluster) if own_runner else runner
            self.bar = tqdm(total=opts.trials, initial=min(session.trials, opts.trials), disable=not opts.progress,
                            unit="trial", dynamic_ncols=True,
                            desc=self.states[0].task.name if len(self.states) == 1 else f"{len(self.states)} tasks")
            self.start = time.perf_counter()
            if self.factory.describe():
                self.bar.write(self.factory.describe())
            self.callbacks = [AppendToLog(self.log), UpdateSummary(), UpdatePolicy(), *self.extra_callbacks,
                              ShowProgress(self.bar, self.start, opts.time_limit, self.runner)]
            for cb in self.callbacks:
                cb.on_start(self)
            self._rounds()
        except KeyboardInterrupt:
            session.interrupted = True
            session.stopped_by = signal.Signals(self.stop.signum or signal.SIGINT).name if self.stop else "SIGINT"
        finally:
            if self.stop is not None:
                self.stop.restore()
            session.seconds = time.perf_counter() - self.start
            for s in session.tasks:
                s.seconds, s.interrupted = session.seconds, session.interrupted
            if self.bar is not None:
                self.bar.close()
            if own_runner and self.runner is not None:
                self.runner.close()
            self.factory.close()
        return session

    def _rounds(self):
        """Round after round until the budget, the time limit or the scheduler ends the session.

        A round is one batch of the task the scheduler picks; a first look (warmup_batch) may take
        several batches, each proposed after the previous one's results (a pre-trained model's first
        batches are small, each followed by fine-tuning). A runner whose `ahead` is k > 0 (a cluster;
        read before each proposal, as it may grow with the workers) gets up to k batches beyond the
        one whose results are being read: they are proposed without those results, and measured
        meanwhile. Results are recorded in the order batches were proposed, so a replayed tune
        logs the same whatever the runner, for the same `ahead`."""
        sent = collections.deque()            # (round, batch, its results: a generator), oldest first
        try:
            while True:
                self._fill_pipeline(sent)
                if not sent:
                    if self.rnd is not None and self.rnd.batches and not self.rnd.ended:
                        self._end_round(self.rnd)        # cut short by the time limit between batches
                    return
                if self._drain_oldest(sent):
                    return
        finally:
            for _, _, results in sent:          # stopped midway: what was sent is not waited for
                results.close()

    def _fill_pipeline(self, sent: collections.deque):
        """Propose and send batches until `runner.ahead` wait beyond the oldest, the budget is all
        proposed, the time is up or the scheduler ends the session."""
        while len(sent) <= self.runner.ahead and not self.no_more and not self._out_of_time():
            self._check_stop()
            self._cut_look(sent)
            left = self.options.trials - self.session.trials - sum(len(b) for _, b, _ in sent) - self.cut
            if left <= 0:
                return
            rnd = self._open_round(sent)
            if rnd is None:
                return
            if rnd.held:            # the rest of a first look, its probe measured
                batch, rnd.held = rnd.held, []
            else:
                batch = self._propose(rnd.state, min(rnd.todo, left))
                rnd.todo -= len(batch)
                cut = self.options.first_look_cut
                n = cut.probe(self.session.tasks, rnd.k) if cut is not None and rnd.first_look and not rnd.batches \
                    else 0
                if 0 < n < len(batch):
                    batch, rnd.held = batch[:n], batch[n:]
            rnd.closed = not batch or not rnd.first_look or (rnd.todo <= 0 and not rnd.held)
            if batch:
                rnd.batches += 1
                sent.append((rnd, batch, self.runner.measure(rnd.state.task, batch)))
            elif not _in_flight(sent, rnd):
                self._end_round(rnd)

    def _cut_look(self, sent: collections.deque):
        """Once the probe of the open first look is in, its rest is measured, or cut where
        options.first_look_cut says so: the round ends, and the budget shrinks by what it left."""
        rnd = self.rnd
        if rnd is None or rnd.closed or not rnd.held or _in_flight(sent, rnd) \
                or self.options.first_look_cut.go_on(self.session.tasks, rnd.k):
            return
        left = len(rnd.held) + rnd.todo
        self.cut += left
        self.bar.total -= left
        rnd.held, rnd.todo, rnd.closed = [], 0, True
        self._end_round(rnd)

    def _open_round(self, sent: collections.deque) -> _Round | None:
        """The round to propose for: the last one while it takes more batches, else a new one of the
        task the scheduler picks; None when the scheduler ends the session."""
        if self.rnd is not None and not self.rnd.closed:
            return self.rnd
        k, why = self.sched.next(busy={r.k for r, _, _ in sent})
        if k is None:
            self.bar.write(f"stopping early: {why}")
            self.no_more = True
            return None
        st = self.states[k]
        self.rnd = _Round(k, st, not st.started, self.options.batch_size if st.started
                          else self.options.first_look(st.task.workload))
        self._announce(st, why)
        return self.rnd

    def _drain_oldest(self, sent: collections.deque) -> bool:
        """Record the oldest batch's results as they arrive; True when the time limit cut it short
        (as strict as --trials: the rest of the batch is not measured)."""
        r, _, results = sent[0]
        cut = False
        for cand, result in results:
            r.ok |= self._record(r.state, cand, result)
            self._check_stop()
            if self._out_of_time():
                cut = True
                break
        sent.popleft()
        results.close()
        if cut:
            r.closed = True
        if r.closed and not _in_flight(sent, r):
            self._end_round(r)
        return cut

    def _out_of_time(self) -> bool:
        limit = self.options.time_limit
        return limit is not None and time.perf_counter() - self.start >= limit

    def _check_stop(self):
        if self.stop.requested:
            raise KeyboardInterrupt

    def _announce(self, st, why: str):
        if len(self.states) > 1:
            wl = st.task.workload
            best = f", best {st.summary.best_latency * 1e3:.4f} ms" if st.summary.best else ""
            self.bar.write(f"next: {wl.label}{f' {wl.spec}' if wl.name else ''} — {why} "
                           f"({st.summary.trials} trials so far{best})")

    def _end_round(self, rnd):
        """A round's last batch is in: the scheduler hears of it (or of a task with nothing left)."""
        st, rnd.ended = rnd.state, True
        if not rnd.batches:
            self.rows[rnd.k].retired = st.summary.retired = \
                f"{st.policy.name} found no unmeasured candidate (space exhausted or search converged)"
            self.bar.write(f"{st.task.name}: {st.summary.retired}")
            return
        self.sched.record_round(rnd.k, st.summary.best_latency, failures_only=not rnd.ok)
        for cb in self.callbacks:
            cb.on_round_end(self, rnd)
        if self.rows[rnd.k].retired:
            st.summary.retired = self.rows[rnd.k].retired
            self.bar.write(f"{st.task.workload.label}: retired ({st.summary.retired})")

    def _propose(self, st, n: int) -> list:
        """The policy's next batch; its time counts as search overhead, C generation as building."""
        t0, cg0 = time.perf_counter(), st.task.codegen_s
        batch = st.policy.propose(n, st.seen, first=self.options.start_from_default and not st.started)
        codegen = st.task.codegen_s - cg0
        self.session.search_s += time.perf_counter() - t0 - codegen
        self.session.codegen_s += codegen
        st.started = True
        return batch

    def _record(self, st, cand, result) -> bool:
        """One result's record, through every callback; True if it measured OK."""
        rec = records.make_record(st.task.workload, self.tgt, cand.steps, result, cand.code_hash,
                                  st.policy.name, st.policy.seed, cand.decisions, self.options.replay)
        for cb in self.callbacks:
            cb.on_result(self, st, cand, result, rec)
        return result.ok


def _in_flight(sent: collections.deque, rnd: _Round) -> bool:
    """Whether a batch of `rnd` is still being measured."""
    return any(r is rnd for r, _, _ in sent)


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
    state: _TaskState
    first_look: bool             # a task's first round: as many batches as `todo` takes
    todo: int                    # candidates it still wants
    batches: int = 0             # proposed
    closed: bool = False         # proposes no more batches
    held: list = field(default_factory=list)     # proposed, measured once its probe is in (FirstLookCut)
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


__all__ = ["tune", "tune_op", "TuneOptions", "TuneSummary", "Session", "Candidate", "default_log", "FirstLookCut",
           "MeasureCallback", "AppendToLog", "UpdateSummary", "UpdatePolicy", "RoundHook", "ShowProgress"]
