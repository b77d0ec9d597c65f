"""Graph operators: one definition per operator, in one registry.

Each `OpDef` holds everything `tuner` knows about an operator: its fusion pattern, shape
inference, NumPy evaluation (the interpreter every pass is checked against, and the reference a
compiled model is checked against), its tensor expression (what `tuner compile` generates a
kernel from when no tuned workload covers the group), its FLOPs, its ONNX import (the ONNX op
types it is read from) and export, and, for an anchor operator, the kernel-side workload it
becomes as a tuning task (te.workloads.WORKLOADS holds that workload's spec parameters, compute,
reference and FLOPs, built on the same te.ops functions). Adding an operator is adding one `OpDef`
to OPS (and its tests); passes, the ONNX frontend and task extraction read the table, never an
if-chain of op names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..te import layouts as L
from ..te import ops as te_ops
from ..te import winograd as WG
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
    return te_ops.conv2d_flops(_elements(node), cg, r, s)


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
    onnx_type = op.capitalize()          # Add, Sub, Mul, Div
    return OpDef(op, BROADCAST, _binary_infer,
                 lambda node, args: _f32(np_fn(args[0].astype(np.float64), args[1].astype(np.float64))),
                 lambda node, ins, name: te_ops.broadcast_binary(op, ins[0], ins[1], name),
                 onnx_in={onnx_type: _onnx_plain(op)}, onnx_out=_export_as(onnx_type))


# ---------------------------------------------------------------- activations (te.ops.ACTIVATIONS)

# activation -> (its ONNX op type, {te.ops.ACTIVATIONS parameter: (node attribute, value when the
# attribute is absent)}); node attributes are named and defaulted as ONNX's
_ACTS = {"relu": ("Relu", {}), "sigmoid": ("Sigmoid", {}), "hard_swish": ("HardSwish", {}),
         "clip": ("Clip", {"lo": ("min", -np.inf), "hi": ("max", np.inf)}),
         "hard_sigmoid": ("HardSigmoid", {"alpha": ("alpha", 0.2), "beta": ("beta", 0.5)})}


def _act_attrs(op: str, given: dict) -> dict:
    """An activation's node attributes, from `given` (ONNX or node attributes) or their defaults."""
    return {attr: given.get(attr, dflt) for attr, dflt in _ACTS[op][1].values()}


def act_params(node: Node) -> dict:
    """The te.ops.ACTIVATIONS parameters of an activation node (clip's min/max are lo/hi there)."""
    return {p: float(node.attrs.get(attr, dflt)) for p, (attr, dflt) in _ACTS[node.op][1].items()}


def _act_def(op: str) -> "OpDef":
    onnx_type = _ACTS[op][0]
    return OpDef(op, ELEMWISE, _same,
                 lambda node, args: _f32(te_ops.activation_ref(args[0], op, act_params(node))),
                 lambda node, ins, name: te_ops.activation(ins[0], op, act_params(node), name),
                 onnx_in={onnx_type: _onnx_clip if op == "clip" else _onnx_act(op)},
                 onnx_out=_export_clip if op == "clip" else _export_as(onnx_type, lambda n: _act_attrs(op, n.attrs)))


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
    return te_ops.window_flops(_elements(node), *node.attrs["kernel"])


def _gap_infer(node):
    x = node.inputs[0]
    lay = node.attrs.get("layout", "NCHW")
    n, c, h, w = nchw_dims(x.shape, lay)
    return _relayout(x.shape, lay, n, c, 1, 1), x.dtype, lay


def _gap_eval(node, args):
    lay = node.attrs.get("layout", "NCHW")
    return _f32(_from_nchw(te_ops.global_avg_pool_ref(_to_nchw(args[0], lay)), lay))


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


# ---------------------------------------------------------------- ONNX import
#
# An importer is (cx, inputs, attributes) -> [output Values]; cx (onnx_frontend.Importer) carries
# the builder, the node's name and opset, and the checked readers of ONNX attributes whose errors
# name the node.

def _onnx_conv(cx, ins, a):
    x = ins[0]
    w = cx.const(ins[1], "the weight")
    if len(w.shape) != 4:
        raise cx.fail("only 2-D convolutions are supported")
    k, strides, dil = cx.window(a, list(w.shape[2:]))
    pads = cx.pads(a, x.shape[2:], k, strides, dil)
    y = cx.add("conv2d", [x, ins[1]], {"strides": strides, "pads": pads, "dilations": dil,
                                       "groups": a.get("group", 1), "layout": "NCHW", "kernel_layout": "OIHW"})
    if len(ins) > 2 and ins[2] is not None:
        bias = cx.const(ins[2], "the bias")
        y = cx.add("add", [y, cx.constant(bias.reshape(-1, 1, 1), "_bias")], {}, "_bias_add")
    return [y]


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


def _onnx_clip(cx, ins, a):
    lo, hi = a.get("min", -np.inf), a.get("max", np.inf)
    if len(ins) > 1 and ins[1] is not None:
        lo = cx.scalar(cx.const(ins[1], "min"), "min")
    if len(ins) > 2 and ins[2] is not None:
        hi = cx.scalar(cx.const(ins[2], "max"), "max")
    return [cx.add("clip", ins[:1], {"min": float(lo), "max": float(hi)})]


def _onnx_act(op: str):
    """Importer of a one-input activation whose ONNX attributes are named as ours (_ACTS)."""
    return lambda cx, ins, a: [cx.add(op, ins[:1], _act_attrs(op, a))]


def _onnx_bn(cx, ins, a):
    for k, what in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")):
        cx.const(ins[k], what)
    return [cx.add("batch_norm", ins[:5], {"epsilon": a.get("epsilon", 1e-5), "layout": "NCHW"})]


def _onnx_pool(cx, ins, a):
    x = ins[0]
    if len(x.shape) != 4:
        raise cx.fail("only 2-D pooling is supported")
    k, strides, dil = cx.window(a)
    if any(d != 1 for d in dil):
        raise cx.fail("dilated pooling is not supported")
    pads = cx.pads(a, x.shape[2:], k, strides, [1, 1])
    if a.get("ceil_mode", 0):
        for size, kk, st, lo, hi in zip(x.shape[2:], k, strides, pads[:2], pads[2:]):
            if (size + lo + hi - kk) % st:
                raise cx.fail("ceil_mode=1 changes the output size here; only ceil_mode=0 is supported")
    attrs = {"kernel": list(k), "strides": list(strides), "pads": pads, "layout": "NCHW"}
    if cx.op_type == "AveragePool":
        attrs["count_include_pad"] = a.get("count_include_pad", 0)
    return [cx.add("max_pool2d" if cx.op_type == "MaxPool" else "avg_pool2d", [x], attrs)]


def _onnx_reduce_mean(cx, ins, a):
    """ReduceMean over H and W of a 4-D tensor (how PyTorch writes global pooling) becomes
    global_avg_pool2d, so that layout conversion can carry it; other axes stay a mean."""
    x = ins[0]
    axes = a.get("axes")
    if axes is None and len(ins) > 1 and ins[1] is not None:
        axes = [int(v) for v in cx.const(ins[1], "axes")]
    axes = sorted(ax % len(x.shape) for ax in (axes if axes is not None else range(len(x.shape))))
    keep = a.get("keepdims", 1)
    if len(x.shape) == 4 and axes == [2, 3]:
        y = cx.add("global_avg_pool2d", [x], {"layout": "NCHW"})
        return [y if keep else cx.add("reshape", [y], {"shape": [x.shape[0], x.shape[1]]}, "_squeeze")]
    return [cx.add("mean", [x], {"axes": axes, "keepdims": keep})]


def _onnx_reshape(cx, ins, a):
    x = ins[0]
    out = [x.shape[k] if d == 0 and not a.get("allowzero", 0) else d
           for k, d in enumerate(int(v) for v in cx.const(ins[1], "the shape"))]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(x.shape)) // max(known, 1)
    return [cx.add("reshape", [x], {"shape": out})]


def _onnx_pad(cx, ins, a):
    x = ins[0]
    if a.get("mode", "constant") != "constant":
        raise cx.fail("only mode=constant is supported")
    pads = a.get("pads")
    if pads is None:
        pads = [int(v) for v in cx.const(ins[1], "pads")]
    value = 0.0
    if len(ins) > 2 and ins[2] is not None:
        value = cx.scalar(cx.const(ins[2], "constant_value"), "constant_value")
    if len(ins) > 3 and ins[3] is not None:
        axes = [int(v) % len(x.shape) for v in cx.const(ins[3], "axes")]
        full = [0] * (2 * len(x.shape))
        for k, ax in enumerate(axes):
            full[ax], full[ax + len(x.shape)] = pads[k], pads[k + len(axes)]
        pads = full
    return [cx.add("pad", [x], {"pads": pads, "value": value})]


def _onnx_softmax(cx, ins, a):
    x = ins[0]
    axis = a.get("axis", -1 if cx.opset >= 13 else 1) % len(x.shape)
    if cx.opset < 13 and axis != len(x.shape) - 1:
        raise cx.fail(f"opset {cx.opset} softmax over a non-last axis is not supported")
    return [cx.add("softmax", [x], {"axis": axis})]


def _onnx_plain(op: str, attrs=lambda ins, a: {}):
    """Importer of an ONNX op that maps to `op` on all its inputs with attributes `attrs(ins, a)`."""
    return lambda cx, ins, a: [cx.add(op, ins, attrs(ins, a))]


# ---------------------------------------------------------------- ONNX export
#
# An exporter is (ex, node, input names) -> None, emitting ONNX nodes through ex
# (onnx_frontend.Exporter).

def _export_dense(ex, n, ins):
    """dense followed by its only consumer, an add of a 1-D constant, is one Gemm with a bias."""
    users = ex.consumers(n.output)
    if len(users) == 1 and users[0].op == "add" and users[0].inputs[1].is_const and users[0].inputs[1].data.ndim == 1:
        ex.fold(users[0], n)
        ins = ins + [ex.ref(users[0].inputs[1])]
    ex.emit(n, "Gemm", ins, transB=1)


def _export_clip(ex, n, ins):
    ex.emit(n, "Clip", ins + [ex.scalar(f"{n.name}_min", n.attrs["min"]), ex.scalar(f"{n.name}_max", n.attrs["max"])])


def _export_as(op_type: str, attrs=lambda n: {}):
    """Exporter to one ONNX node of `op_type` with attributes `attrs(node)`."""
    return lambda ex, n, ins: ex.emit(n, op_type, ins, **attrs(n))


def _pool_attrs(n):
    a = n.attrs
    extra = {"count_include_pad": a.get("count_include_pad", 0)} if n.op == "avg_pool2d" else {}
    return {"kernel_shape": a["kernel"], "strides": a["strides"], "pads": a["pads"], **extra}


# ---------------------------------------------------------------- tuning tasks
#
# A task rule is node -> (workload parameters without the epilogue, workload layout); NoTask says
# why a node of that operator cannot be a task. Epilogue flags are added by extract_tasks.

class NoTask(Exception):
    """This node has no kernel-side workload; the message says why."""


def _pads_param(pads) -> object:
    pads = tuple(pads)
    return pads if len(set(pads)) > 1 else pads[0]


def _conv_task(n):
    a, lay = n.attrs, n.attrs.get("layout", "NCHW")
    if a["strides"][0] != a["strides"][1] or a["dilations"][0] != a["dilations"][1]:
        raise NoTask("conv2d with different strides or dilations per axis")
    nn, c, h, w = nchw_dims(n.inputs[0].shape, lay)
    k = nchw_dims(n.output.shape, lay)[1]
    wshape = n.inputs[1].shape
    r, s = (wshape[0], wshape[1]) if lay == "NHWC" else (wshape[2], wshape[3])
    # a blocked input read in its own block (a fused layout transform, convert_layout.fused_read);
    # make() leaves ib out of the key when it is the layout's own
    ib = dict(ib=n.inputs[0].shape[4]) if L.block_of(lay) and a["groups"] == 1 and len(n.inputs[0].shape) == 5 else {}
    return dict(N=nn, C=c, H=h, W=w, K=k, R=r, S=s, stride=a["strides"][0], pad=_pads_param(a["pads"]),
                dilation=a["dilations"][0], groups=a["groups"], **ib), lay


def _pool_task(n):
    a, lay = n.attrs, n.attrs.get("layout", "NCHW")
    if a["strides"][0] != a["strides"][1]:
        raise NoTask(f"{n.op} with different strides per axis")
    nn, c, h, w = nchw_dims(n.inputs[0].shape, lay)
    extra = {"count_include_pad": int(a.get("count_include_pad", 0))} if n.op == "avg_pool2d" else {}
    return dict(N=nn, C=c, H=h, W=w, R=a["kernel"][0], S=a["kernel"][1], stride=a["strides"][0],
                pad=_pads_param(a["pads"]), **extra), lay


def _gap_task(n):
    lay = n.attrs.get("layout", "NCHW")
    nn, c, h, w = nchw_dims(n.inputs[0].shape, lay)
    return dict(N=nn, C=c, H=h, W=w), lay


# ---------------------------------------------------------------- Winograd (te.winograd)
#
# A 3x3 stride-1 conv that the layout plan runs as Winograd F(m x m, 3 x 3) becomes three nodes
# (passes.convert_layout): winograd_input (activation -> V), winograd_gemm (V and the weight
# transformed at compile time -> M) and winograd_output (M -> activation, the conv's epilogue
# fused after it). Their attributes are the conv's: pad, m, the input's H and W, and the layout
# of the activations around them (NHWC, or NCHW[x]c read and written by the transforms directly).
# All three anchor a group of their own (out-elemwise-fusable: only elementwise consumers join,
# and only the output transform has them).

def _wino_attrs(node) -> tuple:
    a = node.attrs
    return a["pad"], a["m"], a["H"], a["W"]


def _wino_layout(node) -> str:
    return node.attrs.get("layout", "NHWC")


def _wino_v_infer(node):
    pad, m, h, w = _wino_attrs(node)
    x = node.inputs[0]
    if node.op == "winograd_input":
        n_, ch = nchw_dims(x.shape, _wino_layout(node))[:2]
    else:
        n_, ch = x.shape[2], node.inputs[1].shape[3]
    return WG.v_shape(n_, h, w, pad, m, ch), "float32", ""


def _wino_out_infer(node):
    pad, m, h, w = _wino_attrs(node)
    mm, lay = node.inputs[0], _wino_layout(node)
    return L.act_shape(lay, mm.shape[2], mm.shape[5], *WG.out_size(h, w, pad)), "float32", lay


def _wino_task(node):
    pad, m, h, w = _wino_attrs(node)
    params = dict(H=h, W=w, pad=pad, m=m)
    if node.op == "winograd_input":
        n_, c = nchw_dims(node.inputs[0].shape, _wino_layout(node))[:2]
        params.update(N=n_, C=c)
    elif node.op == "winograd_gemm":
        params.update(N=node.inputs[0].shape[2], C=node.inputs[0].shape[5], K=node.inputs[1].shape[3])
        return params, "NHWC"
    else:
        params.update(N=node.inputs[0].shape[2], K=node.inputs[0].shape[5])
    return params, _wino_layout(node)


def _wino_flops(node) -> float:
    from ..te.workloads import make
    params, lay = _wino_task(node)
    return make(node.op, params, lay).flops


def _wino_input_eval(node, args):
    x = args[0] if _wino_layout(node) == "NHWC" else L.act_to_nchw(args[0], _wino_layout(node)).transpose(0, 2, 3, 1)
    return _f32(WG.input_ref(x, node.attrs["pad"], node.attrs["m"]))


def _wino_output_eval(node, args):
    pad, m, h, w = _wino_attrs(node)
    y = WG.output_ref(args[0], *WG.out_size(h, w, pad), m)
    lay = _wino_layout(node)
    return _f32(y if lay == "NHWC" else L.act_from_nchw(y.transpose(0, 3, 1, 2), lay))


_WINO_DEFS = [
    ("winograd_input", OUT_EWISE_FUSABLE, _wino_v_infer, _wino_input_eval,
     lambda n, ins, name: WG.input_transform(ins[0], n.attrs["pad"], n.attrs["m"], name, _wino_layout(n))),
    ("winograd_gemm", OUT_EWISE_FUSABLE, _wino_v_infer, lambda n, args: _f32(WG.gemm_ref(args[0], args[1])),
     lambda n, ins, name: WG.batch_gemm(ins[0], ins[1], name)),
    ("winograd_output", OUT_EWISE_FUSABLE, _wino_out_infer, _wino_output_eval,
     lambda n, ins, name: WG.output_transform(ins[0], *WG.out_size(*_wino_attrs(n)[2:], n.attrs["pad"]),
                                              n.attrs["m"], name, _wino_layout(n))),
]


# ---------------------------------------------------------------- the registry

@dataclass(frozen=True)
class OpDef:
    name: str
    pattern: int                      # fusion pattern (FuseOps)
    infer: Callable                   # node -> (shape, dtype, layout)
    evaluate: Callable                # (node, NumPy args) -> array (float32 math in float64)
    te: Callable                      # (node, input Tensors in the node's layouts, stage name) -> output Tensor
    flops: Callable = _elements       # node -> float
    onnx_in: dict = field(default_factory=dict)   # ONNX op type -> importer (cx, ins, attrs) -> [Value]
    onnx_out: Callable | None = None  # exporter (ex, node, input names) -> None; None: not exported
    workload: str = ""                # te.workloads.WORKLOADS entry this op anchors as a tuning task
    task: Callable | None = None      # node -> (workload params, layout); raises NoTask


_DEFS = [
    OpDef("conv2d", OUT_EWISE_FUSABLE, _conv_infer, _conv_eval, _conv_te, _conv_flops, {"Conv": _onnx_conv},
          _export_as("Conv", lambda n: {"kernel_shape": list(n.inputs[1].shape[2:]), "strides": n.attrs["strides"],
                                        "pads": n.attrs["pads"], "dilations": n.attrs["dilations"],
                                        "group": n.attrs["groups"]}),
          "conv2d", _conv_task),
    OpDef("dense", OUT_EWISE_FUSABLE, _dense_infer, lambda n, args: _f32(te_ops.dense_ref(args[0], args[1])),
          lambda n, ins, name: te_ops.dense(ins[0], ins[1], 0, name),
          lambda n: te_ops.dense_flops(n.inputs[0].shape[0], n.inputs[0].shape[1], n.inputs[1].shape[0]),
          {"Gemm": _onnx_gemm, "MatMul": _onnx_matmul}, _export_dense,
          "dense", lambda n: (dict(N=n.inputs[0].shape[0], C=n.inputs[0].shape[1], K=n.inputs[1].shape[0]),
                              n.attrs.get("packing", L.DENSE_PACKING))),
    *(_binary_def(op) for op in te_ops.BINARY_FNS),
    *(_act_def(op) for op in te_ops.ACTIVATIONS),
    OpDef("batch_norm", OPAQUE, _same, _bn_eval, _bn_te, onnx_in={"BatchNormalization": _onnx_bn},
          onnx_out=_export_as("BatchNormalization", lambda n: {"epsilon": n.attrs["epsilon"]})),
    OpDef("max_pool2d", OUT_EWISE_FUSABLE, _pool_infer, _pool_eval, _pool_te, _pool_flops, {"MaxPool": _onnx_pool},
          _export_as("MaxPool", _pool_attrs), "maxpool", _pool_task),
    OpDef("avg_pool2d", OUT_EWISE_FUSABLE, _pool_infer, _pool_eval, _pool_te, _pool_flops,
          {"AveragePool": _onnx_pool}, _export_as("AveragePool", _pool_attrs), "avgpool", _pool_task),
    OpDef("global_avg_pool2d", OUT_EWISE_FUSABLE, _gap_infer, _gap_eval,
          lambda n, ins, name: te_ops.global_avg_pool(ins[0], n.attrs.get("layout", "NCHW"), name),
          lambda n: float(np.prod(n.inputs[0].shape)),
          {"GlobalAveragePool": _onnx_plain("global_avg_pool2d", lambda ins, a: {"layout": "NCHW"})},
          _export_as("GlobalAveragePool"), "globalavgpool", _gap_task),
    OpDef("flatten", INJECTIVE, _flatten_infer, lambda n, args: args[0].reshape(n.output.shape),
          lambda n, ins, name: te_ops.reshape(ins[0], n.output.shape, name),
          onnx_in={"Flatten": _onnx_plain("flatten", lambda ins, a: {"axis": a.get("axis", 1) % max(1, len(ins[0].shape))})},
          onnx_out=_export_as("Flatten", lambda n: {"axis": n.attrs["axis"]})),
    OpDef("reshape", INJECTIVE, _reshape_infer, lambda n, args: args[0].reshape(n.attrs["shape"]),
          lambda n, ins, name: te_ops.reshape(ins[0], n.output.shape, name), onnx_in={"Reshape": _onnx_reshape},
          onnx_out=lambda ex, n, ins: ex.emit(n, "Reshape", ins + [ex.tensor(f"{n.name}_shape", n.attrs["shape"])])),
    OpDef("transpose", INJECTIVE,
          lambda n: (tuple(n.inputs[0].shape[p] for p in n.attrs["perm"]), n.inputs[0].dtype, ""),
          lambda n, args: np.ascontiguousarray(args[0].transpose(n.attrs["perm"])),
          lambda n, ins, name: te_ops.transpose(ins[0], tuple(n.attrs["perm"]), name),
          onnx_in={"Transpose": _onnx_plain("transpose", lambda ins, a: {
              "perm": a.get("perm", list(range(len(ins[0].shape)))[::-1])})},
          onnx_out=_export_as("Transpose", lambda n: {"perm": n.attrs["perm"]})),
    OpDef("concat", INJECTIVE, _concat_infer, lambda n, args: np.concatenate(args, axis=n.attrs["axis"]),
          lambda n, ins, name: te_ops.concat(ins, n.attrs["axis"], name),
          onnx_in={"Concat": _onnx_plain("concat", lambda ins, a: {"axis": a["axis"] % len(ins[0].shape)})},
          onnx_out=_export_as("Concat", lambda n: {"axis": n.attrs["axis"]})),
    OpDef("pad", INJECTIVE, _pad_infer, _pad_eval, _pad_te, onnx_in={"Pad": _onnx_pad}),
    *(OpDef(name, pattern, infer, ev, te, _wino_flops, workload=name, task=_wino_task)
      for name, pattern, infer, ev, te in _WINO_DEFS),
    OpDef("layout_transform", INJECTIVE, _lt_infer, _lt_eval,
          lambda n, ins, name: te_ops.layout_transform(ins[0], n.attrs["src"], n.attrs["dst"], name)),
    OpDef("mean", COMM_REDUCE, _mean_infer, _mean_eval,
          lambda n, ins, name: te_ops.reduce_mean(ins[0], n.attrs["axes"], bool(n.attrs.get("keepdims", 1)), name),
          onnx_in={"ReduceMean": _onnx_reduce_mean}),
    OpDef("softmax", OPAQUE, _same, _softmax_eval, lambda n, ins, name: te_ops.softmax(ins[0], n.attrs["axis"], name),
          lambda n: 3.0 * _elements(n), {"Softmax": _onnx_softmax},
          _export_as("Softmax", lambda n: {"axis": n.attrs["axis"]})),
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
