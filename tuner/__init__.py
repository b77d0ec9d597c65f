"""tuner: an autotuning, search-based compiler for deep-learning models.

The public API, each name the function itself (so help() shows its parameters), imported on
first use: `import tuner` alone loads nothing else, and tuner.load needs only tuner.runtime.
"""
__version__ = "0.1.0"

# public name -> (module, attribute)
_API = {
    "tune": ("tuner.model_tuning", "tune_model"),         # a whole model, one trial budget, its layout plan
    "tune_op": ("tuner.tuning", "tune_op"),               # one operator workload
    "compile": ("tuner.compiler", "compile_model"),       # a model + logs -> a CompiledModel
    "load": ("tuner.runtime", "load"),                    # an artifact written by CompiledModel.save
    "build_op": ("tuner.build", "build_op"),              # one workload's best logged schedule -> a callable
    "analyze": ("tuner.analysis.report", "analyze"),      # a tuning log -> a report
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    import importlib
    module, attr = _API[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_API])
