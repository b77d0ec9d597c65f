"""Workload keys are canonical; specs parse back; bad specs say what is wrong."""
import subprocess
import sys

import numpy as np
import pytest

from tuner.ops import BUILTIN, WorkloadError, builtin, make, parse_spec, resolve


def test_key_ignores_spelling_order_and_name():
    a = parse_spec("conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1", "NHWC")
    b = parse_spec("conv2d:pad=1.1.1.1,stride=1,S=3,R=3,K=64,W=56,H=56,C=64", "NHWC")
    assert a.key == b.key
    assert a.key != a.with_layout("NCHW16c").key
    assert resolve(a.spec, "NHWC").name == "r50.s1.conv3x3"  # an explicit spec gets its built-in name


def test_key_is_identical_in_another_process():
    wl = builtin("r50.s2.conv1x1a", "NCHW16c")
    code = "from tuner.ops import builtin; print(builtin('r50.s2.conv1x1a', 'NCHW16c').key)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONHASHSEED": "99"})
    assert out.stdout.strip() == wl.key


def test_spec_round_trips_for_every_builtin():
    for name in BUILTIN:
        wl = builtin(name)
        assert parse_spec(wl.spec, wl.layout).key == wl.key, name


def test_builtin_set():
    r50 = [n for n in BUILTIN if n.startswith("r50.")]
    assert len(r50) == 23  # 53 convs in ResNet-50, 23 unique shapes
    assert len({make(*BUILTIN[n]).key for n in r50}) == 23
    assert len([n for n in BUILTIN if n.startswith("mbv2.")]) == 10
    assert all(BUILTIN[n][1]["groups"] == BUILTIN[n][1]["C"] for n in BUILTIN if n.startswith("mbv2."))
    assert {"dense.512x1000", "dense.2048x1000"} <= set(BUILTIN)
    conv = builtin("r50.s1.conv3x3")
    assert conv.flops == 2 * 64 * 56 * 56 * 64 * 9


@pytest.mark.parametrize("spec, message", [
    ("conv2d:C=64,H=56", "needs W, K, R, S"),
    ("conv2d:C=64,H=56,W=56,K=64,R=3,S=3,colour=2", "does not take colour"),
    ("conv2d:C=x,H=56,W=56,K=64,R=3,S=3", "is not a number"),
    ("matmul:M=3", "unknown operator 'matmul'"),
    ("conv2d", "expected op:key=value"),
    ("conv2d:C=6,H=5,W=5,K=6,R=3,S=3,groups=4", "must divide"),
    ("conv2d:C=8,H=2,W=2,K=8,R=3,S=3", "does not fit"),
    ("conv2d:C=8,H=4,W=4,K=8,R=3,S=3,act=softmax", "not an epilogue activation"),
    ("conv2d:C=8,H=4,W=4,K=8,R=3,S=3,relu=1,act=clip", "two activations"),
    ("conv2d:C=8,H=4,W=4,K=8,R=3,S=3,act=sigmoid,lo=1", "does not take lo"),
    ("conv2d:C=8,H=4,W=4,K=8,R=3,S=3,act=clip,hi=x", "is not a number"),
])
def test_bad_specs_explain_themselves(spec, message):
    with pytest.raises(WorkloadError, match=message):
        parse_spec(spec)


def test_an_activation_epilogue_leaves_other_keys_alone():
    plain = make("conv2d", dict(C=8, H=4, W=4, K=8, R=3, S=3))
    assert "act" not in plain.p and parse_spec(plain.spec).key == plain.key
    relu6 = parse_spec("conv2d:C=8,H=4,W=4,K=8,R=3,S=3,act=clip,lo=0,hi=6")
    assert relu6.key == parse_spec(relu6.spec).key == make("conv2d", dict(C=8, H=4, W=4, K=8, R=3, S=3, act="clip")).key
    assert relu6.key != plain.key


# keys that tuner 0.1.0 logged before the pooling workloads took their graph operators' names
OLD_POOL_KEYS = [("maxpool:N=1,C=16,H=16,W=16,R=2,S=2,stride=2,pad=0", "NCHW16c", "e6805d52b931909a"),
                 ("avgpool:N=1,C=8,H=9,W=9,R=3,S=3,stride=2,pad=1", "NCHW", "82da8fbcc34deed3"),
                 ("globalavgpool:N=1,C=2048,H=7,W=7", "NCHW8c", "5b9fe9ec633f5ad0")]


@pytest.mark.parametrize("spec, layout, key", OLD_POOL_KEYS)
def test_a_pooling_spec_logged_under_its_old_name_reads_with_its_old_key(spec, layout, key):
    old = parse_spec(spec, layout)
    assert old.key == key and old.op == {"maxpool": "max_pool2d", "avgpool": "avg_pool2d",
                                         "globalavgpool": "global_avg_pool2d"}[spec.split(":")[0]]
    new = parse_spec(old.spec, layout)
    assert old.spec.startswith(old.op + ":") and new.key == key


def test_bad_layout_and_unknown_name():
    from tuner.te.layouts import LayoutError
    with pytest.raises(LayoutError, match="unknown layout 'NCWH'"):
        resolve("r50.s1.conv3x3", "NCWH")
    with pytest.raises(WorkloadError, match="unknown workload 'r50.s9.conv3x3'.*did you mean"):
        resolve("r50.s9.conv3x3")


# ---------------------------------------------------------------- Winograd

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tuner.ops import winograd as WG  # noqa: E402
from tuner.ops.conv import conv2d_ref  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 12), w=st.integers(1, 12), c=st.integers(1, 6), k=st.integers(1, 6),
       pad=st.integers(0, 2), m=st.sampled_from(WG.TILES), seed=st.integers(0, 1000))
def test_the_three_winograd_stages_compute_the_3x3_convolution(h, w, c, k, pad, m, seed):
    """input transform, batched GEMM with the transformed weight, output transform == direct conv"""
    if h + 2 * pad < 3 or w + 2 * pad < 3:
        return
    rng = np.random.default_rng(seed)
    x, wt = rng.uniform(-1, 1, (1, h, w, c)), rng.uniform(-1, 1, (3, 3, c, k))
    out_h, out_w = h + 2 * pad - 2, w + 2 * pad - 2
    y = WG.output_ref(WG.gemm_ref(WG.input_ref(x, pad, m), WG.weight_transform(wt, m)), out_h, out_w, m)
    ref = conv2d_ref(x.transpose(0, 3, 1, 2), wt.transpose(3, 2, 0, 1), 1, (pad,) * 4).transpose(0, 2, 3, 1)
    assert y.shape == ref.shape == (1, out_h, out_w, k)
    np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9)


def test_winograd_specs_name_their_tile_and_layout():
    wl = parse_spec("winograd_output:H=14,W=14,K=256,pad=1,m=4,bias=1,relu=1")
    assert wl.layout == "NHWC" and parse_spec(wl.spec).key == wl.key
    assert wl.build()[0][0].shape == (6, 6, 1, 4, 4, 256)          # alpha x alpha x N x tiles x K
    with pytest.raises(WorkloadError, match="m=3"):
        parse_spec("winograd_input:C=8,H=14,W=14,m=3")
    with pytest.raises(WorkloadError, match="NHWC"):
        parse_spec("winograd_gemm:C=8,H=14,W=14,K=8", "NCHW")
    with pytest.raises(WorkloadError, match=r"NHWC or NCHW\[x\]c, not NCHW$"):
        parse_spec("winograd_input:C=8,H=14,W=14", "NCHW")


@pytest.mark.slow
@pytest.mark.parametrize("layout, channels", [("NCHW16c", 32), ("NCHW8c", 16), ("NCHW16c", 12)])
def test_winograd_transforms_in_a_blocked_layout_equal_nhwc_re_laid(layout, channels):
    """The input transform reading NCHW[x]c and the output transform (with its epilogue) writing it
    give what the NHWC kernels give on the same data re-laid (12 channels: a block of 4)."""
    from conftest import TARGET1

    from tuner.build import Kernel
    from tuner.task import Task
    from tuner.te import layouts as L
    rng = np.random.default_rng(0)
    checked = 0
    for op, p in [("winograd_input", dict(C=channels, H=9, W=7, pad=1, m=4)),
                  ("winograd_output", dict(K=channels, H=9, W=7, pad=1, m=2, bias=1, residual=1, relu=1))]:
        nhwc, blocked = make(op, p, "NHWC"), make(op, p, layout)
        kernels = [Kernel(t, t.space.steps(t.space.default()), None, None)
                   for t in (Task(nhwc, TARGET1), Task(blocked, TARGET1))]
        args = [rng.uniform(-1, 1, shape).astype(np.float32) for shape in kernels[0].input_shapes]

        def relay(a):            # an NHWC activation (or an NHWC bias vector) in the blocked layout
            if a.ndim == 1:
                return a.reshape(kernels[1].input_shapes[1])
            return L.act_from_nchw(a.transpose(0, 3, 1, 2), layout)
        ins = [relay(a) if op == "winograd_input" or k > 0 else a for k, a in enumerate(args)]
        want, got = kernels[0](*args), kernels[1](*ins)
        if op == "winograd_output":
            want = relay(want)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        checked += 1
    assert checked == 2
