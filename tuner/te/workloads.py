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

import numpy as np

from ..errors import UserError
from . import layouts as L
from . import ops
from .tensor import Tensor, placeholder

OPS = ("conv2d", "dense", "maxpool", "avgpool", "globalavgpool", "relu", "sigmoid", "clip", "add",
       "layout_transform")
_INT_PARAMS = {"N", "C", "H", "W", "K", "R", "S", "stride", "dilation", "groups", "bias", "relu",
               "residual", "count_include_pad"}
_DEFAULTS = {
    "conv2d": dict(N=1, stride=1, pad=0, dilation=1, groups=1, bias=0, relu=0, residual=0),
    "dense": dict(N=1, bias=0, relu=0),
    "maxpool": dict(N=1, stride=1, pad=0),
    "avgpool": dict(N=1, stride=1, pad=0, count_include_pad=0),
    "globalavgpool": dict(N=1),
    "relu": dict(N=1), "sigmoid": dict(N=1), "add": dict(N=1), "clip": dict(N=1, lo=0.0, hi=6.0),
    "layout_transform": dict(N=1),
}
_REQUIRED = {
    "conv2d": ("C", "H", "W", "K", "R", "S"), "dense": ("C", "K"),
    "maxpool": ("C", "H", "W", "R", "S"), "avgpool": ("C", "H", "W", "R", "S"),
    "globalavgpool": ("C", "H", "W"), "relu": ("C", "H", "W"), "sigmoid": ("C", "H", "W"),
    "clip": ("C", "H", "W"), "add": ("C", "H", "W"), "layout_transform": ("C", "H", "W", "dst"),
}


# An anchor's activation epilogue other than relu: act=<name> with that activation's parameters
# (ops.ACTIVATIONS). Absent unless set, so the keys of workloads without one never changed.
EPILOGUE_ACTS = ("clip", "sigmoid", "hard_sigmoid", "hard_swish")
_ACT_OPS = ("conv2d", "dense")
_FLOAT_PARAMS = {"lo", "hi", "alpha", "beta"}

_SPEC_ORDER = ("N", "C", "H", "W", "K", "R", "S", "stride", "pad", "dilation", "groups", "bias", "residual", "relu")


class WorkloadError(UserError):
    pass


def _pads(p) -> tuple:
    t = (p,) if isinstance(p, int) else tuple(p)
    if len(t) not in (1, 2, 4) or not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
        raise WorkloadError(f"pad must be one number, 'h.w' or 'top.left.bottom.right', got {p}")
    if min(t) < 0:
        raise WorkloadError(f"pad must not be negative, got {'.'.join(map(str, t))}")
    return t * 4 if len(t) == 1 else t * 2 if len(t) == 2 else t


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
        defaults = _DEFAULTS[self.op]
        shown = [k for k in order if k in _REQUIRED[self.op] or k in ("N", "stride", "pad") or p[k] != defaults.get(k)]
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
        c = p["C"]
        k = p.get("K", c)
        if self.op == "conv2d" and p["groups"] > 1:
            blk = L.fit_block(c, b)
            return (blk, blk)
        return (L.fit_block(c, b), L.fit_block(k, b))

    @property
    def flops(self) -> float:
        p = self.p
        if self.op == "conv2d":
            out = self._conv_out()
            return 2.0 * p["N"] * p["K"] * out[0] * out[1] * (p["C"] // p["groups"]) * p["R"] * p["S"]
        if self.op == "dense":
            return 2.0 * p["N"] * p["C"] * p["K"]
        if self.op in ("maxpool", "avgpool"):
            oh, ow = self._pool_out()
            return float(p["N"] * p["C"] * oh * ow * p["R"] * p["S"])
        return float(p["N"] * p["C"] * p["H"] * p["W"])

    def _conv_out(self):
        p = self.p
        t, lft, b, r = _pads(p["pad"])
        return (ops.conv_out_size(p["H"], p["R"], p["stride"], t, b, p["dilation"]),
                ops.conv_out_size(p["W"], p["S"], p["stride"], lft, r, p["dilation"]))

    def _pool_out(self):
        p = self.p
        t, lft, b, r = _pads(p["pad"])
        return (ops.conv_out_size(p["H"], p["R"], p["stride"], t, b, 1),
                ops.conv_out_size(p["W"], p["S"], p["stride"], lft, r, 1))

    # ------------------------------------------------------------ compute DAG
    def build(self) -> tuple:
        """(input tensors in argument order, output tensor)."""
        p, lay = self.p, self.layout
        ib, ob = self.blocks
        if self.op == "conv2d":
            g = p["groups"]
            data = placeholder(L.act_shape(lay, p["N"], p["C"], p["H"], p["W"], ib or None), "data")
            if lay == "NCHW":
                wshape = (p["K"], p["C"] // g, p["R"], p["S"])
            elif lay == "NHWC":
                wshape = (p["R"], p["S"], p["C"] // g, p["K"])
            else:
                wshape = ((p["K"] // ob, 1, p["R"], p["S"], 1, ob) if g > 1
                          else (p["K"] // ob, p["C"] // ib, p["R"], p["S"], ib, ob))
            weight = placeholder(wshape, "weight")
            out = ops.conv2d(data, weight, lay, p["stride"], _pads(p["pad"]), p["dilation"], g)
            return self._epilogue([data, weight], out, ob)
        if self.op == "dense":
            data = placeholder((p["N"], p["C"]), "data")
            wshape = (p["K"] // ob, p["C"], ob) if ob else (p["K"], p["C"])
            weight = placeholder(wshape, "weight")
            out = ops.dense(data, weight, ob)
            return self._epilogue([data, weight], out, 0)
        data = placeholder(L.act_shape(lay, p["N"], p["C"], p["H"], p["W"], ib or None), "data")
        if self.op in ("maxpool", "avgpool"):
            out = ops.pool2d(data, lay, self.op[:3], (p["R"], p["S"]), p["stride"], _pads(p["pad"]),
                             bool(p.get("count_include_pad", 0)), name=self.op)
            return [data], out
        if self.op == "globalavgpool":
            return [data], ops.global_avg_pool(data, lay)
        if self.op == "relu":
            return [data], ops.relu(data)
        if self.op == "sigmoid":
            return [data], ops.sigmoid(data)
        if self.op == "clip":
            return [data], ops.clip(data, p["lo"], p["hi"])
        if self.op == "add":
            other = placeholder(data.shape, "other")
            return [data, other], ops.add(data, other)
        if self.op == "layout_transform":
            return [data], ops.layout_transform(data, lay, p["dst"])
        raise WorkloadError(f"no compute for op {self.op!r}")

    def _epilogue(self, inputs: list, out: Tensor, ob: int):
        p = self.p
        k = p["K"]
        if p.get("bias"):
            shape = (k,) if self.op == "dense" else ops.channel_bias_shape(self.layout, k, ob)
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

    # ------------------------------------------------------------ data and reference
    def random_inputs(self, seed: int = 0) -> list:
        """Random, never all-zero inputs in this workload's layout (uniform in [-1, 1))."""
        rng = np.random.default_rng(seed)
        ins, _ = self.build()
        return [rng.uniform(-1.0, 1.0, size=t.shape).astype(np.float32) for t in ins]

    def reference(self, arrays: list) -> np.ndarray:
        """The expected output (float32) for `arrays` given in this workload's layout."""
        p, lay = self.p, self.layout
        ib, ob = self.blocks
        if self.op == "conv2d":
            x = L.act_to_nchw(arrays[0], lay)
            w = L.conv_weight_to_oihw(arrays[1], lay)
            y = ops.conv2d_ref(x, w, p["stride"], _pads(p["pad"]), p["dilation"], p["groups"])
            rest = arrays[2:]
            if p["bias"]:
                # every bias layout flattens to channel order: (K,1,1), (K,), (K/b,1,1,b)
                y = y + rest.pop(0).reshape(-1)[None, :, None, None]
            y = L.act_from_nchw(y, lay, ob or None)
            if p["residual"]:
                y = y + rest.pop(0)
            return self._act_ref(y).astype(np.float32)
        if self.op == "dense":
            w = L.dense_weight_to_oi(arrays[1], ob)
            y = ops.dense_ref(arrays[0], w)
            if p["bias"]:
                y = y + arrays[2]
            return self._act_ref(y).astype(np.float32)
        x = L.act_to_nchw(arrays[0], lay).astype(np.float64)
        if self.op in ("maxpool", "avgpool"):
            y = ops.pool2d_ref(x, self.op[:3], (p["R"], p["S"]), p["stride"], _pads(p["pad"]),
                               bool(p.get("count_include_pad", 0)))
        elif self.op == "globalavgpool":
            y = x.mean(axis=(2, 3), keepdims=True)
        elif self.op in ("relu", "sigmoid", "clip"):
            y = ops.activation_ref(x, self.op, p)
        elif self.op == "add":
            y = x + L.act_to_nchw(arrays[1], lay)
        elif self.op == "layout_transform":
            return L.act_from_nchw(x, p["dst"]).astype(np.float32)
        else:
            raise WorkloadError(f"no reference for op {self.op!r}")
        return L.act_from_nchw(y, lay, ib or None).astype(np.float32)

    def _act_ref(self, y: np.ndarray) -> np.ndarray:
        p = self.p
        if p["relu"]:
            y = ops.activation_ref(y, "relu")
        if p.get("act"):
            y = ops.activation_ref(y, p["act"], p)
        return y


# ---------------------------------------------------------------- construction and parsing

def make(op: str, params: dict, layout: str | None = None, name: str = "") -> Workload:
    if op not in OPS:
        raise WorkloadError(f"unknown operator {op!r}: choose one of {', '.join(OPS)}")
    full = dict(_DEFAULTS[op])
    full.update(params)
    missing = [k for k in _REQUIRED[op] if k not in full]
    if missing:
        raise WorkloadError(f"{op} needs {', '.join(missing)} (e.g. {example_spec(op)})")
    takes = set(_DEFAULTS[op]) | set(_REQUIRED[op])
    if op in _ACT_OPS:
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
    if op == "layout_transform":
        L.check_activation_layout(full["dst"])
    wl = Workload(op, tuple(sorted(full.items())), layout, name)
    _validate(wl)
    return wl


def default_layout(op: str) -> str:
    return "OI16o" if op == "dense" else "NCHW16c" if op == "conv2d" else "NCHW"


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
    if wl.op == "conv2d":
        g = p["groups"]
        if p["C"] % g or p["K"] % g:
            raise WorkloadError(f"conv2d: groups={g} must divide C={p['C']} and K={p['K']}")
        if L.block_of(wl.layout) and g > 1 and not (g == p["C"] == p["K"]):
            raise WorkloadError(f"conv2d in {wl.layout} supports groups=1 or depthwise (groups=C=K); "
                                f"groups={g} needs layout NCHW or NHWC")
        if min(wl._conv_out()) < 1:
            raise WorkloadError(f"conv2d: kernel {p['R']}x{p['S']} does not fit input {p['H']}x{p['W']}")
    if wl.op in ("maxpool", "avgpool") and min(wl._pool_out()) < 1:
        raise WorkloadError(f"{wl.op}: window {p['R']}x{p['S']} does not fit input {p['H']}x{p['W']}")
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
    return {
        "conv2d": "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1",
        "dense": "dense:N=1,C=2048,K=1000,bias=1",
        "maxpool": "maxpool:C=64,H=112,W=112,R=3,S=3,stride=2,pad=1",
        "avgpool": "avgpool:C=64,H=56,W=56,R=3,S=3,stride=1,pad=1",
        "globalavgpool": "globalavgpool:C=2048,H=7,W=7",
        "layout_transform": "layout_transform:C=64,H=56,W=56,dst=NCHW16c",
    }.get(op, f"{op}:C=64,H=56,W=56")


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
