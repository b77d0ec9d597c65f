"""resize: ONNX Resize (and Upsample) in nearest, linear and cubic modes, as segmentation heads, FPNs,
UNets and MobileViT write it. The importer turns every resized axis into constant tables, computed
as ONNX Runtime computes its coordinates in float32: per output position, the input positions it
reads (1 for nearest, 2 for linear, 4 for cubic) and their weights (none for nearest). The kernel
reads its input through them, so one definition serves every mode and coordinate rule, and an
axis's tables do not depend on the others.

Nearest, as ONNX Runtime's CPU kernel picks: the float32 coordinate counts as a half (a tie, which
round_prefer_floor takes down and round_prefer_ceil up) when it lies within 1e-6 of one, so a
coordinate that is a half in exact arithmetic but an ulp or two off in float32 still ties; any
other rounds to the nearer whole number; floor and ceil take the coordinate as it is. An axis
whose scale is exactly 1 maps each position to itself, and a resize that changes no length copies
its input whatever the scales say. Resize before opset 11 and Upsample floor the coordinate when
the axis grows and ceil it when it shrinks."""
from __future__ import annotations

import math

import numpy as np

from ..errors import GraphError
from ..te.expr import Cast, Cmp, Const, FloorMod, all_of, max_expr, min_expr, select
from ..te.tensor import Tensor, compute
from .registry import OpDef, Pattern, output_elements, register

MAX_LENGTH = 1 << 20        # an axis a resize gives; a hostile `sizes` is refused before its tables are built


def _origin(mode: str, out_len: int, in_len: int, scale: np.float32) -> np.ndarray:
    """The input coordinate of each output position (float32), per coordinate_transformation_mode."""
    x = np.arange(out_len, dtype=np.float32)
    half, one = np.float32(0.5), np.float32(1)
    if mode == "half_pixel":
        return (x + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (x + half) / scale - half if out_len > 1 else np.zeros(out_len, np.float32)
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        return x * np.float32(in_len - 1) / np.float32(out_len - 1) if out_len > 1 else np.zeros(out_len, np.float32)
    if mode == "half_pixel_symmetric":       # its offset in float32, the rest in double, as ONNX Runtime
        offset = np.float32(in_len) / np.float32(2) * (one - np.float32(out_len) / (scale * np.float32(in_len)))
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(np.float32)
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    raise ValueError(f"coordinate_transformation_mode {mode!r} is not supported (half_pixel, pytorch_half_pixel, "
                     "asymmetric, align_corners, half_pixel_symmetric, tf_half_pixel_for_nn are)")


TIE = 1e-6      # how near a half (absolute) a float32 coordinate may lie and still count as the half


def _round(v: np.ndarray, up: bool) -> np.ndarray:
    """Nearest whole number to each float32 coordinate; one within TIE of a half takes the half's
    upper neighbour if `up`, else its lower one."""
    v = v.astype(np.float64)                    # exact: every float32 is a double, and so is v - floor(v)
    lo = np.floor(v)
    tie = np.abs(v - lo - 0.5) <= TIE
    return np.where(tie, lo + 1 if up else lo, np.rint(v))


_NEAREST = {"round_prefer_floor": lambda v: _round(v, False), "round_prefer_ceil": lambda v: _round(v, True),
            "floor": np.floor, "ceil": np.ceil}


def _cubic(s: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 from the floor, for fraction s."""
    d = np.stack([s + 1, s, 1 - s, 2 - s], axis=-1)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, far)


def tables(mode: str, coords: str, nearest: str, out_len: int, in_len: int, scale: float, cubic_a: float = -0.75,
           exclude_outside: bool = False) -> list:
    """One axis: [source indices] (nearest) or [source indices, their weights], each (out_len, taps):
    1 tap (nearest), 2 (linear), 4 (cubic), indices clamped into the axis (the edge repeated)."""
    v = _origin(coords, out_len, in_len, np.float32(scale))
    if mode == "nearest":
        if nearest not in _NEAREST:
            raise ValueError(f"nearest_mode {nearest!r} is not supported ({', '.join(_NEAREST)} are)")
        return [np.clip(_NEAREST[nearest](v), 0, in_len - 1).astype(np.int64)[:, None]]
    if mode == "linear":
        v = np.clip(v, 0, in_len - 1)
        lo = np.floor(v)
        f = (v - lo).astype(np.float32)
        idx, w = lo[:, None] + np.arange(2), np.stack([np.float32(1) - f, f], axis=-1)
    else:
        lo = np.floor(v)
        idx, w = lo[:, None] + np.arange(-1, 3), _cubic((v - lo).astype(np.float64), cubic_a)
        if exclude_outside:
            w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
            w = w / w.sum(axis=1, keepdims=True)
    return [np.clip(idx, 0, in_len - 1).astype(np.int64), w.astype(np.float32)]


def resize(x: Tensor, per_axis: list, axes: list, name: str = "resize") -> Tensor:
    """The sum over every resized axis's taps of x at the tapped indices times the taps' weights
    (`per_axis[k]`: [indices] or [indices, weights] for `axes[k]`)."""
    shape = list(x.shape)
    for ax, t in zip(axes, per_axis):
        shape[ax] = t[0].shape[0]

    def f(*i):
        corners = [(list(i), None)]
        for ax, t in zip(axes, per_axis):
            pos = i[ax]
            taps = [(Cast("int32", t[0][pos, Const(k)]), t[1][pos, Const(k)] if len(t) > 1 else None)
                    for k in range(t[0].shape[1])]
            corners = [(idx[:ax] + [j] + idx[ax + 1:], v if w is None else w if v is None else w * v)
                       for idx, w in corners for j, v in taps]
        terms = [x[tuple(idx)] if w is None else x[tuple(idx)] * w for idx, w in corners]
        return sum(terms[1:], start=terms[0])

    return compute(tuple(shape), f, name, inputs=[x] + [a for t in per_axis for a in t],
                   axis_names=[f"{name}_i{k}" for k in range(len(shape))])


def _per_axis(tabs: list, mode: str) -> list:
    """The tables after the input, grouped by axis."""
    k = 1 if mode == "nearest" else 2
    return [tabs[j:j + k] for j in range(0, len(tabs), k)]


def _resize_infer(node):
    x, a = node.inputs[0], node.attrs
    per = _per_axis(node.inputs[1:], a["mode"])
    if len(per) != len(a["axes"]) or any(t.shape != per_ax[0].shape or len(t.shape) != 2 for per_ax in per
                                         for t in per_ax):
        raise GraphError(f"resize {node.name}: one set of tables (outputs x taps) per resized axis is required")
    shape = list(x.shape)
    for ax, t in zip(a["axes"], per):
        shape[ax] = t[0].shape[0]
    return tuple(shape), x.dtype, x.layout


def _resize_eval(node, args):
    x, mode = args[0], node.attrs["mode"]
    per = _per_axis(args[1:], mode)
    y = x.astype(np.float64)
    for ax, t in zip(node.attrs["axes"], per):
        idx = t[0].astype(np.int64)
        w = t[1].astype(np.float64) if len(t) > 1 else np.ones(idx.shape)
        y = sum(np.take(y, idx[:, k], axis=ax) * w[:, k].reshape([-1 if d == ax else 1 for d in range(y.ndim)])
                for k in range(idx.shape[1]))
    return y.astype(x.dtype)


def _onnx_resize(cx, ins, a):
    x = ins[0]
    rank = len(x.shape)
    mode = a.get("mode", "nearest")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("nearest", "linear", "cubic"):
        raise cx.fail(f"mode {mode!r} is not supported (nearest, linear and cubic are)")
    if mode != "nearest" and x.dtype != "float32":
        raise cx.fail(f"a {mode} resize of a {x.dtype} tensor is not supported (of float32 it is)")
    legacy = cx.op_type == "Upsample" or cx.opset < 11     # asymmetric; floor up, ceil down (per axis)
    coords = "asymmetric" if legacy else a.get("coordinate_transformation_mode", "half_pixel")
    nearest = a.get("nearest_mode", "round_prefer_floor")
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise cx.fail(f"keep_aspect_ratio_policy {a['keep_aspect_ratio_policy']!r} is not supported (stretch is)")
    axes = [ax % rank for ax in a.get("axes", range(rank))]
    given = list(ins[1:])
    if cx.op_type == "Upsample" or cx.opset < 11:      # (X, scales), or scales an attribute (opset 7)
        scales, sizes = given[0] if given else cx.constant(np.asarray(a.get("scales", []), np.float32), "_scales"), None
    else:                                              # (X, roi, scales, sizes)
        scales = given[1] if len(given) > 1 else None
        sizes = given[2] if len(given) > 2 else None
    scales = None if scales is None or np.size(cx.const(scales, "the scales")) == 0 else \
        np.asarray(cx.const(scales, "the scales"), np.float32).reshape(-1)
    sizes = None if sizes is None or np.size(cx.const(sizes, "the sizes")) == 0 else \
        np.asarray(cx.const(sizes, "the sizes"), np.int64).reshape(-1)
    if (scales is None) == (sizes is None):
        raise cx.fail("exactly one of scales and sizes must be given")
    if len(scales if sizes is None else sizes) != len(axes):
        raise cx.fail(f"{len(scales if sizes is None else sizes)} scales or sizes for {len(axes)} axes")
    per = []
    for k, ax in enumerate(axes):
        n = x.shape[ax]
        if sizes is None:
            scale = float(scales[k])
            if not scale > 0:
                raise cx.fail(f"scale {scale} of axis {ax} must be positive")
            m = int(math.floor(n * np.float32(scale)))
        else:
            m = int(sizes[k])
            scale = float(np.float32(m) / np.float32(n)) if n else 1.0
        if m < 1:
            raise cx.fail(f"axis {ax} of length {n} would become {m}")
        if m > MAX_LENGTH:
            raise cx.fail(f"axis {ax} of length {n} would become {m}, over the {MAX_LENGTH} a resize may give")
        per.append((ax, n, m, scale))
    if all(m == n for _, n, m, _ in per):      # no length changes: the input as it is, whatever the scales
        return [x]
    out_axes, tabs = [], []
    for ax, n, m, scale in per:
        if scale == 1.0:                        # (then m == n) each position reads itself
            continue
        if a.get("antialias", 0) and m < n and mode != "nearest":
            raise cx.fail("antialiased downscaling is not supported")
        rule = ("ceil" if scale < 1 else "floor") if legacy else nearest
        try:
            t = tables(mode, coords, rule, m, n, scale, float(a.get("cubic_coeff_a", -0.75)),
                       bool(a.get("exclude_outside", 0)))
        except ValueError as e:
            raise cx.fail(str(e)) from None
        out_axes.append(ax)
        tabs += [cx.constant(v, f"_t{ax}_{j}") for j, v in enumerate(t)]
    if not out_axes:
        return [x]
    return [cx.add("resize", [x] + tabs, {"axes": out_axes, "mode": "nearest" if mode == "nearest" else "weighted"})]



# ---------------------------------------------------------------- grid_sample
# ONNX GridSample over 4-D NCHW: each output pixel reads the input at the (x, y) its grid entry
# gives in [-1, 1], unnormalised by align_corners; bilinear mixes the 4 pixels around it (outside
# ones read 0 with `zeros`, the coordinate clamped into the image first with `border`), nearest
# takes the one it rounds to (halves to even, as nearbyint). Deformable DETR's and RT-DETR's
# cross-attention, spatial transformers.
GRID_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest"}
GRID_PADDINGS = ("zeros", "border")


def _unnormalised(g, size: int, align: bool, padding: str):
    u = (g + Const(1.0)) * Const((size - 1) / 2.0) if align else ((g + Const(1.0)) * Const(float(size)) - Const(1.0)) * Const(0.5)
    lo, hi = (0.0, size - 1.0) if padding == "border" else (-2.0, size + 1.0)   # beyond: zeros either way
    return _clamped(u, lo, hi)           # also keeps the int conversion defined


def _clamped(e, lo: int, hi: int):
    return min_expr(max_expr(e, Const(lo)), Const(hi))


def _nearest(i0, f):
    """The position u = i0 + f rounds to, halves to even (nearbyint)."""
    return i0 + select(Cmp("==", f, Const(0.5)), FloorMod(i0, Const(2)), select(f > Const(0.5), Const(1), Const(0)))


def _floor(u):
    """(floor(u) as an int, u - floor(u)) of a float in range."""
    t = Cast("int32", u)
    f = select(u < Cast("float32", t), t - Const(1), t)
    return f, u - Cast("float32", f)


def grid_sample(x: Tensor, grid: Tensor, mode: str, padding: str, align: bool, name: str = "grid_sample") -> Tensor:
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape

    def f(b, ch, i, j):
        ux = _unnormalised(grid[b, i, j, Const(0)], w, align, padding)
        uy = _unnormalised(grid[b, i, j, Const(1)], h, align, padding)
        x0, fx = _floor(ux)
        y0, fy = _floor(uy)

        def pixel(yy, xx):
            inside = all_of(Const(0) <= yy, yy < Const(h), Const(0) <= xx, xx < Const(w))
            return select(inside, x[b, ch, _clamped(yy, 0, h - 1), _clamped(xx, 0, w - 1)], Const(0.0))
        if mode == "nearest":
            return pixel(_nearest(y0, fy), _nearest(x0, fx))
        gx, gy = Const(1.0) - fx, Const(1.0) - fy
        return (gy * (gx * pixel(y0, x0) + fx * pixel(y0, x0 + Const(1)))
                + fy * (gx * pixel(y0 + Const(1), x0) + fx * pixel(y0 + Const(1), x0 + Const(1))))

    return compute((n, c, ho, wo), f, name, inputs=[x, grid], axis_names=[f"{name}_i{k}" for k in range(4)])


def grid_sample_ref(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    n, c, h, w = x.shape
    x, grid = x.astype(np.float64), grid.astype(np.float64)

    def unnorm(g, size):
        u = (g + 1) * (size - 1) / 2 if align else ((g + 1) * size - 1) / 2
        return np.clip(u, 0, size - 1) if padding == "border" else u

    ux, uy = unnorm(grid[..., 0], w), unnorm(grid[..., 1], h)        # [n, ho, wo]
    bi = np.arange(n)[:, None, None]

    def pixel(yy, xx):                                                # [n, c, ho, wo]
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        v = x[bi, :, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]    # [n, ho, wo, c]
        return np.where(inside[..., None], v, 0.0).transpose(0, 3, 1, 2)
    if mode == "nearest":
        return pixel(np.rint(uy).astype(np.int64), np.rint(ux).astype(np.int64)).astype(np.float32)
    x0, y0 = np.floor(ux), np.floor(uy)
    fx, fy = (ux - x0)[:, None], (uy - y0)[:, None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    out = ((1 - fy) * ((1 - fx) * pixel(y0, x0) + fx * pixel(y0, x0 + 1))
           + fy * ((1 - fx) * pixel(y0 + 1, x0) + fx * pixel(y0 + 1, x0 + 1)))
    return out.astype(np.float32)


def _grid_infer(node):
    x, grid = node.inputs
    if len(x.shape) != 4 or len(grid.shape) != 4 or grid.shape[0] != x.shape[0] or grid.shape[3] != 2:
        raise GraphError(f"grid_sample {node.name}: input {list(x.shape)} and grid {list(grid.shape)} must be "
                         f"[N, C, H, W] and [N, H_out, W_out, 2]")
    return (x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), x.dtype, ""


def _grid_eval(node, args):
    a = node.attrs
    return grid_sample_ref(args[0], args[1], a["mode"], a["padding"], bool(a["align_corners"]))


def _onnx_grid_sample(cx, ins, a):
    mode, padding = a.get("mode", "bilinear"), a.get("padding_mode", "zeros")      # the frontend decodes strings
    if mode not in GRID_MODES:
        raise cx.fail(f"mode {mode!r} is not supported (bilinear or nearest)")
    if padding not in GRID_PADDINGS:
        raise cx.fail(f"padding_mode {padding!r} is not supported (zeros or border)")
    if len(ins[0].shape) != 4:
        raise cx.fail(f"input {list(ins[0].shape)} is not 4-D (only 2-D sampling is supported)")
    return [cx.add("grid_sample", ins[:2], {"mode": GRID_MODES[mode], "padding": padding,
                                           "align_corners": int(a.get("align_corners", 0))})]


def _export_grid_sample(ex, n, ins):
    ex.emit(n, "GridSample", ins, mode=n.attrs["mode"], padding_mode=n.attrs["padding"],
            align_corners=n.attrs["align_corners"])


register(
    OpDef(name="resize", pattern=Pattern.INJECTIVE, infer=_resize_infer, evaluate=_resize_eval, integers=True,
          te=lambda n, ins, name: resize(ins[0], _per_axis(ins[1:], n.attrs["mode"]), n.attrs["axes"], name),
          flops=lambda n: float(output_elements(n)) * 2 * math.prod(t[0].shape[1] for t in _per_axis(n.inputs[1:],
                                                                                                     n.attrs["mode"])),
          onnx_in={"Resize": _onnx_resize, "Upsample": _onnx_resize}),
    OpDef(name="grid_sample", pattern=Pattern.OPAQUE, infer=_grid_infer, evaluate=_grid_eval,
          te=lambda n, ins, name: grid_sample(ins[0], ins[1], n.attrs["mode"], n.attrs["padding"],
                                              bool(n.attrs["align_corners"]), name),
          flops=lambda n: 8.0 * output_elements(n), onnx_in={"GridSample": _onnx_grid_sample},
          onnx_out=_export_grid_sample),
)
