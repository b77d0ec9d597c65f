"""MergeConvBranches: a sum of convolutions of one input (and the input itself) is one convolution."""
import numpy as np
import onnx
import pytest
from conftest import agree_with_onnxruntime
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.graph import interp
from tuner.graph.builder import GraphBuilder
from tuner.graph.onnx_frontend import load_onnx
from tuner.graph.passes import optimize

PASSES = ["InferType", "SimplifyInference", "MergeConvBranches"]


def _branch(b, x, rng, kernel, stride=1, dilation=1, groups=1, bias=True, pads=None):
    c = x.shape[1]
    r, s = kernel
    if pads is None:     # "same" at stride 1, more below and right where the kernel is even
        pads = [dilation * (r - 1) // 2, dilation * (s - 1) // 2, 0, 0]
        pads[2], pads[3] = dilation * (r - 1) - pads[0], dilation * (s - 1) - pads[1]
    w = b.const(rng.standard_normal((c, c // groups, r, s)).astype(np.float32), "w")
    y = b.add("conv2d", [x, w], {"strides": [stride, stride], "pads": pads, "dilations": [dilation, dilation],
                                 "groups": groups, "layout": "NCHW", "kernel_layout": "OIHW"})
    return b.add("add", [y, b.const(rng.standard_normal((c, 1, 1)).astype(np.float32), "b")]) if bias else y


def _sum(b, terms):
    total = terms[0]
    for t in terms[1:]:
        total = b.add("add", [total, t])
    return total


def _merged(g, x0):
    """The graph after the pass, having checked that it computes what the graph computes."""
    out = optimize(g, passes=PASSES)
    want, got = interp.run(g, x0)[0], interp.run(out, x0)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    return out


@settings(max_examples=60, deadline=None)
@given(kernels=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
       stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]), depthwise=st.booleans(),
       identity=st.sampled_from([None, "plain", "plain, twice", "scaled", "scaled and shifted, twice"]),
       bias=st.booleans(),
       size=st.integers(5, 9), seed=st.integers(0, 2**16))
def test_a_sum_of_convs_of_one_input_computes_what_the_branches_compute(kernels, stride, dilation, depthwise,
                                                                        identity, bias, size, seed):
    """Every sum of convs of one input (kernels up to 3x3, any of them even, strided, dilated,
    depthwise, with an identity term, once or twice) computes the same after the pass, and the convs whose kernel
    covers every other's, at stride 1 with the identity, become one."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, size, size + 1))
    terms = [_branch(b, x, rng, k, stride, dilation, 4 if depthwise else 1, bias) for k in kernels]
    if identity and stride == 1:
        t = x if identity.startswith("plain") else \
            b.add("mul", [x, b.const(rng.standard_normal((4, 1, 1)).astype(np.float32))])
        if identity.startswith("scaled and shifted"):
            t = b.add("add", [t, b.const(rng.standard_normal((4, 1, 1)).astype(np.float32))])
        terms += [t, t] if identity.endswith("twice") else [t]
    g = b.finish([b.add("relu", [_sum(b, terms)])])
    out = _merged(g, rng.standard_normal((1, 4, size, size + 1)).astype(np.float32))
    big = max(kernels, key=lambda k: k[0] * k[1])
    if all(k[0] <= big[0] and k[1] <= big[1] and (k[0] - big[0]) % 2 == 0 and (k[1] - big[1]) % 2 == 0
           for k in kernels):           # odd-by-odd or all the same: each sits centred in the largest
        assert out.count("conv2d") == 1
        if big[0] % 2 and big[1] % 2:      # an odd window has a centre tap for the identity
            assert out.count("mul") == 0
    assert out.count("conv2d") <= len(kernels)


def test_textnets_three_branches_and_identity_become_one_3x3_conv():
    """3x3, 3x1 and 1x3 convs of one input and its batch norm, summed: one 3x3 conv and its bias."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("g")
    x = b.input("x", (1, 8, 6, 6))
    terms = [_branch(b, x, rng, (3, 3), pads=[1, 1, 1, 1]), _branch(b, x, rng, (3, 1), pads=[1, 0, 1, 0]),
             _branch(b, x, rng, (1, 3), pads=[0, 1, 0, 1])]
    scale, shift = (b.const(rng.standard_normal((8, 1, 1)).astype(np.float32)) for _ in range(2))
    terms.append(b.add("add", [b.add("mul", [x, scale]), shift]))
    g = b.finish([_sum(b, terms)])
    out = _merged(g, rng.standard_normal((1, 8, 6, 6)).astype(np.float32))
    assert [n.op for n in out.nodes] == ["conv2d", "add"]
    assert out.nodes[0].inputs[1].shape == (8, 8, 3, 3) and out.nodes[0].attrs["pads"] == [1, 1, 1, 1]


@pytest.mark.parametrize("case", ["1x3 and 3x1 alone", "2x3 and 3x2", "other strides", "another input",
                                  "used elsewhere", "identity at stride 2", "identity of a grouped conv"])
def test_convs_that_would_read_more_merged_or_differ_stay_apart(case):
    """Kernels no one of which holds the others (a 1x3 and a 3x1 alone: a 3x3 would read corners
    neither reads), convs of other strides or inputs, a conv whose output is also used elsewhere,
    and an identity that no tap maps pixel to pixel (at stride 2; a grouped conv's other channels)
    stay apart."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("g")
    shape = {"identity at stride 2": (1, 4, 2, 2), "other strides": (1, 4, 4, 4)}.get(case, (1, 4, 6, 6))
    x = b.input("x", shape)
    outs = []
    if case == "1x3 and 3x1 alone":
        terms = [_branch(b, x, rng, (1, 3)), _branch(b, x, rng, (3, 1))]
    elif case == "2x3 and 3x2":
        terms = [_branch(b, x, rng, (2, 3)), _branch(b, x, rng, (3, 2))]
    elif case == "other strides":        # one window, both 2x2 outputs of a 4x4 input
        terms = [_branch(b, x, rng, (3, 3), stride=2, pads=[1, 1, 1, 1]),
                 _branch(b, x, rng, (3, 3), stride=3, pads=[1, 1, 1, 1])]
    elif case == "another input":
        terms = [_branch(b, x, rng, (3, 3)), _branch(b, b.add("relu", [x]), rng, (1, 1))]
    elif case == "used elsewhere":
        terms = [_branch(b, x, rng, (3, 3)), _branch(b, x, rng, (1, 1))]
        outs.append(b.add("sigmoid", [terms[1]]))
    elif case == "identity at stride 2":  # a 2x2 output of a 2x2 input, its taps reading pixel 2i
        terms = [_branch(b, x, rng, (5, 5), stride=2, pads=[3, 3, 3, 3]), x]
    else:
        terms = [_branch(b, x, rng, (3, 3), groups=2), x]
    g = b.finish([_sum(b, terms)] + outs)
    before = optimize(g, passes=PASSES[:2])
    out = _merged(g, rng.standard_normal(shape).astype(np.float32))
    assert [n.op for n in out.nodes] == [n.op for n in before.nodes]


def test_an_identity_shifted_but_not_scaled_goes_on_the_centre_tap():
    """conv(x) + (x + c), the shift's x also read by the conv: one conv and its bias."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 5, 5))
    shifted = b.add("add", [x, b.const(rng.standard_normal((4, 1, 1)).astype(np.float32))])
    g = b.finish([_sum(b, [_branch(b, x, rng, (3, 3)), shifted])])
    out = _merged(g, rng.standard_normal((1, 4, 5, 5)).astype(np.float32))
    assert [n.op for n in out.nodes] == ["conv2d", "add"]


def test_an_acnet_block_exported_by_torch_computes_what_onnx_runtime_computes(tmp_path):
    """An asymmetric-convolution block (ACNet, TextNet) as torch exports it, at stride 1 with its
    identity and at stride 2: each block becomes one conv, and the compiled model agrees."""
    torch = pytest.importorskip("torch", reason="torch is an optional benchmark dependency")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c, k, stride):
            super().__init__()
            self.branches = nn.ModuleList(
                nn.Sequential(nn.Conv2d(c, k, ks, stride, pad, bias=False), nn.BatchNorm2d(k))
                for ks, pad in (((3, 3), (1, 1)), ((3, 1), (1, 0)), ((1, 3), (0, 1))))
            self.identity = nn.BatchNorm2d(c) if stride == 1 and c == k else None

        def forward(self, x):
            y = sum(b(x) for b in self.branches)
            return torch.relu(y + self.identity(x) if self.identity is not None else y)

    torch.manual_seed(0)
    m = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1)).eval()
    for bn in m.modules():
        if isinstance(bn, nn.BatchNorm2d):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(1, 16, 13, 14)
    path = tmp_path / "acnet.onnx"
    torch.onnx.export(m, (x,), str(path), opset_version=18, dynamo=False)
    out = optimize(load_onnx(path), passes=PASSES)
    assert out.count("conv2d") == 3
    feeds = {load_onnx(path).inputs[0].name: x.numpy()}
    agree_with_onnxruntime(path, feeds)
    agree_with_onnxruntime(path, feeds, threads=2)


def test_branches_summed_by_one_onnx_sum_node_merge_and_compute_what_onnx_runtime_computes(tmp_path):
    """ONNX Sum (variadic, as older exporters write a RepVGG block) adds its inputs in order; its
    three convs of one input and the input itself become one conv."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(2)
    w = {f"w{k}": rng.standard_normal((8, 8, r, s)).astype(np.float32) for k, (r, s) in enumerate([(3, 3), (1, 1), (1, 3)])}
    b = {f"b{k}": rng.standard_normal(8).astype(np.float32) for k in range(3)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]), n("Conv", ["x", "w1", "b1"], ["c1"]),
             n("Conv", ["x", "w2", "b2"], ["c2"], pads=[0, 1, 0, 1]), n("Sum", ["c0", "c1", "c2", "x"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 7, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in {**w, **b}.items()])
    path = tmp_path / "sum.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    assert [n.op for n in optimize(load_onnx(path), passes=PASSES).nodes] == ["conv2d", "add"]
    agree_with_onnxruntime(path, {"x": rng.standard_normal((1, 8, 7, 9)).astype(np.float32)})


@pytest.mark.parametrize("shapes", [[(2, 3, 4)], [(2, 3, 4), (3, 1), (4,)], [(1, 4), (3, 1), (3, 4), (1, 1)]])
def test_an_onnx_sum_of_one_or_more_broadcast_inputs_computes_what_onnx_runtime_computes(tmp_path, shapes):
    from onnx import TensorProto, helper
    """Sum adds its inputs, broadcast, in order; one input (after a Relu here) passes through."""
    names = [f"x{k}" for k in range(len(shapes))]
    nodes = [helper.make_node("Relu", ["x0"], ["r"]), helper.make_node("Sum", ["r"] + names[1:], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                                       for n, s in zip(names, shapes)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "sum.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    rng = np.random.default_rng(4)
    agree_with_onnxruntime(path, {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)})
