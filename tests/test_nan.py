"""NaN and Inf are never swallowed (issue 33, item 3): float max and min in the generated C (scalar,
vector, the omp simd fallback, and the CUDA C through the same printer) keep a NaN from either
operand as np.maximum and np.minimum do, index arithmetic keeps its plain integer comparisons, and
whole models compiled in three layouts give NaN where ONNX Runtime does for all-NaN, one-NaN and
infinite inputs and NaN weights."""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
from conftest import TARGET1, run_kernel
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tuner.codegen.c import generate_c
from tuner.codegen.cuda import generate_cuda
from tuner.measure.builder import build_batch
from tuner.ops import make
from tuner.schedule.lower import lower
from tuner.schedule.schedule import replay
from tuner.task import Task
from tuner.te.expr import Const, Load, Max, Sub, Var, max_expr, min_expr, simplify
from tuner.te.tensor import compute, max_reduce, placeholder, reduce_axis

pytestmark = pytest.mark.slow

N = 16          # vector loops of 16, 8 and 4 lanes
ODD = 18        # not a multiple of 4: the vectorize annotation falls back to a scalar loop under omp simd


# ---------------------------------------------------------------- generated max and min, every form

def _elementwise(n: int) -> list:
    """[(name, inputs, output tensor, NumPy of (a, b))] of one-loop computations over `n` elements."""
    a, b = placeholder((n,), "A"), placeholder((n,), "B")

    def c(f, ins):
        return compute((n,), f, "out", inputs=ins, axis_names=["i"])

    return [
        ("max", [a, b], c(lambda i: max_expr(a[i], b[i]), [a, b]), np.maximum),
        ("min", [a, b], c(lambda i: min_expr(a[i], b[i]), [a, b]), np.minimum),
        ("relu", [a], c(lambda i: max_expr(a[i], Const(0.0)), [a]), lambda x, y: np.maximum(x, 0.0)),
        ("max of a constant first", [a], c(lambda i: max_expr(Const(0.5), a[i]), [a]),
         lambda x, y: np.maximum(0.5, x)),
        ("min of a constant first", [a], c(lambda i: min_expr(Const(-0.5), a[i]), [a]),
         lambda x, y: np.minimum(-0.5, x)),
        ("clip", [a], c(lambda i: min_expr(max_expr(a[i], Const(-1.0)), Const(1.0)), [a]),
         lambda x, y: np.clip(x, -1.0, 1.0)),
        ("max of a min", [a, b], c(lambda i: max_expr(min_expr(a[i], b[i]), Const(-1.0)), [a, b]),
         lambda x, y: np.maximum(np.minimum(x, y), -1.0)),
    ]


def _max_reduction():
    """out[j] = max over r of A[r, j] (4 x 4): a max-pool's accumulation, from -inf."""
    a = placeholder((4, 4), "A")
    r = reduce_axis(4, "r")
    out = compute((4,), lambda j: max_reduce(a[r.var, j], [r]), "out", inputs=[a], axis_names=["j"])
    return [a], out


def _kernels() -> list:
    """[(label, lowered func, max lanes, inputs of (a, b), NumPy of (a, b))]: every form of the C."""
    out = []
    vec = [["annotate", "out", "i", "vectorize"]]
    for n, forms in ((N, [("scalar", [], 16), ("16 lanes", vec, 16), ("8 lanes", vec, 8), ("4 lanes", vec, 4)]),
                     (ODD, [("omp simd", vec, 16)])):
        for name, ins, t, ref in _elementwise(n):
            for form, steps, lanes in forms:
                out.append((f"{name}, {form}", lower(replay(ins, t, steps)), lanes,
                            lambda a, b, n=n, k=len(ins): [a[:n], b[:n]][:k],
                            lambda a, b, n=n, f=ref: f(a[:n], b[:n])))
    ins, t = _max_reduction()
    for form, steps, lanes in (("scalar", [], 16),
                               ("4 lanes", [["reorder", "out", ["r", "j"]], ["annotate", "out", "j", "vectorize"]], 4)):
        out.append((f"max reduction, {form}", lower(replay(ins, t, steps)), lanes, _square, _column_max))
    return out


def _square(a, b):
    return [a[:16].reshape(4, 4)]


def _column_max(a, b):
    return a[:16].reshape(4, 4).max(axis=0)


def _cuda_kernels() -> list:
    """[(label, CudaKernel, inputs of (a, b), NumPy of (a, b))]: the same computations as CUDA C."""
    def grid(axis):
        return [["split", "out", axis, [2]], ["bind", "out", f"{axis}.0", "blockIdx.x"],
                ["bind", "out", f"{axis}.1", "threadIdx.x"]]
    out = [(f"{name}, CUDA", generate_cuda(lower(replay(ins, t, grid("i")))),
            lambda a, b, k=len(ins): [a[:N], b[:N]][:k], lambda a, b, f=ref: f(a[:N], b[:N]))
           for name, ins, t, ref in _elementwise(N)]
    ins, t = _max_reduction()
    out.append(("max reduction, CUDA", generate_cuda(lower(replay(ins, t, grid("j")))), _square, _column_max))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The kernels above, compiled once for the module (the examples only run them)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        kernels = _kernels()
        funcs = [(f"f{k}", generate_c(dataclasses.replace(f, name=f"f{k}"), lanes, 1)[0])
                 for k, (_, f, lanes, _, _) in enumerate(kernels)]
        libs = build_batch(funcs, TARGET1, jobs=1)
        assert all(b.error is None for b in libs), [b.error for b in libs]
        cuda, emulation = [], None
        if shutil.which("g++"):
            from tuner.codegen.cuda_emulate import build_emulation
            cuda = _cuda_kernels()
            emulation = build_emulation([k for _, k, _, _ in cuda])
    return kernels, libs, cuda, emulation


SPECIAL = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0])
VALUES = arrays(np.float32, (2, ODD), elements=st.one_of(SPECIAL, st.floats(width=32)))


def test_the_generated_c_spells_float_max_with_the_nan_propagating_helpers():
    _, f, _, _, _ = _kernels()[0]
    src = generate_c(f, 16, 1)[0]
    assert "tuner_fmax(A[i], B[i])" in src and "?" not in src


def test_integer_min_and_max_in_index_arithmetic_stay_plain_comparisons():
    """An average pool's window count is min/max of indices: ints, not the float helpers."""
    pool = make("avg_pool2d", dict(C=8, H=9, W=9, R=3, S=3, stride=2, pad=1), "NCHW")
    src = Task(pool, TARGET1).default_candidate().source
    assert "tuner_f" not in src and ") < (9) ?" in src and ") > (0) ?" in src


@settings(max_examples=60, deadline=None)
@given(values=VALUES)
def test_generated_max_and_min_give_what_numpy_gives_for_nan_and_inf(built, values):
    kernels, libs, cuda, emulation = built
    a, b = values
    for (label, _, _, inputs, ref), lib in zip(kernels, libs):
        want = np.asarray(ref(a, b), dtype=np.float32)
        got = run_kernel(lib.lib, lib.index, inputs(a, b), want.shape)
        np.testing.assert_array_equal(got, want, err_msg=f"{label}: a={a} b={b}")
    if emulation is not None:
        from tuner.codegen.cuda_emulate import emulate
        for i, (label, k, inputs, ref) in enumerate(cuda):
            want = np.asarray(ref(a, b), dtype=np.float32)
            got, err = emulate(emulation, i, k, inputs(a, b), want.shape)
            assert err is None, err
            np.testing.assert_array_equal(got, want, err_msg=f"{label}: a={a} b={b}")


def test_the_simplifier_never_cancels_a_value_read_from_a_tensor():
    """x - x and 0 * x are NaN for a NaN or infinite x: only index terms cancel."""
    x, y, i, j = Load("a", (Var("i"),)), Load("b", (Var("i"),)), Var("i"), Var("j")
    assert simplify(x - x) == Sub(x, x)
    assert simplify(x + y - x) == Sub(x + y, x)
    assert not isinstance(simplify(Const(0) * x), Const)
    assert simplify((i + j) - i) == j and simplify(Const(0) * i) == Const(0)
    assert simplify(Max(x, Const(0.0))) == Max(x, Const(0.0))       # float bounds are unknown: kept


# ---------------------------------------------------------------- whole models against ONNX Runtime

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

C, H = 8, 6
OUTPUTS = ["relu", "clip", "maxpool", "avgpool", "hswish", "sig", "softmax", "nan_weights", "gemm_nan_weights"]


def _model(path) -> None:
    """One ONNX model with every operator the importer takes that can meet a NaN: Conv+Relu,
    Conv+Clip, MaxPool, AveragePool, Add+HardSwish, Sigmoid, GlobalAveragePool+Gemm+Softmax, and a
    Conv+Relu and a Gemm whose weights hold a NaN and an Inf (at the centre tap: see below)."""
    rng = np.random.default_rng(0)

    def u(*shape):
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)
    w3 = u(C, C, 3, 3)
    w3[2, 3, 1, 1] = np.nan
    w3[5, 1, 1, 1] = np.inf
    g2 = u(4, C)
    g2[1, 3] = np.nan
    consts = {"w1": u(C, C, 3, 3), "b1": u(C), "w2": u(C, C, 1, 1), "g": u(4, C), "gb": u(4), "w3": w3, "g2": g2,
              "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["relu"], "relu1"),
             n("Conv", ["x", "w2"], ["c2"], "conv2"), n("Clip", ["c2", "lo", "hi"], ["clip"], "clip2"),
             n("MaxPool", ["x"], ["maxpool"], "maxpool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             n("AveragePool", ["x"], ["avgpool"], "avgpool", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Add", ["x", "relu"], ["add"], "add"), n("HardSwish", ["add"], ["hswish"], "hswish"),
             n("Sigmoid", ["x"], ["sig"], "sig"),
             n("GlobalAveragePool", ["x"], ["gap"], "gap"), n("Flatten", ["gap"], ["flat"], "flat"),
             n("Gemm", ["flat", "g", "gb"], ["gemm"], "gemm", transB=1),
             n("Softmax", ["gemm"], ["softmax"], "softmax", axis=1),
             n("Conv", ["x", "w3"], ["c3"], "conv3", pads=[1, 1, 1, 1]), n("Relu", ["c3"], ["nan_weights"], "relu3"),
             n("Gemm", ["flat", "g2"], ["gemm_nan_weights"], "gemm2", transB=1)]
    g = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, H])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in OUTPUTS],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _inputs() -> dict:
    x = np.random.default_rng(1).uniform(-1, 1, (1, C, H, H)).astype(np.float32)
    one, inf = x.copy(), x.copy()
    one[0, 3, 2, 4] = np.nan
    inf[0, 1, 0, 0] = inf[0, 5, 3, 3] = np.inf
    inf[0, 2, 5, 5] = inf[0, 6, 2, 2] = -np.inf
    return {"all NaN": np.full_like(x, np.nan), "one NaN": one, "+Inf and -Inf": inf, "finite": x}


def assert_same_nans(ours, ref, what: str) -> None:
    assert ours.shape == ref.shape, what
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref), err_msg=f"{what}: NaN positions")
    keep = ~np.isnan(ref)
    np.testing.assert_allclose(ours[keep], ref[keep], rtol=1e-4, atol=1e-5, err_msg=f"{what}: values")


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("nan") / "nan.onnx"
    _model(path)
    return str(path)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NCHW8c"])
def test_nan_and_inf_inputs_and_nan_weights_give_nan_where_onnxruntime_does(tmp_cache, nan_model, layout):
    """Every output but MaxPool's against ONNX Runtime: equal NaN masks, close finite values.
    MaxPool is held to NumPy (the graph interpreter: NaN wherever the window holds one, as PyTorch
    does): ONNX Runtime's MaxPool keeps a NaN only when it is the last element of a window (one
    NaN gives 1 NaN output where a 3x3 window's 9 outputs see it); its NaN mask must still be
    within ours. The NaN and Inf weights sit at the 3x3 kernel's centre tap: ONNX Runtime's
    optimised (NCHWc) convolution skips the taps over the zero padding, so a NaN weight at a corner
    gives NaN at the border there only without graph optimisations, as in the ONNX reference,
    PyTorch and here (0 * NaN is NaN)."""
    import tuner
    from tuner.graph import load as load_graph
    from tuner.graph.interp import run as interpret
    m = tuner.compile(nan_model, use_shipped=False, threads=1, layout=layout)
    sess = ort.InferenceSession(nan_model, providers=["CPUExecutionProvider"])
    graph = load_graph(nan_model)
    for what, x in _inputs().items():
        ours = dict(zip(OUTPUTS, m.run(x)))
        ref = dict(zip(OUTPUTS, sess.run(OUTPUTS, {"x": x})))
        with np.errstate(invalid="ignore"):
            numpy_ref = dict(zip(OUTPUTS, interpret(graph, x)))
        for name in OUTPUTS:
            if name == "maxpool":
                assert_same_nans(ours[name], numpy_ref[name], f"{layout} {what} {name} (NumPy)")
                assert not (np.isnan(ref[name]) & ~np.isnan(ours[name])).any(), f"{layout} {what} maxpool"
            else:
                assert_same_nans(ours[name], ref[name], f"{layout} {what} {name}")
        if what == "finite":            # the weights' NaN and Inf reach the outputs, and only theirs
            assert np.isnan(ours["nan_weights"][0, 2]).all() and np.isinf(ours["nan_weights"][0, 5]).any()
            assert np.isnan(ours["gemm_nan_weights"][0]).tolist() == [False, True, False, False]
            assert not any(np.isnan(ours[o]).any() for o in OUTPUTS if "nan_weights" not in o)


def test_a_winograd_convolution_never_turns_a_nan_or_inf_into_a_number(tmp_cache, tmp_path):
    """Winograd F(4x4, 3x3) mixes a whole 6x6 input tile into each output of its 4x4 tile through
    sums that cancel: one NaN input spreads over the tiles that read it, and an Inf becomes
    inf - inf = NaN where ONNX Runtime's direct convolution gives +-Inf (a known difference: exact
    positions would need a direct-convolution fallback for tiles that read a non-finite value).
    What holds: every NaN and Inf of ONNX Runtime is non-finite here, finite values agree, and NaN
    weights give NaN in the same places."""
    import tuner
    rng = np.random.default_rng(0)
    w = rng.uniform(-0.5, 0.5, (C, C, 3, 3)).astype(np.float32)
    w[2, 3, 1, 1] = np.nan
    n = helper.make_node
    g = helper.make_graph([n("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"], "relu")],
                          "wino", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    path = str(tmp_path / "wino.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    m = tuner.compile(path, use_shipped=False, threads=1, layout="NCHW", layout_plan={"conv": "winograd4"})
    assert any("winograd" in s.summary for s in m.steps)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).uniform(-1, 1, (1, C, 8, 8)).astype(np.float32)
    one, inf = x.copy(), x.copy()
    one[0, 3, 2, 4] = np.nan
    inf[0, 1, 3, 3], inf[0, 4, 6, 1] = np.inf, -np.inf
    for what, xi in {"finite": x, "one NaN": one, "+Inf and -Inf": inf, "all NaN": np.full_like(x, np.nan)}.items():
        ours, ref = m.run(xi)[0], sess.run(None, {"x": xi})[0]
        assert not (~np.isfinite(ref) & np.isfinite(ours)).any(), what
        both = np.isfinite(ref) & np.isfinite(ours)
        np.testing.assert_allclose(ours[both], ref[both], rtol=1e-3, atol=1e-4, err_msg=what)
        if what == "finite":                                  # only the NaN weight's output channel
            np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
            assert np.isnan(ours[0, 2]).all()
