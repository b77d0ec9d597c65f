"""3-D windows (Conv3d, MaxPool3d and AvgPool3d over video clips and volumes) as 2-D ones: a window
over depth, height and width is its depth taps' 2-D windows, summed (a conv, an average) or maxed.

The clip goes depth-major ([N, D, C, H, W]); for each tap of the depth kernel, the depths it reads
(a strided slice) become a batch of images ([N * Do, C, H, W]) that the tap's 2-D window maps to
the output depths. A tap that reads only depth padding is left out; one that reads padding for
some outputs computes the others, its result padded with zeros. A max pool pools every frame it
reads in 2-D first, then over depth: a 2-D max pool of a (depth, 1) window over the frames laid out
as the rows of one image. The 2-D windows are the compiler's own convs and
pools, so their layouts, schedules and records are those of any CNN."""
from __future__ import annotations

import numpy as np

from .shape import _slice_nodes


def depth_taps(d: int, k: int, stride: int, dil: int, lo: int, hi: int) -> tuple:
    """(output depths, [(tap, first output, outputs, first input depth)]) of a window of k taps over
    an axis of d with pads lo and hi: per tap, the run of outputs whose tap reads inside the axis."""
    do = (d + lo + hi - dil * (k - 1) - 1) // stride + 1
    taps = []
    for t in range(k):
        outs = [o for o in range(do) if 0 <= o * stride + t * dil - lo < d]
        if outs:
            taps.append((t, outs[0], len(outs), outs[0] * stride + t * dil - lo))
    return do, taps


def _images(cx, xt, begin: int, stride: int, count: int, tag: str):
    """Depths begin, begin + stride, ... (count of them) of the depth-major clip as a batch of images."""
    n, d, c, h, w = xt.shape
    if not (begin == 0 and count == d and (stride == 1 or d == 1)):
        xt = _slice_nodes(cx, xt, 1, [(begin, begin + stride * (count - 1) + 1, stride)], f"_depths{tag}")[0]
    return cx.add("reshape", [xt], {"shape": [n * count, c, h, w]}, f"_images{tag}")


def _sum_taps(cx, parts: list, n: int, do: int):
    """The taps' [N * outputs, K, Ho, Wo] results summed over the Do output depths: a tap with fewer
    outputs padded with zeros where it read only padding."""
    full = [y for o0, cnt, y in parts if cnt == do]
    acc = full[0] if full else None
    for i, y in enumerate(full[1:]):
        acc = cx.add("add", [acc, y], {}, f"_sum{i}")
    for o0, cnt, y in (p for p in parts if p[1] != do):
        _, k, ho, wo = y.shape
        y5 = cx.add("reshape", [y], {"shape": [n, cnt, k, ho, wo]}, f"_part{o0}_{cnt}")
        pads = [0, o0, 0, 0, 0, 0, do - o0 - cnt, 0, 0, 0]
        y = cx.add("reshape", [cx.add("pad", [y5], {"pads": pads, "value": 0.0}, f"_pad{o0}_{cnt}")],
                   {"shape": [n * do, k, ho, wo]}, f"_padded{o0}_{cnt}")
        acc = y if acc is None else cx.add("add", [acc, y], {}, f"_sum_part{o0}_{cnt}")
    return acc


def _channels_major(cx, y, n: int, do: int, scale=None):
    """[N * Do, K, Ho, Wo] -> [N, K, Do, Ho, Wo], times `scale` ([1, Do, 1, 1, 1]) on the way."""
    _, k, ho, wo = y.shape
    y5 = cx.add("reshape", [y], {"shape": [n, do, k, ho, wo]}, "_depth_major_out")
    if scale is not None:
        y5 = cx.add("mul", [y5, cx.constant(scale, "_depth_count")], {}, "_mean")
    return cx.add("transpose", [y5], {"perm": [0, 2, 1, 3, 4]}, "_3d")


def _depth_major(cx, x):
    return cx.add("transpose", [x], {"perm": [0, 2, 1, 3, 4]}, "_depth_major")


def conv3d(cx, x, w: np.ndarray, bias, strides: list, pads: list, dil: list, groups: int):
    """A Conv over [N, C, D, H, W] with a [K, C / groups, KD, KH, KW] weight: its depth taps' 2-D convs
    (the weight's slice at each tap), summed, the bias added once."""
    n, c, d, h, wd = x.shape
    do, taps = depth_taps(d, w.shape[2], strides[0], dil[0], pads[0], pads[3])
    if do < 1:
        raise cx.fail(f"the kernel {list(w.shape[2:])} with pads {pads} leaves no output of the {d} depths")
    if not taps:          # every output reads only depth padding: zeros (and the bias), from a tap of zeros
        taps, w = [(0, 0, 1, 0)], np.zeros_like(w)
    xt = _depth_major(cx, x)
    attrs = {"strides": strides[1:], "pads": [pads[1], pads[2], pads[4], pads[5]], "dilations": dil[1:],
             "groups": groups, "layout": "NCHW", "kernel_layout": "OIHW"}
    parts = []
    for t, o0, cnt, i0 in taps:
        img = _images(cx, xt, i0, strides[0], cnt, f"_tap{t}")
        wt = cx.constant(np.ascontiguousarray(w[:, :, t]), f"_weight_tap{t}")
        parts.append((o0, cnt, cx.add("conv2d", [img, wt], attrs, f"_tap{t}")))
    y = _sum_taps(cx, parts, n, do)
    if bias is not None:
        y = cx.add("add", [y, cx.constant(np.asarray(bias, np.float32).reshape(-1, 1, 1), "_bias")], {}, "_bias_add")
    return _channels_major(cx, y, n, do)


def pool3d(cx, x, op: str, kernel: list, strides: list, pads: list, count_include_pad: int, in_pads: list):
    """MaxPool or AveragePool over [N, C, D, H, W]. pads: begins then ends, ceil mode's extra end pad
    included; in_pads: the model's own (what an average that counts pads counts)."""
    n, c, d, h, w = x.shape
    kd = kernel[0]
    do, taps = depth_taps(d, kd, strides[0], 1, pads[0], pads[3])
    xt = _depth_major(cx, x)
    attrs = {"kernel": kernel[1:], "strides": strides[1:], "pads": [pads[1], pads[2], pads[4], pads[5]],
             "layout": "NCHW"}
    if op == "max":      # every frame it reads pooled in 2-D, then the max over depth: a pool of (depth, 1)
        if kd == 1 and not pads[0] and not pads[3]:
            return _channels_major(cx, cx.add("max_pool2d", [_images(cx, xt, 0, strides[0], do, "")], attrs, "_hw_max"),
                                   n, do)
        pooled = cx.add("max_pool2d", [cx.add("reshape", [xt], {"shape": [n * d, c, h, w]}, "_frames")], attrs, "_hw_max")
        _, _, ho, wo = pooled.shape
        rows = cx.add("reshape", [pooled], {"shape": [n, 1, d, c * ho * wo]}, "_depth_rows")
        deep = cx.add("max_pool2d", [rows], {"kernel": [kd, 1], "strides": [strides[0], 1],
                                             "pads": [pads[0], 0, pads[3], 0], "layout": "NCHW"}, "_depth_max")
        return _channels_major(cx, cx.add("reshape", [deep], {"shape": [n * do, c, ho, wo]}, "_depth_maxed"), n, do)
    attrs["count_include_pad"] = count_include_pad
    parts = [(o0, cnt, cx.add("avg_pool2d", [_images(cx, xt, i0, strides[0], cnt, f"_tap{t}")], attrs, f"_tap{t}"))
             for t, o0, cnt, i0 in taps]
    y = _sum_taps(cx, parts, n, do)
    lo, hi = (in_pads[0], in_pads[3]) if count_include_pad else (0, 0)
    counts = np.array([sum(-lo <= o * strides[0] + t - pads[0] < d + hi for t in range(kd)) for o in range(do)])
    if counts.min() < 1:
        raise cx.fail(f"pads {in_pads} leave a window of {kernel} over depth with nothing to average")
    return _channels_major(cx, y, n, do, (1.0 / counts).astype(np.float32).reshape(1, do, 1, 1, 1))
