"""Reductions: mean over axes, softmax over one axis and layer_norm over the trailing axes
(ReduceMean over H and W of a 4-D tensor, as PyTorch writes global pooling, imports as
global_avg_pool2d; LayerNormalization's decomposed form is found by graph.passes' FuseTransformerOps)."""
from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import GraphError
from ..te.expr import Call, Cmp, Const, select
from ..te.tensor import Tensor, compute, max_reduce, reduce_axis, sum_reduce
from .common import channels_and_space, export_as, f32, same
from .registry import OpDef, Pattern, output_elements, register
from .shape import reshape


def _over_axes(x: Tensor, axes: list, keepdims: bool, name: str):
    """(output shape, reduce axes, index of x at an output index and the reduce axes) of a reduction of
    x over `axes` (sorted, non-negative)."""
    raxes = [reduce_axis(x.shape[a], f"{name}_r{a}") for a in axes]
    shape = [1 if k in axes else x.shape[k] for k in range(x.ndim)] if keepdims else \
        [x.shape[k] for k in range(x.ndim) if k not in axes]

    def src(i):
        out, pos = [], 0
        for k in range(x.ndim):
            if k in axes:
                out.append(raxes[axes.index(k)].var)
                pos += keepdims
            else:
                out.append(i[pos])
                pos += 1
        return tuple(out)
    return shape, raxes, src


def reduce_mean(x: Tensor, axes: list, keepdims: bool, name: str = "mean") -> Tensor:
    axes = sorted(a % x.ndim for a in axes)
    shape, raxes, src = _over_axes(x, axes, keepdims, name)
    count = float(np.prod([x.shape[a] for a in axes]))
    acc = compute(shape, lambda *i: sum_reduce(x[src(i)], raxes), f"{name}_sum", tag="reduction", inputs=[x],
                  axis_names=[f"{name}_s{k}" for k in range(len(shape))])
    return compute(shape, lambda *i: acc[i] * Const(1.0 / count), name, tag="elemwise", inputs=[acc],
                   axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def reduce_extreme(x: Tensor, axes: list, keepdims: bool, kind: str, name: str = "reduce") -> Tensor:
    """The largest (kind "max") or smallest ("min": -max(-x), exact) element over `axes`."""
    axes = sorted(a % x.ndim for a in axes)
    shape, raxes, src = _over_axes(x, axes, keepdims, name)
    if kind == "max":
        return compute(shape, lambda *i: max_reduce(x[src(i)], raxes), name, tag="reduction", inputs=[x],
                       axis_names=[f"{name}_i{k}" for k in range(len(shape))])
    neg = compute(shape, lambda *i: max_reduce(Const(0.0) - x[src(i)], raxes), f"{name}_neg", tag="reduction",
                  inputs=[x], axis_names=[f"{name}_s{k}" for k in range(len(shape))])
    return compute(shape, lambda *i: Const(0.0) - neg[i], name, tag="elemwise", inputs=[neg],
                   axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def softmax(x: Tensor, axis: int, name: str = "softmax") -> Tensor:
    nd = x.ndim
    red_shape = [1 if k == axis else d for k, d in enumerate(x.shape)]

    def over(r):
        return lambda *i: tuple(r.var if k == axis else i[k] for k in range(nd))

    r1, r2 = reduce_axis(x.shape[axis], f"{name}_r1"), reduce_axis(x.shape[axis], f"{name}_r2")
    mx = compute(red_shape, lambda *i: max_reduce(x[over(r1)(*i)], [r1]), f"{name}_max", tag="reduction",
                 inputs=[x], axis_names=[f"{name}_m{k}" for k in range(nd)])

    def keep(i):
        return tuple(Const(0) if k == axis else i[k] for k in range(nd))

    e = compute(x.shape, lambda *i: Call("exp", (x[i] - mx[keep(i)],)), f"{name}_exp", tag="elemwise",
                inputs=[x, mx], axis_names=[f"{name}_e{k}" for k in range(nd)])
    s = compute(red_shape, lambda *i: sum_reduce(e[over(r2)(*i)], [r2]), f"{name}_sum", tag="reduction",
                inputs=[e], axis_names=[f"{name}_s{k}" for k in range(nd)])
    # times the reciprocal (the sum is at least 1): one division per row, not one per element
    return compute(x.shape, lambda *i: e[i] * (Const(1.0) / s[keep(i)]), name, tag="elemwise", inputs=[e, s],
                   axis_names=[f"{name}_i{k}" for k in range(nd)])


def layer_norm(x: Tensor, scale: Tensor, bias: Tensor, axis: int, eps: float, name: str = "layer_norm") -> Tensor:
    """(x - mean) / sqrt(var + eps) * scale + bias over the axes from `axis` on: over the last axis
    directly, over several through a reshape to (rows, D)."""
    if axis != x.ndim - 1:
        rows = (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))
        return reshape(layer_norm(reshape(x, rows, f"{name}_rows"), scale, bias, 1, eps, f"{name}_2d"), x.shape, name)
    d, nl = x.shape[-1], x.ndim - 1
    r1, r2 = reduce_axis(d, f"{name}_r1"), reduce_axis(d, f"{name}_r2")
    red = (*x.shape[:-1], 1)
    names = [f"{name}_i{k}" for k in range(x.ndim)]
    total = compute(red, lambda *i: sum_reduce(x[i[:nl] + (r1.var,)], [r1]), f"{name}_sum", tag="reduction",
                    inputs=[x], axis_names=[f"{name}_m{k}" for k in range(x.ndim)])

    def centred(i, j):
        return x[i + (j,)] - total[i + (Const(0),)] * Const(1.0 / d)

    sq = compute(red, lambda *i: sum_reduce(centred(i[:nl], r2.var) * centred(i[:nl], r2.var), [r2]), f"{name}_sq",
                 tag="reduction", inputs=[x, total], axis_names=[f"{name}_v{k}" for k in range(x.ndim)])

    def inv_std(i):      # one division per row, not one per element (var + eps > 0)
        return Const(1.0) / Call("sqrt", (sq[i + (Const(0),)] * Const(1.0 / d) + Const(eps),))

    return compute(x.shape, lambda *i: centred(i[:nl], i[nl]) * inv_std(i[:nl]) * scale[i[nl]] + bias[i[nl]],
                   name, tag="broadcast", inputs=[x, total, sq, scale, bias], axis_names=names)


def cumsum(x: Tensor, axis: int, exclusive: bool, reverse: bool, name: str = "cumsum") -> Tensor:
    """Running sum along `axis`: each element a sum over the axis of the elements at or before it
    (after it: reverse; strictly: exclusive)."""
    r = reduce_axis(x.shape[axis], f"{name}_r")

    def f(*i):
        src = tuple(r.var if k == axis else e for k, e in enumerate(i))
        lo, hi = (i[axis], r.var) if reverse else (r.var, i[axis])
        inside = (lo < hi) if exclusive else (lo <= hi)
        return sum_reduce(select(inside, x[src], Const(0.0)), [r])

    return compute(x.shape, f, name, tag="reduction", inputs=[x], axis_names=[f"{name}_i{k}" for k in range(x.ndim)])


def cumsum_ref(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX CumSum in NumPy, in x's dtype (float32 sums in float64 first)."""
    y = np.flip(x, axis) if reverse else x
    y = np.cumsum(y, axis=axis, dtype=np.float64 if x.dtype.kind == "f" else x.dtype)
    if exclusive:
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis=axis)), np.delete(y, -1, axis=axis)], axis=axis)
    return (np.flip(y, axis) if reverse else y).astype(x.dtype)


def _cumsum_eval(node, args):
    a = node.attrs
    return cumsum_ref(args[0], a["axis"], bool(a["exclusive"]), bool(a["reverse"]))


def _onnx_cumsum(cx, ins, a):
    axis = int(np.asarray(cx.const(ins[1], "the axis")).reshape(-1)[0])
    if not -len(ins[0].shape) <= axis < len(ins[0].shape):
        raise cx.fail(f"axis {axis} is outside a {len(ins[0].shape)}-D input")
    return [cx.add("cumsum", ins[:1], {"axis": axis % len(ins[0].shape), "exclusive": int(a.get("exclusive", 0)),
                                      "reverse": int(a.get("reverse", 0))})]


def _export_cumsum(ex, n, ins):
    ex.emit(n, "CumSum", [ins[0], ex.tensor(f"{n.name}_axis", [n.attrs["axis"]])],
            exclusive=n.attrs["exclusive"], reverse=n.attrs["reverse"])



# ---------------------------------------------------------------- top k
def _along(i: tuple, v, axis: int) -> tuple:
    """The index `i` with `v` in place of its entry along `axis` (a reduction's or a kept 1's)."""
    return tuple(v if d == axis else e for d, e in enumerate(i))


def topk_indices(x: Tensor, pos: Tensor, axis: int, k: int, largest: bool, name: str = "topk") -> Tensor:
    """The indices of the first k elements of x along `axis` in ONNX TopK's order (largest or
    smallest first, NaN above every number, equal values by index): an element's rank is the count
    of the elements before it in that order (a reduction over the axis), and position p takes the
    index ranked p (a second). n x n comparisons per row. pos: the axis's positions 0..n-1 as a
    float32 table, which a vector loop loads as it loads x (a loop index in a lane it cannot)."""
    n = x.shape[axis]
    r, q = reduce_axis(n, f"{name}_r"), reduce_axis(n, f"{name}_q")
    names = [f"{name}_i{d}" for d in range(x.ndim)]

    at = functools.partial(_along, axis=axis)
    def before(a, b, i, j):
        """1.0 where a (at position i) comes before b (at j), else 0.0."""
        by_index = select(i < j, Const(1.0), Const(0.0))
        numbers = select(b < a if largest else a < b, Const(1.0), select(Cmp("==", a, b), by_index, Const(0.0)))
        return select(Cmp("==", a, a), select(Cmp("==", b, b), numbers, Const(0.0 if largest else 1.0)),
                      select(Cmp("==", b, b), Const(1.0 if largest else 0.0), by_index))

    ranks = compute(x.shape, lambda *i: sum_reduce(before(x[at(i, r.var)], x[i], pos[r.var], pos[i[axis]]), [r]),
                    f"{name}_rank", tag="reduction", inputs=[x, pos], axis_names=names)
    return compute(at(x.shape, k), lambda *i: sum_reduce(
        select(Cmp("==", ranks[at(i, q.var)], pos[i[axis]]), Const(1.0), Const(0.0)) * pos[q.var], [q]),
        name, tag="reduction", inputs=[ranks, pos], axis_names=names)


def topk_ref(x: np.ndarray, axis: int, k: int, largest: bool) -> np.ndarray:
    """ONNX TopK's indices in NumPy (int64)."""
    nan = np.isnan(x)
    key = np.where(nan, 0.0, -x.astype(np.float64) if largest else x)
    order = np.lexsort((key, ~nan if largest else nan), axis=axis)
    return np.take(order, np.arange(k), axis=axis).astype(np.int64)


def _topk_infer(node):
    x, a = node.inputs[0], node.attrs
    if not 0 < a["k"] <= x.shape[a["axis"]]:
        raise GraphError(f"topk {node.name}: k={a['k']} is not in [1, {x.shape[a['axis']]}] (axis {a['axis']} of "
                         f"{list(x.shape)})")
    return tuple(a["k"] if d == a["axis"] else e for d, e in enumerate(x.shape)), "int64", ""


def _onnx_topk(cx, ins, a):
    """TopK of a constant k: its indices (topk), its values gathered at them (gather_elements)."""
    x = ins[0]
    axis = a.get("axis", -1)
    if not -len(x.shape) <= axis < len(x.shape):
        raise cx.fail(f"axis {axis} is outside a {len(x.shape)}-D input")
    axis %= len(x.shape)
    k = int(np.asarray(cx.const(ins[1], "k")).reshape(-1)[0])
    if not 0 < k <= x.shape[axis]:
        raise cx.fail(f"k={k} is not in [1, {x.shape[axis]}], the size of axis {axis} of {list(x.shape)}")
    _indexable(cx, x, axis)
    idx = _topk(cx, x, axis, k, int(a.get("largest", 1)), "")
    return [cx.add("gather_elements", [x, idx], {"axis": axis}, "_values"), idx]


INDEX_EXACT = 1 << 24     # runtime.artifact.FLOAT_EXACT's bound (ops sits below runtime): positions past it are not exact in float32


def _indexable(cx, x, axis: int) -> None:
    """Refuses an axis whose positions float32 cannot hold exactly (an op returning indices along it)."""
    if x.shape[axis] > INDEX_EXACT:
        raise cx.fail(f"axis {axis} of {list(x.shape)} is longer than {INDEX_EXACT}: kernels carry integers as "
                      "float32, exact only up to 2^24; split the input along that axis")


def topk_blocks(n: int, k: int) -> int | None:
    """The block length (a divisor of n, at least k) for which a TopK over n in two stages compares
    the fewest pairs, where that is under half of one stage's n x n; else None."""
    if n <= 256:
        return None
    cost = lambda b: n * b + (n // b * k) ** 2          # noqa: E731
    divisors = {d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}
    best = min((b for b in divisors if k <= b < n), key=cost, default=None)
    return best if best is not None and 2 * cost(best) < n * n else None


def _topk(cx, x, axis: int, k: int, largest: int, tag: str):
    """The indices of TopK(x, k) along `axis`. Over a long axis, in two stages: the top k of each
    block of it (every element of the whole top k is in its block's), then the top k of those
    candidates laid out block by block, each block's in order, so that equal values keep the order
    of their indices; each stage in turn split where that pays."""
    n = x.shape[axis]
    b = topk_blocks(n, k)
    if b is None:
        pos = cx.constant(np.arange(n, dtype=np.float32), f"{tag}_positions")
        return cx.add("topk", [x, pos], {"axis": axis, "k": k, "largest": largest}, f"{tag}_indices")
    m, lead, rest = n // b, list(x.shape[:axis]), list(x.shape[axis + 1:])
    blocks = cx.add("reshape", [x], {"shape": lead + [m, b] + rest}, f"{tag}_blocks")
    local = _topk(cx, blocks, axis + 1, k, largest, f"{tag}_block")
    starts = cx.constant((np.arange(m, dtype=np.int64) * b).reshape([m, 1] + [1] * len(rest)), f"{tag}_block_starts")
    flat = lead + [m * k] + rest
    where = cx.add("reshape", [cx.add("add", [local, starts], {}, f"{tag}_block_where")], {"shape": flat},
                   f"{tag}_candidate_where")
    values = cx.add("reshape", [cx.add("gather_elements", [blocks, local], {"axis": axis + 1}, f"{tag}_block_values")],
                    {"shape": flat}, f"{tag}_candidates")
    pick = _topk(cx, values, axis, k, largest, f"{tag}_final")
    return cx.add("gather_elements", [where, pick], {"axis": axis}, f"{tag}_indices")


# ---------------------------------------------------------------- arg max / min
def arg_extreme(x: Tensor, pos: Tensor, axis: int, kind: str, last: bool, name: str = "arg") -> Tensor:
    """The index of the largest (kind "max") or smallest element of x along `axis`, the axis kept
    as 1, as ONNX Runtime's ArgMax and ArgMin scan: from the first element, a NaN never taken
    after it, a NaN first taken and kept; ties to the first index, or with `last` the last. pos:
    the axis's positions 0..n-1 as float32 (topk_indices)."""
    n = x.shape[axis]
    r, q = reduce_axis(n, f"{name}_r"), reduce_axis(n, f"{name}_q")
    names = [f"{name}_i{d}" for d in range(x.ndim)]
    sign = Const(1.0 if kind == "max" else -1.0)

    at = functools.partial(_along, axis=axis)
    best = compute(at(x.shape, 1), lambda *i: max_reduce(
        select(Cmp("==", x[at(i, r.var)], x[at(i, r.var)]), x[at(i, r.var)] * sign, Const(float("-inf"))), [r]),
        f"{name}_best", tag="reduction", inputs=[x], axis_names=names)

    def found(*i):
        v, first = x[at(i, q.var)], x[at(i, 0)]
        mark = pos[q.var] if last else Const(float(n - 1)) - pos[q.var]      # the max of marks picks the index
        hit = select(Cmp("==", v * sign, best[i]), mark, Const(-1.0))
        return max_reduce(select(Cmp("==", first, first), hit, Const(0.0 if last else float(n - 1))), [q])
    marks = compute(at(x.shape, 1), found, f"{name}_mark", tag="reduction", inputs=[x, best, pos], axis_names=names)
    return marks if last else compute(at(x.shape, 1), lambda *i: Const(float(n - 1)) - marks[i], name,
                                      tag="elemwise", inputs=[marks], axis_names=names)


def arg_extreme_ref(x: np.ndarray, axis: int, kind: str, last: bool) -> np.ndarray:
    """ArgMax / ArgMin as ONNX Runtime computes them (arg_extreme), the axis kept, int64."""
    y = np.moveaxis(x, axis, -1)
    v = np.where(np.isnan(y), -np.inf, y if kind == "max" else -y.astype(np.float64))
    hit = (v == v.max(axis=-1, keepdims=True)) & ~np.isnan(y)      # a NaN is never a hit, even at a max of -inf
    n = y.shape[-1]
    idx = n - 1 - np.argmax(hit[..., ::-1], axis=-1) if last else np.argmax(hit, axis=-1)
    idx = np.where(np.isnan(y[..., 0]), 0, idx)
    return np.expand_dims(idx, axis).astype(np.int64)


def _arg_infer(node):
    x, a = node.inputs[0], node.attrs
    return tuple(1 if d == a["axis"] else e for d, e in enumerate(x.shape)), "int64", ""


def _onnx_arg_extreme(cx, ins, a):
    """ArgMax and ArgMin (a segmentation map's classes, greedy decoding): the index along `axis`,
    then the axis dropped unless keepdims."""
    x = ins[0]
    axis = a.get("axis", 0)
    if not -len(x.shape) <= axis < len(x.shape):
        raise cx.fail(f"axis {axis} is outside a {len(x.shape)}-D input")
    axis %= len(x.shape)
    _indexable(cx, x, axis)
    pos, keep = cx.constant(np.arange(x.shape[axis], dtype=np.float32), "_positions"), a.get("keepdims", 1)
    y = cx.add("arg_extreme", [x, pos], {"axis": axis, "kind": "max" if cx.op_type == "ArgMax" else "min",
                                         "last": int(a.get("select_last_index", 0))}, "" if keep else "_kept")
    return [y] if keep else [cx.add("reshape", [y], {"shape": [e for d, e in enumerate(x.shape) if d != axis]})]


def _export_arg_extreme(ex, n, ins):
    ex.emit(n, "ArgMax" if n.attrs["kind"] == "max" else "ArgMin", ins[:1], axis=n.attrs["axis"], keepdims=1,
            select_last_index=n.attrs["last"])


def _export_topk(ex, n, ins):
    from onnx import helper
    ex.nodes.append(helper.make_node("TopK", [ins[0], ex.tensor(f"{n.name}_k", [n.attrs["k"]])],
                                     [f"{n.name}_values", n.output.name], n.name, axis=n.attrs["axis"],
                                     largest=n.attrs["largest"]))


def _ln_infer(node):
    x, scale, bias = node.inputs
    d = int(np.prod(x.shape[node.attrs["axis"]:]))
    if scale.shape != (d,) or bias.shape != (d,):
        raise GraphError(f"layer_norm {node.name}: scale {list(scale.shape)} and bias {list(bias.shape)} must be [{d}]")
    return x.shape, x.dtype, ""


def _ln_eval(node, args):
    x, scale, bias = (a.astype(np.float64) for a in args)
    axes = tuple(range(node.attrs["axis"], x.ndim))
    shape = x.shape[node.attrs["axis"]:]
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return f32((x - mean) / np.sqrt(var + node.attrs["epsilon"]) * scale.reshape(shape) + bias.reshape(shape))


def _onnx_layer_norm(cx, ins, a):
    x = ins[0]
    if len(cx.node.output) > 1 and any(cx.node.output[1:]):
        raise cx.fail("the Mean and InvStdDev outputs are not supported (only Y)")
    axis = a.get("axis", -1) % len(x.shape)
    norm = tuple(x.shape[axis:])
    scale = np.broadcast_to(cx.const(ins[1], "the scale"), norm).reshape(-1)
    bias = (np.broadcast_to(cx.const(ins[2], "the bias"), norm).reshape(-1) if len(ins) > 2 and ins[2] is not None
            else np.zeros(scale.shape, np.float32))
    return [cx.add("layer_norm", [x, cx.constant(np.ascontiguousarray(scale, np.float32), "_scale"),
                                  cx.constant(np.ascontiguousarray(bias, np.float32), "_bias")],
                   {"axis": axis, "epsilon": float(a.get("epsilon", 1e-5))})]


def _onnx_instance_norm(cx, ins, a):
    """InstanceNormalization (torch's GroupNorm export): a layer_norm over the spatial axes of each
    sample and channel, then the per-channel scale and bias where they are not ones and zeros."""
    x = ins[0]
    if len(x.shape) < 3:
        raise cx.fail(f"the input must have a channel and at least one spatial axis, got shape {list(x.shape)}")
    d = int(np.prod(x.shape[2:]))
    y = cx.add("layer_norm", [x, cx.constant(np.ones(d, np.float32), "_ones"), cx.constant(np.zeros(d, np.float32),
                                                                                          "_zeros")],
               {"axis": 2, "epsilon": float(a.get("epsilon", 1e-5))}, "_norm")
    per_channel = (x.shape[1],) + (1,) * (len(x.shape) - 2)
    scale, bias = (np.asarray(cx.const(v, what), np.float32).reshape(-1) for v, what in ((ins[1], "the scale"),
                                                                                       (ins[2], "the bias")))
    if scale.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
        raise cx.fail(f"scale and bias must have one value per channel ({x.shape[1]})")
    if not (scale == 1).all():
        y = cx.add("mul", [y, cx.constant(scale.reshape(per_channel), "_scale")], {}, "_scaled")
    if not (bias == 0).all():
        y = cx.add("add", [y, cx.constant(bias.reshape(per_channel), "_bias")], {}, "_biased")
    return [y]


def _export_ln(ex, n, ins):
    x = n.inputs[0]
    shape = list(x.shape[n.attrs["axis"]:])
    ex.emit(n, "LayerNormalization", [ins[0], ex.array(f"{n.name}_s", n.inputs[1].data.reshape(shape)),
                                      ex.array(f"{n.name}_b", n.inputs[2].data.reshape(shape))],
            axis=n.attrs["axis"], epsilon=n.attrs["epsilon"])


def _mean_infer(node):
    x, a = node.inputs[0], node.attrs
    axes = [ax % len(x.shape) for ax in a["axes"]]
    if a.get("keepdims", 1):
        return tuple(1 if k in axes else d for k, d in enumerate(x.shape)), x.dtype, ""
    return tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype, ""


def _mean_eval(node, args):
    return f32(args[0].astype(np.float64).mean(axis=tuple(node.attrs["axes"]),
                                                keepdims=bool(node.attrs.get("keepdims", 1))))


def _extreme_eval(node, args):
    fn = np.max if node.attrs["kind"] == "max" else np.min
    return fn(args[0], axis=tuple(node.attrs["axes"]), keepdims=bool(node.attrs.get("keepdims", 1)))


def _softmax_eval(node, args):
    xd = args[0].astype(np.float64)
    e = np.exp(xd - xd.max(axis=node.attrs["axis"], keepdims=True))
    return f32(e / e.sum(axis=node.attrs["axis"], keepdims=True))


def _onnx_axes(cx, ins, a):
    """A reduction's axes, sorted and non-negative (attribute, or input from opset 18; none: every
    axis), or None where there are none and noop_with_empty_axes says return the input."""
    x, axes = ins[0], a.get("axes")
    if axes is None and len(ins) > 1 and ins[1] is not None:
        axes = [int(v) for v in np.asarray(cx.const(ins[1], "axes")).reshape(-1)]
    if not axes and a.get("noop_with_empty_axes", 0):
        return None
    if any(not -len(x.shape) <= ax < len(x.shape) for ax in axes or []):
        raise cx.fail(f"axes {list(axes)} lie outside the input's {len(x.shape)} dimensions")
    out = sorted({ax % len(x.shape) for ax in (axes or range(len(x.shape)))})
    if len(out) == len(x.shape) and not a.get("keepdims", 1):
        raise cx.fail("a reduction to a 0-d value (every axis, keepdims=0) is not supported; "
                      "export it with keepdim=True")
    return out


def _onnx_reduce_mean(cx, ins, a):
    """ReduceMean over H and W of a 4-D tensor (how PyTorch writes global pooling) becomes
    global_avg_pool2d, so that layout conversion can carry it; other axes stay a mean."""
    x = ins[0]
    axes = _onnx_axes(cx, ins, a)
    if axes is None:
        return [x]
    keep = a.get("keepdims", 1)
    if len(x.shape) == 4 and axes == [2, 3]:
        y = cx.add("global_avg_pool2d", [x], {"layout": "NCHW"})
        return [y if keep else cx.add("reshape", [y], {"shape": [x.shape[0], x.shape[1]]}, "_squeeze")]
    return [cx.add("mean", [x], {"axes": axes, "keepdims": keep})]


def _onnx_reduce_extreme(cx, ins, a):
    """ReduceMax and ReduceMin (torch.max(x, dim) and amax write them)."""
    axes = _onnx_axes(cx, ins, a)
    if axes is None:
        return [ins[0]]
    return [cx.add("reduce", [ins[0]], {"axes": axes, "keepdims": a.get("keepdims", 1),
                                        "kind": "max" if cx.op_type == "ReduceMax" else "min"})]


def _onnx_reduce_sum(cx, ins, a):
    """ReduceSum, ReduceSumSquare and ReduceL2 (Swin V2's cosine attention normalises q and k) as a
    mean scaled by the count it averages, of x or of x*x, and a square root for L2."""
    x = ins[0]
    axes = _onnx_axes(cx, ins, a)
    if axes is None:
        return [x]
    if cx.op_type != "ReduceSum":
        x = cx.add("mul", [x, x], {}, "_square")
    y = cx.add("mean", [x], {"axes": axes, "keepdims": a.get("keepdims", 1)}, "_mean")
    count = np.array(float(np.prod([x.shape[ax] for ax in axes])), np.float32)
    y = cx.add("mul", [y, cx.constant(count, "_count")], {}, "" if cx.op_type != "ReduceL2" else "_sum")
    return [cx.add("sqrt", [y], {}) if cx.op_type == "ReduceL2" else y]


def _onnx_softmax(cx, ins, a):
    x = ins[0]
    axis = a.get("axis", -1 if cx.opset >= 13 else 1) % len(x.shape)
    if cx.opset < 13 and axis != len(x.shape) - 1:
        raise cx.fail(f"opset {cx.opset} softmax over a non-last axis is not supported")
    return [cx.add("softmax", [x], {"axis": axis})]


def _onnx_log_softmax(cx, ins, a):
    """LogSoftmax (classifier heads, CTC speech models) as x - max - log(sum(e^(x - max))) along its
    axis: no log of an underflowed softmax."""
    x = ins[0]
    axis = a.get("axis", -1 if cx.opset >= 13 else 1) % len(x.shape)
    if cx.opset < 13 and axis != len(x.shape) - 1:
        raise cx.fail(f"opset {cx.opset} log softmax over a non-last axis is not supported")
    top = cx.add("reduce", [x], {"axes": [axis], "keepdims": 1, "kind": "max"}, "_max")
    shifted = cx.add("sub", [x, top], {}, "_shifted")
    mean = cx.add("mean", [cx.add("exp", [shifted], {}, "_exp")], {"axes": [axis], "keepdims": 1}, "_mean")
    total = cx.add("mul", [mean, cx.constant(np.array(float(x.shape[axis]), np.float32), "_count")], {}, "_sum")
    return [cx.add("sub", [shifted, cx.add("log", [total], {}, "_log")], {})]


def _onnx_global_max_pool(cx, ins, a):
    """GlobalMaxPool (timm's max and avg-max heads, CBAM): the max over every spatial axis."""
    x = ins[0]
    channels_and_space(cx, x)
    return [cx.add("reduce", [x], {"axes": list(range(2, len(x.shape))), "keepdims": 1, "kind": "max"})]


register(
    OpDef(name="mean", pattern=Pattern.COMM_REDUCE, infer=_mean_infer, evaluate=_mean_eval,
          te=lambda n, ins, name: reduce_mean(ins[0], n.attrs["axes"], bool(n.attrs.get("keepdims", 1)), name),
          onnx_in={"ReduceMean": _onnx_reduce_mean, **dict.fromkeys(("ReduceSum", "ReduceSumSquare", "ReduceL2"),
                                                                      _onnx_reduce_sum)}),
    OpDef(name="reduce", pattern=Pattern.COMM_REDUCE, infer=_mean_infer, evaluate=_extreme_eval, integers=True,
          te=lambda n, ins, name: reduce_extreme(ins[0], n.attrs["axes"], bool(n.attrs.get("keepdims", 1)),
                                                 n.attrs["kind"], name),
          onnx_in={**dict.fromkeys(("ReduceMax", "ReduceMin"), _onnx_reduce_extreme),
                   "GlobalMaxPool": _onnx_global_max_pool},
          onnx_out=lambda ex, n, ins: ex.emit(n, "ReduceMax" if n.attrs["kind"] == "max" else "ReduceMin",
                                              [ins[0], ex.tensor(f"{n.name}_axes", n.attrs["axes"])],
                                              keepdims=int(n.attrs.get("keepdims", 1)))),
    OpDef(name="softmax", pattern=Pattern.COMM_REDUCE, infer=same, evaluate=_softmax_eval,
          te=lambda n, ins, name: softmax(ins[0], n.attrs["axis"], name), flops=lambda n: 3.0 * output_elements(n),
          onnx_in={"Softmax": _onnx_softmax, "LogSoftmax": _onnx_log_softmax},
          onnx_out=export_as("Softmax", lambda n: {"axis": n.attrs["axis"]})),
    OpDef(name="cumsum", pattern=Pattern.OPAQUE, infer=same, evaluate=_cumsum_eval, integers=True,
          te=lambda n, ins, name: cumsum(ins[0], n.attrs["axis"], bool(n.attrs["exclusive"]), bool(n.attrs["reverse"]),
                                         name),
          flops=lambda n: float(output_elements(n)), onnx_in={"CumSum": _onnx_cumsum}, onnx_out=_export_cumsum),
    OpDef(name="topk", pattern=Pattern.OPAQUE, infer=_topk_infer, integers=True,
          evaluate=lambda n, args: topk_ref(args[0], n.attrs["axis"], n.attrs["k"], bool(n.attrs["largest"])),
          te=lambda n, ins, name: topk_indices(ins[0], ins[1], n.attrs["axis"], n.attrs["k"], bool(n.attrs["largest"]),
                                               name),
          flops=lambda n: float(np.prod(n.inputs[0].shape)) * n.inputs[0].shape[n.attrs["axis"]],
          onnx_in={"TopK": _onnx_topk}, onnx_out=_export_topk),
    OpDef(name="arg_extreme", pattern=Pattern.OPAQUE, infer=_arg_infer, integers=True,
          evaluate=lambda n, args: arg_extreme_ref(args[0], n.attrs["axis"], n.attrs["kind"], bool(n.attrs["last"])),
          te=lambda n, ins, name: arg_extreme(ins[0], ins[1], n.attrs["axis"], n.attrs["kind"], bool(n.attrs["last"]),
                                              name),
          flops=lambda n: 2.0 * float(np.prod(n.inputs[0].shape)),
          onnx_in=dict.fromkeys(("ArgMax", "ArgMin"), _onnx_arg_extreme), onnx_out=_export_arg_extreme),
    OpDef(name="layer_norm", pattern=Pattern.OPAQUE, infer=_ln_infer, evaluate=_ln_eval,
          te=lambda n, ins, name: layer_norm(ins[0], ins[1], ins[2], n.attrs["axis"], n.attrs["epsilon"], name),
          flops=lambda n: 8.0 * output_elements(n), onnx_in={"LayerNormalization": _onnx_layer_norm,
                                                     "InstanceNormalization": _onnx_instance_norm},
          onnx_out=_export_ln),
)
