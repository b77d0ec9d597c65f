"""ExtractTasks: one tuning task per unique fused-group workload, keyed like the kernel side."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...te.workloads import EPILOGUE_ACTS, Workload, WorkloadError, make
from ..ir import Graph
from ..ops import act_params, nchw_dims
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


def _epilogue_flags(graph: Graph, anchor: int, nodes: list):
    """Workload epilogue parameters when the epilogue is [add const][add activation][activation] in that
    order (bias, residual, then relu or one of the epilogue activations), else (None, why)."""
    flags = {"bias": 0, "residual": 0, "relu": 0}
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
    """(Workload or None, reason) for a fused group."""
    if group.anchor is None:
        return None, "no anchor operator (an injective or elementwise group)"
    n = graph.nodes[group.anchor]
    a = n.attrs
    x = n.inputs[0]
    try:
        if n.op == "conv2d":
            if a["strides"][0] != a["strides"][1] or a["dilations"][0] != a["dilations"][1]:
                return None, "conv2d with different strides or dilations per axis"
            flags, why = _epilogue_flags(graph, group.anchor, group.nodes)
            if flags is None:
                return None, why
            lay = a.get("layout", "NCHW")
            nn, c, h, w = nchw_dims(x.shape, lay)
            k = nchw_dims(n.output.shape, lay)[1]
            wshape = n.inputs[1].shape
            r, s = (wshape[0], wshape[1]) if lay == "NHWC" else (wshape[2], wshape[3])
            pads = tuple(a["pads"])
            return make("conv2d", dict(N=nn, C=c, H=h, W=w, K=k, R=r, S=s, stride=a["strides"][0],
                                       pad=pads if len(set(pads)) > 1 else pads[0], dilation=a["dilations"][0],
                                       groups=a["groups"], **flags), lay), ""
        if n.op == "dense":
            flags, why = _epilogue_flags(graph, group.anchor, group.nodes)
            if flags is None:
                return None, why
            if flags["residual"]:
                return None, "dense with a residual add is not in the kernel library yet"
            del flags["residual"]
            return make("dense", dict(N=x.shape[0], C=x.shape[1], K=n.inputs[1].shape[0], **flags), "OI16o"), ""
        if len(group.nodes) > 1:
            return None, f"{group_summary(graph, group.nodes)}: a fused epilogue on {n.op} is not in the kernel library yet"
        lay = a.get("layout", "NCHW")
        nn, c, h, w = nchw_dims(x.shape, lay)
        if n.op in ("max_pool2d", "avg_pool2d"):
            if a["strides"][0] != a["strides"][1]:
                return None, f"{n.op} with different strides per axis"
            pads = tuple(a["pads"])
            extra = {"count_include_pad": int(a.get("count_include_pad", 0))} if n.op == "avg_pool2d" else {}
            return make(n.op.replace("_pool2d", "pool"), dict(N=nn, C=c, H=h, W=w, R=a["kernel"][0], S=a["kernel"][1],
                                                               stride=a["strides"][0],
                                                               pad=pads if len(set(pads)) > 1 else pads[0], **extra),
                        lay), ""
        if n.op == "global_avg_pool2d":
            return make("globalavgpool", dict(N=nn, C=c, H=h, W=w), lay), ""
    except WorkloadError as e:
        return None, str(e)
    return None, f"{n.op} has no kernel-side workload yet"


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


@register("ExtractTasks", 0, required=("FuseOps",))
def extract_tasks(graph: Graph, ctx) -> Graph:
    """One tuning task per unique fused-group workload, with its weight and FLOPs."""
    out = Graph(graph.inputs, graph.outputs, graph.nodes, graph.name, dict(graph.meta))
    out.meta["tasks"] = extract(graph)
    return out
