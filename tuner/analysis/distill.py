"""Distil logs into a best-schedule database: one best valid record per workload and target.

The fastest logged record is the minimum over many noisy measurements, so it is biased towards a
schedule that was timed in a lucky moment (the winner's curse; docs/history.md has a case). With
`remeasure=K`, the K fastest
distinct schedules of each task this host can run, and this version's default schedule, are timed
again, interleaved over `rounds` rounds, as their records were timed (weights cold where they were:
Record.cold), and the one with the lowest median is kept; its record is that new measurement
(policy "remeasure", one cost per round), not the lucky old one. A record tuned against the
defaults of an older version can lose to this one's: the default's steps are then the record, so
that a compile takes them rather than a slower record of another file (records.shipped_databases).

A task none of whose records replay (code an older version generated differently) keeps its
fastest record as it is, stale, unless `retime_stale`: then, where this host can run it, its
steps are built as this version's code and timed (policy "retimed", the new code's hash).

A record whose workload key is not the one this version gives its spec and layout (an operator
redefined, such as the Winograd GEMM over one axis of tiles) can apply to no compile: distill
leaves it out and warns with the count; tune those workloads again.

A layout plan is solved against the defaults of its day too: with `check_plans`, each model's
plan that this host can run is timed whole against the untuned compile's plan, both with the
records kept, and the faster stays (recheck_plan): a plan an older version tuned can lose to a
newer version's default plan, and a compile applies a file's plan before any default.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import os
import statistics
import warnings

from .. import __version__
from ..build import Kernel
from ..database import records
from ..errors import UserError
from ..ops import parse_spec
from ..target import ISAS, host_cores, host_isa, host_kind, parse_target
from ..task import Task


@functools.lru_cache(maxsize=None)
def _key_now(spec: str, layout: str) -> str | None:
    """The workload key this version gives `spec` in `layout` (None: it reads no such workload)."""
    try:
        return parse_spec(spec, layout).key
    except (UserError, ValueError):
        return None


def _disowned(rec) -> bool:
    """Whether this version gives `rec`'s spec and layout another workload key than its own."""
    now = _key_now(rec.workload.spec, rec.workload.layout)
    return now is not None and now != rec.workload.key


def _runnable_here(target: str, lower_isa: bool = False) -> bool:
    """Whether this host times code of `target`: its own ISA, or with `lower_isa` one below it too."""
    ct = records.code_target(target)
    return ct is not None and ct[0] == "cpu" and ct[2] <= host_cores() and \
        (ct[1] == host_isa() or lower_isa and ISAS[ct[1]][0] < ISAS[host_isa()][0])


def _host_field(rec: records.Record) -> dict:
    """The host field of `rec` timed again here: this host's kind for an ISA below this host's (a
    stand-in for that ISA's own hosts), else "" (the tuner's own host)."""
    ct = records.code_target(rec.target)
    stand_in = ct is not None and ct[1] != host_isa()
    return {"host": (host_kind() or f"unknown-{host_isa()}") if stand_in else ""}


def _timed(recs: list, rounds: int, default: bool = False) -> tuple:
    """(this version's kernel of each record's steps (one task), and with `default` of its default
    schedule last where no record builds the same code; each one's time per round, interleaved
    round by round, weights cold where the first record was timed so; their Task)."""
    first = recs[0]
    task = Task(parse_spec(first.workload.spec, first.workload.layout), parse_target(first.target, check_host=False))
    kernels = [Kernel(task, r.steps, r, None) for r in recs]
    if default:
        k = Kernel(task, task.space.steps(task.space.default()), None, None)
        if k.code_hash not in {x.code_hash for x in kernels}:
            kernels.append(k)
    x = task.workload.random_inputs(seed=1)
    times = [[] for _ in kernels]
    for _ in range(rounds):
        for k, t in zip(kernels, times):
            t.append(statistics.median(k.time(*x, repeat=3, min_repeat_ms=20.0, cold=first.cold)))
    return kernels, times, task


def _new_record(rec: records.Record, costs: list, policy: str, code_hash: str, **changes) -> records.Record:
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return dataclasses.replace(rec, costs=tuple(costs), code_hash=code_hash, timestamp=now, tool=f"tuner {__version__}",
                               policy=policy, replayed_from=None, build_s=0.0, run_s=0.0, **changes)


def remeasure(recs: list, rounds: int = 5) -> records.Record:
    """Time `recs` (schedules of one task, timed alike: all cold or all warm) and this version's
    default schedule again, interleaved round by round; the one with the lowest median, as a new
    record whose costs are its per-round times (the default's: of the first record's task, with
    the default's steps and decisions)."""
    kernels, times, task = _timed(recs, rounds, default=True)
    i = min(range(len(kernels)), key=lambda j: statistics.median(times[j]))
    if i < len(recs):
        return _new_record(recs[i], times[i], "remeasure", recs[i].code_hash, **_host_field(recs[i]))
    k = kernels[i]
    return _new_record(recs[0], times[i], "remeasure", k.code_hash, steps=k.steps, seed=None,
                       decisions=task.space.default(), heat="", **_host_field(recs[0]))


def retime(rec: records.Record, rounds: int = 5) -> records.Record:
    """`rec`'s steps built as this version's code and timed over `rounds` rounds: a new record of
    that code (its hash, one cost per round)."""
    (kernel,), (times,), _ = _timed([rec], rounds)
    return _new_record(rec, times, "retimed", kernel.code_hash, **_host_field(rec))


def distill(logs: list, out: str, remeasure_top: int = 0, rounds: int = 5, progress=None,
            retime_stale: bool = False, check_plans: bool = False, only_given: bool = False,
            lower_isa: bool = False) -> int:
    """Write the best record of every (workload, target) in `logs` and in `out` itself to `out`,
    and the newest layout plan of every (model, target); with remeasure_top=K, the best of the K
    fastest re-timed on this host where it can run them; a task with no record that replays keeps
    its fastest, re-timed as this version's code where retime_stale and this host can run it;
    with check_plans, each plan against the untuned compile's (recheck_plan), with the records kept.
    only_given: re-time (remeasure, retime_stale, check_plans) only the tasks and plans that `logs`
    hold; those only `out` holds keep their best record or plan as it is (refreshing some tasks of a
    shipped file). lower_isa: the records and plans of an ISA below this host's are timed here too
    (AVX2 code on an AVX-512 host), each new record naming this host (Record.host).
    Returns the number of records written."""
    by_task: dict = {}
    plans: dict = {}
    given: set = set()
    given_plans: set = set()
    disowned: dict = {}
    for i, path in enumerate(list(logs) + [out]):
        contents = records.load(path, warn=False)
        for rec in contents.records:
            if _disowned(rec):
                disowned.setdefault(rec.workload.spec.split(":")[0], set()).add(rec.task_key)
                continue
            by_task.setdefault(rec.task_key, []).append(rec)
            if i < len(logs):
                given.add(rec.task_key)
        for p in contents.plans:
            if p.untuned:           # its tune's records lost to the untuned compile: no plan to ship
                continue
            key = (p.model_hash, p.target)
            if key not in plans or p.timestamp > plans[key].timestamp:
                plans[key] = p
            if i < len(logs):
                given_plans.add(key)
    if disowned:
        warnings.warn(f"left out the records of {sum(map(len, disowned.values()))} task(s) whose workload this version "
                      f"defines otherwise ({', '.join(sorted(disowned))}: their keys changed); no compile applies them: "
                      "tune those workloads again", stacklevel=2)
    best = []
    for n, (key, recs) in enumerate(by_task.items(), 1):
        here = _runnable_here(recs[0].target, lower_isa) and (not only_given or key in given)
        # timed alike: those timed cold if any replays, else the warm ones (records.best_of); replaying
        # builds each record's code, so only for a task this host will time
        cands = remeasure_top > 0 and here and (
            records.fastest_that_replay([r for r in recs if r.cold], remeasure_top)
            or records.fastest_that_replay([r for r in recs if not r.cold], remeasure_top))
        if cands:
            b = remeasure(cands, rounds)
            if progress:
                rank = next((f"rank {k + 1} of {len(cands)}" for k, c in enumerate(cands) if c.code_hash == b.code_hash),
                            f"this version's default, beside {len(cands)} logged")
                progress(f"[{n}/{len(by_task)}] {b.workload.title} [{b.workload.layout}] {b.target}: "
                         f"best logged {cands[0].latency * 1e3:.3f} ms, kept {b.latency * 1e3:.3f} ms now ({rank})")
        else:
            b = records.best_of(recs)
        ok = [r for r in recs if r.ok]
        if b is None and ok:            # no record replays: the fastest, stale or re-timed as this code
            b = min(ok, key=lambda r: r.latency)
            if retime_stale and here:
                was, b = b.latency, retime(b, rounds)
                if progress:
                    progress(f"[{n}/{len(by_task)}] {b.workload.title} [{b.workload.layout}] {b.target}: "
                             f"logged {was * 1e3:.3f} ms as older code, {b.latency * 1e3:.3f} ms as this version's")
        if b is not None:
            best.append(b)
    ordered = sorted(best, key=lambda r: (r.target, r.workload.title, r.workload.layout))
    tmp = f"{out}.tmp"

    def write() -> None:
        if os.path.exists(tmp):
            os.remove(tmp)
        records.append(tmp, ordered + sorted(plans.values(), key=lambda p: (p.target, p.model, p.timestamp)))

    write()
    if check_plans:
        for key, p in sorted(plans.items(), key=lambda kv: (kv[1].target, kv[1].model)):
            if not only_given or key in given_plans:
                plans[key] = recheck_plan(p, tmp, max(rounds, 3), progress, lower_isa) or p
        write()
    os.replace(tmp, out)
    if os.path.exists(f"{tmp}.lock"):         # records.append's lock of the private temporary file
        os.remove(f"{tmp}.lock")
    return len(ordered)


def recheck_plan(plan: records.PlanRecord, log: str, rounds: int = 5, progress=None,
                 lower_isa: bool = False) -> records.PlanRecord | None:
    """The model of `plan` compiled with it and with `log`'s records, and compiled as an untuned
    compile is (the default plan's Winograd convs, the other convs in the default layout, channels
    padded: graph.layout_plan.default_plan) with the same records, timed whole, interleaved over
    `rounds` rounds on random inputs; where the untuned compile's plan is faster (the median of the
    paired ratios below 1), that plan as a line marked padded, its estimate the time measured.
    None where the plan stands or cannot be checked here: its target not runnable here, a dynamic
    plan, a model that is no built-in one or file here, or another version of it (its hash)."""
    from ..compiler import compile_model
    from ..compiler.compile_model import DEFAULT_LAYOUT
    from ..graph import load
    from ..graph.ir import graph_digest
    from ..graph.layout_plan import default_plan, winograd_convs
    from ..measure.interleave import paired_ratios
    from ..model_tuning import whole_times

    say = progress or (lambda _: None)
    if plan.dynamic or not _runnable_here(plan.target, lower_isa):
        return None
    tgt = parse_target(plan.target, check_host=False)
    try:
        graph = load(plan.model, plan.shapes if plan.model.endswith(".onnx") else None)
    except (UserError, OSError, ValueError):
        say(f"plan of {plan.model} on '{plan.target}': not checked (no such model here)")
        return None
    if graph_digest(graph) != plan.model_hash:
        say(f"plan of {plan.model} on '{plan.target}': not checked (the model here is another version)")
        return None
    mine = winograd_convs(plan.layouts) if plan.padded else plan.layouts
    untuned = default_plan(graph, DEFAULT_LAYOUT, tgt.lanes)
    if mine == untuned:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = {k: compile_model(graph, log=log, target=str(tgt), layout_plan=lay)
                     for k, lay in (("plan", mine), ("default", untuned))}
    except UserError as e:
        say(f"plan of {plan.model} on '{plan.target}': not checked (it does not compile here: {e})")
        return None
    times = whole_times(built, rounds)
    ratio = statistics.median(paired_ratios(times["default"], times["plan"]))
    kept = ratio < 1
    say(f"plan of {plan.model} on '{plan.target}': {statistics.median(times['plan']) * 1e3:.2f} ms, the untuned "
        f"compile's plan {statistics.median(times['default']) * 1e3:.2f} ms ({ratio:.3f}x paired, {rounds} rounds): "
        + ("the untuned compile's plan replaces it" if kept else "kept"))
    if not kept:
        return None
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return dataclasses.replace(plan, layouts=untuned, padded=True, estimate_s=statistics.median(times["default"]),
                               exact=True, cold={}, cold_estimate_s=None, timestamp=now, tool=f"tuner {__version__}")
