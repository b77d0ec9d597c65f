"""The operator library as tensor expressions, each next to its NumPy reference.

Every TE builder takes tensors in its layout and returns the output tensor; the reference
functions work in NCHW / OIHW / OI, and `workloads.py` converts between the two.
"""
from __future__ import annotations

import numpy as np

from .expr import Call, Cast, Const, all_of, max_expr, min_expr, select
from .layouts import block_of
from .tensor import Tensor, compute, max_reduce, reduce_axis, sum_reduce


def conv_out_size(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


# ------------------------------------------------------------------ pad

def pad(data: Tensor, spatial_dims: tuple, pads: tuple, value: float = 0.0, name: str = "pad") -> Tensor:
    """Pad the two dims in `spatial_dims` by (top, left, bottom, right)."""
    top, left, bottom, right = pads
    hd, wd = spatial_dims
    shape = list(data.shape)
    H, W = shape[hd], shape[wd]
    shape[hd] += top + bottom
    shape[wd] += left + right

    def f(*idx):
        h, w = idx[hd], idx[wd]
        src = list(idx)
        src[hd], src[wd] = h - top, w - left
        inside = all_of(h >= top, h < top + H, w >= left, w < left + W)
        return select(inside, data[tuple(src)], Const(float(value)))

    return compute(shape, f, name, tag="pad", inputs=[data],
                   axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def pad_ref(x: np.ndarray, spatial_dims: tuple, pads: tuple, value: float = 0.0) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    widths[spatial_dims[0]] = (pads[0], pads[2])
    widths[spatial_dims[1]] = (pads[1], pads[3])
    return np.pad(x, widths, constant_values=value)


# ------------------------------------------------------------------ conv2d

def conv2d(data: Tensor, kernel: Tensor, layout: str, stride: int, pads: tuple,
           dilation: int = 1, groups: int = 1, name: str = "conv") -> Tensor:
    """conv2d in NCHW (OIHW weights), NHWC (HWIO) or NCHW[x]c (OIHW[i]i[o]o)."""
    padded = pad(data, _hw_dims(layout), pads, 0.0, name=f"{name}_pad") if any(pads) else data
    s, d = stride, dilation
    if layout == "NCHW":
        n_, c_, h_, w_ = data.shape
        k_, cg, r_, s_ = kernel.shape
        oh = conv_out_size(h_, r_, s, pads[0], pads[2], d)
        ow = conv_out_size(w_, s_, s, pads[1], pads[3], d)
        kg = k_ // groups
        rc, rh, rw = reduce_axis(cg, "rc"), reduce_axis(r_, "rh"), reduce_axis(s_, "rw")
        return compute(
            (n_, k_, oh, ow),
            lambda n, k, y, x: sum_reduce(
                padded[n, (k // kg) * cg + rc.var if groups > 1 else rc.var, y * s + rh.var * d, x * s + rw.var * d]
                * kernel[k, rc.var, rh.var, rw.var], [rc, rh, rw]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "k", "oh", "ow"])
    if layout == "NHWC":
        n_, h_, w_, c_ = data.shape
        r_, s_, cg, k_ = kernel.shape
        oh = conv_out_size(h_, r_, s, pads[0], pads[2], d)
        ow = conv_out_size(w_, s_, s, pads[1], pads[3], d)
        kg = k_ // groups
        rh, rw, rc = reduce_axis(r_, "rh"), reduce_axis(s_, "rw"), reduce_axis(cg, "rc")
        return compute(
            (n_, oh, ow, k_),
            lambda n, y, x, k: sum_reduce(
                padded[n, y * s + rh.var * d, x * s + rw.var * d, (k // kg) * cg + rc.var if groups > 1 else rc.var]
                * kernel[rh.var, rw.var, rc.var, k], [rh, rw, rc]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "oh", "ow", "k"])
    # NCHW[x]c
    n_, icc, h_, w_, ib = data.shape
    occ, _, r_, s_, kib, ob = kernel.shape
    oh = conv_out_size(h_, r_, s, pads[0], pads[2], d)
    ow = conv_out_size(w_, s_, s, pads[1], pads[3], d)
    if groups == 1:
        rcc, rh, rw, rcb = (reduce_axis(icc, "rcc"), reduce_axis(r_, "rh"), reduce_axis(s_, "rw"),
                            reduce_axis(ib, "rcb"))
        return compute(
            (n_, occ, oh, ow, ob),
            lambda n, kc, y, x, kb: sum_reduce(
                padded[n, rcc.var, y * s + rh.var * d, x * s + rw.var * d, rcb.var]
                * kernel[kc, rcc.var, rh.var, rw.var, rcb.var, kb], [rcc, rh, rw, rcb]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "kc", "oh", "ow", "kb"])
    # depthwise: one input channel per output channel, same blocking
    rh, rw = reduce_axis(r_, "rh"), reduce_axis(s_, "rw")
    return compute(
        (n_, occ, oh, ow, ob),
        lambda n, kc, y, x, kb: sum_reduce(
            padded[n, kc, y * s + rh.var * d, x * s + rw.var * d, kb]
            * kernel[kc, 0, rh.var, rw.var, 0, kb], [rh, rw]),
        name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "kc", "oh", "ow", "kb"])


def _hw_dims(layout: str) -> tuple:
    return (1, 2) if layout == "NHWC" else (2, 3)


def conv2d_ref(x: np.ndarray, w: np.ndarray, stride, pads: tuple, dilation=1, groups: int = 1) -> np.ndarray:
    """NCHW x OIHW convolution in float64 through sliding windows and tensordot.

    stride and dilation are one number or an (h, w) pair.
    """
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    x = pad_ref(x.astype(np.float64), (2, 3), pads)
    w = w.astype(np.float64)
    k, cg, r, s = w.shape
    win = np.lib.stride_tricks.sliding_window_view(x, (dh * (r - 1) + 1, dw * (s - 1) + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # n c oh ow r s
    kg = k // groups
    outs = []
    for g in range(groups):
        xs = win[:, g * cg:(g + 1) * cg]
        ws = w[g * kg:(g + 1) * kg]
        outs.append(np.einsum("ncyxrs,kcrs->nkyx", xs, ws, optimize=True))
    return np.concatenate(outs, axis=1)


# ------------------------------------------------------------------ dense

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


# ------------------------------------------------------------------ pooling

def pool2d(data: Tensor, layout: str, kind: str, kernel: tuple, stride: int, pads: tuple,
           count_include_pad: bool = False, name: str = "pool") -> Tensor:
    hd, wd = _hw_dims(layout)
    r_, s_ = kernel
    H, W = data.shape[hd], data.shape[wd]
    oh = conv_out_size(H, r_, stride, pads[0], pads[2], 1)
    ow = conv_out_size(W, s_, stride, pads[1], pads[3], 1)
    fill = float("-inf") if kind == "max" else 0.0
    padded = pad(data, (hd, wd), pads, fill, name=f"{name}_pad") if any(pads) else data
    rh, rw = reduce_axis(r_, "rh"), reduce_axis(s_, "rw")
    shape = list(data.shape)
    shape[hd], shape[wd] = oh, ow
    names = _axis_names(layout)

    def window(*idx):
        src = list(idx)
        src[hd] = idx[hd] * stride + rh.var
        src[wd] = idx[wd] * stride + rw.var
        return padded[tuple(src)]

    reducer = max_reduce if kind == "max" else sum_reduce
    acc = compute(shape, lambda *i: reducer(window(*i), [rh, rw]), name if kind == "max" else f"{name}_sum",
                  tag="pool", inputs=[padded], axis_names=names)
    if kind == "max":
        return acc

    def average(*idx):
        y, x = idx[hd], idx[wd]
        if count_include_pad:
            count = Const(float(r_ * s_))
        else:
            hs, ws = y * stride - pads[0], x * stride - pads[1]
            ch = min_expr(hs + r_, H) - max_expr(hs, 0)
            cw = min_expr(ws + s_, W) - max_expr(ws, 0)
            count = Cast("float32", ch * cw)
        return acc[idx] / count

    return compute(shape, average, name, tag="elemwise", inputs=[acc], axis_names=[f"{a}_" for a in names])


def global_avg_pool(data: Tensor, layout: str, name: str = "gap") -> Tensor:
    hd, wd = _hw_dims(layout)
    H, W = data.shape[hd], data.shape[wd]
    rh, rw = reduce_axis(H, "rh"), reduce_axis(W, "rw")
    shape = list(data.shape)
    shape[hd] = shape[wd] = 1

    def f(*idx):
        src = list(idx)
        src[hd], src[wd] = rh.var, rw.var
        return sum_reduce(data[tuple(src)], [rh, rw])

    acc = compute(shape, f, f"{name}_sum", tag="pool", inputs=[data], axis_names=_axis_names(layout))
    scale = 1.0 / (H * W)
    return compute(shape, lambda *i: acc[i] * Const(scale), name, tag="elemwise", inputs=[acc],
                   axis_names=[f"{a}_" for a in _axis_names(layout)])


def global_avg_pool_ref(x: np.ndarray) -> np.ndarray:
    """NCHW in, (N, C, 1, 1) out."""
    return x.astype(np.float64).mean(axis=(2, 3), keepdims=True)


# FLOPs, one rule per operator kind (workloads and graph nodes both count with these)
def conv2d_flops(out_elements: float, in_channels_per_group: int, r: int, s: int) -> float:
    return 2.0 * out_elements * in_channels_per_group * r * s


def window_flops(out_elements: float, r: int, s: int) -> float:
    """Pooling: one operation per window element per output."""
    return float(out_elements * r * s)


def dense_flops(n: int, c: int, k: int) -> float:
    return 2.0 * n * c * k


def _axis_names(layout: str) -> list:
    if layout == "NCHW":
        return ["n", "c", "h", "w"]
    if layout == "NHWC":
        return ["n", "h", "w", "c"]
    return ["n", "cc", "h", "w", "cb"]


def pool2d_ref(x: np.ndarray, kind: str, kernel: tuple, stride: int, pads: tuple,
               count_include_pad: bool = False) -> np.ndarray:
    fill = -np.inf if kind == "max" else 0.0
    xp = pad_ref(x.astype(np.float64), (2, 3), pads, fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=(2, 3))[:, :, ::stride, ::stride]
    if kind == "max":
        return win.max(axis=(4, 5))
    total = win.sum(axis=(4, 5))
    if count_include_pad:
        return total / (kernel[0] * kernel[1])
    ones = pad_ref(np.ones((1, 1) + x.shape[2:]), (2, 3), pads, 0.0)
    counts = np.lib.stride_tricks.sliding_window_view(ones, kernel, axis=(2, 3))[:, :, ::stride, ::stride]
    return total / counts.sum(axis=(4, 5))


# ------------------------------------------------------------------ elementwise and broadcast

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


def channel_bias_shape(layout: str, k: int, block: int = 0) -> tuple:
    """Shape of a per-output-channel vector broadcast against an activation in `layout`."""
    if layout == "NCHW":
        return (k, 1, 1)
    if layout == "NHWC":
        return (k,)
    return (k // block, 1, 1, block)


# ------------------------------------------------------------------ layout transform

def layout_transform(x: Tensor, src: str, dst: str, name: str = "layout_transform") -> Tensor:
    """Re-lay an activation between NCHW, NHWC and NCHW[x]c (a pure index mapping)."""
    if src == "NCHW":
        n_, c_, h_, w_ = x.shape
    elif src == "NHWC":
        n_, h_, w_, c_ = x.shape
    else:
        n_, cc_, h_, w_, b_ = x.shape
        c_ = cc_ * b_
    sb = block_of(src) and x.shape[4]

    def read(n, c, h, w):
        if src == "NCHW":
            return x[n, c, h, w]
        if src == "NHWC":
            return x[n, h, w, c]
        return x[n, c // sb, h, w, c % sb]

    if dst == "NCHW":
        return compute((n_, c_, h_, w_), lambda n, c, h, w: read(n, c, h, w), name, inputs=[x],
                       axis_names=["n", "c", "h", "w"])
    if dst == "NHWC":
        return compute((n_, h_, w_, c_), lambda n, h, w, c: read(n, c, h, w), name, inputs=[x],
                       axis_names=["n", "h", "w", "c"])
    from .layouts import fit_block
    db = fit_block(c_, block_of(dst))
    return compute((n_, c_ // db, h_, w_, db), lambda n, cc, h, w, cb: read(n, cc * db + cb, h, w), name,
                   inputs=[x], axis_names=["n", "cc", "h", "w", "cb"])


# ------------------------------------------------------------------ activations: one table, TE and NumPy side by side

def _clamp(e, lo: float, hi: float):
    return min_expr(max_expr(e, Const(float(lo))), Const(float(hi)))


# name -> (parameters with defaults, TE element formula, NumPy formula on float64)
ACTIVATIONS = {
    "relu": ({}, lambda e, p: max_expr(e, Const(0.0)), lambda x, p: np.maximum(x, 0.0)),
    "clip": ({"lo": 0.0, "hi": 6.0}, lambda e, p: _clamp(e, p["lo"], p["hi"]),
             lambda x, p: np.clip(x, p["lo"], p["hi"])),
    "sigmoid": ({}, lambda e, p: Const(1.0) / (Const(1.0) + Call("exp", (Const(-1.0) * e,))),
                lambda x, p: 1.0 / (1.0 + np.exp(-x))),
    "hard_sigmoid": ({"alpha": 0.2, "beta": 0.5}, lambda e, p: _clamp(Const(float(p["alpha"])) * e
                                                                      + Const(float(p["beta"])), 0.0, 1.0),
                     lambda x, p: np.clip(p["alpha"] * x + p["beta"], 0.0, 1.0)),
    "hard_swish": ({}, lambda e, p: e * _clamp(e * Const(1.0 / 6.0) + Const(0.5), 0.0, 1.0),
                   lambda x, p: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)),
}


def activation(x: Tensor, kind: str, params: dict | None = None, name: str | None = None) -> Tensor:
    _, fn, _ = ACTIVATIONS[kind]
    p = {**ACTIVATIONS[kind][0], **(params or {})}
    name = name or kind
    return compute(x.shape, lambda *i: fn(x[i], p), name, tag="elemwise", inputs=[x],
                   axis_names=[f"{name}_i{k}" for k in range(x.ndim)])


def activation_ref(x: np.ndarray, kind: str, params: dict | None = None) -> np.ndarray:
    p = {**ACTIVATIONS[kind][0], **(params or {})}
    return ACTIVATIONS[kind][2](x.astype(np.float64), p)


# ------------------------------------------------------------------ general broadcast and data movement

BINARY_FNS = {"add": (lambda u, v: u + v, np.add), "sub": (lambda u, v: u - v, np.subtract),
              "mul": (lambda u, v: u * v, np.multiply), "div": (lambda u, v: u / v, np.divide)}


def broadcast_binary(kind: str, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
    """NumPy broadcasting of two tensors in either direction (trailing dims aligned)."""
    fn = BINARY_FNS[kind][0]
    shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    nd = len(shape)

    def index(t: Tensor, i):
        off = nd - t.ndim
        return tuple(0 if t.shape[k] == 1 and shape[off + k] != 1 else i[off + k] for k in range(t.ndim))

    name = name or kind
    tag = "elemwise" if a.shape == b.shape == shape else "broadcast"
    return compute(shape, lambda *i: fn(a[index(a, i)], b[index(b, i)]), name, tag=tag, inputs=[a, b],
                   axis_names=[f"{name}_i{k}" for k in range(nd)])


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


def reduce_mean(x: Tensor, axes: list, keepdims: bool, name: str = "mean") -> Tensor:
    axes = sorted(a % x.ndim for a in axes)
    raxes = [reduce_axis(x.shape[a], f"{name}_r{a}") for a in axes]
    kept = [k for k in range(x.ndim) if k not in axes]
    shape = [1 if k in axes else x.shape[k] for k in range(x.ndim)] if keepdims else [x.shape[k] for k in kept]
    count = float(np.prod([x.shape[a] for a in axes]))

    def f(*i):
        src, pos = [], 0
        for k in range(x.ndim):
            if k in axes:
                src.append(raxes[axes.index(k)].var)
                if keepdims:
                    pos += 1
            else:
                src.append(i[pos])
                pos += 1
        return sum_reduce(x[tuple(src)], raxes)

    acc = compute(shape, f, f"{name}_sum", tag="reduction", inputs=[x],
                  axis_names=[f"{name}_s{k}" for k in range(len(shape))])
    return compute(shape, lambda *i: acc[i] * Const(1.0 / count), name, tag="elemwise", inputs=[acc],
                   axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def softmax(x: Tensor, axis: int, name: str = "softmax") -> Tensor:
    nd = x.ndim
    red_shape = [1 if k == axis else d for k, d in enumerate(x.shape)]

    def over(r):
        return lambda *i: tuple(r.var if k == axis else i[k] for k in range(nd))

    r1, r2 = reduce_axis(x.shape[axis], f"{name}_r1"), reduce_axis(x.shape[axis], f"{name}_r2")
    mx = compute(red_shape, lambda *i: max_reduce(x[over(r1)(*i)], [r1]), f"{name}_max", tag="reduction",
                 inputs=[x], axis_names=[f"{name}_m{k}" for k in range(nd)])

    def keep(i):
        return tuple(Const(0) if k == axis else i[k] for k in range(nd))

    e = compute(x.shape, lambda *i: Call("exp", (x[i] - mx[keep(i)],)), f"{name}_exp", tag="elemwise",
                inputs=[x, mx], axis_names=[f"{name}_e{k}" for k in range(nd)])
    s = compute(red_shape, lambda *i: sum_reduce(e[over(r2)(*i)], [r2]), f"{name}_sum", tag="reduction",
                inputs=[e], axis_names=[f"{name}_s{k}" for k in range(nd)])
    return compute(x.shape, lambda *i: e[i] / s[keep(i)], name, tag="elemwise", inputs=[e, s],
                   axis_names=[f"{name}_i{k}" for k in range(nd)])
