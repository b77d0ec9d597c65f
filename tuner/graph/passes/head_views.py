"""AbsorbHeadViews: attention's heads are read in place instead of copied. A chain of reshape and
transpose nodes that splits an activation [..., R, H*C] into heads [..., H, R, C] and feeds a
batch_matmul becomes that operand's a_heads / b_heads = H; one that merges heads [..., H, R, C]
back into [..., R, H*C] and feeds a dense becomes the dense's in_heads = H (ops.dense). A chain is
recognised by where it moves each element, not by its nodes, so every exporter's spelling of it is
found; K's transpose into K^T ([..., H, C, R]) is no such view and stays a copy, which gives the
scores' GEMM contiguous columns, except for a few query rows (a decoding step of up to
KEYS_IN_PLACE_ROWS new tokens), where the copy would move the whole cache for a few passes over
it: that batch_matmul reads K itself (trans_b), a dot product per query and key. A chain that
other nodes also read is still computed for them.

PackWideRows goes the other way: a dense over an activation of at most PACK_ROWS rows that outgrows
WIDE_ACTIVATION_BYTES reads it split into PACK_FLOATS-column heads, a copy made once for every dense
that reads it, with in_heads: each chunk of the reduction then reads one contiguous block
(docs/history.md).
"""
from __future__ import annotations

import numpy as np

from ...ops.dense import (BMM_VIEWS, KEYS_IN_PLACE_ROWS, PACK_FLOATS, PACK_ROWS, WIDE_ACTIVATION_BYTES, merge_heads_ref,
                          merge_heads_shape, split_heads_ref, split_heads_shape)
from ..builder import rebuild
from ..ir import Graph
from .base import register
from .simple import dead_code_elimination

VIEWS = ("reshape", "transpose")


def _sources(v):
    """(source, the view nodes from it to v in order) for each value up v's chain of views."""
    chain = []
    while v.producer is not None and v.producer.op in VIEWS:
        chain.insert(0, v.producer)
        v = v.producer.inputs[0]
        yield v, list(chain)


def _numbered(shape) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)


def _moved(src, chain) -> np.ndarray:
    """Where the chain puts each element of src: its flat positions in the chain's output."""
    x = _numbered(src.shape)
    for n in chain:
        x = x.transpose(n.attrs["perm"]) if n.op == "transpose" else x.reshape(n.output.shape)
    return x


def _split_source(v):
    """(source, H) where v is a source [..., R, H*C] split into H > 1 heads as a view ([..., H, R,
    C] = v.shape, R > 1), else None (an unsqueeze is no heads)."""
    found = None
    for src, chain in _sources(v):
        s, h = src.shape, v.shape[-3] if len(v.shape) >= 3 else 0
        if h > 1 and v.shape[-2] > 1 and len(s) >= 2 and split_heads_shape(s, h) == tuple(v.shape) \
                and np.array_equal(_moved(src, chain), split_heads_ref(_numbered(s), h)):
            found = (src, h)
    return found


def _merge_source(v):
    """(source, H) where v is a source [..., H, R, C] (H > 1, R > 1) with its heads merged as a view
    ([..., R, H*C] = v.shape), else None."""
    found = None
    for src, chain in _sources(v):
        s = src.shape
        if len(s) >= 3 and s[-3] > 1 and s[-2] > 1 and merge_heads_shape(s, s[-3]) == tuple(v.shape) \
                and np.array_equal(_moved(src, chain), merge_heads_ref(_numbered(s), s[-3])):
            found = (src, s[-3])
    return found


def _keys_of_few_rows(n):
    """K where batch_matmul n multiplies a few rows by K's transpose [..., C, R] (a decoding step's
    scores), else None."""
    a, b = n.inputs[:2]
    t = b.producer
    if n.attrs.get("trans_b") or len(a.shape) < 2 or a.shape[-2] > KEYS_IN_PLACE_ROWS or t is None or t.op != "transpose":
        return None
    rank = len(b.shape)
    return t.inputs[0] if list(t.attrs["perm"]) == [*range(rank - 2), rank - 1, rank - 2] else None


@register("AbsorbHeadViews", 1, required=("InferType",))
def absorb_head_views(graph: Graph, ctx) -> Graph:
    """reshape/transpose chains that split or merge attention heads -> batch_matmul a_heads /
    b_heads and dense in_heads (reads in place of copies)."""
    plans = {}
    for n in graph.nodes:
        if n.op == "batch_matmul" and not any(n.attrs.get(k) for k in BMM_VIEWS):
            found = {k: _split_source(v) for k, v in zip(BMM_VIEWS, n.inputs[:2])}
            if found["b_heads"] is None and (key := _keys_of_few_rows(n)) is not None:
                found["trans_b"] = key
            if any(found.values()):
                plans[id(n)] = found
        elif n.op == "dense" and not n.attrs.get("in_heads") and len(n.inputs) == 2 \
                and (found := _merge_source(n.inputs[0])) \
                and not (graph.meta.get("dynamic") and int(np.prod(found[0].shape[:-3])) > 1):
            # (a graph for a range of shapes keeps the copy where heads merge over a batch: the view's
            # rows per batch would be the bound's, which the fit of dynamic kernels refuses)
            plans[id(n)] = {"in_heads": found}
    if not plans:
        return graph
    new: dict = {}              # id(old value) -> its value in the new graph

    def rw(b, n, ins):
        new.update((id(v), w) for v, w in zip(n.inputs, ins))
        plan = plans.get(id(n))
        if plan is None:
            return None
        attrs, ins = dict(n.attrs), list(ins)
        if "trans_b" in plan:
            ins[1], attrs["trans_b"] = new[id(plan["trans_b"])], 1
        for j, (k, found) in enumerate(plan.items()):      # operand j: a_heads, b_heads; in_heads: data
            if found is not None and k != "trans_b":
                ins[j], attrs[k] = new[id(found[0])], found[1]
        return b.add(n.op, ins, attrs, n.name)

    return dead_code_elimination(rebuild(graph, rw), ctx)


@register("PackWideRows", 1, required=("InferType",))
def pack_wide_rows(graph: Graph, ctx) -> Graph:
    """dense(x) over x [..., R, C] with R <= PACK_ROWS, C a multiple of PACK_FLOATS and x past
    WIDE_ACTIVATION_BYTES -> dense(transpose(reshape(x)), in_heads=C / PACK_FLOATS)."""
    if graph.meta.get("dynamic"):
        return graph            # (rows vary: the pack's layout would be the bound's)
    packed: dict = {}           # id(activation) -> its packed copy

    def rw(b, n, ins):
        if n.op != "dense" or n.attrs.get("in_heads") or len(ins) != 2 or ins[0].is_const:
            return None
        x = ins[0]
        *lead, rows, cols = x.shape
        if (any(d != 1 for d in lead) or not 1 < rows <= PACK_ROWS or cols % PACK_FLOATS
                or 4 * rows * cols < WIDE_ACTIVATION_BYTES):
            return None
        h = cols // PACK_FLOATS
        if id(x) not in packed:
            split = b.add("reshape", [x], {"shape": [*lead, rows, h, PACK_FLOATS]}, f"{n.name}_rows")
            perm = [*range(len(lead)), len(lead) + 1, len(lead), len(lead) + 2]
            packed[id(x)] = b.add("transpose", [split], {"perm": perm}, f"{n.name}_packed")
        return b.add("dense", [packed[id(x)], ins[1]], {**n.attrs, "in_heads": h}, n.name)

    return rebuild(graph, rw)
