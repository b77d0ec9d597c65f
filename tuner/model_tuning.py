"""`tuner tune MODEL`: every task of a model in every candidate layout, one budget, one layout plan.

The model's layout problem (graph.layout_plan.model_layouts) names the tasks: each convolution's
fused group in each layout it can take, the pools that follow it, the layout transforms that
the choices can need, and the groups no choice moves (the classifier). All are tuned in one
session under one trial budget (tuning.tune): each task first gets a short warm-up batch (the
default schedule and the cost model's best guesses; a layout transform its default alone, see
FIRST_LOOK), then the gradient task scheduler spends the rest where the estimated model latency
falls fastest.

After every round the solver re-plans with the best latencies so far, and the plan steers the
scheduler: a task the current plan uses weighs as often as the plan runs it; so does a task of a
layout the plan does not pick whose conv would beat the chosen layout at equal effort
(EXPLORE_RATIO: the layout tuned first does not keep the plan for that alone). A direct conv
layout that after TUNED_TRIALS trials is behind what the chosen one had after as many loses its
duel and gets no more rounds (DUEL_OPS); one short of TUNED_TRIALS while the chosen one has them
is tuned to its duel with its full weight (DUEL_BEFORE_DISMISS). Otherwise a task keeps a tenth
of its weight when it is close (one that is close can still win a round), and none when every
conv layout it is part of costs over PRUNE_RATIO x the chosen one (pruned: a layout that measured
clearly worse is not tuned further while the plan stands; a task that has had only its first
look is judged on what it could reach, TUNED_TRIALS). The estimated model latency on the progress line is the plan's cost
plus the fixed groups.

Weights are timed cold (weights="cold", the default; `--weights`): a kernel timed over and over
on the same inputs keeps its weights in cache, while a compiled model reads them once per
inference (ResNet-50's are 100 MB; a Winograd GEMM's transformed weights 1.8x or 4x the conv's).
So every task with constant inputs is searched with them evicted before each timed call
(RunConfig.cold_weights; its records say so, Record.cold): cold, the same kernels run slower and
the search finds other schedules (`python -m bench.cold`; docs/model-tuning-history.md). With
weights="warm" the search times them
warm, as an operator tune does, and the plan is solved with those prices; each weighted task's
best kernel is then timed again cold (`cold_prices`, also for a task whose best record predates
cold timing), and the estimate is given both ways. The plan is appended to the log as a
layout-plan line, which `tuner compile` applies.

A graph choice with a cost either way that no task price decides (GRAPH_CHOICES: attention as one
fused kernel or as its batch_matmuls and a softmax; a transformer's Q, K and V projections as one
GEMM or three) is then timed on the whole model both ways,
interleaved, with the plan and the tuned records; the faster goes with the plan (its `choices`),
and `tuner compile` applies it. Each choice is timed with the others off, and a merged GEMM,
which the search did not see, runs the schedule compile gives it untuned.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
import uuid
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np

from .database import records
from .database.result import WEIGHTS
from .database.union import Database
from .errors import UserError
from .graph import Graph, load
from .graph.ir import graph_digest, graph_structure
from .graph.layout_plan import (ModelLayouts, Plan, anonymous_structure, default_plan, model_layouts, padded_graph,
                                winograd_convs)
from .graph.passes import GRAPH_CHOICES, optimize
from .graph.passes.convert_layout import check_choice
from .measure.interleave import interleaved, interleaved_profiles, paired_ratios
from .measure.peak import peak_gflops
from .measure.runner import CpuRunner, RunConfig
from .runtime.artifact import UNTUNED
from .search.scheduler import family
from .target import parse_target
from .task import Task
from .te.layouts import DEFAULT_CHOICES, plan_summary
from .tuning import RoundHook, Session, tune

OUT_OF_PLAN_WEIGHT = 0.1
# A task outside the plan whose every conv layout costs over PRUNE_RATIO x the layout the plan
# chose for that conv is pruned (weight 0: no rounds after its first look while the plan stands).
# Soft weights alone do not prune: the gradient scheduler's optimistic estimate grows with a
# task's latency, so the slowest layout looks the most promising (docs/model-tuning-history.md).
PRUNE_RATIO = 1.25
# ... judged on what a task could reach: one with fewer than TUNED_TRIALS measurements (a first look)
# is priced for pruning at the lower of its best and its FLOPs at the best FLOP rate a task of the
# same operator and layout has reached (reachable_prices): a first look prices a conv well above
# what tuning later finds, and pruning on it would keep whichever layout happened to be tuned first.
TUNED_TRIALS = 20
# operators whose first look is this many measurements (others: warmup_batch). A layout transform
# is a copy with few schedules worth trying, and most of a model's tasks are transforms: one look
# each. A Winograd GEMM's default schedule and the cost model's first guesses are far from what
# tuning finds: sixteen looks give it a fair first price. After the first look the scheduler
# weighs them like any task (docs/model-tuning-history.md).
FIRST_LOOK = {"layout_transform": 1, "winograd_gemm": 16}
# A tune of first looks only (compile --quick) measures a task's first MINOR_PROBE candidates (its
# default and the next: a seed or the cost model's first pick) and stops there when it turns out
# minor: under MINOR_SHARE of the model's time so far (every measured task's best x occurrences),
# while the tasks so stopped stay under MINOR_TOTAL together. A task with MAJOR_FLOPS of the
# model's FLOPs or more is measured whole at once (MinorTasks).
MINOR_PROBE, MINOR_SHARE, MINOR_TOTAL, MAJOR_FLOPS = 2, 0.01, 0.05, 0.03
# A task outside the plan whose conv layout, priced at equal effort (projected_prices), would cost
# under EXPLORE_RATIO x the layout the plan chose gets its full weight, like a task of the plan,
# until its own trials say otherwise: without it the layout tuned first keeps the plan. Alone it
# splits the budget between close layouts, which the duels below end (docs/model-tuning-history.md).
EXPLORE_RATIO = 1.0
# Two direct-convolution layouts of a conv (NCHW8c and NCHW16c) run the same kind of kernel, so
# their searches progress alike and can be compared at equal effort: once the task of a layout
# the plan does not pick has had TUNED_TRIALS trials and its best is still behind what the chosen
# layout's task had after as many trials, it loses the duel and is pruned (equal_effort_losers).
# Without it close layouts are both tuned to the end (docs/model-tuning-history.md). A Winograd
# layout is left out of duels: its GEMM starts far from where tuning takes it (FIRST_LOOK).
DUEL_OPS = ("conv2d",)
# A direct layout the plan does not pick, not clearly worse (PRUNE_RATIO) and still short of
# TUNED_TRIALS while the chosen one has them, is tuned to its duel before it is dismissed:
# without it the plan's first pick keeps convs whose other layout had only a first look
# (docs/model-tuning-history.md).
DUEL_BEFORE_DISMISS = True


@dataclass
class ModelTuneResult:
    model: str
    space: ModelLayouts
    session: Session
    plan: Plan | None            # None when some convolution has no measured layout yet
    estimate_s: float            # plan cost plus the fixed groups (inf without a plan)
    record: records.PlanRecord | None
    prices: dict = field(default_factory=dict)   # workload key -> seconds the plan was solved with
    other_plan: Plan | None = None               # weights="warm": the plan the cold prices give
    other_estimate_s: float = math.inf           # its estimate under those prices
    appended: bool = False                       # whether `record` was appended (not the log's newest already)
    plan_check: dict = field(default_factory=dict)   # {"joint", "one layout", "default": whole-model s} (check_plan)
    padded: bool = False         # the plan compiles as the untuned compile does, channels padded (records.PlanRecord)
    untuned_check: dict = field(default_factory=dict)   # {"tuned", "untuned": whole-model s, "ratio"} (untuned_check)

    def table(self) -> str:
        """The tasks the plan uses (with occurrences, trials, best latency, share) and the plan."""
        if self.plan is None or not math.isfinite(self.estimate_s):
            return ("no layout plan yet: some task has no valid measurement (run the same command with more "
                    "--trials to resume)")
        by_key = {s.workload.key: s for s in self.session.tasks}
        used = self.space.used(self.plan.layouts)
        rows = [f"{'x':>3} {'trials':>6} {'best ms':>9} {'share':>6}  task"]
        price = lambda key: self.prices.get(key, by_key[key].best_latency)  # noqa: E731
        for key, n in sorted(used.items(), key=lambda kv: -kv[1] * price(kv[0])):
            s = by_key[key]
            rows.append(f"{n:>3} {s.trials:>6} {price(key) * 1e3:>9.4f} "
                        f"{100 * n * price(key) / self.estimate_s:>5.1f}%  {s.workload.label}")
        rows.append(f"layout plan: {plan_summary(self.plan.layouts)}; solved in {self.plan.seconds * 1e3:.1f} ms"
                    f"{'' if self.plan.exact else ' (beam search: not proven optimal)'}")
        r = self.record
        cold = sum(k in r.cold or (by_key[k].best is not None and by_key[k].best.cold) for k in used) if r else 0
        rows.append(f"estimated model latency {self.estimate_s * 1e3:.3f} ms (sum of the plan's tasks, "
                    + (f"the {cold} with weights timed with them evicted before each call, as a model meets them)"
                       if r and r.priced == "cold" else "as the search timed them, weights warm in cache)"))
        if cold and r.priced == "warm":
            rows.append(f"with the weights of its {cold} kernels cold (timed again with them evicted before each "
                        f"call): {r.cold_estimate_s * 1e3:.3f} ms; a model run back to back lands between")
        if self.plan_check:
            said = {"joint": "the solved plan", "one layout": "one layout", "default": "the untuned compile's plan"}
            kept = min(self.plan_check, key=self.plan_check.get)
            rows.append("the whole model with " + ", with ".join(f"{said[k]} {s * 1e3:.2f} ms"
                                                                  for k, s in self.plan_check.items())
                        + f" (timed interleaved after the search): {said[kept]} kept"
                        + (", its convs' channels padded to whole blocks as that compile pads them" if self.padded else ""))
        for c, v in (r.choices if r else {}).items():
            rows.append(f"{c}: {'on' if v['on'] else 'off'} (the whole model {v['s'][0] * 1e3:.2f} ms on, "
                        f"{v['s'][1] * 1e3:.2f} ms off, timed interleaved after the search)")
        if r and r.defaults:
            rows.append(f"in the model: {len(r.defaults)} task(s) run their default schedule, faster there than their "
                        "best record (each step timed where it runs after the search): "
                        + "; ".join(by_key[k].workload.label for k in r.defaults if k in by_key))
        if u := self.untuned_check:
            rows.append(f"the whole model as tuned {u['tuned'] * 1e3:.2f} ms, its untuned compile {u['untuned'] * 1e3:.2f} "
                        f"ms ({u['ratio']:.3f}x paired, timed interleaved last): "
                        + ("the untuned compile kept: a compile from this log takes neither this plan nor its records"
                           if r and r.untuned else "the tuned plan kept"))
        elif r and r.untuned:
            rows.append("the log's plan says the untuned compile ran faster whole: a compile from this log takes "
                        "neither this plan nor its records")
        return "\n".join(rows)


def _latencies(session_tasks) -> dict:
    return {s.workload.key: s.best_latency for s in session_tasks}


def cost_ratio(cost: float, chosen: float) -> float:
    """A conv layout's cost relative to the layout the plan chose for that conv (> PRUNE_RATIO: pruned)."""
    return cost / chosen if chosen > 0 else 1.0


def reachable_prices(tasks) -> dict:
    """{workload key: the price a task is pruned on} for (workload, best latency, trials) triples: its
    best, or with fewer than TUNED_TRIALS trials the lower of that and its FLOPs at the best FLOP
    rate any similar task reached (scheduler.family: its operator, layout and, for a conv, how its
    channels are grouped; see PRUNE_RATIO)."""
    rate: dict = {}
    for wl, best, _ in tasks:
        if math.isfinite(best) and best > 0 and wl.flops > 0:
            rate[family(wl)] = max(rate.get(family(wl), 0.0), wl.flops / best)
    return {wl.key: min(best, wl.flops / rate[family(wl)])
            if trials < TUNED_TRIALS and wl.flops > 0 and family(wl) in rate else best
            for wl, best, trials in tasks}


def projected_prices(tasks) -> dict:
    """{workload key: its price at equal effort} for (workload, best latency, curve) triples, the
    curve being the best latency after each trial: a task's best times the factor by which the tasks
    of its operator that had more trials improved after as many trials as it has (the lower
    quartile of those factors: optimistic, as exploring should be). So a layout seen for 12 trials
    is compared with what the plan's layout had after 12 trials, not after 200 (EXPLORE_RATIO).
    The median was too timid: most tasks gain little after their first look and a few gain much
    (MobileNetV2's conv tasks after 4 trials: median 0.92, lower quartile 0.84, tenth 0.62)."""
    by_op: dict = {}
    for wl, best, curve in tasks:
        if curve and math.isfinite(best):
            by_op.setdefault(wl.op, []).append(curve)
    memo: dict = {}

    def factor(op: str, n: int) -> float:
        if (op, n) not in memo:
            gains = [c[-1] / c[n - 1] for c in by_op.get(op, ()) if len(c) > n and math.isfinite(c[n - 1])]
            memo[op, n] = sorted(gains)[len(gains) // 4] if gains else 1.0
        return memo[op, n]
    return {wl.key: best * factor(wl.op, len(curve)) if curve and math.isfinite(best) else best
            for wl, best, curve in tasks}


def layout_ratios(space: ModelLayouts, layouts: dict, best: dict, reach: dict | None = None) -> dict:
    """{conv: {layout: cost_ratio}}: each conv layout's cost under `reach` (default `best`) against
    the chosen layout's under `best` (> PRUNE_RATIO: pruned; what `tuner analyze` marks too)."""
    unary = space.problem(lambda wl: best.get(wl.key, math.inf)).unary
    hope = unary if reach is None else space.problem(lambda wl: reach.get(wl.key, math.inf)).unary
    return {v: {lay: cost_ratio(hope[v][lay], unary[v][layouts[v]]) for lay in options}
            for v, options in space.unary.items()}


def pruning_ratios(space: ModelLayouts, layouts: dict, best: dict, reach: dict | None = None) -> dict:
    """{workload key: the lowest layout_ratios entry over the conv layouts whose cost it is part of};
    tasks of no conv layout (edge transforms, the fixed groups) are left out."""
    ratios = layout_ratios(space, layouts, best, reach)
    out: dict = {}
    for v, options in space.unary.items():
        for lay, wls in options.items():
            for wl in wls:
                out[wl.key] = min(out.get(wl.key, math.inf), ratios[v][lay])
    return out


@dataclass
class TaskProgress:
    """A task's best latency after each of its trials, rebuilt from its records in log order: what
    equal_effort_losers reads of a TuneSummary, for `tuner analyze`."""
    workload: object
    curve: list

    @classmethod
    def from_records(cls, workload, recs) -> "TaskProgress":
        curve: list = []
        for r in recs:
            curve.append(min(curve[-1] if curve else math.inf, r.latency if r.ok else math.inf))
        return cls(workload, curve)

    @property
    def trials(self) -> int:
        return len(self.curve)

    @property
    def best_latency(self) -> float:
        return self.curve[-1] if self.curve else math.inf


def _duels(space: ModelLayouts, layouts: dict, tasks):
    """(chosen, other) TaskProgress pairs: per conv, its chosen layout's task of DUEL_OPS against
    each other layout's (chosen None when the chosen layout has none, a Winograd one)."""
    by = {s.workload.key: s for s in tasks}

    def duelist(wls):
        return next((by[w.key] for w in wls if w.op in DUEL_OPS and w.key in by), None)
    for v, options in space.unary.items():
        chosen = duelist(options[layouts[v]])
        for lay, wls in options.items():
            other = duelist(wls)
            if other is not None and lay != layouts[v]:
                yield chosen, other


def equal_effort_losers(space: ModelLayouts, layouts: dict, tasks) -> set:
    """Keys of the tasks of DUEL_OPS that every conv whose cost they are part of prices in a
    layout the plan does not pick, with TUNED_TRIALS or more trials and a best still behind the
    chosen layout's task of the same operator after as many trials (TuneSummary.curve)."""
    lost: dict = {}
    for chosen, other in _duels(space, layouts, tasks):
        fair = (chosen is not None and other.trials >= TUNED_TRIALS and bool(chosen.curve)
                and other.best_latency > chosen.curve[min(other.trials, len(chosen.curve)) - 1])
        lost[other.workload.key] = lost.get(other.workload.key, True) and fair
    return {k for k, v in lost.items() if v}


def pending_duels(space: ModelLayouts, layouts: dict, tasks) -> set:
    """Keys of the tasks of DUEL_OPS in a layout the plan does not pick for some conv whose chosen
    layout's task has had TUNED_TRIALS trials while they have had fewer: not yet compared at
    equal effort (DUEL_BEFORE_DISMISS)."""
    return {other.workload.key for chosen, other in _duels(space, layouts, tasks)
            if chosen is not None and chosen.trials >= TUNED_TRIALS > other.trials}


def _weights(space: ModelLayouts, plan: Plan, tasks) -> list:
    """Per task: how often the plan runs it; when it does not, 0 when it lost a duel at equal
    effort (equal_effort_losers), its occurrences too if at equal effort its layout would beat the
    chosen one (EXPLORE_RATIO, on projected_prices) or it is short of its duel and not pruned
    (pending_duels), OUT_OF_PLAN_WEIGHT x its occurrences, or 0 when it is pruned (PRUNE_RATIO,
    on reachable_prices)."""
    in_plan = space.used(plan.layouts)
    best = _latencies(tasks)
    reach = reachable_prices([(s.workload, s.best_latency, s.trials) for s in tasks])
    ratio = pruning_ratios(space, plan.layouts, best, reach)
    hope = pruning_ratios(space, plan.layouts, best, projected_prices([(s.workload, s.best_latency, s.curve)
                                                                        for s in tasks]))
    lost = equal_effort_losers(space, plan.layouts, tasks)
    pending = pending_duels(space, plan.layouts, tasks) if DUEL_BEFORE_DISMISS else set()
    return [in_plan.get(s.workload.key)
            or (0.0 if s.workload.key in lost
                else s.weight if hope.get(s.workload.key, math.inf) < EXPLORE_RATIO
                or (s.workload.key in pending and ratio.get(s.workload.key, 1.0) <= PRUNE_RATIO)
                else 0.0 if ratio.get(s.workload.key, 1.0) > PRUNE_RATIO else OUT_OF_PLAN_WEIGHT * s.weight)
            for s in tasks]


CONFIRM_TOP = 3      # front-runners per task timed again, beside its default, after a model tune (confirm_bests)


def confirm_bests(tasks, tgt, log: str, config: RunConfig, progress: bool = True, seed: int = 0,
                  contenders: dict | None = None) -> int:
    """A heat per task (records.heat_winner): its CONFIRM_TOP fastest kernels and its default
    schedule (and its `contenders`, {workload key: [steps]}, that apply) timed side by side, each
    twice (in turn, then in reverse), appended to the log (policy records.CONFIRM, one heat id),
    and the task's best made the heat's winner. A task whose last heat came after its last search
    result, with every contender in it, is not timed again; one whose every timing failed gets its
    default's (a quick tune's one look refused on a busy host would leave the model no plan).
    Returns how many timings were taken.

    Why: every timing on a shared machine is noisy, and a task's best is the fastest of up to
    hundreds of them, taken minutes apart: where a timing that came out too fast ends up, or
    one taken in a minute when the host ran fast. Such a kernel misleads the plan and the
    estimate, and the model it goes into is slower than promised, even slower than its default
    schedules (docs/history.md). The heat's builds are cached; it costs a few seconds a task."""
    contents = records.load(log, warn=False)
    t0, timed = time.perf_counter(), 0
    with CpuRunner(tgt, config) as runner:
        for s in tasks:
            recs = [r for r in contents.applicable(s.workload.key, str(tgt)) if r.cold == config.times_cold(s.workload)]
            task = Task(s.workload, tgt)
            others = [c for c in map(task.applied, (contenders or {}).get(s.workload.key, [])) if c is not None]
            winner = records.heat_winner(recs)
            if not recs or (winner is not None and {c.code_hash for c in others} <=
                            {r.code_hash for r in recs if r.heat == winner.heat}):
                s.best = records.best_of(recs) or s.best       # the heat's winner, as the compile takes it
                continue
            cands = [task.candidate(r.steps, decisions=r.decisions)
                     for r in records.fastest_that_replay(recs, CONFIRM_TOP)]
            for c in [task.default_candidate()] + others:
                if c.code_hash not in {x.code_hash for x in cands}:
                    cands.append(c)
            heat = uuid.uuid4().hex[:16]
            new = [records.make_record(s.workload, tgt, cand.steps, res, cand.code_hash, records.CONFIRM, seed,
                                       cand.decisions, heat=heat)
                   for cand, res in runner.measure(task, cands + cands[::-1])]
            records.append(log, new)
            timed += len(new)
            s.best = records.best_of(recs + new) or s.best
    if timed and progress:
        print(f"confirmed: {timed} timings of front-runners and default schedules side by side in "
              f"{time.perf_counter() - t0:.1f} s; each task keeps the fastest there by its slower timing", flush=True)
    return timed


def cold_prices(tasks, tgt, known: dict | None = None, progress: bool = True,
                config: RunConfig | None = None) -> dict:
    """{workload key: (code hash, seconds)} for each task with constant inputs (weights, biases) and
    a best record timed warm: that kernel timed with the constants evicted from every cache before
    each call (RunConfig.cold_weights), as a compiled model meets them. An entry of `known` (the
    log's last plan) for the same code is reused, so a resumed tune with nothing new re-times nothing."""
    known = known or {}
    todo = [s for s in tasks if s.best is not None and not s.best.cold and s.workload.constant_inputs]
    out = {s.workload.key: known[s.workload.key] for s in todo
           if known.get(s.workload.key, (None,))[0] == s.best.code_hash}
    todo = [s for s in todo if s.workload.key not in out]
    t0 = time.perf_counter()
    with CpuRunner(tgt, dataclasses.replace(config or RunConfig(), cold_weights=True)) as runner:
        for s in todo:
            task = Task(s.workload, tgt)
            for cand, res in runner.measure(task, [task.candidate(s.best.steps)]):
                if res.ok:
                    out[s.workload.key] = (cand.code_hash, res.latency)
    if todo and progress:
        print(f"cold prices: {len(todo)} kernels timed again with their weights evicted in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    return out


class MinorTasks:
    """The FirstLookCut of a tune of first looks only (MINOR_PROBE and the rest above)."""

    def __init__(self, pairs: list):
        self.flops = sum(wl.flops * w for wl, w in pairs)
        self.cut: dict = {}          # workload key -> its best x occurrences when its look was cut

    def probe(self, tasks: list, k: int) -> int:
        s = tasks[k]
        return 0 if s.workload.flops * s.weight >= MAJOR_FLOPS * self.flops else MINOR_PROBE

    def go_on(self, tasks: list, k: int) -> bool:
        s, total = tasks[k], self.total(tasks)
        mine = s.best_latency * s.weight
        if not math.isfinite(mine) or mine >= MINOR_SHARE * total or sum(self.cut.values()) + mine >= MINOR_TOTAL * total:
            return True
        self.cut[s.workload.key] = mine
        return False

    @staticmethod
    def total(tasks: list) -> float:
        """The model's time so far: each measured task's best x occurrences."""
        return sum(t.best_latency * t.weight for t in tasks if math.isfinite(t.best_latency))

    def describe(self, tasks: list) -> str:
        share = sum(self.cut.values()) / self.total(tasks) if self.cut else 0.0
        n = len(self.cut)
        return f"{n} minor task{'s' if n != 1 else ''} ({100 * share:.1f}% of the model together) measured " \
               f"{MINOR_PROBE} candidates each"


def quick_tune(model, per_task: int, log: str, layout: str | None = None, input_shapes: dict | None = None,
               plan_logs=(), use_shipped: bool = True, **kwargs) -> ModelTuneResult:
    """`tuner compile --quick N`: a model tune in which every task has its first look only, N
    candidates: the default schedule, its record for another thread count, and what the cost model
    (the shipped pre-trained one) ranks first; FIRST_LOOK's fixed looks up to N (a Winograd GEMM's
    16 price a layout a tune may drop, and a quick tune's plan is fixed); a minor task's look stops
    after its default and one more (MinorTasks). The tasks
    are those of the layout plan the compile would apply (`plan_logs`, `log`, then the shipped
    database; one of another thread count too), else of the default plan (`layout` None: the
    compile's, graph.layout_plan.default_plan) or of `layout` alone; where that compile pads conv
    channels (graph.layout_plan.padded_graph), the padded graph's, and the model's own checks follow
    (padded_checks). A plan found marked padded compiles so (its Winograd convs, the rest padded in
    `layout`), and is tuned so. Resumes like any tune: a log that holds as many records for the tasks
    measures nothing new."""
    from .compiler.compile_model import DEFAULT_LAYOUT
    t0 = time.perf_counter()
    given = layout
    graph = source = model if isinstance(model, Graph) else load(str(model), input_shapes)
    tgt = parse_target(kwargs.get("target", "cpu"), kwargs.get("threads"))
    found, where = Database.open([p for p in [*plan_logs, log] if Path(p).exists()], tgt, use_shipped,
                                 missing="skip", warn=False).plan(graph_digest(graph), tgt, graph_structure(graph))
    unpadded = found is not None and not found.padded
    if unpadded:
        plan = found.layouts
    elif found is not None:     # a padded plan compiles as no plan does, with its own Winograd convs
        plan = winograd_convs(found.layouts)
    else:           # what the compile applies with no plan: the default one, unless a layout is given
        plan = {} if layout else default_plan(graph, DEFAULT_LAYOUT, tgt.lanes)
    layout = layout or DEFAULT_LAYOUT
    layouts = (layout, *sorted(set(plan.values()) - {layout}))
    keep = True
    if not unpadded:    # the convs the plan leaves out run in `layout`, as the compile runs them
        if (padded := padded_graph(graph, layout, plan, tgt.lanes)) is not None:
            graph, keep = padded, False     # the compile pads them: its tasks, and a plan marked padded
        plan = {v: plan.get(v, layout) for v in model_layouts(graph, layouts, tgt.lanes).domains}
    res = tune_model(graph, None, log, layouts=layouts, plan=plan, warmup_batch=per_task, record_plan=keep,
                     look_cap=per_task, **kwargs)
    limit = kwargs.get("time_limit")
    if not keep and given is None and measured_here(kwargs) \
            and not res.session.interrupted and (limit is None or time.perf_counter() - t0 < limit) \
            and not (found is not None and found.padded and where == str(log) and not res.session.new):
        name = source.name if isinstance(model, Graph) else str(model)     # (else the log's verdicts stand)
        res = padded_checks(source, name, res, found, plan, layouts, log, tgt, use_shipped,
                            kwargs.get("progress", True))
    return res


def measured_here(kwargs: dict) -> bool:
    """Whether a tune with these options times on this host (a replayed tune's costs are another
    machine's, a cluster's or a runner's its workers')."""
    return not (kwargs.get("replay") or kwargs.get("runner") or kwargs.get("cluster"))


def padded_checks(graph: Graph, name: str, res: ModelTuneResult, found, plan: dict, candidates: tuple, log: str,
                  tgt, use_shipped: bool = True, progress: bool = True) -> ModelTuneResult:
    """A quick tune of a model whose compile pads conv channels measured the padded graph's tasks,
    and solved no plan of the model to check whole: the model compiled as the compile pads it (the
    Winograd convs of `plan`, its plan of the padded graph) with the log's records, its tasks beside
    their defaults in the model (in_model_defaults), then whole against its untuned compile
    (untuned_check), the verdicts kept in a plan line of the model marked padded (the plan found's,
    with its choices, else `plan`'s). Without them a quick log can run slower whole than no log
    (docs/history.md). use_shipped: whether the compiles checked take the shipped records."""
    est = res.estimate_s if math.isfinite(res.estimate_s) else (found.estimate_s if found is not None else None)
    if est is None:
        return res
    names = {n.name for n in graph.nodes}
    layouts = dict(found.layouts) if found is not None else {k: v for k, v in plan.items() if k in names}
    as_compiled = winograd_convs(layouts)
    choices = dict(found.choices) if found is not None else {}
    on = {k: v["on"] for k, v in choices.items()}
    defaults = in_model_defaults(graph, log, tgt, as_compiled, on, progress, use_shipped=use_shipped)
    untuned = untuned_check(graph, log, tgt, as_compiled, on, defaults, progress, use_shipped=use_shipped)
    exact = res.plan.exact if res.plan is not None else True
    rec = records.make_plan_record(name, graph_digest(graph), str(tgt), layouts, est, exact, candidates, None, None, None,
                                   "warm", graph_structure(graph), choices,
                                   {v.name: list(v.shape) for v in graph.inputs}, False, {}, anonymous_structure(graph),
                                   True, defaults, untuned["ratio"] <= UNTUNED_MARGIN)
    records.append(log, [rec])
    return dataclasses.replace(res, record=rec, appended=True, padded=True, untuned_check=untuned)


CHOICE_ROUNDS = 5          # interleaved rounds timing each graph choice (GRAPH_CHOICES) both ways


def open_choices(graph: Graph, layouts: dict) -> list:
    """The GRAPH_CHOICES that change how this graph's nodes group into kernels."""

    def groups(**opts) -> list:
        return [tuple(grp.nodes) for grp in optimize(graph, layout_plan=layouts or None, **opts).meta["fused_groups"]]
    base = groups()
    return [c for c in GRAPH_CHOICES if groups(**{c: True}) != base]


def whole_times(built: dict, rounds: int = CHOICE_ROUNDS) -> dict:
    """{name: [seconds per round]} of compiled models ({name: CompiledModel}) timed interleaved on
    the same random inputs (with no pause between turns: their steps run on one OpenMP pool)."""
    inputs = next(iter(built.values())).random_inputs()
    return interleaved({k: (lambda xs, m=m: m.run(*xs)) for k, m in built.items()}, inputs, rounds, settle=0.0)


def _whole_times(built: dict) -> dict:
    """{name: median seconds} of whole_times."""
    return {k: statistics.median(v) for k, v in whole_times(built).items()}


def time_choices(graph: Graph, log: str, tgt, layouts: dict, progress: bool = True) -> dict:
    """{choice: {"on": faster on, "s": [median seconds on, off]}}: each open choice's two compiles
    (with the log's records and `layouts`) timed interleaved on random inputs, CHOICE_ROUNDS rounds."""
    from .compiler import compile_model
    out = {}
    for c in open_choices(graph, layouts):
        built = {v: compile_model(graph, log=log, target=str(tgt), layout_plan=layouts or {}, **{c: v})
                 for v in (True, False)}
        times = _whole_times(built)
        on, off = times[True], times[False]
        out[c] = {"on": on < off, "s": [on, off]}
        if progress:
            print(f"{c}: {on * 1e3:.2f} ms on, {off * 1e3:.2f} ms off -> {'on' if on < off else 'off'}", flush=True)
    return out


def one_layout_plan(space: ModelLayouts, layouts, prices: dict):
    """The plan that runs every convolution in one layout (the compile's default where the tune has
    it, else its first plain layout; a conv whose domain lacks it keeps its own), solved under
    `prices`; None without a plain layout or a finite estimate."""
    from .compiler.compile_model import DEFAULT_LAYOUT
    plain = [lay for lay in layouts if "@" not in lay]
    if not plain:
        return None
    base = DEFAULT_LAYOUT if DEFAULT_LAYOUT in plain else plain[0]
    plan, est = space.restricted({v: base for v in space.domains}).plan(prices)
    return plan if plan is not None and math.isfinite(est) else None


def default_layout_plan(space: ModelLayouts, graph: Graph, layouts, prices: dict, lanes: int):
    """The plan an untuned compile applies (graph.layout_plan.default_plan: its Winograd convs, the
    rest in the compile's default layout), solved under `prices`; None where the tune lacks one of
    its layouts or no finite estimate exists."""
    from .compiler.compile_model import DEFAULT_LAYOUT
    wino = default_plan(graph, DEFAULT_LAYOUT, lanes)
    if DEFAULT_LAYOUT not in layouts or any(lay not in layouts for lay in wino.values()):
        return None
    plan, est = space.restricted({v: wino.get(v, DEFAULT_LAYOUT) for v in space.domains}).plan(prices)
    return plan if plan is not None and math.isfinite(est) else None


def check_plan(graph: Graph, log: str, tgt, plans: dict, progress: bool = True) -> dict:
    """{name: median seconds} of the model compiled with each of `plans` ({name: layout plan}) and the log's
    records, timed interleaved on random inputs, CHOICE_ROUNDS rounds. A plan is solved from each
    kernel's time alone; in the model, where caches hold what the step before left, a layout's
    kernels can lose what they won alone (MobileNetV2's first three convs in NCHW8c: 0.22 ms in the
    model against 0.13 in NCHW16c at 2 threads, docs/history.md)."""
    from .compiler import compile_model
    out = _whole_times({k: compile_model(graph, log=log, target=str(tgt), layout_plan=p) for k, p in plans.items()})
    if progress:
        print("layout plan in the model: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in out.items()), flush=True)
    return out


UNTUNED_ROUNDS = 7             # interleaved rounds timing the tuned model against its untuned compile, whole
UNTUNED_MARGIN = 0.98          # the untuned compile is kept where it took at most this share of the tuned one's time


def untuned_check(graph: Graph, log: str, tgt, layouts: dict, choices: dict, defaults: dict,
                  progress: bool = True, use_shipped: bool = True) -> dict:
    """{"tuned", "untuned": median seconds, "ratio": the median of each round's untuned / tuned}: the model
    compiled as the tune leaves it (`layouts`, `choices` {choice: on}, the log's records but `defaults`,
    in_model_defaults) and as `tuner compile` compiles it with no log, timed whole, interleaved,
    UNTUNED_ROUNDS rounds. Every check before this one compares the tune's records with each other or
    with their defaults; a model whose records each won where they were timed can still run slower
    whole than its untuned compile (ResNet-50 tuned 3000 trials at 2 threads: docs/history.md)."""
    from .compiler import compile_model
    built = {"tuned": compile_model(graph, log=log, target=str(tgt), layout_plan=layouts, in_model=defaults,
                                    use_shipped=use_shipped, **choices),
             "untuned": compile_model(graph, target=str(tgt), use_shipped=use_shipped)}
    times = whole_times(built, UNTUNED_ROUNDS)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["ratio"] = statistics.median(paired_ratios(times["untuned"], times["tuned"]))
    if progress:
        kept = "the untuned compile" if out["ratio"] <= UNTUNED_MARGIN else "the tuned plan"
        print(f"the whole model as tuned {out['tuned'] * 1e3:.2f} ms, untuned {out['untuned'] * 1e3:.2f} ms "
              f"({out['ratio']:.3f}x paired): {kept} kept", flush=True)
    return out


IN_MODEL_ROUNDS, IN_MODEL_RUNS = 7, 10     # rounds of whole runs of each compile timing the tuned records in the model
IN_MODEL_MARGIN = 0.97         # a default replaces its task's record where it took at most this share of its time


def in_model_defaults(graph: Graph, log: str, tgt, layouts: dict, choices: dict, progress: bool = True,
                      use_shipped: bool = True) -> dict:
    """{workload key: its best record's code hash} for each task whose default schedule ran in at
    most IN_MODEL_MARGIN of that record's time where it runs: the model compiled with `layouts`
    and `choices` ({choice: on}) twice, with the log's records and with every task on its default
    schedule, each step timed in context (CompiledModel.profile), the two in turn, IN_MODEL_ROUNDS
    rounds, paired per task. A record is timed alone, and in a model at 2 threads a third of
    ResNet-50's tuned records ran slower than their defaults, each thread reading what the other
    core's step had written (docs/history.md)."""
    from .compiler import compile_model
    opts = dict(log=log, target=str(tgt), layout_plan=layouts, use_shipped=use_shipped, **choices)
    tuned = compile_model(graph, **opts)
    default = compile_model(graph, choose=lambda task: task.space.steps(task.space.default()), **opts)
    keys = [s.workload_key for s in tuned.steps]
    if keys != [s.workload_key for s in default.steps]:
        return {}
    differ = [i for i, (a, b) in enumerate(zip(tuned.steps, default.steps))
              if a.workload_key is not None and a.code_hash != b.code_hash and a.source not in UNTUNED]
    if not differ:
        return {}
    times, _ = interleaved_profiles({"tuned": tuned, "default": default}, tuned.random_inputs(seed=1),
                                    IN_MODEL_ROUNDS, IN_MODEL_RUNS)
    t, d = times["tuned"], times["default"]
    steps = {}                                   # workload key -> its steps whose code differs
    for i in differ:
        steps.setdefault(keys[i], []).append(i)
    out = {key: tuned.steps[idx[0]].code_hash for key, idx in steps.items()
           if float(np.median(d[:, idx].sum(1) / t[:, idx].sum(1))) <= IN_MODEL_MARGIN}
    if progress:
        print(f"in the model: {len(out)} of {len(steps)} tuned tasks ran slower than their default schedules "
              "where they run; the plan runs those defaults", flush=True)
    return out


def tune_model(model, trials: int | None, log: str | None = None, target: str = "cpu", threads: int | None = None,
               layouts=DEFAULT_CHOICES, input_shapes: dict | None = None, warmup_batch: int = 4,
               batch_size: int = 16, policy: str = "evolutionary", weights: str = WEIGHTS[0],
               plan: dict | None = None, contenders: dict | None = None, name: str | None = None,
               handover=None, record_plan: bool = True, look_cap: int | None = None, **kwargs) -> ModelTuneResult:
    """Tune a built-in model, an ONNX file or a Graph until `trials` records exist for its tasks in
    `log`, its weighted tasks timed with their weights cold or warm (`weights`, see the module's
    doc), time each task's front-runners a second time (confirm_bests), and append the layout
    plan to the log, solved with those prices; a task whose best was
    timed warm is also priced cold (cold_prices; not for replayed costs or a stopped tune), which
    with weights="cold" is what the plan uses. Other options as tuning.tune (run_config's
    cold_weights is set by `weights`). plan: {conv or dense node: layout} fixes the nodes it names
    to those layouts (compile --quick tunes the plan the compile will apply; record_plan=False: no
    plan checked or appended, for a compile that applies its own). trials=None: every
    task's first look only (FIRST_LOOK's, at most `look_cap` where given, else `warmup_batch`
    candidates; a minor task's stops after MINOR_PROBE: MinorTasks). contenders: {workload
    key: [steps]} timed in its task's heat too (tune_dynamic: the schedules of a larger bucket).
    name: the model's name in the plan (default: the built-in name or path; a Graph's own name).
    handover: (tasks, RunConfig, log, the last plan's ends) -> the plan's `ends`, after the heats
    (tune_dynamic's handovers); untimed, the last plan's stay."""
    t0 = time.perf_counter()
    if weights not in WEIGHTS:
        raise UserError(f"--weights {weights!r} is not one of {', '.join(WEIGHTS)}")
    for lay in layouts:
        check_choice(lay)
    graph = model if isinstance(model, Graph) else load(str(model), input_shapes)
    name = name or (graph.name if isinstance(model, Graph) else str(model))
    tgt = parse_target(target, threads)
    if tgt.kind != "cpu":
        raise UserError(f"tuning a whole model runs on CPU targets in this version, not {tgt.kind}: tune its "
                        "operators with --workload, or use --target cpu")
    space = model_layouts(graph, tuple(layouts), tgt.lanes).restricted(plan or {})   # plan: the convs it names fixed
    pairs = space.workloads()
    looks = {op: n if look_cap is None else min(n, look_cap) for op, n in FIRST_LOOK.items()}
    looks_only = trials is None
    if looks_only:              # first looks only (compile --quick): the largest share of the model's
        pairs.sort(key=lambda p: -p[0].flops * p[1])     # FLOPs first, so that a time limit cuts the least
        trials = sum(looks.get(wl.op, warmup_batch) for wl, _ in pairs)
    if trials < len(pairs):
        raise UserError(f"--trials {trials} is less than the {len(pairs)} tasks of {name} in layouts "
                        f"{', '.join(layouts)}: give at least {len(pairs)} (one measurement each; "
                        f"{len(pairs) * warmup_batch} or more to tune) or fewer --layouts")
    fixed = [wl.op for wl, _ in pairs if wl.op in looks]
    if trials - sum(looks[op] for op in fixed) < len(pairs) - len(fixed):   # too few trials: one look each
        looks = dict.fromkeys(looks, 1)
    left = trials - sum(looks[op] for op in fixed)          # for the other tasks' first looks
    warm = max(1, min(warmup_batch, left // max(1, len(pairs) - len(fixed))))

    def first_look(wl) -> int:
        return looks.get(wl.op, warm)
    log = log or f"logs/{name.replace('/', '_').removesuffix('.onnx')}.jsonl"

    first: list = []                     # (trials, estimate) when the plan first had a finite estimate

    def on_round(tasks):
        plan, est = space.plan(_latencies(tasks))
        if plan is None or not math.isfinite(est):
            return (None if plan is None else _weights(space, plan, tasks)), "estimate: - (first looks)"
        done = sum(t.trials for t in tasks)
        if not first:
            first.append((done, est))
        trend = f" ({100 * (est / first[0][1] - 1):+.1f}% since trial {first[0][0]})" if done > first[0][0] else ""
        return _weights(space, plan, tasks), (f"estimated model {est * 1e3:.2f} ms{trend}, "
                                              f"{plan_summary(plan.layouts)}")

    config = dataclasses.replace(kwargs.pop("run_config", None) or RunConfig(), cold_weights=weights == "cold")
    minor = MinorTasks(pairs) if looks_only else None
    session = tune(pairs, target=tgt, trials=trials, log=log, policy=policy, batch_size=batch_size,
                   scheduler="gradient", warmup_batch=first_look, run_config=config,
                   callbacks=[RoundHook(on_round)], first_look_cut=minor, **kwargs)
    if minor is not None and minor.cut and kwargs.get("progress", True):
        print(f"first looks: {minor.describe(session.tasks)}", flush=True)
    here = measured_here(kwargs)
    if here and not session.interrupted:
        confirm_bests(session.tasks, tgt, log, config, kwargs.get("progress", True), kwargs.get("seed", 0),
                      contenders)
    prices = _latencies(session.tasks)
    plan, est = space.plan(prices)
    other, other_est = None, math.inf
    cold: dict = {}
    cold_est = None
    logged = records.load(log, warn=False)          # its plans: the last one's cold prices, and no copy of it
    if plan is not None and math.isfinite(est) and here and not session.interrupted:
        last = logged.plan(graph_digest(graph), str(tgt), graph_structure(graph))
        cold = cold_prices(session.tasks, tgt, last.cold if last else None, kwargs.get("progress", True), config)
        cold_best = dict(prices, **{k: s for k, (_, s) in cold.items()})
        if weights == "cold":       # cold already, but for the warm bests of an older log, priced just now
            prices = cold_best
            plan, est = space.plan(prices)
        else:
            other, other_est = space.plan(cold_best)
        cold_est = space.estimate(plan.layouts, cold_best) if cold else None   # (what the plan line keeps)
    rec, appended, checked, padded, untuned = None, False, {}, False, {}
    if plan is not None and math.isfinite(est) and record_plan:
        # the host's peak goes with the plan (for `tuner analyze`'s fraction of peak)
        peak = peak_gflops(tgt, tgt.threads, 5_000_000) if here else None
        limit = kwargs.get("time_limit")
        timed = here and not session.interrupted and (limit is None or time.perf_counter() - t0 < limit)
        last = logged.plan(graph_digest(graph), str(tgt))
        from .compiler.compile_model import DEFAULT_LAYOUT
        rivals = {"one layout": one_layout_plan(space, layouts, prices),
                  "default": default_layout_plan(space, graph, layouts, prices, tgt.lanes)} if timed else {}
        wino = default_plan(graph, DEFAULT_LAYOUT, tgt.lanes) if rivals.get("default") is not None else None
        pads = wino is not None and padded_graph(graph, DEFAULT_LAYOUT, wino, tgt.lanes) is not None
        contest = {"joint": (plan, plan.layouts)}       # name -> (plan, the layouts it compiles with)
        for k, p in rivals.items():
            if k == "default" and pads:                 # as the untuned compile: its channels padded
                contest[k] = (p, wino)
            elif p is not None and all(p.layouts != c for _, c in contest.values()):
                contest[k] = (p, p.layouts)
        as_compiled = plan.layouts
        if len(contest) > 1:
            # the solved plan against one layout and the untuned compile's plan, whole: the fastest
            # in the model is the plan
            checked = check_plan(graph, log, tgt, {k: c for k, (_, c) in contest.items()}, kwargs.get("progress", True))
            best = min(checked, key=checked.get)
            (plan, as_compiled), padded = contest[best], best == "default" and pads
            est = space.estimate(plan.layouts, prices)
            cold_est = space.estimate(plan.layouts, cold_best) if cold else cold_est
        # untimed (replayed, stopped, out of time): the choices the log's plan had timed stay
        choices = time_choices(graph, log, tgt, as_compiled, kwargs.get("progress", True)) if timed \
            else dict(last.choices) if last is not None else {}
        known = dict(last.ends) if last is not None else {}
        ends = handover(session.tasks, config, log, known) if handover is not None and timed else known
        on = {k: v["on"] for k, v in choices.items()}
        defaults = in_model_defaults(graph, log, tgt, as_compiled, on, kwargs.get("progress", True)) if timed \
            else dict(last.defaults) if last is not None and last.layouts == plan.layouts else {}
        dynamic = bool(graph.meta.get("dynamic"))
        if timed and not dynamic:       # (a bucket's plan serves a range: compile --dynamic reads it)
            untuned = untuned_check(graph, log, tgt, as_compiled, on, defaults, kwargs.get("progress", True))
            lost = untuned["ratio"] <= UNTUNED_MARGIN
        else:       # untimed: the last verdict stands only where nothing new was measured
            lost = not dynamic and last is not None and last.untuned and last.layouts == plan.layouts \
                and not session.new
        rec = records.make_plan_record(name, graph_digest(graph), str(tgt), plan.layouts, est, plan.exact,
                                       tuple(layouts), peak, cold, cold_est, weights, graph_structure(graph), choices,
                                       {v.name: list(v.shape) for v in graph.inputs}, dynamic,
                                       ends, anonymous_structure(graph), padded, defaults, lost,
                                       graph.meta.get("run_time", ()))
        same_choices = last is not None and {k: v["on"] for k, v in last.choices.items()} == \
            {k: v["on"] for k, v in rec.choices.items()}       # the times differ run to run; the choices, not
        if last is None or dataclasses.replace(last, timestamp=rec.timestamp, tool=rec.tool, peak_gflops=rec.peak_gflops,
                                               choices=rec.choices if same_choices else last.choices) != rec:
            records.append(log, [rec])          # a tune run again after its end adds no copy of its plan
            appended = True
    return ModelTuneResult(name, space, session, plan, est, rec, prices, other, other_est, appended, checked, padded,
                           untuned)


def tune_dynamic(model: str, dynamic, trials: int, buckets: list | None = None, input_shapes: dict | None = None,
                 time_limit: float | None = None, histogram: str | None = None, **kwargs) -> list:
    """Tune an ONNX model compiled for a range of shapes (graph.dynamic): a model tune (tune_model)
    at its bound and at each bucket of its one varying dimension, into one log, where `tuner
    compile --dynamic` finds the buckets (their plans) and takes each task's record per bucket.
    Buckets: `buckets`, else cut from the `histogram` file of the values a deployment sees
    (graph.dynamic.histogram_buckets), else graph.dynamic.default_buckets. `trials` (and
    `time_limit`) are shared by each bucket's share of the time (graph.dynamic.shares); a bucket
    whose share is below its task count gets every task's first look. With several varying
    dimensions and no buckets or histogram, the bound only. The bound is tuned first,
    then each bucket downwards, and each task's heat (confirm_bests) times the schedule of the
    bucket above beside its own front-runners: where that wins, the bucket needs no version of its
    own, which the compile sees as the same code there. A tune that is stopped stops the rest.
    [(value, ModelTuneResult)], smallest value first."""
    from .graph.dynamic import histogram_buckets, load_at, load_range, parse_dynamic, read_histogram, shares
    from .graph.onnx_frontend import input_dims
    dyn = parse_dynamic(dynamic, input_dims(str(model)))
    run_time = load_range(str(model), dyn, input_shapes)[1]      # what the compile computes at run time: its graphs
    moving = [s.name for s in dyn.symbols if s.lo < s.hi]
    if len(moving) > 1 and buckets is None and histogram is None:
        # buckets are values of one dimension: with several varying, the bound's tune serves the range
        if kwargs.get("progress", True):
            print(f"{len(moving)} dims vary ({', '.join(moving)}): tuning at their bounds only, which serve every "
                  "shape in the range; fix all but one with --input-shape to tune buckets of it", flush=True)
        k, values = next(k for k, s in enumerate(dyn.symbols) if s.lo < s.hi), []
    else:
        k, values = dyn.buckets(buckets)
    sym = dyn.symbols[k]
    hist = read_histogram(histogram, sym) if histogram else None
    if hist is not None and buckets is None:
        values = histogram_buckets(hist, sym)
    values = values + [sym.hi]
    out, above = [], None
    opts = {o: kwargs[o] for o in ("layouts", "target", "threads", "progress", "seed") if o in kwargs}
    lanes = parse_target(kwargs.get("target", "cpu"), kwargs.get("threads")).lanes   # the tasks its tunes run
    for v, share in sorted(zip(values, shares(values, sym, hist)), reverse=True):
        graph = load_at(str(model), dyn.shapes(dyn.at(k, v), input_shapes), run_time)
        pairs = model_layouts(graph, tuple(kwargs.get("layouts", DEFAULT_CHOICES)), lanes).workloads()
        n = round(trials * share)
        first_looks = n < len(pairs)        # every task's first look, whatever its share of the time
        contenders = _contenders(above, pairs)
        over = None if above is None else \
            lambda tasks, config, log, known, v=v, va=out[-1][0], pairs=pairs, them=contenders: handovers(
                str(model), dyn, k, (v, va), tasks, pairs, them, input_shapes, config, log, known, run_time=run_time, **opts)
        if above is not None and not contenders and kwargs.get("progress", True):
            print(f"at {sym.name}={v * sym.step}: its tasks do not pair with those at {out[-1][0] * sym.step}, whose "
                  f"schedules are not timed here; each version tuned here serves up to {v * sym.step}", flush=True)
        res = tune_model(graph, None if first_looks else n,
                         time_limit=time_limit * share if time_limit and not first_looks else None,
                         contenders=contenders, name=str(model), handover=over, **kwargs)
        out.append((v, res))
        above = res
        if res.session.interrupted:
            break
    return out[::-1]


HANDOVER_PROBES = (1, 2, 3)    # quarters of the way from a bucket to the one above, where handovers time both


def handovers(model: str, dyn, k: int, values: tuple, tasks, pairs: list, contenders: dict, input_shapes: dict | None,
              config: RunConfig, log: str, known: dict | None = None, layouts=DEFAULT_CHOICES, target: str = "cpu",
              threads: int | None = None, progress: bool = True, seed: int = 0, run_time: frozenset = frozenset()) -> dict:
    """{workload key at bucket v: {"upto": the largest value up to which its best kernel serves,
    "code", "above": the code hashes at v of that kernel and of the one above it}}: where a
    bucket's version hands over to the version above (`contenders`, _contenders' best of each task
    at va), measured. At each probe between v and va (HANDOVER_PROBES quarters), upwards, each
    task's best at v and its pair's best at va are replayed on the task there and timed side by side, each twice (in turn, then in
    reverse), as static kernels; a task's end is the last probe before the first where the kernel
    of va is as fast or faster by their slower timings (so v itself where it wins at once). The
    timings go to the log (policy records.HANDOVER). A task whose two kernels give the same code at
    v is not named (the compile keeps no version for it); one whose pair of codes `known` (the last
    plan's ends) names is not timed again."""
    from .graph.dynamic import load_at
    v, va = values
    mine = {s.workload.key: s.best for s in tasks}
    tgt = parse_target(target, threads)
    ends, live = {}, {}              # live: position -> (key at v, steps at v, steps at va)
    for j, (a, _) in enumerate(pairs):
        lo, hi = mine.get(a.key), contenders.get(a.key, [None])[0]
        if lo is None or hi is None:
            continue
        task = Task(a, tgt)
        codes = (task.code(lo.steps), task.code(hi))
        if None in codes or codes[0] == codes[1]:
            continue
        ends[a.key] = {"upto": v, "code": codes[0], "above": codes[1]}
        was = (known or {}).get(a.key)
        if was is not None and (was["code"], was["above"]) == codes:
            ends[a.key] = was
        else:
            live[j] = (a.key, lo.steps, hi)
    probes = sorted({v + (va - v) * q // 4 for q in HANDOVER_PROBES} - {v, va})
    t0, timed = time.perf_counter(), 0
    with CpuRunner(tgt, config) as runner:
        for x in probes:
            if not live:
                break
            try:
                here = model_layouts(load_at(model, dyn.shapes(dyn.at(k, x), input_shapes), run_time),
                                     tuple(layouts), tgt.lanes).workloads()
            except (ValueError, UserError):        # the model does not import there: its ends stay below
                break
            if not _paired(pairs, here):
                break
            for j, (key, lo_steps, hi_steps) in list(live.items()):
                task = Task(here[j][0], tgt)
                lo, hi = task.applied(lo_steps), task.applied(hi_steps)
                if lo is None or hi is None:
                    del live[j]
                    continue
                if lo.code_hash == hi.code_hash:     # one kernel here: either serves
                    ends[key]["upto"] = x
                    continue
                heat = uuid.uuid4().hex[:16]
                got = [(c, r) for c, r in runner.measure(task, [lo, hi, hi, lo])]
                records.append(log, [records.make_record(task.workload, tgt, c.steps, r, c.code_hash,
                                                         records.HANDOVER, seed, heat=heat) for c, r in got])
                timed += len(got)
                slower = {h: max(r.latency if r.ok else math.inf for c, r in got if c.code_hash == h)
                          for h in (lo.code_hash, hi.code_hash)}
                if slower[lo.code_hash] < slower[hi.code_hash]:
                    ends[key]["upto"] = x
                else:
                    del live[j]
    if timed and progress:
        print(f"handovers: {timed} timings between {v} and {va} in {time.perf_counter() - t0:.1f} s; "
              f"{sum(e['upto'] > v for e in ends.values())} of {len(ends)} kernels at {v} serve past it", flush=True)
    return ends


def _paired(pairs: list, theirs: list) -> bool:
    """Whether two task lists of one model at two values agree op by op, so that tasks pair by place
    (the model optimises to the same kernels at both)."""
    return len(theirs) == len(pairs) and all(a.op == b.op for (a, _), (b, _) in zip(pairs, theirs))


def _contenders(above, pairs: list) -> dict:
    """{workload key: [steps]}: the best schedule of each task of the tune `above` (a larger bucket)
    for the same task here, paired by their place in the model's task list, which agree op by op
    where the model optimises to the same kernels at both values (else {})."""
    if above is None:
        return {}
    theirs = above.space.workloads()
    if not _paired(pairs, theirs):
        return {}
    best = {s.workload.key: s.best for s in above.session.tasks}
    return {a.key: [best[b.key].steps] for (a, _), (b, _) in zip(pairs, theirs) if best.get(b.key) is not None}
