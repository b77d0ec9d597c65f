"""SimplifyInference drops a conv's kernel rows and columns that read only padding (DeepLabV3's ASPP)."""
import numpy as np
import onnx
from conftest import agree_with_onnxruntime
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.graph import interp
from tuner.graph.builder import GraphBuilder
from tuner.graph.onnx_frontend import load_onnx
from tuner.graph.passes import optimize
from tuner.ops.common import conv_out_size


def _conv_graph(rng, size, kernel, stride, dilation, pads, groups=1):
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, *size))
    w = b.const(rng.standard_normal((6 if groups == 1 else 4, 4 // groups, *kernel)).astype(np.float32), "w")
    y = b.add("conv2d", [x, w], {"strides": list(stride), "pads": list(pads), "dilations": list(dilation),
                                 "groups": groups, "layout": "NCHW", "kernel_layout": "OIHW"})
    return b.finish([y])


def _conv(g):
    (n,) = [n for n in g.nodes if n.op == "conv2d"]
    return n


@settings(max_examples=120, deadline=None)
@given(size=st.tuples(st.integers(1, 12), st.integers(1, 12)), kernel=st.tuples(st.integers(1, 5), st.integers(1, 5)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), dilation=st.tuples(st.integers(1, 8), st.integers(1, 8)),
       pads=st.tuples(*[st.integers(0, 14)] * 4), depthwise=st.booleans(), seed=st.integers(0, 2**16))
def test_a_conv_without_its_taps_that_read_only_padding_computes_what_it_computed(size, kernel, stride, dilation,
                                                                                 pads, depthwise, seed):
    """At any size, kernel, stride, dilation and padding: the same output after the pass, and every
    kernel row and column left reads the input at some output pixel wherever the cut pads allowed
    the cut."""
    h, w = size
    out = [conv_out_size(*a) for a in zip(size, kernel, stride, pads[:2], pads[2:], dilation)]
    if min(out) < 1:
        return
    rng = np.random.default_rng(seed)
    g = _conv_graph(rng, size, kernel, stride, dilation, pads, 4 if depthwise else 1)
    after = optimize(g, passes=["InferType", "SimplifyInference"])
    x = rng.standard_normal((1, 4, h, w)).astype(np.float32)
    want = interp.run(g, x)[0]
    np.testing.assert_allclose(interp.run(after, x)[0], want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    n = _conv(after)
    a, k = n.attrs, n.inputs[1].shape[2:]
    for ax in (0, 1):
        if a["pads"][ax] == pads[ax] and k[ax] == kernel[ax]:
            continue                   # not cut on this axis
        reads = [[0 <= o * stride[ax] + r * a["dilations"][ax] - a["pads"][ax] < size[ax] for o in range(out[ax])]
                 for r in range(k[ax])]
        assert any(reads[0]) and any(reads[-1]), (ax, a, k)


def test_deeplabs_aspp_convs_become_their_centre_tap_and_compile_to_what_onnxruntime_computes(tmp_path, tmp_cache):
    """3x3 convs of dilation 12, 24 and 36 at 14x14, padded as their dilation: 24 and 36 read only
    padding off their centre, so each is a 1x1 conv; 12 keeps its window."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for k, d in enumerate((12, 24, 36)):
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.1, f"w{k}"))
        nodes.append(helper.make_node("Conv", ["x", f"w{k}"], [f"y{k}"], dilations=[d, d], pads=[d] * 4,
                                      kernel_shape=[3, 3]))
    nodes.append(helper.make_node("Concat", ["y0", "y1", "y2"], ["y"], axis=1))
    g = helper.make_graph(nodes, "aspp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 14, 14])], inits)
    path = tmp_path / "aspp.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    convs = sorted((n.name, n.inputs[1].shape[2:], n.attrs["pads"], n.attrs["dilations"])
                   for n in optimize(load_onnx(path), passes=["InferType", "SimplifyInference"]).nodes if n.op == "conv2d")
    assert [c[1:] for c in convs] == [((3, 3), [12, 12, 12, 12], [12, 12]), ((1, 1), [0, 0, 0, 0], [1, 1]),
                                      ((1, 1), [0, 0, 0, 0], [1, 1])], convs
    x = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
    agree_with_onnxruntime(path, {"x": x})
