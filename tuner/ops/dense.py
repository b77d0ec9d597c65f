"""GEMM-shaped operators: dense (activation rows x constant weight: a fully connected layer or a
transformer's projection, its weight packed OI or OI[x]o, with its fused epilogue) and batch_matmul
(activation x activation, as attention's Q.K^T and P.V; layout NT: the second operand given
transposed, N x K). ONNX MatMul of any rank imports as one of the two."""
from __future__ import annotations

import itertools

import numpy as np

from ..errors import GraphError
from ..te import layouts as L
from ..te.tensor import Tensor, compute, placeholder, reduce_axis, sum_reduce
from .common import broadcast_index, f32
from .elementwise import epilogue, epilogue_ref
from .recurrent import onnx_gru, onnx_lstm
from .registry import NoTask, OpDef, Pattern, WorkloadDef, WorkloadError, register


def dense(data: Tensor, weight: Tensor, block: int, name: str = "dense", k: int | None = None) -> Tensor:
    """data (..., C) x weight (K, C) (or packed ceil(K/b), C, b: its first `k` rows, all where
    None): over the last axis, the leading axes rows."""
    lead, nl = data.shape[:-1], data.ndim - 1
    rc = reduce_axis(data.shape[-1], "rc")
    if block:
        b = weight.shape[2]
        k_, w = k or weight.shape[0] * b, lambda k, r: weight[k // b, r, k % b]
    else:
        k_, w = weight.shape[0], lambda k, r: weight[k, r]
    return compute((*lead, k_), lambda *i: sum_reduce(data[i[:nl] + (rc.var,)] * w(i[nl], rc.var), [rc]),
                   name, tag="dense", inputs=[data, weight],
                   axis_names=(["n"] if nl == 1 else [f"n{k}" for k in range(nl)]) + ["k"])


def dense_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


def dense_flops(n: int, c: int, k: int) -> float:
    return 2.0 * n * c * k


def _rows(shape) -> int:
    return int(np.prod(shape[:-1], dtype=np.int64))


# ---------------------------------------------------------------- heads as views
# Attention's heads read in place of a transposed copy (AbsorbHeadViews): an operand stored
# [..., R, H*C] (a projection's output) is read split, as [..., H, R, C], by a batch_matmul
# (attrs a_heads, b_heads = H), and the context stored [..., H, R, C] is read merged, as
# [..., R, H*C], by the dense after it (attr in_heads = H).

BMM_VIEWS = ("a_heads", "b_heads")     # batch_matmul's view parameters, one per operand
KEYS_IN_PLACE_ROWS = 8     # a batch_matmul of up to this many rows reads K^T from K in place (passes.head_views)
# a GEMM's activation past any core's L2: each pass over it serves several column tiles (space.sketch),
# and where it has at most PACK_ROWS rows it is read packed, PACK_FLOATS columns of every row after
# another (passes.head_views.pack_wide_rows: a dense reading it with in_heads)
WIDE_ACTIVATION_BYTES = 2 << 20
PACK_ROWS, PACK_FLOATS = 128, 64


def split_heads_shape(shape, h: int) -> tuple:
    return (*shape[:-2], h, shape[-2], shape[-1] // h)


def merge_heads_shape(shape, h: int) -> tuple:
    return (*shape[:-3], shape[-2], h * shape[-1])


def split_heads_ref(x: np.ndarray, h: int) -> np.ndarray:
    return np.swapaxes(x.reshape(*x.shape[:-1], h, x.shape[-1] // h), -3, -2)


def merge_heads_ref(y: np.ndarray, h: int) -> np.ndarray:
    return np.swapaxes(y, -3, -2).reshape(merge_heads_shape(y.shape, h))


def split_heads(t: Tensor, h: int, name: str) -> Tensor:
    c = t.shape[-1] // h
    return compute(split_heads_shape(t.shape, h), lambda *i: t[i[:-3] + (i[-2], i[-3] * c + i[-1])], name,
                   inputs=[t])


def merge_heads(t: Tensor, h: int, name: str) -> Tensor:
    c = t.shape[-1]
    return compute(merge_heads_shape(t.shape, h), lambda *i: t[i[:-2] + (i[-1] // c, i[-2], i[-1] % c)], name,
                   inputs=[t])


def _dense_data_shape(node) -> tuple:
    x, h = node.inputs[0].shape, node.attrs.get("in_heads", 0)
    return merge_heads_shape(x, h) if h else tuple(x)


def _dense_infer(node):
    w, h = node.inputs[1], node.attrs.get("in_heads", 0)
    if h and (len(node.inputs[0].shape) < 3 or node.inputs[0].shape[-3] != h):
        raise GraphError(f"dense {node.name}: in_heads={h} needs data [..., {h}, rows, cols], "
                         f"not {list(node.inputs[0].shape)}")
    x = _dense_data_shape(node)
    if len(x) < 2 or len(w.shape) != 2 or x[-1] != w.shape[1]:
        raise GraphError(f"dense {node.name}: cannot multiply {list(x)} by weight {list(w.shape)}")
    return (*x[:-1], w.shape[0]), "float32", ""


def _onnx_gemm(cx, ins, a):
    x = ins[0]
    if a.get("transA", 0):
        x = cx.add("transpose", [x], {"perm": [1, 0]}, "_transA")
    w = cx.const(ins[1], "the weight (B)")
    w = np.ascontiguousarray(w) if a.get("transB", 0) else cx.transposed(w)
    y = cx.add("dense", [x, cx.constant(w, "_w")], {})
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if alpha != 1.0:
        y = cx.add("mul", [y, cx.constant(np.float32(alpha), "_alpha")], {}, "_alpha")
    if len(ins) > 2 and ins[2] is not None:
        c = ins[2] if beta == 1.0 or not ins[2].is_const else cx.constant(ins[2].data * beta, "_c")
        y = cx.add("add", [y, c], {}, "_bias")
    return [y]


def _onnx_matmul(cx, ins, a):
    """ONNX MatMul (NumPy matmul semantics): by a constant 2-D weight it is dense over the rows of
    the other operand; otherwise batch_matmul, batch dims broadcast."""
    x, w = ins[0], ins[1]
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise cx.fail(f"a 1-D operand ({list(x.shape)} x {list(w.shape)}) is not supported; both need rank 2 or more")
    if w.is_const and w.data.ndim == 2 and not x.is_const:
        return [cx.add("dense", [x, cx.constant(cx.transposed(w.data), "_w")], {})]
    return [cx.add("batch_matmul", [x, w], {"trans_b": 0})]


def _einsum_terms(cx, eq: str, ranks: list) -> tuple:
    """([letters of each operand], output letters) of an Einsum equation, `...` spelled out as
    letters of its own; the implicit output is the letters used once, in alphabetical order."""
    eq = eq.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks) or not all(c.isalpha() for c in eq.replace("...", "").replace(",", "").replace("->", "")):
        raise cx.fail(f"equation {eq!r} does not fit its {len(ranks)} operands")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in eq][:ell]
    spelled = []
    for t, r in zip(terms, ranks):
        t = t.replace("...", "".join(free[ell - (r - len(t.replace("...", ""))):]))
        if len(t) != r:
            raise cx.fail(f"equation {eq!r}: term {t!r} does not fit an operand of rank {r}")
        if len(set(t)) != len(t):
            raise cx.fail(f"equation {eq!r}: a letter repeated in one operand (a diagonal) is not supported")
        spelled.append(t)
    if arrow:
        out = out.replace("...", "".join(free))
    else:
        once = [c for c in set("".join(spelled)) if "".join(spelled).count(c) == 1]
        out = "".join(free) + "".join(sorted(c for c in once if c not in free))
    return spelled, out


def _onnx_einsum(cx, ins, a):
    """ONNX Einsum of two operands as one batch_matmul (or dense, by a constant matrix): each letter
    is a batch axis (in both and the output), a contracted one (in both, not the output) or a free
    one of either side; operands and result are transposed and reshaped around it. MaxViT and
    relative-position attention write Q.K^T and P.V so."""
    eq = a.get("equation", b"")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    if len(ins) != 2:
        raise cx.fail(f"{len(ins)} operands: only Einsum of two operands is supported")
    (ta, tb), out = _einsum_terms(cx, eq, [len(v.shape) for v in ins])
    x, y = ins
    size = {c: d for t, v in ((ta, x), (tb, y)) for c, d in zip(t, v.shape)}
    for c in set(ta) & set(tb):
        if x.shape[ta.index(c)] != y.shape[tb.index(c)]:
            raise cx.fail(f"equation {eq!r}: axis {c!r} has {x.shape[ta.index(c)]} and {y.shape[tb.index(c)]} "
                          "elements (broadcasting in Einsum is not supported)")
    if set(out) - set(ta + tb) or len(set(out)) != len(out) or (set(ta) ^ set(tb)) - set(out):
        raise cx.fail(f"equation {eq!r}: only products whose every letter is kept or contracted over both "
                      "operands are supported")
    batch = [c for c in out if c in ta and c in tb]
    left, right = [c for c in out if c in ta and c not in tb], [c for c in out if c in tb and c not in ta]
    red = [c for c in ta if c in tb and c not in out]
    prod = lambda cs: int(np.prod([size[c] for c in cs]))      # noqa: E731
    step = itertools.count()

    def arrange(v, term, order, shape):
        """`v` (letters `term`) with its axes in `order`, reshaped to `shape`."""
        perm = [term.index(c) for c in order]
        if v.is_const:
            return cx.constant(np.ascontiguousarray(np.transpose(v.data, perm).reshape(shape)), f"_einsum{next(step)}")
        if perm != list(range(len(perm))):
            v = cx.add("transpose", [v], {"perm": perm}, f"_einsum{next(step)}")
        return v if list(v.shape) == list(shape) else cx.add("reshape", [v], {"shape": list(shape)},
                                                               f"_einsum{next(step)}")

    bshape = [size[c] for c in batch]
    lhs = arrange(x, ta, batch + left + red, bshape + [prod(left), prod(red)])
    if [tb.index(c) for c in batch + right + red] == list(range(len(tb))) and not y.is_const:
        rhs, trans = arrange(y, tb, batch + right + red, bshape + [prod(right), prod(red)]), 1   # read as N x K
    else:
        rhs, trans = arrange(y, tb, batch + red + right, bshape + [prod(red), prod(right)]), 0
    natural = batch + left + right
    last = natural == list(out) and [prod(left), prod(right)] == [size[c] for c in left + right]
    if rhs.is_const and rhs.data.ndim == 2 and not lhs.is_const:
        mm = cx.add("dense", [lhs, cx.constant(np.ascontiguousarray(rhs.data.T), "_w")], {},
                    "" if last else f"_einsum{next(step)}")
    else:
        mm = cx.add("batch_matmul", [lhs, rhs], {"trans_b": trans}, "" if last else f"_einsum{next(step)}")
    if last:
        return [mm]
    shape = [size[c] for c in natural]
    if list(out) == natural:
        return [cx.add("reshape", [mm], {"shape": shape})]
    if list(mm.shape) != shape:
        mm = cx.add("reshape", [mm], {"shape": shape}, f"_einsum{next(step)}")
    return [cx.add("transpose", [mm], {"perm": [natural.index(c) for c in out]})]


def _export_dense(ex, n, ins):
    """dense followed by its only consumer, an add of a 1-D constant, is one Gemm with a bias; over
    more than two axes, a MatMul (and an Add)."""
    if n.attrs.get("in_heads"):
        raise GraphError(f"dense {n.name}: export of the heads form is not supported")
    users = ex.consumers(n.output)
    bias = users[0].inputs[1] if len(users) == 1 and users[0].op == "add" and users[0].inputs[1].is_const else None
    if len(n.inputs[0].shape) > 2:
        ex.emit(n, "MatMul", [ins[0], ex.array(f"{n.name}_wT", n.inputs[1].data.T)])
        return
    if bias is not None and bias.data.ndim == 1:
        ex.fold(users[0], n)
        ins = ins + [ex.ref(bias)]
    ex.emit(n, "Gemm", ins, transB=1)


def _dense_build(wl):
    p = wl.p
    ob, h = wl.blocks[1], p.get("in_heads")
    if h:       # stored [N / rows, heads, rows, C / heads], read as [N, C]
        rows, d = p.get("in_rows", p["N"]), p["C"] // h
        stored = placeholder((p["N"] // rows, h, rows, d), "data")
        data = compute((p["N"], p["C"]), lambda n, c: stored[n // rows, c // d, n % rows, c % d], "data_heads",
                       inputs=[stored])
    else:
        stored = data = placeholder((p["N"], p["C"]), "data")
    weight = placeholder((-(-p["K"] // ob), p["C"], ob) if ob else (p["K"], p["C"]), "weight")
    return epilogue(wl, [stored, weight], dense(data, weight, ob, k=p["K"]), 0)


def _dense_ref(wl, arrays: list):
    p = wl.p
    x = arrays[0]
    if p.get("in_heads"):
        x = merge_heads_ref(x, p["in_heads"]).reshape(p["N"], p["C"])
    y = dense_ref(x, L.dense_weight_to_oi(arrays[1], wl.blocks[1], p["K"]))
    if p["bias"]:
        y = y + arrays[2]
    if p.get("residual"):
        y = y + arrays[-1]
    return epilogue_ref(p, y)


def _dense_check(wl):
    p, h = wl.p, wl.p.get("in_heads")
    rows = p.get("in_rows", p["N"])
    if "in_rows" in p and not h:
        raise WorkloadError("dense: in_rows is the rows of data given as heads; give in_heads too")
    if h and (rows < 1 or p["C"] % h or p["N"] % rows):
        raise WorkloadError(f"dense: data as {h} heads of rows={rows} needs heads to divide C={p['C']} and rows "
                            f"to divide N={p['N']}")


def _dense_task(n):
    x, h = _dense_data_shape(n), n.attrs.get("in_heads", 0)
    p = dict(N=_rows(x), C=x[-1], K=n.inputs[1].shape[0])
    if h:
        p["in_heads"] = h
        if x[-2] != p["N"]:
            p["in_rows"] = x[-2]
    return p, n.attrs.get("packing", L.DENSE_PACKING)


# ---------------------------------------------------------------- batch_matmul

def batch_matmul(a: Tensor, b: Tensor, trans_b: bool, name: str = "batch_matmul") -> Tensor:
    """a (..., M, K) x b (..., K, N), or b (..., N, K) when trans_b; batch dims broadcast."""
    k_ = a.shape[-1]
    n_ = b.shape[-2] if trans_b else b.shape[-1]
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    nb = len(batch)
    r = reduce_axis(k_, f"{name}_r")

    def f(*i):
        m, n = i[nb], i[nb + 1]
        rhs = b[broadcast_index(b.shape[:-2], batch, i[:nb]) + ((n, r.var) if trans_b else (r.var, n))]
        return sum_reduce(a[broadcast_index(a.shape[:-2], batch, i[:nb]) + (m, r.var)] * rhs, [r])

    return compute((*batch, a.shape[-2], n_), f, name, tag="batch_matmul", inputs=[a, b],
                   axis_names=[f"b{k}" for k in range(nb)] + ["m", "n"])


def _bmm_ref(a: np.ndarray, b: np.ndarray, trans_b: bool) -> np.ndarray:
    b = np.swapaxes(b, -1, -2) if trans_b else b
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _bmm_operands(node) -> tuple:
    """The shapes batch_matmul multiplies: each input's, split into heads where a_heads / b_heads say."""
    return tuple(split_heads_shape(v.shape, h) if (h := node.attrs.get(k, 0)) else tuple(v.shape)
                 for v, k in zip(node.inputs[:2], BMM_VIEWS))


def _bmm_eval(n, args):
    a, b = (split_heads_ref(x, h) if (h := n.attrs.get(k, 0)) else x for x, k in zip(args, BMM_VIEWS))
    return f32(_bmm_ref(a, b, n.attrs.get("trans_b", 0)))


def _bmm_te(n, ins, name):
    a, b = (split_heads(x, h, f"{name}_{k}") if (h := n.attrs.get(k, 0)) else x
            for x, k in zip(ins, BMM_VIEWS))
    return batch_matmul(a, b, bool(n.attrs.get("trans_b", 0)), name)


def _bmm_infer(node):
    tb = node.attrs.get("trans_b", 0)
    for v, k in zip(node.inputs[:2], BMM_VIEWS):
        h = node.attrs.get(k, 0)
        if h and (len(v.shape) < 2 or v.shape[-1] % h):
            raise GraphError(f"batch_matmul {node.name}: {k}={h} does not divide the last axis of {list(v.shape)}")
    a, b = _bmm_operands(node)
    k_b, n_ = (b[-1], b[-2]) if tb else (b[-2], b[-1])
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        batch = None
    if len(a) < 2 or len(b) < 2 or a[-1] != k_b or batch is None:
        raise GraphError(f"batch_matmul {node.name}: cannot multiply {list(a)} by {list(b)}"
                         f"{' (transposed)' if tb else ''}")
    return (*batch, a[-2], n_), "float32", ""


def _bmm_flops(n) -> float:
    return 2.0 * float(np.prod(n.output.shape)) * _bmm_operands(n)[0][-1]


def _bmm_task(n):
    a, b = _bmm_operands(n)
    if tuple(a[:-2]) != tuple(b[:-2]):
        raise NoTask(f"batch dims {list(a[:-2])} and {list(b[:-2])} broadcast")
    tb = n.attrs.get("trans_b", 0)
    if tb and a[-2] <= KEYS_IN_PLACE_ROWS:   # a few rows times K^T: a dot product per key (compile_model._reduction_vector)
        raise NoTask("a few rows times a transposed operand")
    p = dict(B=int(np.prod(a[:-2], dtype=np.int64)), M=a[-2], K=a[-1], N=b[-2] if tb else b[-1])
    p.update({k: n.attrs[k] for k in BMM_VIEWS if n.attrs.get(k)})
    return p, "NT" if tb else "NN"


def _bmm_build(wl):
    """Each operand (B, rows, cols), or stored (B / heads, rows, heads * cols) where a_heads /
    b_heads say, read as its heads."""
    p = wl.p

    def operand(rows, cols, key, name):
        h = p.get(key)
        if not h:
            t = placeholder((p["B"], rows, cols), name)
            return t, t
        t = placeholder((p["B"] // h, rows, h * cols), name)
        return t, compute((p["B"], rows, cols), lambda b, r, c: t[b // h, r, (b % h) * cols + c], f"{name}_heads",
                          inputs=[t])
    a, a_view = operand(p["M"], p["K"], "a_heads", "data")
    b, b_view = operand(*((p["N"], p["K"]) if wl.layout == "NT" else (p["K"], p["N"])), "b_heads", "rhs")
    return [a, b], batch_matmul(a_view, b_view, wl.layout == "NT")


def _bmm_wl_ref(wl, arrays):
    a, b = ((split_heads_ref(x, h).reshape(wl.p["B"], *x.shape[1:-1], x.shape[-1] // h) if (h := wl.p.get(k)) else x)
            for x, k in zip(arrays, BMM_VIEWS))
    return _bmm_ref(a, b, wl.layout == "NT")


def _bmm_check(wl):
    for k in BMM_VIEWS:
        if wl.p.get(k) and wl.p["B"] % wl.p[k]:
            raise WorkloadError(f"batch_matmul: {k}={wl.p[k]} does not divide B={wl.p['B']}")


def _export_bmm(ex, n, ins):
    if n.attrs.get("trans_b", 0) or n.attrs.get("a_heads") or n.attrs.get("b_heads"):
        raise GraphError(f"batch_matmul {n.name}: export of the transposed or heads form is not supported")
    ex.emit(n, "MatMul", ins)


register(
    OpDef(name="dense", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_dense_infer,
          evaluate=lambda n, args: f32(dense_ref(merge_heads_ref(args[0], h) if (h := n.attrs.get("in_heads"))
                                                 else args[0], args[1])),
          te=lambda n, ins, name: dense(merge_heads(ins[0], h, f"{name}_heads") if (h := n.attrs.get("in_heads"))
                                        else ins[0], ins[1], 0, name),
          flops=lambda n: dense_flops(_rows(_dense_data_shape(n)), n.inputs[1].shape[1], n.inputs[1].shape[0]),
          onnx_in={"Gemm": _onnx_gemm, "MatMul": _onnx_matmul, "Einsum": _onnx_einsum, "LSTM": onnx_lstm, "GRU": onnx_gru},
          onnx_out=_export_dense, task=_dense_task),
    WorkloadDef(name="dense", required=("C", "K"), defaults=dict(N=1, bias=0, relu=0), build=_dense_build,
                reference=_dense_ref, flops=lambda wl: dense_flops(wl.p["N"], wl.p["C"], wl.p["K"]),
                example="dense:N=1,C=2048,K=1000,bias=1", epilogue=True, layout="OI16o", check=_dense_check,
                optional=("residual", "in_heads", "in_rows"), views=("in_heads", "in_rows")),
    OpDef(name="batch_matmul", pattern=Pattern.OUT_EWISE_FUSABLE, infer=_bmm_infer,
          evaluate=_bmm_eval, te=_bmm_te, flops=_bmm_flops, onnx_out=_export_bmm, task=_bmm_task),
    WorkloadDef(name="batch_matmul", required=("M", "K", "N"), defaults=dict(B=1), build=_bmm_build,
                reference=_bmm_wl_ref, check=_bmm_check, optional=BMM_VIEWS, views=BMM_VIEWS,
                flops=lambda wl: 2.0 * wl.p["B"] * wl.p["M"] * wl.p["N"] * wl.p["K"],
                example="batch_matmul:B=12,M=128,K=64,N=128", layout="NN", layouts=("NN", "NT"),
                operands=("data", "rhs")),
)
