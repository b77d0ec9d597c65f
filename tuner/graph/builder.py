"""Building graphs: unique names, and every node's output typed by its operator's inference."""
from __future__ import annotations

import re

import numpy as np

from ..ops import infer
from .ir import Graph, Node, Value, check_size

_UNSAFE = re.compile(r"[^0-9A-Za-z_.]")     # an ASCII name's characters that become "_"


class GraphBuilder:
    """Makes uniquely named values and nodes, in order; the way every pass builds its output."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list = []
        self.inputs: list = []
        self._names: set = set()
        self._counter = 0

    def fresh(self, hint: str = "v") -> str:
        base = (_UNSAFE.sub("_", hint) if hint.isascii() else "".join(c if c.isalnum() or c in "_." else "_" for c in hint)) or "v"
        name = base
        while name in self._names:
            self._counter += 1
            name = f"{base}_{self._counter}"
        self._names.add(name)
        return name

    def input(self, name: str, shape, dtype="float32", layout="") -> Value:
        v = Value(self.fresh(name), tuple(int(s) for s in shape), dtype, layout)
        check_size(v, f"input {name!r}")
        self.inputs.append(v)
        return v

    def const(self, data: np.ndarray, name: str = "c") -> Value:
        data = np.asarray(data)
        if data.dtype == np.float64:
            data = data.astype(np.float32)
        return Value(self.fresh(name), tuple(data.shape), str(data.dtype), "", None, data)

    def add(self, op: str, inputs: list, attrs: dict | None = None, name: str = "") -> Value:
        attrs = dict(attrs or {})
        out = Value(self.fresh(name or op))
        node = Node(op, list(inputs), attrs, out, name or out.name)
        out.shape, out.dtype, out.layout = infer(node)
        check_size(out, f"the output of {node.op} node {node.name!r}")
        out.producer = node
        self.nodes.append(node)
        return out

    def finish(self, outputs: list, meta: dict | None = None) -> Graph:
        return Graph(list(self.inputs), list(outputs), list(self.nodes), self.name, dict(meta or {}))


def rebuild(graph: Graph, rewrite) -> Graph:
    """Copy `graph` node by node; `rewrite(builder, node, new_inputs)` returns the new output value
    (or None to copy the node unchanged). Inputs and constants are carried over as they are."""
    b = GraphBuilder(graph.name)
    mapping: dict = {}
    for v in graph.inputs:
        nv = b.input(v.name, v.shape, v.dtype, v.layout)
        mapping[id(v)] = nv
    for n in graph.nodes:
        ins = [mapping.get(id(v), v) for v in n.inputs]
        out = rewrite(b, n, ins)
        if out is None:
            out = b.add(n.op, ins, n.attrs, n.name)
        mapping[id(n.output)] = out
    return b.finish([mapping.get(id(v), v) for v in graph.outputs], graph.meta)
