"""Graph IR, frontends (ONNX, built-in models), passes, fusion, layout conversion, task extraction."""
from __future__ import annotations

from pathlib import Path

from .ir import Graph, GraphError
from .models import MODELS, load_model
from .onnx_frontend import load_onnx


def parse_input_shapes(items) -> dict:
    """['input=1x3x224x224', ...] -> {'input': [1, 3, 224, 224]}"""
    out = {}
    for item in items or ():
        name, eq, dims = item.partition("=")
        try:
            shape = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            shape = None
        if not eq or not name or not shape or any(d < 1 for d in shape):
            raise GraphError(f"cannot read --input-shape {item!r}: expected NAME=1x3x224x224")
        out[name] = shape
    return out


def load(model: str, input_shapes: dict | None = None, **onnx_options) -> Graph:
    """A built-in model by name, or an ONNX file by path (onnx_options: onnx_frontend.from_onnx's
    run_time and folded)."""
    if model in MODELS:
        if input_shapes:
            raise GraphError(f"{model} is a built-in model with a fixed input shape; --input-shape is for ONNX files")
        return load_model(model)
    if Path(model).exists() or model.endswith(".onnx"):
        return load_onnx(model, input_shapes, **onnx_options)
    raise GraphError(f"no built-in model or file {model!r}; built-in models are {', '.join(MODELS)}")
