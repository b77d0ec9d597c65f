"""Data movement: flatten, reshape, transpose, concat and pad (injective: fused into their consumers)."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..te.expr import Const, all_of, select
from ..te.tensor import Tensor, compute
from .common import export_as, onnx_plain, unsupported
from .registry import OpDef, Pattern, register


def _unflatten(flat, shape: tuple) -> tuple:
    idx = []
    for k in range(len(shape) - 1, -1, -1):
        idx.append(flat % shape[k] if k else flat)
        flat = flat // shape[k]
    return tuple(reversed(idx))


def reshape(x: Tensor, shape: tuple, name: str = "reshape") -> Tensor:
    """Row-major reshape: element i of the output is element i of the input."""
    shape = tuple(int(d) for d in shape)

    def f(*i):
        flat = Const(0)
        for idx, ext in zip(i, shape):
            flat = flat * Const(ext) + idx
        return x[_unflatten(flat, x.shape)]

    return compute(shape, f, name, inputs=[x], axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def transpose(x: Tensor, perm: tuple, name: str = "transpose") -> Tensor:
    shape = tuple(x.shape[p] for p in perm)

    def f(*i):
        src = [None] * len(perm)
        for k, p in enumerate(perm):
            src[p] = i[k]
        return x[tuple(src)]

    return compute(shape, f, name, inputs=[x], axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def concat(xs: list, axis: int, name: str = "concat") -> Tensor:
    shape = list(xs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in xs)

    def f(*i):
        starts, s = [], 0
        for t in xs:
            starts.append(s)
            s += t.shape[axis]
        value = None
        for t, start in reversed(list(zip(xs, starts))):
            src = list(i)
            src[axis] = i[axis] - start
            load = t[tuple(src)]
            value = load if value is None else select(i[axis] < start + t.shape[axis], load, value)
        return value

    return compute(shape, f, name, inputs=list(xs), axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def pad_nd(x: Tensor, pads: list, value: float = 0.0, name: str = "pad") -> Tensor:
    """ONNX-style constant pad: pads = [begin_0, ..., begin_n-1, end_0, ..., end_n-1]."""
    nd = x.ndim
    shape = [d + pads[k] + pads[k + nd] for k, d in enumerate(x.shape)]

    def f(*i):
        src = tuple(i[k] - pads[k] for k in range(nd))
        conds = [c for k in range(nd) if pads[k] or pads[k + nd]
                 for c in (i[k] >= pads[k], i[k] < pads[k] + x.shape[k])]
        return select(all_of(*conds), x[src], Const(float(value))) if conds else x[src]

    return compute(shape, f, name, tag="pad", inputs=[x], axis_names=[f"{name}_i{k}" for k in range(nd)])


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
        unsupported(node, "negative pads (cropping)")
    return pad_nd(ins[0], list(node.attrs["pads"]), float(node.attrs.get("value", 0.0)), name)


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


register(
    OpDef(name="flatten", pattern=Pattern.INJECTIVE, infer=_flatten_infer,
          evaluate=lambda n, args: args[0].reshape(n.output.shape),
          te=lambda n, ins, name: reshape(ins[0], n.output.shape, name),
          onnx_in={"Flatten": onnx_plain("flatten", lambda ins, a: {"axis": a.get("axis", 1) % max(1, len(ins[0].shape))})},
          onnx_out=export_as("Flatten", lambda n: {"axis": n.attrs["axis"]})),
    OpDef(name="reshape", pattern=Pattern.INJECTIVE, infer=_reshape_infer,
          evaluate=lambda n, args: args[0].reshape(n.attrs["shape"]),
          te=lambda n, ins, name: reshape(ins[0], n.output.shape, name), onnx_in={"Reshape": _onnx_reshape},
          onnx_out=lambda ex, n, ins: ex.emit(n, "Reshape", ins + [ex.tensor(f"{n.name}_shape", n.attrs["shape"])])),
    OpDef(name="transpose", pattern=Pattern.INJECTIVE,
          infer=lambda n: (tuple(n.inputs[0].shape[p] for p in n.attrs["perm"]), n.inputs[0].dtype, ""),
          evaluate=lambda n, args: np.ascontiguousarray(args[0].transpose(n.attrs["perm"])),
          te=lambda n, ins, name: transpose(ins[0], tuple(n.attrs["perm"]), name),
          onnx_in={"Transpose": onnx_plain("transpose", lambda ins, a: {
              "perm": a.get("perm", list(range(len(ins[0].shape)))[::-1])})},
          onnx_out=export_as("Transpose", lambda n: {"perm": n.attrs["perm"]})),
    OpDef(name="concat", pattern=Pattern.INJECTIVE, infer=_concat_infer,
          evaluate=lambda n, args: np.concatenate(args, axis=n.attrs["axis"]),
          te=lambda n, ins, name: concat(ins, n.attrs["axis"], name),
          onnx_in={"Concat": onnx_plain("concat", lambda ins, a: {"axis": a["axis"] % len(ins[0].shape)})},
          onnx_out=export_as("Concat", lambda n: {"axis": n.attrs["axis"]})),
    OpDef(name="pad", pattern=Pattern.INJECTIVE, infer=_pad_infer, evaluate=_pad_eval, te=_pad_te,
          onnx_in={"Pad": _onnx_pad}),
)
