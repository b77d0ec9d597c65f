"""What an exporter computes on shapes and constants becomes constants at import (graph.onnx_fold)."""
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.graph import interp
from tuner.graph.onnx_frontend import OnnxImportError, load_onnx

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference for imported models")


def _model(nodes, inits, out_shape, path, opset=13, in_shape=(1, 3, 8, 8)):
    g = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _matches_onnxruntime(path, in_shape=(1, 3, 8, 8)):
    x = np.random.default_rng(0).standard_normal(in_shape).astype(np.float32)
    g = load_onnx(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(interp.run(g, x)[0], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    return g


def test_a_flatten_written_as_shape_gather_unsqueeze_concat_reshape_imports_as_one_reshape(tmp_path):
    # what torch writes for x.view(x.size(0), -1) after a conv
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    inits = {"w": w, "zero": np.array(0, np.int64), "axes0": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64)}
    g = _matches_onnxruntime(_model(nodes, inits, (1, 256), tmp_path / "flat.onnx"))
    assert [n.op for n in g.nodes] == ["conv2d", "reshape", "relu"]


def test_a_mask_built_from_range_cast_and_where_is_a_constant(tmp_path):
    # positions < 4 keep the value, the others get -1e4 (an attention mask's shape of computation)
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1),
             helper.make_node("Range", ["start", "limit", "delta"], ["pos"]),
             helper.make_node("Less", ["pos", "four"], ["keep"]),
             helper.make_node("Cast", ["keep"], ["keepf"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["one", "keepf"], ["drop"]),
             helper.make_node("Mul", ["drop", "big"], ["mask"]),
             helper.make_node("Add", ["f", "mask"], ["y"])]
    inits = {"start": np.array(0, np.int64), "limit": np.array(192, np.int64), "delta": np.array(1, np.int64),
             "four": np.array(4, np.int64), "one": np.array(1.0, np.float32), "big": np.array(-1e4, np.float32)}
    g = _matches_onnxruntime(_model(nodes, inits, (1, 192), tmp_path / "mask.onnx"))
    assert [n.op for n in g.nodes] == ["flatten", "add"]


@pytest.mark.parametrize("opset", [11, 13])
def test_unsqueeze_and_squeeze_fold_with_axes_as_attribute_or_input(tmp_path, opset):
    axes = {"axes": [0, 2]} if opset < 13 else {}
    more = [] if opset < 13 else ["ax"]
    nodes = [helper.make_node("Unsqueeze", ["v", *more], ["u"], **axes),          # [3] -> [1, 3, 1]
             helper.make_node("Squeeze", ["u", *more], ["sq"], **axes),           # -> [3]
             helper.make_node("Cast", ["sq"], ["sqf"], to=TensorProto.FLOAT),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one", "two"], ["c"]),              # [3]: the channels
             helper.make_node("ConstantOfShape", ["c"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Mul", ["ones", "sqf"], ["scale"]),
             helper.make_node("Reshape", ["scale", "cshape"], ["scale4"]),
             helper.make_node("Mul", ["x", "scale4"], ["y"])]
    inits = {"v": np.array([2, 3, 4], np.int64), "ax": np.array([0, 2], np.int64), "one": np.array([1], np.int64),
             "two": np.array([2], np.int64), "cshape": np.array([1, 3, 1, 1], np.int64)}
    g = _matches_onnxruntime(_model(nodes, inits, (1, 3, 8, 8), tmp_path / "sq.onnx", opset=opset))
    assert [n.op for n in g.nodes] == ["mul"]


def test_a_constant_index_outside_its_table_is_a_one_line_error_naming_the_node(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "nine"], ["n"], name="pick"),
             helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = {"nine": np.array(9, np.int64), "axes0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    path = _model(nodes, inits, (1, 192), tmp_path / "bad.onnx")
    with pytest.raises(OnnxImportError, match=r"node 'pick' \(Gather\) cannot be computed on its constant inputs: "
                                              r"IndexError") as e:
        load_onnx(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("node, inits", [
    (helper.make_node("ConstantOfShape", ["shape"], ["big"], name="huge"), {"shape": np.array([1 << 20, 1 << 20], np.int64)}),
    (helper.make_node("Range", ["a", "b", "c"], ["big"], name="huge"),
     {"a": np.array(0, np.int64), "b": np.array(1 << 40, np.int64), "c": np.array(1, np.int64)}),
    (helper.make_node("Expand", ["one", "shape"], ["big"], name="huge"),
     {"one": np.ones(1, np.float32), "shape": np.array([1 << 16, 1 << 16], np.int64)}),
])
def test_a_hostile_constant_computation_is_refused_before_it_is_computed(tmp_path, node, inits):
    nodes = [node, helper.make_node("Identity", ["x"], ["y"])]
    with pytest.raises(OnnxImportError, match=r"node 'huge' .* would have \d+ elements, over the"):
        load_onnx(_model(nodes, inits, (1, 3, 8, 8), tmp_path / "huge.onnx"))


def test_a_graph_without_constant_inputs_still_names_the_unsupported_operator(tmp_path):
    nodes = [helper.make_node("Hardmax", ["x"], ["y"], name="pick_max")]
    with pytest.raises(OnnxImportError, match=r"unsupported operator Hardmax \(node 'pick_max'\)"):
        load_onnx(_model(nodes, {}, (1, 3, 8, 8), tmp_path / "erf.onnx"))


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_a_cnn_flattening_with_x_size_0_exported_by_torch_imports(tmp_path, dynamic_batch):
    """Without the exporter's own folding: Unsqueeze and Concat of constants, and with a dynamic
    batch axis Shape -> Gather as well (the batch given at import)."""
    torch = pytest.importorskip("torch", reason="torch is an optional benchmark dependency")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.fc = nn.Conv2d(3, 8, 3, 2, 1), nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            y = torch.relu(self.c(x))
            return self.fc(y.view(y.size(0), -1))

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    path = tmp_path / "view.onnx"
    axes = {"input_names": ["x"], "dynamic_axes": {"x": {0: "batch"}}} if dynamic_batch else {}
    torch.onnx.export(m, (x,), str(path), opset_version=17, dynamo=False, do_constant_folding=False, **axes)
    written = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Unsqueeze", "Concat"} <= written and ("Shape" in written) == dynamic_batch
    g = load_onnx(path, {"x": [1, 3, 8, 8]} if dynamic_batch else None)
    assert [n.op for n in g.nodes] == ["conv2d", "add", "relu", "reshape", "dense", "add"]
    np.testing.assert_allclose(interp.run(g, x.numpy())[0], m(x).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("node, inits", [
    (helper.make_node("CumSum", ["x", "ax"], ["y"], exclusive=e, reverse=r),
     {"x": np.arange(1, 13, dtype=np.int64).reshape(3, 4), "ax": np.array(a, np.int64)})
    for e in (0, 1) for r in (0, 1) for a in (1, -2)] + [
    (helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=b),
     {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "i": i})
    for b, i in ((0, np.array([[0, 1], [1, -1]], np.int64)), (0, np.array([[[1]], [[0]]], np.int64)),
                 (1, np.array([[2], [0]], np.int64)))])
def test_cumsum_and_gather_nd_of_constants_fold_to_what_onnx_runtime_computes(tmp_path, node, inits):
    """GPT-2's dynamo export numbers positions and picks its causal mask with these, on shapes."""
    from conftest import ort_run
    from tuner.graph.onnx_fold import FOLD
    got = FOLD[node.op_type](list(inits.values()), {a.name: a.i for a in node.attribute}, 17)[0]
    typ = numpy_helper.from_array(inits["x"]).data_type
    g = helper.make_graph([node], "fold", [helper.make_tensor_value_info(k, numpy_helper.from_array(v).data_type,
                                                                         v.shape) for k, v in inits.items()],
                          [helper.make_tensor_value_info("y", typ, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "o.onnx"))
    np.testing.assert_array_equal(got, ort_run(tmp_path / "o.onnx", dict(inits))[0])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), op=st.sampled_from(["ScatterND", "ScatterElements"]),
       reduction=st.sampled_from(["none", "add", "mul", "max", "min"]))
def test_scatters_of_constants_fold_to_what_onnx_runtime_computes(tmp_path, data, op, reduction):
    """Swin's shifted-window masks are written with ScatterND on constants."""
    from conftest import ort_run
    from tuner.graph.onnx_fold import FOLD
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    rng = np.random.default_rng(data.draw(st.integers(0, 1 << 16)))
    x = rng.integers(-5, 6, shape).astype(np.float32)
    if op == "ScatterND":
        k = data.draw(st.integers(1, len(shape)))
        cells = list(np.ndindex(*shape[:k]))          # distinct targets: ONNX leaves repeats to the runtime
        picks = data.draw(st.lists(st.sampled_from(cells), min_size=1, max_size=len(cells), unique=True))
        idx = np.array([[c - shape[j] if rng.random() < 0.3 else c for j, c in enumerate(p)] for p in picks], np.int64)
        upd = rng.integers(-5, 6, (len(picks), *shape[k:])).astype(np.float32)
        attrs = {}
    else:
        axis = data.draw(st.integers(0, len(shape) - 1))
        ishape = list(shape)
        ishape[axis] = 1      # one write per target along the axis
        idx = rng.integers(-shape[axis], shape[axis], ishape).astype(np.int64)
        upd = rng.integers(-5, 6, ishape).astype(np.float32)
        attrs = {"axis": axis}
    if reduction != "none":
        attrs["reduction"] = reduction
    node = helper.make_node(op, ["x", "i", "u"], ["y"], **attrs)
    inits = {"x": x, "i": idx, "u": upd}
    got = FOLD[op](list(inits.values()), attrs, 18)[0]
    g = helper.make_graph([node], "fold", [helper.make_tensor_value_info(k, numpy_helper.from_array(v).data_type,
                                                                         v.shape) for k, v in inits.items()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    np.testing.assert_array_equal(got, ort_run(path, dict(inits))[0])


def test_a_scatter_index_outside_the_data_is_a_one_line_error_naming_the_node(tmp_path):
    nodes = [helper.make_node("ScatterND", ["zeros", "idx", "upd"], ["mask"], name="window_mask"),
             helper.make_node("Add", ["x", "mask"], ["y"])]
    inits = {"zeros": np.zeros((1, 3, 8, 8), np.float32), "idx": np.array([[0, 3]], np.int64),
             "upd": np.ones((1, 8, 8), np.float32)}
    with pytest.raises(OnnxImportError, match=r"node 'window_mask' \(ScatterND\) cannot be computed on its constant "
                                              r"inputs: IndexError") as e:
        load_onnx(_model(nodes, inits, (1, 3, 8, 8), tmp_path / "bad.onnx"))
    assert "\n" not in str(e.value)
    inits["idx"] = np.array([[0, -1]], np.int64)       # the last channel, as ONNX counts from the end
    g = _matches_onnxruntime(_model(nodes, inits, (1, 3, 8, 8), tmp_path / "ok.onnx"))
    assert [n.op for n in g.nodes] == ["add"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_einsum_of_two_operands_imports_as_a_matmul_with_onnx_runtimes_values(tmp_path, data):
    """MaxViT writes Q.K^T and P.V as Einsum; any split of its letters into batch, contracted and free
    ones, in any order, with the second operand an activation or a constant, and `...` for leading axes."""
    from conftest import ort_run
    kinds = {k: data.draw(st.integers(0, 2 if k != "red" else 2), label=k) for k in ("batch", "left", "right", "red")}
    letters = iter("pqrstuvwxyz")
    groups = {k: [next(letters) for _ in range(n)] for k, n in kinds.items()}
    size = {c: data.draw(st.integers(1, 4), label=c) for g in groups.values() for c in g}
    perm = lambda cs: data.draw(st.permutations(cs)) if cs else []      # noqa: E731
    ta = perm(groups["batch"] + groups["left"] + groups["red"])
    tb = perm(groups["batch"] + groups["right"] + groups["red"])
    out = perm(groups["batch"] + groups["left"] + groups["right"])
    assume(ta and tb)                                   # (inputs of rank 0 are not compiled)
    ell = data.draw(st.booleans()) and ta and tb and ta[0] == tb[0] == out[0] if out else False
    term = lambda t: "..." + "".join(t[1:]) if ell else "".join(t)      # noqa: E731
    eq = f"{term(ta)},{term(tb)}->{term(out)}"
    const = data.draw(st.booleans())
    rng = np.random.default_rng(0)
    a = rng.standard_normal([size[c] for c in ta]).astype(np.float32)
    b = rng.standard_normal([size[c] for c in tb]).astype(np.float32)
    node = helper.make_node("Einsum", ["x", "w" if const else "b"], ["y"], equation=eq, name="attn")
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, a.shape)] + \
        ([] if const else [helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)])
    g = helper.make_graph([node], "einsum", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(b, "w")] if const else [])
    path = tmp_path / "einsum.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    feeds = {"x": a} if const else {"x": a, "b": b}
    want = ort_run(path, feeds)[0]
    got = interp.run(load_onnx(path), *feeds.values())[0]
    assert got.shape == want.shape, eq
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=eq)


@pytest.mark.parametrize("eq, why", [("ii,ij->j", "diagonal"), ("ij,jk->i", "kept or contracted"),
                                     ("ij,jk,kl->il", "two operands")])
def test_an_einsum_beyond_a_product_of_two_is_a_one_line_error_naming_the_node(tmp_path, eq, why):
    n = len(eq.split("->")[0].split(","))
    node = helper.make_node("Einsum", ["x"] * n, ["y"], equation=eq, name="mix")
    g = helper.make_graph([node], "einsum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "e.onnx"))
    with pytest.raises(OnnxImportError, match=rf"node 'mix' \(Einsum\): .*{why}") as e:
        load_onnx(tmp_path / "e.onnx")
    assert "\n" not in str(e.value)


def test_a_layer_computed_on_constants_only_is_evaluated_at_import(tmp_path):
    # Swin V2's position bias: an MLP over fixed coordinates, then a gather of its table by fixed indices
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["coords", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("MatMul", ["hr", "w2"], ["table"]),
             helper.make_node("Gather", ["table", "index"], ["bias"], axis=0),
             helper.make_node("Transpose", ["bias"], ["bias_t"], perm=[1, 0]),
             helper.make_node("Reshape", ["bias_t", "shape"], ["bias4"]),
             helper.make_node("Add", ["x", "bias4"], ["y"])]
    inits = {"coords": rng.standard_normal((15, 2)).astype(np.float32),
             "w1": rng.standard_normal((2, 16)).astype(np.float32), "w2": rng.standard_normal((16, 3)).astype(np.float32),
             "index": rng.integers(0, 15, 64).astype(np.int64), "shape": np.array([1, 3, 8, 8], np.int64)}
    g = _matches_onnxruntime(_model(nodes, inits, (1, 3, 8, 8), tmp_path / "bias.onnx"))
    assert [n.op for n in g.nodes] == ["add"]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceSumSquare", "ReduceL2"])
@pytest.mark.parametrize("axes, keep", [([3], 1), ([1, -1], 0), (None, 1)])
def test_sum_sum_square_and_l2_reductions_import_with_onnx_runtimes_values(tmp_path, op, axes, keep):
    opset = 18 if op != "ReduceSum" else 13          # axes as an input from these opsets on
    more = ["axes"] if axes is not None else []
    nodes = [helper.make_node(op, ["x", *more], ["y"], keepdims=keep)]
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    shape = np.ones((1, 3, 8, 8))
    out = np.sum(shape, axis=tuple(axes) if axes else None, keepdims=bool(keep)).shape
    _matches_onnxruntime(_model(nodes, inits, out, tmp_path / "r.onnx", opset=opset))


def test_normalize_as_torch_writes_it_imports_with_clamp_and_expand(tmp_path):
    # F.normalize(x, dim=-1): x / ReduceL2(x).clamp_min(eps).expand_as(x)
    nodes = [helper.make_node("ReduceL2", ["x", "last"], ["n"], keepdims=1),
             helper.make_node("Max", ["n", "eps"], ["nc"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Expand", ["nc", "s"], ["ne"]),
             helper.make_node("Div", ["x", "ne"], ["d"]),
             helper.make_node("Min", ["d", "cap"], ["y"])]
    inits = {"last": np.array([-1], np.int64), "eps": np.array(1e-12, np.float32), "cap": np.array(0.25, np.float32)}
    g = _matches_onnxruntime(_model(nodes, inits, (1, 3, 8, 8), tmp_path / "norm.onnx", opset=18))
    assert "clip" in [n.op for n in g.nodes]


def test_max_and_min_of_activations_and_constant_tensors_compile_to_what_onnx_runtime_computes(tmp_path):
    """Max of three activations, Min of one and a constant row, and on integers (T5's relative
    position buckets: min(bucket, a full tensor of max_distance - 1)), broadcasting."""
    from tuner.compiler import compile_model
    nodes = [helper.make_node("Neg", ["x"], ["nx"]), helper.make_node("Sin", ["x"], ["sx"]),
             helper.make_node("Max", ["x", "nx", "sx"], ["m"]),
             helper.make_node("Min", ["m", "row"], ["r"]),
             helper.make_node("Mul", ["x", "ten"], ["x10"]), helper.make_node("Cast", ["x10"], ["i"], to=TensorProto.INT64),
             helper.make_node("Min", ["i", "irow"], ["imin"]), helper.make_node("Max", ["imin", "izero"], ["imax"]),
             helper.make_node("Cast", ["imax"], ["f"], to=TensorProto.FLOAT), helper.make_node("Add", ["r", "f"], ["y"])]
    inits = {"row": np.linspace(-1, 1, 8, dtype=np.float32), "ten": np.array(10, np.float32),
             "irow": np.arange(8, dtype=np.int64) * 3 - 4, "izero": np.zeros((1, 3, 1, 1), np.int64)}
    path = _model(nodes, inits, (1, 3, 8, 8), tmp_path / "maxmin.onnx")
    g = _matches_onnxruntime(path)
    assert {"maximum", "minimum"} <= {n.op for n in g.nodes}
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(compile_model(str(path)).run(x)[0], want, rtol=1e-5, atol=1e-6)
    nodes = [helper.make_node("Max", ["x", "i"], ["y"], name="mixed"), helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64)]
    with pytest.raises(OnnxImportError, match=r"node 'mixed' \(Max\): operands are float32 and int64"):
        load_onnx(_model(nodes[::-1], {}, (1, 3, 8, 8), tmp_path / "mixed.onnx"))


@pytest.mark.parametrize("op", ["Log", "Exp", "Sin", "Cos", "Tanh", "Floor", "Ceil", "Round", "Sign", "Reciprocal"])
def test_unary_math_on_constants_folds_to_what_onnx_runtime_computes(tmp_path, op):
    # T5's relative position buckets take a Log of constant distances; rotary tables Sin and Cos
    c = np.array([-2.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.0, 7.25], np.float32).reshape(1, 1, 1, 8)
    nodes = [helper.make_node("Abs" if op == "Log" else "Identity", ["c"], ["c1"]),
             helper.make_node(op, ["c1"], ["t"]),
             helper.make_node("Add", ["x", "t"], ["y"])]
    g = _matches_onnxruntime(_model(nodes, {"c": c + (op == "Log")}, (1, 3, 8, 8), tmp_path / "u.onnx"))
    assert [n.op for n in g.nodes] == ["add"]


@pytest.mark.parametrize("shape", [(2, 4), (1, 4, 6), (1, 4, 3, 5), (1, 4, 2, 3, 2)], ids=["2-D", "3-D", "4-D", "5-D"])
@pytest.mark.parametrize("on", ["constant", "activation"])
def test_batch_norm_of_any_rank_on_a_constant_or_an_activation_computes_what_onnx_runtime_computes(tmp_path, tmp_cache,
                                                                                                  shape, on):
    """Channels on axis 1 at every rank: BiT standardises its conv weights by a BatchNormalization of
    the weight as (1, out, in x kh x kw), which the import evaluates; audio models normalise (N, C, L)."""
    from tuner.compiler import compile_model
    rng = np.random.default_rng(len(shape))
    inits = {k: rng.uniform(0.5, 1.5, 4).astype(np.float32) for k in ("scale", "bias", "mean", "var")}
    src = "x"
    if on == "constant":
        inits["c"] = rng.standard_normal(shape).astype(np.float32)
        src = "c"
    nodes = [helper.make_node("BatchNormalization", [src, "scale", "bias", "mean", "var"], ["b"], epsilon=1e-3),
             helper.make_node("Add", ["b", "x"], ["y"])]
    g = _matches_onnxruntime(_model(nodes, inits, shape, tmp_path / "bn.onnx", opset=15, in_shape=shape), shape)
    assert [n.op for n in g.nodes if n.op == "batch_norm"] == ([] if on == "constant" else ["batch_norm"])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "bn.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = compile_model(str(tmp_path / "bn.onnx"), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(x)[0], want, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), depth=st.integers(1, 6), data=st.data())
def test_a_one_hot_of_constants_folds_to_what_onnx_runtime_computes(tmp_path, shape, depth, data):
    """CANINE's TorchScript export one-hots constant ids; an index outside [-depth, depth) is all off."""
    from conftest import ort_run
    from tuner.graph.onnx_fold import FOLD
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    inits = {"i": np.array(data.draw(st.lists(st.integers(-depth - 1, depth), min_size=int(np.prod(shape)),
                                              max_size=int(np.prod(shape)))), np.int64).reshape(shape),
             "d": np.array(depth, np.int64), "v": np.array([0.5, 3.0], np.float32)}
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)
    got = FOLD["OneHot"](list(inits.values()), {"axis": axis}, 17)[0]
    g = helper.make_graph([node], "fold", [helper.make_tensor_value_info(k, numpy_helper.from_array(v).data_type,
                                                                         v.shape) for k, v in inits.items()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "o.onnx"))
    np.testing.assert_array_equal(got, ort_run(tmp_path / "o.onnx", dict(inits))[0])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 6), cols=st.integers(1, 6), k=st.integers(-7, 7), cast=st.booleans())
def test_an_eye_like_of_an_activation_folds_to_what_onnx_runtime_computes(tmp_path, rows, cols, k, cast):
    """EyeLike reads only its input's shape (BAT's attention in timm's bat_resnext26ts): a constant,
    in its `dtype` or else its input's, with a diagonal above or below the main one or none at all."""
    attrs = {"k": k, **({"dtype": TensorProto.INT64} if cast else {})}
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("EyeLike", ["r"], ["e"], **attrs),
             helper.make_node("Cast", ["e"], ["ef"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "ef"], ["y"])]
    g = _matches_onnxruntime(_model(nodes, {}, (rows, cols), tmp_path / "eye.onnx", opset=17, in_shape=(rows, cols)),
                             (rows, cols))
    assert [n.op for n in g.nodes if n.op != "relu"] == ["add"]       # (the relu only EyeLike read is dead)


def test_an_eye_like_of_a_3d_input_is_a_one_line_error_naming_the_node(tmp_path):
    nodes = [helper.make_node("EyeLike", ["x"], ["e"], name="eye"), helper.make_node("Add", ["x", "e"], ["y"])]
    with pytest.raises(OnnxImportError, match=r"node 'eye' \(EyeLike\).*2-D input, got shape \[1, 3, 8, 8\]"):
        load_onnx(_model(nodes, {}, (1, 3, 8, 8), tmp_path / "eye3.onnx"))
