"""`tuner analyze` of a model tune's log: what the whole-model search found.

A log with a layout-plan line (written by `tuner tune MODEL`) is read as a model: its layout
problem is rebuilt from the model the plan names (graph.layout_plan.model_layouts, over the
layouts the tune chose from), and the log's records price it. The report says, for the newest
plan of each model and target:

  * the estimated model latency of the logged plan (what `tuner compile` applies) under the
    log's best records that still replay, and what the solver picks from the same records;
  * per task the plan runs: occurrences, trials, best latency, GFLOPS, fraction of the tuning
    host's peak (measured when the plan was made), share of the estimate;
  * per convolution: the chosen layout and what each other layout costs relative to it, with the
    trials each got (how soft pruning spent the budget), and the budget spent outside the plan;
  * the layout transforms the plan keeps;
  * the estimate against trials and tuning time (the records as logged, re-solved at up to
    CURVE_POINTS points; pauses over PAUSE_S between records, such as a resumed tune, are cut);
  * with a compiled artifact, its measured latency and the gap to the estimate, split by kind of
    step into what the machine now gives the same kernels alone and what they lose in context.

Text (`table`), a PNG (`plot`) and one self-contained HTML file (`html`) render the same
sections (`sections`), so the three never disagree.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..compare.bench import step_times
from ..database import records
from ..errors import UserError
from ..graph import MODELS, Graph, load
from ..graph.dynamic import load_at
from ..graph.ir import graph_digest
from ..graph.layout_plan import ModelLayouts, Plan, model_layouts
from ..model_tuning import PRUNE_RATIO, TUNED_TRIALS, TaskProgress, equal_effort_losers, layout_ratios, reachable_prices
from ..runtime import load as load_artifact
from ..target import parse_target
from ..te.layouts import CONV_LAYOUTS, plan_summary

CURVE_POINTS = 150
PAUSE_S = 600.0


@dataclass
class TaskRow:
    workload: object           # ops.Workload
    uses: int                  # how often the logged plan runs it (0: not in the plan)
    trials: int
    best: records.Record | None

    @property
    def best_s(self) -> float:
        return records.latency(self.best)

    @property
    def fusion(self) -> str:
        """The best schedule's fusion choices: padding 'inline' (in the kernel's loads) or 'root' (a
        padded copy first), epilogue 'fused' (on each tile) or 'apart' (a pass of its own), '-' for
        what the task lacks or the record did not log."""
        dec = (self.best.decisions or {}) if self.best else {}
        pad = dec.get("pad", {})            # logged data: tolerate a shape this version does not write
        pads = "/".join(sorted(set(map(str, pad.values() if isinstance(pad, dict) else [pad])))) or "-"
        return f"{pads} {dec.get('epilogue', '-')}"


@dataclass
class Choice:
    conv: str
    chosen: str
    costs: dict                # layout -> seconds of its part of the plan (kernel, pools, boundary transforms)
    trials: dict               # layout -> trials of its fused group's task
    ratios: dict               # layout -> model_tuning.layout_ratios against the chosen one (what pruning judges)
    lost: set = field(default_factory=set)   # layouts whose task lost its duel at equal effort (pruned too)

    def pruned(self, lay: str) -> bool:
        return lay in self.lost or not self.ratios[lay] <= PRUNE_RATIO


@dataclass
class StepKind:
    """The compiled model's steps of one kind (op and layout): their records and their times now."""
    steps: int = 0
    logged_s: float = 0.0       # what their records logged (untuned glue: none)
    alone_s: float = 0.0        # each repeated alone on warm data
    in_context_s: float = 0.0   # each where it runs in the whole model


@dataclass
class Section:
    title: str
    head: list
    rows: list                 # [[str]]
    notes: list = field(default_factory=list)


@dataclass
class ModelReport:
    log: str
    plan: records.PlanRecord   # the newest plan of this model and target in the log
    space: ModelLayouts
    rows: list                 # [TaskRow] of every task of the space
    choices: list              # [Choice] per convolution
    estimate_s: float          # the logged plan under the log's best records
    solved: Plan | None        # the solver on the same records
    solved_s: float
    curve: list                # [(trials, tuning seconds, estimate seconds)]
    trials: int                # trial records of the space's tasks on this target
    second_timings: int = 0    # records that time a logged kernel again (not Record.trial)
    compiled: dict | None = None

    # ------------------------------------------------------------ content
    def sections(self) -> list:
        p, est = self.plan, self.estimate_s
        tuned_s = self.curve[-1][1] if self.curve else 0.0
        again = f" (and {self.second_timings} second timings of front-runners)" if self.second_timings else ""
        at = f" at {_shapes(p.shapes)}{' (a bucket of a range of shapes)' if p.dynamic else ''}" if p.shapes else ""
        lines = [f"model {p.model}{at} (graph {p.model_hash}) on '{p.target}': {self.trials} trials of "
                 f"{len(self.rows)} tasks{again} in {_duration(tuned_s)} of tuning",
                 f"layout plan logged {p.timestamp or '(no time)'}: "
                 f"{plan_summary(p.layouts) or 'no layout to choose (no conv or dense node has a choice)'}"
                 f"{'' if p.exact else ' (beam search: not proven optimal)'}",
                 f"estimated model latency {_ms(est)} (the logged plan under the log's best records; the "
                 f"plan line said {_ms(p.estimate_s)})"]
        if p.untuned:
            lines.append("its tune timed the untuned compile (no log) faster than this plan with its records, whole: "
                         "`tuner compile` with this log takes neither; tune on with more --trials to try again")
        if p.priced == "cold":
            lines.append("weights cold: the tasks with weights were timed with them evicted before every call, as a "
                         "model meets them (--weights cold)"
                         + (f"; {len(p.cold)} whose best record was timed warm were timed again so, and their "
                            "'best ms' below is the warm timing" if p.cold else ""))
        elif p.cold:
            lines.append(f"with weights cold ({len(p.cold)} tasks' best kernels timed again with their weights evicted "
                         f"before every call): the plan line said {_ms(p.cold_estimate_s)}; the plan was solved with "
                         "the warm ones, as the search timed them (--weights warm)")
        if self.solved is not None:
            same = self.solved.layouts == p.layouts
            lines.append(f"the solver on the same records: {_ms(self.solved_s)} in {self.solved.seconds * 1e3:.1f} ms"
                         + (", the same plan" if same else
                            f", another plan ({plan_summary(self.solved.layouts)}): run the tune again "
                            "with the same --trials to log it"))
        if self.compiled:
            c = self.compiled
            lines.append(f"compiled model {c['path']}: measured {_ms(c['measured_s'])} (median of {c['repeat']}), "
                         f"{100 * (c['measured_s'] / est - 1):+.1f}% against the estimate"
                         + ("" if c["same_plan"] else "; it was compiled with another layout plan than this one"))
        in_plan = [r for r in self.rows if r.uses]
        spent_in = sum(r.trials for r in in_plan)
        total = max(1, sum(r.trials for r in self.rows))
        lines.append(f"budget: {spent_in} trials ({100 * spent_in / total:.0f}%) on the {len(in_plan)} tasks the plan "
                     f"runs, {total - spent_in} ({100 * (total - spent_in) / total:.0f}%) on the "
                     f"{len(self.rows) - len(in_plan)} it does not")
        per_layout: dict = {}
        for r in self.rows:
            if r.workload.op == "conv2d":
                per_layout[r.workload.layout] = per_layout.get(r.workload.layout, 0) + r.trials
        if per_layout:
            lines.append("trials on conv tasks per layout: "
                         + ", ".join(f"{lay} {n}" for lay, n in sorted(per_layout.items(), key=lambda kv: -kv[1])))
        out = [Section("summary", [], [], lines)]

        peak = p.peak_gflops
        rows = []
        for r in sorted(in_plan, key=lambda r: -r.uses * r.best_s):
            g = r.workload.live_flops / r.best_s / 1e9 if math.isfinite(r.best_s) else 0.0
            rows.append([str(r.uses), str(r.trials), f"{r.best_s * 1e3:.4f}", f"{g:.1f}",
                         f"{g / peak:.2f}" if peak and g else "-", f"{100 * r.uses * r.best_s / est:.1f}%",
                         r.workload.op, _shape(r.workload), r.workload.layout, r.fusion])
        out.append(Section("tasks of the plan, by share of the estimate",
                           ["x", "trials", "best ms", "GFLOPS", "peak", "share", "op", "shape", "layout",
                            "pad epilogue"], rows,
                           [f"peak: fraction of the tuning host's FP32 peak ({peak:.1f} GFLOPS at "
                            f"{_threads(p.target)} thread(s))" if peak else
                            "peak: not known (the plan was made in replay mode or by an older version)",
                            "pad epilogue: the fusion choices of the best schedule, measured by the search: "
                            "padding 'inline' in the kernel's loads or 'root' as a padded copy first; the "
                            "epilogue 'fused' on each tile while in cache or 'apart' as a pass of its own"]))

        rows = []
        for c in self.choices:
            base = c.costs[c.chosen]
            others = [f"{lay} {_ratio(c.costs[lay], base)} ({c.trials.get(lay, 0)}"
                      f"{', pruned' if c.pruned(lay) else ''})"
                      for lay in c.costs if lay != c.chosen]
            rows.append([c.conv, c.chosen, f"{base * 1e3:.4f}", str(c.trials.get(c.chosen, 0)), "  ".join(others)])
        out.append(Section("layout per convolution", ["conv", "chosen", "ms", "trials", "other layouts: cost "
                                                      "relative to the chosen one (trials)"], rows,
                           ["a conv's cost in a layout is its fused group's kernel, the pools that inherit "
                            "the layout and its transforms to and from fixed NCHW boundaries; the transforms "
                            "between convs are priced on the edges, below; a dense (with weight packings "
                            "among the choices) is a row too, its cost its kernel's in each packing",
                            f"pruned: over {PRUNE_RATIO}x the chosen layout's cost, so a tune under this plan "
                            "gives it no more rounds (a task shared with a closer layout is still tuned); a "
                            f"layout whose task has fewer than {TUNED_TRIALS} trials is judged on what it could "
                            "reach: its FLOPs at the best rate a task of its operator and layout reached; a "
                            f"direct conv layout with {TUNED_TRIALS} or more trials is pruned too when its best "
                            "is behind what the chosen layout's task had after as many trials (its duel at "
                            "equal effort)"]))

        if self.compiled:
            out.append(self._gap_section())

        moved = [r for r in in_plan if r.workload.op == "layout_transform"]
        t = sum(r.uses * r.best_s for r in moved)
        out.append(Section("layout transforms the plan keeps", ["x", "best ms", "from", "to", "shape (NCHW)"],
                           [[str(r.uses), f"{r.best_s * 1e3:.4f}", r.workload.layout, r.workload.p["dst"],
                             "x".join(str(r.workload.p[k]) for k in "NCHW")] for r in moved],
                           [f"{len(moved)} distinct transforms, {_ms(t)} in all ({100 * t / est:.1f}% of the "
                            "estimate)"]))
        return out

    def _gap_section(self) -> Section:
        """Where the compiled model and the estimate part, by kind of step."""
        kinds = self.compiled["kinds"]
        tot = {f: sum(getattr(k, f) for k in kinds.values()) for f in ("logged_s", "alone_s", "in_context_s")}
        rows = [[kind, str(k.steps), f"{k.logged_s * 1e3:.3f}" if k.logged_s else "-", f"{k.alone_s * 1e3:.3f}",
                 f"{k.in_context_s * 1e3:.3f}", _ratio(k.in_context_s, k.logged_s) if k.logged_s else "-"]
                for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1].in_context_s)]
        return Section("the compiled model's steps against their records, by kind",
                       ["kind", "steps", "logged ms", "alone ms", "in context ms", "in context / logged"], rows,
                       [f"all steps: logged {_ms(tot['logged_s'])} (the records the estimate sums), alone "
                        f"{_ms(tot['alone_s'])}, in context {_ms(tot['in_context_s'])}; dispatch between steps "
                        f"{100 * self.compiled['dispatch']:.1f}% of a run",
                        "logged -> alone: the same kernels timed now, each repeated on warm data: the machine's "
                        "speed since the tune, and the optimism of keeping the fastest of many noisy timings; "
                        "alone -> in context: each step timed where it runs in the whole model, with the caches "
                        "its neighbours leave; untuned glue has no record"])

    # ------------------------------------------------------------ renderers
    def table(self) -> str:
        parts = []
        for s in self.sections():
            block = list(s.notes) if not s.rows else []
            if s.rows:
                block.append(f"{s.title}:")
                block += _aligned(s.head, s.rows)
                block += s.notes
            elif s.title != "summary":
                block.insert(0, f"{s.title}: none")
            parts.append("\n".join(block))
        return "\n\n".join(parts)

    def plot(self, out: str) -> str:
        """Estimated model latency against trials and against tuning time (PNG)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        for ax, k, scale, label in zip(axes, (0, 1), (1.0, 60.0), ("trials", "tuning time (min)")):
            ax.plot([pt[k] / scale for pt in self.curve], [pt[2] * 1e3 for pt in self.curve],
                    drawstyle="steps-post", label="estimate (the plan's tasks)")
            if self.compiled:
                ax.axhline(self.compiled["measured_s"] * 1e3, color="C3", ls="--", label="compiled model, measured")
            ax.set_xlabel(label)
            ax.set_ylabel("model latency (ms)")
            top = max([pt[2] for pt in self.curve] + [self.compiled["measured_s"] if self.compiled else 0.0])
            ax.set_ylim(0, 1.1e3 * top if top > 0 else None)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{self.plan.model} on '{self.plan.target}'", fontsize=10)
        return _save(fig, out)

    def html(self, out: str, png: str | None = None) -> str:
        """One self-contained HTML file: the sections as tables, the plot inlined."""
        e = html.escape
        body = [f"<h1>{e(self.plan.model)} on {e(self.plan.target)}</h1>", f"<p>log: {e(self.log)}</p>"]
        for s in self.sections():
            body.append(f"<h2>{e(s.title)}</h2>")
            if s.rows:
                body.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in s.head) + "</tr>")
                body += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in s.rows]
                body.append("</table>")
            body += [f"<p>{e(n)}</p>" for n in s.notes]
            if s.title == "summary" and png:
                data = base64.b64encode(Path(png).read_bytes()).decode()
                body.append(f'<img alt="estimated model latency against trials and time" '
                            f'src="data:image/png;base64,{data}">')
        page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>tuner: "
                f"{e(self.plan.model)}</title><style>body{{font-family:sans-serif;max-width:80em;margin:1em auto}}"
                "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;"
                "text-align:left}img{max-width:100%}</style></head><body>" + "\n".join(body) + "</body></html>\n")
        Path(out).write_text(page)
        return out


# ---------------------------------------------------------------- building the report

def analyze_model(path: str, model=None, input_shapes: dict | None = None, compiled: str | None = None,
                  repeat: int = 5, contents: records.LogContents | None = None) -> list:
    """[ModelReport] for the newest plan of each (model, target) in the log at `path` ([] when it
    holds no plan). model: a built-in name, an .onnx path or a Graph, when the plan's model name
    does not load here. compiled: an artifact directory (`tuner compile -o`) to time. contents:
    the log already read (records.load)."""
    contents = contents or records.load(path, warn=False)
    newest: dict = {}
    for p in contents.plans:
        newest[(p.model_hash, records.code_target(p.target))] = p
    return [_report(path, contents, p, model, input_shapes, compiled, repeat) for p in newest.values()]


def _graph(plan, model, input_shapes):
    if isinstance(model, Graph):
        graph, given = model, "the given graph"
    else:
        given = str(model or plan.model)
        shapes = (plan.shapes or input_shapes) if given not in MODELS else input_shapes   # the plan's own first
        try:
            graph = load_at(given, shapes, frozenset(plan.run_time)) if plan.dynamic else load(given, shapes)
        except UserError as err:
            if model:
                raise UserError(f"--model {given}: {err}") from None
            raise UserError(f"the layout plan in the log is for model {plan.model!r}, which does not load here "
                            f"({err}); give the model with --model PATH") from None
    if graph_digest(graph) != plan.model_hash:
        raise UserError(f"{given} is not the model the log's plan was made for (graph hash {graph_digest(graph)}, "
                        f"the plan's {plan.model_hash}); give that model with --model (and its --input-shape)")
    return graph


def _report(path, contents, plan, model, input_shapes, compiled, repeat) -> ModelReport:
    graph = _graph(plan, model, input_shapes)
    lanes = parse_target(plan.target, check_host=False).lanes           # as the tune that logged it saw the convs
    space = model_layouts(graph, tuple(plan.candidates or CONV_LAYOUTS), lanes)
    missing = [v for v in plan.layouts if v not in space.domains]
    if missing:
        raise UserError(f"the log's plan names convolutions the model does not have as choices ({missing[0]}); "
                        "was it written by another version of tuner? Tune again to log a new plan")
    wls = [wl for wl, _ in space.workloads()]
    keys = {wl.key for wl in wls}
    recs = [r for r in contents.records if r.workload.key in keys
            and records.code_target(r.target) == records.code_target(plan.target)]
    by_key: dict = {}          # every record of a task (a best counts a kernel's second timing)
    tried: dict = {}           # its trials: what the search measured, as the tune counted them
    for r in recs:
        by_key.setdefault(r.workload.key, []).append(r)
        if r.trial:
            tried.setdefault(r.workload.key, []).append(r)
    fastest = {k: records.best_of(v) for k, v in by_key.items()}
    best = {k: records.latency(r) for k, r in fastest.items()}
    # the cold prices (model_tuning.cold_prices) of the kernels that are still each task's best; the
    # plan's own prices when it was solved with them
    cold = {k: s for k, (h, s) in plan.cold.items() if fastest.get(k) is not None and fastest[k].code_hash == h}
    if plan.priced == "cold":
        best.update(cold)
    uses = space.used(plan.layouts)
    rows = [TaskRow(wl, uses.get(wl.key, 0), len(tried.get(wl.key, [])), fastest.get(wl.key)) for wl in wls]
    unary = space.problem(lambda wl: best.get(wl.key, math.inf)).unary   # per conv and layout, as the solver prices
    reach = reachable_prices([(wl, best.get(wl.key, math.inf), len(tried.get(wl.key, []))) for wl in wls])
    ratios = layout_ratios(space, plan.layouts, best, reach)
    lost = equal_effort_losers(space, plan.layouts, [TaskProgress.from_records(wl, tried.get(wl.key, []))
                                                     for wl in wls])
    choices = [Choice(v, plan.layouts[v], unary[v],
                      {lay: len(tried.get(space.unary[v][lay][0].key, [])) for lay in d if space.unary[v][lay]},
                      ratios[v], {lay for lay in d if any(wl.key in lost for wl in space.unary[v][lay])})
               for v, d in space.domains.items()]
    solved, solved_s = space.plan(best)
    n_trials = sum(map(len, tried.values()))
    rep = ModelReport(path, plan, space, rows, choices, space.estimate(plan.layouts, best), solved, solved_s,
                      _curve(space, recs), n_trials, len(recs) - n_trials)
    if compiled:
        rep.compiled = _time_compiled(compiled, plan, repeat, {wl.key: wl for wl in wls})
    return rep


def _curve(space: ModelLayouts, recs: list) -> list:
    """[(trials, tuning seconds, estimate)] at up to CURVE_POINTS records where the estimate is finite.
    A second timing of a kernel (not Record.trial) is tuning time but not a trial, and moves no best."""
    if not recs:
        return []
    marks = {round(i * (len(recs) - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)}
    best: dict = {}
    out = []
    trials = 0
    for i, (r, elapsed) in enumerate(zip(recs, tuning_seconds(recs))):
        if r.trial:
            trials += 1
            if r.ok and r.latency < best.get(r.workload.key, math.inf):
                best[r.workload.key] = r.latency
        if i in marks:
            plan, est = space.plan(best)
            if plan is not None and math.isfinite(est):
                out.append((trials, elapsed, est))
    return out


def tuning_seconds(recs: list) -> list:
    """The tuning time elapsed at each record, from their timestamps (pauses over PAUSE_S between
    two records, such as a tune resumed later, are cut)."""
    out, elapsed, last = [], 0.0, _when(recs[0]) if recs else None
    for r in recs:
        now = _when(r)
        if now is not None and last is not None and 0 < now - last <= PAUSE_S:
            elapsed += now - last
        last = now if now is not None else last
        out.append(elapsed)
    return out


def _when(rec) -> float | None:
    try:
        return _dt.datetime.fromisoformat(rec.timestamp).timestamp()
    except (TypeError, ValueError):
        return None


def _time_compiled(path: str, plan, repeat: int, workloads: dict) -> dict:
    """The artifact timed whole (median of `repeat` rounds), and its steps by kind: as logged (the
    records the estimate sums), each timed alone now, and each timed where it runs in the whole
    model (compare.bench.step_times)."""
    m = load_artifact(path)
    if m.meta.get("model_hash") != plan.model_hash:
        raise UserError(f"--compiled {path} is another model than the log's plan ({m.meta.get('model')!r}); "
                        "give the directory `tuner compile` wrote for this model")
    if records.code_target(m.target) != records.code_target(plan.target):
        raise UserError(f"--compiled {path} was built for '{m.target}', the plan for '{plan.target}'; compile for "
                        "the plan's target (--threads) to compare")
    # one timing for both: each of `repeat` rounds times the whole model, then its steps
    whole, alone, in_context, dispatch = step_times(m, m.random_inputs(seed=1), rounds=repeat, runs=10)
    kinds: dict = {}
    for st, a, c in zip(m.steps, alone, in_context):
        wl = workloads.get(st.workload_key)
        kind = f"{wl.op} {wl.layout}" if wl is not None else "untuned glue"
        k = kinds.setdefault(kind, StepKind())
        k.steps += 1
        k.logged_s += st.expected_s or 0.0
        k.alone_s += a
        k.in_context_s += c
    return {"path": str(path), "measured_s": whole, "repeat": repeat,
            "same_plan": m.meta.get("layout_plan") == plan.layouts, "kinds": kinds, "dispatch": dispatch}


# ---------------------------------------------------------------- formatting

def range_curves(reports: list) -> list:
    """[(model, target, [(input elements, shapes, ModelReport)] ascending)] of the models with
    plans at two or more shapes of one range (tune --dynamic: a plan per bucket)."""
    groups: dict = {}
    for r in reports:
        if r.plan.dynamic and r.plan.shapes:
            groups.setdefault((r.plan.model, records.code_target(r.plan.target)), []).append(r)
    return [(model, rs[0].plan.target, sorted(((sum(math.prod(v) for v in r.plan.shapes.values()),
                                                _shapes(r.plan.shapes), r) for r in rs), key=lambda t: t[0]))
            for (model, _), rs in groups.items() if len(rs) > 1]


def range_table(model: str, target: str, points: list) -> str:
    """The latency estimate at each tuned shape of a range, and what each bucket's tune spent."""
    head = ("shapes", "estimate", "per element", "trials", "tuning")
    rows = [(shapes, _ms(r.estimate_s), f"{r.estimate_s / n * 1e6:.1f} us", str(r.trials),
             _duration(r.curve[-1][1] if r.curve else 0.0)) for n, shapes, r in points]
    return "\n".join([f"{model} on '{target}' across its range ({len(points)} tuned shapes; a compile for the range "
                      "runs each bucket's kernels up to its shape, or as far above it as measured):"] + _aligned(head, rows))


def _aligned(head, rows) -> list:
    """The lines of a table: a header and rows of strings in columns, indented."""
    widths = [max(len(x[k]) for x in [head] + rows) for k in range(len(head))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in [head] + rows]


def range_plot(model: str, target: str, points: list, out: str) -> str:
    """Estimated latency against the inputs' size at each tuned shape (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot([n for n, _, _ in points], [r.estimate_s * 1e3 for _, _, r in points], marker="o")
    for n, shapes, r in points:
        ax.annotate(shapes, (n, r.estimate_s * 1e3), fontsize=7, textcoords="offset points", xytext=(4, -10))
    ax.set_xlabel("input elements")
    ax.set_ylabel("estimated latency (ms)")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.set_title(f"{model} on '{target}' across its range", fontsize=10)
    return _save(fig, out)


def _save(fig, out: str) -> str:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _shapes(shapes: dict) -> str:
    return ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if math.isfinite(s) else "- (not every task measured)"


def _ratio(cost: float, base: float) -> str:
    return f"{cost / base:.2f}x" if math.isfinite(cost) and base > 0 else "unmeasured"


def _shape(wl) -> str:
    return wl.spec.partition(":")[2]


def _threads(target: str) -> str:
    ct = records.code_target(target)
    return str(ct[2]) if ct else "?"


def _duration(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


__all__ = ["analyze_model", "ModelReport", "TaskRow", "Choice", "Section", "StepKind"]
