"""The model compiler: a model and tuning logs -> one artifact that tuner.runtime loads."""
from .compile_model import DEFAULT_LAYOUT, UntunedError, compile_model

__all__ = ["DEFAULT_LAYOUT", "UntunedError", "compile_model"]
