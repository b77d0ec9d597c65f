"""What the operator families share: layout arithmetic, NumPy and ONNX helpers (graph side), the
spec helpers of kernel-side workloads, and the spatial pad of a tensor expression."""
from __future__ import annotations

import numpy as np

from ..te import layouts as L
from ..te.expr import Const, all_of, select
from ..te.tensor import Tensor, compute, placeholder
from .registry import Unsupported, WorkloadError


def conv_out_size(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


def tap_reads(size: int, out: int, k: int, stride: int, dilation: int, pad_lo: int) -> np.ndarray:
    """(out, k) booleans along one axis of a window: whether output o's tap r reads the input, not
    its padding."""
    at = np.arange(out)[:, None] * stride + np.arange(k)[None, :] * dilation - pad_lo
    return (at >= 0) & (at < size)


def pad_spatial(data: Tensor, spatial_dims: tuple, pads: tuple, value: float = 0.0, name: str = "pad") -> Tensor:
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


def axis_names(layout: str) -> list:
    if layout == "NCHW":
        return ["n", "c", "h", "w"]
    if layout == "NHWC":
        return ["n", "h", "w", "c"]
    return ["n", "cc", "h", "w", "cb"]


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


def relayout(shape, lay, n, c, h, w):
    if lay == "NCHW" or lay == "":
        return (n, c, h, w)
    if lay == "NHWC":
        return (n, h, w, c)
    return (n, shape[1], h, w, shape[4])


class Empty:
    """An ONNX value with no element (torch.roll by 0 slices x[:0]): no node computes it; a Concat
    leaves it out, anything else that reads it is refused at import."""

    def __init__(self, shape, dtype: str):
        self.shape, self.dtype, self.is_const = tuple(shape), dtype, False


def channels_and_space(cx, x) -> tuple:
    """(N, C, the spatial elements) of a pooling's or normalisation's input: a channel axis and at
    least one spatial axis, else a one-line error naming the node."""
    if len(x.shape) < 3:
        raise cx.fail(f"the input must have a channel axis and at least one spatial axis, got shape {list(x.shape)}")
    return x.shape[0], x.shape[1], int(np.prod(x.shape[2:]))


def unsupported(node, why: str):
    raise Unsupported(f"{node.op} node {node.name!r}: {why}; the kernel library cannot compile it")


def f32(y) -> np.ndarray:
    return np.asarray(y).astype(np.float32)


def to_nchw(x, lay):
    return L.act_to_nchw(x, lay) if lay not in ("", "NCHW") else x


def from_nchw(x, lay):
    return L.act_from_nchw(x, lay) if lay not in ("", "NCHW") else x


def broadcast_index(t_shape: tuple, shape: tuple, i: tuple) -> tuple:
    """The index into a tensor of `t_shape` broadcast to `shape` (NumPy: trailing dims aligned) at `i`."""
    off = len(shape) - len(t_shape)
    return tuple(0 if d == 1 and shape[off + k] != 1 else i[off + k] for k, d in enumerate(t_shape))


def same(node):
    x = node.inputs[0]
    return x.shape, x.dtype, x.layout


def pads_param(pads) -> object:
    pads = tuple(pads)
    return pads if len(set(pads)) > 1 else pads[0]


def onnx_plain(op: str, attrs=lambda ins, a: {}):
    """Importer of an ONNX op that maps to `op` on all its inputs with attributes `attrs(ins, a)`."""
    return lambda cx, ins, a: [cx.add(op, ins, attrs(ins, a))]


def export_as(op_type: str, attrs=lambda n: {}):
    """Exporter to one ONNX node of `op_type` with attributes `attrs(node)`."""
    return lambda ex, n, ins: ex.emit(n, op_type, ins, **attrs(n))


def pads4(p) -> tuple:
    t = (p,) if isinstance(p, int) else tuple(p)
    if len(t) not in (1, 2, 4) or not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
        raise WorkloadError(f"pad must be one number, 'h.w' or 'top.left.bottom.right', got {p}")
    if min(t) < 0:
        raise WorkloadError(f"pad must not be negative, got {'.'.join(map(str, t))}")
    return t * 4 if len(t) == 1 else t * 2 if len(t) == 2 else t


def window_out(p: dict, dilation: int = 1) -> tuple:
    t, lft, b, r = pads4(p["pad"])
    return (conv_out_size(p["H"], p["R"], p["stride"], t, b, dilation),
            conv_out_size(p["W"], p["S"], p["stride"], lft, r, dilation))


def data_placeholder(wl):
    p = wl.p
    return placeholder(L.act_shape(wl.layout, p["N"], p["C"], p["H"], p["W"], wl.blocks[0] or None), "data")


def nchw_in(wl, arrays: list) -> np.ndarray:
    return L.act_to_nchw(arrays[0], wl.layout).astype(np.float64)


def nchw_out(wl, y: np.ndarray) -> np.ndarray:
    return L.act_from_nchw(y, wl.layout, wl.blocks[0] or None)


def unary(te_fn):
    """build for a one-input workload: te_fn(data placeholder, Workload) -> output."""
    def build(wl):
        data = data_placeholder(wl)
        return [data], te_fn(data, wl)
    return build


def hw_pair(v) -> tuple:
    """A stride or dilation given as one number or an (h, w) pair, as the pair."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def hw_dims(layout: str) -> tuple:
    return (1, 2) if layout == "NHWC" else (2, 3)


def one_row(cx, a: dict) -> dict:
    """A 1-D window's attributes as a 2-D one over a single row: the row's stride and dilation
    repeated (over one row with a one-high kernel they change nothing), no pads above or below."""
    def one(attr, default):
        v = a.get(attr, default)
        if not isinstance(v, (list, tuple)) or len(v) != len(default):
            raise cx.fail(f"{attr} of a 1-D window must have {len(default)} values, got {v}")
        return list(v)
    out = dict(a, strides=one("strides", [1]) * 2, dilations=one("dilations", [1]) * 2)
    if "kernel_shape" in a:
        out["kernel_shape"] = [1] + one("kernel_shape", [1])
    if "pads" in a:
        p0, p1 = one("pads", [0, 0])
        out["pads"] = [0, p0, 0, p1]
    return out
