"""Workloads: an operator with concrete shapes, attributes and layout.

A workload builds its compute DAG, random inputs and the NumPy reference in its own layout,
and has a canonical key: a hash of op, params, layout and dtype that is identical across
processes and machines (never of object ids or dict order).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from ..errors import UserError
from . import layouts as L
from . import ops
from . import winograd as WG
from .tensor import Tensor, placeholder

_INT_PARAMS = {"N", "C", "H", "W", "K", "R", "S", "stride", "dilation", "groups", "bias", "relu",
               "residual", "count_include_pad", "m", "ib"}

# An anchor's activation epilogue other than relu: act=<name> with that activation's parameters
# (ops.ACTIVATIONS). Absent unless set, so the keys of workloads without one never changed.
EPILOGUE_ACTS = ("clip", "sigmoid", "hard_sigmoid", "hard_swish")
_FLOAT_PARAMS = {"lo", "hi", "alpha", "beta"}

_SPEC_ORDER = ("N", "C", "H", "W", "K", "R", "S", "stride", "pad", "dilation", "groups", "ib", "bias", "residual",
               "relu", "m")


class WorkloadError(UserError):
    pass


def _pads(p) -> tuple:
    t = (p,) if isinstance(p, int) else tuple(p)
    if len(t) not in (1, 2, 4) or not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
        raise WorkloadError(f"pad must be one number, 'h.w' or 'top.left.bottom.right', got {p}")
    if min(t) < 0:
        raise WorkloadError(f"pad must not be negative, got {'.'.join(map(str, t))}")
    return t * 4 if len(t) == 1 else t * 2 if len(t) == 2 else t


# placeholder names of the inputs that are a model's constants (Workload.constant_inputs)
CONSTANT_INPUTS = ("weight", "bias")


@dataclass(frozen=True)
class Workload:
    op: str
    params: tuple          # sorted (name, value) pairs, canonical
    layout: str
    name: str = ""         # display name only; not part of the key
    dtype: str = "float32"

    # ------------------------------------------------------------ identity
    @property
    def p(self) -> dict:
        return dict(self.params)

    @cached_property
    def key(self) -> str:
        blob = json.dumps({"op": self.op, "params": [list(kv) for kv in self.params], "layout": self.layout,
                           "dtype": self.dtype}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def spec(self) -> str:
        """Readable spec in conventional order, defaults left out; parses back to the same key."""
        def fmt(v):
            return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        p = self.p
        order = [k for k in _SPEC_ORDER if k in p] + sorted(k for k in p if k not in _SPEC_ORDER)
        d = WORKLOADS[self.op]
        shown = [k for k in order if k in d.shown() or p[k] != d.defaults.get(k)]
        return f"{self.op}:" + ",".join(f"{k}={fmt(p[k])}" for k in shown)

    @property
    def label(self) -> str:
        return f"{self.name or self.spec} [{self.layout}]"

    def with_layout(self, layout: str) -> "Workload":
        return make(self.op, self.p, layout, self.name)

    def to_json(self) -> dict:
        return {"key": self.key, "name": self.name, "spec": self.spec, "layout": self.layout, "dtype": self.dtype}

    # ------------------------------------------------------------ shapes
    @cached_property
    def blocks(self) -> tuple:
        """(input channel block, output channel block) of a blocked layout, else (0, 0)."""
        p = self.p
        if self.op == "dense":
            return (0, L.fit_block(p["K"], L.dense_block(self.layout)) if L.dense_block(self.layout) else 0)
        b = L.block_of(self.layout)
        if not b:
            return (0, 0)
        c = p.get("C", p.get("K"))      # winograd_output has only K
        k = p.get("K", c)
        if self.op == "conv2d" and p["groups"] > 1:
            blk = L.fit_block(c, b)
            return (blk, blk)
        return (p.get("ib") or L.fit_block(c, b), L.fit_block(k, b))

    @property
    def flops(self) -> float:
        return WORKLOADS[self.op].flops(self)

    # ------------------------------------------------------------ compute DAG
    def build(self) -> tuple:
        """(input tensors in argument order, output tensor)."""
        return WORKLOADS[self.op].build(self)

    @cached_property
    def constant_inputs(self) -> tuple:
        """Positions of the inputs a compiled model holds as constants (weights, biases): read once
        per inference, they arrive cold from memory there (measure.runner.RunConfig.cold_weights)."""
        return tuple(k for k, t in enumerate(self.build()[0]) if t.name in CONSTANT_INPUTS)

    # ------------------------------------------------------------ data and reference
    def random_inputs(self, seed: int = 0) -> list:
        """Random, never all-zero inputs in this workload's layout (uniform in [-1, 1))."""
        rng = np.random.default_rng(seed)
        ins, _ = self.build()
        return [rng.uniform(-1.0, 1.0, size=t.shape).astype(np.float32) for t in ins]

    def reference(self, arrays: list) -> np.ndarray:
        """The expected output (float32) for `arrays` given in this workload's layout."""
        return WORKLOADS[self.op].reference(self, arrays).astype(np.float32)


# ---------------------------------------------------------------- the workload operators
#
# One WorkloadDef per kernel-side operator: its parameters, compute DAG, NumPy reference and FLOPs.
# The math of every reference and every FLOP count is the te.ops function the graph operator of the
# same name uses too (graph.ops.OpDef.workload names its WorkloadDef), so no formula is written twice.

def _window_out(p: dict, dilation: int = 1) -> tuple:
    t, lft, b, r = _pads(p["pad"])
    return (ops.conv_out_size(p["H"], p["R"], p["stride"], t, b, dilation),
            ops.conv_out_size(p["W"], p["S"], p["stride"], lft, r, dilation))


def _data(wl: Workload):
    p = wl.p
    return placeholder(L.act_shape(wl.layout, p["N"], p["C"], p["H"], p["W"], wl.blocks[0] or None), "data")


def _nchw_in(wl: Workload, arrays: list) -> np.ndarray:
    return L.act_to_nchw(arrays[0], wl.layout).astype(np.float64)


def _nchw_out(wl: Workload, y: np.ndarray) -> np.ndarray:
    return L.act_from_nchw(y, wl.layout, wl.blocks[0] or None)


def _epilogue(wl: Workload, inputs: list, out: Tensor, ob: int):
    """bias, residual, then relu or act=..., each an input and a stage when its parameter is set."""
    p = wl.p
    if p.get("bias"):
        shape = (p["K"],) if wl.op == "dense" else ops.channel_bias_shape(wl.layout, p["K"], ob)
        bias = placeholder(shape, "bias")
        inputs.append(bias)
        out = ops.add(out, bias, name="bias_add")
    if p.get("residual"):
        res = placeholder(out.shape, "residual")
        inputs.append(res)
        out = ops.add(out, res, name="residual_add")
    if p.get("relu"):
        out = ops.relu(out)
    if p.get("act"):
        out = ops.activation(out, p["act"], p, name=p["act"])
    return inputs, out


def _act_ref(p: dict, y: np.ndarray) -> np.ndarray:
    if p.get("relu"):
        y = ops.activation_ref(y, "relu")
    if p.get("act"):
        y = ops.activation_ref(y, p["act"], p)
    return y


def _conv_build(wl: Workload):
    p, lay = wl.p, wl.layout
    ib, ob = wl.blocks
    g = p["groups"]
    if lay == "NCHW":
        wshape = (p["K"], p["C"] // g, p["R"], p["S"])
    elif lay == "NHWC":
        wshape = (p["R"], p["S"], p["C"] // g, p["K"])
    else:
        wshape = ((p["K"] // ob, 1, p["R"], p["S"], 1, ob) if g > 1
                  else (p["K"] // ob, p["C"] // ib, p["R"], p["S"], ib, ob))
    data, weight = _data(wl), placeholder(wshape, "weight")
    out = ops.conv2d(data, weight, lay, p["stride"], _pads(p["pad"]), p["dilation"], g)
    return _epilogue(wl, [data, weight], out, ob)


def _conv_ref(wl: Workload, arrays: list):
    p = wl.p
    w = L.conv_weight_to_oihw(arrays[1], wl.layout)
    y = ops.conv2d_ref(_nchw_in(wl, arrays), w, p["stride"], _pads(p["pad"]), p["dilation"], p["groups"])
    rest = list(arrays[2:])
    if p["bias"]:
        # every bias layout flattens to channel order: (K,1,1), (K,), (K/b,1,1,b)
        y = y + rest.pop(0).reshape(-1)[None, :, None, None]
    y = L.act_from_nchw(y, wl.layout, wl.blocks[1] or None)
    if p["residual"]:
        y = y + rest.pop(0)
    return _act_ref(p, y)


def _conv_check(wl: Workload):
    p = wl.p
    g = p["groups"]
    if "ib" in p and not (L.block_of(wl.layout) and g == 1 and 1 <= p["ib"] <= L.MAX_BLOCK and p["C"] % p["ib"] == 0):
        raise WorkloadError(f"conv2d: ib={p['ib']} (the input's channel block, when it is read in another block "
                            f"than the output's) needs a blocked layout, groups=1 and a block dividing C={p['C']}")
    if p["C"] % g or p["K"] % g:
        raise WorkloadError(f"conv2d: groups={g} must divide C={p['C']} and K={p['K']}")
    if L.block_of(wl.layout) and g > 1 and not (g == p["C"] == p["K"]):
        raise WorkloadError(f"conv2d in {wl.layout} supports groups=1 or depthwise (groups=C=K); "
                            f"groups={g} needs layout NCHW or NHWC")
    if min(_window_out(p, p["dilation"])) < 1:
        raise WorkloadError(f"conv2d: kernel {p['R']}x{p['S']} does not fit input {p['H']}x{p['W']}")


def _conv_flops(wl: Workload):
    p = wl.p
    oh, ow = _window_out(p, p["dilation"])
    return ops.conv2d_flops(p["N"] * p["K"] * oh * ow, p["C"] // p["groups"], p["R"], p["S"])


def _dense_build(wl: Workload):
    p = wl.p
    ob = wl.blocks[1]
    data = placeholder((p["N"], p["C"]), "data")
    weight = placeholder((p["K"] // ob, p["C"], ob) if ob else (p["K"], p["C"]), "weight")
    return _epilogue(wl, [data, weight], ops.dense(data, weight, ob), 0)


def _dense_ref(wl: Workload, arrays: list):
    p = wl.p
    y = ops.dense_ref(arrays[0], L.dense_weight_to_oi(arrays[1], wl.blocks[1]))
    if p["bias"]:
        y = y + arrays[2]
    return _act_ref(p, y)


def _pool_build(wl: Workload):
    p, data = wl.p, _data(wl)
    return [data], ops.pool2d(data, wl.layout, wl.op[:3], (p["R"], p["S"]), p["stride"], _pads(p["pad"]),
                              bool(p.get("count_include_pad", 0)), name=wl.op)


def _pool_ref(wl: Workload, arrays: list):
    p = wl.p
    return _nchw_out(wl, ops.pool2d_ref(_nchw_in(wl, arrays), wl.op[:3], (p["R"], p["S"]), p["stride"],
                                        _pads(p["pad"]), bool(p.get("count_include_pad", 0))))


def _pool_check(wl: Workload):
    p = wl.p
    if min(_window_out(p)) < 1:
        raise WorkloadError(f"{wl.op}: window {p['R']}x{p['S']} does not fit input {p['H']}x{p['W']}")


def _pool_flops(wl: Workload):
    p = wl.p
    oh, ow = _window_out(p)
    return ops.window_flops(p["N"] * p["C"] * oh * ow, p["R"], p["S"])


def _unary(te_fn):
    """build for a one-input workload: te_fn(data placeholder, Workload) -> output."""
    def build(wl: Workload):
        data = _data(wl)
        return [data], te_fn(data, wl)
    return build


def _act_def(op: str) -> "WorkloadDef":
    return WorkloadDef(op, ("C", "H", "W"), dict(N=1, **ops.ACTIVATIONS[op][0]),
                       _unary(lambda d, wl: ops.activation(d, op, wl.p)),
                       lambda wl, a: _nchw_out(wl, ops.activation_ref(_nchw_in(wl, a), op, wl.p)))


def _add_build(wl: Workload):
    data = _data(wl)
    other = placeholder(data.shape, "other")
    return [data, other], ops.add(data, other)


def _elements(wl: Workload) -> float:
    p = wl.p
    return float(p["N"] * p["C"] * p["H"] * p["W"])


# Winograd F(m x m, 3 x 3): the three kernels of one 3x3 stride-1 NHWC convolution (te.winograd).
# Each takes the convolution's own parameters (C, H, W, K, pad) and the tile size m.

def _wino_out(p: dict) -> tuple:
    return WG.out_size(p["H"], p["W"], p["pad"])


def _wino_products(p: dict) -> tuple:
    """(alpha, tiles): the transform size and how many tiles cover the output."""
    th, tw = WG.tiles(*_wino_out(p), p["m"])
    return WG.alpha(p["m"]), p["N"] * th * tw


def _wino_v_shape(p: dict, channels: int) -> tuple:
    return WG.v_shape(p["N"], p["H"], p["W"], p["pad"], p["m"], channels)


def _wino_input_build(wl: Workload):
    p = wl.p
    data = placeholder(L.act_shape(wl.layout, p["N"], p["C"], p["H"], p["W"], wl.blocks[0] or None), "data")
    return [data], WG.input_transform(data, p["pad"], p["m"], layout=wl.layout)


def _wino_gemm_build(wl: Workload):
    p = wl.p
    al = WG.alpha(p["m"])
    v = placeholder(_wino_v_shape(p, p["C"]), "data")
    u = placeholder((al, al, p["C"], p["K"]), "weight")
    return [v, u], WG.batch_gemm(v, u)


def _wino_output_build(wl: Workload):
    p = wl.p
    mm = placeholder(_wino_v_shape(p, p["K"]), "data")
    return _epilogue(wl, [mm], WG.output_transform(mm, *_wino_out(p), p["m"], layout=wl.layout), wl.blocks[1])


def _wino_output_ref(wl: Workload, arrays: list):
    p = wl.p
    y = WG.output_ref(arrays[0], *_wino_out(p), p["m"])
    rest = list(arrays[1:])
    if p["bias"]:
        y = y + _nhwc(wl, rest.pop(0))
    if p["residual"]:
        y = y + _nhwc(wl, rest.pop(0))
    return _from_nhwc(wl, _act_ref(p, y))


def _nhwc(wl: Workload, a: np.ndarray) -> np.ndarray:
    """An activation (or a bias in the layout's channel_bias_shape) of the workload's layout as NHWC."""
    if wl.layout == "NHWC":
        return a
    if a.ndim < 5:                                   # a blocked bias: (channel blocks, 1, 1, block)
        return a.reshape(-1)
    return L.act_to_nchw(a, wl.layout).transpose(0, 2, 3, 1)


def _from_nhwc(wl: Workload, y: np.ndarray) -> np.ndarray:
    return y if wl.layout == "NHWC" else L.act_from_nchw(y.transpose(0, 3, 1, 2), wl.layout)


def _wino_check(wl: Workload):
    p = wl.p
    if p["m"] not in WG.TILES:
        raise WorkloadError(f"{wl.op}: tile size m={p['m']} is not one of {', '.join(map(str, WG.TILES))}")
    if wl.layout != "NHWC" and not (wl.op != "winograd_gemm" and L.block_of(wl.layout)):
        raise WorkloadError(f"{wl.op} runs in NHWC{'' if wl.op == 'winograd_gemm' else ' or NCHW[x]c'}, "
                            f"not {wl.layout}")
    if not 0 <= p["pad"] <= 2 or min(_wino_out(p)) < 1:
        raise WorkloadError(f"{wl.op}: a 3x3 window with pad={p['pad']} does not fit input {p['H']}x{p['W']}")


def _wino_input_flops(wl: Workload) -> float:
    """What the kernel computes: per V element, BT's non-zero entries of two rows (te.winograd.sparse_rows)."""
    al, t = _wino_products(wl.p)
    width = WG.sparse_rows(WG.MATRICES[wl.p["m"]][0])[0].shape[1]
    return 2.0 * al * al * width * width * t * wl.p["C"]


def _wino_gemm_flops(wl: Workload) -> float:
    al, t = _wino_products(wl.p)
    return 2.0 * al * al * t * wl.p["C"] * wl.p["K"]


def _wino_output_flops(wl: Workload) -> float:
    """Per output element, AT's non-zero entries of two rows."""
    p = wl.p
    oh, ow = _wino_out(p)
    width = WG.sparse_rows(WG.MATRICES[p["m"]][2])[0].shape[1]
    return 2.0 * width * width * p["N"] * oh * ow * p["K"]


_WINO = dict(N=1, pad=1, m=2)


@dataclass(frozen=True)
class WorkloadDef:
    op: str
    required: tuple                # parameters a spec must give
    defaults: dict                 # parameters with their defaults
    build: Callable                # Workload -> (input tensors, output tensor)
    reference: Callable            # (Workload, arrays in its layout) -> output in its layout
    flops: Callable = _elements    # Workload -> float
    check: Callable | None = None  # Workload -> None, raising WorkloadError for shapes that do not fit
    example: str = ""              # a spec to show in errors
    epilogue: bool = False         # takes bias/residual/relu and act=... (EPILOGUE_ACTS)
    optional: tuple = ()           # parameters without a default, left out of the key when absent

    def shown(self) -> set:
        """Parameters a spec always shows (the rest only when not the default)."""
        return set(self.required) | {"N", "stride", "pad"}


WORKLOADS: dict = {d.op: d for d in [
    WorkloadDef("conv2d", ("C", "H", "W", "K", "R", "S"),
                dict(N=1, stride=1, pad=0, dilation=1, groups=1, bias=0, relu=0, residual=0),
                _conv_build, _conv_ref, _conv_flops, _conv_check,
                "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1", epilogue=True,
                # ib: a blocked conv reading its input in another channel block than it writes
                # (NCHW16c in, NCHW8c out): the layout transform fused into its loads
                optional=("ib",)),
    WorkloadDef("dense", ("C", "K"), dict(N=1, bias=0, relu=0), _dense_build, _dense_ref,
                lambda wl: ops.dense_flops(wl.p["N"], wl.p["C"], wl.p["K"]), None,
                "dense:N=1,C=2048,K=1000,bias=1", epilogue=True),
    WorkloadDef("maxpool", ("C", "H", "W", "R", "S"), dict(N=1, stride=1, pad=0), _pool_build, _pool_ref,
                _pool_flops, _pool_check, "maxpool:C=64,H=112,W=112,R=3,S=3,stride=2,pad=1"),
    WorkloadDef("avgpool", ("C", "H", "W", "R", "S"), dict(N=1, stride=1, pad=0, count_include_pad=0),
                _pool_build, _pool_ref, _pool_flops, _pool_check, "avgpool:C=64,H=56,W=56,R=3,S=3,stride=1,pad=1"),
    WorkloadDef("globalavgpool", ("C", "H", "W"), dict(N=1),
                _unary(lambda d, wl: ops.global_avg_pool(d, wl.layout)),
                lambda wl, a: L.act_from_nchw(ops.global_avg_pool_ref(_nchw_in(wl, a)), wl.layout,
                                              wl.blocks[0] or None),
                example="globalavgpool:C=2048,H=7,W=7"),
    *(_act_def(op) for op in ("relu", "sigmoid", "clip")),
    WorkloadDef("add", ("C", "H", "W"), dict(N=1), _add_build,
                lambda wl, a: _nchw_out(wl, ops.BINARY_FNS["add"][1](_nchw_in(wl, a),
                                                                     _nchw_in(wl, a[1:])))),
    WorkloadDef("winograd_input", ("C", "H", "W"), dict(_WINO), _wino_input_build,
                lambda wl, a: WG.input_ref(_nhwc(wl, a[0]), wl.p["pad"], wl.p["m"]), _wino_input_flops, _wino_check,
                "winograd_input:C=256,H=14,W=14,pad=1,m=2"),
    WorkloadDef("winograd_gemm", ("C", "H", "W", "K"), dict(_WINO), _wino_gemm_build,
                lambda wl, a: WG.gemm_ref(a[0], a[1]), _wino_gemm_flops, _wino_check,
                "winograd_gemm:C=256,H=14,W=14,K=256,pad=1,m=2"),
    WorkloadDef("winograd_output", ("H", "W", "K"), dict(_WINO, bias=0, relu=0, residual=0), _wino_output_build,
                _wino_output_ref, _wino_output_flops, _wino_check,
                "winograd_output:H=14,W=14,K=256,pad=1,m=2,bias=1,relu=1", epilogue=True),
    WorkloadDef("layout_transform", ("C", "H", "W", "dst"), dict(N=1),
                _unary(lambda d, wl: ops.layout_transform(d, wl.layout, wl.p["dst"])),
                lambda wl, a: L.act_from_nchw(_nchw_in(wl, a), wl.p["dst"]),
                example="layout_transform:C=64,H=56,W=56,dst=NCHW16c"),
]}
OPS = tuple(WORKLOADS)


# ---------------------------------------------------------------- construction and parsing

def make(op: str, params: dict, layout: str | None = None, name: str = "") -> Workload:
    if op not in OPS:
        raise WorkloadError(f"unknown operator {op!r}: choose one of {', '.join(OPS)}")
    d = WORKLOADS[op]
    full = dict(d.defaults)
    full.update(params)
    missing = [k for k in d.required if k not in full]
    if missing:
        raise WorkloadError(f"{op} needs {', '.join(missing)} (e.g. {example_spec(op)})")
    takes = set(d.defaults) | set(d.required) | set(d.optional)
    if d.epilogue:
        takes.add("act")
        act = full.get("act") or ""
        if act:
            if act not in EPILOGUE_ACTS:
                raise WorkloadError(f"{op}: act={act!r} is not an epilogue activation; use one of "
                                    f"{', '.join(EPILOGUE_ACTS)} (or relu=1)")
            if full.get("relu"):
                raise WorkloadError(f"{op}: relu=1 and act={act} are two activations; give one")
            act_params = ops.ACTIVATIONS[act][0]
            takes |= set(act_params)
            full = {**act_params, **full}
        else:
            full.pop("act", None)
    for k in _FLOAT_PARAMS & set(full):
        if isinstance(full[k], int) and not isinstance(full[k], bool):
            full[k] = float(full[k])         # one spelling per value, so one key
    unknown = set(full) - takes
    if unknown:
        raise WorkloadError(f"{op} does not take {', '.join(sorted(unknown))}; it takes "
                            f"{', '.join(sorted(takes))}")
    if "pad" in full:
        t = _pads(full["pad"])
        full["pad"] = t[0] if len(set(t)) == 1 else t
    layout = layout or default_layout(op)
    if op == "dense":
        L.dense_block(layout)
    else:
        L.check_activation_layout(layout)
    b, c = L.block_of(layout), full.get("C")
    if "ib" in full and b and isinstance(c, int) and c > 0 and full["ib"] == L.fit_block(c, b):
        del full["ib"]                       # the layout's own input block: one key per kernel
    if op == "layout_transform":
        L.check_activation_layout(full["dst"])
    wl = Workload(op, tuple(sorted(full.items())), layout, name)
    _validate(wl)
    return wl


def default_layout(op: str) -> str:
    return ("OI16o" if op == "dense" else "NCHW16c" if op == "conv2d" else "NHWC" if op.startswith("winograd")
            else "NCHW")


def _validate(wl: Workload) -> None:
    p = wl.p
    for k, v in p.items():
        if k in _INT_PARAMS and (not isinstance(v, int) or v < 0):
            raise WorkloadError(f"{wl.op}: {k} must be a non-negative integer, got {v!r}")
        if k in _FLOAT_PARAMS and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise WorkloadError(f"{wl.op}: {k} must be a finite number, got {v!r}")
    for k in ("N", "C", "H", "W", "K", "R", "S", "stride", "dilation", "groups"):
        if k in p and p[k] < 1:
            raise WorkloadError(f"{wl.op}: {k} must be at least 1, got {p[k]}")
    check = WORKLOADS[wl.op].check
    if check:
        check(wl)
    inputs, output = wl.build()
    for t in inputs + [output]:
        if math.prod(t.shape) >= MAX_ELEMENTS:
            raise WorkloadError(f"{wl.op}: tensor {t.name} of shape {'x'.join(map(str, t.shape))} has 2^31 or "
                                "more elements; generated kernels index tensors with 32-bit offsets")


MAX_ELEMENTS = 1 << 31      # per tensor: the generated C indexes with int


def tensor_bytes(wl: Workload) -> int:
    """Bytes of every input and the output of a workload (float32)."""
    inputs, output = wl.build()
    return 4 * sum(math.prod(t.shape) for t in inputs + [output])


def example_spec(op: str) -> str:
    return WORKLOADS[op].example if op in WORKLOADS and WORKLOADS[op].example else f"{op}:C=64,H=56,W=56"


def parse_spec(spec: str, layout: str | None = None) -> Workload:
    """Parse 'conv2d:N=1,C=64,...' (pad may be 1, 1.2 or 1.1.2.2)."""
    op, sep, rest = spec.partition(":")
    op = op.strip().lower()
    if not sep or not rest.strip():
        raise WorkloadError(f"cannot read workload {spec!r}: expected op:key=value,... "
                            f"(e.g. {example_spec(op if op in OPS else 'conv2d')})")
    params = {}
    for item in rest.split(","):
        k, eq, v = item.partition("=")
        k, v = k.strip(), v.strip()
        if not eq or not k or not v:
            raise WorkloadError(f"cannot read {item!r} in workload {spec!r}: expected key=value")
        params[k] = _parse_value(k, v, spec)
    return make(op, params, layout)


def _parse_value(k: str, v: str, spec: str):
    if k in ("dst", "act"):
        return v
    try:
        if k == "pad":
            parts = [int(x) for x in v.split(".")]
            return parts[0] if len(parts) == 1 else tuple(parts)
        if k in _FLOAT_PARAMS:
            return float(v)
        return int(v)
    except ValueError:
        raise WorkloadError(f"{k}={v!r} in workload {spec!r} is not a number") from None


# ---------------------------------------------------------------- the built-in set

def _conv(C, H, K, R=1, stride=1, **kw):
    pad = (R - 1) // 2
    return dict(N=1, C=C, H=H, W=H, K=K, R=R, S=R, stride=stride, pad=pad, **kw)


def _r50_stage(s: int, cin: int, mid: int, out: int, hw_in: int, stride: int):
    hw = hw_in // stride
    yield f"r50.s{s}.conv1x1a", _conv(cin, hw_in, mid)              # first block, reduce
    if stride == 2:
        yield f"r50.s{s}.conv3x3s2", _conv(mid, hw_in, mid, 3, 2)
    yield f"r50.s{s}.conv3x3", _conv(mid, hw, mid, 3)
    yield f"r50.s{s}.conv1x1b", _conv(mid, hw, out)                 # expand
    if stride == 2:
        yield f"r50.s{s}.conv1x1ds", _conv(cin, hw_in, out, 1, 2)   # projection shortcut
    yield f"r50.s{s}.conv1x1c", _conv(out, hw, mid)                 # later blocks, reduce


def _builtin_specs():
    yield "r50.stem.conv7x7", "conv2d", _conv(3, 224, 64, 7, 2)
    for s, (cin, mid, out, hw, st) in enumerate([(64, 64, 256, 56, 1), (256, 128, 512, 56, 2),
                                                  (512, 256, 1024, 28, 2), (1024, 512, 2048, 14, 2)], 1):
        for name, p in _r50_stage(s, cin, mid, out, hw, st):
            yield name, "conv2d", p
    yield "r18.s1.conv3x3", "conv2d", _conv(64, 56, 64, 3)
    for s, (cin, c, hw) in enumerate([(64, 128, 56), (128, 256, 28), (256, 512, 14)], 2):
        yield f"r18.s{s}.conv3x3s2", "conv2d", _conv(cin, hw, c, 3, 2)
        yield f"r18.s{s}.conv3x3", "conv2d", _conv(c, hw // 2, c, 3)
        yield f"r18.s{s}.conv1x1ds", "conv2d", _conv(cin, hw, c, 1, 2)
    for c, hw, st in [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
                      (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]:
        yield f"mbv2.dw{c}.{hw}s{st}", "conv2d", _conv(c, hw, c, 3, st, groups=c)
    yield "dense.512x1000", "dense", dict(N=1, C=512, K=1000, bias=1)
    yield "dense.2048x1000", "dense", dict(N=1, C=2048, K=1000, bias=1)


BUILTIN = {name: (op, params) for name, op, params in _builtin_specs()}


def builtin(name: str, layout: str | None = None) -> Workload:
    op, params = BUILTIN[name]
    return make(op, params, layout, name)


def resolve(text: str, layout: str | None = None) -> Workload:
    """A built-in name (r50.s1.conv3x3) or an explicit spec (conv2d:C=...,...)."""
    text = text.strip()
    if text in BUILTIN:
        return builtin(text, layout)
    if ":" in text:
        wl = parse_spec(text, layout)
        for name, (op, params) in BUILTIN.items():  # give explicit specs their built-in name
            if op == wl.op and make(op, params, wl.layout).key == wl.key:
                return make(op, params, wl.layout, name)
        return wl
    close = [n for n in BUILTIN if text.split(".")[0] in n][:5]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise WorkloadError(f"unknown workload {text!r}{hint}; `tuner workloads` lists the built-in set, "
                        f"or give a spec such as {example_spec('conv2d')}")
