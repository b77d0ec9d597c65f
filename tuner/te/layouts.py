"""Data and weight layouts, and the NumPy conversions between them.

Activations: NCHW, NHWC, NCHW[x]c (channels split into blocks of x, the block innermost).
Conv weights follow the activation layout: OIHW, HWIO, OIHW[i]i[o]o. Dense weights: OI or OI[x]o.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import UserError

CONV_LAYOUTS = ("NCHW", "NHWC", "NCHW8c", "NCHW16c")
# The conv choices a model tune weighs unless told otherwise (model_tuning.tune_model, `tuner tune
# MODEL`): the two blocked layouts and Winograd F(2x2,3x3) and F(4x4,3x3) (ops.winograd.CHOICES)
# reading and writing each of them, so a Winograd conv between blocked convs needs no transform.
# With NCHW and NHWC as well, the first looks take over half of a small budget and the joint plan
# loses to a single layout (docs/model-tuning-history.md); they stay available, as does NHWC
# Winograd (`winograd2`, `winograd4`).
DEFAULT_CHOICES = ("NCHW8c", "NCHW16c", "winograd2@NCHW8c", "winograd4@NCHW8c", "winograd2@NCHW16c",
                   "winograd4@NCHW16c")
# A dense's weight packing unless a layout plan names another (OI, OI8o, ... in --layouts make
# it a choice of the plan: graph.layout_plan).
DENSE_PACKING = "OI16o"
_BLOCKED = re.compile(r"^NCHW(\d+)c$")
_DENSE_PACKED = re.compile(r"^OI(\d+)o$")


class LayoutError(UserError):
    pass


MAX_BLOCK = 256


def _block(layout: str, m) -> int:
    b = int(m.group(1))
    if not 1 <= b <= MAX_BLOCK:
        raise LayoutError(f"block size {b} in layout {layout!r} must be between 1 and {MAX_BLOCK} "
                          "(e.g. NCHW8c, NCHW16c, OI16o)")
    return b


def block_of(layout: str) -> int:
    """The channel block of NCHW[x]c, 0 for unblocked layouts."""
    m = _BLOCKED.match(layout)
    return _block(layout, m) if m else 0


def check_activation_layout(layout: str) -> None:
    if layout in ("NCHW", "NHWC"):
        return
    if _BLOCKED.match(layout):
        block_of(layout)
        return
    raise LayoutError(f"unknown layout {layout!r}: use one of {', '.join(CONV_LAYOUTS)}")


def is_dense_packing(layout: str) -> bool:
    """Whether `layout` names a dense weight packing (OI, OI[x]o) rather than an activation layout."""
    return layout == "OI" or bool(_DENSE_PACKED.match(layout))


def dense_block(layout: str) -> int:
    if layout == "OI":
        return 0
    m = _DENSE_PACKED.match(layout)
    if not m:
        raise LayoutError(f"unknown dense layout {layout!r}: use OI (weight [K, C]) or OI16o "
                          "(weight packed [K/16, C, 16])")
    return _block(layout, m)


def fit_block(channels: int, block: int) -> int:
    """The block actually used for `channels`: the largest power of two <= `block` dividing it,
    so blocks stay vector-friendly (1000 -> 8, not 10); below 4, the largest divisor (3 -> 3)."""
    p2 = 1
    while p2 * 2 <= block and channels % (p2 * 2) == 0:
        p2 *= 2
    if p2 >= 4:
        return p2
    return max(b for b in range(1, min(block, channels) + 1) if channels % b == 0)


def dense_pack_block(k: int, block: int) -> int:
    """The block of a dense weight packed [ceil(K/b), C, b]: the layout's, the last block padded
    with zeros, unless it covers K (then fit_block's). In a smaller block a vector of the layout's
    width gathers its lanes from several blocks (K=195 in blocks of 15: 0.22x the time of K=192;
    Swin2SR's K=180 in blocks of 4: 0.53x padded to 192, docs/history.md)."""
    return fit_block(k, block) if k <= block else block


def in_blocks_of(block: int, layout: str, channels: int) -> bool:
    """Whether `channels` channels held in blocks of `block` are already blocked layout `layout`'s
    data: its block fitted to them is `block` (24 channels in blocks of 8 are NCHW16c's)."""
    b = block_of(layout)
    return bool(b) and block == fit_block(channels, b)


def same_data(a: str, b: str, channels: int) -> bool:
    """Whether `channels` channels in activation layout `a` are the same bytes as in `b`: the same
    layout, or two blocked ones whose fitted blocks agree (24 channels: NCHW8c and NCHW16c both
    take blocks of 8), so that going from one to the other moves nothing."""
    return a == b or (bool(block_of(a)) and in_blocks_of(fit_block(channels, block_of(a)), b, channels))


def act_shape(layout: str, n: int, c: int, h: int, w: int, block: int | None = None) -> tuple:
    if layout == "NCHW":
        return (n, c, h, w)
    if layout == "NHWC":
        return (n, h, w, c)
    b = block or fit_block(c, block_of(layout))
    return (n, c // b, h, w, b)


def act_from_nchw(x: np.ndarray, layout: str, block: int | None = None) -> np.ndarray:
    if layout == "NCHW":
        return np.ascontiguousarray(x)
    if layout == "NHWC":
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    n, c, h, w = x.shape
    b = block or fit_block(c, block_of(layout))
    return np.ascontiguousarray(x.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def act_to_nchw(x: np.ndarray, layout: str) -> np.ndarray:
    if layout == "NCHW":
        return x
    if layout == "NHWC":
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    n, cb, h, w, b = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w))


LANE_GROUP = 4     # floats in a 128-bit lane of a vector register, which one in-lane shuffle permutes


def grouped_block(c: int, k: int, groups: int, block: int) -> int:
    """The block a grouped (not depthwise) conv of c -> k channels takes in a layout of `block`: the
    block both channel counts take when it divides both group widths (each block then lies in one
    group) or when both widths are equal, divide it and fit a 128-bit lane (each block holds whole
    groups, each lane's read permuted within its 128 bits: ResNeXt's 4 channels per group in 16c;
    groups of 8 in 16c would cross lanes: they ran up to 1.8x slower, docs/history.md), else 0:
    no blocked form."""
    b = fit_block(c, block)
    if groups <= 1 or fit_block(k, block) != b:
        return 0
    cg, kg = c // groups, k // groups
    within = cg % b == 0 and kg % b == 0
    several = 1 < cg == kg <= LANE_GROUP and b % cg == 0
    return b if within or several else 0


def conv_weight_from_oihw(w: np.ndarray, layout: str, ib: int = 0, ob: int = 0) -> np.ndarray:
    if layout == "NCHW":
        return np.ascontiguousarray(w)
    if layout == "NHWC":
        return np.ascontiguousarray(w.transpose(2, 3, 1, 0))
    o, i, r, s = w.shape
    return np.ascontiguousarray(
        w.reshape(o // ob, ob, i // ib, ib, r, s).transpose(0, 2, 4, 5, 3, 1))


def conv_weight_to_oihw(w: np.ndarray, layout: str) -> np.ndarray:
    if layout == "NCHW":
        return w
    if layout == "NHWC":
        return np.ascontiguousarray(w.transpose(3, 2, 0, 1))
    oc, ic, r, s, ib, ob = w.shape
    return np.ascontiguousarray(w.transpose(0, 5, 1, 4, 2, 3).reshape(oc * ob, ic * ib, r, s))


def dense_weight_from_oi(w: np.ndarray, block: int, out: np.ndarray | None = None) -> np.ndarray:
    """[K, C] packed [ceil(K/b), C, b], the last block's missing rows zeros; written into `out`
    (that shape, C order) where given."""
    if not block:
        if out is None:
            return np.ascontiguousarray(w)
        out[...] = w
        return out
    k, c = w.shape
    full = k // block
    out = np.empty((-(-k // block), c, block), w.dtype) if out is None else out
    out[:full] = w[:full * block].reshape(full, block, c).transpose(0, 2, 1)
    if k % block:
        out[full] = 0
        out[full, :, :k % block] = w[full * block:].T
    return out


def dense_weight_to_oi(w: np.ndarray, block: int, k: int | None = None) -> np.ndarray:
    """dense_weight_from_oi's inverse: its first `k` rows (all where None)."""
    if not block:
        return w
    kb, c, b = w.shape
    return np.ascontiguousarray(w.transpose(0, 2, 1).reshape(kb * b, c)[:k])


def plan_summary(layouts: dict) -> str:
    """'30 NCHW16c, 3 NHWC (convs); 1 OI (dense)'."""
    parts = []
    for dense, what in ((False, "convs"), (True, "dense")):
        counts: dict = {}
        for lay in (lay for lay in layouts.values() if is_dense_packing(lay) == dense):
            counts[lay] = counts.get(lay, 0) + 1
        if counts:
            parts.append(", ".join(f"{n} {lay}" for lay, n in sorted(counts.items(), key=lambda kv: -kv[1]))
                         + f" ({what})")
    return "; ".join(parts)
