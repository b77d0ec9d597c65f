"""tuner: an autotuning, search-based scheduler for deep-learning operators."""
__version__ = "0.1.0"


def tune_op(*args, **kwargs):
    """Tune one operator workload; see tuner.tuning.tune_op."""
    from .tuning import tune_op as _tune_op
    return _tune_op(*args, **kwargs)


def tune(*args, **kwargs):
    """Tune a whole model (a built-in name, an .onnx path or a Graph) under one trial budget and
    log its layout plan; see tuner.model_tuning.tune_model."""
    from .model_tuning import tune_model
    return tune_model(*args, **kwargs)


def build_op(*args, **kwargs):
    """Build the best logged schedule of a workload into a callable; see tuner.build.build_op."""
    from .build import build_op as _build_op
    return _build_op(*args, **kwargs)


def analyze(*args, **kwargs):
    """Summarise a tuning log; see tuner.analysis.report.analyze."""
    from .analysis.report import analyze as _analyze
    return _analyze(*args, **kwargs)


def compile(*args, **kwargs):
    """Compile a whole model with the best schedules of its logs; see tuner.runtime.compiler.compile_model."""
    from .runtime import compile_model
    return compile_model(*args, **kwargs)


def load(path):
    """Load a compiled model saved by CompiledModel.save or `tuner compile -o`."""
    from .runtime import load as _load
    return _load(path)
