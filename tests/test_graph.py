"""The graph compiler: passes keep semantics, fusion and layout conversion do what they claim."""
import subprocess
import sys

import numpy as np
import pytest
from conftest import ort_run

from tuner.graph import interp, load
from tuner.graph.builder import GraphBuilder
from tuner.graph.ir import GraphError
from tuner.graph.models import MODELS, load_model, mobilenet_v2, resnet, tiny
from tuner.graph.passes import DEFAULT_PIPELINE, PassContext, PassTiming, PrintIR, get, optimize
from tuner.graph.passes.convert_layout import data_path_transforms
from tuner.ops import BINARY, OPS
from tuner.ops.elementwise import COMPARISONS, LOGICAL

LAYOUTS = [None, "NHWC", "NCHW8c", "NCHW16c"]


def _close(a, b, rtol=1e-4, atol=1e-4):
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * scale)


@pytest.fixture(scope="module")
def small_models():
    """Built-in models at a small image size (same structure, fast to interpret)."""
    return {"tiny": tiny(), "resnet18": resnet(18, image=32), "resnet50": resnet(50, image=32),
            "mobilenet_v2": mobilenet_v2(image=32)}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "resnet18", "resnet50", "mobilenet_v2"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_pass_keeps_the_interpreters_output(small_models, name, layout):
    g = small_models[name]
    x = np.random.default_rng(1).standard_normal(g.inputs[0].shape).astype(np.float32)
    ref = interp.run(g, x)[0]
    cur = g
    ctx = PassContext(options={"layout": layout} if layout else {})
    for pname in DEFAULT_PIPELINE:
        cur = get(pname)(cur, ctx)
        _close(interp.run(cur, x)[0], ref)


@pytest.mark.slow
def test_resnet50_structure_fusion_and_tasks():
    g = load_model("resnet50")
    assert g.count("conv2d") == 53
    out = optimize(g, layout="NCHW16c")
    assert out.count("batch_norm") == 0 and out.count("mul") == 0      # BN folded into conv weights
    groups = out.meta["fused_groups"]
    conv_groups = [grp for grp in groups if grp.anchor is not None and out.nodes[grp.anchor].op == "conv2d"]
    assert len(conv_groups) == 53
    ops = [tuple(out.nodes[k].op for k in grp.nodes) for grp in conv_groups]
    # 16 bottlenecks: the last conv of each carries bias, residual add and relu; 4 projection
    # shortcuts carry only their bias; every other conv carries bias and relu.
    assert ops.count(("conv2d", "add", "add", "relu")) == 16
    assert ops.count(("conv2d", "add")) == 4
    assert ops.count(("conv2d", "add", "relu")) == 33
    tasks = out.meta["tasks"]
    convs = [t for t in tasks if t.tunable and t.workload.op == "conv2d"]
    # 53 convs but only 24 unique (shape, stride, epilogue) workloads: the stem, then per stage the
    # first block's reduce, 3x3 (strided in stages 2-4), expand+residual, projection, and the later
    # blocks' reduce and 3x3 (stage 1: the later 3x3 equals the first, leaving 5 + 6 + 6 + 6 + 1)
    assert len(convs) == 24
    assert sum(t.weight for t in convs) == 53
    assert {t.workload.op for t in tasks if t.tunable} == {"conv2d", "max_pool2d", "global_avg_pool2d", "dense"}
    assert all(t.workload.layout == "NCHW16c" for t in convs)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["NHWC", "NCHW16c"])
def test_resnet50_keeps_two_layout_transforms_and_none_on_weights(layout):
    out = optimize(load_model("resnet50"), layout=layout)
    assert data_path_transforms(out) == 2                               # the input's and the output's
    assert all(not n.inputs[0].is_const for n in out.nodes if n.op == "layout_transform")
    convs = [n for n in out.nodes if n.op == "conv2d"]
    assert all(n.attrs["layout"] == layout for n in convs)


def test_task_keys_match_the_kernel_side():
    from tuner.ops import make
    out = optimize(load_model("resnet50"), layout="NCHW16c")
    keys = {t.workload.key for t in out.meta["tasks"] if t.tunable}
    expected = make("conv2d", dict(C=64, H=56, W=56, K=64, R=3, S=3, stride=1, pad=1, bias=1, relu=1), "NCHW16c")
    assert expected.key in keys


def test_mobilenet_relu6_groups_are_tasks_with_a_clip_epilogue():
    out = optimize(load_model("mobilenet_v2"), layout="NCHW16c")
    clipped = [t for t in out.meta["tasks"] if "clip" in t.summary]
    assert clipped and all(t.tunable and t.workload.p["act"] == "clip" for t in clipped)
    assert all(t.workload.p["lo"] == 0.0 and t.workload.p["hi"] == 6.0 for t in clipped)
    # every anchor group of MobileNetV2 is a task now (35 convs end in ReLU6)
    assert sum(t.weight for t in clipped) == 35


def test_cse_dce_and_fold_constant():
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 3, 3), layout="NCHW")
    c = b.const(np.ones((4, 1, 1), np.float32))
    folded = b.add("add", [c, c])                      # constant subgraph
    y1 = b.add("relu", [b.add("add", [x, folded])])
    y2 = b.add("relu", [b.add("add", [x, folded])])    # the same computation again
    b.add("sigmoid", [x])                              # dead
    g = b.finish([b.add("mul", [y1, y2])])
    out = optimize(g, passes=["FoldConstant", "EliminateCommonSubexpr", "DeadCodeElimination"])
    assert [n.op for n in out.nodes] == ["add", "relu", "mul"]
    x0 = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype(np.float32)
    _close(interp.run(out, x0)[0], interp.run(g, x0)[0])


@pytest.mark.parametrize("c, becomes", [(8.0, "mul"), (3.0, "mul"), (-0.7, "mul"), (0.0, "div"), (1e-39, "div"),
                                         (float("inf"), "div")])
def test_a_division_by_a_constant_becomes_a_product_with_its_reciprocal_where_that_is_a_normal_float(c, becomes):
    """x / c is x * (1/c) after SimplifyInference, within an ulp of the division (exact for 8);
    a zero, a denormal or an infinite c keeps the division, whose results differ there."""
    b = GraphBuilder("g")
    x = b.input("x", (2, 5))
    g = b.finish([b.add("div", [x, b.const(np.array([1.0, c, c, 2.0, c], np.float32))])])
    out = optimize(g, passes=["InferType", "SimplifyInference"])
    assert [n.op for n in out.nodes] == [becomes]
    x0 = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32) * 1e3
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        want, got = interp.run(g, x0)[0], interp.run(out, x0)[0]
    np.testing.assert_allclose(got, want, rtol=1.2e-7)
    if c == 8.0:
        np.testing.assert_array_equal(got, want)


def test_pass_context_opt_level_disabled_and_instruments():
    g = tiny()
    lines = []
    timing = PassTiming()
    out = optimize(g, layout="NHWC", disabled={"ConvertLayout"}, instruments=[PrintIR(lines.append), timing])
    assert data_path_transforms(out) == 0
    assert any("// after FuseOps" in line for line in lines)
    assert [name for name, _ in timing.times][:2] == ["InferType", "FuseTransformerOps"]
    low = optimize(g, layout="NHWC", opt_level=2)                     # ConvertLayout is level 3
    assert data_path_transforms(low) == 0
    only_fuse = optimize(g, passes=["FuseOps"])                        # InferType is required first
    assert "fused_groups" in only_fuse.meta


@pytest.mark.parametrize("op", ["exp", "log", "sigmoid", "cos"])
def test_a_libm_call_fuses_into_a_reader_of_its_size_but_is_computed_once_where_a_broadcast_rereads_it(op):
    """A squeeze-and-excite scale, op over [1, 4, 1, 1] read by a mul over [1, 4, 5, 6]: fused
    into the mul it would run 30 times per element, so it stays its own group; the same op over x,
    read once per element, fuses into the add that reads it."""
    b = GraphBuilder("rereads")
    s, x = b.input("s", (1, 4, 1, 1)), b.input("x", (1, 4, 5, 6))
    scale = b.add(op, [b.add("abs", [s])])
    g = b.finish([b.add("add", [b.add("mul", [x, scale]), b.add(op, [b.add("abs", [x])])])])
    fused = optimize(g, passes=["InferType", "FuseOps"])
    groups = [[fused.nodes[k].op for k in grp.nodes] for grp in fused.meta["fused_groups"]]
    assert groups == [["abs", op], ["mul", "abs", op, "add"]]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    from tuner.compiler import compile_model
    _close(compile_model(g, threads=1).run(*xs)[0], interp.run(g, *xs)[0], rtol=1e-5, atol=1e-5)


def test_verifier_and_shape_errors_name_the_node():
    b = GraphBuilder("bad")
    x = b.input("x", (1, 3, 8, 8), layout="NCHW")
    w = b.const(np.zeros((4, 5, 3, 3), np.float32))
    with pytest.raises(GraphError, match="conv2d convA: input has 3 channels"):
        b.add("conv2d", [x, w], {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "groups": 1},
              "convA")


# ---------------------------------------------------------------- ONNX

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tuner.compiler import compile_model  # noqa: E402

from tuner.graph.onnx_frontend import OnnxImportError, load_onnx, to_onnx  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "resnet18", "mobilenet_v2"])
def test_exported_models_import_and_match_onnxruntime(tmp_path, name):
    g = {"tiny": tiny(), "resnet18": resnet(18, image=64), "mobilenet_v2": mobilenet_v2(image=64)}[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(to_onnx(g), path)
    imported = load_onnx(path)
    x = np.random.default_rng(2).standard_normal(g.inputs[0].shape).astype(np.float32)
    np.testing.assert_allclose(interp.run(g, x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4)   # the export itself
    ours = interp.run(imported, x)[0]
    np.testing.assert_allclose(ours, ort_run(path, x)[0], rtol=1e-4, atol=1e-5 * max(1, float(np.abs(ours).max())))
    _close(interp.run(optimize(imported, layout="NCHW16c"), x)[0], ours)


def _torch_style_model(path, opset=18, dynamic=False):
    """What torch.onnx.export writes for a small CNN: Conv with bias, ReduceMean for global pooling,
    Flatten, Gemm(transB=1), plus Clip/HardSwish/Concat/Pad/AveragePool/Softmax."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "c1.w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "c1.b"),
        numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3, "dw.w"),
        numpy_helper.from_array(rng.standard_normal((10, 16)).astype(np.float32) * 0.3, "fc.w"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32) * 0.1, "fc.b"),
        numpy_helper.from_array(np.array([0.0], np.float32), "zero"),
        numpy_helper.from_array(np.array([6.0], np.float32), "six"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["a"], "conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["a", "zero", "six"], ["b"], "relu6"),
        helper.make_node("Conv", ["b", "dw.w"], ["c"], "dwconv", group=8, auto_pad="SAME_UPPER"),
        helper.make_node("HardSwish", ["c"], ["d"], "hswish"),
        helper.make_node("Concat", ["b", "d"], ["e"], "cat", axis=1),
        helper.make_node("Pad", ["e", "pads"], ["f"], "pad"),
        helper.make_node("AveragePool", ["f"], ["g"], "avg", kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node("ReduceMean", ["g", "axes"], ["h"], "gap", keepdims=1),
        helper.make_node("Flatten", ["h"], ["i"], "flat", axis=1),
        helper.make_node("Gemm", ["i", "fc.w", "fc.b"], ["j"], "fc", transB=1),
        helper.make_node("Softmax", ["j"], ["y"], "softmax", axis=1),
    ]
    batch = "batch" if dynamic else 1
    graph = helper.make_graph(nodes, "torchish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_pytorch_style_onnx_imports_and_matches_onnxruntime(tmp_path):
    path = _torch_style_model(tmp_path / "torchish.onnx")
    g = load_onnx(path)
    assert g.count("global_avg_pool2d") == 1                  # ReduceMean over H, W
    x = np.random.default_rng(3).standard_normal((1, 3, 12, 12)).astype(np.float32)
    ours = interp.run(g, x)[0]
    np.testing.assert_allclose(ours, ort_run(path, x)[0], rtol=1e-4, atol=1e-5)
    for layout in ("NHWC", "NCHW8c"):
        _close(interp.run(optimize(g, layout=layout), x)[0], ours)


def test_dynamic_batch_needs_a_concrete_shape(tmp_path):
    path = _torch_style_model(tmp_path / "dyn.onnx", dynamic=True)
    with pytest.raises(OnnxImportError, match=r"dynamic shape \?x3x12x12.*--input-shape x=1x3x12x12"):
        load_onnx(path)
    g = load(str(path), {"x": [1, 3, 12, 12]})
    assert g.inputs[0].shape == (1, 3, 12, 12)


def test_unsupported_op_is_named_with_its_node(tmp_path):
    node = helper.make_node("Hardmax", ["x"], ["y"], "my_hardmax")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    path = tmp_path / "hardmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(OnnxImportError, match=r"unsupported operator Hardmax \(node 'my_hardmax'\); supported: Abs, Add"):
        load_onnx(path)


def test_a_model_with_its_weights_in_an_external_file_imports_alike_and_a_missing_or_escaping_file_is_named(tmp_path):
    inline = onnx.load(_torch_style_model(tmp_path / "inline.onnx"))
    const = helper.make_node("Constant", [], ["k"], "k", value=numpy_helper.from_array(np.full((1, 10), 0.5, np.float32), "k"))
    inline.graph.node.insert(0, const)                            # an attribute's tensor outside the file too
    inline.graph.node[-1].input[0] = "j2"
    inline.graph.node.insert(len(inline.graph.node) - 1, helper.make_node("Add", ["j", "k"], ["j2"], "addk"))
    onnx.save(inline, tmp_path / "inline.onnx")
    d = tmp_path / "ext"
    d.mkdir()
    onnx.save(inline, d / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0, convert_attribute=True)
    outside = onnx.load(d / "m.onnx", load_external_data=False)
    assert sum(t.data_location == TensorProto.EXTERNAL for t in outside.graph.initializer) >= 5
    x = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)
    want = interp.run(load_onnx(str(tmp_path / "inline.onnx")), x)[0]
    np.testing.assert_array_equal(interp.run(load_onnx(str(d / "m.onnx")), x)[0], want)
    (d / "m.data").rename(d / "gone.data")
    with pytest.raises(OnnxImportError, match=r"tensor '(k|c1.w)' cannot be read .*external data file is damaged or missing"):
        load_onnx(str(d / "m.onnx"))
    (d / "gone.data").rename(d / "m.data")
    escape = onnx.load(d / "m.onnx", load_external_data=False)        # data said to lie outside the model's folder
    next(e for e in escape.graph.initializer[0].external_data if e.key == "location").value = "../inline.onnx"
    onnx.save(escape, d / "escape.onnx")
    with pytest.raises(OnnxImportError, match=r"tensor 'c1.w' cannot be read"):
        load_onnx(str(d / "escape.onnx"))


def tuner_cli(*args):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_bad_files_are_one_line_errors_with_exit_code_2(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf at all \x00\x01\x02")
    truncated = tmp_path / "trunc.onnx"
    onnx.save(to_onnx(tiny()), truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    dyn = _torch_style_model(tmp_path / "dyn.onnx", dynamic=True)
    mismatch = tmp_path / "mismatch.onnx"
    m = onnx.load(_torch_style_model(tmp_path / "m.onnx"))
    m.graph.initializer[3].CopyFrom(numpy_helper.from_array(np.zeros((10, 7), np.float32), "fc.w"))
    onnx.save(m, mismatch)
    lstm = tmp_path / "hardmax.onnx"
    graph = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], "my_hardmax")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), lstm)
    cases = [(junk, "not a readable ONNX model"), (truncated, "not a readable ONNX model"),
             (dyn, "dynamic shape"), (mismatch, "node 'fc' (Gemm): dense fc: cannot multiply"),
             (lstm, "unsupported operator Hardmax (node 'my_hardmax')"), (tmp_path / "missing.onnx", "no such file")]
    for path, message in cases:
        out = tuner_cli("inspect", str(path))
        assert out.returncode == 2, (path, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_models_table_lists_every_built_in_model_with_its_input_as_built():
    from tuner.graph.models import ABOUT
    assert list(ABOUT) == list(MODELS)
    for name in ("resnet18", "mobilenet_v2", "tiny"):      # the cheap ones to build
        g = load_model(name)
        assert ABOUT[name][0] == " ".join((g.inputs[0].name, "x".join(map(str, g.inputs[0].shape)), g.inputs[0].dtype))


def test_cli_models_inspect_export(tmp_path):
    out = tuner_cli("models")
    assert out.returncode == 0 and all(m in out.stdout for m in MODELS)
    out = tuner_cli("inspect", "resnet50", "--layout", "NCHW16c")
    assert out.returncode == 0, out.stderr
    assert "layout transforms on the data path: 2" in out.stdout
    assert "tasks: 27 unique tunable workloads" in out.stdout   # 24 convs, dense, max pooling, global pooling
    path = tmp_path / "r18.onnx"
    out = tuner_cli("export-onnx", "resnet18", "-o", str(path))
    assert out.returncode == 0 and path.stat().st_size > 1e6
    out = tuner_cli("inspect", str(path), "--passes", "FoldConstant,SimplifyInference,FuseOps",
                    "--disable", "EliminateCommonSubexpr", "--timing", "--print-ir")
    assert out.returncode == 0, out.stderr
    assert "// after SimplifyInference" in out.stdout and "pass timing" in out.stdout
    out = tuner_cli("passes")
    assert out.returncode == 0 and "ConvertLayout" in out.stdout and "FuseOps" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
def test_files_written_by_torch_onnx_export_import(tmp_path, dynamo):
    torch = pytest.importorskip("torch", reason="torch is an optional benchmark dependency")
    if dynamo:
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16)
            self.c2, self.b2 = nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16)
            self.c3, self.pool, self.fc = nn.Conv2d(16, 16, 1), nn.MaxPool2d(3, 2, 1), nn.Linear(16, 10)

        def forward(self, x):
            x = nn.functional.relu6(self.b1(self.c1(x)))
            y = nn.functional.hardswish(self.b2(self.c2(x)))
            x = self.pool(torch.relu(self.c3(y) + x))
            return self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))

    torch.manual_seed(0)
    m = Net().eval()
    for bn in (m.b1, m.b2):
        bn.running_mean.uniform_(-0.1, 0.1)
        bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path / "torch.onnx"
    torch.onnx.export(m, (x,), str(path), opset_version=18, dynamo=dynamo)
    g = load_onnx(path)
    ours = interp.run(g, x.numpy())[0]
    np.testing.assert_allclose(ours, m(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours, ort_run(path, x.numpy())[0], rtol=1e-4, atol=1e-5)
    _close(interp.run(optimize(g, layout="NCHW16c"), x.numpy())[0], ours)


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(["MaxPool", "AveragePool"]), size=st.integers(3, 13), k=st.integers(1, 4),
       stride=st.integers(1, 3), lo=st.integers(0, 1), hi=st.integers(0, 1), include=st.booleans())
def test_pools_with_ceil_mode_import_with_onnx_runtimes_output_size_and_values(tmp_path_factory, op, size, k,
                                                                                stride, lo, hi, include):
    # torchvision's GoogLeNet and Inception pool with ceil_mode=1: the last window runs past the end pad
    # (a window starting inside that pad is dropped) and what lies past it is never counted
    assume(max(lo, hi) < k <= size + lo + hi)
    extra = {"count_include_pad": int(include)} if op == "AveragePool" else {}
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride, stride], pads=[lo, lo, hi, hi],
                            ceil_mode=1, **extra)
    g = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path_factory.mktemp("pool") / "pool.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.random.default_rng(size).standard_normal((1, 2, size, size)).astype(np.float32)
    want = ort_run(path, x)[0]
    try:
        ours = interp.run(load_onnx(path), x)[0]
    except OnnxImportError as e:        # the one refused case: its output size would need counted pads
        assert op == "AveragePool" and include and "count_include_pad" in str(e)
        return
    assert ours.shape == want.shape
    _close(ours, want)


def test_googlenets_ceil_mode_max_pool_compiles_to_onnx_runtimes_values(tmp_path):
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    g = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    m = compile_model(str(path), threads=1, use_shipped=False, predict=False)
    x = np.random.default_rng(0).standard_normal((1, 16, 14, 14)).astype(np.float32)
    want = ort_run(path, x)[0]
    assert want.shape == (1, 16, 7, 7)
    np.testing.assert_array_equal(m.run(x)[0], want)


@pytest.mark.slow
def test_convs_reading_a_channel_shuffle_or_a_permuted_layer_norm_convert_to_blocked_layouts(tmp_path):
    # ShuffleNet's reshape-transpose-reshape and ConvNeXt's permute-LayerNorm-Linear-permute hand a conv
    # a 4-D value with no layout: it is NCHW, and ConvertLayout must transform it, not pass it through
    torch = pytest.importorskip("torch", reason="torch is an optional benchmark dependency")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2, self.c3 = nn.Conv2d(3, 32, 3, 1, 1), nn.Conv2d(32, 32, 1), nn.Conv2d(32, 16, 3, 1, 1)
            self.ln, self.fc = nn.LayerNorm(32), nn.Linear(32, 32)

        def forward(self, x):
            x = self.c1(x)
            x = x.view(1, 2, 16, 8, 8).transpose(1, 2).reshape(1, 32, 8, 8)     # channel shuffle
            x = torch.relu(self.c2(x))
            x = self.fc(self.ln(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2) + x
            return self.c3(x)

    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    path = tmp_path / "shuffle.onnx"
    torch.onnx.export(Net().eval(), (x,), str(path), opset_version=17, dynamo=False)
    g = load_onnx(path)
    ours = interp.run(g, x.numpy())[0]
    np.testing.assert_allclose(ours, ort_run(path, x.numpy())[0], rtol=1e-4, atol=1e-5)
    for layout in ("NCHW16c", "NCHW8c", "NHWC"):
        _close(interp.run(optimize(g, layout=layout), x.numpy())[0], ours)


# ---------------------------------------------------------------- one definition per operator

def _one_op_graph(op: str):
    """A small graph whose single non-trivial node is `op` (inputs NCHW 1x8x6x6, or 2-D for dense)."""
    rng = np.random.default_rng(3)
    b = GraphBuilder(op)
    x = b.input("x", (1, 8, 6, 6), layout="NCHW")
    c = lambda *shape: b.const(rng.uniform(0.5, 1.5, shape).astype(np.float32))   # noqa: E731
    attrs = {
        "conv2d": ([x, c(4, 8, 3, 3)], {"strides": [1, 1], "pads": [1, 0, 1, 2], "dilations": [1, 1], "groups": 1}),
        "dense": None,
        "batch_norm": ([x, c(8), c(8), c(8), c(8)], {"epsilon": 1e-3}),
        "max_pool2d": ([x], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        "avg_pool2d": ([x], {"kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
        "global_avg_pool2d": ([x], {}),
        "flatten": ([x], {"axis": 1}),
        "reshape": ([x], {"shape": [1, 8, 36]}),
        "transpose": ([x], {"perm": [0, 2, 3, 1]}),
        "concat": ([x, x], {"axis": 1}),
        "clip": ([x], {"min": -0.5, "max": 0.5}),
        "hard_sigmoid": ([x], {"alpha": 0.3, "beta": 0.4}),
        "softmax": ([x], {"axis": 1}),
        "batch_matmul": ([x, x], {"trans_b": 0}),
        "layer_norm": ([x, c(6), c(6)], {"axis": 3, "epsilon": 1e-5}),
        "pow": ([x], {"exponent": 4.0}),
        "slice": ([x], {"begin": [0, 1, 5, 0], "step": [1, 2, -1, 3], "shape": [1, 3, 4, 2]}),
        "mod": ([x, c(8, 1, 1)], {"fmod": 1}),
        "maximum": ([x, c(8, 1, 1)], {}),
        "minimum": ([x, c(8, 1, 1)], {}),
        "reduce": ([x], {"axes": [1, 3], "keepdims": 1, "kind": "min"}),
    }
    if op == "dense":
        flat = b.add("flatten", [x], {"axis": 1})
        y = b.add("add", [b.add("dense", [flat, c(10, 288)]), c(10)])      # exported as one Gemm
    elif op in BINARY:
        y = b.add(op, [x, c(8, 1, 1)])
    elif op in COMPARISONS or op in ("not", "where"):    # a boolean: selects between floats
        cond = b.add(op if op in COMPARISONS else "less", [x, c(8, 1, 1)])
        y = b.add("where", [b.add("not", [cond]) if op == "not" else cond, x, c(8, 1, 1)])
    elif op in LOGICAL:                   # two booleans joined, selecting between floats
        conds = [b.add("less", [x, c(8, 1, 1)]), b.add("greater", [x, c(8, 1, 1)])]
        y = b.add("where", [b.add(op, conds), x, c(8, 1, 1)])
    elif op == "gather_elements":         # indices 0..5 from x, along the last axis
        idx = b.add("cast", [b.add("clip", [x], {"min": 0.0, "max": 5.0})], {"to": "int64"})
        y = b.add(op, [x, idx], {"axis": 3})
    elif op == "cumsum":
        y = b.add(op, [x], {"axis": 2, "exclusive": 1, "reverse": 1})
    elif op == "int_div":                 # integers -4..4 from x, divided with truncation by 3
        ints = b.add("cast", [b.add("clip", [x], {"min": -4.0, "max": 4.0})], {"to": "int64"})
        y = b.add("cast", [b.add(op, [ints, b.const(np.array([3], np.int64))])], {"to": "float32"})
    elif op == "topk":                    # the indices of each row's 4 largest, as floats
        pos = b.const(np.arange(6, dtype=np.float32))
        y = b.add("cast", [b.add(op, [x, pos], {"axis": 3, "k": 4, "largest": 1})], {"to": "float32"})
    elif op == "arg_extreme":             # the channel of each pixel's largest value, as floats
        pos = b.const(np.arange(8, dtype=np.float32))
        y = b.add("cast", [b.add(op, [x, pos], {"axis": 1, "kind": "max", "last": 0})], {"to": "float32"})
    elif op == "grid_sample":             # x read at 3 x 5 points in and around [-1, 1]
        grid = b.const(rng.uniform(-1.2, 1.2, (1, 3, 5, 2)).astype(np.float32))
        y = b.add(op, [x, grid], {"mode": "bilinear", "padding": "zeros", "align_corners": 0})
    elif op in ("gather", "cast"):     # token ids 0..3 from x, looked up in a table
        ids = b.add("cast", [b.add("clip", [x], {"min": 0.0, "max": 3.0})], {"to": "int64"})
        y = b.add("gather", [c(5, 6), ids], {"axis": 0})
    elif op == "isnan":
        y = b.add("where", [b.add("isnan", [x]), c(8, 1, 1), x])
    elif op in attrs:
        ins, a = attrs[op]
        y = b.add(op, ins, a)
    else:
        y = b.add(op, [x])
    return b.finish([y])


EXPORTED = sorted(name for name, d in OPS.items() if d.onnx_out is not None)


@pytest.mark.parametrize("op", EXPORTED)
def test_every_exported_operator_round_trips_through_onnx_runtime(tmp_path, op):
    """Each OpDef's exporter, ONNX Runtime and its importer agree with its NumPy evaluation."""
    g = _one_op_graph(op)
    path = tmp_path / f"{op}.onnx"
    onnx.save(to_onnx(g), path)
    x = np.random.default_rng(4).standard_normal((1, 8, 6, 6)).astype(np.float32)
    ours = interp.run(g, x)[0]
    np.testing.assert_allclose(ours, ort_run(path, x)[0], rtol=1e-4, atol=1e-5)
    back = load_onnx(path)
    if op in ("gelu", "gelu_tanh", "silu"):      # exported in pieces (Gelu is opset 20): one again after the pass
        back = optimize(back, passes=["FuseTransformerOps"])
    assert op in {n.op for n in back.nodes}
    np.testing.assert_allclose(interp.run(back, x)[0], ours, rtol=1e-5, atol=1e-6)


def test_the_operator_registry_is_consistent():
    from tuner.graph.onnx_frontend import IMPORTERS
    from tuner.ops import WORKLOADS
    owners: dict = {}
    for name, d in OPS.items():
        for onnx_type in d.onnx_in:
            owners.setdefault(onnx_type, []).append(name)
        if d.task is not None:                   # an anchor: the workload of its name exists
            assert name in WORKLOADS, name
    assert {t: o for t, o in owners.items() if len(o) > 1} == {}        # one importer per ONNX op type
    assert set(owners) <= set(IMPORTERS)
    assert {"Conv", "Gemm", "MatMul", "Relu", "Clip", "ReduceMean", "Softmax"} <= set(owners)
    assert len(EXPORTED) >= 20
    anchors = {name for name, d in OPS.items() if d.task is not None}
    assert anchors == {"conv2d", "dense", "batch_matmul", "max_pool2d", "avg_pool2d", "global_avg_pool2d",
                       "winograd_input", "winograd_gemm", "winograd_output"}
