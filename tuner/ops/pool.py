"""Pooling: max_pool2d, avg_pool2d (windows, strided and padded) and global_avg_pool2d, in NCHW,
NHWC and NCHW[x]c."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..te.expr import Cast, Const, max_expr, min_expr
from ..te.tensor import Tensor, compute, max_reduce, reduce_axis, sum_reduce
from .common import (axis_names, channels_and_space, conv_out_size, data_placeholder, export_as, f32, from_nchw, hw_dims, hw_pair,
                     nchw_dims, nchw_in, nchw_out, one_row, pad_ref, pad_spatial, pads4, pads_param,
                     relayout, to_nchw, unary, window_out)
from .registry import NoTask, OpDef, Pattern, WorkloadDef, WorkloadError, output_elements, register


def pool2d(data: Tensor, layout: str, kind: str, kernel: tuple, stride, pads: tuple,
           count_include_pad: bool = False, name: str = "pool") -> Tensor:
    """Max or average over windows; stride is one number or an (h, w) pair."""
    hd, wd = hw_dims(layout)
    r_, s_ = kernel
    sh, sw = hw_pair(stride)
    H, W = data.shape[hd], data.shape[wd]
    oh = conv_out_size(H, r_, sh, pads[0], pads[2], 1)
    ow = conv_out_size(W, s_, sw, pads[1], pads[3], 1)
    fill = float("-inf") if kind == "max" else 0.0
    padded = pad_spatial(data, (hd, wd), pads, fill, name=f"{name}_pad") if any(pads) else data
    rh, rw = reduce_axis(r_, "rh"), reduce_axis(s_, "rw")
    shape = list(data.shape)
    shape[hd], shape[wd] = oh, ow
    names = axis_names(layout)

    def window(*idx):
        src = list(idx)
        src[hd] = idx[hd] * sh + rh.var
        src[wd] = idx[wd] * sw + rw.var
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
            hs, ws = y * sh - pads[0], x * sw - pads[1]
            ch = min_expr(hs + r_, H) - max_expr(hs, 0)
            cw = min_expr(ws + s_, W) - max_expr(ws, 0)
            count = Cast("float32", ch * cw)
        return acc[idx] / count

    return compute(shape, average, name, tag="elemwise", inputs=[acc], axis_names=[f"{a}_" for a in names])


def pool2d_ref(x: np.ndarray, kind: str, kernel: tuple, stride, pads: tuple,
               count_include_pad: bool = False) -> np.ndarray:
    fill = -np.inf if kind == "max" else 0.0
    sh, sw = hw_pair(stride)
    xp = pad_ref(x.astype(np.float64), (2, 3), pads, fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=(2, 3))[:, :, ::sh, ::sw]
    if kind == "max":
        return win.max(axis=(4, 5))
    total = win.sum(axis=(4, 5))
    if count_include_pad:
        return total / (kernel[0] * kernel[1])
    ones = pad_ref(np.ones((1, 1) + x.shape[2:]), (2, 3), pads, 0.0)
    counts = np.lib.stride_tricks.sliding_window_view(ones, kernel, axis=(2, 3))[:, :, ::sh, ::sw]
    return total / counts.sum(axis=(4, 5))


def window_flops(out_elements: float, r: int, s: int) -> float:
    """Pooling: one operation per window element per output."""
    return float(out_elements * r * s)


def global_avg_pool(data: Tensor, layout: str, name: str = "gap") -> Tensor:
    hd, wd = hw_dims(layout)
    H, W = data.shape[hd], data.shape[wd]
    rh, rw = reduce_axis(H, "rh"), reduce_axis(W, "rw")
    shape = list(data.shape)
    shape[hd] = shape[wd] = 1

    def f(*idx):
        src = list(idx)
        src[hd], src[wd] = rh.var, rw.var
        return sum_reduce(data[tuple(src)], [rh, rw])

    acc = compute(shape, f, f"{name}_sum", tag="pool", inputs=[data], axis_names=axis_names(layout))
    scale = 1.0 / (H * W)
    return compute(shape, lambda *i: acc[i] * Const(scale), name, tag="elemwise", inputs=[acc],
                   axis_names=[f"{a}_" for a in axis_names(layout)])


def global_avg_pool_ref(x: np.ndarray) -> np.ndarray:
    """NCHW in, (N, C, 1, 1) out."""
    return x.astype(np.float64).mean(axis=(2, 3), keepdims=True)


def _pool_out(node):
    x = node.inputs[0]
    a = node.attrs
    lay = a.get("layout", "NCHW")
    n, c, h, w = nchw_dims(x.shape, lay)
    r, s = a["kernel"]
    pt, pl, pb, pr = a["pads"]
    oh = conv_out_size(h, r, a["strides"][0], pt, pb, 1)
    ow = conv_out_size(w, s, a["strides"][1], pl, pr, 1)
    if oh < 1 or ow < 1:
        raise GraphError(f"{node.op} {node.name}: window {r}x{s} does not fit input {h}x{w}")
    return relayout(x.shape, lay, n, c, oh, ow), lay


def _pool_infer(node):
    shape, lay = _pool_out(node)
    return shape, node.inputs[0].dtype, lay


def _pool_eval(node, args):
    a = node.attrs
    lay = a.get("layout", "NCHW")
    y = pool2d_ref(to_nchw(args[0], lay), node.op[:3], tuple(a["kernel"]), tuple(a["strides"]), tuple(a["pads"]),
                          bool(a.get("count_include_pad", 0)))
    return f32(from_nchw(y, lay))


def _pool_te(node, ins, name):
    a = node.attrs
    return pool2d(ins[0], a.get("layout", "NCHW"), node.op[:3], tuple(a["kernel"]), tuple(a["strides"]),
                         tuple(a["pads"]), bool(a.get("count_include_pad", 0)), name=name)


def _pool_flops(node):
    return window_flops(output_elements(node), *node.attrs["kernel"])


def _gap_infer(node):
    x = node.inputs[0]
    lay = node.attrs.get("layout", "NCHW")
    n, c, h, w = nchw_dims(x.shape, lay)
    return relayout(x.shape, lay, n, c, 1, 1), x.dtype, lay


def _gap_eval(node, args):
    lay = node.attrs.get("layout", "NCHW")
    return f32(from_nchw(global_avg_pool_ref(to_nchw(args[0], lay)), lay))


def _onnx_pool(cx, ins, a):
    x = ins[0]
    if len(x.shape) == 3:       # 1-D (SEW squeezes its sequence so): a 2-D pooling over a single row
        n, c, length = x.shape
        rows = cx.add("reshape", [x], {"shape": [n, c, 1, length]}, "_row")
        y = _onnx_pool(cx, [rows], one_row(cx, a))[0]
        return [cx.add("reshape", [y], {"shape": [n, c, y.shape[3]]}, "_1d")]
    if len(x.shape) not in (4, 5):
        raise cx.fail("only 1-D, 2-D and 3-D pooling are supported")
    r = len(x.shape) - 2
    k, strides, dil = cx.window(a, rank=r)
    if any(d != 1 for d in dil):
        raise cx.fail("dilated pooling is not supported")
    pads = cx.pads(a, x.shape[2:], k, strides, [1] * r)
    given = list(pads)
    if a.get("ceil_mode", 0):        # the last window may run past the end pad: more end pad, never counted
        for i, (size, kk, st) in enumerate(zip(x.shape[2:], k, strides)):
            lo, hi = pads[i], pads[i + r]
            out = -(-(size + lo + hi - kk) // st) + 1
            out -= (out - 1) * st >= size + lo             # a window starting in the end pad is dropped
            extra = (out - 1) * st + kk - (size + lo + hi)
            if extra > 0 and cx.op_type == "AveragePool" and a.get("count_include_pad", 0):
                raise cx.fail("ceil_mode=1 with count_include_pad=1 changes the output size here; "
                              "re-export with count_include_pad=0 or ceil_mode=0")
            pads[i + r] += max(extra, 0)
    if r == 3:                       # MaxPool3d, AvgPool3d: over depth taps of 2-D pools
        from .window3d import pool3d
        return [pool3d(cx, x, "max" if cx.op_type == "MaxPool" else "avg", list(k), list(strides), pads,
                       a.get("count_include_pad", 0), given)]
    attrs = {"kernel": list(k), "strides": list(strides), "pads": pads, "layout": "NCHW"}
    if cx.op_type == "AveragePool":
        attrs["count_include_pad"] = a.get("count_include_pad", 0)
    return [cx.add("max_pool2d" if cx.op_type == "MaxPool" else "avg_pool2d", [x], attrs)]


def _onnx_global_avg_pool(cx, ins, a):
    """GlobalAveragePool; over other than two axes (a clip's depth, height and width), over the
    axes laid out as one column."""
    x = ins[0]
    if len(x.shape) == 4:
        return [cx.add("global_avg_pool2d", [x], {"layout": "NCHW"})]
    n, c, rest = channels_and_space(cx, x)
    col = cx.add("reshape", [x], {"shape": [n, c, rest, 1]}, "_column")
    y = cx.add("global_avg_pool2d", [col], {"layout": "NCHW"}, "_pool")
    return [cx.add("reshape", [y], {"shape": [n, c] + [1] * (len(x.shape) - 2)})]


def _onnx_lrn(cx, ins, a):
    """LRN (AlexNet, CaffeNet, GoogLeNet as Caffe trained them): x / (bias + alpha / size * the sum of
    x^2 over `size` channels around each)^beta; that sum over size is an average pool of a
    (size, 1) window, pads counted, over the channels laid out as the rows of one image."""
    x = ins[0]
    size = a.get("size")
    if not isinstance(size, int) or size < 1:
        raise cx.fail(f"size must be a positive integer, got {size}")
    n, c, rest = channels_and_space(cx, x)
    sq = cx.add("mul", [x, x], {}, "_square")
    rows = cx.add("reshape", [sq], {"shape": [n, 1, c, rest]}, "_channel_rows")
    lo = (size - 1) // 2
    mean = cx.add("avg_pool2d", [rows], {"kernel": [size, 1], "strides": [1, 1], "pads": [lo, 0, size - 1 - lo, 0],
                                         "layout": "NCHW", "count_include_pad": 1}, "_window_mean")
    base = cx.add("add", [cx.add("mul", [mean, cx.constant(np.array(a.get("alpha", 1e-4), np.float32), "_alpha")],
                                 {}, "_scaled"), cx.constant(np.array(a.get("bias", 1.0), np.float32), "_bias")],
                  {}, "_base")
    den = cx.add("pow", [base], {"exponent": float(a.get("beta", 0.75))}, "_pow")
    return [cx.add("div", [x, cx.add("reshape", [den], {"shape": list(x.shape)}, "_den")], {})]


def _pool_attrs(n):
    a = n.attrs
    extra = {"count_include_pad": a.get("count_include_pad", 0)} if n.op == "avg_pool2d" else {}
    return {"kernel_shape": a["kernel"], "strides": a["strides"], "pads": a["pads"], **extra}


def _pool_task(n):
    a, lay = n.attrs, n.attrs.get("layout", "NCHW")
    if a["strides"][0] != a["strides"][1]:
        raise NoTask(f"{n.op} with different strides per axis")
    nn, c, h, w = nchw_dims(n.inputs[0].shape, lay)
    extra = {"count_include_pad": int(a.get("count_include_pad", 0))} if n.op == "avg_pool2d" else {}
    return dict(N=nn, C=c, H=h, W=w, R=a["kernel"][0], S=a["kernel"][1], stride=a["strides"][0],
                pad=pads_param(a["pads"]), **extra), lay


def _gap_task(n):
    lay = n.attrs.get("layout", "NCHW")
    nn, c, h, w = nchw_dims(n.inputs[0].shape, lay)
    return dict(N=nn, C=c, H=h, W=w), lay


def _pool_build(wl):
    p, data = wl.p, data_placeholder(wl)
    return [data], pool2d(data, wl.layout, wl.op[:3], (p["R"], p["S"]), p["stride"], pads4(p["pad"]),
                              bool(p.get("count_include_pad", 0)), name=wl.logged_op)


def _pool_ref(wl, arrays: list):
    p = wl.p
    return nchw_out(wl, pool2d_ref(nchw_in(wl, arrays), wl.op[:3], (p["R"], p["S"]), p["stride"],
                                        pads4(p["pad"]), bool(p.get("count_include_pad", 0))))


def _pool_check(wl):
    p = wl.p
    if min(window_out(p)) < 1:
        raise WorkloadError(f"{wl.op}: window {p['R']}x{p['S']} does not fit input {p['H']}x{p['W']}")


def _pool_wl_flops(wl):
    p = wl.p
    oh, ow = window_out(p)
    return window_flops(p["N"] * p["C"] * oh * ow, p["R"], p["S"])


_WINDOW = ("C", "H", "W", "R", "S")

register(
    OpDef(name="max_pool2d", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_pool_infer, evaluate=_pool_eval, te=_pool_te,
          flops=_pool_flops, onnx_in={"MaxPool": _onnx_pool}, onnx_out=export_as("MaxPool", _pool_attrs), task=_pool_task),
    OpDef(name="avg_pool2d", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_pool_infer, evaluate=_pool_eval, te=_pool_te,
          flops=_pool_flops, onnx_in={"AveragePool": _onnx_pool, "LRN": _onnx_lrn}, onnx_out=export_as("AveragePool", _pool_attrs), task=_pool_task),
    OpDef(name="global_avg_pool2d", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_gap_infer, evaluate=_gap_eval,
          te=lambda n, ins, name: global_avg_pool(ins[0], n.attrs.get("layout", "NCHW"), name),
          flops=lambda n: float(np.prod(n.inputs[0].shape)),
          onnx_in={"GlobalAveragePool": _onnx_global_avg_pool},
          onnx_out=export_as("GlobalAveragePool"), task=_gap_task),
    WorkloadDef(name="max_pool2d", required=_WINDOW, defaults=dict(N=1, stride=1, pad=0), build=_pool_build,
                reference=_pool_ref, flops=_pool_wl_flops, check=_pool_check,
                example="max_pool2d:C=64,H=112,W=112,R=3,S=3,stride=2,pad=1", key_name="maxpool"),
    WorkloadDef(name="avg_pool2d", required=_WINDOW, defaults=dict(N=1, stride=1, pad=0, count_include_pad=0),
                build=_pool_build, reference=_pool_ref, flops=_pool_wl_flops, check=_pool_check,
                example="avg_pool2d:C=64,H=56,W=56,R=3,S=3,stride=1,pad=1", key_name="avgpool"),
    WorkloadDef(name="global_avg_pool2d", required=("C", "H", "W"), defaults=dict(N=1), key_name="globalavgpool",
                build=unary(lambda d, wl: global_avg_pool(d, wl.layout)),
                reference=lambda wl, a: nchw_out(wl, global_avg_pool_ref(nchw_in(wl, a))),
                example="global_avg_pool2d:C=2048,H=7,W=7"),
)
