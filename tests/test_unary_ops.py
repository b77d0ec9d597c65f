"""The unary ops transformers use (the pieces of GELU and of a decomposed LayerNorm): Erf, Tanh,
Exp, Sqrt, Neg, imported, interpreted and compiled against ONNX Runtime."""
import math

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


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 3, 32)], ids=["lane by lane", "vectorised"])
@pytest.mark.parametrize("op", OPS)
def test_every_unary_op_compiles_to_what_onnxruntime_computes(tmp_path, tmp_cache, op, shape):
    path = _model(op, shape, tmp_path / "u.onnx")
    x = (np.random.default_rng(1).standard_normal(shape) * 2).astype(np.float32)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def vector_math():
    """The PRELUDE's W-lane erf, tanh, exp and sigmoid, each over an array, built for this host."""
    import ctypes
    from tuner.codegen.c import PRELUDE
    from tuner.target import parse_target
    from tuner.toolchain.cc import compile_library
    loops = "".join(f"void {f}{w}(const float* a, float* b, int n) {{ for (int i = 0; i < n; i += {w}) "
                    f"*(f32x{w}*)&b[i] = tuner_{f}{w}(*(const f32x{w}*)&a[i]); }}\n"
                    for f in ("erf", "tanh", "exp", "sigmoid") for w in (4, 8, 16))
    loops += "".join(f"unsigned {f}{w}_flags(const float* a, float* b, int n) {{ "        # MXCSR's exception flags
                     f"__builtin_ia32_ldmxcsr(__builtin_ia32_stmxcsr() & ~0x3fu); {f}{w}(a, b, n); "
                     "return __builtin_ia32_stmxcsr() & 0x3fu; }\n" for f in ("erf", "tanh", "exp", "sigmoid") for w in (4, 8, 16))
    path, err = compile_library(PRELUDE + loops, list(parse_target("cpu -threads=1").cflags))
    assert err is None, err
    lib = ctypes.CDLL(path)

    def run(name, x):
        y = np.empty_like(x)
        ptr = ctypes.POINTER(ctypes.c_float)
        fn = getattr(lib, name)
        fn.restype = ctypes.c_uint
        flags = fn(x.ctypes.data_as(ptr), y.ctypes.data_as(ptr), ctypes.c_int(len(x)))
        return flags if name.endswith("_flags") else y
    return run


FLOATS = st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True) | st.floats(-120, 120, width=32),
                  min_size=16, max_size=16)


@settings(max_examples=100, deadline=None)
@given(xs=st.lists(st.floats(-1, 1, width=32, allow_subnormal=False), min_size=16, max_size=16),
       lanes=st.sampled_from([4, 8, 16]))
def test_vector_erf_tanh_and_exp_of_normal_floats_touch_no_subnormal(vector_math, xs, lanes):
    """Every operation on a subnormal takes a microcode assist (the powers of x^2 in the polynomials
    of GELUs near 0 made FocalNet's 5-20x slower): none is an operand (MXCSR's DE flag) or a result
    (UE) of erf and tanh of normal floats near 0, nor of exp where its result is a normal float
    (and its input no smaller than 1e-15, whose square, in its polynomial, would be subnormal)."""
    x = np.array(xs, np.float32)
    x[:4] = [1e-30, -3e-12, 2e-5, -4.5e-4]
    for name in ("erf", "tanh"):
        assert vector_math(f"{name}{lanes}_flags", x) & 0x12 == 0, (name, x)
    x = np.where(np.abs(x) < 1e-15, 0, x).astype(np.float32)
    x[:4] = [-87.3, -87.0, -60.5, 88.0]
    assert vector_math(f"exp{lanes}_flags", x) & 0x12 == 0, x
    x[:4] = [-86.0, -85.9, 86.0, 1e30]
    assert vector_math(f"sigmoid{lanes}_flags", x) & 0x12 == 0, x


@settings(max_examples=200, deadline=None)
@given(xs=FLOATS, lanes=st.sampled_from([4, 8, 16]))
def test_vector_erf_tanh_and_exp_are_the_exact_functions_rounded_at_every_float(vector_math, xs, lanes):
    x = np.array(xs, np.float32)
    for name, exact in (("erf", math.erf), ("tanh", math.tanh)):
        ref = np.array([exact(float(v)) if v == v else v for v in x])
        got = vector_math(f"{name}{lanes}", x)
        assert np.array_equal(np.isnan(got), np.isnan(x))
        err, ref = np.abs(got - ref)[~np.isnan(x)], ref[~np.isnan(x)]
        assert (err <= 5e-7).all(), (name, x, got)
        if name == "tanh":          # relative too: tanh is x itself near 0
            assert (err <= 5e-7 * np.abs(ref) + 1e-30).all(), (x, got)
    got = vector_math(f"exp{lanes}", x)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.exp(x.astype(np.float64))
        err = np.abs(got - ref)
    normal = (ref >= 1.2e-38) & (ref <= 3.4e38)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    assert (err <= 2e-7 * ref)[normal].all(), (x[normal], got[normal] / ref[normal] - 1)
    assert (got[x > 88.73] == np.inf).all() and (got[x < -87.34] <= 1.2e-38).all()


@settings(max_examples=200, deadline=None)
@given(xs=FLOATS, lanes=st.sampled_from([4, 8, 16]))
def test_vector_sigmoid_is_the_exact_function_rounded_at_every_float_and_0_below_minus_86(vector_math, xs, lanes):
    x = np.array(xs, np.float32)
    x[:3] = [-86.0, np.nextafter(np.float32(-86), np.float32(-100)), -np.inf]
    x[3:5] = np.array([0x7FC001FF, 0xFF8000A5], np.uint32).view(np.float32)   # NaNs with payloads
    got = vector_math(f"sigmoid{lanes}", x)
    with np.errstate(over="ignore"):
        ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert np.array_equal(np.isnan(got), np.isnan(x))
    kept = ~np.isnan(x) & (x >= -86)
    assert kept.sum() >= 1
    assert (np.abs(got - ref)[kept] <= 3e-7 * ref[kept]).all(), (x[kept], got[kept] / ref[kept] - 1)
    assert (got[x < -86] == 0).all() and got[1] == 0 and got[2] == 0 and got[0] > 0


@pytest.mark.parametrize("act, call", [("gelu", "erf"), ("gelu_tanh", "tanh")])
def test_a_gelu_epilogue_runs_vectorised_and_computes_the_reference(tmp_cache, act, call):
    from tuner.build import build_op
    from tuner.ops import resolve
    from tuner.target import parse_target
    from tuner.task import Task
    wl = resolve(f"dense:N=8,C=32,K=64,bias=1,act={act}", None)
    target = parse_target("cpu -threads=1")
    assert f"tuner_{call}{target.lanes}(" in Task(wl, target).default_candidate().source
    arrays = wl.random_inputs(seed=3)
    np.testing.assert_allclose(build_op(wl, target=target, use_shipped=False, quiet=True)(*arrays),
                               wl.reference(arrays), rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [[2, 3, 16, 32], [5, 7], [3, 13], [2, 2, 197], [64, 197]])
def test_a_softmax_runs_its_exp_vectorised_with_a_tail_and_its_rows_in_parallel_and_computes_what_onnxruntime_computes(
        tmp_path, tmp_cache, shape, threads):
    from tuner.target import parse_target
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    path = tmp_path / "s.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = compile_model(str(path), target=f"cpu -threads={threads}", use_shipped=False)
    x = (np.random.default_rng(0).standard_normal(shape) * 4).astype(np.float32)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)
    m.save(str(tmp_path / "built"))
    from tuner.codegen.c import PRELUDE
    source = (tmp_path / "built" / "model.c").read_text()
    assert PRELUDE in source
    vectorised = "tuner_exp" in source.replace(PRELUDE, "")
    # rows in parallel where there is enough to share (a few thousand elements; PARALLEL_MIN_WORK)
    assert ("omp parallel for" in source.replace(PRELUDE, "")) == (threads > 1 and np.prod(shape) > 2048)
    assert vectorised == ((shape[-1] % 4 == 0 or shape[-1] >= 8) and parse_target("cpu").lanes >= 4)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_in_either_form_compiles_to_what_onnxruntime_computes(tmp_path, tmp_cache, approximate):
    shape = [2, 4, 24]
    g = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], "gelu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    assert [s.summary for s in m.steps] == ["gelu" if approximate == "none" else "gelu_tanh"]
    x = (np.random.default_rng(2).standard_normal(shape) * 3).astype(np.float32)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)


def _one_thread(isa: str):
    """A 1-thread CPU target of `isa`, or of AVX2 where this host lacks AVX-512."""
    from tuner.target import host_isa, parse_target
    return parse_target(f"cpu -isa={isa if host_isa() == 'avx512' else 'avx2'} -threads=1", check_host=False)


def _tail_code(src: str, n: int, width: int, tail: int) -> None:
    """The remainder after whole vectors of `width` runs as tail_widths says: a vector of each
    narrower width, then a scalar loop over the lanes left only."""
    import re
    from tuner.codegen.c import PRELUDE
    from tuner.schedule.ir import tail_widths
    narrower, left = tail_widths(tail, width)
    body = src.replace(PRELUDE, "")
    for w in (8, 4):
        if w < width:
            assert bool(re.search(rf"\(f32x{w}\*\)|__acc_w{w} ", body)) == (w in narrower), (w, narrower)
    scalar = [(int(a), int(b)) for a, b in re.findall(r"for \(int \w+ = (\d+); \w+ < (\d+); ", body) if int(a) > 0]
    assert scalar == ([(n - left, n)] if left else []), (scalar, left)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 3), n=st.one_of(st.integers(1, 45), st.integers(46, 300)), kind=st.sampled_from(["sum", "max"]),
       specials=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from([np.nan, np.inf, -np.inf])), max_size=2),
       seed=st.integers(0, 1000), isa=st.sampled_from(["avx2", "avx512"]))
def test_a_vectorised_reduction_loop_computes_the_sum_and_max_of_every_row_nan_and_infinity_included(
        rows, n, kind, specials, seed, isa):
    """A reduction loop annotated `vectorize` (softmax's and layer_norm's innermost loop) keeps a
    vector of partial results over whole vectors (four independent ones from 8 vectors on),
    combines the lanes and adds the remainder (a vector of 8, one of 4, the lanes left one by one);
    any length, any NaN or infinity where the row has one."""
    from tuner.codegen.c import generate_c
    from tuner.measure.builder import build_batch
    from tuner.schedule.ir import vector_split
    from tuner.schedule.lower import lower
    from tuner.schedule.schedule import replay
    from tuner.te.tensor import compute, max_reduce, placeholder, reduce_axis, sum_reduce
    from tuner.toolchain.library import open_library, pointer_array
    target = _one_thread(isa)
    x = placeholder((rows, n), "x")
    r = reduce_axis(n, "r")
    fold = sum_reduce if kind == "sum" else max_reduce
    y = compute((rows,), lambda i: fold(x[i, r.var], [r]), "y", tag="reduction", inputs=[x])
    src, _ = generate_c(lower(replay([x], y, [["annotate", "y", "r", "vectorize"]]), "f"), target.lanes, 1)
    assert ("__acc" in src) == (n % 4 == 0 or n >= 8)         # vectorised whenever vector_split allows
    width, tail = vector_split(n, target.lanes)
    assert ("__acc3" in src) == (width > 0 and (n - tail) // width >= 8)
    if width:
        _tail_code(src, n, width, tail)
    built = build_batch([("f", src)], target, jobs=1)[0]
    assert not built.error, built.error
    xs = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32) * 10
    for pos, v in specials:
        xs.flat[pos % xs.size] = v
    out = np.empty(rows, np.float32)
    assert open_library(built.lib).tuner_run(built.index, pointer_array([xs, out])) == 0
    with np.errstate(invalid="ignore", over="ignore"):
        want = xs.astype(np.float64).sum(axis=1) if kind == "sum" else xs.max(axis=1)
    np.testing.assert_allclose(out, want.astype(np.float32), rtol=1e-5, atol=1e-4 * np.sqrt(n) * 10)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 3), n=st.integers(8, 300), isa=st.sampled_from(["avx2", "avx512"]), seed=st.integers(0, 1000))
def test_a_vectorised_elementwise_loop_runs_its_remainder_as_narrower_vectors_and_computes_the_reference(rows, n, isa, seed):
    """exp(x) * 2 over rows of any length: whole vectors, then a vector of 8 and one of 4 where they
    fit, then the lanes left one by one (softmax's rows of 197: 12 vectors, one of 4 and one lane;
    the five lanes called the C library's expf one by one before)."""
    from tuner.codegen.c import generate_c
    from tuner.measure.builder import build_batch
    from tuner.schedule.ir import vector_split
    from tuner.schedule.lower import lower
    from tuner.schedule.schedule import replay
    from tuner.te.expr import Call, Const
    from tuner.te.tensor import compute, placeholder
    from tuner.toolchain.library import open_library, pointer_array
    target = _one_thread(isa)
    x = placeholder((rows, n), "x")
    y = compute((rows, n), lambda i, j: Call("exp", (x[i, j],)) * Const(2.0), "y", tag="elemwise", inputs=[x])
    src, _ = generate_c(lower(replay([x], y, [["annotate", "y", "i1", "vectorize"]]), "f"), target.lanes, 1)
    width, tail = vector_split(n, target.lanes)
    assert width and f"(f32x{width}*)" in src
    _tail_code(src, n, width, tail)
    built = build_batch([("f", src)], target, jobs=1)[0]
    assert not built.error, built.error
    xs = (np.random.default_rng(seed).standard_normal((rows, n)) * 5).astype(np.float32)
    out = np.empty((rows, n), np.float32)
    assert open_library(built.lib).tuner_run(built.index, pointer_array([xs, out])) == 0
    np.testing.assert_allclose(out, np.exp(xs.astype(np.float64)) * 2, rtol=2e-6)


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=3), n=st.integers(1, 40),
       op=st.sampled_from(["softmax", "layer_norm"]), threads=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_a_softmax_or_layer_norm_computed_row_by_row_keeps_no_whole_tensor_and_computes_what_numpy_computes(
        lead, n, op, threads, seed):
    """The generic kernel of a row-wise reduction group computes every stage at the output's row
    loop (a stage read there by the output and by stages computed at the same loop after it), so
    no intermediate tensor is allocated whole; a cheap element-wise stage before it (a scale) is
    inlined into its readers, with no row buffer; any shape, one thread or several."""
    from tuner.compiler.compile_model import _generic_kernel
    from tuner.measure.builder import build_batch
    from tuner.ops.reduce import layer_norm, softmax
    from tuner.target import parse_target
    from tuner.te.expr import Const
    from tuner.te.tensor import compute, placeholder
    from tuner.toolchain.library import open_library, pointer_array
    target = parse_target(f"cpu -threads={threads}")
    shape = (*lead, n)
    x = placeholder(shape, "in0")
    pre = compute(shape, lambda *i: x[i] * Const(0.5), "pre", tag="elemwise", inputs=[x])
    ins = [x] if op == "softmax" else [x, placeholder((n,), "in1"), placeholder((n,), "in2")]
    y = softmax(pre, len(shape) - 1, "s0") if op == "softmax" else layer_norm(pre, ins[1], ins[2], len(shape) - 1, 1e-5, "s0")
    steps, src, omp, _ = _generic_kernel((ins, y), target, "f")
    assert any(s[0] == "compute_at" for s in steps) and "aligned_alloc" not in src
    assert ["compute_inline", "pre"] in steps and "pre[" not in src
    built = build_batch([("f", src)], target, openmp=omp, jobs=1)[0]
    assert not built.error, built.error
    rng = np.random.default_rng(seed)
    arrays = [(rng.standard_normal(t.shape) * 4).astype(np.float32) for t in ins]
    out = np.empty(shape, np.float32)
    assert open_library(built.lib).tuner_run(built.index, pointer_array(arrays + [out])) == 0
    a = arrays[0].astype(np.float64) * 0.5
    if op == "softmax":
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
        bound = 0.0
    else:
        scale = np.sqrt(a.var(-1, keepdims=True) + 1e-5)
        want = (a - a.mean(-1, keepdims=True)) / scale * arrays[1] + arrays[2]
        # x - mean rounds at float32's ulp of |x|, and a row of nearly equal values divides that by
        # little more than sqrt(eps) (two values 0.002 apart: 6e-4 of the output), not a kernel's error
        bound = 4 * np.finfo(np.float32).eps * np.abs(a).max(-1, keepdims=True) / scale * np.abs(arrays[1])
    assert (np.abs(out - want) <= 1e-5 + 1e-4 * np.abs(want) + bound).all(), np.abs(out - want).max()


def test_a_stage_computed_at_a_loop_must_be_read_only_there_and_a_row_group_never_recomputes_a_column_reduction():
    """compute_at refuses a stage that a stage at the root still reads; a group whose row-by-row
    schedule would recompute a column mean for every row is computed stage by stage instead."""
    from tuner.compiler.compile_model import _generic_kernel
    from tuner.ops.reduce import reduce_mean, softmax
    from tuner.schedule.lower import lower
    from tuner.schedule.schedule import ScheduleError, replay
    from tuner.target import parse_target
    from tuner.te.tensor import compute, placeholder
    x = placeholder((6, 10), "x")
    y = softmax(x, 1, "sm")
    with pytest.raises(ScheduleError, match="compute_at needs its readers"):
        lower(replay([x], y, [["compute_at", "sm_exp", "sm_sum", "sm_s0"]]))
    col = reduce_mean(x, [0], keepdims=True, name="colmean")
    centred = compute((6, 10), lambda i, j: x[i, j] - col[0, j], "centred", tag="elemwise", inputs=[x, col])
    steps, _, _, _ = _generic_kernel(([x], softmax(centred, 1, "sm2")), parse_target("cpu -threads=1"), "f")
    assert steps and not any(s[0] == "compute_at" for s in steps)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [197, 13, 7])
def test_an_elementwise_kernel_whose_last_axis_no_vector_divides_runs_vectorised_with_a_tail(
        tmp_path, tmp_cache, n, threads):
    """ViT's 197 tokens: the injective sketch vectorises the whole innermost axis (vectors, then the
    remainder as narrower vectors and lanes) instead of one element per iteration of a loop fused
    with the others."""
    from tuner.codegen.c import PRELUDE
    from tuner.schedule.ir import vector_split
    from tuner.target import parse_target
    shape = [2, 3, n]
    g = helper.make_graph([helper.make_node("Div", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "div",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, shape)],
                          [numpy_helper.from_array(np.array(0.125, np.float32), "s")])
    path = tmp_path / "d.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = compile_model(str(path), target=f"cpu -threads={threads}", use_shipped=False)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-6)
    m.save(str(tmp_path / "built"))
    source = (tmp_path / "built" / "model.c").read_text().replace(PRELUDE, "")
    lanes = parse_target("cpu").lanes
    assert ("__chunk" in source) == (vector_split(n, lanes)[0] > 0)
    assert "% " + str(n) not in source           # no division and remainder per element


def test_an_elementwise_kernel_over_half_a_million_odd_columns_compiles_and_computes_what_numpy_computes(tmp_path, tmp_cache):
    """A whole innermost axis vectorised is a loop of vector chunks unrolled a little, not one
    unrolled body per chunk (GCC refuses an unroll pragma of 65535 or more)."""
    n = 524_309
    g = helper.make_graph([helper.make_node("Div", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "div",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, n])],
                          [numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    path = tmp_path / "d.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    np.testing.assert_allclose(m.run(x)[0], np.maximum(x / 0.5, 0), rtol=1e-6)


def test_silu_as_torch_exports_it_runs_in_the_epilogue_of_the_conv_before_it_and_computes_what_onnxruntime_computes(
        tmp_path, tmp_cache):
    torch = pytest.importorskip("torch", reason="torch is not installed (the [bench] extra)")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.SiLU(),
                              torch.nn.Conv2d(16, 24, 1), torch.nn.SiLU()).eval()
    path = str(tmp_path / "silu.onnx")
    torch.onnx.export(net, (torch.randn(1, 3, 12, 12),), path, input_names=["input"], dynamo=False)
    m = compile_model(path, target="cpu -threads=1", use_shipped=False)
    assert [s.summary.split(" ")[0] for s in m.steps if "silu" in s.summary] == ["conv2d", "conv2d"]
    assert not any("sigmoid" in s.summary or s.summary == "mul" for s in m.steps), [s.summary for s in m.steps]
    x = (np.random.default_rng(0).standard_normal((1, 3, 12, 12)) * 3).astype(np.float32)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["x*sigmoid(x)", "sigmoid(x)*x", "sigmoid(x)*y"])
def test_a_mul_by_a_sigmoid_is_silu_only_of_the_sigmoids_own_input(tmp_path, tmp_cache, order):
    """x * sigmoid(x) in either order becomes one silu node (a vectorised kernel); sigmoid(x) * y stays
    a sigmoid and a mul (a gate, as squeeze-excitation's)."""
    a, b = {"x*sigmoid(x)": ("x", "s"), "sigmoid(x)*x": ("s", "x"), "sigmoid(x)*y": ("s", "y")}[order]
    shape = [2, 3, 40]
    g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", [a, b], ["z"])], "silu",
                          [helper.make_tensor_value_info(v, TensorProto.FLOAT, shape) for v in ("x", "y")],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, shape)])
    path = tmp_path / "s.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    from tuner.graph.passes import optimize
    fused = optimize(load_onnx(path), passes=["FuseTransformerOps"])
    ops = sorted(n.op for n in fused.nodes)
    rng = np.random.default_rng(4)
    x, y = ((rng.standard_normal(shape) * 30).astype(np.float32) for _ in range(2))
    x[0, 0, :4] = [np.nan, np.inf, -np.inf, -100.0]
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    with np.errstate(over="ignore", invalid="ignore"):     # exact (ONNX Runtime's sigmoid is 0 below -18); -inf: NaN
        want = 1 / (1 + np.exp(-x.astype(np.float64))) * (y if order == "sigmoid(x)*y" else x)
    np.testing.assert_allclose(m.run(x, y)[0], want, rtol=1e-5, atol=1e-6)
    with np.errstate(over="ignore", invalid="ignore"):          # the import's nodes and silu's own reference
        for graph in (load_onnx(path), fused):
            np.testing.assert_allclose(interp.run(graph, x, y)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.run(x, y)[0], ort_run(path, {"x": x, "y": y})[0], rtol=1e-3, atol=1e-5)
    assert ops == (["mul", "sigmoid"] if order == "sigmoid(x)*y" else ["silu"])


@pytest.mark.parametrize("op", ["Sigmoid", "Erf", "Tanh"])
@pytest.mark.parametrize("cols", [16, 32, 40])
def test_a_math_call_whose_argument_is_the_same_in_every_lane_compiles_and_computes_what_onnxruntime_computes(
        tmp_path, tmp_cache, op, cols):
    """y = reshape(op(a)[:, None] * b): the vector loop over y's flat index reads a at index // cols, the
    same in all of a vector's lanes (WavLM's gated position bias: the C did not compile)."""
    rows = 6
    nodes = [helper.make_node(op, ["a"], ["s"]), helper.make_node("Unsqueeze", ["s", "ax"], ["u"]),
             helper.make_node("Mul", ["u", "b"], ["m"]), helper.make_node("Reshape", ["m", "flat"], ["y"])]
    g = helper.make_graph(nodes, "lanes", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [rows]),
                                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [rows, cols])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows * cols])],
                          [numpy_helper.from_array(np.array([1], np.int64), "ax"),
                           numpy_helper.from_array(np.array([rows * cols], np.int64), "flat")])
    path = tmp_path / "lanes.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rng = np.random.default_rng(cols)
    feeds = {"a": rng.standard_normal(rows).astype(np.float32), "b": rng.standard_normal((rows, cols)).astype(np.float32)}
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(**feeds)[0], ort_run(path, feeds)[0], rtol=1e-5, atol=1e-6)
