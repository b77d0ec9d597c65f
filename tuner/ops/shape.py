"""Data movement: flatten, reshape, transpose, concat, pad and slice (injective: fused into their
consumers). ONNX Squeeze and Unsqueeze of an activation import as reshape; Slice, Split and a
Gather at constant indices as slices (and a reshape, or a concat of slices)."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..te.expr import Cast, Const, all_of, max_expr, min_expr, select
from ..te.tensor import Tensor, compute
from .common import Empty, export_as, onnx_plain, unsupported
from .registry import OpDef, Pattern, register

MAX_ELEMENTS = 1 << 28      # a constant the import computes (folded, or a table it builds) is refused past this


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


def strided_slice(x: Tensor, begin: list, step: list, shape: tuple, name: str = "slice") -> Tensor:
    """Element i of the output is x[begin + i * step] on every axis."""
    return compute(tuple(shape), lambda *i: x[tuple(Const(b) + idx * Const(st) if st != 1 else idx + Const(b)
                                                    for idx, b, st in zip(i, begin, step))],
                   name, inputs=[x], axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def _slice_infer(node):
    x, a = node.inputs[0], node.attrs
    for d, b, st, n in zip(x.shape, a["begin"], a["step"], a["shape"]):
        if n < 0 or st == 0 or (n and not (0 <= b < d and 0 <= b + (n - 1) * st < d)):
            raise GraphError(f"slice {node.name}: begin {a['begin']}, step {a['step']}, shape {a['shape']} "
                             f"reach outside {list(x.shape)}")
    return tuple(a["shape"]), x.dtype, ""


def _slice_eval(node, args):
    a = node.attrs
    return args[0][np.ix_(*[b + st * np.arange(n) for b, st, n in zip(a["begin"], a["step"], a["shape"])])]


def unsqueeze_shape(shape, axes) -> list:
    """ONNX Unsqueeze's output shape: a 1 inserted at each of `axes` (of the output's rank)."""
    out, rank = list(shape), len(shape) + len(axes)
    for ax in sorted(ax % rank for ax in axes):
        out.insert(ax, 1)
    return out


def squeeze_shape(shape, axes) -> list:
    """ONNX Squeeze's output shape: `axes` dropped (each must be 1), or every 1 when axes is None."""
    drop = {ax % len(shape) for ax in axes} if axes is not None else {k for k, d in enumerate(shape) if d == 1}
    if any(shape[ax] != 1 for ax in drop):
        raise ValueError(f"cannot squeeze axes {sorted(drop)} of {list(shape)}")
    return [d for k, d in enumerate(shape) if k not in drop]


def split_sizes(dim: int, given, outputs: int) -> list:
    """ONNX Split's part sizes along an axis of `dim`: `given`, else `outputs` parts, the last smaller."""
    if given is not None:
        sizes = [int(v) for v in given]
    else:
        chunk = -(-dim // outputs)
        sizes = [min(chunk, dim - k * chunk) for k in range(outputs)]
    if sum(sizes) != dim or min(sizes) < 0:
        raise ValueError(f"split sizes {sizes} do not add up to {dim}")
    return sizes


def _slice_nodes(cx, x, axis: int, ranges: list, suffix: str = "") -> list:
    """One slice node per (start, stop, step) on `axis` (Python's slice semantics, clamped as ONNX)."""
    out = []
    for k, (start, stop, step) in enumerate(ranges):
        begin, step_all, shape = [0] * len(x.shape), [1] * len(x.shape), list(x.shape)
        r = range(*slice(start, stop, step).indices(x.shape[axis]))
        begin[axis], step_all[axis], shape[axis] = (r.start if len(r) else 0), r.step, len(r)
        out.append(cx.add("slice", [x], {"begin": begin, "step": step_all, "shape": shape},
                          f"{suffix}_{k}" if len(ranges) > 1 else suffix))
    return out


def _ints(cx, v, what: str) -> list:
    return [int(i) for i in np.asarray(cx.const(v, what)).reshape(-1)]


def _onnx_slice(cx, ins, a):
    x = ins[0]
    starts, ends = _ints(cx, ins[1], "starts"), _ints(cx, ins[2], "ends")
    axes = _ints(cx, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = _ints(cx, ins[4], "steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    if 0 in steps:
        raise cx.fail("a step of 0")
    shape = list(x.shape)
    for ax, st, en, sp in zip(axes, starts, ends, steps):
        shape[ax % len(shape)] = len(range(*slice(st, en, sp).indices(shape[ax % len(shape)])))
    if 0 in shape:
        return [Empty(shape, x.dtype)]
    y = x
    for ax, st, en, sp in zip(axes, starts, ends, steps):
        y = _slice_nodes(cx, y, ax % len(x.shape), [(st, en, sp)], f"_ax{ax % len(x.shape)}")[0]
    return [y]


def _onnx_split(cx, ins, a):
    x = ins[0]
    axis = a.get("axis", 0) % len(x.shape)
    given = _ints(cx, ins[1], "split") if len(ins) > 1 and ins[1] is not None else a.get("split")
    try:
        sizes = split_sizes(x.shape[axis], given, a.get("num_outputs", len(cx.node.output)))
    except ValueError as e:
        raise cx.fail(f"{e} (axis {axis} of {list(x.shape)})") from None
    starts = np.cumsum([0] + sizes[:-1])
    return _slice_nodes(cx, x, axis, [(int(s), int(s) + n, 1) for s, n in zip(starts, sizes)])


def _onnx_squeeze(unsqueeze: bool):
    def imp(cx, ins, a):
        x = ins[0]
        axes = _ints(cx, ins[1], "axes") if len(ins) > 1 and ins[1] is not None else a.get("axes")
        try:
            shape = unsqueeze_shape(x.shape, axes) if unsqueeze else squeeze_shape(x.shape, axes)
        except ValueError as e:
            raise cx.fail(str(e)) from None
        return [cx.add("reshape", [x], {"shape": shape})]
    return imp


def _onnx_gather_nd(cx, ins, a):
    """GatherND of an activation at constant indices (torch's x[rows, cols], as transformers index
    the attention mask): a gather along the indexed dimensions flattened into one."""
    x, idx = ins
    if not idx.is_const:
        raise cx.fail("a GatherND at indices computed at run time is not supported (constant indices are)")
    if a.get("batch_dims", 0):
        raise cx.fail(f"batch_dims={a['batch_dims']} is not supported (0 is)")
    idx = np.asarray(idx.data).astype(np.int64)
    k = idx.shape[-1]
    if not 1 <= k <= len(x.shape):
        raise cx.fail(f"indices of {k} coordinates into a {len(x.shape)}-D input")
    dims = np.array(x.shape[:k], np.int64)
    if idx.size and ((idx < -dims) | (idx >= dims)).any():
        raise cx.fail(f"an index lies outside the input's dimensions {dims.tolist()}")
    flat = np.ravel_multi_index(tuple(np.moveaxis(idx % np.maximum(dims, 1), -1, 0)), tuple(dims)) if idx.size else \
        np.zeros(idx.shape[:-1], np.int64)
    rows = x if k == 1 else cx.add("reshape", [x], {"shape": [int(np.prod(dims))] + list(x.shape[k:])}, "_rows")
    return [_onnx_gather_at(cx, rows, np.asarray(flat), 0)]


def _onnx_scatter_nd(cx, ins, a):
    """ScatterND into or of activations at constant indices (Funnel writes its pooled sequence so):
    the updates gathered to where they go, the data kept elsewhere (a where on a constant mask). A
    slice addressed twice takes its last update."""
    data, idx, upd = ins
    if not idx.is_const:
        raise cx.fail("a ScatterND at indices computed at run time is not supported (constant indices are)")
    if a.get("reduction", "none") != "none":
        raise cx.fail(f"reduction={a['reduction']!r} into an activation is not supported (none is)")
    idx = np.asarray(idx.data).astype(np.int64)
    k = idx.shape[-1] if idx.ndim else 0
    if not 1 <= k <= len(data.shape):
        raise cx.fail(f"indices of {k} coordinates into a {len(data.shape)}-D input")
    if list(upd.shape) != list(idx.shape[:-1]) + list(data.shape[k:]):
        raise cx.fail(f"updates {list(upd.shape)} do not fit indices {list(idx.shape)} into data {list(data.shape)}")
    dims = np.array(data.shape[:k], np.int64)
    if ((idx < -dims) | (idx >= dims)).any():
        raise cx.fail(f"an index lies outside the data's dimensions {dims.tolist()}")
    rows = np.ravel_multi_index(tuple((idx.reshape(-1, k) % dims).T), tuple(dims))
    if not rows.size:
        return [data]
    inner = int(np.prod(data.shape[k:]))
    src, mask = np.zeros(int(np.prod(data.shape)), np.int64), np.zeros(int(np.prod(data.shape)), bool)
    at = (rows[:, None] * inner + np.arange(inner)).reshape(-1)    # where each update element goes, in order
    last = at.size - 1 - np.unique(at[::-1], return_index=True)[1]  # the last update of each place written
    src[at[last]], mask[at] = last, True
    flat = cx.add("reshape", [upd], {"shape": [rows.size * inner]}, "_updates")
    picked = cx.add("gather", [flat, cx.constant(src.reshape(data.shape), "_from")], {"axis": 0}, "_picked")
    return [cx.add("where", [cx.constant(mask.reshape(data.shape), "_mask"), picked, data], {})]


def _onnx_scatter_elements(cx, ins, a):
    """ScatterElements at constant indices (BART shifts its ids right for the decoder and writes the
    start token at column 0 so) as the ScatterND that writes the same elements."""
    data, idx, upd = ins
    if not idx.is_const:
        raise cx.fail("a ScatterElements at indices computed at run time is not supported (constant indices are)")
    idx = np.asarray(idx.data).astype(np.int64)
    if idx.ndim != len(data.shape) or tuple(idx.shape) != tuple(upd.shape):
        raise cx.fail(f"indices {list(idx.shape)} and updates {list(upd.shape)} must have one shape, of the data's "
                      f"rank {len(data.shape)}")
    grid = np.indices(idx.shape, dtype=np.int64)
    grid[a.get("axis", 0) % len(data.shape)] = idx
    coords = np.ascontiguousarray(np.moveaxis(grid, 0, -1))
    return _onnx_scatter_nd(cx, [data, cx.constant(coords, "_coordinates"), upd], {"reduction": a.get("reduction", "none")})


def place_blocks(cx, x, n: int, c: int, kh: int, kw: int, rows: int, cols: int):
    """Blocks that tile an image (x: n x c*kh*kw x rows*cols, in any shape of that order) placed in
    it by a reshape and transpose, a depth-to-space: n x c x rows*kh x cols*kw."""
    y = cx.add("reshape", [x], {"shape": [int(v) for v in (n, c, kh, kw, rows, cols)]}, "_blocks")
    y = cx.add("transpose", [y], {"perm": [0, 1, 4, 2, 5, 3]}, "_placed")
    return cx.add("reshape", [y], {"shape": [int(v) for v in (n, c, rows * kh, cols * kw)]}, "_image")


def _onnx_col2im(cx, ins, a):
    """Col2Im (torch's nn.Fold: MobileViT V2 folds its patches back): each output pixel the sum of the
    columns' entries that land on it, at most m of them; the sum of m gathers of the flattened columns
    at constant positions, each masked where a pixel has fewer (one gather where blocks do not overlap;
    a reshape and transpose where they tile the image, as ConvTranspose's depth-to-space)."""
    x = ins[0]
    hw, block = (np.asarray(cx.const(v, what)).astype(np.int64).reshape(-1) for v, what in
                 ((ins[1], "the image shape"), (ins[2], "the block shape")))
    if len(x.shape) != 3 or len(hw) != 2 or len(block) != 2:
        raise cx.fail("only a 2-D Col2Im of (N, C x block, L) columns is supported")
    dil, strides, pads = (list(a.get(k, d)) for k, d in (("dilations", [1, 1]), ("strides", [1, 1]),
                                                          ("pads", [0, 0, 0, 0])))
    (h, w), (kh, kw), (n, ckk, length) = hw, block, x.shape
    if min(h, w, kh, kw) < 1 or ckk % (kh * kw) or min(strides + dil) < 1 or min(pads) < 0:
        raise cx.fail(f"image {hw.tolist()}, block {block.tolist()}, strides {strides}, dilations {dil} or pads "
                      f"{pads} do not fold {list(x.shape)} columns")
    rows = [(size + lo + hi - d * (k - 1) - 1) // st + 1
            for size, lo, hi, d, k, st in ((h, pads[0], pads[2], dil[0], kh, strides[0]),
                                           (w, pads[1], pads[3], dil[1], kw, strides[1]))]
    if rows[0] * rows[1] != length:
        raise cx.fail(f"{length} columns, but the image and block give {rows[0]} x {rows[1]}")
    c = ckk // (kh * kw)
    if strides == [kh, kw] and dil == [1, 1] and not any(pads) and not (h % kh or w % kw):
        return [place_blocks(cx, x, n, c, kh, kw, *rows)]      # each pixel one column's entry
    if c * h * w > MAX_ELEMENTS or c * kh * kw * length > MAX_ELEMENTS:
        raise cx.fail(f"an image of {c} x {h} x {w} is past the {MAX_ELEMENTS} elements its index tables may hold")
    ch, i, j, by, bx = np.meshgrid(*(np.arange(v) for v in (c, kh, kw, rows[0], rows[1])), indexing="ij")
    y, xx = by * strides[0] - pads[0] + i * dil[0], bx * strides[1] - pads[1] + j * dil[1]
    inside = ((0 <= y) & (y < h) & (0 <= xx) & (xx < w)).reshape(-1)
    pixel = ((ch * h + y) * w + xx).reshape(-1)[inside]      # output pixel <- flat column position
    col = ((((ch * kh + i) * kw + j) * length) + by * rows[1] + bx).reshape(-1)[inside]
    if not pixel.size:           # every column falls in the pads or between strides: an image of zeros,
        # computed from x (a constant output has no kernel to write it), exact where x holds a NaN
        part = cx.add("gather", [cx.add("reshape", [x], {"shape": [n, ckk * length]}, "_flat"),
                                 cx.constant(np.zeros((c, h, w), np.int64), "_at")], {"axis": 1}, "_part")
        return [cx.add("where", [cx.constant(np.zeros((c, h, w), bool), "_none"), part,
                                 cx.constant(np.zeros((c, h, w), np.float32), "_zeros")], {})]
    order = np.argsort(pixel, kind="stable")
    pixel, col = pixel[order], col[order]
    first = np.searchsorted(pixel, pixel)                    # each entry's rank among its pixel's
    rank = np.arange(pixel.size) - first
    at, keep = np.zeros((rank.max() + 1, c * h * w), np.int64), np.zeros((rank.max() + 1, c * h * w), np.float32)
    at[rank, pixel], keep[rank, pixel] = col, 1.0
    flat = cx.add("reshape", [x], {"shape": [n, ckk * length]}, "_flat")
    out = None
    for t in range(len(at)):
        part = cx.add("gather", [flat, cx.constant(at[t].reshape(c, h, w), f"_at{t}")], {"axis": 1}, f"_part{t}")
        if not keep[t].all():
            part = cx.add("mul", [part, cx.constant(keep[t].reshape(c, h, w), f"_keep{t}")], {}, f"_kept{t}")
        out = part if out is None else cx.add("add", [out, part], {}, f"_sum{t}")
    return [out]


def _onnx_gather_at(cx, x, idx: np.ndarray, axis: int, suffix: str = ""):
    """Gather of an activation at constant indices: one slice where they step evenly, a slice per run
    of consecutive indices and a concat for up to three runs (a reflect pad), else a gather at a
    constant index tensor (a concat of many one-wide slices takes GCC seconds to compile)."""
    d = x.shape[axis]
    flat = [int(i) for i in idx.reshape(-1)]
    if any(not -d <= i < d for i in flat):
        raise cx.fail(f"index {next(i for i in flat if not -d <= i < d)} is outside axis {axis} of size {d}")
    flat = [i % d for i in flat]
    step = flat[1] - flat[0] if len(flat) > 1 else 1
    if flat and step != 0 and flat == list(range(flat[0], flat[0] + step * len(flat), step)):
        y = _slice_nodes(cx, x, axis, [(flat[0], flat[0] + step * len(flat) if flat[0] + step * len(flat) >= 0
                                        else None, step)], suffix)[0]
    elif flat and len(runs := _runs(flat)) <= 3:
        y = cx.add("concat", _slice_nodes(cx, x, axis, runs, suffix), {"axis": axis}, suffix or "_concat")
    elif (order := _split_axis(np.asarray(flat, np.int64).reshape(idx.shape), d)) is not None:
        sizes = [idx.shape[k] for k in order]
        y = cx.add("reshape", [x], {"shape": list(x.shape[:axis]) + sizes + list(x.shape[axis + 1:])}, f"{suffix}_split")
        perm = list(range(axis)) + [axis + order.index(k) for k in range(len(order))] + \
            list(range(axis + len(order), len(y.shape)))
        y = cx.add("transpose", [y], {"perm": perm}, suffix or "_transposed")
    else:
        return cx.add("gather", [x, cx.constant(np.asarray(flat, np.int64).reshape(idx.shape), f"{suffix}_at")],
                      {"axis": axis}, suffix)
    shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])
    return y if list(y.shape) == shape else cx.add("reshape", [y], {"shape": shape}, f"{suffix}_shape")


def _split_axis(idx: np.ndarray, d: int) -> list | None:
    """The dims of idx from outer to inner where idx holds each of 0..d-1 once, as the axis split by a
    reshape into those dims and transposed into idx's order would (torch's unfold into patches
    gathers rows [[0, 2, 4, ...], [1, 3, 5, ...]]); else None."""
    if idx.ndim < 2 or idx.size != d or idx.flat[0] != 0:
        return None
    strides = [int(idx[tuple(1 if j == k else 0 for j in range(idx.ndim))]) if n > 1 else 0
               for k, n in enumerate(idx.shape)]
    order = sorted(range(idx.ndim), key=lambda k: -strides[k])
    inner = 1
    for k in reversed(order):
        if idx.shape[k] > 1 and strides[k] != inner:
            return None
        inner *= idx.shape[k]
    affine = sum(s * np.arange(n).reshape([-1 if j == k else 1 for j in range(idx.ndim)])
                 for k, (s, n) in enumerate(zip(strides, idx.shape)))
    return order if np.array_equal(affine, idx) else None


def gather(table: Tensor, idx: Tensor, axis: int, name: str = "gather") -> Tensor:
    """ONNX Gather of `table` at the integer `idx` (carried as float32) along `axis`; an index
    outside [-size, size) is clamped into the table (the runtime refuses such inputs first)."""
    size, ni = table.shape[axis], idx.ndim
    shape = tuple(table.shape[:axis]) + tuple(idx.shape) + tuple(table.shape[axis + 1:])

    def f(*i):
        raw = Cast("int32", idx[i[axis:axis + ni]])
        k = min_expr(max_expr(select(raw < 0, raw + Const(size), raw), Const(0)), Const(size - 1))
        return table[i[:axis] + (k,) + i[axis + ni:]]

    return compute(shape, f, name, inputs=[table, idx], axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def _gather_infer(node):
    table, idx = node.inputs
    ax = node.attrs["axis"]
    if not idx.dtype.startswith("int"):
        raise GraphError(f"gather {node.name}: indices are {idx.dtype}, not integers")
    return tuple(table.shape[:ax]) + tuple(idx.shape) + tuple(table.shape[ax + 1:]), table.dtype, ""


def _gather_eval(node, args):
    table, idx = args
    size = table.shape[node.attrs["axis"]]
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise GraphError(f"gather {node.name}: index {int(idx.min() if idx.min() < -size else idx.max())} is "
                         f"outside [-{size}, {size})")
    return np.take(table, idx.astype(np.int64), axis=node.attrs["axis"])


def affine_steps(a: np.ndarray) -> list | None:
    """[start, step of each dim] where the integers `a` are start + sum(step_d * index_d) (a position
    id, a range), else None."""
    if a.dtype.kind not in "iu" or a.size == 0:
        return None
    start = int(a.flat[0])
    steps = [int(a[tuple(1 if j == d else 0 for j in range(a.ndim))]) - start if n > 1 else 0
             for d, n in enumerate(a.shape)]
    return [start, *steps] if np.array_equal(_iota_values(a.shape, start, steps), a) else None


def _iota_values(shape, start: int, steps: list) -> np.ndarray:
    out = np.full(tuple(shape), start, np.int64)
    for d, s in enumerate(steps):
        out = out + s * np.arange(shape[d]).reshape([-1 if j == d else 1 for j in range(len(shape))])
    return out


def _iota_infer(node):
    return tuple(node.attrs["shape"]), node.attrs["dtype"], ""


def _iota_eval(node, args):
    a = node.attrs
    return _iota_values(a["shape"], a["start"], a["steps"]).astype(a["dtype"])


def _iota_te(node, ins, name):
    """Integers start + sum(step_d * i_d), carried as float32: a run's position ids, whose start (the
    past length) te.dynamic fits as an expression of the symbols."""
    a = node.attrs

    def f(*i):
        e = Const(int(a["start"]))
        for d, s in enumerate(a["steps"]):
            if s:
                e = e + i[d] * Const(int(s))
        return Cast("float32", e)

    return compute(a["shape"], f, name, axis_names=[f"{name}_i{d}" for d in range(len(a["shape"]))])


def _onnx_gather(cx, ins, a):
    """Gather: of a constant table at activation indices (an embedding lookup), a gather node; of an
    activation at constant indices, slices."""
    x, idx = ins
    axis = a.get("axis", 0) % len(x.shape)
    if not idx.is_const:
        return [cx.add("gather", [x, idx], {"axis": axis})]
    return [_onnx_gather_at(cx, x, np.asarray(idx.data), axis)]


def gather_elements(data: Tensor, idx: Tensor, axis: int, name: str = "gather_elements") -> Tensor:
    """ONNX GatherElements: out[i] = data[i with its `axis` coordinate replaced by idx[i]], the index
    clamped into the axis as in `gather`."""
    size = data.shape[axis]

    def f(*i):
        raw = Cast("int32", idx[i])
        k = min_expr(max_expr(select(raw < 0, raw + Const(size), raw), Const(0)), Const(size - 1))
        return data[i[:axis] + (k,) + i[axis + 1:]]

    return compute(idx.shape, f, name, inputs=[data, idx], axis_names=[f"{name}_i{k}" for k in range(idx.ndim)])


def _gather_elements_infer(node):
    data, idx = node.inputs
    ax = node.attrs["axis"]
    if not idx.dtype.startswith("int"):
        raise GraphError(f"gather_elements {node.name}: indices are {idx.dtype}, not integers")
    if len(idx.shape) != len(data.shape) or any(a > d for k, (a, d) in enumerate(zip(idx.shape, data.shape)) if k != ax):
        raise GraphError(f"gather_elements {node.name}: indices {list(idx.shape)} do not fit data {list(data.shape)}")
    return tuple(idx.shape), data.dtype, ""


def _gather_elements_eval(node, args):
    data, idx = args
    ax, size = node.attrs["axis"], data.shape[node.attrs["axis"]]
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise GraphError(f"gather_elements {node.name}: index {int(idx.min() if idx.min() < -size else idx.max())} "
                         f"is outside [-{size}, {size})")
    sub = data[tuple(slice(None) if k == ax else slice(0, n) for k, n in enumerate(idx.shape))]
    return np.take_along_axis(sub, idx.astype(np.int64) % size, axis=ax)


def _onnx_flatten(cx, ins, a):
    """Flatten's axis lies in [-rank, rank]: rank itself puts every axis in the rows (torch's
    flatten(start_dim=2) of a 2-D mask), and a negative one counts from the end."""
    r, axis = len(ins[0].shape), a.get("axis", 1)
    if not -r <= axis <= r:
        raise cx.fail(f"axis {axis} is outside [-{r}, {r}]")
    return [cx.add("flatten", ins[:1], {"axis": axis + r if axis < 0 else axis})]


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


def _export_slice(ex, n, ins):
    a = n.attrs
    ends = [b + st * k if b + st * k >= 0 else -(1 << 62) for b, st, k in zip(a["begin"], a["step"], a["shape"])]
    ex.emit(n, "Slice", ins + [ex.tensor(f"{n.name}_starts", a["begin"]), ex.tensor(f"{n.name}_ends", ends),
                               ex.tensor(f"{n.name}_axes", list(range(len(ends)))),
                               ex.tensor(f"{n.name}_steps", a["step"])])


# Pad's other modes: the input index each output position j (from -before to n + after) reads
PAD_MODES = {"reflect": lambda j, n: np.where(np.abs(j) >= n, 2 * (n - 1) - np.abs(j), np.abs(j)),
             "edge": lambda j, n: np.clip(j, 0, n - 1),
             "wrap": lambda j, n: j % n}


def _onnx_depth_space(to_space: bool):
    """DepthToSpace (pixel shuffle: super-resolution upsamplers) and SpaceToDepth as a reshape, a
    transpose and a reshape; DCR and CRD orders differ only in where the channel factor sits."""
    def imp(cx, ins, a):
        x, b = ins[0], a.get("blocksize")
        mode = a.get("mode", "DCR")
        if not isinstance(b, int) or b < 1 or len(x.shape) != 4 or mode not in ("DCR", "CRD"):
            raise cx.fail(f"needs a 4-D input, a positive blocksize and mode DCR or CRD; got {list(x.shape)}, "
                          f"blocksize={b}, mode={mode}")
        n, c, h, w = x.shape
        if to_space:
            if c % (b * b):
                raise cx.fail(f"{c} channels do not divide into blocks of {b} x {b}")
            c2 = c // (b * b)
            shape, perm = (([n, b, b, c2, h, w], [0, 3, 4, 1, 5, 2]) if mode == "DCR" else
                           ([n, c2, b, b, h, w], [0, 1, 4, 2, 5, 3]))
            out = [n, c2, h * b, w * b]
        else:
            if h % b or w % b:
                raise cx.fail(f"a {h} x {w} image does not divide into blocks of {b} x {b}")
            shape, perm, out = [n, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4], [n, c * b * b, h // b, w // b]
        y = cx.add("reshape", [x], {"shape": shape}, "_blocks")
        y = cx.add("transpose", [y], {"perm": perm}, "_moved")
        return [cx.add("reshape", [y], {"shape": out})]
    return imp


def _runs(idx) -> list:
    """The (start, stop, step) slices that read `idx` in order: its runs of consecutive indices, up or down."""
    out, k = [], 0
    while k < len(idx):
        step = int(idx[k + 1] - idx[k]) if k + 1 < len(idx) and abs(int(idx[k + 1] - idx[k])) == 1 else 1
        end = k + 1
        while end < len(idx) and idx[end] - idx[end - 1] == step:
            end += 1
        last = int(idx[end - 1])
        out.append((int(idx[k]), last + step if last + step >= 0 else None, step))
        k = end
    return out


def _onnx_pad(cx, ins, a):
    x = ins[0]
    mode = a.get("mode", "constant")
    if mode != "constant" and mode not in PAD_MODES:
        raise cx.fail(f"mode={mode!r} is not supported (constant, {', '.join(PAD_MODES)} are)")
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
    if mode == "constant":
        return [cx.add("pad", [x], {"pads": pads, "value": value})]
    rank = len(x.shape)
    if len(pads) != 2 * rank:
        raise cx.fail(f"pads must have {2 * rank} values for a {rank}-D input, got {len(pads)}")
    for ax, (lo, hi) in enumerate(zip(pads[:rank], pads[rank:])):
        n = x.shape[ax]
        if lo == hi == 0:
            continue
        if n + lo + hi < 1 or (mode == "reflect" and max(lo, hi) > n - 1):
            raise cx.fail(f"pads {lo} and {hi} of axis {ax} (size {n}) are past what mode={mode} can read")
        x = _onnx_gather_at(cx, x, PAD_MODES[mode](np.arange(-lo, n + hi), n), ax, f"_ax{ax}")
    return [x]


register(
    OpDef(name="flatten", pattern=Pattern.INJECTIVE, integers=True, infer=_flatten_infer,
          evaluate=lambda n, args: args[0].reshape(n.output.shape),
          te=lambda n, ins, name: reshape(ins[0], n.output.shape, name),
          onnx_in={"Flatten": _onnx_flatten},
          onnx_out=export_as("Flatten", lambda n: {"axis": n.attrs["axis"]})),
    OpDef(name="reshape", pattern=Pattern.INJECTIVE, integers=True, infer=_reshape_infer,
          evaluate=lambda n, args: args[0].reshape(n.attrs["shape"]),
          te=lambda n, ins, name: reshape(ins[0], n.output.shape, name),
          onnx_in={"Reshape": _onnx_reshape, "Squeeze": _onnx_squeeze(False), "Unsqueeze": _onnx_squeeze(True)},
          onnx_out=lambda ex, n, ins: ex.emit(n, "Reshape", ins + [ex.tensor(f"{n.name}_shape", n.attrs["shape"])])),
    OpDef(name="transpose", pattern=Pattern.INJECTIVE, integers=True,
          infer=lambda n: (tuple(n.inputs[0].shape[p] for p in n.attrs["perm"]), n.inputs[0].dtype, ""),
          evaluate=lambda n, args: np.ascontiguousarray(args[0].transpose(n.attrs["perm"])),
          te=lambda n, ins, name: transpose(ins[0], tuple(n.attrs["perm"]), name),
          onnx_in={"Transpose": onnx_plain("transpose", lambda ins, a: {
              "perm": a.get("perm", list(range(len(ins[0].shape)))[::-1])}),
              "DepthToSpace": _onnx_depth_space(True), "SpaceToDepth": _onnx_depth_space(False)},
          onnx_out=export_as("Transpose", lambda n: {"perm": n.attrs["perm"]})),
    OpDef(name="concat", pattern=Pattern.INJECTIVE, integers=True, infer=_concat_infer,
          evaluate=lambda n, args: np.concatenate(args, axis=n.attrs["axis"]),
          te=lambda n, ins, name: concat(ins, n.attrs["axis"], name),
          onnx_in={"Concat": onnx_plain("concat", lambda ins, a: {"axis": a["axis"] % len(ins[0].shape)})},
          onnx_out=export_as("Concat", lambda n: {"axis": n.attrs["axis"]})),
    OpDef(name="pad", pattern=Pattern.INJECTIVE, integers=True, infer=_pad_infer, evaluate=_pad_eval, te=_pad_te,
          onnx_in={"Pad": _onnx_pad}),
    OpDef(name="gather", pattern=Pattern.INJECTIVE, integers=True, infer=_gather_infer, evaluate=_gather_eval,
          te=lambda n, ins, name: gather(ins[0], ins[1], n.attrs["axis"], name),
          onnx_in={"Gather": _onnx_gather, "GatherND": _onnx_gather_nd, "ScatterND": _onnx_scatter_nd,
                   "ScatterElements": _onnx_scatter_elements,
                   "Col2Im": _onnx_col2im},
          onnx_out=export_as("Gather", lambda n: {"axis": n.attrs["axis"]})),
    OpDef(name="gather_elements", pattern=Pattern.INJECTIVE, integers=True, infer=_gather_elements_infer,
          evaluate=_gather_elements_eval, te=lambda n, ins, name: gather_elements(ins[0], ins[1], n.attrs["axis"], name),
          onnx_in={"GatherElements": onnx_plain("gather_elements", lambda ins, a: {
              "axis": a.get("axis", 0) % len(ins[0].shape)})},
          onnx_out=export_as("GatherElements", lambda n: {"axis": n.attrs["axis"]})),
    OpDef(name="iota", pattern=Pattern.INJECTIVE, integers=True, infer=_iota_infer, evaluate=_iota_eval, te=_iota_te),
    OpDef(name="slice", pattern=Pattern.INJECTIVE, integers=True, infer=_slice_infer, evaluate=_slice_eval,
          te=lambda n, ins, name: strided_slice(ins[0], n.attrs["begin"], n.attrs["step"], n.attrs["shape"], name),
          onnx_in={"Slice": _onnx_slice, "Split": _onnx_split}, onnx_out=_export_slice),
)
