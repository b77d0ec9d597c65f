"""ExtractTasks: one tuning task per unique fused-group workload, keyed like the kernel side."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...ops import (EPILOGUE_ACTS, OPS, PATTERN, WORKLOADS, NoTask, Pattern, Workload, WorkloadError, act_params, make,
                   nchw_dims)
from ...te import layouts as L
from ..ir import Graph
from .fuse_ops import OWN_KERNEL, FusedGroup, fuse_attention
from .base import register


@dataclass
class GraphTask:
    workload: Workload | None
    weight: int                       # how many fused groups have this workload
    groups: list = field(default_factory=list)
    summary: str = ""                 # anchor + epilogue, for people
    reason: str = ""                  # why the kernel side cannot tune it yet ("" if it can)

    @property
    def tunable(self) -> bool:
        return self.workload is not None

    @property
    def flops(self) -> float:
        return self.workload.flops if self.workload else 0.0


def group_summary(graph: Graph, nodes: list) -> str:
    return " + ".join(graph.nodes[k].op for k in nodes)


_SWITCHES = ("bias", "residual", "relu")     # epilogue flags a workload takes as 0/1 parameters


def _epilogue_flags(graph: Graph, anchor: int, nodes: list):
    """Workload epilogue parameters when the epilogue is [add const][add activation][activation] in that
    order (bias, residual, then relu or one of the epilogue activations), else (None, why)."""
    flags = dict.fromkeys(_SWITCHES, 0)
    order = ["bias", "residual", "act"]
    pos = 0
    cur = graph.nodes[anchor].output
    for k in nodes:
        if k == anchor:
            continue
        n = graph.nodes[k]
        if cur not in n.inputs:
            return None, f"{n.op} does not consume the running result"
        other = [v for v in n.inputs if v is not cur]
        if n.op == "add" and other and other[0].is_const:
            kind = "bias"
        elif n.op == "add" and other and tuple(other[0].shape) == tuple(cur.shape):
            kind = "residual"
        elif n.op in EPILOGUE_ACTS or n.op == "relu":
            kind = "act"
        else:
            return None, (f"epilogue op {n.op} is not in the kernel library yet (bias add, residual add, relu, "
                          f"{', '.join(EPILOGUE_ACTS)} are)")
        if order.index(kind) < pos or (kind == "act" and (flags["relu"] or "act" in flags)) or flags.get(kind):
            return None, f"epilogue order {group_summary(graph, nodes)} is not bias, residual, activation"
        if n.op == "relu":
            flags["relu"] = 1
        elif kind == "act":
            flags["act"] = n.op
            flags.update(act_params(n))
        else:
            flags[kind] = 1
        pos = order.index(kind)
        cur = n.output
    return flags, ""


def workload_of(graph: Graph, group) -> tuple:
    """(Workload or None, reason) for a fused group: its anchor's task rule (OpDef.task) plus, for a
    workload that takes one (WorkloadDef.epilogue), the fused epilogue as parameters."""
    if group.anchor is None:
        return None, "no anchor operator (an injective or elementwise group)"
    n = graph.nodes[group.anchor]
    d = OPS.get(n.op)
    if d is None or d.task is None:
        return None, f"{n.op} has no kernel-side workload yet"
    wdef = WORKLOADS[d.name]
    try:
        params, layout = d.task(n)
        if wdef.epilogue:
            flags, why = _epilogue_flags(graph, group.anchor, group.nodes)
            if flags is None:
                return None, why
            takes = set(wdef.defaults) | set(wdef.optional)
            missing = [k for k in _SWITCHES if flags[k] and k not in takes]
            if missing:
                return None, f"{n.op} with a {missing[0]} epilogue is not in the kernel library yet"
            params.update({k: v for k, v in flags.items()
                           if k not in _SWITCHES or k in wdef.defaults or (k in wdef.optional and v)})
        elif len(group.nodes) > 1:
            return None, f"{group_summary(graph, group.nodes)}: a fused epilogue on {n.op} is not in the kernel library yet"
        return make(d.name, params, layout), ""
    except NoTask as e:
        return None, str(e)
    except WorkloadError as e:
        return None, str(e)


def transform_task(nchw: tuple, src: str, dst: str) -> Workload:
    """The layout_transform workload of an activation of NCHW shape `nchw` going from src to dst:
    what a model tune measures (graph.layout_plan) and what `tuner compile` looks up, one key."""
    n, c, h, w = nchw
    return make("layout_transform", dict(N=n, C=c, H=h, W=w, dst=dst), layout=src)


def transform_workload(graph: Graph, group) -> Workload | None:
    """The layout_transform workload of a group that is one transform of an activation (what a
    model tune measures for the layout plan's edges), else None. Not an ExtractTasks task: under
    a single layout there are two per model and they take a fraction of a percent of its time."""
    if len(group.nodes) != 1:
        return None
    n = graph.nodes[group.nodes[0]]
    if n.op != "layout_transform" or n.inputs[0].is_const or len(n.output.shape) not in (4, 5):
        return None
    try:
        wl = transform_task(nchw_dims(n.inputs[0].shape, n.attrs["src"]), n.attrs["src"], n.attrs["dst"])
    except WorkloadError:
        return None
    # a source held in a block no layout names for its channels (360 in blocks of 15) is not the
    # data the workload's kernel reads: no task
    return wl if L.act_shape(wl.layout, *nchw_dims(n.inputs[0].shape, n.attrs["src"])) == n.inputs[0].shape else None


def extract(graph: Graph) -> list:
    groups = graph.meta.get("fused_groups")
    if groups is None:
        raise ValueError("ExtractTasks needs the fused groups of FuseOps")
    tasks: dict = {}
    for gi, g in enumerate(groups):
        wl, why = workload_of(graph, g)
        key = wl.key if wl else f"untunable:{group_summary(graph, g.nodes)}:{why}"
        t = tasks.get(key)
        if t is None:
            t = tasks[key] = GraphTask(wl, 0, [], group_summary(graph, g.nodes), why)
        t.weight += 1
        t.groups.append(gi)
    return sorted(tasks.values(), key=lambda t: -t.flops * t.weight)


def split_epilogue(graph: Graph, group) -> list:
    """[group], or, when its anchor has a workload but not with all of the epilogue fused to it,
    [the anchor with the longest epilogue prefix its workload takes, the rest as a group of its
    own]: a tunable operator is never compiled as a generic kernel for an epilogue op it lacks
    (a batch_matmul and the scale after it; a dense and an activation written as pieces)."""
    anchor = group.anchor
    d = OPS.get(graph.nodes[anchor].op) if anchor is not None else None
    if d is None or d.task is None or group.nodes[0] != anchor or workload_of(graph, group)[0] is not None:
        return [group]
    after = group.nodes[1:]
    for cut in range(len(after) - 1, -1, -1):
        head, rest = [anchor] + after[:cut], after[cut:]
        inside = {id(graph.nodes[k].output) for k in head[:-1]}
        reads_inside = any(id(v) in inside for k in rest for v in graph.nodes[k].inputs)
        if not reads_inside and workload_of(graph, FusedGroup(head, anchor, group.pattern))[0] is not None:
            pattern = max(PATTERN.get(graph.nodes[k].op, Pattern.OPAQUE) for k in rest)
            return [FusedGroup(head, anchor, group.pattern), FusedGroup(rest, None, pattern)]
    return [group]


@register("ExtractTasks", 0, required=("FuseOps",))
def extract_tasks(graph: Graph, ctx) -> Graph:
    """One tuning task per unique fused-group workload, with its weight and FLOPs; a group whose
    epilogue its anchor's workload cannot take is split first (split_epilogue); with the option
    fuse_attention each attention becomes one generic group (fuse_ops.fuse_attention)."""
    groups = graph.meta.get("fused_groups")
    out = Graph(graph.inputs, graph.outputs, graph.nodes, graph.name, dict(graph.meta))
    if groups is not None:
        groups = _into_reductions(graph, [part for g in groups for part in split_epilogue(graph, g)])
        out.meta["fused_groups"] = fuse_attention(graph, groups) if ctx.options.get("fuse_attention") else groups
    out.meta["tasks"] = extract(out)
    return out


def _into_reductions(graph: Graph, groups: list) -> list:
    """An elementwise or injective group without an anchor (the rest of a split epilogue: BERT's
    attention scale) joins the reducing group (softmax) that alone reads it, as FuseOps would
    have fused it there had the anchor not taken it first."""
    groups = list(groups)
    owner = {k: i for i, g in enumerate(groups) for k in g.nodes}
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    readers = {v: {index[id(n)] for n in ns} for v, ns in graph.consumers().items()}
    outputs = {id(v) for v in graph.outputs}
    gone = set()
    for i, g in enumerate(groups):
        if g.anchor is not None or g.pattern > Pattern.INJECTIVE or any(graph.nodes[k].op in OWN_KERNEL for k in g.nodes):
            continue
        last = graph.nodes[g.nodes[-1]].output
        read = readers.get(id(last), set())
        sinks = {owner[r] for r in read}
        inner_read_outside = any(not readers.get(id(graph.nodes[k].output), set()) <= set(g.nodes) for k in g.nodes[:-1])
        if id(last) in outputs or len(sinks) != 1 or inner_read_outside:
            continue
        j = sinks.pop()
        if groups[j].anchor is None and groups[j].pattern == Pattern.COMM_REDUCE:
            groups[j] = FusedGroup(sorted(groups[j].nodes + g.nodes), None, groups[j].pattern, dict(groups[j].extra))
            owner.update({k: j for k in g.nodes})
            gone.add(i)
    return [g for i, g in enumerate(groups) if i not in gone]
