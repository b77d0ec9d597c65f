"""Graph IR: a functional DAG of operator nodes over typed values.

Values are produced by exactly one node (or are graph inputs / constants); nodes list their
input values, so use-def edges are explicit. Graphs are treated as immutable: passes build new
ones with `builder.GraphBuilder`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphError
from .printer import print_graph


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
        return print_graph(self)


MAX_ELEMENTS = 2**31 - 1     # kernels index tensors with 32-bit ints


def check_size(v: Value, what: str) -> None:
    n = 1
    for d in v.shape:
        if d < 1:
            raise GraphError(f"{what} has shape {list(v.shape)}: every dimension must be at least 1")
        n *= d
    if n > MAX_ELEMENTS:
        raise GraphError(f"{what} has shape {list(v.shape)}, {n} elements; tuner compiles tensors of at most "
                         f"{MAX_ELEMENTS} elements: give a smaller --input-shape")


def interface_names(graph: Graph) -> tuple:
    """(input names, output names) as the model's file gives them: a value's name is also a C
    identifier, so an importer that had to change one keeps the original in meta['interface']."""
    io = graph.meta.get("interface")
    if io:
        return list(io["inputs"]), list(io["outputs"])
    return [v.name for v in graph.inputs], [v.name for v in graph.outputs]


def _graph_hash(graph: Graph, structure: bool, named: bool = True) -> str:
    """The hash of graph_digest, or (structure) of graph_structure (without node names: not
    `named`): one walk, in node order."""
    h = hashlib.sha256()
    names: dict = {}
    for v in graph.inputs:
        names[id(v)] = f"in{len(names)}"
        h.update(f"input {v.shape}{'' if structure else f' {v.dtype}'}".encode())
    for n in graph.nodes:
        ins = []
        for v in n.inputs:
            if v.is_const and not structure:
                h.update(np.ascontiguousarray(v.data).data)
            ins.append((f"const{v.data.shape}" + ("" if structure else str(v.data.dtype))) if v.is_const
                       else names.get(id(v), "?"))
        names[id(n.output)] = f"v{len(names)}"
        attrs = sorted((k, str(a)) for k, a in n.attrs.items() if not (structure and isinstance(a, float)))
        h.update(json.dumps([n.op, n.name, attrs, ins] if structure and named else [n.op, attrs, ins]).encode())
    h.update(json.dumps([names.get(id(v), "?") for v in graph.outputs]).encode())
    return h.hexdigest()[:20]


def graph_digest(graph: Graph) -> str:
    """A hash of a graph: operators, attributes, shapes and constant bytes, in order."""
    return _graph_hash(graph, structure=False)


def graph_anonymous(graph: Graph) -> str:
    """graph_structure without node names: the same architecture however an exporter names it."""
    return _graph_hash(graph, structure=True, named=False)


def graph_structure(graph: Graph) -> str:
    """A hash of what a layout plan depends on: operators, node names, integer attributes, shapes
    and edges; not constants' values nor float attributes (an exporter rounds them to float32)."""
    return _graph_hash(graph, structure=True)
