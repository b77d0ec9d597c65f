"""3-D windows (Conv3d, MaxPool3d, AvgPool3d, global pooling of a clip) as torchvision's video models
and volumetric CNNs export them, against ONNX Runtime: the graph interpreter over many attribute
mixes, the compiled model over a few and over a real export."""
import numpy as np
import onnx
import pytest
from conftest import agree_with_onnxruntime, ort_run
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import UserError
from tuner.graph import interp
from tuner.graph.onnx_frontend import load_onnx
from tuner.ops.window3d import depth_taps

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def _save(path, nodes, shape: list, inits: dict):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _interp_agrees(path, x):
    want = ort_run(path, {"x": x})[0]
    ours = interp.run(load_onnx(path), x)[0]
    assert ours.shape == want.shape
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4 * max(float(np.abs(want).max()), 1e-30))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), groups=st.sampled_from([1, 2]), bias=st.booleans(), batch=st.integers(1, 2),
       auto=st.sampled_from(["NOTSET", "SAME_UPPER", "VALID"]))
def test_a_3d_convolution_computes_what_onnx_runtime_computes(tmp_path, data, groups, bias, batch, auto):
    """Any kernel, stride, dilation and pads over depth, height and width, grouped, with or without a
    bias, a batch of clips; taps that read only depth padding left out."""
    three = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=3, max_size=3)  # noqa: E731
    k, s, d, size = data.draw(three(1, 3)), data.draw(three(1, 2)), data.draw(three(1, 2)), data.draw(three(1, 5))
    pads = data.draw(st.lists(st.integers(0, 3), min_size=6, max_size=6))
    attrs = dict(kernel_shape=k, strides=s, dilations=d, group=groups)
    if auto == "NOTSET":
        attrs["pads"] = pads
        assume(all(n + pads[i] + pads[i + 3] >= (kk - 1) * dd + 1 for i, (n, kk, dd) in enumerate(zip(size, k, d))))
    else:            # ONNX Runtime dilates no SAME window
        attrs |= dict(auto_pad=auto, dilations=[1, 1, 1] if auto != "VALID" else d)
        d = attrs["dilations"]
        assume(auto != "VALID" or all(n >= (kk - 1) * dd + 1 for n, kk, dd in zip(size, k, d)))
    c, kout = 4, 6
    inits = {"w": _f32(kout, c // groups, *k)} | ({"b": _f32(kout)} if bias else {})
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)]
    _interp_agrees(_save(tmp_path / "c.onnx", nodes, [batch, c, *size], inits), _f32(batch, c, *size))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), op=st.sampled_from(["MaxPool", "AveragePool"]), ceil=st.integers(0, 1),
       include=st.integers(0, 1))
def test_a_3d_pool_computes_what_onnx_runtime_computes(tmp_path, data, op, ceil, include):
    """Max and average pools over clips: any window, stride and pads, ceil mode, pads counted or not."""
    three = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=3, max_size=3)  # noqa: E731
    k, s, size = data.draw(three(1, 3)), data.draw(three(1, 3)), data.draw(three(1, 6))
    pads = [data.draw(st.integers(0, kk - 1)) for kk in k] + [data.draw(st.integers(0, kk - 1)) for kk in k]
    assume(all(n + pads[i] + pads[i + 3] >= kk for i, (n, kk) in enumerate(zip(size, k))))
    extra = {"count_include_pad": include} if op == "AveragePool" else {}
    nodes = [helper.make_node(op, ["x"], ["y"], kernel_shape=k, strides=s, pads=pads, ceil_mode=ceil, **extra)]
    path = _save(tmp_path / "p.onnx", nodes, [1, 3, *size], {})
    try:
        _interp_agrees(path, _f32(1, 3, *size))
    except UserError as e:       # the 2-D rule: ceil mode with counted pads that would change the output size
        assert op == "AveragePool" and ceil and include and "count_include_pad" in str(e)


def test_each_depth_tap_reads_only_the_outputs_whose_window_it_falls_inside_the_clip():
    assert depth_taps(4, 3, 1, 1, 1, 1) == (4, [(0, 1, 3, 0), (1, 0, 4, 0), (2, 0, 3, 1)])
    assert depth_taps(1, 3, 1, 1, 1, 1) == (1, [(1, 0, 1, 0)])          # one frame: the centre tap alone
    assert depth_taps(8, 3, 2, 1, 1, 1) == (4, [(0, 1, 3, 1), (1, 0, 4, 0), (2, 0, 4, 1)])


def test_a_clip_network_compiles_to_onnx_runtimes_values(tmp_path):
    """Conv3d (full, (1, k, k) and (k, 1, 1) kernels as R(2+1)D factors them, strided, one frame deep at the
    end), max and average pools over clips, and the clip's global average, compiled."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3, 3], pads=[1] * 6),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 3, 3], strides=[2, 2, 2],
                              pads=[0, 1, 1, 1, 1, 1], ceil_mode=1),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1]),
             helper.make_node("Conv", ["c2", "w3"], ["c3"], kernel_shape=[3, 1, 1], strides=[2, 1, 1],
                              pads=[1, 0, 0, 1, 0, 0]),
             helper.make_node("AveragePool", ["c3"], ["p3"], kernel_shape=[3, 3, 3], strides=[1, 1, 1],
                              pads=[1] * 6),
             helper.make_node("GlobalAveragePool", ["p3"], ["g"]),
             helper.make_node("Flatten", ["g"], ["y"])]
    inits = {"w1": _f32(16, 3, 3, 3, 3), "b1": _f32(16), "w2": _f32(32, 16, 1, 3, 3), "w3": _f32(32, 32, 3, 1, 1)}
    path = _save(tmp_path / "clip.onnx", nodes, [1, 3, 4, 10, 10], inits)
    agree_with_onnxruntime(path, {"x": _f32(1, 3, 4, 10, 10)}, threads=2)


def test_a_torch_video_block_exported_by_torch_compiles_to_onnx_runtimes_values(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is an optional benchmark dependency")
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv3d(3, 8, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2), bias=False), nn.BatchNorm3d(8), nn.ReLU(),
        nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
        nn.Conv3d(8, 16, 3, stride=2, padding=1, groups=2), nn.BatchNorm3d(16), nn.ReLU(),
        nn.AvgPool3d(2, ceil_mode=True, count_include_pad=False), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, 5)).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, 5, 17, 17)
    path = tmp_path / "video.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], opset_version=17, dynamo=False)
    agree_with_onnxruntime(path, {"x": x.numpy()})


def test_a_convolution_over_more_than_three_axes_is_a_one_line_error_naming_the_node(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv4d")]
    path = _save(tmp_path / "c4.onnx", nodes, [1, 2, 3, 3, 3, 3], {"w": _f32(4, 2, 1, 1, 1, 1)})
    with pytest.raises(UserError, match="node 'conv4d' \\(Conv\\): only 1-D, 2-D and 3-D convolutions are supported"):
        load_onnx(path)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="bad", group=3)]
    path = _save(tmp_path / "g.onnx", nodes, [1, 4, 3, 3, 3], {"w": _f32(6, 2, 1, 1, 1)})
    with pytest.raises(UserError, match="node 'bad' \\(Conv\\): a weight of shape \\[6, 2, 1, 1, 1\\] and group=3"):
        load_onnx(path)


def test_the_2d_pools_of_a_clips_frames_run_in_blocks_where_its_channels_fill_them(tmp_path):
    """A pool reading a reshape's images (no layout names them) runs in the desired blocked layout
    where its channels are whole blocks (NCHW: 1 GFLOP/s in S3D), else in NCHW; both keep the values."""
    from tuner.graph.passes import optimize
    for c, want in ((16, "NCHW16c"), (12, "NCHW")):
        nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3, 3], strides=[1, 2, 2], pads=[1] * 6),
                 helper.make_node("Relu", ["p"], ["y"])]
        path = _save(tmp_path / f"pool{c}.onnx", nodes, [1, c, 3, 6, 6], {})
        g = load_onnx(path)
        out = optimize(g, layout="NCHW16c")
        frames = [n for n in out.nodes if n.op == "max_pool2d" and n.attrs["kernel"] == [3, 3]]
        assert len(frames) == 1 and frames[0].attrs["layout"] == want, [n.attrs for n in frames]
        x = _f32(1, c, 3, 6, 6)
        np.testing.assert_allclose(interp.run(out, x)[0], ort_run(path, {"x": x})[0], rtol=1e-6)
