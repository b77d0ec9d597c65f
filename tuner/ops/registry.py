"""The operator registry: per operator one OpDef (the graph side) and, for one that can be a
tuning task, one WorkloadDef (the kernel side), both registered by the operator's family module.
Passes, the ONNX frontend, task extraction, the interpreter and the compiler read these tables,
never an if-chain of op names."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable

import numpy as np

from ..errors import GraphError, UserError


class Pattern(IntEnum):
    """Fusion patterns, ordered as in TVM's FuseOps: a group fuses producers of a lower pattern."""
    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_EWISE_FUSABLE = 4
    OPAQUE = 8


class Unsupported(GraphError):
    """The kernel library cannot run this node (named in the message); exit 2."""


class NoTask(Exception):
    """This node has no kernel-side workload; the message says why."""


class WorkloadError(UserError):
    pass


def output_elements(node) -> float:
    return float(np.prod(node.output.shape))


def nchw_elements(wl) -> float:
    p = wl.p
    return float(p["N"] * p["C"] * p["H"] * p["W"])


@dataclass(frozen=True, kw_only=True)
class OpDef:
    """An operator of the graph IR."""
    name: str
    pattern: Pattern                  # fusion pattern (FuseOps)
    infer: Callable                   # node -> (shape, dtype, layout)
    evaluate: Callable                # (node, NumPy args) -> array (float32 math in float64)
    te: Callable                      # (node, input Tensors in the node's layouts, stage name) -> output Tensor
    flops: Callable = output_elements  # node -> float
    onnx_in: dict = field(default_factory=dict)   # ONNX op type -> importer (cx, ins, attrs) -> [Value]
    onnx_out: Callable | None = None  # exporter (ex, node, input names) -> None; None: not exported
    task: Callable | None = None      # node -> (params of its WorkloadDef, the one of the same name, layout);
                                      # raises NoTask
    integers: bool = False            # exact on integers carried as float32 (below 2^24): data movement,
                                      # selection, comparison, add/sub/mul/neg; the rest take float32 only


@dataclass(frozen=True, kw_only=True)
class WorkloadDef:
    """A kernel-side operator: what a Workload of it takes, computes and costs."""
    name: str
    required: tuple                # parameters a spec must give
    defaults: dict                 # parameters with their defaults
    build: Callable                # Workload -> (input tensors, output tensor)
    reference: Callable            # (Workload, arrays in its layout) -> output in its layout
    flops: Callable = nchw_elements  # Workload -> float
    live_flops: Callable | None = None  # Workload -> the FLOPs no kernel can skip (a conv's products that read
                                   # the input, not its padding); None: all of `flops`
    least_flops: Callable | None = None  # Workload -> the operations no kernel does without (1 FLOP each, an
                                   # FMA 2), where `flops` counts more (a transform's products by +-1); None: live_flops
    check: Callable | None = None  # Workload -> None, raising WorkloadError for shapes that do not fit
    example: str = ""              # a spec to show in errors
    epilogue: bool = False         # takes bias/residual/relu and act=... (workload.EPILOGUE_ACTS)
    optional: tuple = ()           # parameters without a default, left out of the key when absent
    layout: str = "NCHW"           # the layout of a spec given without one
    key_name: str = ""             # the name its keys are hashed with and logged specs may give, when it
                                   # was first logged under another (logs keep matching); its stage name too
    operands: tuple = ("data", "weight")   # its input placeholders that are the anchor node's inputs, in order
    layouts: tuple = ()            # the only layouts it takes (empty: activation layouts, or dense packings)
    views: tuple = ()              # parameters that only say where an operand's elements lie (Workload.plain)

    def shown(self) -> set:
        """Parameters a spec always shows (the rest only when not the default)."""
        return set(self.required) | {"N", "stride", "pad"}


OPS: dict = {}          # name -> OpDef
WORKLOADS: dict = {}    # name -> WorkloadDef


def register(*defs) -> None:
    for d in defs:
        table = OPS if isinstance(d, OpDef) else WORKLOADS
        if d.name in table:
            raise AssertionError(f"operator {d.name} is defined twice")
        table[d.name] = d


def opdef(node) -> OpDef:
    d = OPS.get(node.op)
    if d is None:
        raise Unsupported(f"{node.op} node {node.name!r}: no such operator (operators: {', '.join(sorted(OPS))})")
    return d


def infer(node) -> tuple:
    """(shape, dtype, layout) of the node's output."""
    if node.op not in OPS:
        raise GraphError(f"no shape rule for op {node.op!r}")
    if not OPS[node.op].integers:
        bad = next((v for v in node.inputs if v.dtype.startswith("int")), None)
        if bad is not None:
            raise GraphError(f"{node.op} {node.name}: input {bad.name} is {bad.dtype}; {node.op} takes float32 "
                             "(cast it to float first)")
    return OPS[node.op].infer(node)


def evaluate(node, args: list) -> np.ndarray:
    """The node's output for NumPy `args` (float32 in, float32 out; math in float64)."""
    if node.op not in OPS:
        raise GraphError(f"no evaluator for op {node.op!r}")
    return OPS[node.op].evaluate(node, args)


def to_te(node, ins: list, name: str):
    """The node as a tensor expression over `ins` (Tensors in its inputs' layouts); `name` (a C
    identifier, never a user-given name) prefixes every stage it makes."""
    return opdef(node).te(node, ins, name)


def flops(node) -> float:
    return opdef(node).flops(node)
