"""PadMatmulColumns: a batch_matmul whose column count no vector width divides (ViT's 197 tokens in
Q.K^T) multiplies by its second operand padded with zero columns to a multiple of 8, and the product
is sliced back: the task gets whole vectors of columns, for the cost of a pad and a slice copy.
Not in the default pipeline since GEMM tiles take a guarded last tile of columns that runs vectors
(ViT-B/16 ran 1.07x faster at 1 thread and 1.04x at 2 without it, on an AVX-512 host:
docs/history.md); `tuner inspect --passes` runs it.
A graph imported for a range of shapes (meta "dynamic", graph.dynamic) is left as it is: its
column count varies, and one decision must hold for every value.
"""
from __future__ import annotations

from ..builder import rebuild
from ..ir import Graph
from ...ops.dense import BMM_VIEWS
from .base import register

WIDTH = 8          # columns padded to a multiple of this
MIN_COLUMNS = 16   # fewer: the pad and slice would cost more than the scalar columns


def padded(n: int) -> int:
    return -(-n // WIDTH) * WIDTH


@register("PadMatmulColumns", 0, required=("InferType",))
def pad_matmul_columns(graph: Graph, ctx) -> Graph:
    """batch_matmul(a, b) with N % 4 and N >= MIN_COLUMNS -> slice(batch_matmul(a, pad(b)))."""
    if graph.meta.get("dynamic"):
        return graph

    def rw(b, n, ins):
        if n.op != "batch_matmul" or any(n.attrs.get(k) for k in BMM_VIEWS):   # heads read in place: as they are
            return None
        trans = bool(n.attrs.get("trans_b", 0))
        rhs = ins[1]
        cols = rhs.shape[-2] if trans else rhs.shape[-1]
        if cols % 4 == 0 or cols < MIN_COLUMNS:
            return None
        nd, axis = len(rhs.shape), len(rhs.shape) - (2 if trans else 1)
        pads = [0] * (2 * nd)                  # ONNX order: every axis's begin, then every axis's end
        pads[nd + axis] = padded(cols) - cols
        wide = b.add("batch_matmul", [ins[0], b.add("pad", [rhs], {"pads": pads, "value": 0.0}, f"{n.name}_cols")],
                     n.attrs, f"{n.name}_padded")
        shape = list(n.output.shape)
        return b.add("slice", [wide], {"begin": [0] * len(shape), "step": [1] * len(shape), "shape": shape}, n.name)

    return rebuild(graph, rw)
