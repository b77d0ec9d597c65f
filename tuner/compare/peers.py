"""The peers a compiled model is compared with, on the same graph and input: ONNX Runtime (default
CPU provider, all graph optimisations) and PyTorch eager (the graph run op by op with
torch.nn.functional, in NCHW or channels_last), and the interleaved timing of all of them.

Timing is interleaved round by round (each round times every runner once, in turn), so that a
slow spell of a shared machine hits every runner alike, each turn after an idle pause, so that no
runner shares the cores with the last one's spinning threads; the figure reported is the median
over rounds of each round's median call time.
"""
from __future__ import annotations


import numpy as np

from ..errors import SetupError, UserError
from ..graph import Graph
from ..graph.onnx_frontend import to_onnx
from ..measure.interleave import interleaved, paired_ratios, time_call  # noqa: F401 (the peers' timing)


def onnxruntime_runner(graph: Graph, threads: int, onnx_path: str | None = None, optimize: bool = True):
    """A callable(inputs) -> outputs running `graph` (or the ONNX file it came from) in ONNX Runtime,
    with its graph optimisations (fusions that round differently) or, optimize=False, none."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise SetupError("onnxruntime is not installed: pip install onnxruntime (or the project's [test] extra)") from None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else \
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if onnx_path is None:               # (a graph is needed only without a file)
        model = to_onnx(graph).SerializeToString()
    else:
        model = onnx_path
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda inputs: sess.run(None, dict(zip(names, inputs)))


def _torch():
    try:
        import torch
    except ImportError:
        raise SetupError("torch is not installed: pip install torch (or the project's [bench] extra)") from None
    return torch


def torch_runner(graph: Graph, threads: int, channels_last: bool = False):
    """A callable(inputs) -> outputs running the NCHW `graph` op by op in PyTorch eager mode."""
    torch = _torch()
    F = torch.nn.functional
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    consts: dict = {}

    def const(v):
        t = consts.get(id(v))
        if t is None:
            t = torch.from_numpy(np.array(v.data, order="C"))      # a copy: torch wants it writable
            if t.ndim == 4:
                t = t.contiguous(memory_format=fmt)
            consts[id(v)] = t
        return t

    def conv(n, x, w):
        a = n.attrs
        pt, pl, pb, pr = a["pads"]
        if (pt, pl) != (pb, pr):
            x = F.pad(x, (pl, pr, pt, pb))
            pt = pl = 0
        return F.conv2d(x, w, None, tuple(a["strides"]), (pt, pl), tuple(a["dilations"]), a["groups"])

    def pool(n, x):
        a = n.attrs
        pt, pl, pb, pr = a["pads"]
        if n.op == "max_pool2d":
            if (pt, pl) != (pb, pr):
                x = F.pad(x, (pl, pr, pt, pb), value=float("-inf"))
                pt = pl = 0
            return F.max_pool2d(x, tuple(a["kernel"]), tuple(a["strides"]), (pt, pl))
        return F.avg_pool2d(x, tuple(a["kernel"]), tuple(a["strides"]), (pt, pl),
                            count_include_pad=bool(a.get("count_include_pad", 0)))

    ops = {
        "conv2d": lambda n, x, w: conv(n, x, w),
        "dense": lambda n, x, w: F.linear(x, w),
        "add": lambda n, a, b: a + b, "sub": lambda n, a, b: a - b, "mul": lambda n, a, b: a * b,
        "div": lambda n, a, b: a / b,
        "relu": lambda n, x: F.relu(x),
        "sigmoid": lambda n, x: torch.sigmoid(x),
        "clip": lambda n, x: torch.clamp(x, n.attrs.get("min"), n.attrs.get("max")),
        "hard_sigmoid": lambda n, x: torch.clamp(n.attrs.get("alpha", 0.2) * x + n.attrs.get("beta", 0.5), 0, 1),
        "hard_swish": lambda n, x: F.hardswish(x),
        "leaky_relu": lambda n, x: F.leaky_relu(x, n.attrs.get("alpha", 0.01)),
        "silu": lambda n, x: F.silu(x),
        "batch_norm": lambda n, x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, n.attrs["epsilon"]),
        "max_pool2d": pool, "avg_pool2d": pool,
        "global_avg_pool2d": lambda n, x: F.adaptive_avg_pool2d(x, 1),
        "flatten": lambda n, x: torch.flatten(x, n.attrs["axis"]),
        "reshape": lambda n, x: torch.reshape(x, tuple(n.attrs["shape"])),
        "transpose": lambda n, x: x.permute(*n.attrs["perm"]),
        "concat": lambda n, *xs: torch.cat(xs, n.attrs["axis"]),
        "softmax": lambda n, x: torch.softmax(x, n.attrs["axis"]),
        "mean": lambda n, x: torch.mean(x, tuple(n.attrs["axes"]), bool(n.attrs.get("keepdims", 1))),
        # transformers
        "gather": lambda n, t, i: gather(n, t, i),
        "batch_matmul": lambda n, a, b: torch.matmul(a, b.transpose(-1, -2) if n.attrs.get("trans_b") else b),
        "layer_norm": lambda n, x, s, b: F.layer_norm(x, x.shape[n.attrs["axis"]:], s.reshape(x.shape[n.attrs["axis"]:]),
                                                      b.reshape(x.shape[n.attrs["axis"]:]), n.attrs["epsilon"]),
        "erf": lambda n, x: torch.erf(x), "tanh": lambda n, x: torch.tanh(x), "exp": lambda n, x: torch.exp(x),
        "sqrt": lambda n, x: torch.sqrt(x), "neg": lambda n, x: -x, "pow": lambda n, a, b: torch.pow(a, b),
        "gelu": lambda n, x: F.gelu(x), "gelu_tanh": lambda n, x: F.gelu(x, approximate="tanh"),
    }

    def gather(n, table, idx):
        axis = n.attrs["axis"]
        i = idx.reshape(-1).long()
        flat = torch.index_select(table, axis, torch.where(i < 0, i + table.shape[axis], i))    # ONNX: -1 is the last
        return flat.reshape(table.shape[:axis] + idx.shape + table.shape[axis + 1:])
    for n in graph.nodes:
        if n.op not in ops or (len(n.inputs[0].shape) == 5 if n.inputs else False):
            raise UserError(f"{n.op} node {n.name!r} has no PyTorch equivalent here")

    def run(inputs):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            env = {}
            for v, x in zip(graph.inputs, inputs):
                t = torch.from_numpy(x)
                env[id(v)] = t.contiguous(memory_format=fmt) if t.ndim == 4 else t
            for n in graph.nodes:
                env[id(n.output)] = ops[n.op](n, *(const(v) if v.is_const else env[id(v)] for v in n.inputs))
            return [env[id(v)].contiguous().numpy() for v in graph.outputs]

    return run
