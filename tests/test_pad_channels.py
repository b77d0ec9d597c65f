"""PadChannels: convs whose channel count the layout's block does not divide compute whole blocks,
and the graph's outputs stay what the unpadded graph computes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.graph import interp
from tuner.graph.builder import GraphBuilder
from tuner.graph.passes import optimize
from tuner.graph.passes.pad_channels import padded_count

CONV = {"strides": [1, 1], "dilations": [1, 1], "groups": 1}


def _net(rng, c: int, k: int, tail: str, act: str = "clip"):
    """conv(c->k)+bias+relu -> depthwise 3x3 + act -> conv(k->k)+bias -> [SE scale] -> tail, NCHW 1x c x 9 x 9
    (sigmoid makes the extra channels 0.5, which the next conv must weigh by zero)."""
    b = GraphBuilder("odd")
    w = lambda *s: b.const(rng.standard_normal(s).astype(np.float32) * 0.3)       # noqa: E731
    x = b.input("x", (1, c, 9, 9), layout="NCHW")
    y = b.add("relu", [b.add("add", [b.add("conv2d", [x, w(k, c, 1, 1)], dict(CONV, pads=[0, 0, 0, 0])), w(1, k, 1, 1)])])
    d = b.add("conv2d", [y, w(k, 1, 3, 3)], dict(CONV, pads=[1, 1, 1, 1], groups=k))
    d = b.add(act, [b.add("add", [d, w(k, 1, 1)])], {"min": 0.0, "max": 6.0} if act == "clip" else {})
    z = b.add("add", [b.add("conv2d", [d, w(k, k, 1, 1)], dict(CONV, pads=[0, 0, 0, 0])), w(1, k, 1, 1)])
    if tail in ("se", "residual"):
        s = b.add("global_avg_pool2d", [z], {})
        s = b.add("sigmoid", [b.add("conv2d", [b.add("relu", [b.add("conv2d", [s, w(8, k, 1, 1)],
                                                                               dict(CONV, pads=[0, 0, 0, 0]))]),
                                               w(k, 8, 1, 1)], dict(CONV, pads=[0, 0, 0, 0]))])
        z = b.add("mul", [z, s])
        if tail == "residual":
            z = b.add("add", [z, y])
        z = b.add("div", [z, w(1, k, 1, 1)])
    if tail == "concat":
        z = b.add("concat", [z, y], {"axis": 1})
    if tail == "flatten":
        z = b.add("flatten", [b.add("global_avg_pool2d", [z], {})], {"axis": 1})
    return b.finish([z, y] if tail == "two_outputs" else [z])


@settings(max_examples=25, deadline=None)
@given(c=st.integers(3, 40), k=st.sampled_from([1, 3, 12, 18, 24, 26, 40, 58, 100, 116]),
       tail=st.sampled_from(["none", "se", "residual", "concat", "flatten", "two_outputs"]),
       act=st.sampled_from(["clip", "sigmoid"]), layout=st.sampled_from(["NCHW16c", "NCHW8c"]),
       seed=st.integers(0, 99))
def test_padded_convs_keep_every_output_and_compute_whole_blocks(c, k, tail, act, layout, seed):
    g = _net(np.random.default_rng(seed), c, k, tail, act)
    x = np.random.default_rng(seed + 1).standard_normal((1, c, 9, 9)).astype(np.float32)
    want = interp.run(g, x)
    o = optimize(g, layout=layout)
    got = interp.run(o, x)
    assert len(got) == len(want) > 0
    for a, r in zip(got, want):
        assert a.shape == r.shape
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(r).max())))
    block = int(layout[4:-1])
    ks = [n.output.shape[1] * n.output.shape[4] for n in o.nodes if n.op == "conv2d" and len(n.output.shape) == 5]
    assert ks, "no blocked conv"
    if padded_count(k, block) != k:
        assert padded_count(k, block) in ks and k not in ks, (k, ks)


@pytest.mark.parametrize("k, block, want", [(58, 16, 64), (1000, 16, 1008), (24, 16, 32), (40, 8, 40), (8, 16, 8),
                                            (12, 16, 16), (116, 16, 128), (64, 16, 64), (18, 8, 24), (20, 8, 24),
                                            (4, 16, 4), (3, 16, 16), (1, 16, 1), (150, 16, 160), (26, 16, 32),
                                            (2, 8, 8)])
def test_a_conv_is_padded_only_where_the_pad_costs_less_than_the_small_block(k, block, want):
    """A block of 4 or 8 fills its lanes; any other (3, 13, 15) runs as scalars, so 150 classes run as 160."""
    assert padded_count(k, block) == want


@pytest.mark.parametrize("k, want", [(24, 24), (40, 40), (56, 56), (72, 80), (120, 128), (232, 240), (1000, 1008),
                                     (58, 64), (20, 32), (12, 16), (3, 16), (32, 32)])
def test_on_8_lane_vectors_a_block_of_8_is_padded_only_where_that_adds_little_compute(k, want):
    """AVX2 in NCHW16c: 24 channels in blocks of 8 already fill its 8 lanes, so padding them to 32
    would add a third more compute; 1000 as 1008 adds little and gives each register tile two
    vectors of channels (NARROW); 58 (blocks of 2) and 20 (blocks of 4) gain from whole blocks."""
    assert padded_count(k, 16, lanes=8) == want
    assert padded_count(k, 16, lanes=16) == padded_count(k, 16)          # the block's own lanes: as before


def test_a_compile_for_8_lanes_runs_24_channels_in_blocks_of_8_where_16_lanes_would_pad_them():
    """The compile passes its target's vector width to PadChannels, as a quick tune's padded graph
    does: for AVX2 the conv writing 24 channels runs unpadded in blocks of 8 and computes what the
    graph does; for AVX-512 the graph is padded to 32."""
    from tuner.compiler import compile_model
    from tuner.graph.layout_plan import padded_graph
    g = _net(np.random.default_rng(5), 16, 24, "se")
    assert padded_graph(g, "NCHW16c", {}, lanes=8) is None and padded_graph(g, "NCHW16c", {}, lanes=16) is not None
    x = np.random.default_rng(6).standard_normal((1, 16, 9, 9)).astype(np.float32)
    want = interp.run(g, x)[0]
    m = compile_model(g, target="cpu -isa=avx2", threads=1, use_shipped=False, predict=False)
    convs = [s.workload for s in m.steps if (s.workload or "").startswith("conv2d")]
    assert convs and not any("K=32," in c for c in convs) and any("K=24," in c for c in convs), convs
    np.testing.assert_allclose(m.run(x)[0], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("first", ["NCHW", "NCHW8c", "NCHW16c"])
def test_a_compile_with_a_layout_plan_pads_nothing_as_the_solver_priced_it(first):
    """The layout solver prices each layout from the graph compiled in it, unpadded: a padded producer
    in one layout would change the channels its consumer in another reads, so a plan compiles unpadded."""
    from tuner.graph.layout_plan import model_layouts
    g = _net(np.random.default_rng(0), 16, 58, "none")
    convs = [n.name for n in g.nodes if n.op == "conv2d"]
    o = optimize(g, layout="NCHW16c", layout_plan={convs[0]: first})
    ks = [n.output.shape[1] * (n.output.shape[4] if len(n.output.shape) == 5 else 1) for n in o.nodes
          if n.op == "conv2d"]
    assert ks and 64 not in ks and 58 in ks
    space = model_layouts(g, ("NCHW8c", "NCHW16c"))
    assert all(wl.p.get("K") != 64 for wl, _ in space.workloads())
    assert 64 in [n.output.shape[1] * n.output.shape[4] for n in optimize(g, layout="NCHW16c").nodes
                  if n.op == "conv2d"]


@pytest.mark.parametrize("tail", ["residual", "concat"])
def test_a_compiled_model_with_padded_convs_computes_what_the_graph_does(tail):
    from tuner.compiler import compile_model
    g = _net(np.random.default_rng(3), 24, 58, tail, "sigmoid")
    m = compile_model(g, threads=1, use_shipped=False, predict=False)
    assert any("K=64," in (s.workload or "") for s in m.steps), [s.workload for s in m.steps]
    x = np.random.default_rng(4).standard_normal((1, 24, 9, 9)).astype(np.float32)
    want = interp.run(g, x)[0]
    np.testing.assert_allclose(m.run(x)[0], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_tuner_inspect_pads_as_a_compile_for_its_target_would():
    """`tuner inspect --target` counts that target's lanes: MobileNetV2's 24-channel convs stay whole
    for AVX2 and run as 32 for AVX-512 (both can be inspected on any host)."""
    import subprocess
    import sys
    out = {isa: subprocess.run([sys.executable, "-m", "tuner.cli", "inspect", "mobilenet_v2", "--layout", "NCHW16c",
                                "--target", f"cpu -isa={isa}"], capture_output=True, text=True) for isa in ("avx2", "avx512")}
    assert all(o.returncode == 0 for o in out.values()), {k: o.stderr for k, o in out.items()}
    assert "K=24," in out["avx2"].stdout and "K=24," not in out["avx512"].stdout and "K=32," in out["avx512"].stdout
