"""In-place steps: a kernel that schedule.inplace lets write over its input computes what it
computes into a buffer of its own, under every schedule; the memory plan gives the two one range."""
import dataclasses
import random

import numpy as np
import pytest
from conftest import TARGET1
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tuner.codegen.c import generate_c
from tuner.compiler.memory import Lifetime, peak_live_bytes, plan
from tuner.measure.builder import build_batch
from tuner.ops.reduce import cumsum, layer_norm, softmax
from tuner.schedule.inplace import writes_over
from tuner.schedule.lower import lower
from tuner.schedule.schedule import ScheduleError, replay
from tuner.te.expr import Call, Const
from tuner.te.tensor import compute, placeholder
from tuner.toolchain.library import open_library, pointer_array


def _softmax(shape):
    x = placeholder(shape, "x")
    return [x], softmax(x, len(shape) - 1, "sm")


def _layer_norm(shape):
    x, g, b = placeholder(shape, "x"), placeholder(shape[-1:], "g"), placeholder(shape[-1:], "b")
    return [x, g, b], layer_norm(x, g, b, len(shape) - 1, 1e-5, "ln")


def _gelu_like(shape):
    x = placeholder(shape, "x")
    t = compute(shape, lambda *i: Call("tanh", (x[i],)), "t", inputs=[x])
    return [x], compute(shape, lambda *i: x[i] * (Const(1.0) + t[i]), "y", inputs=[x, t])


def _cumsum(shape):
    x = placeholder(shape, "x")
    return [x], cumsum(x, len(shape) - 1, False, False, "cs")


def _reversed(shape):
    x = placeholder(shape, "x")
    last = shape[-1] - 1
    return [x], compute(shape, lambda *i: x[i[:-1] + (Const(last) - i[-1],)] * Const(2.0), "rev", inputs=[x])


def _transposed(shape):
    x = placeholder(shape, "x")
    return [x], compute(shape[::-1], lambda *i: x[tuple(reversed(i))] + Const(1.0), "tr", inputs=[x])


def _minus_column_mean(shape):      # a reduction over the rows: each output reads a whole column
    from tuner.te.tensor import reduce_axis, sum_reduce
    x = placeholder(shape, "x")
    r = reduce_axis(shape[0], "r")
    m = compute((1, *shape[1:]), lambda *i: sum_reduce(x[(r.var, *i[1:])], [r]), "colsum", tag="reduction", inputs=[x])
    return [x], compute(shape, lambda *i: x[i] - m[(Const(0), *i[1:])], "centred", inputs=[x, m])


DAGS = {"softmax": _softmax, "layer_norm": _layer_norm, "gelu": _gelu_like, "cumsum": _cumsum,
        "reversed": _reversed, "transposed": _transposed, "column_mean": _minus_column_mean}


def _random_steps(dag, rng: random.Random) -> list:
    """A random schedule: the output's loops split, reordered, parallel and vectorised at random;
    every other stage computed at root, inlined or at a random loop of the output."""
    inputs, out = dag
    steps, leaves = [], list(replay(inputs, out, []).output.leaves)
    last, extent = leaves[-1], out.shape[-1]
    if extent > 1 and rng.random() < 0.6:
        steps.append(["split", out.name, last, [rng.randint(1, extent)]])
        leaves[-1:] = [f"{last}.0", f"{last}.1"]
    if rng.random() < 0.3 and len(leaves) > 1:
        k = rng.randrange(len(leaves) - 1)
        leaves[k], leaves[k + 1] = leaves[k + 1], leaves[k]
        steps.append(["reorder", out.name, list(leaves)])
    if rng.random() < 0.5:
        steps.append(["annotate", out.name, leaves[0], "parallel"])
    if rng.random() < 0.5:
        steps.append(["annotate", out.name, leaves[-1], "vectorize"])
    for stage in replay(inputs, out, []).stages:
        kind = rng.choice(["root", "inline", "at"])
        if stage.name == out.name or kind == "root":
            continue
        if kind == "inline" and not stage.op.is_reduction:
            steps.append(["compute_inline", stage.name])
        elif kind == "at":
            steps.append(["compute_at", stage.name, out.name, rng.choice(leaves)])
    return steps


def _run_both(fn, dag, data: list) -> tuple:
    """The kernel's output into a buffer of its own, and written over its first input."""
    name = fn.args[-1].name
    plain, _ = generate_c(fn, TARGET1.lanes, TARGET1.threads)
    fn_over = dataclasses.replace(fn, name=fn.name + "_over")
    over, _ = generate_c(fn_over, TARGET1.lanes, TARGET1.threads, frozenset((fn.args[0].name, name)))
    built = build_batch([(fn.name, plain), (fn_over.name, over)], TARGET1, openmp=True, jobs=1)
    assert not any(b.error for b in built), [b.error for b in built]
    out_shape = dag[1].shape
    apart = np.full(out_shape, np.nan, np.float32)
    args = [np.ascontiguousarray(a) for a in data]
    assert open_library(built[0].lib).tuner_run(built[0].index, pointer_array(args + [apart])) == 0
    shared = [a.copy() for a in args]
    alias = shared[0].reshape(out_shape)
    assert open_library(built[1].lib).tuner_run(built[1].index, pointer_array(shared + [alias])) == 0
    return apart, alias


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(DAGS)), rows=st.integers(1, 5), cols=st.integers(1, 37), seed=st.integers(0, 10**6))
def test_a_kernel_allowed_to_write_over_its_input_computes_what_it_computes_apart(kind, rows, cols, seed):
    dag = DAGS[kind]((rows, cols))
    try:
        fn = lower(replay(*dag, _random_steps(dag, random.Random(seed))))
    except (ScheduleError, ValueError):
        assume(False)
    assume(writes_over(fn, "x"))
    rng = np.random.default_rng(seed)
    data = [rng.standard_normal(t.shape).astype(np.float32) for t in dag[0]]
    apart, over = _run_both(fn, dag, data)
    np.testing.assert_allclose(over, apart, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind, allowed", [("softmax", True), ("layer_norm", True), ("gelu", True),
                                           ("cumsum", False), ("reversed", False), ("transposed", False)])
def test_rows_and_elementwise_kernels_write_over_their_input_and_scans_and_permutations_do_not(kind, allowed):
    dag = DAGS[kind]((6, 40))
    fn = lower(replay(*dag, []))
    assert writes_over(fn, "x") is allowed


def test_a_kernel_refused_would_have_computed_garbage_over_its_input():
    """The refusals are not only caution: a scan written over its input reads its own output."""
    dag = DAGS["cumsum"]((3, 20))
    fn = lower(replay(*dag, []))
    assert not writes_over(fn, "x")
    data = [np.random.default_rng(0).standard_normal((3, 20)).astype(np.float32)]
    apart, over = _run_both(fn, dag, data)
    assert not np.allclose(over, apart)


def test_a_column_mean_recomputed_inside_the_rows_loop_is_refused():
    dag = DAGS["column_mean"]((8, 16))
    whole = writes_over(lower(replay(*dag, [])), "x")   # the sums first, whole: then the rows may write over it
    inner = lower(replay(*dag, [["compute_at", "colsum", dag[1].name, dag[1].op.axes[1].name]]))
    assert whole and not writes_over(inner, "x")
    data = [np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)]
    apart, over = _run_both(inner, dag, data)
    assert not np.allclose(over, apart)


def test_an_output_that_takes_its_inputs_memory_shares_one_range_with_it_in_the_plan():
    tensors = [Lifetime("a", 4096, 0, 1), Lifetime("b", 4096, 1, 2), Lifetime("c", 4096, 2, 3),
               Lifetime("d", 1024, 0, 3)]
    offsets, arena = plan(tensors, {"b": "a", "c": "b"})
    assert offsets["a"] == offsets["b"] == offsets["c"]
    assert offsets["d"] >= offsets["a"] + 4096 or offsets["d"] + 1024 <= offsets["a"]
    assert arena == 4096 + 1024 == peak_live_bytes(tensors, {"b": "a", "c": "b"})
    apart, arena_apart = plan(tensors)
    assert apart["b"] != apart["a"] and arena_apart > arena


def _attention(path, heads=3, seq=20, d=8):
    import onnx
    from onnx import TensorProto, helper
    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"])]
    g = helper.make_graph(nodes, "attention", [info("q", [heads, seq, d]), info("k", [heads, d, seq]),
                                               info("v", [heads, seq, d])], [info("o", [heads, seq, d])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in
            (("q", (heads, seq, d)), ("k", (heads, d, seq)), ("v", (heads, seq, d)))}


def test_a_softmax_between_two_matmuls_writes_over_its_scores_in_the_compiled_model(tmp_path):
    from conftest import ort_run

    from tuner.compiler import compile_model
    from tuner.runtime.model import load
    feeds = _attention(tmp_path / "att.onnx")
    m = compile_model(str(tmp_path / "att.onnx"), threads=1)
    [sm] = [s for s in m.steps if s.summary == "softmax"]
    assert sm.inplace == 0 and sm.args[0] == sm.args[-1] and sm.args[0].kind == "arena"
    assert m.meta["arena_bytes"] < m.meta["intermediate_bytes"]
    assert "1 step writes its output over an input read by no later step (softmax)" in m.report()
    np.testing.assert_allclose(m.run(**feeds)[0], ort_run(tmp_path / "att.onnx", feeds)[0], rtol=1e-4, atol=1e-5)
    assert all(t > 0 for t in m.time(list(feeds.values()), step=sm.index, repeat=2, min_repeat_ms=1))
    loaded = load(m.save(tmp_path / "art"))
    assert [s.inplace for s in loaded.steps] == [s.inplace for s in m.steps]
    np.testing.assert_allclose(loaded.run(**feeds)[0], m.run(**feeds)[0])


def _hand(shape, body, temps=()):
    from tuner.schedule import ir
    x, o = ir.Buffer("x", shape, "arg"), ir.Buffer("o", shape, "arg")
    return ir.Func("hand", [x, o], list(temps), body, {"x": x, "o": o, **{t.name: t for t in temps}})


def _hand_kernels():
    """Loop nests lowering does not write today, each of which reads an element of the input after
    writing it when run in place (a review's counterexamples to a first version of the analysis)."""
    from tuner.schedule import ir
    from tuner.te.expr import Add, Cmp, Load, Max, Mul, Var
    i = Var("i")
    neg = Mul(Const(-1.0), Load("x", (i,)))
    t = ir.Buffer("t", (1,), "global")
    return {
        "a test read on the way down": _hand((6,), ir.For("i", 6, ir.IfThen(
            Cmp("<", Const(0.0), Load("x", (Const(0),))), ir.Store("o", (i,), neg)))),
        "a test read between statements": _hand((3, 2), ir.For("i", 3, ir.Seq([
            ir.Store("o", (i, Const(0)), Mul(Const(-1.0), Load("x", (i, Const(0))))),
            ir.IfThen(Cmp("<", Const(0.0), Load("x", (i, Const(0)))), ir.Store("o", (i, Const(1)), Const(1.0))),
            ir.IfThen(Cmp("<", Load("x", (i, Const(0))), Const(0.0)), ir.Store("o", (i, Const(1)), Const(7.0)))]))),
        "a loop no access follows": _hand((6,), ir.For("i", 6, ir.For("r", 2, ir.Store(
            "o", (i,), Mul(Const(2.0), Load("x", (i,))))))),
        "an unfolded constant index": _hand((6,), ir.Seq([
            ir.For("i", 6, ir.Store("o", (i,), Mul(Const(2.0), Load("x", (i,))))),
            ir.Store("t", (Const(0),), Load("x", (Add(Max(Const(13), Const(3)), Const(-10)),))),
            ir.For("i", 6, ir.Store("o", (i,), Add(Load("o", (i,)), Load("t", (Const(0),)))))]), [t]),
    }


@pytest.mark.parametrize("case", sorted(_hand_kernels()))
def test_a_nest_that_reads_what_it_wrote_over_is_refused(case):
    from types import SimpleNamespace
    fn = _hand_kernels()[case]
    shape = fn.args[0].shape
    assert not writes_over(fn, "x")
    data = [np.abs(np.random.default_rng(0).standard_normal(shape)).astype(np.float32) + 0.5]
    apart, over = _run_both(fn, ([SimpleNamespace(shape=shape)], SimpleNamespace(shape=shape)), data)
    assert not np.allclose(over, apart)


def test_a_dynamic_softmax_writes_over_its_scores_at_every_length(tmp_path):
    """Checked at the bounds: a run's loops cover a prefix of each extent, a subset of what was proven."""
    from conftest import ort_run
    from test_dynamic import _attention_onnx, _compile
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    model = _compile(path, "x=1x[1..24]x16", threads=2)
    assert [(s.summary, s.dynamic) for s in model.steps if s.inplace is not None] == [("mul + softmax", True)]
    for n in (1, 7, 24):
        x = np.random.default_rng(n).standard_normal((1, n, 16)).astype(np.float32)
        np.testing.assert_allclose(model.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4, err_msg=f"length {n}")


def test_a_group_writes_over_the_first_dying_input_it_may_when_the_first_it_could_may_not_be():
    from tuner.compiler.compile_model import _generic_kernel
    a, b = placeholder((2, 8, 8), "in0"), placeholder((2, 8, 8), "in1")
    y = compute((2, 8, 8), lambda i, j, k: a[i, k, j] - b[i, j, k], "y", inputs=[a, b])   # a read transposed
    assert _generic_kernel(([a, b], y), TARGET1, "f", None, (0,))[3] is None
    assert _generic_kernel(([a, b], y), TARGET1, "f", None, (0, 1))[3] == 1


def test_a_step_is_timed_on_what_the_steps_before_it_gave_it(tmp_path):
    """time(step=i) runs the steps before i, not the whole model: an in-place softmax is timed on its
    scores, not on probabilities the whole run left in their place."""
    from tuner.compiler import compile_model
    feeds = _attention(tmp_path / "att.onnx", heads=2, seq=8, d=4)
    m = compile_model(str(tmp_path / "att.onnx"), threads=1)
    assert hasattr(m._lib, "tuner_model_prefix")
    [sm] = [s for s in m.steps if s.inplace is not None]
    from tuner.runtime.model import _ffi
    from tuner.toolchain.library import aligned_empty
    arena, ffi = aligned_empty((m.arena_bytes // 4 + 16,)), _ffi()
    ins = [np.ascontiguousarray(feeds[s["name"]]) for s in m.meta["inputs"]]
    outs = [np.empty(s["shape"], np.float32) for s in m.meta["outputs"]]
    ptrs = lambda arrays: ffi.new("float*[]", [ffi.cast("float*", a.ctypes.data) for a in arrays])  # noqa: E731
    weights = ffi.cast("char*", m._weights.ctypes.data)
    base = ffi.cast("char*", arena.ctypes.data)
    assert m._lib.tuner_model_prefix(sm.index, ptrs(ins), ptrs(outs), base, weights) == 0
    off = sm.args[0].where // 4
    scores = np.einsum("hsd,hdt->hst", feeds["q"], feeds["k"]).ravel()
    np.testing.assert_allclose(arena[off:off + scores.size], scores, rtol=1e-5, atol=1e-5)
