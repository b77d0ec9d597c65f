"""FuseTransformerOps: the transformer operators exporters write as pieces become one operator each.

    x * 0.5 * (1 + erf(x / sqrt 2))   (any association; / sqrt 2 or * 1/sqrt 2)   -> gelu(x)
    d / sqrt(mean(d * d) + eps), d = x - mean(x)   (means over the last axis)      -> layer_norm(x, 1, 0)
    layer_norm(x, s, b) * c, layer_norm(x, s, b) + c   (c constant over the last axis, used once)
                                                                                    -> layer_norm(x, s*c, b*c), (x, s, b+c)
so that gelu is a dense epilogue (one kernel with its GEMM, and a task) and LayerNorm one reduction.
Runs before SimplifyInference, which would otherwise distribute the constants of these patterns.
"""
from __future__ import annotations

import numpy as np

from ..builder import rebuild
from ..ir import Graph
from .base import register
from .simple import dead_code_elimination


def _const(v, value: float) -> bool:
    return v.is_const and v.data.size == 1 and abs(float(v.data.reshape(-1)[0]) - value) <= 1e-6 * abs(value)


def _op(v, op: str):
    """v's producer when it is an `op` node, else None."""
    return v.producer if v.producer is not None and v.producer.op == op else None


def _other(node, v):
    """The other operand of a binary node one of whose operands is v, else None."""
    a, b = node.inputs
    return b if a is v else a if b is v else None


def _erf_arg(v):
    """x when v is 1 + erf(x / sqrt 2) (or erf(x * 1/sqrt 2) + 1), else None."""
    add = _op(v, "add")
    if add is None:
        return None
    erf = next((_op(u, "erf") for u in add.inputs if _op(u, "erf") is not None), None)
    if erf is None or not _const(_other(add, erf.output), 1.0):
        return None
    z = erf.inputs[0]
    div, mul = _op(z, "div"), _op(z, "mul")
    if div is not None and _const(div.inputs[1], float(np.sqrt(2.0))):
        return div.inputs[0]
    if mul is not None:
        for u in mul.inputs:
            if _const(_other(mul, u), float(1 / np.sqrt(2.0))) and not u.is_const:
                return u
    return None


def _halved(v, x) -> bool:
    """v is x * 0.5 (or x / 2)."""
    mul, div = _op(v, "mul"), _op(v, "div")
    return ((mul is not None and _other(mul, x) is not None and _const(_other(mul, x), 0.5))
            or (div is not None and div.inputs[0] is x and _const(div.inputs[1], 2.0)))


def _gelu_input(node):
    """x when `node` (a mul) computes gelu(x) in one of the associations exporters write, else None."""
    a, b = node.inputs
    for p, q in ((a, b), (b, a)):
        x = _erf_arg(p)
        if x is not None and _halved(q, x):                # (x * 0.5) * (1 + erf)
            return x
        inner = _op(p, "mul")                          # (x * (1 + erf)) * 0.5
        if inner is not None and _const(q, 0.5):
            for u in inner.inputs:
                x = _erf_arg(u)
                if x is not None and _other(inner, u) is x:
                    return x
        if not p.is_const:                             # x * ((1 + erf) * 0.5)
            inner = _op(q, "mul")
            if inner is not None:
                for u in inner.inputs:
                    if _erf_arg(u) is p and _const(_other(inner, u), 0.5):
                        return p
    return None


def _layer_norm_parts(node):
    """(x, eps) when `node` (a div) is d / sqrt(mean(d*d) + eps) with d = x - mean(x) over the last axis."""
    d, s = node.inputs
    sub, sqrt = _op(d, "sub"), _op(s, "sqrt")
    if sub is None or sqrt is None:
        return None
    x, m1 = sub.inputs
    last = [len(x.shape) - 1]
    mean1 = _op(m1, "mean")
    if mean1 is None or mean1.inputs[0] is not x or mean1.attrs["axes"] != last or not mean1.attrs.get("keepdims", 1):
        return None
    add = _op(sqrt.inputs[0], "add")
    if add is None:
        return None
    m2, eps = (add.inputs if add.inputs[1].is_const else add.inputs[::-1])
    mean2 = _op(m2, "mean")
    if (mean2 is None or not eps.is_const or eps.data.size != 1 or mean2.attrs["axes"] != last
            or not mean2.attrs.get("keepdims", 1)):
        return None
    sq = _op(mean2.inputs[0], "mul")
    if sq is None or sq.inputs[0] is not d or sq.inputs[1] is not d:
        return None
    return x, float(eps.data.reshape(-1)[0])


def _over_last_axis(c, x) -> np.ndarray | None:
    """A constant that varies only along x's last axis, as a vector over it; else None."""
    if not c.is_const or c.data.ndim > len(x.shape):
        return None
    d = x.shape[-1]
    lead = c.data.shape[:-1] if c.data.ndim else ()
    if any(e != 1 for e in lead) or (c.data.ndim and c.data.shape[-1] not in (1, d)):
        return None
    return np.broadcast_to(c.data.reshape(-1), (d,)).astype(np.float64)


@register("FuseTransformerOps", 0)
def fuse_transformer_ops(graph: Graph, ctx) -> Graph:
    """GELU, LayerNorm written as pieces become gelu and layer_norm (with the scale and shift after it)."""
    uses = {k: len(ns) for k, ns in graph.consumers().items()}
    for v in graph.outputs:
        uses[id(v)] = uses.get(id(v), 0) + 1

    def rw(b, n, ins):
        probe = type(n)(n.op, ins, n.attrs, n.output, n.name)     # the node over its rebuilt inputs
        if n.op == "mul" and (x := _gelu_input(probe)) is not None:
            return b.add("gelu", [x], {}, n.name)
        if n.op == "div" and (parts := _layer_norm_parts(probe)) is not None:
            x, eps = parts
            d = x.shape[-1]
            return b.add("layer_norm", [x, b.const(np.ones(d, np.float32), "ln_scale"),
                                        b.const(np.zeros(d, np.float32), "ln_bias")],
                         {"axis": len(x.shape) - 1, "epsilon": eps}, n.name)
        if n.op in ("mul", "add"):
            for k, (v, c) in enumerate(((ins[0], ins[1]), (ins[1], ins[0]))):
                ln = _op(v, "layer_norm")
                vec = _over_last_axis(c, v) if ln is not None and ln.attrs["axis"] == len(v.shape) - 1 else None
                if vec is None or uses.get(id(n.inputs[k]), 0) != 1 or tuple(v.shape) != tuple(n.output.shape):
                    continue
                scale, bias = (u.data.astype(np.float64) for u in ln.inputs[1:3])
                scale, bias = (scale * vec, bias * vec) if n.op == "mul" else (scale, bias + vec)
                return b.add("layer_norm", [ln.inputs[0], b.const(scale.astype(np.float32), "ln_scale"),
                                            b.const(bias.astype(np.float32), "ln_bias")], ln.attrs, n.name)
        return None

    return dead_code_elimination(rebuild(graph, rw), ctx)
