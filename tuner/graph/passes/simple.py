"""Small cleanup passes: InferType, FoldConstant, EliminateCommonSubexpr, DeadCodeElimination."""
from __future__ import annotations

import numpy as np

from ...ops import evaluate
from ..builder import GraphBuilder, rebuild
from ..interp import verify
from ..ir import Graph
from .base import register

FOLD_LIMIT = 1 << 26  # bytes; folding never materialises a constant larger than this


@register("InferType", 0)
def infer_type(graph: Graph, ctx) -> Graph:
    """Re-derive every value's shape, dtype and layout, and verify use-before-def."""
    out = rebuild(graph, lambda b, n, ins: None)
    verify(out)
    return out


@register("FoldConstant", 2)
def fold_constant(graph: Graph, ctx) -> Graph:
    """Evaluate nodes whose inputs are all constants (e.g. layout transforms of weights), but those
    the import leaves to run time (meta "unfolded": a window of a table that moves with the symbols)."""
    kept = set(graph.meta.get("unfolded", ()))

    def rw(b: GraphBuilder, n, ins):
        if ins and all(v.is_const for v in ins) and int(np.prod(n.output.shape)) * 4 <= FOLD_LIMIT and n.name not in kept:
            return b.const(evaluate(n, [v.data for v in ins]), name=f"{n.output.name}_folded")
        return None
    return rebuild(graph, rw)


def _attr_key(v):
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    return v


@register("EliminateCommonSubexpr", 3)
def eliminate_common_subexpr(graph: Graph, ctx) -> Graph:
    """Merge nodes with the same op, attributes and inputs (and equal small constants)."""
    seen: dict = {}
    const_ids: dict = {}

    def canon(v):
        if v.is_const and v.data.size <= 4096:
            key = (v.data.dtype.str, v.data.shape, v.data.tobytes())
            return ("c", const_ids.setdefault(key, id(v)))
        return ("v", id(v))

    def rw(b, n, ins):
        key = (n.op, tuple(sorted((k, _attr_key(v)) for k, v in n.attrs.items())), tuple(canon(v) for v in ins))
        if key in seen:
            return seen[key]
        out = b.add(n.op, ins, n.attrs, n.name)
        seen[key] = out
        return out
    return rebuild(graph, rw)


@register("DeadCodeElimination", 1)
def dead_code_elimination(graph: Graph, ctx) -> Graph:
    """Drop nodes whose results no output needs."""
    live: set = {id(v) for v in graph.outputs}
    keep = []
    for n in reversed(graph.nodes):
        if id(n.output) in live:
            keep.append(n)
            live.update(id(v) for v in n.inputs)
    keep_ids = {id(n) for n in keep}
    pruned = Graph(graph.inputs, graph.outputs, [n for n in graph.nodes if id(n) in keep_ids], graph.name, graph.meta)
    return rebuild(pruned, lambda b, n, ins: None)
