"""FuseTransformerOps: the operators exporters write as pieces become one operator each.

    x * sigmoid(x)   (either order)                                                 -> silu(x)
    x * tanh(softplus(x))   (either order: Mish as exporters before opset 18 write it)  -> mish(x)
    x * 0.5 * (1 + erf(x / sqrt 2))   (any association; / sqrt 2 or * 1/sqrt 2)   -> gelu(x)
    x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))   (likewise)          -> gelu_tanh(x)
    d / sqrt(mean(d * d) + eps), d = x - mean(x)   (means over the last axis)      -> layer_norm(x, 1, 0)
    layer_norm(x, s, b) * c, layer_norm(x, s, b) + c   (c constant over the last axis, used once)
                                                                                    -> layer_norm(x, s*c, b*c), (x, s, b+c)
so that silu, mish and gelu (either form) are a conv or dense epilogue (one kernel with its GEMM, and a task) and LayerNorm one reduction.
Runs before SimplifyInference, which would otherwise distribute the constants of these patterns.
"""
from __future__ import annotations

import math

import numpy as np

from ..builder import rebuild
from ..ir import Graph
from .base import register
from .simple import dead_code_elimination


def _scalar(v) -> float | None:
    """The value of a one-element constant, else None."""
    return float(v.data.reshape(-1)[0]) if v.is_const and v.data.size == 1 else None


def _near(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= 1e-6 * abs(b)


def _op(v, op: str):
    """v's producer when it is an `op` node, else None."""
    return v.producer if v.producer is not None and v.producer.op == op else None


def _factors(v, depth: int) -> tuple:
    """(values, constant) with v = product(values) * constant, looking through `depth` levels of
    mul nodes and divisions by a constant."""
    mul, div = _op(v, "mul"), _op(v, "div")
    if depth and mul is not None:
        (va, ca), (vb, cb) = (_factors(u, depth - 1) for u in mul.inputs)
        return va + vb, ca * cb
    if depth and div is not None and _scalar(div.inputs[1]):
        vals, c = _factors(div.inputs[0], depth - 1)
        return vals, c / _scalar(div.inputs[1])
    c = _scalar(v)
    return ((), c) if c is not None else ((v,), 1.0)


def _one_plus(v, op: str):
    """z when v is 1 + op(z) (either order), else None."""
    add = _op(v, "add")
    call = next((_op(u, op) for u in add.inputs if _op(u, op) is not None), None) if add is not None else None
    if call is None or not _near(_scalar(add.inputs[1] if add.inputs[0] is call.output else add.inputs[0]), 1.0):
        return None
    return call.inputs[0]


def _erf_arg(v):
    """x when v is 1 + erf(x / sqrt 2) (the scale in any form _factors reads), else None."""
    z = _one_plus(v, "erf")
    vals, c = _factors(z, 1) if z is not None else ((), None)
    return vals[0] if len(vals) == 1 and _near(c, 2 ** -0.5) else None


def _tanh_arg(v):
    """x when v is 1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)) (x^3 as the products Pow imports as),
    else None."""
    z = _one_plus(v, "tanh")
    vals, c = _factors(z, 1) if z is not None else ((), None)
    inner = _op(vals[0], "add") if len(vals) == 1 and _near(c, math.sqrt(2.0 / math.pi)) else None
    for x, cube in ((inner.inputs, inner.inputs[::-1]) if inner is not None else ()):
        cvals, cc = _factors(cube, 3)
        if len(cvals) == 3 and all(u is x for u in cvals) and _near(cc, 0.044715):
            return x
    return None


def _gelu_input(node):
    """(x, gelu or gelu_tanh) when `node` (a mul) is x * (1 + erf(x / sqrt 2)) * 0.5 or its tanh
    form, the three factors in any association (as exporters write them), else None."""
    (va, ca), (vb, cb) = (_factors(u, 1) for u in node.inputs)
    vals, c = va + vb, ca * cb
    if len(vals) != 2 or not _near(c, 0.5):
        return None
    for x, other in (vals, vals[::-1]):
        if _erf_arg(other) is x:
            return x, "gelu"
        if _tanh_arg(other) is x:
            return x, "gelu_tanh"
    return None


def _silu_input(node):
    """x when `node` (a mul) is x * sigmoid(x), else None."""
    for x, s in (node.inputs, node.inputs[::-1]):
        sig = _op(s, "sigmoid")
        if sig is not None and sig.inputs[0] is x:
            return x
    return None


def _mish_input(node):
    """x when `node` (a mul) is x * tanh(softplus(x)), else None."""
    for x, t in (node.inputs, node.inputs[::-1]):
        th = _op(t, "tanh")
        sp = _op(th.inputs[0], "softplus") if th is not None else None
        if sp is not None and sp.inputs[0] is x:
            return x
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
    if mean2 is None or _scalar(eps) is None or mean2.attrs["axes"] != last or not mean2.attrs.get("keepdims", 1):
        return None
    sq = _op(mean2.inputs[0], "mul")
    if sq is None or sq.inputs[0] is not d or sq.inputs[1] is not d:
        return None
    return x, _scalar(eps)


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
    """SiLU, Mish, GELU, LayerNorm written as pieces become silu, mish, gelu and layer_norm (with the scale and shift after it)."""
    uses = {k: len(ns) for k, ns in graph.consumers().items()}
    for v in graph.outputs:
        uses[id(v)] = uses.get(id(v), 0) + 1

    def rw(b, n, ins):
        probe = type(n)(n.op, ins, n.attrs, n.output, n.name)     # the node over its rebuilt inputs
        if n.op == "mul" and (x := _silu_input(probe)) is not None:
            return b.add("silu", [x], {}, n.name)
        if n.op == "mul" and (x := _mish_input(probe)) is not None:
            return b.add("mish", [x], {}, n.name)
        if n.op == "mul" and (found := _gelu_input(probe)) is not None:
            return b.add(found[1], [found[0]], {}, n.name)
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
