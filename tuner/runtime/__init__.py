"""Running compiled models: load an artifact (one shared library with every kernel and a generated
executor over a static arena, one weights file, model.json) and call it once per inference. It
never imports the compiler: a deployment needs only this package, the toolchain's loader, numpy
and cffi."""
from .model import CompiledModel, load

__all__ = ["CompiledModel", "load"]
