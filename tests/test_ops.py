"""Every operator in every layout computes the NumPy reference (default schedules, small shapes)."""
import random

import numpy as np
import onnx
import pytest
from conftest import TARGET1, check_schedules
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from tuner.compiler import compile_model
from tuner.ops import make
from tuner.task import Task
from tuner.te.layouts import CONV_LAYOUTS, dense_weight_from_oi, dense_weight_to_oi

CONV_CASES = [
    dict(C=16, H=7, W=7, K=16, R=3, S=3, stride=1, pad=1),
    dict(C=8, H=9, W=9, K=16, R=3, S=3, stride=2, pad=1),
    dict(C=16, H=8, W=8, K=8, R=1, S=1, stride=1, pad=0),
    dict(C=3, H=11, W=11, K=16, R=5, S=5, stride=2, pad=2),            # stem-like, C not a block multiple
    dict(C=16, H=9, W=9, K=16, R=3, S=3, stride=1, pad=2, dilation=2),
    dict(C=16, H=8, W=8, K=16, R=3, S=3, stride=1, pad=1, groups=16),  # depthwise
    dict(C=16, H=6, W=6, K=16, R=3, S=3, stride=1, pad=(0, 1, 1, 2)),  # asymmetric pads
    dict(C=16, H=6, W=6, K=16, R=3, S=3, stride=1, pad=1, bias=1, residual=1, relu=1),
]


@pytest.mark.slow
@pytest.mark.parametrize("layout", CONV_LAYOUTS)
def test_conv2d_every_layout(layout):
    check_schedules([(make("conv2d", p, layout), None) for p in CONV_CASES])


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_grouped_conv2d(layout):
    check_schedules([(make("conv2d", dict(C=8, H=6, W=6, K=12, R=3, S=3, pad=1, groups=4), layout), None)])


@settings(max_examples=10, deadline=None)
@given(width=st.sampled_from([4, 8, 16]), groups=st.integers(2, 4), out_mult=st.integers(1, 2),
       r=st.sampled_from([1, 3]), stride=st.integers(1, 2), block=st.sampled_from([4, 8, 16]), seed=st.integers(0, 99))
def test_a_grouped_conv_in_a_block_its_group_widths_take_computes_the_reference(width, groups, out_mult, r, stride,
                                                                              block, seed):
    """Grouped (not depthwise) convs in NCHW[x]c, where the block divides both group widths (a
    block lies in one group: RegNet's group width 8 in NCHW8c) or holds whole groups of equal in
    and out widths (ResNeXt's width 4 in NCHW16c): the default and sampled schedules compute the
    reference; a block that takes neither is refused, naming the layouts that work."""
    import random

    from tuner.ops import WorkloadError
    from tuner.task import Task
    from tuner.te.layouts import grouped_block
    c, k = width * groups, width * groups * out_mult
    p = dict(C=c, H=7, W=6, K=k, R=r, S=r, stride=stride, pad=r // 2, groups=groups, bias=1, relu=1)
    layout = f"NCHW{block}c"
    if not grouped_block(c, k, groups, block):
        with pytest.raises(WorkloadError, match="needs layout NCHW, NHWC or another block"):
            make("conv2d", p, layout)
        return
    wl = make("conv2d", p, layout)
    task = Task(wl, TARGET1)
    rng = random.Random(seed)
    check_schedules([(wl, None)] + [(wl, task.space.steps(task.space.sample(rng))) for _ in range(3)])


@pytest.mark.parametrize("isa,layout,width", [("avx512", "NCHW16c", 4), ("avx512", "NCHW16c", 2),
                                               ("avx2", "NCHW8c", 4), ("avx2", "NCHW16c", 4)])
def test_a_block_of_whole_groups_reads_each_lane_from_one_vector_load_of_its_block(isa, layout, width):
    """A grouped conv whose block holds several whole groups of up to 4 channels (a 128-bit
    lane; groups of 8 in a block of 16 take blocks of 8) reads, for each output lane, its
    group's channels of the same input block: one vector load permuted (a shuffle), never a gather
    lane by lane, the group's reduction unrolled so that each permutation is a constant; the
    default and sampled schedules compute the reference in both ISAs' code."""
    from tuner.target import host_isa, parse_target
    from tuner.te.layouts import grouped_block
    target = parse_target(f"cpu -isa={isa} -threads=1", check_host=False)
    assert grouped_block(32, 32, 8, 16) == 16 and grouped_block(32, 32, 4, 16) == 0 == grouped_block(32, 64, 8, 16)
    assert grouped_block(32, 32, 4, 8) == 8
    wl = make("conv2d", dict(C=32, H=6, W=7, K=32, R=3, S=3, pad=1, groups=32 // width, bias=1, relu=1), layout)
    task = Task(wl, target)
    lanes = target.lanes
    src = task.default_candidate().source
    assert "__builtin_shuffle((*(f32x%d*)&data[" % lanes in src
    assert "(f32x%d){data[" % lanes not in src
    assert any(st[0] == "annotate" and st[2:] == ["rcb.0", "unroll"] for st in task.space.steps(task.space.default()))
    if isa == "avx512" and host_isa() != "avx512":
        return                       # the code is checked above; this host cannot run it
    check_schedules([(wl, None)] + [(wl, task.space.steps(task.space.sample(random.Random(k)))) for k in range(3)],
                    target)


@pytest.mark.parametrize("layout", ["OI", "OI16o", "OI8o"])
def test_dense(layout):
    check_schedules([(make("dense", dict(C=24, K=48), layout), None),
                     (make("dense", dict(N=3, C=20, K=40, bias=1, relu=1), layout), None)])


@settings(max_examples=10, deadline=None)
@given(k=st.integers(17, 80).filter(lambda k: k % 4), n=st.integers(1, 9), c=st.integers(1, 40))
def test_a_dense_weight_whose_outputs_no_power_of_two_block_divides_is_packed_in_whole_vectors_padded_with_zeros(
        k, n, c):
    """K=195 (FocalNet's) in blocks of 15 read each vector lane by lane; packed in blocks of 16 the
    last one padded, every schedule still computes the reference and the packing round-trips."""
    wl = make("dense", dict(N=n, C=c, K=k, bias=1), "OI16o")
    assert wl.blocks[1] == 16 and wl.build()[0][1].shape == (-(-k // 16), c, 16)
    w = np.random.default_rng(k).standard_normal((k, c)).astype(np.float32)
    packed = dense_weight_from_oi(w, 16)
    assert packed.shape == (-(-k // 16), c, 16) and not packed[-1, :, k % 16:].any()
    np.testing.assert_array_equal(dense_weight_to_oi(packed, 16, k), w)
    into = np.full(packed.shape, np.nan, np.float32)      # packed into storage (compile's weights): the same
    assert dense_weight_from_oi(w, 16, into) is into
    np.testing.assert_array_equal(into, packed)
    task = Task(wl, TARGET1)
    check_schedules([(wl, None), (wl, task.space.steps(task.space.sample(random.Random(k))))])


def test_a_gemm_with_an_odd_number_of_outputs_compiles_to_numpys_values(tmp_path):
    rng = np.random.default_rng(0)
    w, bias = rng.standard_normal((48, 35)).astype(np.float32), rng.standard_normal(35).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"])
    g = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [20, 48])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
                           helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias)])
    path = tmp_path / "gemm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    m = compile_model(str(path), threads=1, use_shipped=False, predict=False)
    assert "OI16o" in str(m.meta)
    x = rng.standard_normal((20, 48)).astype(np.float32)
    np.testing.assert_allclose(m.run(x)[0], x @ w + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", CONV_LAYOUTS)
def test_pooling_and_elementwise(layout):
    shape = dict(C=16, H=9, W=9)
    check_schedules([
        (make("max_pool2d", dict(shape, R=3, S=3, stride=2, pad=1), layout), None),
        (make("avg_pool2d", dict(shape, R=3, S=3, stride=2, pad=1), layout), None),
        (make("avg_pool2d", dict(shape, R=2, S=2, stride=1, pad=1, count_include_pad=1), layout), None),
        (make("global_avg_pool2d", shape, layout), None),
        (make("relu", shape, layout), None),
        (make("sigmoid", shape, layout), None),
        (make("clip", dict(shape, lo=-0.5, hi=0.25), layout), None),
        (make("add", shape, layout), None),
    ])


@pytest.mark.slow
@pytest.mark.parametrize("src", CONV_LAYOUTS)
def test_layout_transform(src):
    check_schedules([(make("layout_transform", dict(C=32, H=5, W=6, dst=dst), src), None)
                     for dst in CONV_LAYOUTS if dst != src])


@pytest.mark.slow
@pytest.mark.parametrize("act", ["clip", "sigmoid", "hard_sigmoid", "hard_swish", "silu", "leaky_relu"])
def test_activation_epilogues(act):
    extra = {"clip": dict(lo=-0.5, hi=0.75), "hard_sigmoid": dict(alpha=0.25, beta=0.4),
             "leaky_relu": dict(alpha=0.1)}.get(act, {})
    check_schedules([
        (make("conv2d", dict(C=16, H=6, W=6, K=16, R=3, S=3, pad=1, bias=1, act=act, **extra), "NCHW16c"), None),
        (make("conv2d", dict(C=16, H=6, W=6, K=16, R=3, S=3, pad=1, groups=16, bias=1, residual=1, act=act,
                             **extra), "NCHW8c"), None),
        (make("dense", dict(N=2, C=20, K=32, bias=1, act=act, **extra), "OI16o"), None)])
