"""MergeConvBranches: a sum of convolutions of one input becomes one convolution, as RepVGG's and
ACNet's re-parameterisation does by hand for the models it trains (TextNet, FAST, RepVGG, MobileOne).

    conv(x, W1) + b1 + conv(x, W2) + b2 + x * a + c  ->  conv(x, W) + (b1 + b2 + c)

Each kernel is placed inside the largest where its taps read the same pixels (a 3x1 and a 1x3 go
down the middle column and row of a 3x3), and the identity term (x, or x times a per-channel
scale, plus a shift) goes on the centre tap, where a tap maps each pixel to itself. The convs must
share strides, dilations and groups and have outputs of one shape; one of them must hold every
other's window (so the merged conv reads no pixel and costs no product the branches did not: a
1x3 and a 3x1 alone stay apart), and all must end together (so the outputs agree at every image
size). Runs before layouts are chosen: only convs in NCHW with OIHW weights are merged.
"""
from __future__ import annotations

import numpy as np

from ...ops.common import conv_out_size
from ..builder import rebuild
from ..ir import Graph
from .base import register
from .simple import dead_code_elimination
from .simplify_inference import _per_channel, _split_const


def _const_of(node, out):
    """(the non-constant operand, the per-channel vector) of a binary node with a constant, or None."""
    if len(node.inputs) != 2:
        return None
    v, c = _split_const(node.inputs)
    if c is None or v.is_const or c.data.ndim > len(out.shape):
        return None
    vec = _per_channel(c, out)
    return None if vec is None else (v, vec)


class _Terms:
    """The summands of each add tree (adds of two activations, each inner one used once), read as
    conv terms, identity terms and others."""

    def __init__(self, graph: Graph):
        self.users = graph.consumers()
        self.outputs = {id(v) for v in graph.outputs}

    def once(self, v) -> bool:
        return len(self.users.get(id(v), [])) == 1 and id(v) not in self.outputs

    @staticmethod
    def is_sum(n) -> bool:
        return n.op == "add" and len(n.inputs) == 2 and not any(v.is_const for v in n.inputs) \
            and n.inputs[0].shape == n.inputs[1].shape == n.output.shape and n.output.dtype == "float32"

    def is_root(self, n) -> bool:
        return self.is_sum(n) and not (self.once(n.output) and self.is_sum(self.users[id(n.output)][0]))

    def flatten(self, v) -> list:
        """The summands of the sum v, in order (a loop: an ONNX Sum of many inputs is a long chain)."""
        out, todo = [], [v]
        while todo:
            u = todo.pop()
            p = u.producer
            if p is not None and self.is_sum(p) and (u is v or self.once(u)):
                todo += [p.inputs[1], p.inputs[0]]
            else:
                out.append(u)
        return out

    def conv(self, v):
        """(conv node, bias vector or None) where v is conv(x, W) or conv(x, W) + b, else None."""
        p, bias = v.producer, None
        if p is not None and p.op == "add" and (cv := _const_of(p, v)) is not None and self.once(cv[0]):
            v, bias = cv[0], cv[1]
            p = v.producer
        if p is None or p.op != "conv2d" or len(p.inputs) != 2 or not p.inputs[1].is_const \
                or p.inputs[0].is_const or p.attrs.get("layout", "NCHW") != "NCHW" \
                or p.attrs.get("kernel_layout", "OIHW") != "OIHW" or len(p.output.shape) != 4:
            return None
        return p, bias

    def identity(self, v):
        """(x, scale or None, shift or None) where v is x, x * a, x + c or x * a + c, else None."""
        scale = shift = None
        p = v.producer
        if p is not None and p.op == "add" and (cv := _const_of(p, v)) is not None:
            v, shift = cv
            p = v.producer
        if p is not None and p.op == "mul" and (cv := _const_of(p, v)) is not None and (shift is None or self.once(v)):
            v, scale = cv
        return None if v.is_const or len(v.shape) != 4 or v.dtype != "float32" else (v, scale, shift)


def _window(convs: list):
    """(merged OIHW weight, pads) of convs (conv nodes reading one input), or None where no conv's
    window holds the others' or they do not end together."""
    a = convs[0].attrs
    (dh, dw), out = a["dilations"], convs[0].output.shape
    _, _, h, w = convs[0].inputs[0].shape
    top, left = max(c.attrs["pads"][0] for c in convs), max(c.attrs["pads"][1] for c in convs)
    offsets = []
    for c in convs:
        pt, pl = c.attrs["pads"][:2]
        if (top - pt) % dh or (left - pl) % dw:
            return None
        offsets.append(((top - pt) // dh, (left - pl) // dw))
    shapes = [c.inputs[1].shape for c in convs]
    r = max(oh + s[2] for (oh, _), s in zip(offsets, shapes))
    s_ = max(ow + s[3] for (_, ow), s in zip(offsets, shapes))
    if not any(off == (0, 0) and sh[2:] == (r, s_) for off, sh in zip(offsets, shapes)):
        return None     # no conv holds the others' windows
    bottoms = {c.attrs["pads"][2] + dh * (r - oh - sh[2]) for c, (oh, _), sh in zip(convs, offsets, shapes)}
    rights = {c.attrs["pads"][3] + dw * (s_ - ow - sh[3]) for c, (_, ow), sh in zip(convs, offsets, shapes)}
    if len(bottoms) > 1 or len(rights) > 1:     # windows that end apart agree on the output size at some sizes only
        return None
    (bottom,), (right,), st = bottoms, rights, a["strides"]
    if (conv_out_size(h, r, st[0], top, bottom, dh), conv_out_size(w, s_, st[1], left, right, dw)) != tuple(out[2:]):
        return None
    weight = np.zeros(shapes[0][:2] + (r, s_), np.float64)
    for c, (oh, ow), sh in zip(convs, offsets, shapes):
        weight[:, :, oh:oh + sh[2], ow:ow + sh[3]] += c.inputs[1].data
    return weight, [top, left, bottom, right]


def _add_identity(weight, pads, conv, scale) -> bool:
    """Put x * scale on the centre tap of `weight` (in place) where conv maps each pixel of x to
    the same pixel of its output through one tap, channel to channel; False where it does not."""
    a = conv.attrs
    k, cg, r, s = weight.shape
    c = conv.inputs[0].shape[1]
    (dh, dw), g = a["dilations"], a["groups"]
    if list(a["strides"]) != [1, 1] or conv.output.shape != conv.inputs[0].shape \
            or cg not in (c, 1) or (cg == 1 and g != c) or pads[0] % dh or pads[1] % dw:
        return False
    th, tw = pads[0] // dh, pads[1] // dw
    if th >= r or tw >= s:
        return False
    ch = np.arange(k)
    weight[ch, ch if cg == c else 0, th, tw] += 1.0 if scale is None else scale
    return True


def _plan(terms: _Terms, root) -> list | None:
    """[[(main conv, merged weight, pads, bias) per group of convs that merges], the other terms] of
    the root's sum, or None where nothing merges."""
    parts = terms.flatten(root.output)
    groups: dict = {}        # (input, strides, dilations, groups, output shape) -> [(part index, conv, bias)]
    for i, t in enumerate(parts):
        if terms.once(t) and (cv := terms.conv(t)) is not None:
            n = cv[0]
            key = (id(n.inputs[0]), tuple(n.attrs["strides"]), tuple(n.attrs["dilations"]), n.attrs["groups"],
                   n.output.shape)
            groups.setdefault(key, []).append((i, *cv))
    plan, used = [], set()   # used: indices into parts (a term may be summed twice: x + x)
    for members in groups.values():
        convs = [n for _, n, _ in members]
        found = _window(convs) if len(convs) > 1 else (convs[0].inputs[1].data.astype(np.float64),
                                                       list(convs[0].attrs["pads"]))
        if found is None:
            continue
        weight, pads = found
        shifts = []
        for i, t in enumerate(parts):
            if i not in used and (it := terms.identity(t)) is not None and it[0] is convs[0].inputs[0] \
                    and _add_identity(weight, pads, convs[0], it[1]):
                shifts.append(it[2])
                used.add(i)
        if len(convs) + len(shifts) < 2:
            continue
        bias = sum((b for _, _, b in members if b is not None), np.zeros(convs[0].output.shape[1]))
        bias = bias + sum((c for c in shifts if c is not None), np.zeros_like(bias))
        main = max(convs, key=lambda n: n.inputs[1].shape[2] * n.inputs[1].shape[3])
        plan.append((main, weight, pads, bias))
        used.update(i for i, _, _ in members)
    if not plan:
        return None
    return [plan, [t for i, t in enumerate(parts) if i not in used]]


@register("MergeConvBranches", 2, required=("InferType",))
def merge_conv_branches(graph: Graph, ctx) -> Graph:
    """conv(x, W1) + conv(x, W2) + x * a + c (a sum of convs of one input, with its identity) ->
    conv(x, W) + b."""
    terms = _Terms(graph)
    plans = {id(n): p for n in graph.nodes if terms.is_root(n) and (p := _plan(terms, n)) is not None}
    if not plans:
        return graph
    new: dict = {}      # old value -> rebuilt, for every value a node reads (the root's terms and convs' inputs)

    def rw(b, n, ins):
        new.update(zip(map(id, n.inputs), ins))
        if id(n) not in plans:
            return None
        groups, others = plans[id(n)]
        sums = []
        for main, weight, pads, bias in groups:
            w = b.const(weight.astype(np.float32), f"{main.name}_merged_w")
            y = b.add("conv2d", [new[id(main.inputs[0])], w], {**main.attrs, "pads": pads}, main.name)
            sums.append((y, b.const(bias.astype(np.float32).reshape(-1, 1, 1), f"{main.name}_bias")))
        sums += [(new[id(t)], None) for t in others]
        total = None
        for i, (y, c) in enumerate(sums):        # the last add keeps the root's name
            last = i == len(sums) - 1
            if c is not None:
                y = b.add("add", [y, c], {}, n.name if last and total is None else f"{y.name}_bias_add")
            if total is not None:
                y = b.add("add", [total, y], {}, n.name if last else f"{n.name}_part")
            total = y
        return total

    return dead_code_elimination(rebuild(graph, rw), ctx)
