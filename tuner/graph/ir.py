"""Graph IR: a functional DAG of operator nodes over typed values.

Values are produced by exactly one node (or are graph inputs / constants); nodes list their
input values, so use-def edges are explicit. Graphs are treated as immutable: passes build new
ones with `GraphBuilder`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError


class GraphError(UserError):
    pass


@dataclass(eq=False)
class Value:
    name: str
    shape: tuple = ()
    dtype: str = "float32"
    layout: str = ""                 # activation layout (NCHW, NHWC, NCHW16c, ...) or "" if none
    producer: "Node | None" = None
    data: np.ndarray | None = None   # set for constants

    @property
    def is_const(self) -> bool:
        return self.data is not None

    def type_str(self) -> str:
        dt = {"float32": "f32", "int64": "i64", "int32": "i32"}.get(self.dtype, self.dtype)
        lay = f" {self.layout}" if self.layout else ""
        return f"{dt}[{','.join(str(d) for d in self.shape)}]{lay}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: list
    attrs: dict
    output: Value
    name: str = ""                   # the source node name (e.g. from ONNX), for messages


@dataclass(eq=False)
class Graph:
    inputs: list                     # Values
    outputs: list                    # Values
    nodes: list                      # Nodes in topological order
    name: str = "graph"
    meta: dict = field(default_factory=dict)

    def consumers(self) -> dict:
        uses: dict = {}
        for n in self.nodes:
            for v in n.inputs:
                uses.setdefault(id(v), []).append(n)
        return uses

    def constants(self) -> list:
        seen, out = set(), []
        for n in self.nodes:
            for v in n.inputs:
                if v.is_const and id(v) not in seen:
                    seen.add(id(v))
                    out.append(v)
        return out

    def count(self, op: str) -> int:
        return sum(1 for n in self.nodes if n.op == op)

    def __str__(self) -> str:
        from .printer import print_graph
        return print_graph(self)


MAX_ELEMENTS = 2**31 - 1     # kernels index tensors with 32-bit ints


def _check_size(v: Value, what: str) -> None:
    n = 1
    for d in v.shape:
        if d < 1:
            raise GraphError(f"{what} has shape {list(v.shape)}: every dimension must be at least 1")
        n *= d
    if n > MAX_ELEMENTS:
        raise GraphError(f"{what} has shape {list(v.shape)}, {n} elements; tuner compiles tensors of at most "
                         f"{MAX_ELEMENTS} elements: give a smaller --input-shape")


class GraphBuilder:
    """Makes uniquely named values and nodes, in order; the way every pass builds its output."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list = []
        self.inputs: list = []
        self._names: set = set()
        self._counter = 0

    def fresh(self, hint: str = "v") -> str:
        base = "".join(c if c.isalnum() or c in "_." else "_" for c in hint) or "v"
        name = base
        while name in self._names:
            self._counter += 1
            name = f"{base}_{self._counter}"
        self._names.add(name)
        return name

    def input(self, name: str, shape, dtype="float32", layout="") -> Value:
        v = Value(self.fresh(name), tuple(int(s) for s in shape), dtype, layout)
        _check_size(v, f"input {name!r}")
        self.inputs.append(v)
        return v

    def const(self, data: np.ndarray, name: str = "c") -> Value:
        data = np.asarray(data)
        if data.dtype == np.float64:
            data = data.astype(np.float32)
        return Value(self.fresh(name), tuple(data.shape), str(data.dtype), "", None, data)

    def add(self, op: str, inputs: list, attrs: dict | None = None, name: str = "") -> Value:
        from .ops import infer
        attrs = dict(attrs or {})
        out = Value(self.fresh(name or op))
        node = Node(op, list(inputs), attrs, out, name or out.name)
        out.shape, out.dtype, out.layout = infer(node)
        _check_size(out, f"the output of {node.op} node {node.name!r}")
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


def interface_names(graph: Graph) -> tuple:
    """(input names, output names) as the model's file gives them: a value's name is also a C
    identifier, so an importer that had to change one keeps the original in meta['interface']."""
    io = graph.meta.get("interface")
    if io:
        return list(io["inputs"]), list(io["outputs"])
    return [v.name for v in graph.inputs], [v.name for v in graph.outputs]
