"""The NumPy interpreter of the graph IR: the semantic oracle every pass is checked against."""
from __future__ import annotations

import numpy as np

from ..ops import evaluate, infer
from .ir import Graph, GraphError


def run(graph: Graph, *inputs: np.ndarray) -> list:
    if len(inputs) != len(graph.inputs):
        raise GraphError(f"{graph.name} takes {len(graph.inputs)} inputs, got {len(inputs)}")
    env: dict = {}
    for v, x in zip(graph.inputs, inputs):
        x = np.asarray(x, dtype=v.dtype)
        if x.shape != v.shape:
            raise GraphError(f"input {v.name} must have shape {list(v.shape)}, got {list(x.shape)}")
        env[id(v)] = x
    for n in graph.nodes:
        args = [v.data if v.is_const else env[id(v)] for v in n.inputs]
        env[id(n.output)] = evaluate(n, args)
    return [v.data if v.is_const else env[id(v)] for v in graph.outputs]


def verify(graph: Graph) -> None:
    """Every value defined before use, outputs defined, and every recorded type re-derivable."""
    defined = {id(v) for v in graph.inputs}
    for n in graph.nodes:
        for v in n.inputs:
            if not v.is_const and id(v) not in defined:
                raise GraphError(f"{n.op} {n.name} uses %{v.name} before it is defined")
        shape, dtype, layout = infer(n)
        if tuple(shape) != tuple(n.output.shape):
            raise GraphError(f"{n.op} {n.name}: recorded shape {list(n.output.shape)}, inferred {list(shape)}")
        defined.add(id(n.output))
    for v in graph.outputs:
        if not v.is_const and id(v) not in defined:
            raise GraphError(f"output %{v.name} is never computed")
