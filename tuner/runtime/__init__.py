"""Compiled models: one shared library with every kernel and a generated executor over a static
arena, one weights file, and a Python loader that calls it once per inference."""
from .compiler import compile_model
from .model import CompiledModel, load

__all__ = ["compile_model", "CompiledModel", "load"]
