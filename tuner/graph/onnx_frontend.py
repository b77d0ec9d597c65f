"""ONNX import (opsets 11-21, the operators CNNs use) and export of built-in models.

Import covers what PyTorch's exporter writes for CNNs, e.g. global average pooling written as
ReduceMean over H and W (imported as global_avg_pool2d so layout conversion can carry it); what
it computes on constants and shapes (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Range,
masks) becomes constants at import (onnx_fold).
Every failure is an OnnxImportError that names the problem and, where there is one, the node.

Which ONNX op types are read, and how, is each operator's own business: `ops.OpDef.onnx_in`
and `onnx_out`. This module walks the ONNX graph and gives those converters an `Importer` or
`Exporter`: the builder, the node's name and the attribute checks, so every error names its node.
"""
from __future__ import annotations

import itertools
import os

import numpy as np

from ..errors import UserError
from ..ops import OPS, evaluate
from ..ops.common import Empty
from ..ops.shape import affine_steps
from .builder import GraphBuilder
from .ir import Graph, GraphError, Value
from .onnx_fold import MAX_ELEMENTS, fold, foldable


def _identity(cx, ins, a):
    return [ins[0]]


# Constant's attribute forms -> the array each gives
_CONSTANT_FORMS = {"value": np.asarray, "value_float": lambda v: np.array(v, np.float32),
                   "value_floats": lambda v: np.array(v, np.float32), "value_int": lambda v: np.array(v, np.int64),
                   "value_ints": lambda v: np.array(v, np.int64)}


def _constant(cx, ins, a):
    form = next((k for k in _CONSTANT_FORMS if k in a), None)
    if form is None:
        raise cx.fail(f"only the {', '.join(_CONSTANT_FORMS)} forms are supported")
    return [cx.b.const(_CONSTANT_FORMS[form](a[form]), cx.node.output[0])]


# ONNX op type -> importer: every operator's own (OpDef.onnx_in), plus the ops that only name values
IMPORTERS = {**{t: f for d in OPS.values() for t, f in d.onnx_in.items()},
             "Identity": _identity, "Dropout": _identity, "Constant": _constant}
SUPPORTED = tuple(sorted(IMPORTERS))     # what a node on activations may be (onnx_fold: on constants)
OPSETS = range(11, 22)


NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 6: "six"}     # how an error counts a window's values


class OnnxImportError(UserError):
    pass


def _onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:  # pragma: no cover - onnx is a dependency
        raise OnnxImportError("reading ONNX files needs the onnx package: pip install onnx") from None
    return onnx, numpy_helper


def load_onnx(path: str, input_shapes: dict | None = None, run_time: frozenset = frozenset(),
              folded: dict | None = None, shared: dict | None = None) -> Graph:
    """shared: a dict that imports of the same file at several shapes share (the parsed file, the
    weights' arrays and their transposes: graph.dynamic.load_range)."""
    onnx, _ = _onnx()
    base = os.path.dirname(os.path.abspath(path))
    if shared is not None and shared.get("path") == os.path.abspath(path):
        return from_onnx(shared["model"], input_shapes, str(path), base, run_time, folded, shared)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise OnnxImportError(f"no such file: {path}") from None
    except Exception as e:  # protobuf DecodeError and friends
        raise OnnxImportError(f"{path} is not a readable ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    # the graph's initializers' external data is read one tensor at a time by from_onnx; the rest
    # (tensors of attributes and of branches' graphs) now
    xd = onnx.external_data_helper
    for t in itertools.chain(xd._get_attribute_tensors(model),
                             (t for n in model.graph.node for a in n.attribute
                              for t in xd._recursive_attribute_processor(a, xd._get_initializer_tensors_from_graph))):
        if xd.uses_external_data(t):
            try:
                xd.load_external_data_for_tensor(t, base)
            except Exception as e:  # noqa: BLE001 - onnx's own checks of the path and the bounds
                raise _unreadable(t.name, e, outside=True) from None
    if not model.graph.node:
        raise OnnxImportError(f"{path} is not a readable ONNX model (it has no graph nodes)")
    if shared is not None:
        shared.clear()
        shared.update(path=os.path.abspath(path), model=model)
    return from_onnx(model, input_shapes, str(path), base, run_time, folded, shared)


def input_dims(path: str) -> dict:
    """{input name: its dims as the file declares them: an int, a dim_param name, or None}."""
    onnx, _ = _onnx()
    try:
        g = onnx.load(str(path), load_external_data=False).graph
    except FileNotFoundError:
        raise OnnxImportError(f"no such file: {path}") from None
    except Exception as e:  # noqa: BLE001 - protobuf DecodeError and friends
        raise OnnxImportError(f"{path} is not a readable ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    inits = {i.name for i in g.initializer}
    return {inp.name: [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                       else d.dim_param if d.HasField("dim_param") and d.dim_param else None
                       for d in inp.type.tensor_type.shape.dim]
            for inp in g.input if inp.name not in inits}


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
        elif a.type == onnx.AttributeProto.STRINGS:
            out[a.name] = [v.decode() for v in a.strings]
        elif a.type == onnx.AttributeProto.TENSOR:
            out[a.name] = numpy_helper.to_array(a.t)
    return out


def _unreadable(name: str, e: Exception, outside: bool) -> OnnxImportError:
    return OnnxImportError(f"tensor {name!r} cannot be read ({type(e).__name__}: {str(e)[:160]}); the file"
                           f"{' or its external data file' if outside else ''} is damaged or missing: export the model again")


def from_onnx(model, input_shapes: dict | None = None, source: str = "model", base_dir: str = "",
              run_time: frozenset = frozenset(), folded: dict | None = None, shared: dict | None = None) -> Graph:
    """The graph of an ONNX ModelProto; base_dir: where the data of initializers stored outside it
    lies (onnx's own checks on the path), read one tensor at a time, so that a model of 1 GiB of
    weights is never in memory twice while it is imported. `run_time`: pairs (ONNX value, the first
    output of a node reading it) where the node reads the value, a folded constant of integers
    in steps (a position id at the past length), computed at run time by an iota node instead,
    or a fixed table it takes a window of (a causal mask's rows P..P+S), not folded (a model for
    a range of shapes: graph.dynamic.load_range); what reads that is not folded in turn. `folded`,
    where given, gets {ONNX value name: its constant Value} of what folding computed; `shared`
    (load_onnx's), the initializers' arrays and their transposes of earlier imports of the model."""
    onnx, numpy_helper = _onnx()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset not in OPSETS:
        raise OnnxImportError(f"{source} uses opset {opset}; supported opsets are {OPSETS.start}-{OPSETS.stop - 1}")
    g = model.graph
    _check_ssa(g)
    b = GraphBuilder(g.name or "onnx")
    env: dict = {}
    for init in g.initializer:
        data = shared.get(("init", init.name)) if shared is not None else None
        if data is None:
            try:
                data = numpy_helper.to_array(init, base_dir)
            except Exception as e:  # noqa: BLE001 - onnx raises ValueError, TypeError or its own on damaged data
                raise _unreadable(init.name, e, onnx.external_data_helper.uses_external_data(init)) from None
            if shared is not None:
                shared["init", init.name] = data
        env[init.name] = b.const(data, init.name)
    input_shapes = dict(input_shapes or {})
    for inp in g.input:
        if inp.name in env:
            continue
        dtype = _check_type(inp, "input")
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
        if not dims:
            raise OnnxImportError(f"input {inp.name!r} is a scalar (rank 0); tuner compiles inputs of rank 1 or more")
        if any(d is None for d in dims):
            shown = "x".join("?" if d is None else str(d) for d in dims)
            raise OnnxImportError(f"input {inp.name!r} has a dynamic shape {shown}; give a concrete one with "
                                  f"--input-shape {inp.name}={'x'.join('1' if d is None else str(d) for d in dims)}")
        env[inp.name] = b.input(inp.name, dims, dtype, layout="NCHW" if len(dims) == 4 and dtype == "float32" else "")
    if input_shapes:
        raise OnnxImportError(f"--input-shape names {', '.join(input_shapes)}, which the model has no input called")
    todo = list(g.node)[::-1]          # popped from the end: an If's branch goes in where the If was
    env_iota: dict = {}
    unfolded: list = []        # graph nodes over constants that FoldConstant leaves (a window of a fixed table)
    while todo:
        node = todo.pop()
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(f"unsupported operator {node.domain}.{node.op_type} (node {node.name!r})")
        ins = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name not in env:
                raise OnnxImportError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which nothing defines")
            else:
                ins.append(env[name])
        at_run = bool(run_time and node.output) and any((name, node.output[0]) in run_time for name in node.input)
        if at_run:          # an iota for integers in steps; a fixed table read as it is (a window of it)
            ins = [_at_run_time(b, v, env_iota) if isinstance(v, Value) and (name, node.output[0]) in run_time else v
                   for name, v in zip(node.input, ins)]
        if any(isinstance(v, Empty) for v in ins):
            empty = [name for name, v in zip(node.input, ins) if isinstance(v, Empty)]
            if node.op_type != "Concat":
                raise OnnxImportError(f"node {node.name!r} ({node.op_type}) reads {empty[0]!r}, a tensor with no "
                                      f"element (shape {list(env[empty[0]].shape)}); tuner compiles tensors of one "
                                      "element or more")
            ins = [v for v in ins if not isinstance(v, Empty)]
            if not ins:
                axis = _attrs(node).get("axis", 0) % len(env[empty[0]].shape)
                shape = list(env[empty[0]].shape)
                shape[axis] = sum(env[name].shape[axis] for name in empty)
                env[node.output[0]] = Empty(shape, env[empty[0]].dtype)
                continue
            if len(ins) == 1:
                env[node.output[0]] = ins[0]
                continue
        if node.op_type == "If":
            todo.extend(_taken_branch(b, env, node, ins)[::-1])
            continue
        if not at_run and foldable(node.op_type, ins):
            try:
                outs = fold(node.op_type, ins, {**_attrs(node), "_outputs": len(node.output)}, opset)
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise OnnxImportError(f"node {node.name!r} ({node.op_type}) cannot be computed on its constant "
                                      f"inputs: {type(e).__name__}: {str(e)[:120]}") from None
            for name, y in zip(node.output, outs):
                env[name] = b.const(y, name)
                if folded is not None:
                    folded[name] = env[name]
            continue
        if node.op_type not in SUPPORTED:
            raise OnnxImportError(f"unsupported operator {node.op_type} (node {node.name!r}); supported: "
                                  f"{', '.join(SUPPORTED)}")
        start = len(b.nodes)
        try:
            outs = IMPORTERS[node.op_type](Importer(b, node, opset, shared), ins, _attrs(node))
        except GraphError as e:
            raise OnnxImportError(f"node {node.name!r} ({node.op_type}): {e}") from None
        if at_run:
            unfolded.extend(n.name for n in b.nodes[start:])
        elif any(v is not None for v in ins) and all(v is None or v.is_const for v in ins):
            outs = _computed(b, start, outs, node)
            if folded is not None:
                folded.update({name: v for v, name in zip(outs, node.output) if v.is_const})
        for name, v in zip(node.output, outs):
            env[name] = v
    outputs = []
    for o in g.output:
        if o.name not in env:
            raise OnnxImportError(f"graph output {o.name!r} is never computed")
        if isinstance(env[o.name], Empty):
            raise OnnxImportError(f"graph output {o.name!r} has no element (shape {list(env[o.name].shape)}); "
                                  "tuner compiles outputs of one element or more")
        _check_type(o, "output")
        outputs.append(env[o.name])
    consts = {t.name for t in g.initializer}
    inputs = [i.name for i in g.input if i.name not in consts]
    return b.finish(outputs, {"source": source, "opset": opset, **({"unfolded": unfolded} if unfolded else {}),
                              "interface": {"inputs": inputs, "outputs": [o.name for o in g.output]}})


def _taken_branch(b: GraphBuilder, env: dict, node, ins: list) -> list:
    """The nodes of the branch an If takes, its condition known at import (TorchScript writes one
    for a test on a shape: F.local_response_norm's `if dim == 3`), then an Identity from each branch
    output to the If's; the branch's initializers go into `env`."""
    onnx, numpy_helper = _onnx()
    cond = ins[0] if ins else None
    if cond is None or not cond.is_const or np.size(cond.data) != 1:
        raise OnnxImportError(f"node {node.name!r} (If): its condition is computed at run time; tuner compiles an "
                              "If only where the condition is known at import (a test on shapes or constants)")
    name = "then_branch" if bool(np.asarray(cond.data).reshape(-1)[0]) else "else_branch"
    branch = next((a.g for a in node.attribute if a.name == name), None)
    if branch is None or len(branch.output) != len(node.output):
        raise OnnxImportError(f"node {node.name!r} (If): its {name} is missing or has {len(branch.output) if branch else 0} "
                              f"outputs for the If's {len(node.output)}; the model is not valid ONNX")
    for value in [i.name for i in branch.initializer] + [o for n in branch.node for o in n.output if o]:
        if value in env:
            raise OnnxImportError(f"node {node.name!r} (If): its {name} defines {value!r}, which is already defined; "
                                  "the model is not valid ONNX (each value has one definition)")
    for init in branch.initializer:
        env[init.name] = b.const(numpy_helper.to_array(init), init.name)
    return list(branch.node) + [onnx.helper.make_node("Identity", [o.name], [out], f"{node.name}_{k}")
                                for k, (o, out) in enumerate(zip(branch.output, node.output))]


def _at_run_time(b: GraphBuilder, v, made: dict):
    """An iota node computing the constant `v` (integers in steps, shape.affine_steps), one per
    constant; `v` itself where it is not such a constant."""
    steps = affine_steps(np.asarray(v.data)) if v.is_const and v.data.ndim else None
    if steps is None:
        return v
    if v.name not in made:
        made[v.name] = b.add("iota", [], {"shape": list(v.shape), "start": steps[0], "steps": steps[1:],
                                          "dtype": str(v.data.dtype)}, f"{v.name}_at_run")
    return made[v.name]


def _computed(b: GraphBuilder, start: int, outs: list, node) -> list:
    """The outputs of a node whose inputs are all constants (Swin V2's position-bias MLP on fixed
    coordinates, a weight's own normalisation): the graph nodes its import added, from `start`,
    evaluated now and replaced by the constants they compute."""
    vals: dict = {}
    for n in b.nodes[start:]:
        size = int(np.prod(n.output.shape))
        if size > MAX_ELEMENTS:
            raise OnnxImportError(f"node {node.name!r} ({node.op_type}) on constants would compute {size} elements, "
                                  f"over the {MAX_ELEMENTS} a folded constant may have")
        try:
            vals[id(n.output)] = evaluate(n, [v.data if v.is_const else vals[id(v)] for v in n.inputs])
        except (ValueError, IndexError, TypeError, FloatingPointError) as e:
            raise OnnxImportError(f"node {node.name!r} ({node.op_type}) cannot be computed on its constant inputs: "
                                  f"{type(e).__name__}: {str(e)[:120]}") from None
    del b.nodes[start:]
    return [b.const(vals[id(v)], v.name) if id(v) in vals else v for v in outs]


def _check_ssa(g) -> None:
    """Refuse a graph where a value is defined twice (by two nodes, or by a node and an input or
    initializer): ONNX graphs are in single static assignment form, and no definition may win."""
    defined = {}
    for v in g.input:
        if v.name in defined:
            raise OnnxImportError(f"graph input {v.name!r} is listed twice; the model is not valid ONNX")
        defined[v.name] = "a graph input"
    for init in g.initializer:
        if defined.get(init.name) == "an initializer":
            raise OnnxImportError(f"initializer {init.name!r} is listed twice; the model is not valid ONNX")
        defined.setdefault(init.name, "an initializer")     # an input's default value may share its name
    for node in g.node:
        for name in node.output:
            if name and name in defined:
                raise OnnxImportError(f"node {node.name!r} ({node.op_type}) defines {name!r}, which {defined[name]} "
                                      "already defines; the model is not valid ONNX (each value has one definition)")
            defined[name] = f"node {node.name!r}"


# ONNX element types a graph input or output may have -> its dtype (integers: token ids in, an argmax map out)
TYPES = {1: "float32", 0: "float32", 7: "int64", 6: "int32"}


def _check_type(v, what: str) -> str:
    """The dtype of a graph input or output: float32, int64 or int32."""
    onnx, _ = _onnx()
    if not v.type.HasField("tensor_type"):
        raise OnnxImportError(f"graph {what} {v.name!r} is not a tensor; tuner compiles tensor {what}s only")
    elem = v.type.tensor_type.elem_type
    if elem not in TYPES:
        kind = onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else f"type {elem}"
        raise OnnxImportError(f"graph {what} {v.name!r} is {kind}; this version of tuner compiles FLOAT (float32), INT64 or INT32 "
                              f"{what}s only: export the model with such an {what}")
    return TYPES[elem]


class Importer:
    """What an operator's ONNX importer (OpDef.onnx_in) works with: the builder, the node (its name
    prefixes every graph node it adds) and checked readers of ONNX attributes whose errors name it."""

    def __init__(self, b: GraphBuilder, node, opset: int, shared: dict | None = None):
        self.b, self.node, self.opset, self.shared = b, node, opset, shared
        self.name, self.op_type = node.name or node.output[0], node.op_type

    def transposed(self, data: np.ndarray) -> np.ndarray:
        """A 2-D weight's transpose, C-ordered: made once for the imports that share `shared`."""
        key = ("T", id(data))
        if self.shared is not None and key in self.shared and self.shared[key][0] is data:
            return self.shared[key][1]
        out = np.ascontiguousarray(data.T)
        if self.shared is not None:
            self.shared[key] = (data, out)
        return out

    def fail(self, msg: str) -> OnnxImportError:
        return OnnxImportError(f"node {self.name!r} ({self.op_type}): {msg}")

    def add(self, op: str, ins: list, attrs: dict, suffix: str = "") -> Value:
        return self.b.add(op, ins, attrs, self.name + suffix)

    def constant(self, data, suffix: str) -> Value:
        return self.b.const(data, self.name + suffix)

    def const(self, v, what: str):
        """The data of input `v`, which must be a constant."""
        if v is None or not v.is_const:
            raise self.fail(f"{what} must be a constant")
        return v.data

    def scalar(self, data, what: str) -> float:
        """A scalar given as a 0-d or one-element tensor."""
        arr = np.asarray(data).reshape(-1)
        if arr.size != 1:
            raise self.fail(f"{what} must be a single value")
        return float(arr[0])

    def window(self, a: dict, kernel=None, rank: int = 2) -> tuple:
        """(kernel_shape, strides, dilations) of a Conv or pooling node over `rank` axes, each `rank`
        positive integers; a kernel_shape that disagrees with the weight (`kernel`) is refused, not ignored."""
        given = a.get("kernel_shape", kernel)
        if given is None:
            raise self.fail("kernel_shape is missing")
        out = []
        for attr, v in (("kernel_shape", given), ("strides", a.get("strides", [1] * rank)),
                        ("dilations", a.get("dilations", [1] * rank))):
            v = list(v) if isinstance(v, (list, tuple)) else v
            if not isinstance(v, list) or len(v) != rank or not all(isinstance(x, int) and x >= 1 for x in v):
                raise self.fail(f"{attr} must be {NUMBERS[rank]} positive integers, got {v}")
            out.append(v)
        if kernel is not None and out[0] != list(kernel):
            raise self.fail(f"kernel_shape {out[0]} disagrees with the weight's spatial shape {list(kernel)}")
        return tuple(out)

    def pads(self, a: dict, in_hw, kernel, strides, dilations) -> list:
        """The begins of each axis then the ends ([top, left, bottom, right] in 2-D) from pads or auto_pad."""
        auto = a.get("auto_pad", "NOTSET")
        n = 2 * len(in_hw)
        if auto in ("NOTSET", ""):
            p = a.get("pads", [0] * n)
            if not isinstance(p, (list, tuple)) or len(p) != n or not all(isinstance(x, int) and x >= 0 for x in p):
                raise self.fail(f"pads must be {NUMBERS[n]} non-negative integers, got {p}")
            return list(p)
        if auto == "VALID":
            return [0] * n
        pads_begin, pads_end = [], []
        for size, k, s, d in zip(in_hw, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads_begin.append(small if auto == "SAME_UPPER" else big)
            pads_end.append(big if auto == "SAME_UPPER" else small)
        return pads_begin + pads_end


# ---------------------------------------------------------------- export

class Exporter:
    """What an operator's ONNX exporter (OpDef.onnx_out) works with: names of values, initializers,
    the graph's consumers, and folding a following node into the one being exported."""

    def __init__(self, graph: Graph):
        self.names: dict = {}
        self.inits, self.nodes = [], []
        self.alive: list = []      # values named by id() stay alive, so no id is reused for another value
        self.skip: set = set()
        self._consumers = graph.consumers()

    def ref(self, v) -> str:
        if id(v) not in self.names:
            _, numpy_helper = _onnx()
            self.alive.append(v)
            self.names[id(v)] = v.name
            if v.is_const:
                self.inits.append(numpy_helper.from_array(np.asarray(v.data), v.name))
        return self.names[id(v)]

    def emit(self, n, op_type: str, ins: list, **attrs) -> None:
        from onnx import helper
        self.nodes.append(helper.make_node(op_type, ins, [n.output.name], n.name, **attrs))

    def node(self, op_type: str, ins: list, name: str, **attrs) -> str:
        """An extra ONNX node (one output, named `name`) of a node exported as several."""
        from onnx import helper
        self.nodes.append(helper.make_node(op_type, ins, [name], name, **attrs))
        return name

    def array(self, name: str, data) -> str:
        """A float32 initializer (a scalar too)."""
        data = np.array(data, dtype=np.float32, order="C")       # a 0-d array stays 0-d
        return self.ref(Value(name, data.shape, "float32", "", None, data))

    scalar = array

    def tensor(self, name: str, ints) -> str:
        """An int64 initializer (shapes, axes)."""
        return self.ref(Value(name, (len(ints),), "int64", "", None, np.asarray(ints, dtype=np.int64)))

    def consumers(self, v) -> list:
        return self._consumers.get(id(v), [])

    def fold(self, follower, into) -> None:
        """`follower` is exported as part of `into`: skipped, its output named as `into`'s."""
        self.skip.add(id(follower))
        self.names[id(follower.output)] = into.output.name


def to_onnx(graph: Graph, opset: int = 18):
    """An ONNX model of an NCHW graph (as built by tuner.graph.models)."""
    onnx, _ = _onnx()
    from onnx import TensorProto, helper
    ex = Exporter(graph)
    for n in graph.nodes:
        if id(n) in ex.skip:
            continue
        export = OPS[n.op].onnx_out if n.op in OPS else None
        if export is None:
            raise OnnxImportError(f"export of op {n.op} is not supported")
        export(ex, n, [ex.ref(v) for v in n.inputs])
        ex.names[id(n.output)] = n.output.name
    elem = {dtype: e for e, dtype in TYPES.items() if e}       # an input's or output's dtype -> its ONNX type
    inputs = [helper.make_tensor_value_info(v.name, elem[v.dtype], list(v.shape)) for v in graph.inputs]
    outputs = [helper.make_tensor_value_info(ex.names[id(v)], elem.get(v.dtype, TensorProto.FLOAT), list(v.shape))
               for v in graph.outputs]
    used = {name for node in ex.nodes for name in node.input}      # an op exported from a rewritten weight
    g = helper.make_graph(ex.nodes, graph.name, inputs, outputs, [i for i in ex.inits if i.name in used])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="tuner")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
