"""GEMM-shaped operators: dense (activation rows x constant weight: a fully connected layer or a
transformer's projection, its weight packed OI or OI[x]o, with its fused epilogue) and batch_matmul
(activation x activation, as attention's Q.K^T and P.V; layout NT: the second operand given
transposed, N x K). ONNX MatMul of any rank imports as one of the two."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..te import layouts as L
from ..te.tensor import Tensor, compute, placeholder, reduce_axis, sum_reduce
from .common import broadcast_index, f32
from .elementwise import epilogue, epilogue_ref
from .registry import NoTask, OpDef, Pattern, WorkloadDef, register


def dense(data: Tensor, weight: Tensor, block: int, name: str = "dense") -> Tensor:
    """data (..., C) x weight (K, C) (or packed K/b, C, b): over the last axis, the leading axes rows."""
    lead, nl = data.shape[:-1], data.ndim - 1
    rc = reduce_axis(data.shape[-1], "rc")
    if block:
        b = weight.shape[2]
        k_, w = weight.shape[0] * b, lambda k, r: weight[k // b, r, k % b]
    else:
        k_, w = weight.shape[0], lambda k, r: weight[k, r]
    return compute((*lead, k_), lambda *i: sum_reduce(data[i[:nl] + (rc.var,)] * w(i[nl], rc.var), [rc]),
                   name, tag="dense", inputs=[data, weight],
                   axis_names=(["n"] if nl == 1 else [f"n{k}" for k in range(nl)]) + ["k"])


def dense_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


def dense_flops(n: int, c: int, k: int) -> float:
    return 2.0 * n * c * k


def _rows(shape) -> int:
    return int(np.prod(shape[:-1], dtype=np.int64))


def _dense_infer(node):
    x, w = node.inputs[:2]
    if len(x.shape) < 2 or len(w.shape) != 2 or x.shape[-1] != w.shape[1]:
        raise GraphError(f"dense {node.name}: cannot multiply {list(x.shape)} by weight {list(w.shape)}")
    return (*x.shape[:-1], w.shape[0]), "float32", ""


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
    """ONNX MatMul (NumPy matmul semantics): by a constant 2-D weight it is dense over the rows of
    the other operand; otherwise batch_matmul, batch dims broadcast."""
    x, w = ins[0], ins[1]
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise cx.fail(f"a 1-D operand ({list(x.shape)} x {list(w.shape)}) is not supported; both need rank 2 or more")
    if w.is_const and w.data.ndim == 2 and not x.is_const:
        return [cx.add("dense", [x, cx.constant(np.ascontiguousarray(w.data.T), "_w")], {})]
    return [cx.add("batch_matmul", [x, w], {"trans_b": 0})]


def _export_dense(ex, n, ins):
    """dense followed by its only consumer, an add of a 1-D constant, is one Gemm with a bias; over
    more than two axes, a MatMul (and an Add)."""
    users = ex.consumers(n.output)
    bias = users[0].inputs[1] if len(users) == 1 and users[0].op == "add" and users[0].inputs[1].is_const else None
    if len(n.inputs[0].shape) > 2:
        ex.emit(n, "MatMul", [ins[0], ex.array(f"{n.name}_wT", n.inputs[1].data.T)])
        return
    if bias is not None and bias.data.ndim == 1:
        ex.fold(users[0], n)
        ins = ins + [ex.ref(bias)]
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
    if p.get("residual"):
        y = y + arrays[-1]
    return epilogue_ref(p, y)


def _dense_task(n):
    x = n.inputs[0].shape
    return dict(N=_rows(x), C=x[-1], K=n.inputs[1].shape[0]), n.attrs.get("packing", L.DENSE_PACKING)


# ---------------------------------------------------------------- batch_matmul

def batch_matmul(a: Tensor, b: Tensor, trans_b: bool, name: str = "batch_matmul") -> Tensor:
    """a (..., M, K) x b (..., K, N), or b (..., N, K) when trans_b; batch dims broadcast."""
    k_ = a.shape[-1]
    n_ = b.shape[-2] if trans_b else b.shape[-1]
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    nb = len(batch)
    r = reduce_axis(k_, f"{name}_r")

    def f(*i):
        m, n = i[nb], i[nb + 1]
        rhs = b[broadcast_index(b.shape[:-2], batch, i[:nb]) + ((n, r.var) if trans_b else (r.var, n))]
        return sum_reduce(a[broadcast_index(a.shape[:-2], batch, i[:nb]) + (m, r.var)] * rhs, [r])

    return compute((*batch, a.shape[-2], n_), f, name, tag="batch_matmul", inputs=[a, b],
                   axis_names=[f"b{k}" for k in range(nb)] + ["m", "n"])


def _bmm_ref(a: np.ndarray, b: np.ndarray, trans_b: bool) -> np.ndarray:
    b = np.swapaxes(b, -1, -2) if trans_b else b
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _bmm_infer(node):
    a, b = node.inputs[:2]
    tb = node.attrs.get("trans_b", 0)
    k_b, n_ = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        batch = None
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != k_b or batch is None:
        raise GraphError(f"batch_matmul {node.name}: cannot multiply {list(a.shape)} by {list(b.shape)}"
                         f"{' (transposed)' if tb else ''}")
    return (*batch, a.shape[-2], n_), "float32", ""


def _bmm_flops(n) -> float:
    return 2.0 * float(np.prod(n.output.shape)) * n.inputs[0].shape[-1]


def _bmm_task(n):
    a, b = n.inputs[:2]
    if tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
        raise NoTask(f"batch dims {list(a.shape[:-2])} and {list(b.shape[:-2])} broadcast")
    tb = n.attrs.get("trans_b", 0)
    return (dict(B=int(np.prod(a.shape[:-2], dtype=np.int64)), M=a.shape[-2], K=a.shape[-1],
                 N=b.shape[-2] if tb else b.shape[-1]), "NT" if tb else "NN")


def _bmm_build(wl):
    p = wl.p
    a = placeholder((p["B"], p["M"], p["K"]), "data")
    b = placeholder((p["B"], p["N"], p["K"]) if wl.layout == "NT" else (p["B"], p["K"], p["N"]), "rhs")
    return [a, b], batch_matmul(a, b, wl.layout == "NT")


def _export_bmm(ex, n, ins):
    if n.attrs.get("trans_b", 0):
        raise GraphError(f"batch_matmul {n.name}: export of the transposed form is not supported")
    ex.emit(n, "MatMul", ins)


register(
    OpDef(name="dense", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_dense_infer,
          evaluate=lambda n, args: f32(dense_ref(args[0], args[1])),
          te=lambda n, ins, name: dense(ins[0], ins[1], 0, name),
          flops=lambda n: dense_flops(_rows(n.inputs[0].shape), n.inputs[0].shape[-1], n.inputs[1].shape[0]),
          onnx_in={"Gemm": _onnx_gemm, "MatMul": _onnx_matmul}, onnx_out=_export_dense, task=_dense_task),
    WorkloadDef(name="dense", required=("C", "K"), defaults=dict(N=1, bias=0, relu=0), build=_dense_build,
                reference=_dense_ref, flops=lambda wl: dense_flops(wl.p["N"], wl.p["C"], wl.p["K"]),
                example="dense:N=1,C=2048,K=1000,bias=1", epilogue=True, layout="OI16o", optional=("residual",)),
    OpDef(name="batch_matmul", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_bmm_infer,
          evaluate=lambda n, args: f32(_bmm_ref(args[0], args[1], n.attrs.get("trans_b", 0))),
          te=lambda n, ins, name: batch_matmul(ins[0], ins[1], bool(n.attrs.get("trans_b", 0)), name),
          flops=_bmm_flops, onnx_out=_export_bmm, task=_bmm_task),
    WorkloadDef(name="batch_matmul", required=("M", "K", "N"), defaults=dict(B=1), build=_bmm_build,
                reference=lambda wl, a: _bmm_ref(a[0], a[1], wl.layout == "NT"),
                flops=lambda wl: 2.0 * wl.p["B"] * wl.p["M"] * wl.p["N"] * wl.p["K"],
                example="batch_matmul:B=12,M=128,K=64,N=128", layout="NN", layouts=("NN", "NT"),
                operands=("data", "rhs")),
)
