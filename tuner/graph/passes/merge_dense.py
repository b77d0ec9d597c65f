"""MergeParallelDense: dense layers that read the same activation (a transformer's Q, K and V
projections) become one dense over their weights stacked, sliced back into each layer's output,
as ONNX Runtime's Attention and TVM's CombineParallelDense do. When each layer's only consumer
adds a constant vector (its bias), the biases are stacked too and added once, so that the merged
GEMM keeps its bias as an epilogue. One GEMM reads the activation once for all layers.

Not in the default pipeline: on the 2-core AVX2 EPYC, BERT-base's and ViT-B/16's merged Q, K and
V ran as fast as the three GEMMs in the model, at 1 and 2 threads (docs/history.md), and merging
gives the task a new workload, which existing logs have no records for. Run it with
`tuner inspect MODEL --passes ...`, or make it a measured choice.
"""
from __future__ import annotations

import numpy as np

from ..builder import rebuild
from ..ir import Graph
from .base import register
from .simple import dead_code_elimination


def _bias(n, consumers) -> np.ndarray | None:
    """The vector a dense's only consumer adds to it (its bias), else None."""
    users = consumers.get(id(n.output), [])
    if len(users) != 1 or users[0].op != "add":
        return None
    add = users[0]
    other = add.inputs[1] if add.inputs[0] is n.output else add.inputs[0]
    k = n.output.shape[-1]
    if not other.is_const or other.data.ndim != 1 or other.data.shape[0] != k:
        return None
    return other.data


def _groups(graph: Graph) -> list:
    """Lists (two or more) of the dense nodes with a constant 2-D weight reading each activation."""
    by_input: dict = {}
    for n in graph.nodes:
        if n.op == "dense" and len(n.inputs) == 2 and not n.inputs[0].is_const and n.inputs[1].is_const \
                and n.inputs[1].data.ndim == 2 and not n.attrs:
            by_input.setdefault(id(n.inputs[0]), []).append(n)
    return [g for g in by_input.values() if len(g) > 1]


@register("MergeParallelDense", 2, required=("InferType",))
def merge_parallel_dense(graph: Graph, ctx) -> Graph:
    """dense(x, W1), dense(x, W2), ... -> slices of dense(x, [W1; W2; ...]) (+ [b1; b2; ...])."""
    found = _groups(graph)
    if not found:
        return graph
    consumers = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    replace: dict = {}           # id(node) -> (group index, member index, after the bias or not)
    groups = []                  # (members, stacked bias or None)
    for gi, g in enumerate(found):
        biases = [_bias(n, consumers) for n in g]
        with_bias = all(b is not None for b in biases) and not any(id(n.output) in outputs for n in g)
        for mi, n in enumerate(g):
            replace[id(n)] = (gi, mi, False)
            if with_bias:
                replace[id(consumers[id(n.output)][0])] = (gi, mi, True)
        groups.append((g, np.concatenate(biases).astype(np.float32) if with_bias else None))
    made: dict = {}              # group index -> (merged dense, merged with its bias or None)

    def rw(b, n, ins):
        if id(n) not in replace:
            return None
        gi, mi, biased = replace[id(n)]
        g, bias = groups[gi]
        if gi not in made:
            x = ins[0]          # the first member comes first in graph order: its input is built
            w = b.const(np.concatenate([m.inputs[1].data for m in g]).astype(np.float32), f"{g[0].name}_merged_w")
            y = b.add("dense", [x, w], {}, f"{g[0].name}_merged")
            yb = b.add("add", [y, b.const(bias, f"{g[0].name}_merged_b")], {}, f"{g[0].name}_merged_bias") \
                if bias is not None else None
            made[gi] = (y, yb)
        src = made[gi][1] if biased else made[gi][0]
        start = sum(m.output.shape[-1] for m in g[:mi])
        shape = list(g[mi].output.shape)
        begin = [0] * len(shape)
        begin[-1] = start
        return b.add("slice", [src], {"begin": begin, "step": [1] * len(shape), "shape": shape}, n.name)

    return dead_code_elimination(rebuild(graph, rw), ctx)
