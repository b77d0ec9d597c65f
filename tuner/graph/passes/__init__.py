"""Graph passes; importing this package registers them all."""
from ...errors import UserError
from . import (convert_layout, extract_tasks, fuse_ops, head_views, merge_conv, pad_columns, simple,  # noqa: F401
               simplify_inference, transformer_ops)
from . import pad_channels as _pad_channels  # noqa: F401 (registers PadChannels; optimize's option shares the name)
from . import merge_dense as _merge_dense  # noqa: F401 (registers MergeParallelDense; optimize's option shares the name)
from .base import REGISTRY, Pass, PassContext, PassTiming, PrintIR, Sequential

DEFAULT_PIPELINE = ("InferType", "FuseTransformerOps", "SimplifyInference", "MergeConvBranches",
                    "FoldConstant", "EliminateCommonSubexpr", "DeadCodeElimination", "PadChannels", "ConvertLayout", "FoldConstant",
                    "EliminateCommonSubexpr", "DeadCodeElimination", "AbsorbHeadViews", "PackWideRows", "FuseOps", "ExtractTasks")
GRAPH_CHOICES = ("fuse_attention", "merge_dense")    # optimize's options with a cost either way (model_tuning times them)


def get(name: str) -> Pass:
    if name not in REGISTRY:
        raise UserError(f"unknown pass {name!r}; passes are {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def optimize(graph, layout: str | None = None, passes=None, disabled=(), opt_level: int = 3, instruments=(),
             layout_plan: dict | None = None, fuse_attention: bool = False, merge_dense: bool = False,
             pad_channels: bool = True, lanes: int | None = None):
    """Run `passes` (default: the standard pipeline) under a PassContext. layout_plan: {conv node
    name: layout} for the convolutions that take another layout than `layout`; fuse_attention:
    ExtractTasks makes each attention one group (fuse_ops.fuse_attention); merge_dense: the default
    pipeline runs MergeParallelDense after FuseTransformerOps; pad_channels: PadChannels may pad
    (the layout solver's compiles say False), counting the lanes of the target's vectors (`lanes`; None:
    the layout's block)."""
    names = list(passes) if passes else list(DEFAULT_PIPELINE)
    if merge_dense and not passes:
        names.insert(names.index("FuseTransformerOps") + 1, "MergeParallelDense")
    seq = Sequential([get(n) for n in names])
    options = {"layout": layout} if layout else {}
    if layout_plan:
        options["layout_plan"] = dict(layout_plan)
    if fuse_attention:
        options["fuse_attention"] = True
    if not pad_channels:
        options["pad_channels"] = False
    if lanes:
        options["lanes"] = lanes
    ctx = PassContext(opt_level, set(disabled), list(instruments), options)
    with ctx:
        return seq(graph, ctx)


__all__ = ["REGISTRY", "Pass", "PassContext", "PassTiming", "PrintIR", "Sequential", "optimize", "get",
           "DEFAULT_PIPELINE", "GRAPH_CHOICES"]
