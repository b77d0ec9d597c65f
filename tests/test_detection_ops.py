"""Operators of transformer detectors (RT-DETR, Deformable DETR) and spatial transformers, against
ONNX Runtime: TopK of a constant k (values and indices, largest or smallest, ties by index, NaN
first) and GridSample (bilinear or nearest, zeros or border, either align_corners), interpreted
and compiled."""
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
from tuner.ops.reduce import topk_blocks

pytest.importorskip("onnxruntime", reason="onnxruntime is the reference for imported models")


def _topk_model(path, shape, k, axis, largest):
    """v, i = TopK(x, k), the indices cast to float32."""
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["v", "i64"], axis=axis, largest=largest),
                           helper.make_node("Cast", ["i64"], ["i"], to=TensorProto.FLOAT)], "topk",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("i", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([k], np.int64), "k")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _ties(shape, seed):
    """Values with many repeats, an infinity and NaNs: the order's every rule is exercised."""
    x = np.random.default_rng(seed).integers(-3, 4, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[:: 5] = np.nan
    flat[1:: 7] = -np.inf
    return x


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), data=st.data(), largest=st.sampled_from([0, 1]))
def test_topk_interprets_as_onnx_runtime_computes_it_ties_and_nans_included(tmp_path, shape, data, largest):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, shape[axis]))
    path = _topk_model(tmp_path / "t.onnx", shape, k, axis, largest)
    x = _ties(shape, len(shape) + k)
    got, want = interp.run(load_onnx(path), x), ort_run(path, x)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.sampled_from([300, 1200, 4096, 8400]), lead=st.integers(1, 3), data=st.data(), largest=st.sampled_from([0, 1]))
def test_a_topk_over_a_long_axis_ranks_in_blocks_first_and_still_computes_what_onnx_runtime_does(
        tmp_path, n, lead, data, largest):
    k = data.draw(st.integers(1, 60).filter(lambda k: topk_blocks(n, k) is not None))   # 41 of 300 pays no blocks
    path = _topk_model(tmp_path / "t.onnx", (lead, n), k, -1, largest)
    g = load_onnx(path)
    assert sum(nd.op == "topk" for nd in g.nodes) >= 2
    x = _ties((lead, n), n + k)
    got, want = interp.run(g, x), ort_run(path, x)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


# the last three in blocks: along a middle axis, and (4096 by 3) its candidates in blocks again
@pytest.mark.parametrize("shape, k, axis, largest", [((2, 37), 5, -1, 1), ((3, 6, 4), 6, 1, 0), ((1, 300), 300, 1, 1),
                                                     ((2, 1200), 5, -1, 1), ((2, 600, 3), 4, 1, 0), ((1, 4096), 3, 1, 1)])
def test_topk_compiles_to_what_onnx_runtime_computes(tmp_path, tmp_cache, shape, k, axis, largest):
    path = _topk_model(tmp_path / "t.onnx", shape, k, axis, largest)
    x = _ties(shape, k)
    got, want = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x), ort_run(path, x)
    assert len(got) == len(want) == 2
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


def _arg_model(path, op, shape, axis, keepdims, last, cast=True):
    """y = ArgMax/ArgMin(x), as float32 where `cast`, else the int64 itself."""
    nodes = [helper.make_node(op, ["x"], ["i64" if cast else "y"], axis=axis, keepdims=keepdims, select_last_index=last)]
    nodes += [helper.make_node("Cast", ["i64"], ["y"], to=TensorProto.FLOAT)] if cast else []
    g = helper.make_graph(nodes, "arg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT if cast else TensorProto.INT64, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("op, last", [("ArgMax", 0), ("ArgMax", 1), ("ArgMin", 0), ("ArgMin", 1)])
def test_a_nan_after_the_extreme_of_minus_or_plus_infinity_is_no_tie_of_it(tmp_path, tmp_cache, op, last):
    # found by CI: the reference counted a later NaN as a tie of a -inf maximum, with last its index
    x = np.array([[-np.inf, np.inf, -np.inf, 1.0], [-np.inf, np.inf, np.nan, np.nan], [np.nan] * 4], np.float32)
    path = _arg_model(tmp_path / "a.onnx", op, x.shape, 0, 0, last)
    want = ort_run(path, x)[0]
    np.testing.assert_array_equal(interp.run(load_onnx(path), x)[0], want)
    np.testing.assert_array_equal(compile_model(str(path), target="cpu -threads=1").run(x)[0], want)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), data=st.data(), op=st.sampled_from(["ArgMax", "ArgMin"]),
       keepdims=st.integers(0, 1), last=st.integers(0, 1), nan_first=st.booleans())
def test_argmax_and_argmin_interpret_as_onnx_runtime_computes_them_ties_nans_and_infinities_included(
        tmp_path, shape, data, op, keepdims, last, nan_first):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    if keepdims == 0 and len(shape) == 1:
        keepdims = 1                # a 0-d output is no graph output here
    path = _arg_model(tmp_path / "a.onnx", op, shape, axis, keepdims, last)
    x = _ties(shape, len(shape) * 7 + axis)
    if nan_first:                   # a NaN where the scan starts: ONNX Runtime keeps it
        np.moveaxis(x, axis, 0)[0] = np.nan
    np.testing.assert_array_equal(interp.run(load_onnx(path), x)[0], ort_run(path, x)[0])


@pytest.mark.parametrize("op, shape, axis, keepdims, last", [("ArgMax", (2, 21, 5, 7), 1, 0, 0), ("ArgMin", (3, 40), -1, 1, 1),
                                                            ("ArgMax", (4, 9, 3), 0, 1, 1), ("ArgMin", (2, 150), 1, 0, 0)])
def test_argmax_and_argmin_compile_to_what_onnx_runtime_computes(tmp_path, tmp_cache, op, shape, axis, keepdims, last):
    path = _arg_model(tmp_path / "a.onnx", op, shape, axis, keepdims, last)
    x = _ties(shape, 3)
    np.moveaxis(x, axis, 0)[0].flat[::3] = np.nan      # some scans start at a NaN
    got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x)
    want = ort_run(path, x)
    assert len(got) == len(want) == 1 and got[0].shape == want[0].shape
    np.testing.assert_array_equal(got[0], want[0])


def test_a_model_whose_output_is_int64_returns_int64_as_onnx_runtime_does(tmp_path, tmp_cache):
    """A segmentation map (argmax over the classes) travels as float32 inside and comes back int64."""
    path = _arg_model(tmp_path / "a.onnx", "ArgMax", (1, 21, 6, 7), 1, 0, 0, cast=False)
    x = np.random.default_rng(2).standard_normal((1, 21, 6, 7)).astype(np.float32)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    got, want = m.run(x)[0], ort_run(path, x)[0]
    assert m.meta["outputs"][0]["dtype"] == "int64" and got.dtype == want.dtype == np.int64
    assert len(np.unique(want)) > 5
    np.testing.assert_array_equal(got, want)


def _grid_model(path, xs, gs, mode, padding, align):
    g = helper.make_graph([helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding,
                                            align_corners=align)], "gs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs)),
                           helper.make_tensor_value_info("g", TensorProto.FLOAT, list(gs))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]), str(path))
    return path


def _grid(gs, seed):
    """Coordinates inside, on and beyond [-1, 1], and exact halves (nearest's ties)."""
    g = np.random.default_rng(seed).uniform(-1.3, 1.3, size=gs).astype(np.float32)
    g.reshape(-1)[:6] = [-1.0, 1.0, 0.0, -1.5, 1.25, 0.5]
    return g


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_interprets_and_compiles_to_what_onnx_runtime_computes(tmp_path, tmp_cache, mode, padding, align):
    xs, gs = (2, 3, 5, 7), (2, 4, 6, 2)
    path = _grid_model(tmp_path / "g.onnx", xs, gs, mode, padding, align)
    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    g = _grid(gs, 2)
    want = ort_run(path, {"x": x, "g": g})[0]
    np.testing.assert_allclose(interp.run(load_onnx(path), x, g)[0], want, rtol=1e-5, atol=1e-5)
    got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x, g)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs, words", [({"mode": "bicubic"}, "mode 'bicubic'"),
                                          ({"padding_mode": "reflection"}, "padding_mode 'reflection'")])
def test_a_grid_sample_the_tool_cannot_run_is_a_one_line_error_naming_the_node(tmp_path, attrs, words):
    g = helper.make_graph([helper.make_node("GridSample", ["x", "g"], ["y"], name="sampler", **attrs)], "gs",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                           helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 3, 3, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]), str(path))
    with pytest.raises(UserError) as e:
        load_onnx(path)
    assert "sampler" in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("shape, k, words", [((2, 5), 6, "k=6"), ((1, (1 << 24) + 1), 3, "2^24")])
def test_a_topk_whose_k_exceeds_its_axis_or_whose_positions_float32_cannot_hold_is_a_one_line_error(
        tmp_path, shape, k, words):
    path = _topk_model(tmp_path / "t.onnx", shape, k, -1, 1)
    with pytest.raises(UserError) as e:
        load_onnx(path)
    assert words in str(e.value) and "\n" not in str(e.value)
