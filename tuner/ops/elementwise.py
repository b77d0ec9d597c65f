"""Elementwise and broadcast operators: the activations (one table: ACTIVATIONS), the binary
arithmetic ops (BINARY_FNS), comparisons (COMPARISONS), isnan, not, where and cast, batch_norm,
and the epilogue a conv, dense or Winograd output kernel fuses (bias, residual, activation).

Boolean values (comparisons, isnan, masks) are bool in the IR and in NumPy; compiled kernels carry
them, like every tensor, as float32 (0 or 1)."""
from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from ..te.expr import Call, Cmp, Const, max_expr, min_expr, select
from ..te.tensor import Tensor, compute, placeholder
from .common import (broadcast_index, data_placeholder, export_as, f32, from_nchw, nchw_in, nchw_out, onnx_plain,
                     same, to_nchw, unary)
from .registry import OpDef, Pattern, WorkloadDef, register


def _clamp(e, lo: float, hi: float):
    return min_expr(max_expr(e, Const(float(lo))), Const(float(hi)))


# name -> (parameters with defaults, TE element formula, NumPy formula on float64)
ACTIVATIONS = {
    "relu": ({}, lambda e, p: max_expr(e, Const(0.0)), lambda x, p: np.maximum(x, 0.0)),
    "clip": ({"lo": 0.0, "hi": 6.0}, lambda e, p: _clamp(e, p["lo"], p["hi"]),
             lambda x, p: np.clip(x, p["lo"], p["hi"])),
    "sigmoid": ({}, lambda e, p: Call("sigmoid", (e,)),
                lambda x, p: 1.0 / (1.0 + np.exp(-x))),
    # x * sigmoid(x) (SiLU, swish): EfficientNet's, YOLO's and SwiGLU's activation, written as Sigmoid and Mul
    "silu": ({}, lambda e, p: e * Call("sigmoid", (e,)),
             lambda x, p: x / (1.0 + np.exp(-x))),
    "hard_sigmoid": ({"alpha": 0.2, "beta": 0.5}, lambda e, p: _clamp(Const(float(p["alpha"])) * e
                                                                      + Const(float(p["beta"])), 0.0, 1.0),
                     lambda x, p: np.clip(p["alpha"] * x + p["beta"], 0.0, 1.0)),
    "hard_swish": ({}, lambda e, p: e * _clamp(e * Const(1.0 / 6.0) + Const(0.5), 0.0, 1.0),
                   lambda x, p: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)),
    # YOLO's and GANs' activation: max(x, 0) + alpha min(x, 0), exact either side of 0
    "leaky_relu": ({"alpha": 0.01},
                   lambda e, p: max_expr(e, Const(0.0)) + Const(float(p["alpha"])) * min_expr(e, Const(0.0)),
                   lambda x, p: np.where(x >= 0, x, p["alpha"] * x)),
    # the pieces of GELU (erf and tanh forms) and of a decomposed LayerNorm
    "erf": ({}, lambda e, p: Call("erf", (e,)), lambda x, p: _erf(x)),
    "tanh": ({}, lambda e, p: Call("tanh", (e,)), lambda x, p: np.tanh(x)),
    "exp": ({}, lambda e, p: Call("exp", (e,)), lambda x, p: np.exp(x)),
    "sqrt": ({}, lambda e, p: Call("sqrt", (e,)), lambda x, p: np.sqrt(x)),
    "neg": ({}, lambda e, p: Const(-1.0) * e, lambda x, p: -x),
    "gelu": ({}, lambda e, p: e * Const(0.5) * (Const(1.0) + Call("erf", (e * Const(0.7071067811865476),))),
             lambda x, p: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))),
    # GPT-2's: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), ONNX Gelu(approximate="tanh")
    "gelu_tanh": ({}, lambda e, p: e * Const(0.5) * (Const(1.0) + Call("tanh", (
        (e + Const(0.044715) * e * e * e) * Const(0.7978845608028654),))),
        lambda x, p: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))),
    "pow": ({"exponent": 1.0}, lambda e, p: Call("pow", (e, Const(float(p["exponent"])))),
            lambda x, p: np.power(x, p["exponent"])),
    "abs": ({}, lambda e, p: _abs(e), lambda x, p: np.abs(x)),
    "log": ({}, lambda e, p: Call("log", (e,)), lambda x, p: np.log(x)),
    # log(1 + e^x) as max(x, 0) + log(1 + e^-|x|): no overflow; Mish (YOLOv4, CSPDarknet) is x tanh of it
    "softplus": ({}, lambda e, p: _softplus(e), lambda x, p: np.logaddexp(x, 0.0)),
    "mish": ({}, lambda e, p: _mish(e), lambda x, p: x * np.tanh(np.logaddexp(x, 0.0))),
    # max(x, 0) + alpha (e^min(x, 0) - 1), Selu's scaled by gamma, Celu's with x / alpha in the exponent
    "elu": ({"alpha": 1.0}, lambda e, p: _elu(e, p["alpha"], 1.0),
            lambda x, p: np.where(x > 0, x, p["alpha"] * np.expm1(np.minimum(x, 0.0)))),
    "selu": ({"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
             lambda e, p: Const(float(p["gamma"])) * _elu(e, p["alpha"], 1.0),
             lambda x, p: p["gamma"] * np.where(x > 0, x, p["alpha"] * np.expm1(np.minimum(x, 0.0)))),
    "celu": ({"alpha": 1.0}, lambda e, p: _elu(e, p["alpha"], 1.0 / p["alpha"]),
             lambda x, p: np.where(x > 0, x, p["alpha"] * np.expm1(np.minimum(x, 0.0) / p["alpha"]))),
    "softsign": ({}, lambda e, p: e / (Const(1.0) + _abs(e)), lambda x, p: x / (1.0 + np.abs(x))),
    # an oriented box's corners (YOLO OBB), sinusoidal position codes computed on the fly (RT-DETR)
    "sin": ({}, lambda e, p: Call("sin", (e,)), lambda x, p: np.sin(x)),
    "cos": ({}, lambda e, p: Call("cos", (e,)), lambda x, p: np.cos(x)),
}


def _abs(e):
    return max_expr(e, Const(-1.0) * e)


def _softplus(e):
    return max_expr(e, Const(0.0)) + Call("log", (Const(1.0) + Call("exp", (Const(-1.0) * _abs(e),)),))


def _mish(e):
    """x tanh(log(1 + e^x)) = x n / (n + 2), n = e^x (e^x + 2): one vector exp and no log; past
    x = 20 the fraction is 1 in float32 (and e^x would overflow n)."""
    u = Call("exp", (min_expr(e, Const(20.0)),))
    n = u * (u + Const(2.0))
    return e * n / (n + Const(2.0))


def _elu(e, alpha: float, inner: float):
    neg = min_expr(e, Const(0.0))
    return max_expr(e, Const(0.0)) + Const(float(alpha)) * (
        Call("exp", (neg * Const(float(inner)) if inner != 1.0 else neg,)) - Const(1.0))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def elementwise_map(x: Tensor, fn, name: str) -> Tensor:
    """fn of every element of x."""
    return compute(x.shape, lambda *i: fn(x[i]), name, tag="elemwise", inputs=[x],
                   axis_names=[f"{name}_i{k}" for k in range(x.ndim)])


def activation(x: Tensor, kind: str, params: dict | None = None, name: str | None = None) -> Tensor:
    _, fn, _ = ACTIVATIONS[kind]
    p = {**ACTIVATIONS[kind][0], **(params or {})}
    return elementwise_map(x, lambda e: fn(e, p), name or kind)


def activation_ref(x: np.ndarray, kind: str, params: dict | None = None) -> np.ndarray:
    p = {**ACTIVATIONS[kind][0], **(params or {})}
    return ACTIVATIONS[kind][2](x.astype(np.float64), p)


def relu(x: Tensor, name: str = "relu") -> Tensor:
    return activation(x, "relu", name=name)


def add(a: Tensor, b: Tensor, name: str = "add") -> Tensor:
    return _binary(a, b, lambda u, v: u + v, name)


def _binary(a: Tensor, b: Tensor, fn, name: str) -> Tensor:
    """NumPy-style broadcast of `b` against `a` (b's dims align to a's trailing dims)."""
    if b.ndim > a.ndim:
        raise ValueError(f"{name}: cannot broadcast {list(b.shape)} onto {list(a.shape)}")
    off = a.ndim - b.ndim
    for k, e in enumerate(b.shape):
        if e not in (1, a.shape[off + k]):
            raise ValueError(f"{name}: cannot broadcast {list(b.shape)} onto {list(a.shape)}")

    def f(*i):
        bi = tuple(0 if b.shape[k] == 1 else i[off + k] for k in range(b.ndim))
        return fn(a[i], b[bi])

    tag = "elemwise" if b.shape == a.shape else "broadcast"
    return compute(a.shape, f, name, tag=tag, inputs=[a, b], axis_names=[f"{name}_i{k}" for k in range(a.ndim)])


BINARY_FNS = {"add": (lambda u, v: u + v, np.add), "sub": (lambda u, v: u - v, np.subtract),
              "mul": (lambda u, v: u * v, np.multiply), "div": (lambda u, v: u / v, np.divide)}


def broadcast_te(ins: list, fn, name: str) -> Tensor:
    """fn of the elements of `ins` under NumPy broadcasting (trailing dims aligned, in every direction)."""
    shape = tuple(np.broadcast_shapes(*(t.shape for t in ins)))
    tag = "elemwise" if all(t.shape == shape for t in ins) else "broadcast"
    return compute(shape, lambda *i: fn(*(t[broadcast_index(t.shape, shape, i)] for t in ins)), name, tag=tag,
                   inputs=list(ins), axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def broadcast_binary(kind: str, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
    return broadcast_te([a, b], BINARY_FNS[kind][0], name or kind)


def channel_bias_shape(layout: str, k: int, block: int = 0) -> tuple:
    """Shape of a per-output-channel vector broadcast against an activation in `layout`."""
    if layout == "NCHW":
        return (k, 1, 1)
    if layout == "NHWC":
        return (k,)
    return (k // block, 1, 1, block)


def _broadcast(node):
    try:
        shape = np.broadcast_shapes(*(v.shape for v in node.inputs))
    except ValueError:
        raise GraphError(f"{node.op} {node.name}: shapes {' and '.join(str(list(v.shape)) for v in node.inputs)} "
                         "do not broadcast") from None
    act = [v for v in node.inputs if not v.is_const and v.shape == shape]
    return tuple(shape), (act[0].layout if act else node.inputs[0].layout)


def _binary_infer(node):
    shape, lay = _broadcast(node)
    return shape, node.inputs[0].dtype, lay


# activation -> (its ONNX op type, {ops.elementwise.ACTIVATIONS parameter: (node attribute, value when the
# attribute is absent)}); node attributes are named and defaulted as ONNX's. None: imported through
# another's (gelu_tanh is ONNX Gelu with approximate="tanh"), or by a pattern (silu: FuseTransformerOps)
_ACTS = {"relu": ("Relu", {}), "sigmoid": ("Sigmoid", {}), "hard_swish": ("HardSwish", {}),
         **{op: (op.capitalize(), {}) for op in ("erf", "tanh", "exp", "sqrt", "neg")},
         "pow": ("Pow", {"exponent": ("exponent", 1.0)}), "gelu": ("Gelu", {}), "gelu_tanh": (None, {}),
         "silu": (None, {}),
         "clip": ("Clip", {"lo": ("min", -np.inf), "hi": ("max", np.inf)}),
         "hard_sigmoid": ("HardSigmoid", {"alpha": ("alpha", 0.2), "beta": ("beta", 0.5)}),
         "leaky_relu": ("LeakyRelu", {"alpha": ("alpha", 0.01)}),
         **{op: (op.capitalize(), {}) for op in ("abs", "log", "softplus", "mish", "softsign", "sin", "cos")},
         "elu": ("Elu", {"alpha": ("alpha", 1.0)}), "celu": ("Celu", {"alpha": ("alpha", 1.0)}),
         "selu": ("Selu", {"alpha": ("alpha", 1.67326319217681884765625),
                           "gamma": ("gamma", 1.05070102214813232421875)})}


def _act_attrs(op: str, given: dict) -> dict:
    """An activation's node attributes, from `given` (ONNX or node attributes) or their defaults."""
    return {attr: given.get(attr, dflt) for attr, dflt in _ACTS[op][1].values()}


def act_params(node) -> dict:
    """The ops.elementwise.ACTIVATIONS parameters of an activation node (clip's min/max are lo/hi there)."""
    return {p: float(node.attrs.get(attr, dflt)) for p, (attr, dflt) in _ACTS[node.op][1].items()}


def _bn_eval(node, args):
    lay = node.attrs.get("layout", "NCHW")
    scale, bias, mean, var = (v.astype(np.float64) for v in args[1:5])
    y = to_nchw(args[0], lay).astype(np.float64)
    sh = (1, -1) + (1,) * (y.ndim - 2)           # channels on axis 1, of any rank
    y = (y - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + node.attrs["epsilon"]) * scale.reshape(sh) + bias.reshape(sh)
    return f32(from_nchw(y, lay))


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


def _onnx_clip(cx, ins, a):
    lo, hi = a.get("min", -np.inf), a.get("max", np.inf)
    if len(ins) > 1 and ins[1] is not None:
        lo = cx.scalar(cx.const(ins[1], "min"), "min")
    if len(ins) > 2 and ins[2] is not None:
        hi = cx.scalar(cx.const(ins[2], "max"), "max")
    return [cx.add("clip", ins[:1], {"min": float(lo), "max": float(hi)})]


def _onnx_max_min(cx, ins, a):
    """Max or Min of an activation and one constant scalar (torch's clamp_min and clamp_max, as in
    F.normalize) is a clip; of anything else (two activations, a constant tensor: T5's relative
    position buckets), a chain of maximum or minimum, broadcasting."""
    ins = [v for v in ins if v is not None]
    acts = [v for v in ins if not v.is_const]
    kind = "maximum" if cx.op_type == "Max" else "minimum"
    if len(ins) == 1:
        return ins
    consts = [v for v in ins if v.is_const]
    if len(ins) == 2 and len(consts) == 1 and np.size(consts[0].data) == 1:
        bound = float(np.asarray(consts[0].data).reshape(-1)[0])
        return [cx.add("clip", acts, {"min": bound, "max": np.inf} if kind == "maximum" else {"min": -np.inf, "max": bound})]
    if len({v.dtype for v in ins}) != 1:
        raise cx.fail(f"operands are {' and '.join(sorted({v.dtype for v in ins}))}; {cx.op_type} takes one type")
    out = ins[0]
    for k, v in enumerate(ins[1:]):
        out = cx.add(kind, [out, v], {}, "" if k == len(ins) - 2 else f"_{kind}{k}")
    return [out]


def _onnx_sum(cx, ins, a):
    """Sum of any number of inputs (variadic, broadcasting): a chain of adds in input order."""
    total = ins[0]
    for k, v in enumerate(ins[1:]):
        total = cx.add("add", [total, v], {}, "" if k == len(ins) - 2 else f"_sum{k}")
    return [total]


def _onnx_expand(cx, ins, a):
    """Expand of an activation (F.normalize's expand_as) broadcast as an add of zeros shaped only
    along the axes it grows, so that the constant stays small (of a boolean, an or of False)."""
    x = ins[0]
    shape = [int(d) for d in cx.const(ins[1], "the shape")]
    try:
        out = np.broadcast_shapes(tuple(x.shape), tuple(shape))
    except ValueError:
        raise cx.fail(f"cannot broadcast {list(x.shape)} to {shape}") from None
    if tuple(out) == tuple(x.shape):
        return [x]
    if x.dtype not in ("float32", "int64", "int32", "bool"):
        raise cx.fail(f"an Expand of a {x.dtype} activation is not supported")
    have = (1,) * (len(out) - len(x.shape)) + tuple(x.shape)
    zeros = np.zeros([d if h == 1 else 1 for d, h in zip(out, have)], x.dtype)     # integers stay integers
    return [cx.add("or" if x.dtype == "bool" else "add", [x, cx.constant(zeros, "_zeros")], {})]   # a mask: or False


def _onnx_tile(cx, ins, a):
    """Tile of an activation by constant repeats: each axis split in two, the repeats broadcast in
    by an add of zeros ([d] -> [1, d] + zeros [r, 1] -> [r*d]), as Expand is."""
    x = ins[0]
    reps = [int(r) for r in np.asarray(cx.const(ins[1], "the repeats")).reshape(-1)]
    if len(reps) != len(x.shape) or any(r < 1 for r in reps):
        raise cx.fail(f"repeats {reps} must be one positive count per axis of {list(x.shape)}")
    if all(r == 1 for r in reps):
        return [x]
    if x.dtype != "float32":
        raise cx.fail(f"a Tile of a {x.dtype} activation is not supported")
    split = cx.add("reshape", [x], {"shape": [v for d in x.shape for v in (1, d)]}, "_split")
    zeros = np.zeros([v for r in reps for v in (r, 1)], np.float32)
    grown = cx.add("add", [split, cx.constant(zeros, "_zeros")], {}, "_grown")
    return [cx.add("reshape", [grown], {"shape": [r * d for r, d in zip(reps, x.shape)]})]


def _onnx_reciprocal(cx, ins, a):
    return [cx.add("div", [cx.constant(np.ones(1, np.float32), "_one"), ins[0]], {})]


def _onnx_pow(cx, ins, a):
    """Pow by a constant exponent: x*x for 2 and x*x*x for 3 (as ONNX Runtime computes them, and the
    form the LayerNorm and GELU rewrites look for), sqrt for 0.5, else powf."""
    x = ins[0]
    e = cx.scalar(cx.const(ins[1], "the exponent"), "the exponent")
    if e == 1.0:
        return [x]
    if e == 0.5:
        return [cx.add("sqrt", [x], {})]
    if e in (2.0, 3.0):
        sq = cx.add("mul", [x, x], {}, "_sq" if e == 3.0 else "")
        return [cx.add("mul", [sq, x], {}) if e == 3.0 else sq]
    return [cx.add("pow", [x], {"exponent": e})]


def _onnx_act(op: str):
    """Importer of a one-input activation whose ONNX attributes are named as ours (_ACTS)."""
    return lambda cx, ins, a: [cx.add(op, ins[:1], _act_attrs(op, a))]


def _onnx_prelu(cx, ins, a):
    """PRelu (ENet, ESPNet, face recognition ResNets): max(x, 0) + slope min(x, 0), min(x, 0) as
    x - relu(x); a slope of one value is LeakyRelu's alpha."""
    x = ins[0]
    slope = np.asarray(cx.const(ins[1], "the slope"), np.float32)
    if slope.size == 1:
        return [cx.add("leaky_relu", [x], {"alpha": float(slope.reshape(-1)[0])})]
    if slope.ndim > len(x.shape) or any(d not in (1, e) for d, e in zip(slope.shape[::-1], x.shape[::-1])):
        raise cx.fail(f"the slope's shape {list(slope.shape)} does not broadcast to the input's {list(x.shape)}")
    pos = cx.add("relu", [x], {}, "_pos")
    neg = cx.add("mul", [cx.add("sub", [x, pos], {}, "_neg"), cx.constant(slope, "_slope")], {}, "_scaled")
    return [cx.add("add", [pos, neg], {})]


def _onnx_bn(cx, ins, a):
    for k, what in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")):
        cx.const(ins[k], what)
    return [cx.add("batch_norm", ins[:5], {"epsilon": a.get("epsilon", 1e-5), "layout": "NCHW"})]


def _onnx_gelu(cx, ins, a):
    approx = a.get("approximate", "none")
    if approx not in ("none", "tanh"):
        raise cx.fail(f"approximate={approx!r} is not a GELU form (none or tanh)")
    return [cx.add("gelu" if approx == "none" else "gelu_tanh", ins[:1], {})]


def _export_gelu(ex, n, ins):
    """x * 0.5 * (1 + erf(x / sqrt 2)), or with tanh(sqrt(2 / pi) (x + 0.044715 x^3)) for erf(x /
    sqrt 2) (gelu_tanh): Gelu itself is opset 20."""
    x, name = ins[0], n.name
    if n.op == "gelu":
        inner = ex.node("Erf", [ex.node("Mul", [x, ex.scalar(f"{name}_r2", 0.7071067811865476)], f"{name}_z")],
                        f"{name}_erf")
    else:
        cube = ex.node("Mul", [ex.node("Mul", [x, x], f"{name}_x2"), x], f"{name}_x3")
        z = ex.node("Add", [x, ex.node("Mul", [cube, ex.scalar(f"{name}_c", 0.044715)], f"{name}_cx3")], f"{name}_s")
        inner = ex.node("Tanh", [ex.node("Mul", [z, ex.scalar(f"{name}_k", 0.7978845608028654)], f"{name}_z")],
                        f"{name}_tanh")
    half = ex.node("Mul", [x, ex.scalar(f"{name}_half", 0.5)], f"{name}_halfx")
    ex.emit(n, "Mul", [half, ex.node("Add", [inner, ex.scalar(f"{name}_one", 1.0)], f"{name}_1p")])


def _export_silu(ex, n, ins):
    """x * sigmoid(x), as exporters write SiLU (ONNX has no op for it before opset 24)."""
    ex.emit(n, "Mul", [ins[0], ex.node("Sigmoid", [ins[0]], f"{n.name}_sigmoid")])


def _export_pow(ex, n, ins):
    ex.emit(n, "Pow", ins + [ex.scalar(f"{n.name}_exponent", n.attrs["exponent"])])


def _export_clip(ex, n, ins):
    ex.emit(n, "Clip", ins + [ex.scalar(f"{n.name}_min", n.attrs["min"]), ex.scalar(f"{n.name}_max", n.attrs["max"])])


def epilogue(wl, inputs: list, out: Tensor, ob: int):
    """bias, residual, then relu or act=..., each an input and a stage when its parameter is set."""
    p = wl.p
    if p.get("bias"):
        shape = (p["K"],) if wl.op == "dense" else channel_bias_shape(wl.layout, p["K"], ob)
        bias = placeholder(shape, "bias")
        inputs.append(bias)
        out = add(out, bias, name="bias_add")
    if p.get("residual"):
        res = placeholder(out.shape, "residual")
        inputs.append(res)
        out = add(out, res, name="residual_add")
    if p.get("relu"):
        out = relu(out)
    if p.get("act"):
        out = activation(out, p["act"], p, name=p["act"])
    return inputs, out


def epilogue_ref(p: dict, y: np.ndarray) -> np.ndarray:
    if p.get("relu"):
        y = activation_ref(y, "relu")
    if p.get("act"):
        y = activation_ref(y, p["act"], p)
    return y


def _add_build(wl):
    data = data_placeholder(wl)
    other = placeholder(data.shape, "other")
    return [data, other], add(data, other)


def _binary_def(op: str) -> OpDef:
    np_fn = BINARY_FNS[op][1]
    onnx_type = op.capitalize()          # Add, Sub, Mul, Div
    return OpDef(name=op, pattern=Pattern.BROADCAST, infer=_binary_infer, integers=op != "div",
                 evaluate=lambda node, args: f32(np_fn(args[0].astype(np.float64), args[1].astype(np.float64))),
                 te=lambda node, ins, name: broadcast_binary(op, ins[0], ins[1], name),
                 onnx_in={onnx_type: onnx_plain(op), **({"Expand": _onnx_expand, "Tile": _onnx_tile, "Sum": _onnx_sum} if op == "add" else {}),
                         **({"Div": _onnx_div, "Reciprocal": _onnx_reciprocal} if op == "div" else {})},
                 onnx_out=export_as(onnx_type))


def _act_def(op: str) -> OpDef:
    onnx_type = _ACTS[op][0]
    return OpDef(name=op, pattern=Pattern.ELEMWISE, infer=same, integers=op == "neg",
                 evaluate=lambda node, args: f32(activation_ref(args[0], op, act_params(node))),
                 te=lambda node, ins, name: activation(ins[0], op, act_params(node), name),
                 onnx_in={onnx_type: {"clip": _onnx_clip, "pow": _onnx_pow, "gelu": _onnx_gelu}.get(op, _onnx_act(op)),
                          **({"PRelu": _onnx_prelu} if op == "leaky_relu" else {})}
                 if onnx_type else {},
                 onnx_out={"clip": _export_clip, "pow": _export_pow, "gelu": _export_gelu,
                           "gelu_tanh": _export_gelu, "silu": _export_silu}.get(
                     op, export_as(onnx_type, lambda n: _act_attrs(op, n.attrs))))


def _act_workload(op: str) -> WorkloadDef:
    return WorkloadDef(name=op, required=("C", "H", "W"), defaults=dict(N=1, **ACTIVATIONS[op][0]),
                       build=unary(lambda d, wl: activation(d, op, wl.p)),
                       reference=lambda wl, a: nchw_out(wl, activation_ref(nchw_in(wl, a), op, wl.p)))


# ---------------------------------------------------------------- booleans: comparisons, isnan, not, where, cast

# name -> (ONNX op type, TE condition, NumPy function)
COMPARISONS = {"equal": ("Equal", lambda u, v: Cmp("==", u, v), np.equal),
               "less": ("Less", lambda u, v: u < v, np.less),
               "less_equal": ("LessOrEqual", lambda u, v: u <= v, np.less_equal),
               "greater": ("Greater", lambda u, v: u > v, np.greater),
               "greater_equal": ("GreaterOrEqual", lambda u, v: u >= v, np.greater_equal)}


# name -> (ONNX op type, TE formula on 0/1 floats, NumPy function)
LOGICAL = {"and": ("And", lambda u, v: u * v, np.logical_and),
           "or": ("Or", lambda u, v: max_expr(u, v), np.logical_or),
           "xor": ("Xor", lambda u, v: select(Cmp("==", u, v), Const(0.0), Const(1.0)), np.logical_xor)}


def _truth(e):
    """A boolean carried as float32 (0 or 1) -> a TE condition."""
    return Cmp("==", e, Const(0.0))


def _bool_infer(node):
    shape, lay = _broadcast(node)
    return shape, "bool", lay


def _bool_def(op: str, onnx_type: str, fn, np_fn) -> OpDef:
    """A binary op with a boolean result: `fn` gives it as 0 or 1 from the two float-carried operands."""
    return OpDef(name=op, pattern=Pattern.BROADCAST, infer=_bool_infer, integers=True,
                 evaluate=lambda n, args: np_fn(args[0], args[1]),
                 te=lambda n, ins, name: broadcast_te(ins, fn, name),
                 onnx_in={onnx_type: onnx_plain(op)}, onnx_out=export_as(onnx_type))


def _compare_def(op: str) -> OpDef:
    onnx_type, cond, np_fn = COMPARISONS[op]
    return _bool_def(op, onnx_type, lambda u, v: select(cond(u, v), Const(1.0), Const(0.0)), np_fn)


def _where_infer(node):
    c, x, y = node.inputs
    shape, lay = _broadcast(node)
    if c.dtype != "bool":
        raise GraphError(f"where {node.name}: the condition is {c.dtype}, not bool")
    return shape, x.dtype if x.dtype == y.dtype else "float32", lay


# ONNX Cast's `to` (TensorProto element types) -> NumPy dtype the IR names it by
_CAST_TYPES = {1: "float32", 9: "bool", 6: "int32", 7: "int64", 11: "float64"}


def _cast_te(node, ins, name):
    to = node.attrs["to"]
    if to == "bool":
        return elementwise_map(ins[0], lambda e: select(_truth(e), Const(0.0), Const(1.0)), name)
    if to.startswith("int"):
        return elementwise_map(ins[0], lambda e: Call("trunc", (e,)), name)
    return elementwise_map(ins[0], lambda e: e, name)


def _onnx_cast(cx, ins, a):
    to = _CAST_TYPES.get(a.get("to"))
    if to is None:
        raise cx.fail(f"a cast to ONNX element type {a.get('to')} is not supported (float, double, bool, int32 and int64 are)")
    return [cx.add("cast", ins[:1], {"to": to})]


def _mod_te(node, ins, name):
    """ONNX Mod: C's fmod (fmod=1: the dividend's sign), or with the divisor's sign (fmod=0, integers:
    Python's %), exact on integers carried as float32."""
    def f(a, b):
        r = Call("fmod", (a, b))
        if node.attrs["fmod"]:
            return r
        return select(r < Const(0.0), select(b > Const(0.0), r + b, r),
                      select(r > Const(0.0), select(b < Const(0.0), r + b, r), r))
    return broadcast_te(ins, f, name)


def _mod_eval(node, args):
    a, b = args
    if a.dtype.kind == "f":
        a, b = a.astype(np.float64), b.astype(np.float64)
    if a.dtype.kind != "f" and (b == 0).any():
        raise GraphError(f"mod {node.name}: an integer divisor is 0")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (np.fmod if node.attrs["fmod"] else np.mod)(a, b)
    return f32(y) if y.dtype.kind == "f" else y


def _onnx_mod(cx, ins, a):
    fmod = int(a.get("fmod", 0))
    if ins[0].dtype != ins[1].dtype:
        raise cx.fail(f"operands are {ins[0].dtype} and {ins[1].dtype}; Mod takes two of one type")
    if not fmod and not ins[0].dtype.startswith(("int", "uint")):
        raise cx.fail(f"fmod=0 on {ins[0].dtype} operands: ONNX takes it for integers only; export with fmod=1")
    return [cx.add("mod", ins[:2], {"fmod": fmod})]


def _onnx_div(cx, ins, a):
    """Div of two integer tensors divides with truncation (a detector's flat index // classes: its
    query); of floats, as float32."""
    ints = [v.dtype.startswith(("int", "uint")) for v in ins[:2]]
    if any(ints) and not all(ints):
        raise cx.fail(f"operands are {ins[0].dtype} and {ins[1].dtype}; Div takes two of one type")
    return [cx.add("int_div" if all(ints) else "div", ins[:2], {})]


def _int_div_eval(node, args):
    a, b = (x.astype(np.int64) for x in args)
    if (b == 0).any():
        raise GraphError(f"int_div {node.name}: an integer divisor is 0")
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(*args))


def _unary_te(fn):
    return lambda n, ins, name: elementwise_map(ins[0], fn, name)


register(
    *(_compare_def(op) for op in COMPARISONS),
    *(_bool_def(op, *LOGICAL[op]) for op in LOGICAL),
    # integers carried as float32 (below 2^24): the float quotient is rounded correctly, and no integer
    # quotient's neighbour is within half an ulp of it, so truncating it is exact
    OpDef(name="int_div", pattern=Pattern.BROADCAST, infer=_binary_infer, integers=True, evaluate=_int_div_eval,
          te=lambda n, ins, name: broadcast_te(ins, lambda a, b: Call("trunc", (a / b,)), name),
          onnx_in={}, onnx_out=export_as("Div")),
    *(OpDef(name=op, pattern=Pattern.BROADCAST, infer=_binary_infer, integers=True,
            evaluate=lambda n, args, fn=fn: fn(*args).astype(np.result_type(*args)),
            te=lambda n, ins, name, te=te: broadcast_te(ins, te, name),
            onnx_in={onnx: _onnx_max_min}, onnx_out=export_as(onnx))
      for op, (onnx, te, fn) in {"maximum": ("Max", max_expr, np.maximum), "minimum": ("Min", min_expr, np.minimum)}.items()),
    OpDef(name="mod", pattern=Pattern.BROADCAST, infer=_binary_infer, integers=True, evaluate=_mod_eval,
          te=_mod_te, onnx_in={"Mod": _onnx_mod}, onnx_out=export_as("Mod", lambda n: {"fmod": n.attrs["fmod"]})),
    OpDef(name="isnan", pattern=Pattern.ELEMWISE, infer=lambda n: (n.inputs[0].shape, "bool", n.inputs[0].layout),
          evaluate=lambda n, args: np.isnan(args[0]),
          te=_unary_te(lambda e: select(Cmp("==", e, e), Const(0.0), Const(1.0))),
          onnx_in={"IsNaN": onnx_plain("isnan")}, onnx_out=export_as("IsNaN")),
    OpDef(name="not", pattern=Pattern.ELEMWISE, infer=lambda n: (n.inputs[0].shape, "bool", n.inputs[0].layout),
          evaluate=lambda n, args: np.logical_not(args[0]),
          te=_unary_te(lambda e: select(_truth(e), Const(1.0), Const(0.0))),
          onnx_in={"Not": onnx_plain("not")}, onnx_out=export_as("Not")),
    OpDef(name="where", pattern=Pattern.BROADCAST, infer=_where_infer, integers=True,
          evaluate=lambda n, args: np.where(args[0], args[1], args[2]),
          te=lambda n, ins, name: broadcast_te(ins, lambda c, x, y: select(_truth(c), y, x), name),
          onnx_in={"Where": onnx_plain("where")}, onnx_out=export_as("Where")),
    OpDef(name="cast", pattern=Pattern.ELEMWISE, integers=True, infer=lambda n: (n.inputs[0].shape, n.attrs["to"], n.inputs[0].layout),
          evaluate=lambda n, args: (np.trunc(args[0]) if n.attrs["to"].startswith("int") and args[0].dtype.kind == "f"
                                    else args[0]).astype(n.attrs["to"]),
          te=_cast_te, onnx_in={"Cast": _onnx_cast},
          onnx_out=export_as("Cast", lambda n: {"to": next(k for k, v in _CAST_TYPES.items() if v == n.attrs["to"])})),
)


register(
    *(_binary_def(op) for op in BINARY_FNS),
    *(_act_def(op) for op in ACTIVATIONS),
    OpDef(name="batch_norm", pattern=Pattern.OPAQUE, infer=same, evaluate=_bn_eval, te=_bn_te,
          onnx_in={"BatchNormalization": _onnx_bn},
          onnx_out=export_as("BatchNormalization", lambda n: {"epsilon": n.attrs["epsilon"]})),
    *(_act_workload(op) for op in ("relu", "sigmoid", "clip")),
    WorkloadDef(name="add", required=("C", "H", "W"), defaults=dict(N=1), build=_add_build,
                reference=lambda wl, a: nchw_out(wl, BINARY_FNS["add"][1](nchw_in(wl, a), nchw_in(wl, a[1:])))),
)
