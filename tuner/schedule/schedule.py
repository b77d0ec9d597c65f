"""Schedules as data: stages, primitives, and replay of a JSON step list.

A step is a JSON list whose first element names the primitive:

    ["split", stage, axis, [f1, f2, ...]]    -> axis.0 (outer) ... axis.k (innermost, length fk)
    ["fuse", stage, [a, b, ...]]             -> a@b@...   (consecutive leaves)
    ["reorder", stage, [every leaf, in the new order]]
    ["annotate", stage, axis, "parallel" | "vectorize" | "unroll"]
    ["pragma", stage, axis, "auto_unroll_max_step", n]
    ["pragma", stage, axis, "unswitch", 1]   -> the nest from that loop in runs in two versions: one
                                                without the bounds tests of its selects (an inlined
                                                pad's), taken where they hold for all of its
                                                iterations, the other with them (schedule.peel)
    ["compute_at", stage, consumer_stage, consumer_axis]
    ["compute_inline", stage]
    ["compute_root", stage]
    ["cache_write", stage]                   -> new stage "<stage>.local" does the computing
    ["cache_read", tensor, scope, [readers]] -> new stage "<tensor>.<scope>" copies it; the readers
                                                read the copy (scope: "shared", a GPU block's memory)
    ["storage_order", stage, [every axis of the stage's output, outermost first]]
                                             -> its own buffer (a stage computed at a loop) stores
                                                them in that order; indexing is unchanged
    ["prefetch", stage, tensor]            -> while one panel of the input `tensor` (what one iteration
                                                of the outermost loop moving through it reads) is
                                                computed, the next is fetched into L2 (schedule.prefetch)
    ["prefetch", stage, tensor, "tile"]    -> while one tile reads its window of `tensor`, the lines
                                                the next tile reads are fetched (schedule.prefetch)
    ["bind", stage, axis, "blockIdx.x" | "threadIdx.x" | "vthread"]
                                             -> the loop is the GPU grid / block / a thread's
                                                interleaved copies of its work (schedule.vthread)

A stage computed at a loop of another gets a buffer of its own: registers or the stack
("local"), or, after cache_read with "shared", a GPU block's shared memory, which covers what
all the block's threads read (lowering relaxes threadIdx and vthread) and is filled cooperatively between
two barriers (the CUDA codegen writes them; no step names a barrier).

Steps refer to axes by name, so a logged schedule reads like what it does and replays the same
way in any process. An illegal step raises ScheduleError naming the step and the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..te.expr import Load, Reduce, transform, walk
from ..te.tensor import ComputeOp, Tensor, compute, topo_order

ANNOTATIONS = ("parallel", "vectorize", "unroll")
THREAD_TAGS = ("blockIdx.x", "threadIdx.x", "vthread")
SCOPES = ("shared",)
PREFETCHES = ("panel", "tile")   # what a prefetch step fetches ahead: the next panel of a weight, the next tile of an activation


class ScheduleError(ValueError):
    pass


@dataclass
class Stage:
    name: str
    op: ComputeOp
    leaves: list
    relations: list = field(default_factory=list)  # ("split", parent, [children], [factors]) | ("fuse", [parts], fused)
    annotations: dict = field(default_factory=dict)
    auto_unroll: dict = field(default_factory=dict)
    unswitch: set = field(default_factory=set)     # leaves whose nests run in an interior and a border version
    attach: tuple = ("root",)                      # ("root",) | ("inline",) | ("at", stage, axis)
    scope: str = "global"                          # "shared": a GPU block's memory (cache_read)
    storage: list = field(default_factory=list)    # its buffer's axes outermost first (storage_order); [] as declared

    @property
    def reduce_names(self) -> set:
        return {r.name for r in self.op.reduce_axes}

    @property
    def root_names(self) -> list:
        return [a.name for a in self.op.axes] + [r.name for r in self.op.reduce_axes]

    def is_reduce(self, leaf: str) -> bool:
        """A leaf derived from reduce axes (fuse never mixes the two kinds)."""
        return leaf.split(".")[0].split("@")[0] in self.reduce_names


class Schedule:
    """The mutable state that a step list is replayed onto."""

    def __init__(self, inputs: list, output: Tensor):
        self.inputs = list(inputs)
        self.output_name = output.name
        self.tensors = {t.name: t for t in topo_order(output)}
        for t in inputs:
            if t.name not in self.tensors:
                raise ScheduleError(f"input {t.name} is not read by {output.name}")
        self.stages = [Stage(t.name, t.op, [a.name for a in t.op.axes] + [r.name for r in t.op.reduce_axes])
                       for t in self.tensors.values() if isinstance(t.op, ComputeOp)]
        self.steps: list = []
        self.prefetches: list = []   # (input, "panel" | "tile"): what the kernel fetches ahead (schedule.prefetch)

    # ------------------------------------------------------------ lookup
    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise ScheduleError(f"no stage {name!r}; stages are {', '.join(s.name for s in self.stages)}")

    @property
    def output(self) -> Stage:
        return self.stage(self.output_name)

    def shape_of(self, name: str) -> tuple:
        return self.tensors[name].shape

    # ------------------------------------------------------------ replay
    def apply(self, step: list) -> None:
        index = len(self.steps)
        try:
            kind = step[0]
            fn = getattr(self, f"_{kind}", None) if isinstance(kind, str) else None
            if fn is None:
                raise ScheduleError(f"unknown primitive {kind!r}")
            fn(*step[1:])
        except ScheduleError as e:
            raise ScheduleError(f"step {index} {step}: {e}") from None
        except (TypeError, ValueError, IndexError) as e:
            raise ScheduleError(f"step {index} {step}: malformed step ({e})") from None
        self.steps.append(list(step))

    def _leaf(self, st: Stage, axis: str) -> int:
        if axis not in st.leaves:
            raise ScheduleError(f"{axis!r} is not a loop of {st.name}; its loops are {', '.join(st.leaves)}")
        return st.leaves.index(axis)

    def _split(self, stage: str, axis: str, factors: list):
        st = self.stage(stage)
        if st.attach[0] == "inline":
            raise ScheduleError(f"{stage} is inlined and has no loops")
        pos = self._leaf(st, axis)
        self._not_attached(stage, [axis])
        if not factors or any(not isinstance(f, int) or isinstance(f, bool) or f < 1 for f in factors):
            raise ScheduleError(f"split factors must be positive integers, got {factors}")
        children = [f"{axis}.{k}" for k in range(len(factors) + 1)]
        st.relations.append(("split", axis, children, list(factors)))
        st.leaves[pos:pos + 1] = children
        for name in (axis,):
            st.annotations.pop(name, None)

    def _fuse(self, stage: str, axes: list):
        st = self.stage(stage)
        if len(axes) < 2:
            raise ScheduleError("fuse needs at least two loops")
        pos = [self._leaf(st, a) for a in axes]
        if pos != list(range(pos[0], pos[0] + len(axes))):
            raise ScheduleError(f"fuse needs consecutive loops in order; loops are {', '.join(st.leaves)}")
        kinds = {st.is_reduce(a) for a in axes}
        if len(kinds) > 1:
            raise ScheduleError("cannot fuse a reduction loop with a spatial loop")
        self._not_attached(stage, axes)
        fused = "@".join(axes)
        st.relations.append(("fuse", list(axes), fused))
        st.leaves[pos[0]:pos[-1] + 1] = [fused]

    def _not_attached(self, stage: str, axes: list) -> None:
        """A loop that another stage is computed at stays a loop (split or fuse it before)."""
        for o in self.stages:
            if o.attach[0] == "at" and o.attach[1] == stage and o.attach[2] in axes:
                raise ScheduleError(f"{o.name} is computed at {stage}'s loop {o.attach[2]}; split or fuse that "
                                    "loop before the compute_at")

    def _reorder(self, stage: str, order: list):
        st = self.stage(stage)
        if sorted(order) != sorted(st.leaves) or len(set(order)) != len(order):
            raise ScheduleError(f"reorder must list every loop of {stage} once: {', '.join(st.leaves)}")
        st.leaves = list(order)

    def _annotate(self, stage: str, axis: str, kind: str):
        st = self.stage(stage)
        self._leaf(st, axis)
        if kind not in ANNOTATIONS:
            raise ScheduleError(f"unknown annotation {kind!r}; use one of {', '.join(ANNOTATIONS)}")
        if kind == "parallel" and st.is_reduce(axis):
            raise ScheduleError(f"cannot parallelise reduction loop {axis} (threads would race on the sum)")
        st.annotations[axis] = kind

    def _bind(self, stage: str, axis: str, tag: str):
        st = self.stage(stage)
        self._leaf(st, axis)
        if tag not in THREAD_TAGS:
            raise ScheduleError(f"unknown thread tag {tag!r}; use one of {', '.join(THREAD_TAGS)}")
        if st.is_reduce(axis):
            raise ScheduleError(f"cannot bind reduction loop {axis} to {tag} (threads would race on the sum)")
        st.annotations[axis] = tag

    def _storage_order(self, stage: str, order: list):
        st = self.stage(stage)
        names = [a.name for a in st.op.axes]
        if not isinstance(order, list) or sorted(map(str, order)) != sorted(names):
            raise ScheduleError(f"storage_order must list every axis of {stage} once: {', '.join(names)}")
        st.storage = [] if order == names else list(order)

    def _cache_read(self, tensor: str, scope: str, readers: list):
        if scope not in SCOPES:
            raise ScheduleError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
        if tensor not in self.tensors:
            raise ScheduleError(f"no tensor {tensor!r}")
        if not readers or len(set(readers)) != len(readers):
            raise ScheduleError("cache_read needs the stages that read the copy, each once")
        src = self.tensors[tensor]
        name = f"{tensor}.{scope}"
        if name in self.tensors:
            raise ScheduleError(f"{tensor} already has a {scope} copy")
        rs = [self.stage(r) for r in readers]
        for r in rs:
            if not any(isinstance(n, Load) and n.buffer == tensor for n in _walk_op(r.op)):
                raise ScheduleError(f"{r.name} does not read {tensor}")
        copy_t = compute(src.shape, lambda *i: src[i], name, tag="elemwise", inputs=[src],
                         axis_names=[f"ax{k}" for k in range(len(src.shape))])
        def fn(n):
            return Load(name, n.indices) if isinstance(n, Load) and n.buffer == tensor else None
        for r in rs:
            body = r.op.body
            new_body = (Reduce(body.combiner, transform(body.source, fn), body.axes, body.init)
                        if isinstance(body, Reduce) else transform(body, fn))
            inputs = tuple(copy_t if t.name == tensor else t for t in r.op.inputs)
            r.op = ComputeOp(r.op.name, r.op.axes, new_body, inputs, r.op.tag, r.op.table)
            old = self.tensors[r.name]              # shared with the workload's DAG: replaced, not changed
            self.tensors[r.name] = Tensor(old.name, old.shape, r.op, old.dtype)
        first = min(self.stages.index(r) for r in rs)
        names = list(self.tensors)
        items = list(self.tensors.items())
        items.insert(min(names.index(r.name) for r in rs), (name, copy_t))
        self.tensors = dict(items)
        self.stages.insert(first, Stage(name, copy_t.op, [a.name for a in copy_t.op.axes], scope=scope))

    def _pragma(self, stage: str, axis: str, name: str, value: int):
        st = self.stage(stage)
        self._leaf(st, axis)
        if name == "unswitch":
            if value != 1 or isinstance(value, bool):
                raise ScheduleError(f"the unswitch pragma takes the value 1, got {value!r}")
            st.unswitch.add(axis)
            return
        if name != "auto_unroll_max_step":
            raise ScheduleError(f"unknown pragma {name!r}; the pragmas are auto_unroll_max_step and unswitch")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ScheduleError(f"auto_unroll_max_step must be a non-negative integer, got {value!r}")
        st.auto_unroll[axis] = value

    def _prefetch(self, stage: str, tensor: str, what: str = "panel"):
        st = self.stage(stage)
        if what not in PREFETCHES:
            raise ScheduleError(f"prefetch fetches the next {' or '.join(PREFETCHES)}, got {what!r}")
        if tensor not in {t.name for t in self.inputs}:
            raise ScheduleError(f"{tensor!r} is not an input; prefetch names one of {', '.join(t.name for t in self.inputs)}")
        if not self._reads(st, tensor):
            raise ScheduleError(f"{stage} does not read {tensor}")
        if tensor in dict(self.prefetches):
            raise ScheduleError(f"{tensor} is already prefetched")
        self.prefetches.append((tensor, what))

    def _reads(self, st: Stage, tensor: str) -> bool:
        """Whether `st` reads `tensor`, itself or through the stages inlined into it."""
        inlined = {s.name: s for s in self.stages if s.attach[0] == "inline"}
        todo = [st]
        while todo:
            for n in _walk_op(todo.pop().op):
                if isinstance(n, Load) and n.buffer == tensor:
                    return True
                if isinstance(n, Load) and n.buffer in inlined:
                    todo.append(inlined[n.buffer])
        return False

    def _compute_at(self, stage: str, target: str, axis: str):
        st, tg = self.stage(stage), self.stage(target)
        if stage == self.output_name:
            raise ScheduleError("the output stage cannot be computed at another stage")
        if st is tg:
            raise ScheduleError("a stage cannot be computed at itself")
        self._leaf(tg, axis)
        if tg.attach[0] == "inline":
            raise ScheduleError(f"{target} is inlined and has no loops to attach to")
        st.attach = ("at", target, axis)

    def _compute_root(self, stage: str):
        self.stage(stage).attach = ("root",)

    def _compute_inline(self, stage: str):
        st = self.stage(stage)
        if stage == self.output_name:
            raise ScheduleError("the output stage cannot be inlined")
        if st.op.is_reduction:
            raise ScheduleError(f"{stage} is a reduction and cannot be inlined")
        if any(o.attach[0] == "at" and o.attach[1] == stage for o in self.stages):
            raise ScheduleError(f"another stage is computed at {stage}; inline would remove its loops")
        st.attach = ("inline",)

    def _cache_write(self, stage: str):
        st = self.stage(stage)
        if st.relations or st.attach != ("root",):
            raise ScheduleError("cache_write must come before any other step on the stage")
        if not st.op.is_reduction:
            raise ScheduleError(f"{stage} is not a reduction; cache_write makes an accumulator for one")
        local_name = f"{stage}.local"
        old = self.tensors[stage]
        local_op = ComputeOp(local_name, st.op.axes, st.op.body, st.op.inputs, st.op.tag)
        local = Tensor(local_name, old.shape, local_op)
        copy_t = compute(old.shape, lambda *i: local[i], stage, tag="elemwise", inputs=[local],
                         axis_names=[f"{a.name}_" for a in st.op.axes])
        self.tensors = {**{k: v for k, v in self.tensors.items() if k != stage}, local_name: local, stage: copy_t}
        idx = self.stages.index(st)
        local_stage = Stage(local_name, local_op, list(st.leaves))
        st.op = copy_t.op
        st.leaves = [a.name for a in copy_t.op.axes]
        self.stages.insert(idx, local_stage)


def _walk_op(op: ComputeOp):
    body = op.body
    yield from walk(body.source if isinstance(body, Reduce) else body)


def replay(inputs: list, output: Tensor, steps: list) -> Schedule:
    sch = Schedule(inputs, output)
    for step in steps:
        sch.apply(step)
    return sch


__all__ = ["Schedule", "Stage", "ScheduleError", "replay", "ANNOTATIONS", "THREAD_TAGS", "SCOPES"]
