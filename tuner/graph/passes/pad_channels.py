"""PadChannels: a convolution whose output channels the layout's block does not divide (ShuffleNet's
58, SqueezeNet's 1000, EfficientNet's 40) computes zero-weight channels up to a whole number of
blocks, so that its task runs full vectors rather than the small block its count divides (58 in
blocks of 2: a twentieth of peak). The padding is carried to the consumers that can take it and
sliced off before any other:

- a convolution (groups 1) reads the padded input with zero weights for the extra channels;
- a depthwise convolution, channel-wise ops (activations, pooling) and a broadcast with a
  per-channel constant (padded with the op's identity) keep it; an elementwise op of two activations
  keeps it when both carry the same padding;
- anything else (a concat, a reshape, a channel reduction, a graph output) gets the real channels,
  sliced once per value.

Extra channels start at zero (zero weights, zero bias) and pass only through ops that keep a finite
value finite, and every convolution that reads them weighs them by zero, so the real channels are
exactly what the unpadded graph computes. A conv is padded to the block of the plain blocked layout
the plan runs it in (the compile's layout where the plan names none; none for NCHW, NHWC, Winograd
and fused reads, so that the layout solver, which compiles the graph once per layout, prices the
tasks a compile meets), and only where the compute the pad adds is less than the vector width the
small block leaves idle.
"""
from __future__ import annotations

import numpy as np

from ..builder import GraphBuilder
from ..ir import Graph
from ...ops import UNARY
from ...te import layouts as L
from .base import register

KEEPS = tuple(op for op in UNARY if op != "pow") + ("max_pool2d", "avg_pool2d", "global_avg_pool2d")
IDENTITY = {"add": 0.0, "sub": 0.0, "mul": 1.0, "div": 1.0}       # a constant's padding: the op leaves x as it is


def padded_count(k: int, block: int) -> int:
    """Channels a conv of `k` output channels computes in a layout of `block`: `k`, or the next
    multiple of the block where that wastes less than the small block (fit_block) would."""
    fit = L.fit_block(k, block)
    up = -(-k // block) * block
    return up if fit < block and k >= block and up * fit < k * block else k


def _pad_axis(data: np.ndarray, axis: int, to: int, value: float = 0.0) -> np.ndarray:
    widths = [(0, 0)] * data.ndim
    widths[axis] = (0, to - data.shape[axis])
    return np.pad(data, widths, constant_values=value)


def _channel_const(b, c, real: int, to: int, value: float):
    """Constant `c` broadcast against NCHW channels padded from `real` to `to`: as it is where it
    does not vary per channel, padded with `value` along its channel axis where it has `real`
    channels, else None."""
    d = c.data
    if d.ndim > 4:
        return None
    if d.ndim < 3 or d.shape[-3] == 1:
        return c
    if d.shape[-3] != real:
        return None
    return b.const(_pad_axis(d, d.ndim - 3, to, value).astype(d.dtype), f"{c.name}_padded")


@register("PadChannels", 3, required=("InferType",))
def pad_channels(graph: Graph, ctx) -> Graph:
    """Conv output channels padded to whole blocks of the layout, carried while consumers can take them."""
    desired = ctx.options.get("layout") or "NCHW"
    plan = ctx.options.get("layout_plan") or {}
    if not (L.block_of(desired) or any(L.block_of(v) for v in plan.values())) or graph.meta.get("dynamic"):
        return graph
    b = GraphBuilder(graph.name)
    new: dict = {}          # id(old value) -> new value (padded where `real` says so)
    real: dict = {}         # id(old value) -> its real channel count, for values carried padded
    sliced: dict = {}

    def plain(v):
        """The new value of old value `v` with its real channels only."""
        nv = new.get(id(v), v)
        if id(v) not in real:
            return nv
        if id(v) not in sliced:
            shape = list(v.shape)
            sliced[id(v)] = b.add("slice", [nv], {"begin": [0] * len(shape), "step": [1] * len(shape),
                                                  "shape": shape}, f"{v.name}_channels")
        return sliced[id(v)]

    for v in graph.inputs:
        new[id(v)] = b.input(v.name, v.shape, v.dtype, v.layout)
    for n in graph.nodes:
        ins, a = n.inputs, dict(n.attrs)
        padded_in = [v for v in ins if id(v) in real]
        out = None
        block = L.block_of(plan.get(n.name, desired))        # 0 for NCHW, NHWC, Winograd and fused reads
        if n.op == "conv2d" and len(ins) == 2 and ins[1].is_const and len(ins[0].shape) == 4 and block:
            w = ins[1].data
            k, groups = w.shape[0], a.get("groups", 1)
            x = new.get(id(ins[0]), ins[0])
            if groups == 1:
                to = padded_count(k, block)
                if id(ins[0]) in real:                  # the input's extra channels weigh zero
                    w = _pad_axis(w, 1, x.shape[1])
                if to != k or id(ins[0]) in real:
                    w = _pad_axis(w, 0, to)
                    out = b.add("conv2d", [x, b.const(w.astype(ins[1].data.dtype), f"{ins[1].name}_padded")], a,
                                n.name)
                    if to != k:
                        real[id(n.output)] = k
            elif groups == k == ins[0].shape[1] and w.shape[1] == 1 and id(ins[0]) in real:   # depthwise
                to = x.shape[1]
                a["groups"] = to
                out = b.add("conv2d", [x, b.const(_pad_axis(w, 0, to), f"{ins[1].name}_padded")], a, n.name)
                real[id(n.output)] = k
        elif padded_in and len(n.output.shape) == 4 and (n.op in KEEPS or n.op in IDENTITY):
            k, to = real[id(padded_in[0])], new[id(padded_in[0])].shape[1]
            args = [_channel_const(b, v, k, to, IDENTITY.get(n.op, 0.0)) if v.is_const else
                    new[id(v)] if real.get(id(v)) == k and new[id(v)].shape[1] == to else None for v in ins]
            if None not in args and n.output.shape[1] == k:
                out = b.add(n.op, args, a, n.name)
                real[id(n.output)] = k
        if out is None:
            out = b.add(n.op, [plain(v) for v in ins], a, n.name)
        new[id(n.output)] = out
    return b.finish([plain(v) for v in graph.outputs], graph.meta)
