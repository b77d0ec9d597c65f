"""Constant folding at ONNX import: a node whose inputs are all constants (or, for Shape and Size,
an input whose shape is known) becomes the constant it computes, with ONNX's semantics in NumPy.

Exporters compute shapes and indices in the graph: `x.view(x.size(0), -1)` is Shape -> Gather ->
Unsqueeze -> Concat -> Reshape, a position id is Range, a mask ConstantOfShape or Trilu. At
static input shapes all of that is constant, so the imported graph keeps only the real work.
FOLD maps an ONNX op type to fn(inputs, attributes, opset) -> [output arrays]; an input is a
NumPy array, or the Value itself for the ops in OF_SHAPE.
"""
from __future__ import annotations

import math

import numpy as np

from ..ops.reduce import cumsum_ref
from ..ops.shape import MAX_ELEMENTS, split_sizes, squeeze_shape, unsqueeze_shape

# ONNX TensorProto data types -> NumPy (the ones exporters write for shapes, ids, masks and values)
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
          10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}

OF_SHAPE = ("Shape", "Size", "EyeLike")      # need only the input's shape (and type), not its values


def _axes(ins, a, opset, k=1):
    """The `axes` of Unsqueeze/Squeeze/Reduce*: an attribute before opset 13, else input k."""
    if len(ins) > k and ins[k] is not None:
        return [int(v) for v in np.asarray(ins[k]).reshape(-1)]
    return a.get("axes")


def _shape(ins, a, opset):
    shape = list(ins[0].shape)
    n = len(shape)
    start, end = a.get("start", 0), a.get("end", n)
    start, end = (max(0, min(n, s + n if s < 0 else s)) for s in (start, end))
    return [np.array(shape[start:end], dtype=np.int64)]


def _unsqueeze(ins, a, opset):
    x = np.asarray(ins[0])
    return [x.reshape(unsqueeze_shape(x.shape, _axes(ins, a, opset)))]


def _squeeze(ins, a, opset):
    x = np.asarray(ins[0])
    return [x.reshape(squeeze_shape(x.shape, _axes(ins, a, opset)))]


def _reshape(ins, a, opset):
    x, shape = np.asarray(ins[0]), [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    shape = [x.shape[k] if d == 0 and not a.get("allowzero", 0) else d for k, d in enumerate(shape)]
    return [x.reshape(shape)]


def _slice(ins, a, opset):
    x = np.asarray(ins[0])
    if opset < 10 or len(ins) < 3:
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = (np.asarray(v).reshape(-1).tolist() for v in ins[1:3])
        axes = np.asarray(ins[3]).reshape(-1).tolist() if len(ins) > 3 and ins[3] is not None else None
        steps = np.asarray(ins[4]).reshape(-1).tolist() if len(ins) > 4 and ins[4] is not None else None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        index[ax % x.ndim] = slice(s, e, st)      # NumPy clamps out-of-range bounds as ONNX does
    return [x[tuple(index)]]


def _div(ins, a, opset):
    x, y = np.asarray(ins[0]), np.asarray(ins[1])
    if np.issubdtype(x.dtype, np.integer):
        return [np.trunc(x / y).astype(x.dtype)]     # ONNX's integer division truncates
    return [x / y]


def _mod(ins, a, opset):
    x, y = np.asarray(ins[0]), np.asarray(ins[1])
    return [np.fmod(x, y) if a.get("fmod", 0) else np.mod(x, y)]


def _constant_of_shape(ins, a, opset):
    value = np.asarray(a.get("value", np.zeros(1, np.float32))).reshape(-1)
    return [np.full([int(d) for d in np.asarray(ins[0]).reshape(-1)], value[0], dtype=value.dtype)]


def _trilu(ins, a, opset):
    x = np.asarray(ins[0])
    k = int(np.asarray(ins[1])) if len(ins) > 1 and ins[1] is not None else 0
    return [np.triu(x, k) if a.get("upper", 1) else np.tril(x, k)]


def _split(ins, a, opset):
    x = np.asarray(ins[0])
    axis = a.get("axis", 0) % x.ndim
    given = np.asarray(ins[1]).reshape(-1) if len(ins) > 1 and ins[1] is not None else a.get("split")
    sizes = split_sizes(x.shape[axis], given, a.get("num_outputs", a["_outputs"]))
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _cumsum(ins, a, opset):
    """ONNX CumSum along the axis its second input names (GPT-2's exporters number positions with it)."""
    x = np.asarray(ins[0])
    axis = int(np.asarray(ins[1]).reshape(-1)[0]) % x.ndim
    return [cumsum_ref(x, axis, bool(a.get("exclusive", 0)), bool(a.get("reverse", 0)))]


def _gather_nd(ins, a, opset):
    """ONNX GatherND: the last axis of the indices addresses the data's leading (after
    `batch_dims` shared ones) dimensions; negative indices count from the end."""
    x, idx, b = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64), a.get("batch_dims", 0)
    k = idx.shape[-1]
    idx = idx % np.array(x.shape[b:b + k], np.int64)
    if b == 0:
        return [x[tuple(np.moveaxis(idx, -1, 0))]]
    out = [x[batch][tuple(np.moveaxis(idx[batch], -1, 0))] for batch in np.ndindex(*x.shape[:b])]
    return [np.stack(out).reshape(*idx.shape[:b], *out[0].shape)]


SCATTER = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _in_range(idx: np.ndarray, dims) -> np.ndarray:
    """Indices with negatives counted from the end; one outside [-dim, dim) is an IndexError."""
    dims = np.asarray(dims, np.int64)
    if idx.size and ((idx < -dims) | (idx >= dims)).any():
        raise IndexError(f"an index lies outside the data's dimensions {dims.tolist()}")
    return idx % np.maximum(dims, 1)


def _scatter(out: np.ndarray, where: tuple, updates: np.ndarray, reduction: str) -> list:
    if reduction == "none":
        out[where] = updates
    elif reduction in SCATTER:
        SCATTER[reduction].at(out, where, updates)
    else:
        raise ValueError(f"unknown reduction {reduction!r}")
    return [out]


def _scatter_nd(ins, a, opset):
    """ONNX ScatterND: the data with the slices its indices' last axis addresses replaced by (or
    reduced with) the updates (Swin's shifted-window masks are written so)."""
    out, idx = np.array(ins[0]), np.asarray(ins[1]).astype(np.int64)
    k = idx.shape[-1]
    idx = _in_range(idx, out.shape[:k]).reshape(-1, k)
    updates = np.asarray(ins[2]).reshape(idx.shape[0], *out.shape[k:])
    return _scatter(out, tuple(idx.T), updates, a.get("reduction", "none"))


def _scatter_elements(ins, a, opset):
    out, idx = np.array(ins[0]), np.asarray(ins[1]).astype(np.int64)
    axis = a.get("axis", 0) % out.ndim
    where = list(np.indices(idx.shape))
    where[axis] = _in_range(idx, out.shape[axis])
    return _scatter(out, tuple(where), np.asarray(ins[2]), a.get("reduction", "none"))


def _one_hot(ins, a, opset):
    """ONNX OneHot: values[1] where the index (negatives counted from depth) is the position along the
    new axis, values[0] elsewhere (an index outside the depth: nowhere)."""
    idx = np.trunc(np.asarray(ins[0])).astype(np.int64)
    depth, values = int(np.asarray(ins[1]).reshape(-1)[0]), np.asarray(ins[2]).reshape(-1)
    if depth < 1 or values.size != 2:
        raise ValueError(f"depth {depth} and {values.size} values do not make a one-hot (depth >= 1, 2 values)")
    hot = np.where(idx < 0, idx + depth, idx)[..., None] == np.arange(depth)
    return [np.moveaxis(np.where(hot, values[1], values[0]), -1, a.get("axis", -1) % (idx.ndim + 1))]


def _eye_like(ins, a, opset):
    """ONNX EyeLike: ones on the k-th diagonal of a 2-D input's shape, in `dtype` (else the input's type)."""
    x = ins[0]
    if len(x.shape) != 2:
        raise ValueError(f"EyeLike takes a 2-D input, got shape {list(x.shape)}")
    return [np.eye(*x.shape, k=a.get("k", 0), dtype=DTYPES[a["dtype"]] if "dtype" in a else np.dtype(x.dtype))]


def _elementwise(fn):
    return lambda ins, a, opset: [fn(*(np.asarray(v) for v in ins))]


FOLD = {
    "Shape": _shape,
    "Size": lambda ins, a, opset: [np.array(int(np.prod(ins[0].shape)), dtype=np.int64)],
    "Gather": lambda ins, a, opset: [np.take(np.asarray(ins[0]), np.asarray(ins[1]), axis=a.get("axis", 0))],
    "GatherElements": lambda ins, a, opset: [np.take_along_axis(np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
                                                                % np.shape(ins[0])[a.get("axis", 0)], axis=a.get("axis", 0))],
    "Split": _split,
    "IsNaN": _elementwise(np.isnan),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda ins, a, opset: [np.concatenate([np.asarray(v) for v in ins], axis=a["axis"])],
    "Reshape": _reshape,
    "Slice": _slice,
    "Expand": lambda ins, a, opset: [np.broadcast_to(ins[0], np.broadcast_shapes(
        np.shape(ins[0]), tuple(int(d) for d in np.asarray(ins[1]).reshape(-1)))).copy()],
    "Transpose": lambda ins, a, opset: [np.transpose(np.asarray(ins[0]), a.get("perm"))],
    "Tile": lambda ins, a, opset: [np.tile(np.asarray(ins[0]), tuple(int(r) for r in np.asarray(ins[1]).reshape(-1)))],
    "Cast": lambda ins, a, opset: [np.asarray(ins[0]).astype(DTYPES[a["to"]])],
    "ConstantOfShape": _constant_of_shape,
    "Range": lambda ins, a, opset: [np.arange(*(np.asarray(v).item() for v in ins[:3])).astype(np.asarray(ins[0]).dtype)],
    "Trilu": _trilu,
    "CumSum": _cumsum,
    "GatherND": _gather_nd,
    "ScatterND": _scatter_nd,
    "OneHot": _one_hot,
    "EyeLike": _eye_like,           # BAT's bilinear attention transform (timm's bat_resnext26ts)
    "ScatterElements": _scatter_elements,
    "Scatter": _scatter_elements,
    "Add": _elementwise(np.add),
    "Sub": _elementwise(np.subtract),
    "Mul": _elementwise(np.multiply),
    "Div": _div,
    "Mod": _mod,
    "Neg": _elementwise(np.negative),
    "Abs": _elementwise(np.abs),
    "Sqrt": _elementwise(np.sqrt),
    "Reciprocal": _elementwise(np.reciprocal),
    "Log": _elementwise(np.log),            # T5's relative position buckets
    "Exp": _elementwise(np.exp),
    "Sin": _elementwise(np.sin),            # rotary embeddings' tables
    "Cos": _elementwise(np.cos),
    "Tanh": _elementwise(np.tanh),
    "Floor": _elementwise(np.floor),
    "Ceil": _elementwise(np.ceil),
    "Round": _elementwise(np.round),        # half to even, as ONNX
    "Sign": _elementwise(np.sign),
    "Pow": _elementwise(np.power),
    "Equal": _elementwise(np.equal),
    "Less": _elementwise(np.less),
    "LessOrEqual": _elementwise(np.less_equal),
    "Greater": _elementwise(np.greater),
    "GreaterOrEqual": _elementwise(np.greater_equal),
    "Not": _elementwise(np.logical_not),
    "And": _elementwise(np.logical_and),
    "Or": _elementwise(np.logical_or),
    "Where": _elementwise(np.where),
    "Min": _elementwise(np.minimum),
    "Max": _elementwise(np.maximum),
}


def _broadcast(*arrays) -> int:
    return math.prod(np.broadcast_shapes(*(np.shape(v) for v in arrays if v is not None)))


def _range_length(ins) -> int:
    start, limit, delta = (np.asarray(v).item() for v in ins[:3])
    return max(0, math.ceil((limit - start) / delta)) if delta else 0


# ops whose output can outgrow their inputs -> fn(inputs, attributes): the elements it will have
GROWS = {
    "ConstantOfShape": lambda ins, a: math.prod(int(d) for d in np.asarray(ins[0]).reshape(-1)),
    "Expand": lambda ins, a: math.prod(np.broadcast_shapes(np.shape(ins[0]),
                                                           tuple(int(d) for d in np.asarray(ins[1]).reshape(-1)))),
    "Range": lambda ins, a: _range_length(ins),
    "OneHot": lambda ins, a: np.size(ins[0]) * max(1, int(np.asarray(ins[1]).reshape(-1)[0])),
    "Tile": lambda ins, a: np.size(ins[0]) * math.prod(max(0, int(r)) for r in np.asarray(ins[1]).reshape(-1)),
    "Gather": lambda ins, a: np.size(ins[1]) * np.size(ins[0]) // max(1, np.shape(ins[0])[a.get("axis", 0)]),
    **{t: lambda ins, a: _broadcast(*ins) for t in ("Add", "Sub", "Mul", "Div", "Mod", "Pow", "Equal", "Less",
                                                 "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Where",
                                                 "Min", "Max")},
}


def foldable(op_type: str, ins: list) -> bool:
    """Whether a node of `op_type` over the Values `ins` is a constant this module computes."""
    if op_type not in FOLD:
        return False
    given = [v for v in ins if v is not None]
    if op_type in OF_SHAPE:
        return bool(given)
    return bool(given) and all(v.is_const for v in given)


def fold(op_type: str, ins: list, attrs: dict, opset: int) -> list:
    """The node's outputs as arrays (foldable(op_type, ins) must hold)."""
    args = [v if v is None or op_type in OF_SHAPE else v.data for v in ins]
    if op_type in GROWS and (n := GROWS[op_type](args, attrs)) > MAX_ELEMENTS:
        raise ValueError(f"its result would have {n} elements, over the {MAX_ELEMENTS} a folded constant may have")
    with np.errstate(all="ignore"):     # inf and NaN as ONNX Runtime computes them (T5 takes log(0) and masks it)
        return [np.asarray(y) for y in FOLD[op_type](args, attrs, opset)]
