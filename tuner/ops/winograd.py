"""Winograd convolution F(m x m, 3 x 3) as three kernels, each one reduction that the tiled
sketch schedules like any other (Lavin and Gray, "Fast Algorithms for Convolutional Neural
Networks", 2016; TVM's conv2d_winograd_nhwc has the same three stages).

A 3x3, stride-1 convolution in NHWC is cut into tiles of m x m outputs; each reads an
alpha x alpha input window (alpha = m + 2). With the constant matrices B, G, A of F(m, 3):

    winograd_input   V[a, b, n, th, tw, c] = sum_{r,s} BT[a, r] BT[b, s] x[n, th*m + r, tw*m + s, c]
    winograd_gemm    M[a, b, n, th, tw, k] = sum_c V[a, b, n, th, tw, c] U[a, b, c, k]
                     (its kernel reads V and writes M with (n, th, tw) as one axis of tiles t,
                     where they lie in memory alike: a register tile of 3 rows covers 49 tiles as
                     16 x 3 + 1 where 7 x 7 took 7 x (3 + 3 + 1))
    winograd_output  y[n, h, w, k] = sum_{a,b} AT[h % m, a] AT[w % m, b] M[a, b, n, h / m, w / m, k]
                     (+ bias, residual, activation: the conv2d epilogue)

where U = G w G^T is the weight transformed once, when a model is compiled (`weight_transform`).
The multiplications of a 3x3 convolution fall from 9 per output to alpha^2 / m^2 (4 for m = 2,
2.25 for m = 4) in the batched GEMM, which is where the time goes; the transforms read and write
each activation a few times. The input is padded by the convolution's padding and, at the bottom
and right, up to whole tiles; the output drops what the last tiles computed past its edge.

The transforms sum over their matrix rows' non-zero entries only (`sparse_rows`: a table of
columns and values per row), entering the kernels as constants (a select over the index pair),
so a schedule that unrolls the small loops lets the C compiler fold them.
"""
from __future__ import annotations

import re

import numpy as np

from ..te import layouts as L
from ..te.expr import And, Cmp, Const, Expr, as_expr, select
from ..te.layouts import LayoutError, act_shape, block_of
from ..te.tensor import Tensor, compute, placeholder, reduce_axis, sum_reduce
from .common import data_placeholder, f32, nchw_dims, pad_spatial
from .elementwise import epilogue, epilogue_ref
from .layout import layout_transform
from .registry import OpDef, Pattern, WorkloadDef, WorkloadError, register
from .workload import make

# (BT, G, AT) of F(m, 3), from Lavin and Gray (interpolation points 0, +-1 for m = 2; 0, +-1, +-2 for m = 4)
MATRICES = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], dtype=np.float64),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], dtype=np.float64),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
                 dtype=np.float64)),
}


TILES = tuple(MATRICES)


def alpha(m: int) -> int:
    return m + 2


def tiles(out_h: int, out_w: int, m: int) -> tuple:
    """(tile rows, tile columns) covering an out_h x out_w output."""
    return -(-out_h // m), -(-out_w // m)


def out_size(h: int, w: int, pad: int) -> tuple:
    """The output (height, width) of a 3x3 stride-1 convolution of an h x w input."""
    return h + 2 * pad - 2, w + 2 * pad - 2


def tile_pads(h: int, w: int, pad: int, m: int) -> tuple:
    """(top, left, bottom, right) padding of an h x w input: the convolution's, and at the bottom
    and right up to whole tiles ((tiles - 1) * m + alpha rows and columns)."""
    th, tw = tiles(*out_size(h, w, pad), m)
    return pad, pad, th * m + 2 - h - pad, tw * m + 2 - w - pad


def v_shape(n: int, h: int, w: int, pad: int, m: int, channels: int) -> tuple:
    """The shape of V (input channels) or M (output channels): alpha x alpha x N x tiles x channels."""
    al = alpha(m)
    return (al, al, n, *tiles(*out_size(h, w, pad), m), channels)


def const_matrix(mat: np.ndarray, i, j, integer: bool = False) -> Expr:
    """mat[i, j] as an expression of index expressions i and j: a select over the entries that
    differ from the matrix's most common value (float, or int for a table of indices)."""
    i, j = as_expr(i), as_expr(j)
    kind = int if integer else float
    values, counts = np.unique(mat, return_counts=True)
    common = values[np.argmax(counts)]
    out: Expr = Const(kind(common))
    for (a, b), v in np.ndenumerate(mat):
        if v != common:
            out = select(And(Cmp("==", i, Const(a)), Cmp("==", j, Const(b))), Const(kind(v)), out)
    return out


def sparse_rows(mat: np.ndarray) -> tuple:
    """(columns, values), each rows x width: row i's non-zero entries of `mat` in column order,
    padded with (column 0, value 0) to the widest row's count."""
    width = max(int(np.count_nonzero(row)) for row in mat)
    cols = np.zeros((mat.shape[0], width), dtype=np.int64)
    vals = np.zeros((mat.shape[0], width))
    for i, row in enumerate(mat):
        nz = np.flatnonzero(row)
        cols[i, :len(nz)], vals[i, :len(nz)] = nz, row[nz]
    return cols, vals


def input_transform(data: Tensor, pad: int, m: int, name: str = "winograd_input", layout: str = "NHWC") -> Tensor:
    """V[a, b, n, th, tw, c] of an input in `layout` under a 3x3 convolution with padding `pad`.

    BT d B summed over BT's non-zero entries only: row a of BT has at most 2 (m = 2) or 4 (m = 4)
    of its alpha, so each V element reads 4 or 16 inputs instead of 16 or 36; the reduction runs
    over (i, j) < width, reading d at the i-th and j-th non-zero columns of rows a and b.
    An NCHW[x]c input is read through a layout_transform stage to NHWC that the sketches inline
    into these loads: the transform fused into its consumer."""
    if layout != "NHWC":
        data = layout_transform(data, layout, "NHWC", name=f"{name}_nhwc")
    cols, vals = sparse_rows(MATRICES[m][0])
    width = cols.shape[1]
    n_, h_, w_, c_ = data.shape
    padded = pad_spatial(data, (1, 2), tile_pads(h_, w_, pad, m), 0.0, name=f"{name}_pad")
    i, j = reduce_axis(width, "i"), reduce_axis(width, "j")
    return compute(
        v_shape(n_, h_, w_, pad, m, c_),
        lambda a, b, n, y, x, c: sum_reduce(
            const_matrix(vals, a, i.var) * const_matrix(vals, b, j.var)
            * padded[n, y * m + const_matrix(cols, a, i.var, True), x * m + const_matrix(cols, b, j.var, True), c],
            [i, j]),
        name, tag="winograd_input", inputs=[padded], axis_names=["a", "b", "n", "th", "tw", "c"],
        table={"a": 0, "b": 0})


def batch_gemm(v: Tensor, u: Tensor, name: str = "winograd_gemm") -> Tensor:
    """M[a, b, ..., k] = sum_c V[a, b, ..., c] U[a, b, c, k] over V's tile axes: (n, th, tw) as the
    graph holds them, or one axis of tiles t as the kernel computes them (_wino_gemm_build)."""
    k_ = u.shape[3]
    rc = reduce_axis(v.shape[-1], "rc")
    tiles = ["n", "th", "tw"] if len(v.shape) == 6 else ["t"]
    return compute(
        (*v.shape[:-1], k_),
        lambda a, b, *rest: sum_reduce(v[(a, b, *rest[:-1], rc.var)] * u[a, b, rc.var, rest[-1]], [rc]),
        name, tag="winograd_gemm", inputs=[v, u], axis_names=["a", "b", *tiles, "k"])


def output_transform(mm: Tensor, out_h: int, out_w: int, m: int, name: str = "winograd_output",
                     layout: str = "NHWC") -> Tensor:
    """y (in `layout`: NHWC, or NCHW[x]c written directly, the transform fused into this store) of
    the batched products M, cropped to out_h x out_w: AT M A summed, like the input transform,
    over AT's non-zero entries only (9 of 16 terms for m = 2, 25 of 36 for m = 4)."""
    cols, vals = sparse_rows(MATRICES[m][2])
    width = cols.shape[1]
    n_, k_ = mm.shape[2], mm.shape[5]
    i, j = reduce_axis(width, "i"), reduce_axis(width, "j")

    def value(n, y, x, k):
        return sum_reduce(
            const_matrix(vals, y % m, i.var) * const_matrix(vals, x % m, j.var)
            * mm[const_matrix(cols, y % m, i.var, True), const_matrix(cols, x % m, j.var, True), n, y // m, x // m, k],
            [i, j])

    if layout == "NHWC":
        return compute((n_, out_h, out_w, k_), value, name, tag="winograd_output", inputs=[mm],
                       axis_names=["n", "oh", "ow", "k"], table={"oh": m, "ow": m})
    shape = act_shape(layout, n_, k_, out_h, out_w)      # (n, k blocks, h, w, block)
    b = shape[4]
    return compute(shape, lambda n, kk, y, x, kb: value(n, y, x, kk * b + kb), name,
                   tag="winograd_output", inputs=[mm], axis_names=["n", "kk", "oh", "ow", "kb"],
                   table={"oh": m, "ow": m})


def input_ref(x: np.ndarray, pad: int, m: int) -> np.ndarray:
    bt = MATRICES[m][0]
    top, left, bottom, right = tile_pads(x.shape[1], x.shape[2], pad, m)
    xp = np.pad(x.astype(np.float64), [(0, 0), (top, bottom), (left, right), (0, 0)])
    al = alpha(m)
    win = np.lib.stride_tricks.sliding_window_view(xp, (al, al), axis=(1, 2))[:, ::m, ::m]   # n th tw c r s
    return np.einsum("ar,bs,nhwcrs->abnhwc", bt, bt, win, optimize=True)


def gemm_ref(v: np.ndarray, u: np.ndarray) -> np.ndarray:
    return np.einsum("ab...c,abck->ab...k", v.astype(np.float64), u.astype(np.float64), optimize=True)


def output_ref(mm: np.ndarray, out_h: int, out_w: int, m: int) -> np.ndarray:
    at = MATRICES[m][2]
    al, _, n_, th, tw, k_ = mm.shape
    y = np.einsum("ya,xb,abnhwk->nhywxk", at, at, mm.astype(np.float64), optimize=True)
    return y.reshape(n_, th * m, tw * m, k_)[:, :out_h, :out_w]


def weight_transform(w_hwio: np.ndarray, m: int) -> np.ndarray:
    """U[a, b, c, k] = (G w[:, :, c, k] G^T)[a, b] of a 3x3 HWIO weight."""
    g = MATRICES[m][1]
    return np.einsum("ar,bs,rsck->abck", g, g, w_hwio.astype(np.float64), optimize=True)


CHOICES = {f"winograd{m}": m for m in TILES}    # the NHWC choices; winograd<m>@NCHW<x>c also parses (parse_choice)


_CHOICE = re.compile(r"^winograd(\d+)(?:@(.*))?$")


def parse_choice(choice: str) -> tuple | None:
    """(m, activation layout) of a layout-plan value that runs a convolution as F(m x m, 3 x 3),
    None for a plain layout. `winograd<m>` keeps NHWC activations around the convolution;
    `winograd<m>@NCHW<x>c` keeps that blocked layout: the input transform reads it and the output
    transform writes it (the layout transforms fused into them), so a Winograd convolution among
    blocked ones needs no transform. Raises LayoutError (naming the value) for a malformed one."""
    mt = _CHOICE.match(choice)
    if not mt:
        return None
    m, lay = int(mt.group(1)), mt.group(2)
    if m not in TILES:
        raise LayoutError(f"unknown layout choice {choice!r}: Winograd tiles are "
                          f"{' or '.join(f'winograd{t}' for t in TILES)} (optionally @NCHW8c, @NCHW16c)")
    if lay is None:
        return m, "NHWC"
    if not block_of(lay):                       # raises for a bad block size itself
        raise LayoutError(f"layout choice {choice!r}: Winograd transforms keep NHWC (winograd{m}) or a blocked "
                          f"layout (winograd{m}@NCHW16c), not {lay!r}")
    return m, lay


def activation_layout(choice: str) -> str:
    """The layout of the activations around a convolution that runs as `choice` (a layout or a Winograd choice)."""
    w = parse_choice(choice)
    return w[1] if w else choice


def applies(kernel: tuple, strides, dilations, groups: int, pads) -> bool:
    """Whether a convolution can run as Winograd F(m, 3): a 3x3 window, stride 1, no dilation, no
    groups, the same padding (at most 2) on every side."""
    return (tuple(kernel) == (3, 3) and tuple(strides) == (1, 1) and tuple(dilations) == (1, 1) and groups == 1
            and len(set(pads)) == 1 and 0 <= pads[0] <= 2)


def _wino_attrs(node) -> tuple:
    a = node.attrs
    return a["pad"], a["m"], a["H"], a["W"]


def _wino_layout(node) -> str:
    return node.attrs.get("layout", "NHWC")


def _wino_v_infer(node):
    pad, m, h, w = _wino_attrs(node)
    x = node.inputs[0]
    if node.op == "winograd_input":
        n_, ch = nchw_dims(x.shape, _wino_layout(node))[:2]
    else:
        n_, ch = x.shape[2], node.inputs[1].shape[3]
    return v_shape(n_, h, w, pad, m, ch), "float32", ""


def _wino_out_infer(node):
    pad, m, h, w = _wino_attrs(node)
    mm, lay = node.inputs[0], _wino_layout(node)
    return L.act_shape(lay, mm.shape[2], mm.shape[5], *out_size(h, w, pad)), "float32", lay


def _wino_task(node):
    pad, m, h, w = _wino_attrs(node)
    params = dict(H=h, W=w, pad=pad, m=m)
    if node.op == "winograd_input":
        n_, c = nchw_dims(node.inputs[0].shape, _wino_layout(node))[:2]
        params.update(N=n_, C=c)
    elif node.op == "winograd_gemm":
        params.update(N=node.inputs[0].shape[2], C=node.inputs[0].shape[5], K=node.inputs[1].shape[3])
        return params, "NHWC"
    else:
        params.update(N=node.inputs[0].shape[2], K=node.inputs[0].shape[5])
    return params, _wino_layout(node)


def _wino_flops(node) -> float:
    params, lay = _wino_task(node)
    return make(node.op, params, lay).flops


def _wino_input_eval(node, args):
    return f32(input_ref(_nhwc(_wino_layout(node), args[0]), node.attrs["pad"], node.attrs["m"]))


def _wino_output_eval(node, args):
    pad, m, h, w = _wino_attrs(node)
    return f32(_from_nhwc(_wino_layout(node), output_ref(args[0], *out_size(h, w, pad), m)))


def _wino_out(p: dict) -> tuple:
    return out_size(p["H"], p["W"], p["pad"])


def _wino_products(p: dict) -> tuple:
    """(alpha, tiles): the transform size and how many tiles cover the output."""
    th, tw = tiles(*_wino_out(p), p["m"])
    return alpha(p["m"]), p["N"] * th * tw


def _wino_v_shape(p: dict, channels: int) -> tuple:
    return v_shape(p["N"], p["H"], p["W"], p["pad"], p["m"], channels)


def _wino_input_build(wl):
    p = wl.p
    data = data_placeholder(wl)
    return [data], input_transform(data, p["pad"], p["m"], layout=wl.layout)


def _wino_gemm_build(wl):
    p = wl.p
    al, t = _wino_products(p)
    v = placeholder((al, al, t, p["C"]), "data")       # V's (n, th, tw) as one axis of tiles
    u = placeholder((al, al, p["C"], p["K"]), "weight")
    return [v, u], batch_gemm(v, u)


def _wino_output_build(wl):
    p = wl.p
    mm = placeholder(_wino_v_shape(p, p["K"]), "data")
    return epilogue(wl, [mm], output_transform(mm, *_wino_out(p), p["m"], layout=wl.layout), wl.blocks[1])


def _wino_output_ref(wl, arrays: list):
    p = wl.p
    y = output_ref(arrays[0], *_wino_out(p), p["m"])
    rest = list(arrays[1:])
    if p["bias"]:
        y = y + _nhwc(wl.layout, rest.pop(0))
    if p["residual"]:
        y = y + _nhwc(wl.layout, rest.pop(0))
    return _from_nhwc(wl.layout, epilogue_ref(p, y))


def _nhwc(layout: str, a: np.ndarray) -> np.ndarray:
    """An activation (or a bias in the layout's channel_bias_shape) in `layout` as NHWC."""
    if layout == "NHWC":
        return a
    if a.ndim < 5:                                   # a blocked bias: (channel blocks, 1, 1, block)
        return a.reshape(-1)
    return L.act_to_nchw(a, layout).transpose(0, 2, 3, 1)


def _from_nhwc(layout: str, y: np.ndarray) -> np.ndarray:
    return y if layout == "NHWC" else L.act_from_nchw(y.transpose(0, 3, 1, 2), layout)


def _wino_check(wl):
    p = wl.p
    if p["m"] not in TILES:
        raise WorkloadError(f"{wl.op}: tile size m={p['m']} is not one of {', '.join(map(str, TILES))}")
    if wl.layout != "NHWC" and not (wl.op != "winograd_gemm" and L.block_of(wl.layout)):
        raise WorkloadError(f"{wl.op} runs in NHWC{'' if wl.op == 'winograd_gemm' else ' or NCHW[x]c'}, "
                            f"not {wl.layout}")
    if not 0 <= p["pad"] <= 2 or min(_wino_out(p)) < 1:
        raise WorkloadError(f"{wl.op}: a 3x3 window with pad={p['pad']} does not fit input {p['H']}x{p['W']}")


def _wino_input_flops(wl) -> float:
    """What the kernel computes: per V element, BT's non-zero entries of two rows (ops.winograd.sparse_rows)."""
    al, t = _wino_products(wl.p)
    width = sparse_rows(MATRICES[wl.p["m"]][0])[0].shape[1]
    return 2.0 * al * al * width * width * t * wl.p["C"]


def _rows_computed(mat: np.ndarray) -> int:
    """Rows of a transform matrix whose entries each take an operation: those of two or more
    non-zeros (one non-zero is a copy or a scale the next product absorbs)."""
    return sum(int(np.count_nonzero(row)) > 1 for row in mat)


def _wino_input_least(wl) -> float:
    """BT d B as two passes, each computed row of each an operation for every column: with +-1
    entries (m=2) a quarter of `flops`, and a timing is judged by it (measure.plausible)."""
    al, t = _wino_products(wl.p)
    return 2.0 * al * _rows_computed(MATRICES[wl.p["m"]][0]) * t * wl.p["C"]


def _wino_output_least(wl) -> float:
    """AT M A as two passes: AT's computed rows over alpha columns, then over m."""
    al, t = _wino_products(wl.p)
    m = wl.p["m"]
    return float((al + m) * _rows_computed(MATRICES[m][2]) * t * wl.p["K"])


def _wino_gemm_flops(wl) -> float:
    al, t = _wino_products(wl.p)
    return 2.0 * al * al * t * wl.p["C"] * wl.p["K"]


def _wino_output_flops(wl) -> float:
    """Per output element, AT's non-zero entries of two rows."""
    p = wl.p
    oh, ow = _wino_out(p)
    width = sparse_rows(MATRICES[p["m"]][2])[0].shape[1]
    return 2.0 * width * width * p["N"] * oh * ow * p["K"]


_WINO = dict(N=1, pad=1, m=2)


register(
    OpDef(name="winograd_input", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_wino_v_infer, evaluate=_wino_input_eval,
          te=lambda n, ins, name: input_transform(ins[0], n.attrs["pad"], n.attrs["m"], name, _wino_layout(n)),
          flops=_wino_flops, task=_wino_task),
    OpDef(name="winograd_gemm", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_wino_v_infer,
          evaluate=lambda n, args: f32(gemm_ref(args[0], args[1])),
          te=lambda n, ins, name: batch_gemm(ins[0], ins[1], name),
          flops=_wino_flops, task=_wino_task),
    OpDef(name="winograd_output", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_wino_out_infer, evaluate=_wino_output_eval,
          te=lambda n, ins, name: output_transform(ins[0], *out_size(*_wino_attrs(n)[2:], n.attrs["pad"]),
                                                   n.attrs["m"], name, _wino_layout(n)),
          flops=_wino_flops, task=_wino_task),
    WorkloadDef(name="winograd_input", required=("C", "H", "W"), defaults=dict(_WINO), build=_wino_input_build,
                reference=lambda wl, a: input_ref(_nhwc(wl.layout, a[0]), wl.p["pad"], wl.p["m"]), flops=_wino_input_flops,
                least_flops=_wino_input_least, check=_wino_check, example="winograd_input:C=256,H=14,W=14,pad=1,m=2", layout="NHWC"),
    WorkloadDef(name="winograd_gemm", required=("C", "H", "W", "K"), defaults=dict(_WINO), build=_wino_gemm_build,
                reference=lambda wl, a: gemm_ref(a[0], a[1]), flops=_wino_gemm_flops, check=_wino_check,
                example="winograd_gemm:C=256,H=14,W=14,K=256,pad=1,m=2", layout="NHWC",
                key_name="winograd_tiles_gemm"),    # its tiles as one axis: keys apart from the 6-axis kernel's
    WorkloadDef(name="winograd_output", required=("H", "W", "K"), defaults=dict(_WINO, bias=0, relu=0, residual=0),
                build=_wino_output_build, reference=_wino_output_ref, flops=_wino_output_flops,
                least_flops=_wino_output_least, check=_wino_check,
                example="winograd_output:H=14,W=14,K=256,pad=1,m=2,bias=1,relu=1", epilogue=True, layout="NHWC"),
)
