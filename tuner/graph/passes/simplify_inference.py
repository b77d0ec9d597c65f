"""SimplifyInference: BatchNorm becomes a per-channel scale and shift, folded into the producer.

    batch_norm(x)                 -> x * a + c                    (a = gamma/sqrt(var+eps), c = beta - mean*a)
    mul(conv2d(x, W), a)          -> conv2d(x, W * a)             (a per output channel, or a scalar)
    mul(add(y, c), a)             -> add(mul(y, a), c * a)
    add(add(y, c1), c2)           -> add(y, c1 + c2)
and the same for dense. What remains after a conv is one bias add per conv.

    conv2d(x, W) whose kernel rows or columns read only padding at every output pixel
                                  -> conv2d(x, W without them), pads cut to match
(DeepLabV3's ASPP: 3x3 convs of dilation 24 and 36 at 14x14 are their centre tap, a 1x1 conv.)
"""
from __future__ import annotations

import numpy as np

from ...ops import channel_bias_shape, nchw_dims
from ...ops.common import tap_reads
from ..builder import rebuild
from ..ir import Graph
from .base import register
from .simple import dead_code_elimination


def _channel_shape(x, channels: int):
    """Shape that broadcasts a per-channel vector against activation x (in x's layout; the last axis
    of a tensor that is no image)."""
    if len(x.shape) not in (4, 5):
        return (channels,)
    lay = x.layout or "NCHW"
    return channel_bias_shape(lay, channels, x.shape[4] if len(x.shape) == 5 else 0)


def _per_channel(const, out):
    """The constant as a vector over out's channels, or None if it is not per-channel/scalar."""
    data = const.data.astype(np.float64)
    if data.size == 1:
        return np.full(_channels(out), float(data.reshape(-1)[0]))
    ch = _channels(out)
    target = _channel_shape(out, ch)
    full = [1] * (len(out.shape) - len(data.shape)) + list(data.shape)
    if data.size == ch and tuple(full[len(out.shape) - len(target):]) == tuple(target):
        return data.reshape(-1)
    if data.size == ch and len(out.shape) == 4 and (out.layout or "NCHW") == "NCHW" and tuple(full) == (1, ch, 1, 1):
        return data.reshape(-1)
    return None


def _channels(v) -> int:
    if len(v.shape) not in (4, 5):
        return v.shape[-1]
    return nchw_dims(v.shape, v.layout or "NCHW")[1]


def _live_window(node, w: np.ndarray):
    """(weight, attributes) of a conv (NCHW, OIHW) without its kernel rows and columns that read
    only padding for every output pixel, the pads cut so that each output reads what it read; None
    where none goes. Exact: those taps add 0 times their weight."""
    a = node.attrs
    if a.get("layout", "NCHW") != "NCHW" or a.get("kernel_layout", "OIHW") != "OIHW" or w.ndim != 4:
        return None
    pads, cut = list(a["pads"]), []
    for ax in (0, 1):
        size, out, k = node.inputs[0].shape[2 + ax], node.output.shape[2 + ax], w.shape[2 + ax]
        st, d, lo = a["strides"][ax], a["dilations"][ax], pads[ax]
        live = [int(r) for r in np.flatnonzero(tap_reads(size, out, k, st, d, lo).any(axis=0))]
        if not live:
            return None
        first, last = live[0], live[-1]
        new_lo = lo - first * d
        new_hi = (out - 1) * st + (last - first) * d + 1 - size - new_lo
        cut.append((first, last + 1, new_lo, new_hi) if new_lo >= 0 and new_hi >= 0 else (0, k, lo, pads[ax + 2]))
    (r0, r1, top, bottom), (s0, s1, left, right) = cut
    if (r1 - r0, s1 - s0) == w.shape[2:]:
        return None
    # one tap left on both axes: a 1x1 conv, whose dilation means nothing; else each axis keeps its
    dil = [1, 1] if (r1 - r0, s1 - s0) == (1, 1) else list(a["dilations"])
    return np.ascontiguousarray(w[:, :, r0:r1, s0:s1]), {**a, "pads": [top, left, bottom, right], "dilations": dil}


def _scale_weight(node, w, a):
    if node.op == "dense":
        return w * a[:, None]
    lay = node.attrs.get("layout", "NCHW")
    if lay == "NCHW":
        return w * a[:, None, None, None]
    if lay == "NHWC":
        return w * a[None, None, None, :]
    oc, _, _, _, _, ob = w.shape
    return w * a.reshape(oc, 1, 1, 1, 1, ob)


@register("SimplifyInference", 0)
def simplify_inference(graph: Graph, ctx) -> Graph:
    """Fold BatchNorm and constant scales into conv/dense weights and biases; a division by a
    constant becomes a product with its reciprocal (a division costs several products); a conv's
    kernel taps that read only padding go."""
    uses = {k: len(ns) for k, ns in graph.consumers().items()}
    for v in graph.outputs:
        uses[id(v)] = uses.get(id(v), 0) + 1
    new_uses: dict = {}   # uses of the rebuilt values, carried over from the values they replace

    def single_use(v):
        # values made by this pass itself are used once, by the node being built from them
        return new_uses.get(id(v), 1) == 1

    def emit(b, op, ins, name):
        """Build `op(ins)`, simplified by the rules below when one applies."""
        return rule(b, op, ins, name) or b.add(op, ins, {}, name)

    def rule(b, op, ins, name):
        if op == "mul" and len(ins) == 2:
            y, k = (ins[0], ins[1]) if ins[1].is_const else (ins[1], ins[0])
            if not k.is_const or y.is_const or y.producer is None or not single_use(y):
                return None
            p = y.producer
            a = _per_channel(k, y)
            if a is None or k.data.ndim > len(y.shape):
                return None
            if p.op in ("conv2d", "dense") and p.inputs[1].is_const:
                w = b.const(_scale_weight(p, p.inputs[1].data.astype(np.float64), a).astype(np.float32), "w_scaled")
                return b.add(p.op, [p.inputs[0], w] + p.inputs[2:], p.attrs, p.name)
            if p.op == "add":
                inner, c = _split_const(p.inputs)
                cv = _per_channel(c, y) if c is not None else None
                if cv is not None and not inner.is_const:
                    scaled = emit(b, "mul", [inner, k], name)
                    return emit(b, "add", [scaled, _bias_const(b, cv * a, y)], name + "_bias")
            return None
        if op == "add" and len(ins) == 2:
            y, c2 = _split_const(ins)
            if c2 is None or y.is_const or y.producer is None or y.producer.op != "add" or not single_use(y):
                return None
            inner, c1 = _split_const(y.producer.inputs)
            if c1 is None or inner.is_const:
                return None
            v1, v2 = _per_channel(c1, y), _per_channel(c2, y)
            if v1 is None or v2 is None:
                return None
            return b.add("add", [inner, _bias_const(b, v1 + v2, y)], {}, name)
        return None

    def rw(b, n, ins):
        for old, new in zip(n.inputs, ins):
            new_uses[id(new)] = uses.get(id(old), 0)
        if n.op == "conv2d" and ins[1].is_const and (live := _live_window(n, ins[1].data)) is not None:
            return b.add("conv2d", [ins[0], b.const(live[0], "w_live")] + ins[2:], live[1], n.name)
        if n.op == "div" and not ins[0].is_const and (inv := _reciprocal(ins[1])) is not None:
            return emit(b, "mul", [ins[0], b.const(inv, "inv")], n.name)
        if n.op == "batch_norm":
            x = ins[0]
            scale, bias, mean, var = (v.data.astype(np.float64) for v in ins[1:5])
            a = scale / np.sqrt(var + n.attrs["epsilon"])
            # NCHW: channels on axis 1 at any rank ((N, C, L) in audio models); else as the layout puts them
            sh = (len(a),) + (1,) * (len(x.shape) - 2) if n.attrs.get("layout", "NCHW") == "NCHW" else \
                _channel_shape(x, len(a))
            y = emit(b, "mul", [x, b.const(a.astype(np.float32).reshape(sh), "bn_scale")], n.name + "_scale")
            return emit(b, "add", [y, b.const((bias - mean * a).astype(np.float32).reshape(sh), "bn_shift")],
                        n.name + "_shift")
        return rule(b, n.op, ins, n.name)

    return dead_code_elimination(rebuild(graph, rw), ctx)


def _reciprocal(c) -> np.ndarray | None:
    """1 / c, rounded once, where c is a float32 constant whose reciprocals are all normal floats
    (x * (1/c) is then within an ulp of x / c, and as exact where c is a power of two)."""
    if not c.is_const or c.data.dtype != np.float32:
        return None
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = (1.0 / c.data.astype(np.float64)).astype(np.float32)
    ok = np.isfinite(c.data) & np.isfinite(inv) & (np.abs(inv) >= np.finfo(np.float32).tiny)
    return inv if ok.all() else None


def _split_const(ins):
    """(non-constant operand, constant operand) of a binary node, or (x, None)."""
    if ins[1].is_const:
        return ins[0], ins[1]
    if ins[0].is_const:
        return ins[1], ins[0]
    return ins[0], None


def _bias_const(b, vec, like, name="bias"):
    return b.const(np.asarray(vec, dtype=np.float32).reshape(_channel_shape(like, len(vec))), name)
