"""Operators: one module per family (conv, dense, pool, elementwise, winograd, layout, shape,
reduce, resize), each holding its operators' graph definitions (OpDef: shape inference, NumPy evaluation,
tensor expression, FLOPs, ONNX import and export, the task rule) and kernel-side workloads
(WorkloadDef: spec parameters, compute, reference, FLOPs) next to the tensor expressions and NumPy
references both use. Adding an operator is one entry in its family's module, and its tests."""
from . import conv, dense, elementwise, layout, pool, reduce, resize, shape, winograd  # noqa: F401  (each registers its ops)
from .common import kernel_layout, nchw_dims
from .elementwise import ACTIVATIONS, BINARY_FNS, act_params, channel_bias_shape
from .registry import (OPS, WORKLOADS, NoTask, OpDef, Pattern, Unsupported, WorkloadDef, WorkloadError, evaluate, flops,
                       infer, opdef, to_te)
from .workload import (BUILTIN, CONSTANT_INPUTS, EPILOGUE_ACTS, Workload, builtin, default_layout, example_spec, make,
                       parse_spec, resolve, tensor_bytes)

UNARY = tuple(ACTIVATIONS)
BINARY = tuple(BINARY_FNS)
PATTERN = {name: d.pattern for name, d in OPS.items()}

__all__ = ["ACTIVATIONS", "BINARY", "BINARY_FNS", "BUILTIN", "CONSTANT_INPUTS", "EPILOGUE_ACTS", "OPS", "PATTERN",
           "UNARY", "WORKLOADS", "NoTask", "OpDef", "Pattern", "Unsupported", "Workload", "WorkloadDef",
           "WorkloadError", "act_params", "builtin", "channel_bias_shape", "default_layout", "evaluate",
           "example_spec", "flops", "infer", "kernel_layout", "make", "nchw_dims", "opdef", "parse_spec", "resolve",
           "tensor_bytes", "to_te"]
