"""conv2d: 2-D convolution in NCHW (OIHW weights), NHWC (HWIO) or NCHW[x]c (OIHW[i]i[o]o), strided,
padded, dilated, grouped and depthwise, with its fused epilogue."""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..te import layouts as L
from ..te.tensor import Tensor, compute, placeholder, reduce_axis, sum_reduce
from .common import (conv_out_size, data_placeholder, export_as, f32, from_nchw, hw_dims, hw_pair, kernel_layout,
                     nchw_dims, nchw_in, one_row, pad_ref, pad_spatial, pads4, pads_param, tap_reads, to_nchw, unsupported,
                     window_out)
from .elementwise import epilogue, epilogue_ref
from .registry import NoTask, OpDef, Pattern, WorkloadDef, WorkloadError, output_elements, register


def conv2d(data: Tensor, kernel: Tensor, layout: str, stride, pads: tuple,
           dilation=1, groups: int = 1, name: str = "conv") -> Tensor:
    """conv2d in NCHW (OIHW weights), NHWC (HWIO) or NCHW[x]c (OIHW[i]i[o]o); stride and dilation
    are one number or an (h, w) pair."""
    padded = pad_spatial(data, hw_dims(layout), pads, 0.0, name=f"{name}_pad") if any(pads) else data
    (sh, sw), (dh, dw) = hw_pair(stride), hw_pair(dilation)
    if layout == "NCHW":
        n_, c_, h_, w_ = data.shape
        k_, cg, r_, s_ = kernel.shape
        oh = conv_out_size(h_, r_, sh, pads[0], pads[2], dh)
        ow = conv_out_size(w_, s_, sw, pads[1], pads[3], dw)
        kg = k_ // groups
        rc, rh, rw = reduce_axis(cg, "rc"), reduce_axis(r_, "rh"), reduce_axis(s_, "rw")
        return compute(
            (n_, k_, oh, ow),
            lambda n, k, y, x: sum_reduce(
                padded[n, (k // kg) * cg + rc.var if groups > 1 else rc.var, y * sh + rh.var * dh, x * sw + rw.var * dw]
                * kernel[k, rc.var, rh.var, rw.var], [rc, rh, rw]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "k", "oh", "ow"])
    if layout == "NHWC":
        n_, h_, w_, c_ = data.shape
        r_, s_, cg, k_ = kernel.shape
        oh = conv_out_size(h_, r_, sh, pads[0], pads[2], dh)
        ow = conv_out_size(w_, s_, sw, pads[1], pads[3], dw)
        kg = k_ // groups
        rh, rw, rc = reduce_axis(r_, "rh"), reduce_axis(s_, "rw"), reduce_axis(cg, "rc")
        return compute(
            (n_, oh, ow, k_),
            lambda n, y, x, k: sum_reduce(
                padded[n, y * sh + rh.var * dh, x * sw + rw.var * dw, (k // kg) * cg + rc.var if groups > 1 else rc.var]
                * kernel[rh.var, rw.var, rc.var, k], [rh, rw, rc]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "oh", "ow", "k"])
    # NCHW[x]c
    n_, icc, h_, w_, ib = data.shape
    occ, _, r_, s_, kib, ob = kernel.shape
    oh = conv_out_size(h_, r_, sh, pads[0], pads[2], dh)
    ow = conv_out_size(w_, s_, sw, pads[1], pads[3], dw)
    if groups == 1:
        rcc, rh, rw, rcb = (reduce_axis(icc, "rcc"), reduce_axis(r_, "rh"), reduce_axis(s_, "rw"),
                            reduce_axis(ib, "rcb"))
        return compute(
            (n_, occ, oh, ow, ob),
            lambda n, kc, y, x, kb: sum_reduce(
                padded[n, rcc.var, y * sh + rh.var * dh, x * sw + rw.var * dw, rcb.var]
                * kernel[kc, rcc.var, rh.var, rw.var, rcb.var, kb], [rcc, rh, rw, rcb]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "kc", "oh", "ow", "kb"])
    if 1 < kib < ib:  # grouped, whole groups in each block: output lane kb reads its group's lanes of block kc
        rh, rw, rcb = reduce_axis(r_, "rh"), reduce_axis(s_, "rw"), reduce_axis(kib, "rcb")
        return compute(
            (n_, occ, oh, ow, ob),
            lambda n, kc, y, x, kb: sum_reduce(
                padded[n, kc, y * sh + rh.var * dh, x * sw + rw.var * dw, (kb // kib) * kib + rcb.var]
                * kernel[kc, 0, rh.var, rw.var, rcb.var, kb], [rh, rw, rcb]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "kc", "oh", "ow", "kb"])
    if kib > 1:       # grouped, each block in one group: output block kc reads its group's input blocks
        per_out, per_in = occ // groups, kernel.shape[1]     # blocks per group, out and in
        rcc, rh, rw, rcb = (reduce_axis(per_in, "rcc"), reduce_axis(r_, "rh"), reduce_axis(s_, "rw"),
                            reduce_axis(kib, "rcb"))
        return compute(
            (n_, occ, oh, ow, ob),
            lambda n, kc, y, x, kb: sum_reduce(
                padded[n, (kc // per_out) * per_in + rcc.var, y * sh + rh.var * dh, x * sw + rw.var * dw, rcb.var]
                * kernel[kc, rcc.var, rh.var, rw.var, rcb.var, kb], [rcc, rh, rw, rcb]),
            name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "kc", "oh", "ow", "kb"])
    # depthwise: one input channel per output channel, same blocking
    rh, rw = reduce_axis(r_, "rh"), reduce_axis(s_, "rw")
    return compute(
        (n_, occ, oh, ow, ob),
        lambda n, kc, y, x, kb: sum_reduce(
            padded[n, kc, y * sh + rh.var * dh, x * sw + rw.var * dw, kb]
            * kernel[kc, 0, rh.var, rw.var, 0, kb], [rh, rw]),
        name, tag="conv2d", inputs=[padded, kernel], axis_names=["n", "kc", "oh", "ow", "kb"])


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


# FLOPs, one rule per operator kind (workloads and graph nodes both count with these)
def conv2d_flops(out_elements: float, in_channels_per_group: int, r: int, s: int) -> float:
    return 2.0 * out_elements * in_channels_per_group * r * s


def _conv_out(node):
    x, w = node.inputs[:2]
    a = node.attrs
    lay = a.get("layout", "NCHW")
    n, c, h, wd = nchw_dims(x.shape, lay)
    k, cg, r, s = _oihw_shape(w.shape, a.get("kernel_layout", kernel_layout(lay)))
    if c != cg * a["groups"]:
        raise GraphError(f"conv2d {node.name}: input has {c} channels but the weight expects "
                         f"{cg} x {a['groups']} groups")
    pt, pl, pb, pr = a["pads"]
    oh = conv_out_size(h, r, a["strides"][0], pt, pb, a["dilations"][0])
    ow = conv_out_size(wd, s, a["strides"][1], pl, pr, a["dilations"][1])
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


def _conv_infer(node):
    shape, lay = _conv_out(node)
    return shape, "float32", lay


def _conv_eval(node, args):
    a = node.attrs
    lay = a.get("layout", "NCHW")
    kl = a.get("kernel_layout", kernel_layout(lay))
    w_oihw = args[1] if kl == "OIHW" else L.conv_weight_to_oihw(args[1], "NHWC" if kl == "HWIO" else "NCHW16c")
    y = conv2d_ref(to_nchw(args[0], lay), w_oihw, tuple(a["strides"]), tuple(a["pads"]),
                          tuple(a["dilations"]), a["groups"])
    return f32(from_nchw(y, lay))


def _conv_te(node, ins, name):
    a = node.attrs
    lay = a.get("layout", "NCHW")
    if a.get("kernel_layout", kernel_layout(lay)) != kernel_layout(lay):
        unsupported(node, f"weight layout {a['kernel_layout']} with activation layout {lay}")
    if L.block_of(lay) and a["groups"] > 1 and node.inputs[1].shape[1] != 1 and node.inputs[1].shape[4] == 1:
        unsupported(node, "a grouped (not depthwise) convolution in a blocked layout whose block no group width takes")
    return conv2d(ins[0], ins[1], lay, tuple(a["strides"]), tuple(a["pads"]), tuple(a["dilations"]), a["groups"],
                  name=name)


def _conv_flops(node):
    lay = node.attrs.get("layout", "NCHW")
    _, cg, r, s = _oihw_shape(node.inputs[1].shape, node.attrs.get("kernel_layout", kernel_layout(lay)))
    return conv2d_flops(output_elements(node), cg, r, s)


def _onnx_conv(cx, ins, a):
    x = ins[0]
    w = cx.const(ins[1], "the weight")
    if len(w.shape) == 3 and len(x.shape) == 3:       # Conv1d (Whisper, wav2vec 2.0): a conv over one row
        n, c, length = x.shape
        rows = cx.add("reshape", [x], {"shape": [n, c, 1, length]}, "_row")
        y = _onnx_conv(cx, [rows, cx.constant(np.ascontiguousarray(w[:, :, None, :]), "_weight2d"), *ins[2:]],
                       one_row(cx, a))[0]
        return [cx.add("reshape", [y], {"shape": [n, y.shape[1], y.shape[3]]}, "_1d")]
    if len(w.shape) == 5 and len(x.shape) == 5:       # Conv3d (video clips, volumes): its depth taps' 2-D convs
        from .window3d import conv3d
        k, strides, dil = cx.window(a, list(w.shape[2:]), rank=3)
        g = a.get("group", 1)
        if not isinstance(g, int) or g < 1 or x.shape[1] % g or w.shape[1] * g != x.shape[1] or w.shape[0] % g:
            raise cx.fail(f"a weight of shape {list(w.shape)} and group={g} do not fit {x.shape[1]} input channels")
        bias = cx.const(ins[2], "the bias") if len(ins) > 2 and ins[2] is not None else None
        return [conv3d(cx, x, w, bias, strides, cx.pads(a, x.shape[2:], k, strides, dil), dil, g)]
    if len(w.shape) != 4 or len(x.shape) != 4:
        raise cx.fail("only 1-D, 2-D and 3-D convolutions are supported")
    k, strides, dil = cx.window(a, list(w.shape[2:]))
    pads = cx.pads(a, x.shape[2:], k, strides, dil)
    y = cx.add("conv2d", [x, ins[1]], {"strides": strides, "pads": pads, "dilations": dil,
                                       "groups": a.get("group", 1), "layout": "NCHW", "kernel_layout": "OIHW"})
    if len(ins) > 2 and ins[2] is not None:
        bias = cx.const(ins[2], "the bias")
        y = cx.add("add", [y, cx.constant(bias.reshape(-1, 1, 1), "_bias")], {}, "_bias_add")
    return [y]


def _onnx_conv_transpose(cx, ins, a):
    """ConvTranspose (the upsampling of U-Net, DPT and GAN decoders): every input pixel's channels
    times the weight spread over a kernel-sized window of the output. A 1x1 conv to K x kh x kw
    channels (grouped as the node is) gives each pixel's windows; a kernel that tiles its stride
    with no pads places them whole (a depth-to-space: reshape and transpose), any other is summed
    where windows overlap and cut by the pads (Col2Im)."""
    from .shape import _onnx_col2im, place_blocks
    x = ins[0]
    w = cx.const(ins[1], "the weight")
    if len(w.shape) == 3 and len(x.shape) == 3:       # ConvTranspose1d: over one row
        n, c, length = x.shape
        rows = cx.add("reshape", [x], {"shape": [n, c, 1, length]}, "_row")
        row = one_row(cx, a)       # the row's own stride and dilation 1: over one row a window moves along it only
        row.update(strides=[1, row["strides"][1]], dilations=[1, row["dilations"][1]],
                   output_padding=[0, *a.get("output_padding", [0])])
        if "output_shape" in a:
            row["output_shape"] = [1, *list(a["output_shape"])[-1:]]
        y = _onnx_conv_transpose(cx, [rows, cx.constant(np.ascontiguousarray(w[:, :, None, :]), "_weight2d"), *ins[2:]],
                                 row)[0]
        return [cx.add("reshape", [y], {"shape": [n, y.shape[1], y.shape[3]]}, "_1d")]
    if len(w.shape) != 4 or len(x.shape) != 4:
        raise cx.fail("only 1-D and 2-D transposed convolutions are supported")
    g = a.get("group", 1)
    n, c, h, wd = x.shape
    kg, kh, kw = w.shape[1:]
    if not isinstance(g, int) or g < 1 or c % g or w.shape[0] != c:
        raise cx.fail(f"a weight of shape {list(w.shape)} and group={g} do not fit {c} input channels")
    (kh, kw), strides, dil = cx.window(a, [kh, kw])
    op = list(a.get("output_padding", [0, 0]))
    if len(op) != 2 or not all(isinstance(v, int) and 0 <= v < s for v, s in zip(op, strides)):
        raise cx.fail(f"output_padding must be two integers each below its stride {strides}, got {op}")
    span = [s * (i - 1) + o + (k - 1) * d + 1 for s, i, o, k, d in zip(strides, (h, wd), op, (kh, kw), dil)]
    auto = a.get("auto_pad", "NOTSET")
    if "output_shape" in a or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = list(a["output_shape"])[-2:] if "output_shape" in a else [i * s for i, s in zip((h, wd), strides)]
        if len(want) != 2:
            raise cx.fail(f"output_shape must give the output's height and width, got {a['output_shape']}")
        total = [sp - o for sp, o in zip(span, want)]
        if min(total) < 0:
            raise cx.fail(f"output_shape {want} is past what the input, kernel and strides reach ({span})")
        lo = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        pads = [*lo, *(t - b for t, b in zip(total, lo))]
    else:
        pads = [0, 0, 0, 0] if auto == "VALID" else cx.pads(a, (h, wd), (kh, kw), strides, dil)
    out = [sp - pads[i] - pads[i + 2] for i, sp in enumerate(span)]
    if min(out) < 1:
        raise cx.fail(f"pads {pads} leave no output of the {span[0]} x {span[1]} the windows cover")
    k = kg * g
    cols_w = w.reshape(g, c // g, kg, kh, kw).transpose(0, 2, 3, 4, 1).reshape(k * kh * kw, c // g, 1, 1)
    cols = cx.add("conv2d", [x, cx.constant(np.ascontiguousarray(cols_w), "_windows_weight")],
                  {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "groups": g, "layout": "NCHW",
                   "kernel_layout": "OIHW"}, "_windows")
    if [kh, kw] == strides and dil == [1, 1] and not any(pads) and not any(op):
        y = place_blocks(cx, cols, n, k, kh, kw, h, wd)
    else:
        flat = cx.add("reshape", [cols], {"shape": [n, k * kh * kw, h * wd]}, "_columns")
        y = _onnx_col2im(cx, [flat, cx.constant(np.array(out, np.int64), "_size"),
                              cx.constant(np.array([kh, kw], np.int64), "_block")],
                         {"strides": strides, "dilations": dil, "pads": pads})[0]
    if len(ins) > 2 and ins[2] is not None:
        bias = cx.const(ins[2], "the bias")
        y = cx.add("add", [y, cx.constant(np.asarray(bias, np.float32).reshape(-1, 1, 1), "_bias")], {}, "_bias_add")
    return [y]


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
    return dict(N=nn, C=c, H=h, W=w, K=k, R=r, S=s, stride=a["strides"][0], pad=pads_param(a["pads"]),
                dilation=a["dilations"][0], groups=a["groups"], **ib), lay


def _conv_build(wl):
    p, lay = wl.p, wl.layout
    ib, ob = wl.blocks
    g = p["groups"]
    if lay == "NCHW":
        wshape = (p["K"], p["C"] // g, p["R"], p["S"])
    elif lay == "NHWC":
        wshape = (p["R"], p["S"], p["C"] // g, p["K"])
    else:
        cg = p["C"] // g
        kib = min(ib, cg)       # the weight's input block: the input's, or a group's width (depthwise: 1)
        wshape = (p["K"] // ob, cg // kib, p["R"], p["S"], kib, ob)
    data, weight = data_placeholder(wl), placeholder(wshape, "weight")
    out = conv2d(data, weight, lay, p["stride"], pads4(p["pad"]), p["dilation"], g)
    return epilogue(wl, [data, weight], out, ob)


def _conv_ref(wl, arrays: list):
    p = wl.p
    w = L.conv_weight_to_oihw(arrays[1], wl.layout)
    y = conv2d_ref(nchw_in(wl, arrays), w, p["stride"], pads4(p["pad"]), p["dilation"], p["groups"])
    rest = list(arrays[2:])
    if p["bias"]:
        # every bias layout flattens to channel order: (K,1,1), (K,), (K/b,1,1,b)
        y = y + rest.pop(0).reshape(-1)[None, :, None, None]
    y = L.act_from_nchw(y, wl.layout, wl.blocks[1] or None)
    if p["residual"]:
        y = y + rest.pop(0)
    return epilogue_ref(p, y)


def _conv_check(wl):
    p = wl.p
    g = p["groups"]
    if "ib" in p and not (L.block_of(wl.layout) and g == 1 and 1 <= p["ib"] <= L.MAX_BLOCK and p["C"] % p["ib"] == 0):
        raise WorkloadError(f"conv2d: ib={p['ib']} (the input's channel block, when it is read in another block "
                            f"than the output's) needs a blocked layout, groups=1 and a block dividing C={p['C']}")
    if p["C"] % g or p["K"] % g:
        raise WorkloadError(f"conv2d: groups={g} must divide C={p['C']} and K={p['K']}")
    if L.block_of(wl.layout) and g > 1 and not (g == p["C"] == p["K"]) \
            and not L.grouped_block(p["C"], p["K"], g, L.block_of(wl.layout)):
        raise WorkloadError(f"conv2d in {wl.layout} supports groups=1, depthwise (groups=C=K) and groups whose "
                            "widths its channel block divides or whose equal in and out widths of up to 4 channels divide it; "
                            f"groups={g} of {p['C']} -> {p['K']} channels needs layout NCHW, NHWC or another block")
    if min(window_out(p, p["dilation"])) < 1:
        raise WorkloadError(f"conv2d: kernel {p['R']}x{p['S']} does not fit input {p['H']}x{p['W']}")


def _conv_wl_flops(wl):
    p = wl.p
    oh, ow = window_out(p, p["dilation"])
    return conv2d_flops(p["N"] * p["K"] * oh * ow, p["C"] // p["groups"], p["R"], p["S"])


def _conv_wl_live_flops(wl):
    """The products that read the input: a kernel skips those that read only padding (schedule.peel)."""
    p = wl.p
    top, left, _, _ = pads4(p["pad"])
    live = [int(tap_reads(size, out, k, p["stride"], p["dilation"], lo).sum())
            for size, out, k, lo in zip((p["H"], p["W"]), window_out(p, p["dilation"]), (p["R"], p["S"]), (top, left))]
    return conv2d_flops(p["N"] * p["K"], p["C"] // p["groups"], *live)


register(
    OpDef(name="conv2d", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_conv_infer, evaluate=_conv_eval, te=_conv_te,
          flops=_conv_flops, onnx_in={"Conv": _onnx_conv, "ConvTranspose": _onnx_conv_transpose},
          onnx_out=export_as("Conv", lambda n: {"kernel_shape": list(n.inputs[1].shape[2:]), "strides": n.attrs["strides"],
                                                "pads": n.attrs["pads"], "dilations": n.attrs["dilations"],
                                                "group": n.attrs["groups"]}), task=_conv_task),
    WorkloadDef(name="conv2d", required=("C", "H", "W", "K", "R", "S"),
                defaults=dict(N=1, stride=1, pad=0, dilation=1, groups=1, bias=0, relu=0, residual=0),
                build=_conv_build, reference=_conv_ref, flops=_conv_wl_flops, live_flops=_conv_wl_live_flops,
                check=_conv_check,
                example="conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1", epilogue=True,
                # ib: a blocked conv reading its input in another channel block than it writes
                # (NCHW16c in, NCHW8c out): the layout transform fused into its loads
                optional=("ib",), layout="NCHW16c"),
)
