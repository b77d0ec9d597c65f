"""Graph operators: shape inference, NumPy evaluation and fusion pattern, one entry per op."""
from __future__ import annotations

import numpy as np

from ..te import layouts as L
from ..te import ops as te_ops
from .ir import GraphError, Node

# fusion patterns, ordered as in TVM's FuseOps
ELEMWISE, BROADCAST, INJECTIVE, COMM_REDUCE, OUT_EWISE_FUSABLE, OPAQUE = 0, 1, 2, 3, 4, 8
PATTERN_NAMES = {0: "elemwise", 1: "broadcast", 2: "injective", 3: "comm-reduce", 4: "out-elemwise-fusable",
                 8: "opaque"}

PATTERN = {
    "conv2d": OUT_EWISE_FUSABLE, "dense": OUT_EWISE_FUSABLE, "max_pool2d": OUT_EWISE_FUSABLE,
    "avg_pool2d": OUT_EWISE_FUSABLE, "global_avg_pool2d": OUT_EWISE_FUSABLE,
    "add": BROADCAST, "sub": BROADCAST, "mul": BROADCAST, "div": BROADCAST,
    "relu": ELEMWISE, "sigmoid": ELEMWISE, "clip": ELEMWISE, "hard_sigmoid": ELEMWISE, "hard_swish": ELEMWISE,
    "flatten": INJECTIVE, "reshape": INJECTIVE, "transpose": INJECTIVE, "concat": INJECTIVE, "pad": INJECTIVE,
    "layout_transform": INJECTIVE, "mean": COMM_REDUCE, "softmax": OPAQUE, "batch_norm": OPAQUE,
}
UNARY = ("relu", "sigmoid", "clip", "hard_sigmoid", "hard_swish")
BINARY = ("add", "sub", "mul", "div")


def kernel_layout(layout: str) -> str:
    if layout == "NCHW":
        return "OIHW"
    if layout == "NHWC":
        return "HWIO"
    b = L.block_of(layout)
    return f"OIHW{b}i{b}o"


def nchw_dims(shape: tuple, layout: str) -> tuple:
    """(N, C, H, W) of an activation of `shape` in `layout`."""
    if layout in ("NCHW", ""):
        return tuple(shape)
    if layout == "NHWC":
        n, h, w, c = shape
        return (n, c, h, w)
    n, cb, h, w, b = shape
    return (n, cb * b, h, w)


def _conv_out(node: Node):
    x, w = node.inputs[:2]
    a = node.attrs
    lay = a.get("layout", "NCHW")
    n, c, h, wd = nchw_dims(x.shape, lay)
    k, cg, r, s = _oihw_shape(w.shape, a.get("kernel_layout", kernel_layout(lay)))
    if c != cg * a["groups"]:
        raise GraphError(f"conv2d {node.name}: input has {c} channels but the weight expects "
                         f"{cg} x {a['groups']} groups")
    pt, pl, pb, pr = a["pads"]
    oh = te_ops.conv_out_size(h, r, a["strides"][0], pt, pb, a["dilations"][0])
    ow = te_ops.conv_out_size(wd, s, a["strides"][1], pl, pr, a["dilations"][1])
    if oh < 1 or ow < 1:
        raise GraphError(f"conv2d {node.name}: kernel {r}x{s} does not fit input {h}x{wd}")
    return L.act_shape(lay, n, k, oh, ow, L.fit_block(k, L.block_of(lay)) if L.block_of(lay) else None), lay


def _oihw_shape(shape: tuple, klayout: str) -> tuple:
    if klayout == "OIHW":
        return tuple(shape)
    if klayout == "HWIO":
        r, s, i, o = shape
        return (o, i, r, s)
    oc, ic, r, s, ib, ob = shape
    return (oc * ob, ic * ib, r, s)


def _pool_out(node: Node):
    x = node.inputs[0]
    a = node.attrs
    lay = a.get("layout", "NCHW")
    n, c, h, w = nchw_dims(x.shape, lay)
    r, s = a["kernel"]
    pt, pl, pb, pr = a["pads"]
    oh = te_ops.conv_out_size(h, r, a["strides"][0], pt, pb, 1)
    ow = te_ops.conv_out_size(w, s, a["strides"][1], pl, pr, 1)
    if oh < 1 or ow < 1:
        raise GraphError(f"{node.op} {node.name}: window {r}x{s} does not fit input {h}x{w}")
    return _relayout(x.shape, lay, n, c, oh, ow), lay


def _relayout(shape, lay, n, c, h, w):
    if lay == "NCHW" or lay == "":
        return (n, c, h, w)
    if lay == "NHWC":
        return (n, h, w, c)
    return (n, shape[1], h, w, shape[4])


def _broadcast(node: Node):
    try:
        shape = np.broadcast_shapes(*(v.shape for v in node.inputs))
    except ValueError:
        raise GraphError(f"{node.op} {node.name}: shapes {' and '.join(str(list(v.shape)) for v in node.inputs)} "
                         "do not broadcast") from None
    act = [v for v in node.inputs if not v.is_const and v.shape == shape]
    return tuple(shape), (act[0].layout if act else node.inputs[0].layout)


def infer(node: Node) -> tuple:
    """(shape, dtype, layout) of the node's output."""
    op, a, ins = node.op, node.attrs, node.inputs
    x = ins[0] if ins else None
    if op == "conv2d":
        shape, lay = _conv_out(node)
        return shape, "float32", lay
    if op == "dense":
        if len(x.shape) != 2 or len(ins[1].shape) != 2 or x.shape[1] != ins[1].shape[1]:
            raise GraphError(f"dense {node.name}: cannot multiply {list(x.shape)} by weight {list(ins[1].shape)}")
        return (x.shape[0], ins[1].shape[0]), "float32", ""
    if op in BINARY:
        shape, lay = _broadcast(node)
        return shape, x.dtype, lay
    if op in UNARY or op == "softmax":
        return x.shape, x.dtype, x.layout
    if op == "batch_norm":
        return x.shape, x.dtype, x.layout
    if op in ("max_pool2d", "avg_pool2d"):
        shape, lay = _pool_out(node)
        return shape, x.dtype, lay
    if op == "global_avg_pool2d":
        lay = a.get("layout", "NCHW")
        n, c, h, w = nchw_dims(x.shape, lay)
        return _relayout(x.shape, lay, n, c, 1, 1), x.dtype, lay
    if op == "flatten":
        ax = a["axis"]
        return (int(np.prod(x.shape[:ax], dtype=np.int64)), int(np.prod(x.shape[ax:], dtype=np.int64))), x.dtype, ""
    if op == "reshape":
        if int(np.prod(a["shape"])) != int(np.prod(x.shape)):
            raise GraphError(f"reshape {node.name}: cannot reshape {list(x.shape)} to {list(a['shape'])}")
        return tuple(a["shape"]), x.dtype, ""
    if op == "transpose":
        return tuple(x.shape[p] for p in a["perm"]), x.dtype, ""
    if op == "concat":
        ax = a["axis"]
        base = list(ins[0].shape)
        for v in ins[1:]:
            if len(v.shape) != len(base) or any(d != e for k, (d, e) in enumerate(zip(v.shape, base)) if k != ax):
                raise GraphError(f"concat {node.name}: shapes {[list(v.shape) for v in ins]} differ off axis {ax}")
        base[ax] = sum(v.shape[ax] for v in ins)
        return tuple(base), x.dtype, x.layout
    if op == "pad":
        p = a["pads"]
        nd = len(x.shape)
        return tuple(d + p[k] + p[k + nd] for k, d in enumerate(x.shape)), x.dtype, ""
    if op == "mean":
        axes = [ax % len(x.shape) for ax in a["axes"]]
        if a.get("keepdims", 1):
            return tuple(1 if k in axes else d for k, d in enumerate(x.shape)), x.dtype, ""
        return tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype, ""
    if op == "layout_transform":
        n, c, h, w = nchw_dims(x.shape, a["src"])
        return L.act_shape(a["dst"], n, c, h, w), x.dtype, a["dst"]
    raise GraphError(f"no shape rule for op {op!r}")


# ---------------------------------------------------------------- evaluation

def _to_nchw(x, lay):
    return L.act_to_nchw(x, lay) if lay not in ("", "NCHW") else x


def _from_nchw(x, lay):
    return L.act_from_nchw(x, lay) if lay not in ("", "NCHW") else x


def evaluate(node: Node, args: list) -> np.ndarray:
    """The node's output for NumPy `args` (float32 in, float32 out; math in float64)."""
    op, a = node.op, node.attrs
    x = args[0] if args else None
    if op == "conv2d":
        lay = a.get("layout", "NCHW")
        w = args[1]
        kl = a.get("kernel_layout", kernel_layout(lay))
        w_oihw = w if kl == "OIHW" else L.conv_weight_to_oihw(w, "NHWC" if kl == "HWIO" else "NCHW16c")
        y = te_ops.conv2d_ref(_to_nchw(x, lay), w_oihw, tuple(a["strides"]), tuple(a["pads"]),
                              tuple(a["dilations"]), a["groups"])
        return _from_nchw(y, lay).astype(np.float32)
    if op == "dense":
        return (x.astype(np.float64) @ args[1].astype(np.float64).T).astype(np.float32)
    if op in BINARY:
        f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
        return f(x.astype(np.float64), args[1].astype(np.float64)).astype(np.float32)
    if op == "relu":
        return np.maximum(x, 0).astype(np.float32)
    if op == "sigmoid":
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)
    if op == "clip":
        return np.clip(x, a.get("min", -np.inf), a.get("max", np.inf)).astype(np.float32)
    if op == "hard_sigmoid":
        return np.clip(a["alpha"] * x.astype(np.float64) + a["beta"], 0, 1).astype(np.float32)
    if op == "hard_swish":
        xd = x.astype(np.float64)
        return (xd * np.clip(xd / 6.0 + 0.5, 0, 1)).astype(np.float32)
    if op == "batch_norm":
        lay = a.get("layout", "NCHW")
        scale, bias, mean, var = (v.astype(np.float64) for v in args[1:5])
        y = _to_nchw(x, lay).astype(np.float64)
        sh = (1, -1, 1, 1) if y.ndim == 4 else (1, -1)
        y = (y - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + a["epsilon"]) * scale.reshape(sh) + bias.reshape(sh)
        return _from_nchw(y, lay).astype(np.float32)
    if op in ("max_pool2d", "avg_pool2d"):
        lay = a.get("layout", "NCHW")
        y = te_ops.pool2d_ref(_to_nchw(x, lay), op[:3], tuple(a["kernel"]), a["strides"][0], tuple(a["pads"]),
                              bool(a.get("count_include_pad", 0)))
        return _from_nchw(y, lay).astype(np.float32)
    if op == "global_avg_pool2d":
        lay = a.get("layout", "NCHW")
        y = _to_nchw(x, lay).astype(np.float64).mean(axis=(2, 3), keepdims=True)
        return _from_nchw(y, lay).astype(np.float32)
    if op == "flatten":
        return x.reshape(node.output.shape)
    if op == "reshape":
        return x.reshape(a["shape"])
    if op == "transpose":
        return np.ascontiguousarray(x.transpose(a["perm"]))
    if op == "concat":
        return np.concatenate(args, axis=a["axis"])
    if op == "pad":
        nd = x.ndim
        p = a["pads"]
        return np.pad(x, [(p[k], p[k + nd]) for k in range(nd)], constant_values=a.get("value", 0.0))
    if op == "softmax":
        xd = x.astype(np.float64)
        e = np.exp(xd - xd.max(axis=a["axis"], keepdims=True))
        return (e / e.sum(axis=a["axis"], keepdims=True)).astype(np.float32)
    if op == "mean":
        return x.astype(np.float64).mean(axis=tuple(a["axes"]), keepdims=bool(a.get("keepdims", 1))).astype(np.float32)
    if op == "layout_transform":
        return _from_nchw(_to_nchw(x, a["src"]), a["dst"]).astype(x.dtype)
    raise GraphError(f"no evaluator for op {op!r}")
