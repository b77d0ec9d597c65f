"""ONNX import (opsets 11-21, the operators CNNs use) and export of built-in models.

Import covers what PyTorch's exporter writes for CNNs, e.g. global average pooling written as
ReduceMean over H and W (imported as global_avg_pool2d so layout conversion can carry it).
Every failure is an OnnxImportError that names the problem and, where there is one, the node.
"""
from __future__ import annotations

import numpy as np

from ..errors import UserError
from .ir import Graph, GraphBuilder, GraphError

SUPPORTED = ("Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Constant", "Conv", "Div", "Dropout",
             "Flatten", "Gemm", "GlobalAveragePool", "HardSigmoid", "HardSwish", "Identity", "MatMul", "MaxPool",
             "Mul", "Pad", "ReduceMean", "Relu", "Reshape", "Sigmoid", "Softmax", "Sub", "Transpose")
OPSETS = range(11, 22)


class OnnxImportError(UserError):
    pass


def _onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:  # pragma: no cover - onnx is a dependency
        raise OnnxImportError("reading ONNX files needs the onnx package: pip install onnx") from None
    return onnx, numpy_helper


def load_onnx(path: str, input_shapes: dict | None = None) -> Graph:
    onnx, _ = _onnx()
    try:
        model = onnx.load(str(path))
    except FileNotFoundError:
        raise OnnxImportError(f"no such file: {path}") from None
    except Exception as e:  # protobuf DecodeError and friends
        raise OnnxImportError(f"{path} is not a readable ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    if not model.graph.node:
        raise OnnxImportError(f"{path} is not a readable ONNX model (it has no graph nodes)")
    return from_onnx(model, input_shapes, str(path))


def _attrs(node) -> dict:
    onnx, numpy_helper = _onnx()
    out = {}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.INT:
            out[a.name] = a.i
        elif a.type == onnx.AttributeProto.FLOAT:
            out[a.name] = a.f
        elif a.type == onnx.AttributeProto.INTS:
            out[a.name] = list(a.ints)
        elif a.type == onnx.AttributeProto.FLOATS:
            out[a.name] = list(a.floats)
        elif a.type == onnx.AttributeProto.STRING:
            out[a.name] = a.s.decode()
        elif a.type == onnx.AttributeProto.TENSOR:
            out[a.name] = numpy_helper.to_array(a.t)
    return out


def from_onnx(model, input_shapes: dict | None = None, source: str = "model") -> Graph:
    onnx, numpy_helper = _onnx()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset not in OPSETS:
        raise OnnxImportError(f"{source} uses opset {opset}; supported opsets are {OPSETS.start}-{OPSETS.stop - 1}")
    g = model.graph
    b = GraphBuilder(g.name or "onnx")
    env: dict = {}
    for init in g.initializer:
        env[init.name] = b.const(numpy_helper.to_array(init), init.name)
    input_shapes = dict(input_shapes or {})
    for inp in g.input:
        if inp.name in env:
            continue
        dims = []
        for _k, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(d.dim_value)
            else:
                dims.append(None)
        if inp.name in input_shapes:
            given = list(input_shapes.pop(inp.name))
            if len(given) != len(dims) or any(x is not None and x != y for x, y in zip(dims, given)):
                raise OnnxImportError(f"--input-shape {inp.name}={'x'.join(map(str, given))} does not match the "
                                      f"model's {['?' if x is None else x for x in dims]}")
            dims = given
        if any(d is None for d in dims):
            shown = "x".join("?" if d is None else str(d) for d in dims)
            raise OnnxImportError(f"input {inp.name!r} has a dynamic shape {shown}; give a concrete one with "
                                  f"--input-shape {inp.name}={'x'.join('1' if d is None else str(d) for d in dims)}")
        env[inp.name] = b.input(inp.name, dims, layout="NCHW" if len(dims) == 4 else "")
    if input_shapes:
        raise OnnxImportError(f"--input-shape names {', '.join(input_shapes)}, which the model has no input called")
    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(f"unsupported operator {node.domain}.{node.op_type} (node {node.name!r})")
        if node.op_type not in SUPPORTED:
            raise OnnxImportError(f"unsupported operator {node.op_type} (node {node.name!r}); supported: "
                                  f"{', '.join(SUPPORTED)}")
        ins = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name not in env:
                raise OnnxImportError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which nothing defines")
            else:
                ins.append(env[name])
        try:
            outs = _convert(b, node, ins, _attrs(node), opset)
        except GraphError as e:
            raise OnnxImportError(f"node {node.name!r} ({node.op_type}): {e}") from None
        for name, v in zip(node.output, outs):
            env[name] = v
    outputs = []
    for o in g.output:
        if o.name not in env:
            raise OnnxImportError(f"graph output {o.name!r} is never computed")
        outputs.append(env[o.name])
    return b.finish(outputs, {"source": source, "opset": opset})


def _const(v, what: str, node):
    if v is None or not v.is_const:
        raise OnnxImportError(f"node {node.name!r} ({node.op_type}): {what} must be a constant")
    return v.data


def _scalar_value(data, what: str, node) -> float:
    """A scalar given as a 0-d or one-element tensor."""
    arr = np.asarray(data).reshape(-1)
    if arr.size != 1:
        raise OnnxImportError(f"node {node.name!r} ({node.op_type}): {what} must be a single value")
    return float(arr[0])


def _window(node, a: dict, kernel=None) -> tuple:
    """(kernel_shape, strides, dilations) of a 2-D Conv or pooling node, each two positive integers;
    a kernel_shape that disagrees with the weight (`kernel`) is refused rather than ignored."""
    name, op = node.name or node.output[0], node.op_type
    given = a.get("kernel_shape", kernel)
    if given is None:
        raise OnnxImportError(f"node {name!r} ({op}): kernel_shape is missing")
    out = []
    for attr, v in (("kernel_shape", given), ("strides", a.get("strides", [1, 1])),
                    ("dilations", a.get("dilations", [1, 1]))):
        v = list(v) if isinstance(v, (list, tuple)) else v
        if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and x >= 1 for x in v):
            raise OnnxImportError(f"node {name!r} ({op}): {attr} must be two positive integers, got {v}")
        out.append(v)
    if kernel is not None and out[0] != list(kernel):
        raise OnnxImportError(f"node {name!r} ({op}): kernel_shape {out[0]} disagrees with the weight's "
                              f"spatial shape {list(kernel)}")
    return tuple(out)


def _pads(a: dict, in_hw, kernel, strides, dilations, node=None) -> list:
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = a.get("pads", [0, 0, 0, 0])
        if not isinstance(p, (list, tuple)) or len(p) != 4 or not all(isinstance(x, int) and x >= 0 for x in p):
            where = f"node {node.name or node.output[0]!r} ({node.op_type}): " if node is not None else ""
            raise OnnxImportError(f"{where}pads must be four non-negative integers, got {p}")
        return [p[0], p[1], p[2], p[3]]
    if auto == "VALID":
        return [0, 0, 0, 0]
    pads_begin, pads_end = [], []
    for size, k, s, d in zip(in_hw, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        pads_begin.append(small if auto == "SAME_UPPER" else big)
        pads_end.append(big if auto == "SAME_UPPER" else small)
    return [pads_begin[0], pads_begin[1], pads_end[0], pads_end[1]]


def _convert(b: GraphBuilder, node, ins, a: dict, opset: int) -> list:
    op = node.op_type
    name = node.name or node.output[0]
    x = ins[0] if ins else None
    if op in ("Identity", "Dropout"):
        return [x]
    if op == "Constant":
        if "value" not in a:
            raise OnnxImportError(f"node {name!r} (Constant): only the 'value' form is supported")
        return [b.const(a["value"], node.output[0])]
    if op == "Conv":
        w = _const(ins[1], "the weight", node)
        if len(w.shape) != 4:
            raise OnnxImportError(f"node {name!r} (Conv): only 2-D convolutions are supported")
        k, strides, dil = _window(node, a, list(w.shape[2:]))
        pads = _pads(a, x.shape[2:], k, strides, dil, node)
        y = b.add("conv2d", [x, ins[1]], {"strides": strides, "pads": pads, "dilations": dil,
                                          "groups": a.get("group", 1), "layout": "NCHW", "kernel_layout": "OIHW"}, name)
        if len(ins) > 2 and ins[2] is not None:
            bias = _const(ins[2], "the bias", node)
            y = b.add("add", [y, b.const(bias.reshape(-1, 1, 1), f"{name}_bias")], {}, f"{name}_bias_add")
        return [y]
    if op == "Gemm":
        if a.get("transA", 0):
            x = b.add("transpose", [x], {"perm": [1, 0]}, f"{name}_transA")
        w = _const(ins[1], "the weight (B)", node)
        w = w if a.get("transB", 0) else w.T
        y = b.add("dense", [x, b.const(np.ascontiguousarray(w), f"{name}_w")], {}, name)
        alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
        if alpha != 1.0:
            y = b.add("mul", [y, b.const(np.float32(alpha), f"{name}_alpha")], {}, f"{name}_alpha")
        if len(ins) > 2 and ins[2] is not None:
            c = ins[2] if beta == 1.0 or not ins[2].is_const else b.const(ins[2].data * beta, f"{name}_c")
            y = b.add("add", [y, c], {}, f"{name}_bias")
        return [y]
    if op == "MatMul":
        if ins[1] is None or not ins[1].is_const or len(x.shape) != 2 or ins[1].data.ndim != 2:
            raise OnnxImportError(f"node {name!r} (MatMul): only 2-D activation x constant 2-D weight is supported")
        return [b.add("dense", [x, b.const(np.ascontiguousarray(ins[1].data.T), f"{name}_w")], {}, name)]
    if op in ("Add", "Sub", "Mul", "Div"):
        return [b.add(op.lower(), [x, ins[1]], {}, name)]
    if op == "Relu":
        return [b.add("relu", [x], {}, name)]
    if op == "Sigmoid":
        return [b.add("sigmoid", [x], {}, name)]
    if op == "Clip":
        lo, hi = a.get("min", -np.inf), a.get("max", np.inf)
        if len(ins) > 1 and ins[1] is not None:
            lo = _scalar_value(_const(ins[1], "min", node), "min", node)
        if len(ins) > 2 and ins[2] is not None:
            hi = _scalar_value(_const(ins[2], "max", node), "max", node)
        return [b.add("clip", [x], {"min": float(lo), "max": float(hi)}, name)]
    if op == "HardSigmoid":
        return [b.add("hard_sigmoid", [x], {"alpha": a.get("alpha", 0.2), "beta": a.get("beta", 0.5)}, name)]
    if op == "HardSwish":
        return [b.add("hard_swish", [x], {}, name)]
    if op == "BatchNormalization":
        for k, what in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")):
            _const(ins[k], what, node)
        return [b.add("batch_norm", ins[:5], {"epsilon": a.get("epsilon", 1e-5), "layout": "NCHW"}, name)]
    if op in ("MaxPool", "AveragePool"):
        if len(x.shape) != 4:
            raise OnnxImportError(f"node {name!r} ({op}): only 2-D pooling is supported")
        k, strides, dil = _window(node, a)
        if any(d != 1 for d in dil):
            raise OnnxImportError(f"node {name!r} ({op}): dilated pooling is not supported")
        pads = _pads(a, x.shape[2:], k, strides, [1, 1], node)
        if a.get("ceil_mode", 0):
            for size, kk, s, lo, hi in zip(x.shape[2:], k, strides, pads[:2], pads[2:]):
                if (size + lo + hi - kk) % s:
                    raise OnnxImportError(f"node {name!r} ({op}): ceil_mode=1 changes the output size here; "
                                          "only ceil_mode=0 is supported")
        attrs = {"kernel": list(k), "strides": list(strides), "pads": pads, "layout": "NCHW"}
        if op == "AveragePool":
            attrs["count_include_pad"] = a.get("count_include_pad", 0)
        return [b.add("max_pool2d" if op == "MaxPool" else "avg_pool2d", [x], attrs, name)]
    if op == "GlobalAveragePool":
        return [b.add("global_avg_pool2d", [x], {"layout": "NCHW"}, name)]
    if op == "ReduceMean":
        axes = a.get("axes")
        if axes is None and len(ins) > 1 and ins[1] is not None:
            axes = [int(v) for v in _const(ins[1], "axes", node)]
        axes = sorted(ax % len(x.shape) for ax in (axes if axes is not None else range(len(x.shape))))
        keep = a.get("keepdims", 1)
        if len(x.shape) == 4 and axes == [2, 3]:
            y = b.add("global_avg_pool2d", [x], {"layout": "NCHW"}, name)
            return [y if keep else b.add("reshape", [y], {"shape": [x.shape[0], x.shape[1]]}, f"{name}_squeeze")]
        return [b.add("mean", [x], {"axes": axes, "keepdims": keep}, name)]
    if op == "Flatten":
        return [b.add("flatten", [x], {"axis": a.get("axis", 1) % max(1, len(x.shape))}, name)]
    if op == "Reshape":
        shape = [int(v) for v in _const(ins[1], "the shape", node)]
        out = []
        for k, d in enumerate(shape):
            out.append(x.shape[k] if d == 0 and not a.get("allowzero", 0) else d)
        if -1 in out:
            known = int(np.prod([d for d in out if d != -1]))
            out[out.index(-1)] = int(np.prod(x.shape)) // max(known, 1)
        return [b.add("reshape", [x], {"shape": out}, name)]
    if op == "Transpose":
        return [b.add("transpose", [x], {"perm": a.get("perm", list(range(len(x.shape)))[::-1])}, name)]
    if op == "Concat":
        return [b.add("concat", ins, {"axis": a["axis"] % len(x.shape)}, name)]
    if op == "Pad":
        if a.get("mode", "constant") != "constant":
            raise OnnxImportError(f"node {name!r} (Pad): only mode=constant is supported")
        pads = a.get("pads")
        if pads is None:
            pads = [int(v) for v in _const(ins[1], "pads", node)]
        value = 0.0
        if len(ins) > 2 and ins[2] is not None:
            value = _scalar_value(_const(ins[2], "constant_value", node), "constant_value", node)
        if len(ins) > 3 and ins[3] is not None:
            axes = [int(v) % len(x.shape) for v in _const(ins[3], "axes", node)]
            full = [0] * (2 * len(x.shape))
            for k, ax in enumerate(axes):
                full[ax], full[ax + len(x.shape)] = pads[k], pads[k + len(axes)]
            pads = full
        return [b.add("pad", [x], {"pads": pads, "value": value}, name)]
    if op == "Softmax":
        axis = a.get("axis", -1 if opset >= 13 else 1) % len(x.shape)
        if opset < 13 and axis != len(x.shape) - 1:
            raise OnnxImportError(f"node {name!r} (Softmax): opset {opset} softmax over a non-last axis is not supported")
        return [b.add("softmax", [x], {"axis": axis}, name)]
    raise OnnxImportError(f"unsupported operator {op} (node {name!r})")


# ---------------------------------------------------------------- export

def to_onnx(graph: Graph, opset: int = 18):
    """An ONNX model of an NCHW graph (as built by tuner.graph.models)."""
    onnx, numpy_helper = _onnx()
    from onnx import TensorProto, helper
    names: dict = {}
    inits, nodes = [], []
    alive: list = []          # values named by id() stay alive, so no id is reused for another value

    def ref(v):
        if id(v) not in names:
            alive.append(v)
            names[id(v)] = v.name
            if v.is_const:
                inits.append(numpy_helper.from_array(np.asarray(v.data), v.name))
        return names[id(v)]

    consumers = graph.consumers()
    skip: set = set()
    for n in graph.nodes:
        if id(n) in skip:
            continue
        a, out = n.attrs, n.output.name
        ins = [ref(v) for v in n.inputs]
        if n.op == "conv2d":
            nodes.append(helper.make_node("Conv", ins, [out], n.name, kernel_shape=list(n.inputs[1].shape[2:]),
                                          strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
                                          group=a["groups"]))
        elif n.op == "dense":
            users = consumers.get(id(n.output), [])
            if len(users) == 1 and users[0].op == "add" and users[0].inputs[1].is_const \
                    and users[0].inputs[1].data.ndim == 1:
                bias = users[0]
                skip.add(id(bias))
                names[id(bias.output)] = out
                nodes.append(helper.make_node("Gemm", ins + [ref(bias.inputs[1])], [out], n.name, transB=1))
            else:
                nodes.append(helper.make_node("Gemm", ins, [out], n.name, transB=1))
        elif n.op == "batch_norm":
            nodes.append(helper.make_node("BatchNormalization", ins, [out], n.name, epsilon=a["epsilon"]))
        elif n.op == "relu":
            nodes.append(helper.make_node("Relu", ins, [out], n.name))
        elif n.op == "clip":
            lo = ref(_scalar(graph, f"{n.name}_min", a["min"]))
            hi = ref(_scalar(graph, f"{n.name}_max", a["max"]))
            nodes.append(helper.make_node("Clip", ins + [lo, hi], [out], n.name))
        elif n.op in ("add", "sub", "mul", "div"):
            nodes.append(helper.make_node(n.op.capitalize(), ins, [out], n.name))
        elif n.op == "max_pool2d":
            nodes.append(helper.make_node("MaxPool", ins, [out], n.name, kernel_shape=a["kernel"],
                                          strides=a["strides"], pads=a["pads"]))
        elif n.op == "global_avg_pool2d":
            nodes.append(helper.make_node("GlobalAveragePool", ins, [out], n.name))
        elif n.op == "flatten":
            nodes.append(helper.make_node("Flatten", ins, [out], n.name, axis=a["axis"]))
        elif n.op == "concat":
            nodes.append(helper.make_node("Concat", ins, [out], n.name, axis=a["axis"]))
        elif n.op in ("sigmoid", "hard_swish", "softmax"):
            kw = {"axis": a["axis"]} if n.op == "softmax" else {}
            nodes.append(helper.make_node({"sigmoid": "Sigmoid", "hard_swish": "HardSwish", "softmax": "Softmax"}[n.op],
                                          ins, [out], n.name, **kw))
        elif n.op == "hard_sigmoid":
            nodes.append(helper.make_node("HardSigmoid", ins, [out], n.name, alpha=a.get("alpha", 0.2),
                                          beta=a.get("beta", 0.5)))
        elif n.op == "avg_pool2d":
            nodes.append(helper.make_node("AveragePool", ins, [out], n.name, kernel_shape=a["kernel"],
                                          strides=a["strides"], pads=a["pads"],
                                          count_include_pad=a.get("count_include_pad", 0)))
        else:
            raise OnnxImportError(f"export of op {n.op} is not supported")
        names[id(n.output)] = out
    inputs = [helper.make_tensor_value_info(v.name, TensorProto.FLOAT, list(v.shape)) for v in graph.inputs]
    outputs = [helper.make_tensor_value_info(names[id(v)], TensorProto.FLOAT, list(v.shape)) for v in graph.outputs]
    g = helper.make_graph(nodes, graph.name, inputs, outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="tuner")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _scalar(graph, name, value):
    from .ir import Value
    return Value(name, (), "float32", "", None, np.asarray(value, dtype=np.float32))
