"""`tuner compile`: a model and tuning logs -> one shared library, one weights file, one arena plan.

Every fused group of the optimised graph becomes one kernel call (a step):
  * a group that is a task (an anchor with its epilogue: `ExtractTasks`' workload) gets the best
    record of the given logs, then of the shipped database (`tuner/schedules/`), else the default
    schedule of its search space: apply-best, loud about misses;
  * a group that is one layout transform of an activation takes the best record of its
    `layout_transform` workload when a log has one (a model tune measures every transform its
    layout plan can need), else it is generic like the rest;
  * every other group (layout transforms, flatten, concat, softmax, broadcast chains, ...) gets a
    tensor expression built node by node from the operator registry (`ops.OPS`) and the
    default schedule of the same search space (producers inlined, inner loop vectorised, outer
    loops parallel); a DAG that space cannot schedule is computed stage by stage.
Kernels with equal code are compiled once and shared. The steps run in graph order from a
generated C entry point over one arena (compiler.memory); weights are laid out in their kernels'
layouts at compile time and stored in one binary file.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..codegen.c import STACK_LIMIT_BYTES, generate_c
from ..database import records
from ..database.union import Database
from ..errors import UserError
from ..graph import Graph, load
from ..graph.dynamic import is_start, load_at, load_range, parse_dynamic
from ..graph.ir import graph_digest, graph_structure, interface_names
from ..graph.layout_plan import anonymous_structure, default_plan, whole_tiles, winograd_convs
from ..graph.models import MODELS
from ..graph.onnx_frontend import input_dims
from ..graph.passes import GRAPH_CHOICES, optimize
from ..graph.passes.extract_tasks import group_summary, transform_workload, workload_of
from ..ops import WORKLOADS, Unsupported, flops, to_te
from ..runtime.artifact import (FLOAT_EXACT, GENERIC, IN_MODEL, OTHER_THREADS, PLAIN, PREDICTED, SHIPPED, UNTUNED, Arg, Step,
                                declaration)
from ..runtime.model import CompiledModel, weights_storage
from ..schedule.inplace import writes_over
from ..schedule.ir import flat_index, vector_split
from ..schedule.lower import lower
from ..schedule.schedule import Schedule, ScheduleError, replay
from ..search.predict import Predictor
from ..space.sketch import FOREIGN, SearchSpace
from ..target import Target, parse_target
from ..task import Task, by_code, code_hash
from ..te import layouts as L
from ..te.dynamic import DynamicError, box, described, fit_dims, fit_table, monomials, with_bodies
from ..te.expr import Call, Load, coefficient, walk
from ..te.layouts import plan_summary
from ..te.tensor import placeholder
from ..toolchain.cc import compile_object, compile_objects, compile_parts
from ..toolchain.spills import spilled_accumulators
from .executor import executor_parts, executor_source, kernel_part
from .memory import Lifetime, align, peak_live_bytes, plan

DEFAULT_LAYOUT = "NCHW16c"


@dataclass
class Kernel:
    func: str
    source: str
    openmp: bool
    code_hash: str


class UntunedError(UserError):
    """--strict and some anchor task has no record."""


COMPARED = 1 << 24          # bytes of two equal-hashed weights compared at once (no temporary of a whole weight)


@dataclass(frozen=True, eq=False)
class _Packed:
    """A dense weight [K, C] as its kernel reads it, packed in blocks of `block` rows
    (layouts.dense_weight_from_oi) only when it is written into the weights storage, so that a
    model's packed weights are never all held beside the graph's."""
    source: np.ndarray
    block: int
    is_const = True

    @property
    def shape(self) -> tuple:
        k, c = self.source.shape
        return (-(-k // self.block), c, self.block)

    @property
    def nbytes(self) -> int:
        return 4 * int(np.prod(self.shape))

    def write(self, out: np.ndarray) -> None:
        L.dense_weight_from_oi(self.source, self.block, out.view(np.float32).reshape(self.shape))


class _Weights:
    """Constants packed into one 64-byte aligned blob, each content stored once: the steps of an
    unrolled RNN, or layers that share their weights (ALBERT), read one copy of a weight each
    packs alike, which then stays in cache from step to step. The arrays are kept as they are
    (no copy) until `fill` writes them, once, into the model's weights storage: a model of 1 GiB
    of weights is never held as bytes, a blob and a copy of the blob beside its arrays."""

    def __init__(self):
        self.chunks: list = []
        self.size = 0
        self.offsets: dict = {}     # (bytes, a sample's hash) -> [(offset, array)]: equal contents compared whole

    def add(self, data) -> int:
        """The offset of `data` (an array, or a _Packed weight: equal to another only where both
        pack equal sources alike) in the storage."""
        packed = isinstance(data, _Packed)
        flat = np.ascontiguousarray(data.source if packed else data, dtype=np.float32).reshape(-1).view(np.uint8)
        nbytes = data.nbytes if packed else flat.size
        same = self.offsets.setdefault((nbytes, data.shape if packed else None, _sample_hash(flat)), [])
        for off, other in same:
            if all(np.array_equal(other[k:k + COMPARED], flat[k:k + COMPARED]) for k in range(0, flat.size, COMPARED)):
                return off
        off = self.size
        self.chunks.append((off, nbytes, data if packed else flat))
        same.append((off, flat))
        self.size = align(off + nbytes)
        return off

    def fill(self, out: np.ndarray) -> None:
        """Write every chunk at its offset into `out` (uint8, at least `size` long); the gaps between
        them are zeros."""
        end = 0
        for off, nbytes, data in self.chunks:
            out[end:off] = 0
            if isinstance(data, _Packed):
                data.write(out[off:off + nbytes])
            else:
                out[off:off + nbytes] = data
            end = off + nbytes
        out[end:self.size] = 0


def _sample_hash(flat: np.ndarray) -> bytes:
    """A hash of up to 64 KiB of `flat` spread over it: equal arrays hash alike, and arrays that
    differ almost always differ in the sample (random weights do everywhere), so that only equal
    contents, or the rare pair differing outside the sample, are compared whole."""
    step = max(1, flat.size // 65536)
    return hashlib.blake2b(np.ascontiguousarray(flat[::step]).data, digest_size=16).digest()


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
    binding = dict(zip(WORKLOADS[wl.op].operands, anchor.inputs))
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
            out.append(_Packed(_carried_const(v), wl.blocks[1]))      # packed once, into the weights storage
            continue
        # a view may re-shape an activation (a dense's rows), never re-block one: blocked, the shapes agree
        if int(np.prod(v.shape)) != int(np.prod(t.shape)) or (t.name == "weight" and tuple(v.shape) != t.shape) or \
                (not v.is_const and L.block_of(v.layout or "") and tuple(v.shape) != tuple(t.shape)):
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


def _stage_steps(st, target: Target, parallel: bool = True, name: str = "", rows: int = 1) -> list:
    """A stage computed whole: its innermost loop vectorised where its extent allows
    (schedule.ir.vector_split; a reduction's innermost reduction loop as a vector of partial results),
    and with several threads the spatial axes outside it fused and run in parallel. name: the
    stage that computes it, where that is another (its cache_write accumulator). rows: a block of
    that many rows is computed at once, so a reduction vectorised along its last axis runs its rows
    inside the reduction, unrolled, each vector it loads feeding every row's FMA, over as many
    columns at a time as keep the accumulators in registers (block_rows)."""
    axes = [a.name for a in st.op.axes]
    stage = name or st.name
    steps = []
    if _spatial_vector(st, target):     # a reduction whose reads run along its last spatial axis
        reduce, inner, extent, spatial = [a.name for a in st.op.reduce_axes], axes[-1], st.op.axes[-1].extent, True
        if rows > 1 and len(axes) > 1:
            fits = [c for c in range(target.lanes, _accumulators(target) // rows * target.lanes + 1, target.lanes)
                    if extent % c == 0]
            cols = max(fits, default=extent)
            split = extent > cols
            if split:
                steps.append(["split", stage, inner, [cols]])
                inner, extent = f"{axes[-1]}.1", cols
            steps += [["reorder", stage, axes[:-2] + ([f"{axes[-1]}.0"] if split else []) + reduce + [axes[-2], inner]],
                      ["annotate", stage, axes[-2], "unroll"]]
            axes = axes[:-1]                # the row axis is inside the reduction now: not an outer loop
        else:
            steps.append(["reorder", stage, axes[:-1] + reduce + axes[-1:]])
    else:
        iv = st.op.reduce_axes[-1] if st.op.is_reduction else st.op.axes[-1] if axes else None
        inner, extent, spatial = (iv.name, iv.extent, not st.op.is_reduction) if iv is not None else (None, 0, False)
    vector = inner is not None and vector_split(extent, target.lanes)[0] > 0
    outer = axes[:-1] if vector and spatial else axes
    steps += [["annotate", stage, inner, "vectorize"]] if vector else []
    if parallel and target.threads > 1 and outer:
        if len(outer) > 1:
            steps.append(["fuse", stage, outer])
        steps.append(["annotate", stage, "@".join(outer), "parallel"])
    return steps


def _strides(st, axis: str) -> list:
    """The element stride of each of the stage's reads along `axis` (None: not affine in it)."""
    shapes = {t.name: t.shape for t in st.op.inputs}
    return [coefficient(flat_index(ld.indices, shapes[ld.buffer]), axis)
            for ld in walk(st.op.body) if isinstance(ld, Load) and ld.buffer in shapes]


def _spatial_vector(st, target: Target) -> bool:
    """A reduction is vectorised along its last spatial axis, with the reductions outside it, where
    a read strides along its innermost reduction and every read is contiguous or constant along
    that axis (a GEMM's B operand: P.V in attention); else along its innermost reduction."""
    if not st.op.is_reduction or not st.op.axes or vector_split(st.op.axes[-1].extent, target.lanes)[0] == 0:
        return False
    along_reduce, along_axis = _reduce_and_axis_strides(st)
    return any(s not in (0, 1) for s in along_reduce) and all(s in (0, 1) for s in along_axis)


def _reduce_and_axis_strides(st) -> tuple:
    """The strides of a reduction's reads along its innermost reduction and its last spatial axis."""
    return _strides(st, st.op.reduce_axes[-1].name), _strides(st, st.op.axes[-1].name)


def _reduction_vector(st, target: Target) -> bool:
    """A reduction better vectorised along its innermost reduction than along its last spatial axis:
    every read contiguous or constant along the reduction, some read strided along the axis."""
    if not st.op.is_reduction or not st.op.axes or vector_split(st.op.reduce_axes[-1].extent, target.lanes)[0] == 0:
        return False
    along_reduce, along_axis = _reduce_and_axis_strides(st)
    return all(s in (0, 1) for s in along_reduce) and any(s not in (0, 1) for s in along_axis)


def _row_steps(stages: list, target: Target) -> list | None:
    """A group with a reduction (softmax, layer_norm, what feeds a softmax, attention) computed row
    by row: every stage at the output's row loop, so a row's intermediates stay in registers and
    L1 instead of whole tensors in memory; None where the output has one axis. An output that is
    a reduction itself (attention's P.V) accumulates in a buffer of the row (cache_write). Cheap
    element-wise stages (no call: a slice, a scale, an add) are inlined into their readers
    instead: recomputing them costs less than a pass that stores the row and one that loads it
    back. Whether each stage is then computed once (its reduction runs along the row) is
    _rows_fit's to check. With several threads the rows run in parallel."""
    out, inner = stages[-1], stages[:-1]
    if len(out.op.axes) < 2 or not any(st.op.is_reduction for st in inner):
        return None
    cheap = [st.name for st in inner if not st.op.is_reduction and not any(isinstance(n, Call) for n in walk(st.op.body))]
    steps = [["compute_inline", name] for name in cheap]
    axes = [a.name for a in out.op.axes]
    if out.op.is_reduction:
        steps.append(["cache_write", out.name])
        axes = [f"{a}_" for a in axes]            # the copy's axes (Schedule._cache_write)
    outer = axes[:-1]
    if (r := block_rows(stages, target)) > 1:    # blocks of r rows: the row axis split, its outer part fused
        m = axes[-2]
        steps += [["split", out.name, m, [r]], ["reorder", out.name, axes[:-2] + [f"{m}.0", f"{m}.1", axes[-1]]]]
        outer = axes[:-2] + [f"{m}.0"]
    if len(outer) > 1:
        steps.append(["fuse", out.name, outer])
    at = "@".join(outer)
    local = [f"{out.name}.local"] if out.op.is_reduction else []
    steps += [["compute_at", name, out.name, at] for name in local + [st.name for st in inner if st.name not in cheap]]
    steps += [step for st in inner if st.name not in cheap
              for step in _stage_steps(st, target, parallel=False, rows=r)]
    if out.op.is_reduction:
        steps += _stage_steps(out, target, parallel=False, name=local[0], rows=r)
        steps += [["annotate", out.name, axes[-1], "vectorize"]] if vector_split(out.op.axes[-1].extent, target.lanes)[0] else []
    else:
        steps += _stage_steps(out, target, parallel=False)
    if target.threads > 1:
        steps.append(["annotate", out.name, at, "parallel"])
    return steps


def block_rows(stages: list, target: Target) -> int:
    """Rows computed together by a row-by-row group whose output is a reduction vectorised along
    its last axis (attention's P.V): the most, dividing the output's rows, whose accumulator
    vectors fit 3/4 of the vector registers (with AVX-512 four rows of 64 columns), else 1."""
    out = stages[-1]
    if not out.op.is_reduction or len(out.op.axes) < 2 or not _spatial_vector(out, target):
        return 1
    vectors = -(-out.op.axes[-1].extent // target.lanes)
    return max(d for d in range(1, 9) if out.op.axes[-2].extent % d == 0 and d * vectors <= _accumulators(target)
               or d == 1)


def _accumulators(target: Target) -> int:
    """Vector registers a register tile may hold as accumulators: 3/4 of them."""
    return (32 if target.lanes >= 16 else 16) * 3 // 4


def _rows_fit(fn, sch: Schedule, target: Target) -> bool:
    """Every stage computed at a row computes no more elements over all rows than its tensor has
    (a stage whose row region is bigger, a column mean, would be recomputed row after row), and
    its row buffer fits the stack (a longer row falls back to stage by stage rather than to an
    allocation per row)."""
    rows = int(np.prod(sch.shape_of(sch.output_name)[:-1])) // block_rows(sch.stages, target)   # row blocks
    local = [(name, int(np.prod(b.shape))) for name, b in fn.buffers.items() if b.scope == "local"]
    return all(n * rows <= int(np.prod(sch.shape_of(name.removesuffix(".local")))) and 4 * n <= STACK_LIMIT_BYTES
               for name, n in local)       # a cache_write's accumulator has its stage's shape


def _generic_kernel(dag: tuple, target: Target, func: str, dims=None, over: tuple = ()):
    """(steps, C source, uses OpenMP, the input it writes over or None) of a generic group: the
    default point of its search space, else row by row (_row_steps: groups with reductions over
    the last axis), else every stage computed whole, one after the other (_stage_steps: vectorised
    and parallel where they can be), else the same without (always legal). over: the indices of
    the inputs whose memory the output may take, the first that schedule.inplace allows taken."""
    sch = Schedule(*dag)
    tries = [[step for st in sch.stages for step in _stage_steps(st, target)], []]
    if (rows := _row_steps(sch.stages, target)) is not None:
        tries.insert(0, rows)
    try:
        space = SearchSpace(None, target, dag)
        # the space's tiles vectorise the output's last axis: after the others where a reduction reads
        # along it with strides and along its reduction contiguously (one row times K^T: a dot per key)
        tries.insert(len(tries) - 1 if any(_reduction_vector(st, target) for st in sch.stages) else 0,
                     space.steps(space.default()))
    except (ValueError, ScheduleError):   # more than one reduction (softmax): row by row, or stage by stage
        pass
    last_error = None
    for steps in tries:
        try:
            fn = lower(replay(*with_bodies(dag[0], dag[1], dims.bodies if dims else {}), steps), dims=dims)
        except (ScheduleError, ValueError) as e:
            last_error = e
            continue
        if steps is rows and not _rows_fit(fn, sch, target):
            continue
        taken = next((k for k in over if writes_over(fn, dag[0][k].name)), None)
        aliased = frozenset((dag[0][taken].name, fn.args[-1].name)) if taken is not None else frozenset()
        src, omp = generate_c(dataclasses.replace(fn, name=func), target.lanes, target.threads, aliased)
        return steps, src, omp, taken
    raise AssertionError(f"no schedule lowers for {dag[1].name}: {last_error}")


def compile_model(model, log=None, target: str | Target = "cpu", threads: int | None = None,
                  layout: str | None = None, input_shapes: dict | None = None, strict: bool = False,
                  use_shipped: bool = True, progress=None, choose=None, layout_plan: dict | None = None,
                  predict: bool = True, fuse_attention: bool | None = None, merge_dense: bool | None = None,
                  dynamic=None, buckets: list | None = None, in_model: dict | None = None):
    """Compile a built-in model, an ONNX file or a Graph with the best schedules of `log` (a path or
    a list of paths). Returns a runtime.model.CompiledModel.

    layout_plan: {conv node name: layout} for convolutions that run in another layout
    than `layout` (graph.layout_plan: what the solver chose).

    predict: a task no record covers runs the shipped cost model's pick (search.predict) where
    the target's ISA has a model; False: its default schedule.

    fuse_attention: each attention as one kernel (True) or as its batch_matmuls and a softmax
    (False); merge_dense: dense layers reading one activation as one GEMM (True) or apart. None:
    as the layout plan's timed choice says (graph.passes.GRAPH_CHOICES), else False.

    dynamic: ranges of input dimensions (graph.dynamic.parse_dynamic: "input_ids=1x[1..512]" or
    {"input_ids": [1, (1, 512)]}): one artifact that runs any shape in them (issue 37). buckets:
    values of its one varying symbol whose records in `log` each task takes where they apply, a
    version per value dispatched on the run's value (default with a log: the values its plans of
    this model were tuned at by tune_dynamic, else graph.dynamic.default_buckets).

    in_model: {workload key: record code hash} whose task runs its default schedule while that
    record is its best (a plan line's `defaults`, records.PlanRecord; default: the found plan's).

    A log whose plan of the model is marked `untuned` (its tune timed the untuned compile faster
    whole) is left out: the compile is the one it would be without that log.

    choose: for tests, a function Task -> steps that replaces apply-best (its steps are reported
    as coming from 'chosen')."""
    t0 = time.perf_counter()
    say = progress or (lambda msg: None)
    tgt = parse_target(target, threads)
    if tgt.kind != "cpu":
        raise UserError(f"a whole model compiles for CPU targets in this version, not {tgt.kind}: "
                        "use --target cpu")
    chosen_layout, layout = layout, layout or DEFAULT_LAYOUT
    L.check_activation_layout(layout)
    family = _Family.load(model, dynamic, input_shapes) if dynamic is not None else None
    graph = family.graphs[0] if family else model if isinstance(model, Graph) else load(str(model), input_shapes)
    source_name = graph.name if isinstance(model, Graph) else str(model)
    logs = [str(p) for p in ([log] if isinstance(log, (str, Path)) else list(log or []))]
    db = Database.open(logs, tgt, use_shipped)
    model_hash, structure = graph_digest(graph), graph_structure(graph)
    anonymous = functools.cache(lambda: anonymous_structure(graph))      # the passes before layouts: asked once
    if layout_plan is None and family is None:
        db, left_out = _without_untuned(db, graph, model_hash, tgt, structure, anonymous)
        logs = [p for p in logs if p not in left_out]
    layout_plan, plan_from, timed, found_in_model = _layout_plan(db, graph, model_hash, tgt, layout, layout_plan,
                                                                 source_name, say, structure, anonymous)
    in_model = found_in_model if in_model is None else in_model
    if layout_plan is None and chosen_layout is None \
            and (layout_plan := whole_tiles(default_plan(graph, layout, tgt.lanes), family.graphs if family else [],
                                            family.symbols if family else ())):
        plan_from = "default"
        say(f"layout plan (default, none measured): {plan_summary(layout_plan)}")
    elif family and layout_plan and (whole := whole_tiles(layout_plan, family.graphs, family.symbols)) != layout_plan:
        say(f"layout plan for the range: {plan_summary(whole)} (Winograd tiles the outputs are whole multiples of "
            "at every size)")
        layout_plan = whole
    if not str(plan_from).startswith(SHIPPED) and any(n.op == "conv2d" for n in graph.nodes) and \
            any(s.name == SHIPPED for s in db.sources):
        # a shipped conv record was tuned inside its model's plan: outside it (a model no shipped plan
        # fits) such records ran 0.97-1.07x the defaults' time (docs/history.md), so the defaults run
        db = Database([s for s in db.sources if s.name != SHIPPED])
        say("no shipped layout plan fits this model: its convs take no shipped record")
    given = {"fuse_attention": fuse_attention, "merge_dense": merge_dense}
    choices = {c: (given[c], "given") if given[c] is not None else (timed[c]["on"], plan_from) if c in timed
               else (False, "default") for c in GRAPH_CHOICES}
    options = dict(layout=layout, layout_plan=layout_plan, lanes=tgt.lanes, **{c: on for c, (on, _) in choices.items()})
    g = optimize(graph, **options)
    if family:
        family.optimised([g] + [optimize(gp, **options) for gp in family.graphs[1:]])
        found = family.logged(db, tgt) if logs else []          # (and each bucket's measured ends)
        family.bucket(buckets if buckets is not None else found, options, say)
    elif buckets:
        raise UserError("--buckets are values of a --dynamic range: give --dynamic too")
    say(f"optimised {graph.name}: {len(graph.nodes)} nodes -> {len(g.nodes)}, "
        f"{len(g.meta['fused_groups'])} fused groups")
    io = _Interface(g)
    predictor = Predictor(tgt) if predict and choose is None else None
    if predictor is not None:
        predictor.start([Task(t.workload, tgt) for t in g.meta["tasks"] if t.workload is not None
                         and t.workload.op in predictor.ops and db.best(t.workload, tgt)[0] is None])
    if choose is None and family is None:
        _build_defaults([Task(t.workload, tgt) for t in g.meta["tasks"]
                         if t.workload is not None and db.best(t.workload, tgt)[0] is None])
    try:
        low = _lower_groups(g, io, db, tgt, choose, say, predictor, family, in_model)
    finally:
        if predictor is not None:
            predictor.close()
    lives, arena_bytes, weights = _place_arguments(low, io)
    if strict:
        _check_tuned(low.steps, logs, tgt)
    if stale := db.stale_warning():
        warnings.warn(stale, stacklevel=2)
    storage = weights_storage(weights.size, weights.fill)
    meta = {
        "format": 2,
        "tool": f"tuner {__version__}",
        "model": source_name,
        "model_hash": model_hash,
        "target": str(tgt),
        "layout": layout,
        "layout_given": chosen_layout is not None,
        "layout_plan": dict(layout_plan or {}),
        "layout_plan_from": plan_from,
        "choices": {c: {"on": on, "from": src} for c, (on, src) in choices.items()},
        "logs": logs,
        **{side: [{"name": name, "shape": list(v.shape), "dtype": v.dtype, **_carried(g, v),
                   **(family.interface(side, k) if family else {})}
                  for k, (name, v) in enumerate(zip(names, values, strict=True))]
           for side, names, values in zip(("inputs", "outputs"), interface_names(graph), (g.inputs, g.outputs))},
        **({"symbols": [{"name": s.name, "lo": s.lo, "hi": s.hi, **({"step": s.step} if s.step > 1 else {})}
                         for s in family.symbols],
            "dynamic": family.dyn.spec(), **({"run_time": sorted(map(list, family.run_time))} if family.run_time else {})} if family else {}),
        "arena_bytes": arena_bytes,
        "intermediate_bytes": sum(align(t.nbytes) for t in lives),
        "peak_live_bytes": peak_live_bytes(lives, _over(low)),
        "weights_bytes": weights.size,
        "weights_sha256": hashlib.sha256(storage[0].view(np.uint8)[:weights.size].data).hexdigest(),
        "kernels": len(low.kernels),
        "steps": [s.to_json() for s in low.steps],
    }
    lib, source = _build_library(low, tgt, meta, say)
    meta["compile_s"] = round(time.perf_counter() - t0, 3)
    return CompiledModel(meta, lib, source, storage)


def _carried(g: Graph, v) -> dict:
    """How an integer input travels: as float32 (kernels compute in float32), so its values must lie in
    `range` [lo, hi): within every table a gather indexes with it, and exact in float32."""
    if not v.dtype.startswith("int"):
        return {}
    lo, hi = -FLOAT_EXACT, FLOAT_EXACT
    seen, todo = {id(v)}, [v]          # v and the values that only move its elements (GPT-2 reshapes its ids)
    while todo:
        u = todo.pop()
        for n in g.nodes:
            if n.op == "gather" and n.inputs[1] is u:
                size = n.inputs[0].shape[n.attrs["axis"]]
                lo, hi = max(lo, -size), min(hi, size)
            elif n.op in _MOVES and any(i is u for i in n.inputs) and id(n.output) not in seen:
                seen.add(id(n.output))
                todo.append(n.output)
    return {"carried": "float32", "range": [lo, hi]}


_MOVES = frozenset({"reshape", "transpose", "slice", "flatten", "concat", "cast", "layout_transform"})


def _without_untuned(db, graph, model_hash, tgt, structure: str, anonymous) -> tuple:
    """(`db` without each source whose newest plan of this model is marked untuned, records.PlanRecord:
    its tune timed the compile without it faster, so neither its plan nor its records apply; the
    names of those left out). structure, anonymous: the graph's graph_structure and a callable
    giving its anonymous_structure."""
    left = []
    while True:
        found, _ = db.plan(model_hash, tgt, structure, anonymous)
        if found is None or not found.untuned:
            return db, left
        src = next(s for s in db.sources if any(p is found for p in s.contents.plans))
        warnings.warn(f"{src.name}: its tune of {found.model} on '{found.target}' timed the model's untuned "
                      "compile faster, whole, than its plan and records: compiling without that log")
        left.append(src.name)
        db = Database([s for s in db.sources if s is not src])


def _layout_plan(db, graph, model_hash, tgt, layout, layout_plan, source_name, say, structure: str, anonymous) -> tuple:
    """(the layout plan to compile with: the given one, else the newest the logs hold for this
    model and target, else None; where it came from; the graph choices that plan's tune timed; the
    records it found slower than their defaults in the model), refusing a given plan of another model."""
    plan_from, timed, defaults = "given" if layout_plan else None, {}, {}
    if layout_plan is None:
        found, where = db.plan(model_hash, tgt, structure, anonymous)
        names = {n.name for n in graph.nodes}
        if found is not None and found.anonymous and not set(found.layouts) <= names \
                and anonymous()[0] == found.anonymous:     # another export of the architecture: its names
            found = found.renamed(anonymous()[1]) or found
        if found is not None:
            layout_plan, plan_from, timed, defaults = found.layouts, where, found.choices, found.defaults
            if found.padded:        # as an untuned compile: its Winograd convs, channels padded (PadChannels)
                layout_plan = winograd_convs(found.layouts)
            say(f"layout plan from {where}: {plan_summary(found.layouts)}")
        elif planned := db.planned_models():
            same = any(Path(m).resolve() == Path(str(source_name)).resolve() for m in planned)
            shapes = " at these input shapes" if same else ""          # (say, a dynamic tune's buckets)
            convs = " (the default layouts)" if any(n.op == "conv2d" for n in graph.nodes) else ""
            warnings.warn(f"the log holds a layout plan of {', '.join(planned)} but none of this model{shapes} "
                          f"on '{tgt}': compiling {source_name} without one{convs}")
    unknown = sorted(set(layout_plan or {}) - {n.name for n in graph.nodes if n.op in ("conv2d", "dense")})
    if unknown:
        said = (f"the layout plan ({plan_from}) names {len(unknown)} conv or dense node(s) that {source_name} does "
                f"not have: {', '.join(unknown[:4])}")
        if plan_from == "given":
            raise UserError(f"{said}; give a plan of this model")
        warnings.warn(f"{said} (its nodes were renamed?): compiling without it (the default layouts)")
        return None, None, {}, {}
    return layout_plan, plan_from, timed, defaults


class _Interface:
    """Where the optimised graph's inputs and outputs are (by position); every output must be
    computed by a kernel of its own."""

    def __init__(self, g: Graph):
        self.uses = g.consumers()
        self.outputs = {id(v) for v in g.outputs}
        self.inputs = {id(v): k for k, v in enumerate(g.inputs)}
        self.out_index: dict = {}
        for k, v in enumerate(g.outputs):
            if id(v) in self.out_index or id(v) in self.inputs or v.is_const:
                raise Unsupported(f"graph output {k} ({v.name}) is a graph input, a constant or another output; "
                                  "tuner compile needs every output computed by a kernel of its own")
            self.out_index[id(v)] = k

    def outside_arena(self, v) -> bool:
        return isinstance(v, np.ndarray) or v.is_const or id(v) in self.inputs or id(v) in self.out_index


class _Family:
    """A dynamic model (graph.dynamic): imported and optimised at the sample points of its symbols,
    the bound first. Fits each group's dimensions (te.dynamic) and checks what a layout at the bound
    assumes: every run's data is the start of each dimension, in every view of a buffer."""

    def __init__(self, dyn, graphs: list, path: str = "", input_shapes: dict | None = None,
                 run_time: frozenset = frozenset()):
        self.dyn, self.graphs, self.symbols, self.points = dyn, graphs, dyn.symbols, dyn.points
        self.path, self.input_shapes, self.run_time = path, dict(input_shapes or {}), run_time
        self.gs: list = []
        self.io: list = []
        self.buckets: list = []      # [(value of the varying symbol, the model optimised there)], ascending
        self.symbol = None           # the index of that symbol
        self.ends: dict = {}         # bucket value -> its newest plan's ends (records.PlanRecord.ends)

    @staticmethod
    def load(model, dynamic, input_shapes) -> "_Family":
        path = str(model)
        if isinstance(model, Graph) or path in MODELS or not (Path(path).exists() or path.endswith(".onnx")):
            raise UserError(f"--dynamic needs an ONNX file whose inputs have dynamic axes, not {model}; export the "
                            "model with them (torch.onnx.export(..., dynamic_axes=...))")
        dyn = parse_dynamic(dynamic, input_dims(path))
        if clash := set(dyn.dims) & set(input_shapes or {}):
            raise UserError(f"--input-shape and --dynamic both give {', '.join(sorted(clash))}; give one")
        graphs, run_time = load_range(path, dyn, input_shapes)
        return _Family(dyn, graphs, path, input_shapes, run_time)

    def logged(self, db, tgt) -> dict | None:
        """{value of the one varying symbol: the graph hashes of its plans} where the user's logs
        hold a plan made for a range of this model's shapes (tune --dynamic, records.PlanRecord.dynamic)
        at that value, other dims as compiled, for this target's ISA; None where they hold none (the
        default buckets then)."""
        moving = [k for k, s in enumerate(self.symbols) if s.lo < s.hi]
        if len(moving) != 1:
            return None
        k, isa, found = moving[0], records.code_target(str(tgt))[:2], {}
        name, axis = next((n, d) for n, dims in self.dyn.dims.items() for d, x in enumerate(dims) if x == ("sym", k))
        plans = sorted((p for src in db.sources if src.name != SHIPPED for p in src.contents.plans),
                       key=lambda p: p.timestamp)
        for p in plans:
            shape = p.shapes.get(name, [])
            v = shape[axis] if p.dynamic and len(shape) > axis else None
            if v is not None and self.symbols[k].step > 1:          # the symbol's value, not the dim's
                v = v // self.symbols[k].step if v % self.symbols[k].step == 0 else None
            if v is None or not self.symbols[k].lo <= v < self.symbols[k].hi \
                    or (records.code_target(p.target) or ())[:2] != isa:
                continue
            want = self.dyn.shapes(self.dyn.at(k, v), self.input_shapes)
            if all(p.shapes.get(n) == list(s) for n, s in want.items()):
                found.setdefault(v, set()).add(p.model_hash)
                self.ends[v] = p.ends            # the newest plan's (versions checks their codes)
        return found or None

    def bucket(self, values, options: dict, say) -> None:
        """The model optimised at each of `values` of its one varying symbol (None: the default
        buckets; with several varying symbols, none; a dict: Family.logged's, each kept where
        the model there is the one its plan names) whose kernels are the bound's; a value where
        they are not is left out, said."""
        if values == [] or (values is None and sum(s.lo < s.hi for s in self.symbols) != 1):
            return
        hashes = values if isinstance(values, dict) else {}
        k, values = self.dyn.buckets(sorted(values) if hashes else values)
        for v in values:
            graph = load_at(self.path, self.dyn.shapes(self.dyn.at(k, v), self.input_shapes), self.run_time)
            if hashes and graph_digest(graph) not in hashes[v]:
                say(f"{self.symbols[k].name}={v * self.symbols[k].step}: the log's plan there is another model's; no versions for it")
                continue
            gv = optimize(graph, **options)
            if not _same_kernels(gv, self.gs[0]):
                say(f"{self.symbols[k].name}={v * self.symbols[k].step}: the model optimises to other kernels there; no versions for it")
                continue
            self.buckets.append((v, gv))
        self.symbol = k

    def versions(self, gi: int, db, tgt, task: Task, dims, func: str, bound) -> list:
        """[(bucket, largest value served, Candidate, source)] of the records at the buckets for
        group gi's task, each replayed on the kernel for the range (a record that does not replay is
        left out). A bucket whose best is the code that the steps of the version above it (of
        `bound`, the bound's record, at the top) give at the bucket gets none: its heat timed that
        code there and it won (model_tuning.tune_dynamic), and the version above serves its values
        as well. A version serves up to its bucket, or as far above it (below the next bucket) as
        its plan's `ends` measured (model_tuning.handovers) between this kernel and the one above
        it; an end measured between other kernels is not used."""
        found = []
        for v, gv in self.buckets:
            wl = workload_of(gv, gv.meta["fused_groups"][gi])[0]
            rec, source = db.best(wl, tgt) if wl is not None else (None, None)
            if rec is not None:
                found.append((v, rec, source, wl))
        if not found:
            return []
        out, above, limit = [], bound.steps if bound is not None else None, self.symbols[self.symbol].hi
        for v, rec, source, wl in reversed(found):
            here = Task(wl, tgt)
            code, code_above = here.code(rec.steps), here.code(above) if above is not None else None
            if code_above is not None and code_above == code:
                continue
            try:
                cand = task.candidate(rec.steps, func_name=f"{func}_le{v}", dims=dims)
            except (ScheduleError, ValueError):
                continue
            end = self.ends.get(v, {}).get(wl.key, {})      # measured between these two kernels only
            upto = end["upto"] if (end.get("code"), end.get("above")) == (code, code_above) else v
            out.append((v, max(v, min(upto, limit - 1)), cand, source))
            above, limit = rec.steps, v
        return out[::-1]

    def optimised(self, gs: list) -> None:
        for p, gp in zip(self.points[1:], gs[1:]):
            if not _same_kernels(gp, gs[0]):
                raise DynamicError(f"at {described(p, self.symbols)} the model optimises to other kernels than at "
                                   f"the bounds ({len(gp.meta['fused_groups'])} against "
                                   f"{len(gs[0].meta['fused_groups'])} groups): narrow the range or compile a model "
                                   "per shape")
        self.gs = gs
        self.io = [(gp.consumers(), {id(v) for v in gp.outputs}) for gp in gs]

    def group(self, i: int, gi: int) -> tuple:
        gp = self.gs[i]
        grp = gp.meta["fused_groups"][gi]
        ins, out = _group_io(gp, grp.nodes, *self.io[i])
        return gp, grp, ins, out

    def dims(self, gi: int, task: bool):
        """The group's kernel dims (None where nothing in it varies); its constants checked."""
        def build(values):
            gp, grp, ins, out = self.group(self.points.index(values), gi)
            if not task:
                return _generic_dag(gp, grp.nodes, ins, out)
            wl = workload_of(gp, grp)[0] or transform_workload(gp, grp)
            if wl is None:
                raise DynamicError(f"{group_summary(gp, grp.nodes)} is a task at the bounds and not at "
                                   f"{described(values, self.symbols)}")
            return wl.build()

        dims = fit_dims(build, self.symbols)
        self._check_constants(gi)
        return dims if dims.tensors or dims.reduce or dims.bodies else None

    def _check_constants(self, gi: int) -> None:
        """A constant that changes with the symbols (position ids, a causal mask) must be the start
        of its value at the bounds, which the kernel reads."""
        bound = self.group(0, gi)[2]
        for i, p in enumerate(self.points[1:], 1):
            for v0, v in zip(bound, self.group(i, gi)[2]):
                if not v0.is_const:
                    continue
                if not is_start(v0.data, v.data):
                    raise DynamicError(f"constant {v0.name} at {described(p, self.symbols)} is not the start of its value at "
                                       "the bounds, which a dynamic kernel reads: what it holds depends on the "
                                       "dimension's value")

    def bind(self, gi: int, args: list, tensors: list, dims):
        """`dims` for a task's kernel that covers, in every value it reads or writes, the run's data.
        A view that merges two varying dimensions (a dense over [batch, seq] rows, both varying)
        holds its rows with gaps: the kernel's extent there becomes the prefix that covers them
        ((B - 1) * S_bound + S rows), the rows in the gaps computed into padding, where no
        reduction runs over that dimension (it would sum them); else refused."""
        if dims is None:
            return None
        _, grp0, ins0, out0 = self.group(0, gi)
        pos = {id(v): k for k, v in enumerate(ins0)} | {id(out0): -1}
        held, widened = {}, False       # (arg position, point) -> the run's data, as the kernel's tensor
        for i, p in enumerate(self.points):
            _, _, ins, out = self.group(i, gi)
            for k, (a, t) in enumerate(zip(args, tensors, strict=True)):
                if not (isinstance(a, np.ndarray) or a.is_const):
                    vp = out if pos[id(a)] == -1 else ins[pos[id(a)]]
                    mask = np.zeros(a.shape, bool)
                    mask[tuple(slice(0, n) for n in vp.shape)] = True
                    held[k, i] = mask.reshape(t.shape)
        for k, t in enumerate(tensors):
            if not any((k, i) in held for i in range(len(self.points))) or self._covers(held, k, t, dims):
                continue
            table = [{("t", t.name, d): int(np.nonzero(held[k, i].any(axis=tuple(x for x in range(t.ndim) if x != d)))[0]
                                            .max(initial=-1)) + 1 for d in range(t.ndim)} for i in range(len(self.points))]
            widen = {}
            for (_, _, d), expr in fit_table(table, self.symbols).items():
                old = (dims.tensor(t.name) + (None,) * t.ndim)[d]
                if old is not None and old != expr:
                    widen[old] = expr
            if widen and not any(e in widen for e in dims.reduce.values()):
                dims = dataclasses.replace(dims, tensors={n: tuple(widen.get(e, e) for e in sh)
                                                          for n, sh in dims.tensors.items()})
            if not self._covers(held, k, t, dims):
                raise DynamicError(f"the kernel of {group_summary(self.gs[0], grp0.nodes)} reads {args[k].name} "
                                   f"{list(args[k].shape)} as {t.name} {list(t.shape)}, which does not cover "
                                   "where its data are: a varying dimension merged with another")
            widened = True
        for k, t in enumerate(tensors):
            if widened and (gaps := self._gaps(held, k, t)):
                dims = dataclasses.replace(dims, gaps={**dims.gaps, t.name: gaps})
        return dims

    def _gaps(self, held: dict, k: int, t) -> dict:
        """{dim: (period, rows)} of tensor `t` where argument k's data lie, at every point, in the
        first `rows` (an expression of the symbols) of each `period` along the dim: two varying
        dims merged into one; {} where none does."""
        if any((k, i) not in held for i in range(len(self.points))):
            return {}
        out = {}
        for d in range(t.ndim):
            others = tuple(x for x in range(t.ndim) if x != d)
            used = [held[k, i].any(axis=others) for i in range(len(self.points))]      # rows holding data, per point
            firsts = [int(np.argmin(u)) if not u.all() else u.size for u in used]      # the first run's length
            periods = {v + int(later[0]) for u, v in zip(used, firsts) if (later := np.flatnonzero(u[v:])).size}
            if len(periods) != 1 or (p := periods.pop()) >= t.shape[d]:
                continue
            idx, rows = np.arange(t.shape[d]), [min(v, p) for v in firsts]
            if not all(np.array_equal(u, (idx % p < r) & (idx <= np.flatnonzero(u).max())) for u, r in zip(used, rows)):
                continue
            try:
                fitted = fit_table([{("gap", t.name, d): r} for r in rows], self.symbols)
            except DynamicError:
                continue
            if ("gap", t.name, d) in fitted:
                out[d] = (p, fitted[("gap", t.name, d)])
        return out

    def _covers(self, held: dict, k: int, t, dims) -> bool:
        """Whether the kernel's region of tensor `t` holds the run's data of argument k everywhere."""
        for i, p in enumerate(self.points):
            if (k, i) in held:
                region = np.zeros(t.shape, bool)
                region[box(t.shape, dims.tensor(t.name), p)] = True
                if (held[k, i] & ~region).any():
                    return False
        return True

    def interface(self, side: str, k: int) -> dict:
        """{"extents": per dim, None or monomials of the symbols} of the model's k-th input or output."""
        table = [{("v", f"{side[:-1]} {k}", d): n for d, n in enumerate(getattr(gp, side)[k].shape)} for gp in self.gs]
        fitted = fit_table(table, self.symbols)
        rank = len(getattr(self.gs[0], side)[k].shape)
        ext = [fitted.get(("v", f"{side[:-1]} {k}", d)) for d in range(rank)]
        return {"extents": [monomials(e, len(self.symbols)) if e is not None else None for e in ext]}


def _same_kernels(g: Graph, base: Graph) -> bool:
    """Whether two optimised graphs have the same fused groups, operator by operator."""
    groups, ref = g.meta["fused_groups"], base.meta["fused_groups"]
    return len(groups) == len(ref) and all([g.nodes[i].op for i in a.nodes] == [base.nodes[i].op for i in b.nodes]
                                           for a, b in zip(groups, ref))


@dataclass
class _Lowered:
    kernels: dict = field(default_factory=dict)     # code hash -> Kernel
    steps: list = field(default_factory=list)
    step_args: list = field(default_factory=list)   # per step: [(value or array)]
    lifetimes: dict = field(default_factory=dict)   # value id -> [first step, last step, bytes]


def _lower_groups(g: Graph, io: _Interface, db, tgt, choose, say, predictor=None, family=None,
                  in_model: dict | None = None) -> _Lowered:
    """One step per fused group, in graph order: a task's best record (else its default), or a
    generic kernel; kernels with equal code are shared. With a dynamic `family`, a group whose
    dimensions vary gets a dynamic kernel (te.dynamic). in_model: the plan's records that lost to
    their defaults in the model (records.PlanRecord.defaults)."""
    low, generic, tasks = _Lowered(), {}, {}
    group_of = {id(g.nodes[k]): gi for gi, grp in enumerate(g.meta["fused_groups"]) for k in grp.nodes}
    for gi, grp in enumerate(g.meta["fused_groups"]):
        ins, out_v = _group_io(g, grp.nodes, io.uses, io.outputs)
        func = f"kernel{len(low.kernels)}"
        wl, _why = workload_of(g, grp)
        if wl is None and (lt := transform_workload(g, grp)) is not None and db.best(lt, tgt)[0] is not None:
            wl = lt                  # a transform a model tune measured: its record, not the generic kernel
        dims = family.dims(gi, wl is not None) if family else None
        versions, over = [], None
        if wl is not None and dims is not None:
            task = Task(wl, tgt)
            dims = family.bind(gi, (list(ins) if wl.op == "layout_transform" else _task_binding(g, grp, wl, task.space.inputs))
                               + [out_v], list(task.space.inputs) + [task.space.output], dims)
            versions = family.versions(gi, db, tgt, task, dims, func, db.best(wl, tgt)[0])
        if wl is not None:
            kern, args, sched, where, label, expected = _task_kernel(g, grp, wl, ins, db, tgt, choose,
                                                                     f"{func}_bound" if versions else func,
                                                                     predictor, dims, in_model, tasks)
            if versions:
                kern = _dispatch(func, versions, kern, len(args) + 1, family.symbol)
        else:
            kern, args, sched, over = _generic_group(g, grp.nodes, ins, out_v, tgt, func, dims,
                                                     _dying_inputs(ins, out_v, gi, io, group_of), generic)
            where, label, expected = GENERIC, f"{group_summary(g, grp.nodes)} -> {out_v.type_str()}", None
        if not versions:               # named by its code: the object a tune built and timed is linked
            kern = Kernel(*by_code(kern.func, kern.source), kern.openmp, kern.code_hash)
        kern = low.kernels.setdefault(kern.code_hash, kern)
        anchor = g.nodes[grp.anchor] if grp.anchor is not None else g.nodes[grp.nodes[0]]
        low.steps.append(Step(gi, group_summary(g, grp.nodes), anchor.name, kern.func, [], label,
                              wl.key if wl is not None else None, where, expected,
                              sum(flops(g.nodes[k]) for k in grp.nodes), kern.code_hash, sched, dims is not None,
                              [{"bucket": v, "upto": upto, "source": src} for v, upto, _, src in versions], over))
        low.step_args.append(args + [out_v])
        for v in args + [out_v]:
            if not io.outside_arena(v):
                life = low.lifetimes.setdefault(id(v), [gi, gi, 4 * int(np.prod(v.shape))])
                life[1] = max(life[1], gi)
        say(f"[{gi + 1}/{len(g.meta['fused_groups'])}] {low.steps[-1].summary}: {where}")
    return low


def _dying_inputs(ins: list, out_v, gi: int, io: _Interface, group_of: dict) -> list:
    """The indices of the inputs of group `gi` whose memory its output could take: in the arena, as
    large as the output, and read by no later step."""
    if io.outside_arena(out_v):
        return []
    return [k for k, v in enumerate(ins) if not io.outside_arena(v) and np.prod(v.shape) == np.prod(out_v.shape)
            and max(group_of[id(n)] for n in io.uses[id(v)]) == gi]


def _task_kernel(g: Graph, grp, wl, ins: list, db, tgt, choose, func: str, predictor=None, dims=None,
                 in_model: dict | None = None, memo: dict | None = None) -> tuple:
    """(Kernel, its arguments, steps, where they came from, label, the latency the record promises)
    of a group that is a task: apply-best, else the cost model's pick, else the default; the
    default too where the plan found the best record slower than it in the model (`in_model`).
    memo: the kernels of earlier groups of the same static workload, which this one shares."""
    task = Task(wl, tgt)
    key = wl.key if memo is not None and dims is None and choose is None else None
    made = memo.get(key) if key is not None else None
    if made is None:
        made = _task_kernel_of(task, wl, db, tgt, choose, func, predictor, dims, in_model)
        if key is not None:
            memo[key] = made
    return (made[0], _task_args(g, grp, wl, ins, task), *made[1:])


def _task_args(g: Graph, grp, wl, ins: list, task: Task) -> list:
    """A task's kernel's arguments: the group's inputs bound to the workload's."""
    if wl.op == "layout_transform":
        if tuple(ins[0].shape) != tuple(task.space.inputs[0].shape):
            raise AssertionError(f"{wl.label}: input {list(ins[0].shape)} is not the workload's "
                                 f"{list(task.space.inputs[0].shape)}")
        return list(ins)
    return _task_binding(g, grp, wl, task.space.inputs)


def _task_kernel_of(task: Task, wl, db, tgt, choose, func: str, predictor, dims, in_model) -> tuple:
    """_task_kernel's (Kernel, steps, where, label, latency promised)."""
    rec, where = db.best(wl, tgt)
    plain = wl.plain() if rec is None else None
    if rec is not None and dims is None and (in_model or {}).get(wl.key) == rec.code_hash:
        rec, where, sched = None, IN_MODEL, _unspilled(task, func, dims)
    elif rec is not None:
        sched = rec.steps
    elif plain is not None and (sched := _rendered(task, db.best(plain, tgt)[0])) is not None:
        where = PLAIN                       # operands read in place: a record of them as copies
    elif predictor is not None and wl.op in predictor.ops:
        sched, where = predictor.steps(task, [_rendered(task, r) or r.steps for r in db.elsewhere(wl, tgt)]), PREDICTED
        if sched == task.space.steps(task.space.default()):      # the pick is the default (search.predict.pick)
            sched = _unspilled(task, func, dims)
    elif (sched := _rendered(task, db.other_threads(wl, tgt)[0])) is not None:
        where = OTHER_THREADS
    else:
        sched = _unspilled(task, func, dims)
    if choose is not None:
        rec, where, sched = None, "chosen", choose(task)
    cand = task.candidate(sched, func_name=func, dims=dims)
    stale = db.is_stale(rec)
    if rec is not None and rec.code_hash and cand.code_hash != rec.code_hash and not stale and dims is None:
        raise AssertionError(f"{wl.label}: the record's steps give other code than it logged")
    return (Kernel(func, cand.source, cand.openmp, cand.code_hash), sched, where, wl.label,
            rec.latency if rec is not None and not stale else None)


MIN_SPILLS = 2     # spilled accumulators from which a default gives way to a lighter variant that spills none


def _unspilled(task: Task, func: str, dims) -> list:
    """The default's steps, or those of the first of its lighter variants (SearchSpace.lighter) whose
    code spills no accumulator, where the default's spilled MIN_SPILLS or more (toolchain.spills:
    the objects built here are those the library links). One spilled chain costs less than a third
    of the tile's accumulators (the ResNet stem in AVX2 code, spilling one, ran 0.93x the time of 8),
    and a variant that still spilled some ran slower in 4 of 6 convs (docs/history.md)."""
    space = task.space
    dec = space.default()
    sched = space.steps(dec)
    lighter = space.lighter(dec) if dims is None and task.target.kind == "cpu" else []
    if not lighter or (spilled := _spills(task, sched, func)) is None or spilled < MIN_SPILLS:
        return sched
    for alt in lighter:
        if _spills(task, steps := space.steps(alt), func) == 0:
            return steps
    return sched


def _spills(task: Task, steps: list, func: str) -> int | None:
    """Spilled accumulators in the code of `steps` as the model's library builds it, or None where
    it does not build or its code cannot be read."""
    source, flags = _object_part(task, steps, func)
    obj, err = compile_object(source, list(task.target.cflags) + flags)
    return None if err is not None else spilled_accumulators(obj)


def _object_part(task: Task, steps: list, func: str) -> tuple:
    """executor_parts' part of the kernel of `steps`, named by its code as _lower_groups names it."""
    cand = task.candidate(steps, func_name=func)
    return kernel_part(by_code(func, cand.source)[1], cand.openmp)


def _build_defaults(tasks: list) -> None:
    """Build at once, on every core, the objects of the defaults that _unspilled reads (those with
    lighter variants), which the library then links from the cache."""
    parts, seen = [], set()
    for task in tasks:
        if task.workload.key not in seen and task.space.lighter(dec := task.space.default()):
            seen.add(task.workload.key)
            parts.append(_object_part(task, task.space.steps(dec), "kernel"))
    if parts:
        compile_objects(parts, list(tasks[0].target.cflags))


def _dispatch(func: str, versions: list, bound: Kernel, nargs: int, symbol: int) -> Kernel:
    """One kernel `func` that runs the first version whose range (up to its largest value served)
    holds the run's value of the symbol, else `bound` (every version is laid out at the bounds: any
    serves any value)."""
    lines = [f"int {func}(float** restrict args) {{",
             f"  const int n = ((const int*)args[{nargs}])[{symbol}];"]
    lines += [f"  if (n <= {int(upto)}) return {cand.func_name}(args);" for _, upto, cand, _ in versions]
    lines += [f"  return {bound.func}(args);", "}"]
    source = "".join(c.source for _, _, c, _ in versions) + bound.source + "\n".join(lines) + "\n"
    return Kernel(func, source, bound.openmp or any(c.openmp for _, _, c, _ in versions), code_hash(source, func))


def _rendered(task: Task, rec) -> list | None:
    """A record of another target as steps for `task`'s target: its decisions rendered by this
    target's space (a record for another thread count, parallelised for this one), or None where
    there is no record or its decisions are no point of this space."""
    if rec is None or rec.decisions is None or records.code_target(rec.target)[0] != task.target.kind:
        return None
    try:
        sched = task.space.steps(rec.decisions)
        task.space.schedule(sched)          # replays: the decisions are a point of this space
        return sched
    except FOREIGN:
        return None


def _generic_group(g: Graph, nodes: list, ins: list, out_v, tgt, func: str, dims=None, over: list = (),
                   memo: dict | None = None) -> tuple:
    """(Kernel, its arguments, steps, the input it writes over or None) of a group that is no task,
    built from the operator registry; over: as _generic_kernel's. memo: the kernels of earlier groups
    by their dataflow's structure: a group with the same structure (an unrolled RNN's steps, a
    transformer's layers) runs the same kernel, lowered and generated once."""
    dag = _generic_dag(g, nodes, ins, out_v)
    key = (_dag_key(dag), tuple(over)) if memo is not None and dims is None else None
    made = memo.get(key) if key is not None else None
    if made is None:
        sched, src, omp, taken = _generic_kernel(dag, tgt, func, dims, tuple(over))
        made = Kernel(func, src, omp, code_hash(src, func)), sched, taken
        if key is not None:
            memo[key] = made
    return made[0], list(ins), *made[1:]


def _dag_key(dag: tuple) -> tuple:
    """What lowering reads of a dataflow (placeholders, output), as a key: every tensor's name,
    shape, type and operation, an operation's inputs by name (expressions compare structurally)."""
    order, seen = [], set()

    def visit(t):
        if t.name not in seen:
            seen.add(t.name)
            for x in getattr(t.op, "inputs", ()):
                visit(x)
            order.append(t)
    for t in (*dag[0], dag[1]):
        visit(t)
    frozen = lambda v: tuple(sorted(v.items())) if isinstance(v, dict) else tuple(v) if isinstance(v, list) else v  # noqa: E731
    return tuple((t.name, t.shape, t.dtype, type(t.op).__name__,
                  tuple((k, tuple(x.name for x in v) if k == "inputs" else frozen(v)) for k, v in sorted(vars(t.op).items())))
                 for t in order)


def _place_arguments(low: _Lowered, io: _Interface) -> tuple:
    """(lifetimes, arena bytes, weights): every step argument placed in the arena (planned from
    the lifetimes), the weights blob, or the model's inputs and outputs."""
    lives = [Lifetime(str(k), n, a, b) for k, (a, b, n) in low.lifetimes.items()]
    offsets, arena_bytes = plan(lives, _over(low))
    weights = _Weights()
    for st, args in zip(low.steps, low.step_args):
        for v in args:
            if isinstance(v, (np.ndarray, _Packed)):
                st.args.append(Arg("weight", weights.add(v)))
            elif v.is_const:
                st.args.append(Arg("weight", weights.add(_carried_const(v))))
            elif id(v) in io.inputs:
                st.args.append(Arg("input", io.inputs[id(v)]))
            elif id(v) in io.out_index:
                st.args.append(Arg("output", io.out_index[id(v)]))
            else:
                st.args.append(Arg("arena", offsets[str(id(v))]))
    return lives, arena_bytes, weights


def _over(low: _Lowered) -> dict:
    """memory.plan's `over`: in-place steps' outputs and inputs by their Lifetime names."""
    return {str(id(args[-1])): str(id(args[s.inplace])) for s, args in zip(low.steps, low.step_args)
            if s.inplace is not None}


def _carried_const(v) -> np.ndarray:
    """A constant as kernels carry every tensor: float32, a bool as 0 or 1, an integer exactly."""
    d = v.data
    if d.dtype == np.float32:
        return d
    if d.dtype == np.bool_ or (d.dtype.kind in "iu" and (d.size == 0 or np.abs(d).max() < FLOAT_EXACT)):
        return d.astype(np.float32)
    raise Unsupported(f"constant {v.name} is {d.dtype}{' with values past 2^24' if d.dtype.kind in 'iu' else ''}; "
                      f"kernels carry tensors as float32")


def _check_tuned(steps: list, logs: list, tgt) -> None:
    """--strict: every task has a record."""
    names = sorted({s.workload for s in steps if s.anchor and s.source in UNTUNED})
    if names:
        raise UntunedError(f"--strict: {len(names)} task(s) have no record in {', '.join(logs) or 'any log'} or the "
                           f"shipped database for '{tgt}': {'; '.join(names[:5])}"
                           f"{' ...' if len(names) > 5 else ''}; tune them (tuner tune) or leave out --strict")


def _build_library(low: _Lowered, tgt, meta: dict, say) -> tuple:
    """(path of the model's library, its C source): kernels, steps and the executor, declaring meta."""
    apart = {s.index: low.lifetimes[id(args[-1])][2] for s, args in zip(low.steps, low.step_args)
             if s.inplace is not None}
    kernels = list(low.kernels.values())
    source = executor_source(kernels, low.steps, declaration(meta), apart)
    say(f"building {len(low.kernels)} kernels for {len(low.steps)} steps")
    lib, err = compile_parts(executor_parts(kernels, low.steps, declaration(meta), apart), list(tgt.cflags))
    if lib is None:
        raise AssertionError(f"the generated model library does not compile: {err}")
    return lib, source
