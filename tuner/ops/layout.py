"""layout_transform: an activation re-laid between NCHW, NHWC and NCHW[x]c (a pure index mapping);
the graph-side op the layout passes insert, and its kernel-side workload a model tune measures."""
from __future__ import annotations

from ..te import layouts as L
from ..te.layouts import block_of, fit_block
from ..te.tensor import Tensor, compute
from .common import from_nchw, nchw_dims, nchw_in, to_nchw, unary
from .registry import OpDef, Pattern, WorkloadDef, register


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
    db = fit_block(c_, block_of(dst))
    return compute((n_, c_ // db, h_, w_, db), lambda n, cc, h, w, cb: read(n, cc * db + cb, h, w), name,
                   inputs=[x], axis_names=["n", "cc", "h", "w", "cb"])


def _lt_infer(node):
    x, a = node.inputs[0], node.attrs
    n, c, h, w = nchw_dims(x.shape, a["src"])
    return L.act_shape(a["dst"], n, c, h, w), x.dtype, a["dst"]


def _lt_eval(node, args):
    return from_nchw(to_nchw(args[0], node.attrs["src"]), node.attrs["dst"]).astype(args[0].dtype)


register(
    OpDef(name="layout_transform", pattern=Pattern.INJECTIVE, infer=_lt_infer, evaluate=_lt_eval,
          te=lambda n, ins, name: layout_transform(ins[0], n.attrs["src"], n.attrs["dst"], name)),
    WorkloadDef(name="layout_transform", required=("C", "H", "W", "dst"), defaults=dict(N=1),
                build=unary(lambda d, wl: layout_transform(d, wl.layout, wl.p["dst"])),
                reference=lambda wl, a: L.act_from_nchw(nchw_in(wl, a), wl.p["dst"]),
                example="layout_transform:C=64,H=56,W=56,dst=NCHW16c"),
)
