"""Activations and heads of models outside the built-in set, against ONNX Runtime: Abs, Log,
Softplus and Mish (YOLOv4, CSPDarknet), Elu, Selu, Celu, Softsign, Sin and Cos (YOLO's oriented
boxes, RT-DETR), PRelu (ENet, ESPNet, face recognition ResNets), LogSoftmax (classifier heads, CTC speech models) and GlobalMaxPool."""
import numpy as np
import onnx
import pytest
from conftest import ort_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.compiler import compile_model
from tuner.errors import UserError
from tuner.graph import interp
from tuner.graph.onnx_frontend import load_onnx

pytest.importorskip("onnxruntime", reason="onnxruntime is the reference for imported models")

# ONNX op -> attributes hypothesis may draw (name -> strategy)
ACTS = {"Abs": {}, "Log": {}, "Softplus": {}, "Mish": {}, "Softsign": {}, "Sin": {}, "Cos": {},
        "Elu": {"alpha": st.floats(0.1, 2.0)}, "Celu": {"alpha": st.floats(0.1, 2.0)},
        "Selu": {"alpha": st.floats(0.5, 2.0), "gamma": st.floats(0.5, 2.0)}}


def _save(path, nodes, shape, outs, inits=None, opset=18):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                          [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _act_node(op, src, out, attrs):
    return helper.make_node(op, [src], [out], **attrs)


def _log_input(nodes, op):
    """Log reads x * x + 1 (defined everywhere); the others read x."""
    if op != "Log":
        return "x"
    nodes += [helper.make_node("Mul", ["x", "x"], ["xx"]), helper.make_node("Add", ["xx", "one"], ["pos"])]
    return "pos"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(sorted(ACTS)), data=st.data(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       scale=st.sampled_from([1.0, 30.0]))
def test_every_activation_interprets_as_onnx_runtime_computes_it(tmp_path, op, data, shape, scale):
    attrs = {k: data.draw(v) for k, v in ACTS[op].items()}
    nodes = []
    nodes.append(_act_node(op, _log_input(nodes, op), "y", attrs))
    path = _save(tmp_path / "a.onnx", nodes, shape, ["y"], {"one": np.array(1.0, np.float32)})
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * scale).astype(np.float32)
    np.testing.assert_allclose(interp.run(load_onnx(path), x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 3, 32)], ids=["lane by lane", "vectorised"])
def test_every_activation_compiles_to_what_onnx_runtime_computes(tmp_path, tmp_cache, shape):
    nodes, outs = [], []
    for op in sorted(ACTS):
        attrs = {"alpha": 0.7} if op in ("Elu", "Celu") else {"alpha": 1.5, "gamma": 0.9} if op == "Selu" else {}
        nodes.append(_act_node(op, _log_input(nodes, op), f"y_{op}", attrs))
        outs.append(f"y_{op}")
    path = _save(tmp_path / "acts.onnx", nodes, shape, outs, {"one": np.array(1.0, np.float32)})
    x = (np.random.default_rng(1).standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:4] = [100.0, -100.0, 1e-30, -1e-30]        # where e^x overflows, underflows; subnormal
    got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x)
    want = ort_run(path, x)
    assert len(got) == len(want) == len(ACTS)
    for op, g, w in zip(outs, got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=op)


def test_prelu_per_channel_or_of_one_slope_after_a_conv_compiles_to_what_onnx_runtime_computes(tmp_path, tmp_cache):
    rng = np.random.default_rng(0)
    for slope in (rng.uniform(-0.5, 0.5, (8, 1, 1)).astype(np.float32), np.array([0.25], np.float32)):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                 helper.make_node("PRelu", ["c", "slope"], ["y"])]
        path = _save(tmp_path / "prelu.onnx", nodes, (1, 4, 6, 6), ["y"],
                     {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "slope": slope}, opset=17)
        x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
        got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x)[0]
        np.testing.assert_allclose(got, ort_run(path, x)[0], rtol=1e-5, atol=1e-5)
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["y"], name="bad")]
    path = _save(tmp_path / "bad.onnx", nodes, (1, 4, 6, 6), ["y"], {"slope": np.ones((3, 1, 1), np.float32)}, opset=17)
    with pytest.raises(UserError, match=r"node 'bad' \(PRelu\): the slope's shape \[3, 1, 1\] does not broadcast"):
        load_onnx(path)


@pytest.mark.parametrize("axis", [1, -1])
def test_log_softmax_of_far_apart_logits_is_finite_and_what_onnx_runtime_computes(tmp_path, tmp_cache, axis):
    """x - max - log(sum(exp(x - max))): logits 200 apart, whose softmax underflows to 0 in float32."""
    path = _save(tmp_path / "ls.onnx", [helper.make_node("LogSoftmax", ["x"], ["y"], axis=axis)], (2, 5, 9), ["y"])
    x = (np.random.default_rng(2).standard_normal((2, 5, 9)) * 100).astype(np.float32)
    want = ort_run(path, x)[0]
    got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x)[0]
    assert np.isfinite(got).all() and want.min() < -150
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 16, 7, 5), (1, 4, 3, 4, 5)], ids=["image", "clip"])
def test_global_max_pool_compiles_to_what_onnx_runtime_computes(tmp_path, tmp_cache, shape):
    nodes = [helper.make_node("GlobalMaxPool", ["x"], ["p"]), helper.make_node("Relu", ["p"], ["y"])]
    path = _save(tmp_path / "gmp.onnx", nodes, shape, ["y"], opset=17)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x)[0]
    np.testing.assert_array_equal(got, ort_run(path, x)[0])


@pytest.mark.parametrize("act", ["Mish", "ELU", "SELU", "CELU", "Softplus"])
def test_a_conv_activation_torch_exports_runs_in_the_convs_epilogue_and_computes_what_onnx_runtime_computes(
        tmp_path, tmp_cache, act):
    """Mish as torch writes it before opset 18 (x * tanh(softplus(x))) is one mish; each of these is
    the activation of the conv task before it (ResNet-18 with Mish: 16.7 -> 5.6 ms at 1 thread)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the [bench] extra)")
    torch.manual_seed(0)
    make = getattr(torch.nn, act)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), make(),
                              torch.nn.Conv2d(16, 24, 1), make()).eval()
    path = str(tmp_path / "act.onnx")
    torch.onnx.export(net, (torch.randn(1, 3, 12, 12),), path, input_names=["input"], opset_version=17, dynamo=False)
    m = compile_model(path, target="cpu -threads=1", use_shipped=False)
    name = act.lower()
    assert [s.summary for s in m.steps if name in s.summary] == [f"conv2d + add + {name}"] * 2, \
        [s.summary for s in m.steps]
    x = (np.random.default_rng(0).standard_normal((1, 3, 12, 12)) * 3).astype(np.float32)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size, shape", [(5, (1, 16, 7, 7)), (3, (2, 6, 5, 3)), (1, (1, 3, 4, 4))])
def test_local_response_norm_compiles_to_what_onnx_runtime_computes(tmp_path, tmp_cache, size, shape):
    """LRN as AlexNet and Caffe's GoogLeNet normalise: windows cut at the first and last channel, of
    5, 3 and 1 channels (ONNX Runtime runs odd sizes of 4-D inputs only)."""
    nodes = [helper.make_node("LRN", ["x"], ["y"], size=size, alpha=0.02, beta=0.75, bias=2.0)]
    path = _save(tmp_path / "lrn.onnx", nodes, shape, ["y"], opset=17)
    x = (np.random.default_rng(4).standard_normal(shape) * 3).astype(np.float32)
    got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x)[0]
    np.testing.assert_allclose(got, ort_run(path, x)[0], rtol=1e-5, atol=1e-6)


def test_an_if_on_a_shape_imports_as_its_taken_branch_and_one_on_run_time_data_is_refused(tmp_path, tmp_cache):
    """TorchScript writes F.local_response_norm's `if dim == 3` as an ONNX If on the input's shape:
    known at import, its taken branch is the graph (an AlexNet-style stem with torch's LRN)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the [bench] extra)")
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 24, 5, 2, 2), nn.ReLU(), nn.LocalResponseNorm(5, 1e-3, 0.75, 2.0),
                        nn.MaxPool2d(3, 2), nn.Conv2d(24, 16, 3, padding=1)).eval()
    x = torch.randn(1, 3, 32, 32)
    path = str(tmp_path / "lrn.onnx")
    torch.onnx.export(net, (x,), path, input_names=["input"], opset_version=17, dynamo=False)
    assert "If" in {n.op_type for n in onnx.load(path).graph.node}
    got = compile_model(path, target="cpu -threads=1", use_shipped=False).run(x.numpy())[0]
    np.testing.assert_allclose(got, ort_run(path, x.numpy())[0], rtol=1e-4, atol=1e-5)
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=1), helper.make_node("Greater", ["m", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], "branchy", then_branch=then, else_branch=other)]
    path = _save(tmp_path / "if.onnx", nodes, (1, 4), ["y"], {"zero": np.array(0.0, np.float32)}, opset=17)
    with pytest.raises(UserError, match=r"node 'branchy' \(If\): its condition is computed at run time"):
        load_onnx(path)
    redefines = helper.make_graph([helper.make_node("Relu", ["x"], ["x"])], "then", [],
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["yes"], ["y"], "branchy", then_branch=redefines, else_branch=redefines)]
    path = _save(tmp_path / "redefines.onnx", nodes, (1, 4), ["y"], {"yes": np.array(True)}, opset=17)
    with pytest.raises(UserError, match=r"node 'branchy' \(If\): its then_branch defines 'x', which is already"):
        load_onnx(path)
