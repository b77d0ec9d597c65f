"""`tuner compile`: a model and tuning logs -> one shared library, one weights file, one arena plan.

Every fused group of the optimised graph becomes one kernel call (a step):
  * a group that is a task (an anchor with its epilogue: `ExtractTasks`' workload) gets the best
    record of the given logs, then of the shipped database (`schedules/`), else the default
    schedule of its search space: apply-best, loud about misses;
  * a group that is one layout transform of an activation takes the best record of its
    `layout_transform` workload when a log has one (a model tune measures every transform its
    layout plan can need), else it is generic like the rest;
  * every other group (layout transforms, flatten, concat, softmax, broadcast chains, ...) gets a
    tensor expression built node by node from the operator registry (`graph.ops.OPS`) and the
    default schedule of the same search space (producers inlined, inner loop vectorised, outer
    loops parallel); a DAG that space cannot schedule is computed stage by stage.
Kernels with equal code are compiled once and shared. The steps run in graph order from a
generated C entry point over one arena (runtime.memory); weights are laid out in their kernels'
layouts at compile time and stored in one binary file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__, records
from ..codegen.c import PRELUDE, generate_c
from ..errors import UserError
from ..graph import Graph, load
from ..graph.ir import interface_names
from ..graph.ops import Unsupported, flops, to_te
from ..graph.passes import optimize
from ..graph.passes.extract_tasks import group_summary, transform_workload, workload_of
from ..measure.builder import TIMING, compile_library
from ..schedule.lower import lower
from ..schedule.schedule import ScheduleError, replay
from ..space.sketch import SearchSpace
from ..target import Target, parse_target
from ..task import Task, code_hash
from ..te import layouts as L
from ..te.tensor import placeholder
from .memory import Lifetime, align, peak_live_bytes, plan

DEFAULT_LAYOUT = "NCHW16c"

# where a step's schedule came from (besides a log path)
SHIPPED, DEFAULT, GENERIC = "shipped", "default", "generic"


@dataclass
class Arg:
    """Where a kernel argument lives: a graph input or output (by position), or a byte offset
    in the arena or in the weights."""
    kind: str            # input | output | arena | weight
    where: int


@dataclass
class Step:
    index: int
    summary: str         # "conv2d + add + relu"
    node: str            # the anchor's (or first node's) name, for people
    func: str            # C function of its kernel (shared between steps with equal code)
    args: list           # Args: inputs, then the output
    workload: str        # the task's label, or the group's output type for generic groups
    workload_key: str | None   # None for generic groups
    source: str          # log path | shipped | default | generic
    expected_s: float | None   # the latency the record promises
    flops: float
    code_hash: str
    steps: list = field(default_factory=list)

    @property
    def anchor(self) -> bool:
        """A task with a workload key: an anchor group (counted by --strict and the untuned warning), or a
        layout transform that took a logged record."""
        return self.workload_key is not None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["args"] = [[a.kind, a.where] for a in self.args]
        return d

    @staticmethod
    def from_json(d: dict) -> "Step":
        d = dict(d)
        d["args"] = [Arg(k, w) for k, w in d["args"]]
        return Step(**d)


@dataclass
class Kernel:
    func: str
    source: str
    openmp: bool
    code_hash: str


class UntunedError(UserError):
    """--strict and some anchor task has no record."""


def _graph_hash(graph: Graph, structure: bool) -> str:
    """The hash of graph_digest, or (structure) of graph_structure: one walk, in node order."""
    h = hashlib.sha256()
    names: dict = {}
    for v in graph.inputs:
        names[id(v)] = f"in{len(names)}"
        h.update(f"input {v.shape}{'' if structure else f' {v.dtype}'}".encode())
    for n in graph.nodes:
        ins = []
        for v in n.inputs:
            if v.is_const and not structure:
                h.update(np.ascontiguousarray(v.data).tobytes())
            ins.append((f"const{v.data.shape}" + ("" if structure else str(v.data.dtype))) if v.is_const
                       else names.get(id(v), "?"))
        names[id(n.output)] = f"v{len(names)}"
        attrs = sorted((k, str(a)) for k, a in n.attrs.items() if not (structure and isinstance(a, float)))
        h.update(json.dumps([n.op, n.name, attrs, ins] if structure else [n.op, attrs, ins]).encode())
    h.update(json.dumps([names.get(id(v), "?") for v in graph.outputs]).encode())
    return h.hexdigest()[:20]


def graph_digest(graph: Graph) -> str:
    """A hash of a graph: operators, attributes, shapes and constant bytes, in order."""
    return _graph_hash(graph, structure=False)


def graph_structure(graph: Graph) -> str:
    """A hash of what a layout plan depends on: operators, node names, integer attributes, shapes
    and edges; not constants' values nor float attributes (an exporter rounds them to float32)."""
    return _graph_hash(graph, structure=True)


class _Weights:
    """Constants packed into one 64-byte aligned blob, each stored once."""

    def __init__(self):
        self.chunks: list = []
        self.size = 0
        self.offsets: dict = {}

    def add(self, key, data: np.ndarray) -> int:
        if key in self.offsets:
            return self.offsets[key]
        data = np.ascontiguousarray(data, dtype=np.float32)
        off = self.size
        self.chunks.append((off, data.tobytes()))
        self.size = align(off + data.nbytes)
        self.offsets[key] = off
        return off

    def blob(self) -> bytes:
        out = bytearray(self.size)
        for off, b in self.chunks:
            out[off:off + len(b)] = b
        return bytes(out)


def _group_io(graph: Graph, nodes: list, uses: dict, outputs: set):
    """(input values in order of first use, the output value) of a fused group."""
    inside = {id(graph.nodes[k].output) for k in nodes}
    ins, seen = [], set()
    for k in nodes:
        for v in graph.nodes[k].inputs:
            if id(v) not in inside and id(v) not in seen:
                seen.add(id(v))
                ins.append(v)
    group_nodes = {id(graph.nodes[k]) for k in nodes}
    outs = [graph.nodes[k].output for k in nodes
            if id(graph.nodes[k].output) in outputs
            or any(id(c) not in group_nodes for c in uses.get(id(graph.nodes[k].output), []))]
    if len(outs) != 1:
        raise AssertionError(f"fused group {group_summary(graph, nodes)} has {len(outs)} outputs; FuseOps "
                             "must give every group exactly one")
    return ins, outs[0]


def _task_binding(graph: Graph, group, wl, ins_wl: list) -> list:
    """The graph values (or arrays to store as weights) behind each argument of a task's kernel."""
    anchor = graph.nodes[group.anchor]
    binding = dict(zip(("data", "weight"), anchor.inputs))
    cur = anchor.output
    for n in (graph.nodes[k] for k in group.nodes if k != group.anchor):
        if n.op == "add":
            other = next(v for v in n.inputs if v is not cur)
            binding["bias" if other.is_const else "residual"] = other
        cur = n.output
    out = []
    for t in ins_wl:
        v = binding[t.name]
        if t.name == "weight" and wl.op == "dense" and wl.blocks[1]:
            out.append(L.dense_weight_from_oi(v.data, wl.blocks[1]))      # packed now, once
            continue
        if int(np.prod(v.shape)) != int(np.prod(t.shape)) or (t.name == "weight" and tuple(v.shape) != t.shape):
            raise AssertionError(f"{wl.label}: argument {t.name} {list(t.shape)} bound to {v.name} {list(v.shape)}")
        out.append(v)
    return out


def _generic_dag(graph: Graph, nodes: list, ins: list, out_value):
    """(placeholders, output tensor) of a group built from the operator registry."""
    tensors, phs = {}, []
    for k, v in enumerate(ins):
        t = placeholder(v.shape, f"in{k}")
        tensors[id(v)] = t
        phs.append(t)
    for j, k in enumerate(nodes):
        n = graph.nodes[k]
        tensors[id(n.output)] = to_te(n, [tensors[id(v)] for v in n.inputs], f"s{j}_{n.op}")
    return phs, tensors[id(out_value)]


def _generic_kernel(dag: tuple, target: Target, func: str):
    """(steps, C source, uses OpenMP) of a generic group: the default point of its search space,
    else every stage computed whole, one after the other (always legal)."""
    tries = [[]]
    try:
        space = SearchSpace(None, target, dag)
        tries.insert(0, space.steps(space.default()))
    except (ValueError, ScheduleError):
        pass                     # more than one reduction (softmax): stage by stage
    last_error = None
    for steps in tries:
        try:
            fn = lower(replay(dag[0], dag[1], steps))
        except (ScheduleError, ValueError) as e:
            last_error = e
            continue
        src, omp = generate_c(dataclasses.replace(fn, name=func), target.lanes, target.threads)
        return steps, src, omp
    raise AssertionError(f"no schedule lowers for {dag[1].name}: {last_error}")


def compile_model(model, log=None, target: str | Target = "cpu", threads: int | None = None,
                  layout: str | None = None, input_shapes: dict | None = None, strict: bool = False,
                  use_shipped: bool = True, progress=None, choose=None, layout_plan: dict | None = None):
    """Compile a built-in model, an ONNX file or a Graph with the best schedules of `log` (a path or
    a list of paths). Returns a runtime.model.CompiledModel.

    layout_plan: {conv node name: layout} for convolutions that run in another layout
    than `layout` (graph.layout_plan: what the solver chose).

    choose: for tests, a function Task -> steps that replaces apply-best (its steps are reported
    as coming from 'chosen')."""
    from .model import CompiledModel
    t0 = time.perf_counter()
    say = progress or (lambda msg: None)
    tgt = parse_target(target, threads)
    if tgt.kind != "cpu":
        raise UserError(f"a whole model compiles for CPU targets in this version, not {tgt.kind}: "
                        "use --target cpu")
    layout = layout or DEFAULT_LAYOUT
    L.check_activation_layout(layout)
    graph = model if isinstance(model, Graph) else load(str(model), input_shapes)
    source_name = graph.name if isinstance(model, Graph) else str(model)
    logs = [log] if isinstance(log, (str, Path)) else list(log or [])
    for p in logs:
        if not Path(p).exists():
            raise UserError(f"log {p} does not exist; give the log `tuner tune --log` wrote")
    contents = [(str(p), records.load(p)) for p in logs]
    if use_shipped:
        shipped = records.shipped_database(tgt)
        if shipped.exists():
            contents.append((SHIPPED, records.load(shipped, warn=False)))
    model_hash = graph_digest(graph)
    plan_from = "given" if layout_plan else None
    if layout_plan is None:             # the newest plan a model tune logged for this model and target
        structure = graph_structure(graph)
        for where, c in contents:
            found = c.plan(model_hash, str(tgt), structure)
            if found is not None:
                layout_plan, plan_from = found.layouts, where
                say(f"layout plan from {where}: {plan_summary(found.layouts)}")
                break
        others = sorted({p.model for where, c in contents if where != SHIPPED for p in c.plans})
        if layout_plan is None and others:
            warnings.warn(f"the log holds a layout plan of {', '.join(others)} but none of this model on "
                          f"'{tgt}': compiling {source_name} without one (every conv in {layout})")
    unknown = sorted(set(layout_plan or {}) - {n.name for n in graph.nodes if n.op in ("conv2d", "dense")})
    if unknown:
        said = (f"the layout plan ({plan_from}) names {len(unknown)} conv or dense node(s) that {source_name} does "
                f"not have: {', '.join(unknown[:4])}")
        if plan_from == "given":
            raise UserError(f"{said}; give a plan of this model")
        warnings.warn(f"{said} (its nodes were renamed?): compiling without it (every conv in {layout})")
        layout_plan, plan_from = None, None
    g = optimize(graph, layout=layout, layout_plan=layout_plan)
    say(f"optimised {graph.name}: {len(graph.nodes)} nodes -> {len(g.nodes)}, "
        f"{len(g.meta['fused_groups'])} fused groups")

    uses = g.consumers()
    outputs = {id(v) for v in g.outputs}
    in_index = {id(v): k for k, v in enumerate(g.inputs)}
    out_index: dict = {}
    for k, v in enumerate(g.outputs):
        if id(v) in out_index or id(v) in in_index or v.is_const:
            raise Unsupported(f"graph output {k} ({v.name}) is a graph input, a constant or another output; "
                              "tuner compile needs every output computed by a kernel of its own")
        out_index[id(v)] = k

    weights = _Weights()
    kernels: dict = {}               # code hash -> Kernel
    steps: list = []
    lifetimes: dict = {}             # value id -> [first step, last step, bytes]
    step_args: list = []             # per step: [(value or array)]
    chosen: dict = {}                # workload key -> (record, where)

    def best_of(wl) -> tuple:
        """(the best record of `wl` in the logs, then the shipped database, or None; where from)."""
        if wl.key not in chosen:
            chosen[wl.key] = next(((rec, where) for where, c in contents
                                   if (rec := records.best(c, wl.key, str(tgt)))), (None, DEFAULT))
        return chosen[wl.key]

    for gi, grp in enumerate(g.meta["fused_groups"]):
        ins, out_v = _group_io(g, grp.nodes, uses, outputs)
        anchor_node = g.nodes[grp.anchor] if grp.anchor is not None else g.nodes[grp.nodes[0]]
        wl, _why = workload_of(g, grp)
        gflops = sum(flops(g.nodes[k]) for k in grp.nodes)
        func = f"kernel{len(kernels)}"
        if wl is None and (lt := transform_workload(g, grp)) is not None and best_of(lt)[0] is not None:
            wl = lt                  # a transform a model tune measured: its record, not the generic kernel
        if wl is not None:
            task = Task(wl, tgt)
            rec, where = best_of(wl)
            sched = rec.steps if rec is not None else task.space.steps(task.space.default())
            if choose is not None:
                rec, where, sched = None, "chosen", choose(task)
            cand = task.candidate(sched, func_name=func)
            if rec is not None and rec.code_hash and cand.code_hash != rec.code_hash:
                raise AssertionError(f"{wl.label}: the record's steps give other code than it logged")
            src, omp, chash = cand.source, cand.openmp, cand.code_hash
            args = list(ins) if wl.op == "layout_transform" else _task_binding(g, grp, wl, task.space.inputs)
            if wl.op == "layout_transform" and tuple(ins[0].shape) != tuple(task.space.inputs[0].shape):
                raise AssertionError(f"{wl.label}: input {list(ins[0].shape)} is not the workload's "
                                     f"{list(task.space.inputs[0].shape)}")
            label, key, expected = wl.label, wl.key, (rec.latency if rec is not None else None)
        else:
            dag = _generic_dag(g, grp.nodes, ins, out_v)
            sched, src, omp = _generic_kernel(dag, tgt, func)
            chash = code_hash(src, func)
            args, where = list(ins), GENERIC
            label, key, expected = f"{group_summary(g, grp.nodes)} -> {out_v.type_str()}", None, None
        kern = kernels.get(chash)
        if kern is None:
            kern = kernels[chash] = Kernel(func, src, omp, chash)
        steps.append(Step(gi, group_summary(g, grp.nodes), anchor_node.name, kern.func, [], label, key,
                          where, expected, gflops, chash, sched))
        step_args.append(args + [out_v])
        for v in args + [out_v]:
            if isinstance(v, np.ndarray) or v.is_const or id(v) in in_index or id(v) in out_index:
                continue
            life = lifetimes.setdefault(id(v), [gi, gi, 4 * int(np.prod(v.shape))])
            life[1] = max(life[1], gi)
        say(f"[{gi + 1}/{len(g.meta['fused_groups'])}] {steps[-1].summary}: {where}")

    lives = [Lifetime(str(k), n, a, b) for k, (a, b, n) in lifetimes.items()]
    offsets, arena_bytes = plan(lives)
    for st, args in zip(steps, step_args):
        for v in args:
            if isinstance(v, np.ndarray):
                st.args.append(Arg("weight", weights.add(("packed", st.index, len(st.args)), v)))
            elif v.is_const:
                if v.data.dtype != np.float32:
                    raise Unsupported(f"constant {v.name} is {v.data.dtype}; kernels take float32 tensors")
                st.args.append(Arg("weight", weights.add(id(v), v.data)))
            elif id(v) in in_index:
                st.args.append(Arg("input", in_index[id(v)]))
            elif id(v) in out_index:
                st.args.append(Arg("output", out_index[id(v)]))
            else:
                st.args.append(Arg("arena", offsets[str(id(v))]))

    untuned = [s for s in steps if s.anchor and s.source == DEFAULT]
    if strict and untuned:
        names = sorted({s.workload for s in untuned})
        raise UntunedError(f"--strict: {len(names)} task(s) have no record in {', '.join(logs) or 'any log'} or the "
                           f"shipped database for '{tgt}': {'; '.join(names[:5])}"
                           f"{' ...' if len(names) > 5 else ''}; tune them (tuner tune) or leave out --strict")
    blob = weights.blob()
    meta = {
        "format": 2,
        "tool": f"tuner {__version__}",
        "model": source_name,
        "model_hash": model_hash,
        "target": str(tgt),
        "layout": layout,
        "layout_plan": dict(layout_plan or {}),
        "layout_plan_from": plan_from,
        "logs": [str(p) for p in logs],
        **{side: [{"name": name, "shape": list(v.shape), "dtype": v.dtype}
                  for name, v in zip(names, values, strict=True)]
           for side, names, values in zip(("inputs", "outputs"), interface_names(graph), (g.inputs, g.outputs))},
        "arena_bytes": arena_bytes,
        "intermediate_bytes": sum(align(t.nbytes) for t in lives),
        "peak_live_bytes": peak_live_bytes(lives),
        "weights_bytes": weights.size,
        "weights_sha256": hashlib.sha256(blob).hexdigest(),
        "kernels": len(kernels),
        "steps": [s.to_json() for s in steps],
    }
    source = executor_source(list(kernels.values()), steps, declaration(meta))
    say(f"building {len(kernels)} kernels for {len(steps)} steps")
    flags = list(tgt.cflags) + (["-fopenmp"] if any(k.openmp for k in kernels.values()) else [])
    lib, err = compile_library(source, flags)
    if lib is None:
        raise AssertionError(f"the generated model library does not compile: {err}")
    meta["compile_s"] = round(time.perf_counter() - t0, 3)
    return CompiledModel(meta, lib, source, blob)


# what the library declares of its model.json (runtime.model.load checks the file against it): the
# facts running it depends on, and a hash of every field but those known only after it is built
DECLARED = ("target", "arena_bytes", "weights_bytes", "weights_sha256", "inputs", "outputs")
UNDECLARED = ("library", "compile_s")


def declaration(meta: dict) -> dict:
    fields = json.loads(json.dumps({k: v for k, v in meta.items() if k not in UNDECLARED}))   # as read back
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return {**{k: fields.get(k) for k in DECLARED}, "meta_sha256": hashlib.sha256(text.encode()).hexdigest()}


def plan_summary(layouts: dict) -> str:
    """'30 NCHW16c, 3 NHWC (convs); 1 OI (dense)'."""
    parts = []
    for dense, what in ((False, "convs"), (True, "dense")):
        counts: dict = {}
        for lay in (lay for lay in layouts.values() if L.is_dense_packing(lay) == dense):
            counts[lay] = counts.get(lay, 0) + 1
        if counts:
            parts.append(", ".join(f"{n} {lay}" for lay, n in sorted(counts.items(), key=lambda kv: -kv[1]))
                         + f" ({what})")
    return "; ".join(parts)


# ---------------------------------------------------------------- the generated executor

EXECUTOR = r"""
typedef struct { float** inputs; float** outputs; char* arena; char* weights; } tuner_ctx;
%(steps)s
typedef int (*tuner_step_fn)(const tuner_ctx*);
static const tuner_step_fn tuner_steps[] = { %(table)s };
int tuner_model_steps(void) { return %(count)d; }
/* what this library was compiled for, as JSON (runtime.model checks model.json against it) */
static const unsigned char tuner_declared[] = { %(declared)s, 0 };
const char* tuner_model_declared(void) { return (const char*)tuner_declared; }
int tuner_model_run(float** inputs, float** outputs, char* arena, char* weights) {
  tuner_ctx c = { inputs, outputs, arena, weights };
  for (int i = 0; i < %(count)d; ++i) { int rc = tuner_steps[i](&c); if (rc) return 1000 + i; }
  return 0;
}
static int tuner_call(int step, const tuner_ctx* c) {
  if (step >= %(count)d) return -1;
  if (step >= 0) return tuner_steps[step](c);
  for (int i = 0; i < %(count)d; ++i) { int rc = tuner_steps[i](c); if (rc) return rc; }
  return 0;
}
/* seconds per call of one step (step >= 0) or of the whole model (step < 0), by the kernels'
   timing rule (measure.builder.TIMING) */
int tuner_model_time(int step, float** inputs, float** outputs, char* arena, char* weights, int repeat,
                     double min_repeat_ms, double* costs) {
  tuner_ctx c = { inputs, outputs, arena, weights };
  int number = 0, flush = 0;
  TUNER_TIME_LOOP(tuner_call(step, &c));
}
/* each step's seconds in context: the whole model run `runs` times after one warm-up run, every
   step timed where it runs (its inputs as its producers left them); per_step[r * (steps + 1) + i],
   and the whole run r (steps and the dispatch between them) at per_step[r * (steps + 1) + steps] */
int tuner_model_profile(float** inputs, float** outputs, char* arena, char* weights, int runs, double* per_step) {
  tuner_ctx c = { inputs, outputs, arena, weights };
  int rc = tuner_call(-1, &c);
  for (int r = 0; r < runs && !rc; ++r) {
    double* row = per_step + r * (%(count)d + 1);
    double start = tuner_now();
    for (int i = 0; i < %(count)d && !rc; ++i) {
      double s = tuner_now();
      rc = tuner_steps[i](&c);
      row[i] = tuner_now() - s;
    }
    row[%(count)d] = tuner_now() - start;
  }
  return rc;
}
"""

_ARG_C = {"input": "c->inputs[%d]", "output": "c->outputs[%d]", "arena": "(float*)(c->arena + %d)",
          "weight": "(float*)(c->weights + %d)"}


def executor_source(kernels: list, steps: list, declared: dict) -> str:
    """The library's C: kernels, the timing harness, one function per step and the executor, which
    also declares `declared` (as bytes: names from a model file never become C text)."""
    parts = []
    for s in steps:
        args = ", ".join(_ARG_C[a.kind] % a.where for a in s.args)
        parts.append(f"/* step {s.index}: {s.summary} */\n"
                     f"static int step{s.index}(const tuner_ctx* c) {{ float* a[] = {{ {args} }}; "
                     f"return {s.func}(a); }}")
    return (PRELUDE + "\n".join(k.source for k in kernels) + TIMING
            + EXECUTOR % {"steps": "\n".join(parts), "table": ", ".join(f"step{s.index}" for s in steps),
                          "count": len(steps),
                          "declared": ", ".join(str(b) for b in json.dumps(declared, sort_keys=True).encode())})

