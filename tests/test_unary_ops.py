"""The unary ops transformers use (the pieces of GELU and of a decomposed LayerNorm): Erf, Tanh,
Exp, Sqrt, Neg, imported, interpreted and compiled against ONNX Runtime."""
import numpy as np
import onnx
import pytest
from conftest import ort_run
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.compiler import compile_model
from tuner.graph import interp
from tuner.graph.onnx_frontend import load_onnx

pytest.importorskip("onnxruntime", reason="onnxruntime is the reference for imported models")

OPS = ["Erf", "Tanh", "Exp", "Sqrt", "Neg"]


def _model(op: str, shape, path):
    """y = op(x), with Sqrt taken of x * x + 1 (defined everywhere)."""
    nodes, src = [], "x"
    if op == "Sqrt":
        nodes += [helper.make_node("Mul", ["x", "x"], ["xx"]), helper.make_node("Add", ["xx", "one"], ["pos"])]
        src = "pos"
    nodes.append(helper.make_node(op, [src], ["y"]))
    g = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                          [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@settings(max_examples=25, deadline=None)
@given(op=st.sampled_from(OPS), shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       seed=st.integers(0, 1000))
def test_every_unary_op_interprets_as_onnxruntime_computes_it(tmp_path_factory, op, shape, seed):
    path = _model(op, shape, tmp_path_factory.mktemp("u") / "u.onnx")
    x = (np.random.default_rng(seed).standard_normal(shape) * 2).astype(np.float32)
    np.testing.assert_allclose(interp.run(load_onnx(path), x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_every_unary_op_compiles_to_what_onnxruntime_computes(tmp_path, tmp_cache, op):
    path = _model(op, (1, 3, 5, 7), tmp_path / "u.onnx")
    x = (np.random.default_rng(1).standard_normal((1, 3, 5, 7)) * 2).astype(np.float32)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)


def test_gelu_in_its_erf_form_compiles_to_what_onnxruntime_computes(tmp_path, tmp_cache):
    # torch's nn.GELU(): x * 0.5 * (1 + erf(x / sqrt(2)))
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["x", "e1"], ["xe"]),
             helper.make_node("Mul", ["xe", "half"], ["y"])]
    shape = [1, 16, 24]
    g = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                          [numpy_helper.from_array(np.array(v, np.float32), k)
                           for k, v in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))])
    path = tmp_path / "gelu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = (np.random.default_rng(2).standard_normal(shape) * 3).astype(np.float32)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)
