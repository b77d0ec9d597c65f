"""FuseOps: operator fusion by post-dominator tree, as TVM's FuseOps.

Each node gets the post-dominator of its outputs (the least common ancestor of its consumers in
the post-dominator tree) and the combined pattern of the edges on the way there. Two phases:
  0: an out-elemwise-fusable op (conv2d, dense, pool) takes its post-dominator when the path
     to it is elemwise and every op on it is at most broadcast (the epilogue: bias, residual, relu);
  1: elemwise/broadcast ops fuse into an injective or reducing post-dominator; injective ops fuse
     along all-injective paths, into a reducing post-dominator too (unlike TVM: the generic
     kernel of a reduction computes its producers row by row, compile_model._row_steps);
TVM's third phase fuses injective ops into intermediate tuples; this IR has no tuples, so it is left out.
With the option fuse_attention, ExtractTasks makes each attention one group (fuse_attention below):
a batch_matmul alone in its group, the softmax group it alone feeds, and the batch_matmul alone in
its group that alone reads the softmax, so that the scores of a row never leave the kernel.
A group never grows past `max_depth` nodes. The graph itself is unchanged; the groups are
recorded in graph.meta["fused_groups"] as lists of node indices.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...ops import PATTERN, Pattern
from ...ops.registry import output_elements
from ..ir import Graph
from .base import register

MAX_FUSE_DEPTH = 256
OWN_KERNEL = ("layout_transform",)    # injective ops with a task of their own, which the layout plan prices
# ops that read their input through index tables: inlined into a layout transform's loop over the
# other layout's rows, each of their reads became a gather (a segmentation head's upsample to NCHW:
# 2.4 ms); apart, they run in their own layout's blocks, as vectors (docs/history.md)
TABLE_READS = ("resize",)
# elementwise ops whose element is a libm call (exp, log, erf, tanh, sin, ...): fused into a consumer
# that reads each of their elements several times (a broadcast over heads or pixels, a gather's
# indices), the call would run once per read; such a group stays apart, computed once (T5's
# relative position buckets, a log per query and key, were recomputed for each head)
CALLS = ("exp", "log", "pow", "erf", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh", "softplus", "mish", "elu",
         "selu", "celu", "sin", "cos")


@dataclass
class _TreeNode:
    parent: "_TreeNode | None"
    depth: int
    pattern: int
    index: int


@dataclass
class _Group:
    pattern: int
    parent: "_Group | None" = None
    num_nodes: int = 1
    anchor: int | None = None
    calls: bool = False         # a member is in CALLS

    def root(self) -> "_Group":
        g = self
        while g.parent is not None:
            g = g.parent
        # path compression
        h = self
        while h.parent is not None and h.parent is not g:
            h.parent, h = g, h.parent
        return g


@dataclass
class FusedGroup:
    nodes: list                 # node indices, in topological order
    anchor: int | None          # the out-elemwise-fusable / reducing node, if any
    pattern: int
    extra: dict = field(default_factory=dict)


def _edges(graph: Graph):
    index = {id(n.output): k for k, n in enumerate(graph.nodes)}
    outs = [[] for _ in graph.nodes]
    for k, n in enumerate(graph.nodes):
        pat = PATTERN.get(n.op, Pattern.OPAQUE)
        for v in n.inputs:
            src = index.get(id(v))
            if src is None:
                continue
            edge = pat
            if pat == Pattern.BROADCAST and tuple(v.shape) == tuple(n.output.shape):
                edge = Pattern.ELEMWISE
            outs[src].append((k, edge))
    extern = {index[id(v)] for v in graph.outputs if id(v) in index}
    return outs, extern


def _lca(a: _TreeNode, b: _TreeNode, pattern: list):
    while a is not b:
        if a is None or b is None:
            return None
        if a.depth < b.depth:
            pattern[0] = max(pattern[0], b.pattern)
            b = b.parent
        elif b.depth < a.depth:
            pattern[0] = max(pattern[0], a.pattern)
            a = a.parent
        else:
            pattern[0] = max(pattern[0], a.pattern, b.pattern)
            a, b = a.parent, b.parent
    return a


def post_dominator_tree(graph: Graph, outs, extern) -> list:
    tree: list = [None] * len(graph.nodes)
    for k in range(len(graph.nodes) - 1, -1, -1):
        if k in extern or not outs[k]:
            tree[k] = _TreeNode(None, 1, Pattern.OPAQUE, k)
            continue
        pattern = [Pattern.ELEMWISE]
        parent = None
        for j, (consumer, edge) in enumerate(outs[k]):
            node = tree[consumer]
            parent = node if j == 0 else _lca(parent, node, pattern)
            pattern[0] = max(pattern[0], edge)
        tree[k] = _TreeNode(parent, parent.depth + 1 if parent else 1, pattern[0], k)
    return tree


def fuse(graph: Graph, max_depth: int = MAX_FUSE_DEPTH) -> list:
    """The fused groups of `graph`."""
    outs, extern = _edges(graph)
    tree = post_dominator_tree(graph, outs, extern)
    groups = []
    for k, n in enumerate(graph.nodes):
        pat = PATTERN.get(n.op, Pattern.OPAQUE)
        groups.append(_Group(pat, anchor=k if pat == Pattern.OUT_EWISE_FUSABLE else None, calls=n.op in CALLS))

    def path(src: int, sink: int) -> list:
        """src and every node on a path from it to its post-dominator `sink` (included), preorder."""
        order, visited, stack = [], set(), [src]
        while stack:
            k = stack.pop()
            if k in visited:
                continue
            visited.add(k)
            order.append(k)
            if k != sink:
                stack.extend(c for c, _ in reversed(outs[k]))
        return order

    def check_path(src: int, sink: int, fcond) -> bool:
        return all(fcond(groups[k].root().pattern, k == sink) for k in path(src, sink) if k != src)

    def rereads(src: int, sink: int) -> bool:
        """src's group calls libm and a node up to sink has more elements: each call would run per read."""
        size = output_elements(graph.nodes[src])
        return groups[src].root().calls and max(output_elements(graph.nodes[k]) for k in path(src, sink) if k != src) > size

    def count_with(src: int, sink: int) -> int:
        """Size of the group that fusing src..sink would make."""
        roots = {id(groups[k].root()): groups[k].root() for k in path(src, sink)}
        return sum(g.num_nodes for g in roots.values())

    def merge(child: _Group, parent: _Group):
        child, parent = child.root(), parent.root()
        if child is parent:
            return
        parent.num_nodes += child.num_nodes
        parent.calls |= child.calls
        child.parent = parent
        if child.anchor is not None:
            parent.anchor = child.anchor
            parent.pattern = max(parent.pattern, child.pattern)

    def commit(src: int, sink: int):
        for k in path(src, sink):
            merge(groups[k], groups[sink])

    for phase in range(2):
        for k in range(len(graph.nodes)):
            own = groups[k].pattern          # this node's own group, as in TVM (not its root's)
            if own == Pattern.OPAQUE:
                continue
            dom = tree[k]
            if dom.parent is None:
                continue
            sink = dom.parent.index
            if groups[sink].root() is groups[k].root():
                continue
            if count_with(k, sink) > max_depth or (own <= Pattern.INJECTIVE and rereads(k, sink)):
                continue
            if own == Pattern.OUT_EWISE_FUSABLE:
                if phase != 0:
                    continue
                if dom.pattern == Pattern.ELEMWISE and check_path(k, sink, lambda p, is_sink: p <= Pattern.BROADCAST):
                    commit(k, sink)
            elif own <= Pattern.BROADCAST:
                if dom.pattern <= Pattern.INJECTIVE or dom.pattern == Pattern.COMM_REDUCE:
                    def cond(p, is_sink):
                        if not is_sink:
                            return p <= Pattern.INJECTIVE
                        return p <= Pattern.BROADCAST or p in (Pattern.COMM_REDUCE, Pattern.INJECTIVE, Pattern.OUT_EWISE_FUSABLE)
                    if check_path(k, sink, cond):
                        commit(k, sink)
            elif own == Pattern.INJECTIVE:
                if phase != 1:
                    continue
                into_reduce = graph.nodes[k].op not in OWN_KERNEL     # a layout transform stays priced apart
                if graph.nodes[k].op in TABLE_READS and any(graph.nodes[p].op in OWN_KERNEL for p in path(k, sink)):
                    continue
                if check_path(k, sink, lambda p, is_sink: p <= Pattern.INJECTIVE
                              or (into_reduce and is_sink and p == Pattern.COMM_REDUCE)):
                    commit(k, sink)
    by_root: dict = {}
    for k in range(len(graph.nodes)):
        by_root.setdefault(id(groups[k].root()), []).append(k)
    result = []
    for members in by_root.values():
        root = groups[members[0]].root()
        result.append(FusedGroup(sorted(members), root.anchor, root.pattern))
    result.sort(key=lambda fg: fg.nodes[-1])     # by output node: a topological order of the groups
    # (by first node is not: a residual block's group starts before the shortcut group it consumes)
    return result


def fuse_attention(graph: Graph, groups: list) -> list:
    """`groups` with each attention as one group: batch_matmul (Q.K^T), the group of what reads it
    up to a softmax over the last axis (scale, mask, slice), batch_matmul (P.V). Each side must be
    alone in its group and read only by the next, so the merged group still has one output and
    its scores row by row (compile_model._row_steps) replace three tensors in memory."""
    of = {k: gi for gi, grp in enumerate(groups) for k in grp.nodes}
    index = {id(n.output): k for k, n in enumerate(graph.nodes)}
    consumers = graph.consumers()
    outputs = {id(v) for v in graph.outputs}

    def sole(k: int, op: str) -> bool:
        grp = groups[of[k]]
        return grp.nodes == [k] and graph.nodes[k].op == op

    def read_once(k: int) -> bool:
        v = graph.nodes[k].output
        return id(v) not in outputs and len(consumers.get(id(v), [])) == 1

    merged, absorbed = {}, set()
    for gi, grp in enumerate(groups):
        last = graph.nodes[grp.nodes[-1]]
        if grp.anchor is not None or last.op != "softmax" or last.attrs["axis"] != len(last.output.shape) - 1:
            continue
        inside = set(grp.nodes)
        feeds = {index[id(v)] for k in grp.nodes for v in graph.nodes[k].inputs
                 if id(v) in index and index[id(v)] not in inside}
        if len(feeds) != 1 or not sole(q := feeds.pop(), "batch_matmul") or not read_once(q) \
                or not read_once(grp.nodes[-1]):
            continue
        reader = consumers[id(last.output)][0]
        pv = index[id(reader.output)]
        if not sole(pv, "batch_matmul") or reader.inputs[0] is not last.output:
            continue
        merged[of[pv]] = FusedGroup(sorted([q, *grp.nodes, pv]), None, Pattern.COMM_REDUCE)
        absorbed |= {of[q], gi}
    return [merged.get(gi, grp) for gi, grp in enumerate(groups) if gi not in absorbed]


@register("FuseOps", 0, required=("InferType",))
def fuse_ops(graph: Graph, ctx) -> Graph:
    """Group operators into fused primitive subgraphs by the post-dominator tree."""
    depth = int(ctx.options.get("max_fuse_depth", MAX_FUSE_DEPTH))
    out = Graph(graph.inputs, graph.outputs, graph.nodes, graph.name, dict(graph.meta))
    out.meta["fused_groups"] = fuse(graph, depth)
    return out
