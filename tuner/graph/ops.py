"""Graph operators: one definition per operator, in one registry.

Each `OpDef` holds everything the graph side knows about an operator: its fusion pattern, shape
inference, NumPy evaluation (the interpreter every pass is checked against, and the reference a
compiled model is checked against), its tensor expression (what `tuner compile` generates a
kernel from when no tuned workload covers the group) and its FLOPs. Adding an operator is adding
one `OpDef` to OPS (and its tests); passes read the table, never an if-chain of op names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..te import layouts as L
from ..te import ops as te_ops
from ..te.expr import Call, Const
from ..te.tensor import Tensor, compute
from .ir import GraphError, Node

# fusion patterns, ordered as in TVM's FuseOps
ELEMWISE, BROADCAST, INJECTIVE, COMM_REDUCE, OUT_EWISE_FUSABLE, OPAQUE = 0, 1, 2, 3, 4, 8
PATTERN_NAMES = {0: "elemwise", 1: "broadcast", 2: "injective", 3: "comm-reduce", 4: "out-elemwise-fusable",
                 8: "opaque"}

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


class Unsupported(GraphError):
    """The kernel library cannot run this node (named in the message); exit 2."""


def _unsupported(node: Node, why: str):
    raise Unsupported(f"{node.op} node {node.name!r}: {why}; the kernel library cannot compile it")


def _f32(y) -> np.ndarray:
    return np.asarray(y).astype(np.float32)


def _to_nchw(x, lay):
    return L.act_to_nchw(x, lay) if lay not in ("", "NCHW") else x


def _from_nchw(x, lay):
    return L.act_from_nchw(x, lay) if lay not in ("", "NCHW") else x


def _same(node: Node):
    x = node.inputs[0]
    return x.shape, x.dtype, x.layout


def _elements(node: Node) -> float:
    return float(np.prod(node.output.shape))


# ---------------------------------------------------------------- conv2d

def _conv_infer(node):
    shape, lay = _conv_out(node)
    return shape, "float32", lay


def _conv_eval(node, args):
    a = node.attrs
    lay = a.get("layout", "NCHW")
    kl = a.get("kernel_layout", kernel_layout(lay))
    w_oihw = args[1] if kl == "OIHW" else L.conv_weight_to_oihw(args[1], "NHWC" if kl == "HWIO" else "NCHW16c")
    y = te_ops.conv2d_ref(_to_nchw(args[0], lay), w_oihw, tuple(a["strides"]), tuple(a["pads"]),
                          tuple(a["dilations"]), a["groups"])
    return _f32(_from_nchw(y, lay))


def _conv_te(node, ins, name):
    a = node.attrs
    lay = a.get("layout", "NCHW")
    if a["strides"][0] != a["strides"][1] or a["dilations"][0] != a["dilations"][1]:
        _unsupported(node, "different strides or dilations per axis")
    if a.get("kernel_layout", kernel_layout(lay)) != kernel_layout(lay):
        _unsupported(node, f"weight layout {a['kernel_layout']} with activation layout {lay}")
    if L.block_of(lay) and a["groups"] > 1 and node.inputs[1].shape[1] != 1:
        _unsupported(node, "a grouped (not depthwise) convolution in a blocked layout")
    return te_ops.conv2d(ins[0], ins[1], lay, a["strides"][0], tuple(a["pads"]), a["dilations"][0], a["groups"],
                         name=name)


def _conv_flops(node):
    lay = node.attrs.get("layout", "NCHW")
    _, cg, r, s = _oihw_shape(node.inputs[1].shape, node.attrs.get("kernel_layout", kernel_layout(lay)))
    return 2.0 * _elements(node) * cg * r * s


# ---------------------------------------------------------------- dense and broadcast

def _dense_infer(node):
    x, w = node.inputs[:2]
    if len(x.shape) != 2 or len(w.shape) != 2 or x.shape[1] != w.shape[1]:
        raise GraphError(f"dense {node.name}: cannot multiply {list(x.shape)} by weight {list(w.shape)}")
    return (x.shape[0], w.shape[0]), "float32", ""


def _binary_infer(node):
    shape, lay = _broadcast(node)
    return shape, node.inputs[0].dtype, lay


def _binary_def(op: str) -> "OpDef":
    np_fn = te_ops.BINARY_FNS[op][1]
    return OpDef(op, BROADCAST, _binary_infer,
                 lambda node, args: _f32(np_fn(args[0].astype(np.float64), args[1].astype(np.float64))),
                 lambda node, ins, name: te_ops.broadcast_binary(op, ins[0], ins[1], name))


# ---------------------------------------------------------------- activations (te.ops.ACTIVATIONS)

# activation parameter -> (node attribute, value when the attribute is absent), as ONNX defines them
_ACT_ATTRS = {"clip": {"lo": ("min", -np.inf), "hi": ("max", np.inf)},
              "hard_sigmoid": {"alpha": ("alpha", 0.2), "beta": ("beta", 0.5)}}


def act_params(node: Node) -> dict:
    """The te.ops.ACTIVATIONS parameters of an activation node (clip's min/max are lo/hi there)."""
    return {p: float(node.attrs.get(attr, dflt)) for p, (attr, dflt) in _ACT_ATTRS.get(node.op, {}).items()}


def _act_def(op: str) -> "OpDef":
    return OpDef(op, ELEMWISE, _same,
                 lambda node, args: _f32(te_ops.activation_ref(args[0], op, act_params(node))),
                 lambda node, ins, name: te_ops.activation(ins[0], op, act_params(node), name))


# ---------------------------------------------------------------- batch_norm

def _bn_eval(node, args):
    lay = node.attrs.get("layout", "NCHW")
    scale, bias, mean, var = (v.astype(np.float64) for v in args[1:5])
    y = _to_nchw(args[0], lay).astype(np.float64)
    sh = (1, -1, 1, 1) if y.ndim == 4 else (1, -1)
    y = (y - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + node.attrs["epsilon"]) * scale.reshape(sh) + bias.reshape(sh)
    return _f32(_from_nchw(y, lay))


def _bn_te(node, ins, name):
    x = node.inputs[0]
    lay = node.attrs.get("layout", "NCHW")
    eps = float(node.attrs["epsilon"])
    data, scale, bias, mean, var = ins

    def channel(i):
        if len(i) == 2 or lay == "NCHW":
            return i[1]
        if lay == "NHWC":
            return i[3]
        return i[1] * Const(x.shape[4]) + i[4]

    def f(*i):
        c = channel(i)
        return (data[i] - mean[c]) / Call("sqrt", (var[c] + Const(eps),)) * scale[c] + bias[c]

    return compute(x.shape, f, name, tag="broadcast", inputs=[data, scale, bias, mean, var],
                   axis_names=[f"{name}_i{k}" for k in range(len(x.shape))])


# ---------------------------------------------------------------- pooling

def _pool_infer(node):
    shape, lay = _pool_out(node)
    return shape, node.inputs[0].dtype, lay


def _pool_eval(node, args):
    a = node.attrs
    lay = a.get("layout", "NCHW")
    y = te_ops.pool2d_ref(_to_nchw(args[0], lay), node.op[:3], tuple(a["kernel"]), a["strides"][0], tuple(a["pads"]),
                          bool(a.get("count_include_pad", 0)))
    return _f32(_from_nchw(y, lay))


def _pool_te(node, ins, name):
    a = node.attrs
    if a["strides"][0] != a["strides"][1]:
        _unsupported(node, "different strides per axis")
    return te_ops.pool2d(ins[0], a.get("layout", "NCHW"), node.op[:3], tuple(a["kernel"]), a["strides"][0],
                         tuple(a["pads"]), bool(a.get("count_include_pad", 0)), name=name)


def _pool_flops(node):
    return _elements(node) * node.attrs["kernel"][0] * node.attrs["kernel"][1]


def _gap_infer(node):
    x = node.inputs[0]
    lay = node.attrs.get("layout", "NCHW")
    n, c, h, w = nchw_dims(x.shape, lay)
    return _relayout(x.shape, lay, n, c, 1, 1), x.dtype, lay


def _gap_eval(node, args):
    lay = node.attrs.get("layout", "NCHW")
    return _f32(_from_nchw(_to_nchw(args[0], lay).astype(np.float64).mean(axis=(2, 3), keepdims=True), lay))


# ---------------------------------------------------------------- data movement and reductions

def _flatten_infer(node):
    x, ax = node.inputs[0], node.attrs["axis"]
    return (int(np.prod(x.shape[:ax], dtype=np.int64)), int(np.prod(x.shape[ax:], dtype=np.int64))), x.dtype, ""


def _reshape_infer(node):
    x, shape = node.inputs[0], node.attrs["shape"]
    if int(np.prod(shape)) != int(np.prod(x.shape)):
        raise GraphError(f"reshape {node.name}: cannot reshape {list(x.shape)} to {list(shape)}")
    return tuple(shape), x.dtype, ""


def _concat_infer(node):
    ins, ax = node.inputs, node.attrs["axis"]
    base = list(ins[0].shape)
    for v in ins[1:]:
        if len(v.shape) != len(base) or any(d != e for k, (d, e) in enumerate(zip(v.shape, base)) if k != ax):
            raise GraphError(f"concat {node.name}: shapes {[list(v.shape) for v in ins]} differ off axis {ax}")
    base[ax] = sum(v.shape[ax] for v in ins)
    return tuple(base), ins[0].dtype, ins[0].layout


def _pad_infer(node):
    x, p = node.inputs[0], node.attrs["pads"]
    nd = len(x.shape)
    return tuple(d + p[k] + p[k + nd] for k, d in enumerate(x.shape)), x.dtype, ""


def _pad_eval(node, args):
    x, p = args[0], node.attrs["pads"]
    nd = x.ndim
    return np.pad(x, [(p[k], p[k + nd]) for k in range(nd)], constant_values=node.attrs.get("value", 0.0))


def _pad_te(node, ins, name):
    if min(node.attrs["pads"]) < 0:
        _unsupported(node, "negative pads (cropping)")
    return te_ops.pad_nd(ins[0], list(node.attrs["pads"]), float(node.attrs.get("value", 0.0)), name)


def _mean_infer(node):
    x, a = node.inputs[0], node.attrs
    axes = [ax % len(x.shape) for ax in a["axes"]]
    if a.get("keepdims", 1):
        return tuple(1 if k in axes else d for k, d in enumerate(x.shape)), x.dtype, ""
    return tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype, ""


def _mean_eval(node, args):
    return _f32(args[0].astype(np.float64).mean(axis=tuple(node.attrs["axes"]),
                                                keepdims=bool(node.attrs.get("keepdims", 1))))


def _softmax_eval(node, args):
    xd = args[0].astype(np.float64)
    e = np.exp(xd - xd.max(axis=node.attrs["axis"], keepdims=True))
    return _f32(e / e.sum(axis=node.attrs["axis"], keepdims=True))


def _lt_infer(node):
    x, a = node.inputs[0], node.attrs
    n, c, h, w = nchw_dims(x.shape, a["src"])
    return L.act_shape(a["dst"], n, c, h, w), x.dtype, a["dst"]


def _lt_eval(node, args):
    return _from_nchw(_to_nchw(args[0], node.attrs["src"]), node.attrs["dst"]).astype(args[0].dtype)


# ---------------------------------------------------------------- the registry

@dataclass(frozen=True)
class OpDef:
    name: str
    pattern: int                      # fusion pattern (FuseOps)
    infer: Callable                   # node -> (shape, dtype, layout)
    evaluate: Callable                # (node, NumPy args) -> array (float32 math in float64)
    te: Callable                      # (node, input Tensors in the node's layouts, stage name) -> output Tensor
    flops: Callable = _elements       # node -> float


_DEFS = [
    OpDef("conv2d", OUT_EWISE_FUSABLE, _conv_infer, _conv_eval, _conv_te, _conv_flops),
    OpDef("dense", OUT_EWISE_FUSABLE, _dense_infer, lambda n, args: _f32(te_ops.dense_ref(args[0], args[1])),
          lambda n, ins, name: te_ops.dense(ins[0], ins[1], 0, name),
          lambda n: 2.0 * _elements(n) * n.inputs[0].shape[1]),
    *(_binary_def(op) for op in te_ops.BINARY_FNS),
    *(_act_def(op) for op in te_ops.ACTIVATIONS),
    OpDef("batch_norm", OPAQUE, _same, _bn_eval, _bn_te),
    OpDef("max_pool2d", OUT_EWISE_FUSABLE, _pool_infer, _pool_eval, _pool_te, _pool_flops),
    OpDef("avg_pool2d", OUT_EWISE_FUSABLE, _pool_infer, _pool_eval, _pool_te, _pool_flops),
    OpDef("global_avg_pool2d", OUT_EWISE_FUSABLE, _gap_infer, _gap_eval,
          lambda n, ins, name: te_ops.global_avg_pool(ins[0], n.attrs.get("layout", "NCHW"), name),
          lambda n: float(np.prod(n.inputs[0].shape))),
    OpDef("flatten", INJECTIVE, _flatten_infer, lambda n, args: args[0].reshape(n.output.shape),
          lambda n, ins, name: te_ops.reshape(ins[0], n.output.shape, name)),
    OpDef("reshape", INJECTIVE, _reshape_infer, lambda n, args: args[0].reshape(n.attrs["shape"]),
          lambda n, ins, name: te_ops.reshape(ins[0], n.output.shape, name)),
    OpDef("transpose", INJECTIVE,
          lambda n: (tuple(n.inputs[0].shape[p] for p in n.attrs["perm"]), n.inputs[0].dtype, ""),
          lambda n, args: np.ascontiguousarray(args[0].transpose(n.attrs["perm"])),
          lambda n, ins, name: te_ops.transpose(ins[0], tuple(n.attrs["perm"]), name)),
    OpDef("concat", INJECTIVE, _concat_infer, lambda n, args: np.concatenate(args, axis=n.attrs["axis"]),
          lambda n, ins, name: te_ops.concat(ins, n.attrs["axis"], name)),
    OpDef("pad", INJECTIVE, _pad_infer, _pad_eval, _pad_te),
    OpDef("layout_transform", INJECTIVE, _lt_infer, _lt_eval,
          lambda n, ins, name: te_ops.layout_transform(ins[0], n.attrs["src"], n.attrs["dst"], name)),
    OpDef("mean", COMM_REDUCE, _mean_infer, _mean_eval,
          lambda n, ins, name: te_ops.reduce_mean(ins[0], n.attrs["axes"], bool(n.attrs.get("keepdims", 1)), name)),
    OpDef("softmax", OPAQUE, _same, _softmax_eval, lambda n, ins, name: te_ops.softmax(ins[0], n.attrs["axis"], name),
          lambda n: 3.0 * _elements(n)),
]
OPS: dict = {d.name: d for d in _DEFS}

PATTERN = {name: d.pattern for name, d in OPS.items()}
UNARY = tuple(te_ops.ACTIVATIONS)
BINARY = tuple(te_ops.BINARY_FNS)


def opdef(node: Node) -> OpDef:
    d = OPS.get(node.op)
    if d is None:
        raise Unsupported(f"{node.op} node {node.name!r}: no such operator (operators: {', '.join(sorted(OPS))})")
    return d


def infer(node: Node) -> tuple:
    """(shape, dtype, layout) of the node's output."""
    if node.op not in OPS:
        raise GraphError(f"no shape rule for op {node.op!r}")
    return OPS[node.op].infer(node)


def evaluate(node: Node, args: list) -> np.ndarray:
    """The node's output for NumPy `args` (float32 in, float32 out; math in float64)."""
    if node.op not in OPS:
        raise GraphError(f"no evaluator for op {node.op!r}")
    return OPS[node.op].evaluate(node, args)


def to_te(node: Node, ins: list, name: str) -> Tensor:
    """The node as a tensor expression over `ins` (Tensors in its inputs' layouts); `name` (a C
    identifier, never a user-given name) prefixes every stage it makes."""
    return opdef(node).te(node, ins, name)


def flops(node: Node) -> float:
    return opdef(node).flops(node)
