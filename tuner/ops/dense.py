"""dense: a fully connected layer (activation rows x constant weight), its weight packed OI or
OI[x]o, with its fused epilogue."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..te import layouts as L
from ..te.tensor import Tensor, compute, placeholder, reduce_axis, sum_reduce
from .common import f32
from .elementwise import epilogue, epilogue_ref
from .registry import OpDef, Pattern, WorkloadDef, register


def dense(data: Tensor, weight: Tensor, block: int, name: str = "dense") -> Tensor:
    n_, c_ = data.shape
    rc = reduce_axis(c_, "rc")
    if block:
        kb, _, b = weight.shape
        k_ = kb * b
        return compute((n_, k_), lambda n, k: sum_reduce(data[n, rc.var] * weight[k // b, rc.var, k % b], [rc]),
                       name, tag="dense", inputs=[data, weight], axis_names=["n", "k"])
    k_ = weight.shape[0]
    return compute((n_, k_), lambda n, k: sum_reduce(data[n, rc.var] * weight[k, rc.var], [rc]),
                   name, tag="dense", inputs=[data, weight], axis_names=["n", "k"])


def dense_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


def dense_flops(n: int, c: int, k: int) -> float:
    return 2.0 * n * c * k


def _dense_infer(node):
    x, w = node.inputs[:2]
    if len(x.shape) != 2 or len(w.shape) != 2 or x.shape[1] != w.shape[1]:
        raise GraphError(f"dense {node.name}: cannot multiply {list(x.shape)} by weight {list(w.shape)}")
    return (x.shape[0], w.shape[0]), "float32", ""


def _onnx_gemm(cx, ins, a):
    x = ins[0]
    if a.get("transA", 0):
        x = cx.add("transpose", [x], {"perm": [1, 0]}, "_transA")
    w = cx.const(ins[1], "the weight (B)")
    w = w if a.get("transB", 0) else w.T
    y = cx.add("dense", [x, cx.constant(np.ascontiguousarray(w), "_w")], {})
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if alpha != 1.0:
        y = cx.add("mul", [y, cx.constant(np.float32(alpha), "_alpha")], {}, "_alpha")
    if len(ins) > 2 and ins[2] is not None:
        c = ins[2] if beta == 1.0 or not ins[2].is_const else cx.constant(ins[2].data * beta, "_c")
        y = cx.add("add", [y, c], {}, "_bias")
    return [y]


def _onnx_matmul(cx, ins, a):
    x, w = ins[0], ins[1]
    if w is None or not w.is_const or len(x.shape) != 2 or w.data.ndim != 2:
        raise cx.fail("only 2-D activation x constant 2-D weight is supported")
    return [cx.add("dense", [x, cx.constant(np.ascontiguousarray(w.data.T), "_w")], {})]


def _export_dense(ex, n, ins):
    """dense followed by its only consumer, an add of a 1-D constant, is one Gemm with a bias."""
    users = ex.consumers(n.output)
    if len(users) == 1 and users[0].op == "add" and users[0].inputs[1].is_const and users[0].inputs[1].data.ndim == 1:
        ex.fold(users[0], n)
        ins = ins + [ex.ref(users[0].inputs[1])]
    ex.emit(n, "Gemm", ins, transB=1)


def _dense_build(wl):
    p = wl.p
    ob = wl.blocks[1]
    data = placeholder((p["N"], p["C"]), "data")
    weight = placeholder((p["K"] // ob, p["C"], ob) if ob else (p["K"], p["C"]), "weight")
    return epilogue(wl, [data, weight], dense(data, weight, ob), 0)


def _dense_ref(wl, arrays: list):
    p = wl.p
    y = dense_ref(arrays[0], L.dense_weight_to_oi(arrays[1], wl.blocks[1]))
    if p["bias"]:
        y = y + arrays[2]
    return epilogue_ref(p, y)


def _dense_task(n):
    return (dict(N=n.inputs[0].shape[0], C=n.inputs[0].shape[1], K=n.inputs[1].shape[0]),
            n.attrs.get("packing", L.DENSE_PACKING))


register(
    OpDef(name="dense", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_dense_infer,
          evaluate=lambda n, args: f32(dense_ref(args[0], args[1])),
          te=lambda n, ins, name: dense(ins[0], ins[1], 0, name),
          flops=lambda n: dense_flops(n.inputs[0].shape[0], n.inputs[0].shape[1], n.inputs[1].shape[0]),
          onnx_in={"Gemm": _onnx_gemm, "MatMul": _onnx_matmul}, onnx_out=_export_dense, task=_dense_task),
    WorkloadDef(name="dense", required=("C", "K"), defaults=dict(N=1, bias=0, relu=0), build=_dense_build,
                reference=_dense_ref, flops=lambda wl: dense_flops(wl.p["N"], wl.p["C"], wl.p["K"]),
                example="dense:N=1,C=2048,K=1000,bias=1", epilogue=True, layout="OI16o"),
)
