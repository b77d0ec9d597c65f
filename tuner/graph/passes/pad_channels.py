"""PadChannels: a convolution whose output channels the layout's block does not divide (ShuffleNet's
58, SqueezeNet's 1000, EfficientNet's 40) computes zero-weight channels up to a whole number of
blocks, so that its task runs full vectors rather than the small block its count divides (58 in
blocks of 2: a twentieth of peak). The padding is carried to the consumers that can take it and
sliced off before any other:

- a convolution (groups 1) reads the padded input with zero weights for the extra channels;
- a depthwise convolution, channel-wise ops (activations, pooling), a resize over H and W (a
  segmentation head's upsample, which then runs in the blocked layout rather than gathering through
  a transform to NCHW) and a broadcast with a per-channel constant (padded with the op's identity)
  keep it; an elementwise op of two activations keeps it when both carry the same padding;
- anything else (a concat, a reshape, a channel reduction, a graph output) gets the real channels,
  sliced once per value.

Extra channels start at zero (zero weights, zero bias) and pass only through ops that keep a finite
value finite, and every convolution that reads them weighs them by zero, so the real channels are
exactly what the unpadded graph computes. A conv is padded only where the compute the pad adds is
less than the vector width the small block leaves idle.

Only a compile in one blocked layout pads (no layout plan: an untuned compile, or one whose logs
hold no plan of the model; or the default plan, whose Winograd convs read and write that layout's
blocks). The layout solver prices each conv's tasks from the graph compiled
once per layout, unpadded (optimize's pad_channels=False), so a plan it solved compiles unpadded
to the tasks it priced: a padded producer in one layout would change the channels its consumer in
another layout reads.
"""
from __future__ import annotations

import numpy as np

from ..builder import GraphBuilder
from ..ir import Graph
from ...ops import UNARY
from ...ops import winograd as WG
from ...te import layouts as L
from .base import register

KEEPS = tuple(op for op in UNARY if op != "pow") + ("max_pool2d", "avg_pool2d", "global_avg_pool2d")
IDENTITY = {"add": 0.0, "sub": 0.0, "mul": 1.0, "div": 1.0}       # a constant's padding: the op leaves x as it is


# A small block of whole vectors (8 channels on AVX2 in NCHW16c) fills its lanes, but a register tile
# of it feeds each input load to fewer output channels than the layout's block: it counts as this
# fraction of its lanes (docs/graph-compiler.md).
NARROW = 0.875


def padded_count(k: int, block: int, lanes: int | None = None) -> int:
    """Channels a conv of `k` output channels computes in a layout of `block` on vectors of `lanes`
    floats (None: the block's): `k`, or the next multiple of the block where that wastes fewer lanes
    than the small block (fit_block) idles. A small block of whole vectors fills them (NARROW); one
    of 4 or 8 narrower than the vector fills that many lanes; any other (2, 3, 10, 15) runs as
    scalars: one lane."""
    lanes = lanes or block
    fit = L.fit_block(k, block)
    up = -(-k // block) * block
    filled = lambda b: lanes if b % lanes == 0 else b if b % 4 == 0 else 1  # noqa: E731
    small = lanes * NARROW if fit % lanes == 0 else filled(fit)
    return up if fit < block and up * small < k * filled(block) else k


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
    if d.ndim < 3 or d.shape[-3] == 1 < real:
        return c
    if d.shape[-3] != real:
        return None
    return b.const(_pad_axis(d, d.ndim - 3, to, value).astype(d.dtype), f"{c.name}_padded")


def keeps_blocks(plan: dict, layout: str) -> bool:
    """Whether every conv of `plan` reads and writes `layout`'s blocks (Winograd in them: the
    default plan), so that padded channels mean the same to each."""
    return all((choice := WG.parse_choice(lay)) is not None and choice[1] == layout for lay in plan.values())


@register("PadChannels", 3, required=("InferType",))
def pad_channels(graph: Graph, ctx) -> Graph:
    """Conv output channels padded to whole blocks of the layout, carried while consumers can take them."""
    layout = ctx.options.get("layout") or "NCHW"
    block, lanes = L.block_of(layout), ctx.options.get("lanes")
    if not keeps_blocks(ctx.options.get("layout_plan") or {}, layout) or not ctx.options.get("pad_channels", True) \
            or not block:
        return graph
    b = GraphBuilder(graph.name)
    new: dict = {}          # id(old value) -> new value
    real: dict = {}         # id(old value) -> its real channel count, for values whose channels can carry padding
    made: dict = {}         # (id(old value), channels) -> that value sliced or padded to them

    def to(v, want: int):
        """Old value `v` with `want` channels: its real ones, then zeros (a conv reading it weighs them by
        zero); a conv reads the count padded_count gives its input's real channels."""
        nv = new.get(id(v), v)
        if id(v) not in real or nv.shape[1] == want:
            return nv
        if (id(v), want) not in made:
            k, shape = real[id(v)], list(nv.shape)
            x = nv
            if shape[1] > k:
                shape[1] = k
                x = b.add("slice", [x], {"begin": [0] * len(shape), "step": [1] * len(shape), "shape": list(shape)},
                          f"{v.name}_channels")
            if want > k:
                pads = [0] * (2 * len(shape))
                pads[len(shape) + 1] = want - k
                x = b.add("pad", [x], {"pads": pads, "value": 0.0}, f"{v.name}_channels{want}")
            made[(id(v), want)] = x
        return made[(id(v), want)]

    def plain(v):
        return to(v, real[id(v)]) if id(v) in real else new.get(id(v), v)

    for v in graph.inputs:
        new[id(v)] = b.input(v.name, v.shape, v.dtype, v.layout)
    for n in graph.nodes:
        ins, a = n.inputs, dict(n.attrs)
        out = None
        if n.op == "conv2d" and len(ins) == 2 and ins[1].is_const and len(ins[0].shape) == 4:
            w, x = ins[1].data, ins[0]
            k, groups = w.shape[0], a.get("groups", 1)
            if groups == 1:
                to_k = padded_count(k, block, lanes)
                c = padded_count(real[id(x)], block, lanes) if id(x) in real else x.shape[1]
                if c != x.shape[1]:
                    w = _pad_axis(w, 1, c)
                if to_k != k:
                    w = _pad_axis(w, 0, to_k)
                out = b.add("conv2d", [to(x, c), b.const(w.astype(ins[1].data.dtype), f"{ins[1].name}_padded")
                                       if w is not ins[1].data else new.get(id(ins[1]), ins[1])], a, n.name)
                real[id(n.output)] = k
            elif groups == k == x.shape[1] and w.shape[1] == 1 and id(x) in real:        # depthwise
                c = padded_count(k, block, lanes)
                a["groups"] = c
                out = b.add("conv2d", [to(x, c), b.const(_pad_axis(w, 0, c), f"{ins[1].name}_padded")], a, n.name)
                real[id(n.output)] = k
        elif len(n.output.shape) == 4 and (n.op in KEEPS or n.op in IDENTITY) and \
                (acts := [v for v in ins if not v.is_const]) and all(id(v) in real for v in acts) and \
                len({real[id(v)] for v in acts}) == 1 and n.output.shape[1] == real[id(acts[0])]:
            k = real[id(acts[0])]
            lead = next((v for v in acts if v.producer is not None and v.producer.op == "conv2d"), acts[0])
            c = new[id(lead)].shape[1]          # the count of the conv output it may fuse into
            args = [_channel_const(b, v, k, c, IDENTITY.get(n.op, 0.0)) if v.is_const else to(v, c) for v in ins]
            if None not in args:
                out = b.add(n.op, args, a, n.name)
                real[id(n.output)] = k
        elif n.op == "resize" and len(n.output.shape) == 4 and set(a["axes"]) <= {2, 3} and id(ins[0]) in real:
            # over H and W only, a weighted sum of each channel's own pixels: its tables (constants) as they are
            out = b.add(n.op, [to(ins[0], new[id(ins[0])].shape[1])] + [new.get(id(v), v) for v in ins[1:]], a, n.name)
            real[id(n.output)] = real[id(ins[0])]
        if out is None:
            out = b.add(n.op, [plain(v) for v in ins], a, n.name)
        new[id(n.output)] = out
    return b.finish([plain(v) for v in graph.outputs], graph.meta)
