"""Workloads: a kernel-side operator with concrete shapes, attributes and layout.

A workload builds its compute DAG, random inputs and the NumPy reference in its own layout (its
operator's WorkloadDef), and has a canonical key: a hash of op, params, layout and dtype that is
identical across processes and machines (never of object ids or dict order).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..te import layouts as L
from .common import pads4
from .elementwise import ACTIVATIONS
from .registry import WORKLOADS, WorkloadError

_INT_PARAMS = {"B", "M", "N", "C", "H", "W", "K", "R", "S", "stride", "dilation", "groups", "bias", "relu",
               "residual", "count_include_pad", "m", "ib", "a_heads", "b_heads", "in_heads", "in_rows"}


# An anchor's activation epilogue other than relu: act=<name> with that activation's parameters
# (ACTIVATIONS). Absent unless set, so the keys of workloads without one never changed.
EPILOGUE_ACTS = ("clip", "sigmoid", "hard_sigmoid", "hard_swish", "gelu", "gelu_tanh", "silu", "leaky_relu", "mish",
                 "elu", "selu", "celu", "softplus")


_FLOAT_PARAMS = {"lo", "hi", "alpha", "beta", "gamma"}


_SPEC_ORDER = ("B", "M", "N", "C", "H", "W", "K", "R", "S", "stride", "pad", "dilation", "groups", "ib", "bias", "residual",
               "relu", "m")


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

    @property
    def logged_op(self) -> str:
        """The operator name its keys are hashed with and its logs were first written under."""
        return WORKLOADS[self.op].key_name or self.op

    @cached_property
    def key(self) -> str:
        blob = json.dumps({"op": self.logged_op, "params": [list(kv) for kv in self.params], "layout": self.layout,
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

    def plain(self) -> "Workload | None":
        """The same computation with its operands given as they are read (no view parameters), whose
        records apply to this one by their decisions; None when it has no view parameters."""
        views = set(WORKLOADS[self.op].views) & set(self.p)
        return make(self.op, {k: v for k, v in self.p.items() if k not in views}, self.layout) if views else None

    def to_json(self) -> dict:
        return {"key": self.key, "name": self.name, "spec": self.spec, "layout": self.layout, "dtype": self.dtype}

    # ------------------------------------------------------------ shapes
    @cached_property
    def blocks(self) -> tuple:
        """(input channel block, output channel block) of a blocked layout, else (0, 0)."""
        p = self.p
        if WORKLOADS[self.op].layouts:
            return (0, 0)
        if self.op == "dense":
            return (0, L.dense_pack_block(p["K"], L.dense_block(self.layout)) if L.dense_block(self.layout) else 0)
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

    @property
    def live_flops(self) -> float:
        """The FLOPs a kernel cannot skip (a conv's products of padding left out)."""
        d = WORKLOADS[self.op]
        return (d.live_flops or d.flops)(self)

    @property
    def least_flops(self) -> float:
        """The arithmetic no kernel does without: what a timing faster than the peak allows is judged by."""
        d = WORKLOADS[self.op]
        return d.least_flops(self) if d.least_flops else self.live_flops

    # ------------------------------------------------------------ compute DAG
    def build(self) -> tuple:
        """(input tensors in argument order, output tensor)."""
        return WORKLOADS[self.op].build(self)

    @cached_property
    def constant_inputs(self) -> tuple:
        """Positions of the inputs a compiled model holds as constants (weights, biases): read once
        per inference, they arrive cold from memory there (measure.runner.RunConfig.cold_weights)."""
        return tuple(k for k, t in enumerate(self.build()[0]) if t.name in CONSTANT_INPUTS)

    def cold_bytes(self, arrays) -> list:
        """Per kernel argument, the bytes evicted before each call timed cold: a constant input's
        size, 0 for the others (the activations and the output stay warm)."""
        return [a.nbytes if k in self.constant_inputs else 0 for k, a in enumerate(arrays)]

    # ------------------------------------------------------------ data and reference
    def random_inputs(self, seed: int = 0) -> list:
        """Random, never all-zero inputs in this workload's layout (uniform in [-1, 1))."""
        rng = np.random.default_rng(seed)
        ins, _ = self.build()
        return [rng.uniform(-1.0, 1.0, size=t.shape).astype(np.float32) for t in ins]

    def reference(self, arrays: list) -> np.ndarray:
        """The expected output (float32) for `arrays` given in this workload's layout."""
        return WORKLOADS[self.op].reference(self, arrays).astype(np.float32)


def make(op: str, params: dict, layout: str | None = None, name: str = "") -> Workload:
    op = next((d.name for d in WORKLOADS.values() if d.key_name and d.key_name == op), op)   # a name it was logged under
    if op not in WORKLOADS:
        raise WorkloadError(f"unknown operator {op!r}: choose one of {', '.join(sorted(WORKLOADS))}")
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
            act_params = ACTIVATIONS[act][0]
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
        t = pads4(full["pad"])
        full["pad"] = t[0] if len(set(t)) == 1 else t
    layout = layout or default_layout(op)
    if d.layouts:
        if layout not in d.layouts:
            raise WorkloadError(f"{op} takes layout {' or '.join(d.layouts)}, not {layout!r}")
    elif op == "dense":
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
    return WORKLOADS[op].layout


def _validate(wl: Workload) -> None:
    p = wl.p
    for k, v in p.items():
        if k in _INT_PARAMS and (not isinstance(v, int) or v < 0):
            raise WorkloadError(f"{wl.op}: {k} must be a non-negative integer, got {v!r}")
        if k in _FLOAT_PARAMS and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise WorkloadError(f"{wl.op}: {k} must be a finite number, got {v!r}")
    for k in ("B", "M", "N", "C", "H", "W", "K", "R", "S", "stride", "dilation", "groups"):
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
                            f"(e.g. {example_spec(op if op in WORKLOADS else 'conv2d')})")
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
