"""Readable text form of the graph IR: `%3 = conv2d(%0, %w1, strides=[1,1]) : f32[1,64,56,56]`."""
from __future__ import annotations

import numpy as np


def _fmt_attr(v) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt_attr(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def print_graph(graph, show_consts: bool = False) -> str:
    names: dict = {}
    lines = []

    def ref(v) -> str:
        if id(v) not in names:
            names[id(v)] = f"%{v.name}"
        return names[id(v)]

    ins = ", ".join(f"{ref(v)}: {v.type_str()}" for v in graph.inputs)
    lines.append(f"graph {graph.name}({ins}) {{")
    if show_consts:
        for c in graph.constants():
            lines.append(f"  {ref(c)} = const {c.type_str()} (mean {float(np.mean(c.data)):.4g})")
    for n in graph.nodes:
        args = [ref(v) for v in n.inputs]
        attrs = [f"{k}={_fmt_attr(v)}" for k, v in sorted(n.attrs.items())]
        lines.append(f"  {ref(n.output)} = {n.op}({', '.join(args + attrs)}) : {n.output.type_str()}")
    lines.append(f"  return {', '.join(ref(v) for v in graph.outputs)}")
    lines.append("}")
    return "\n".join(lines)
