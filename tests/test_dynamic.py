"""Dynamic kernels (issue 37): buffers laid out at the symbols' bounds, loops that stop at the run's
extents. A schedule tuned at one value of a symbol, replayed on the kernel for its range, computes
what the static workload at any value in the range computes, whatever the padding holds."""
from __future__ import annotations

import dataclasses
import random
import warnings
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import TARGET1
from tuner.errors import UserError
from tuner.measure.builder import build_batch
from tuner.measure.worker import check_output
from tuner.ops import make
from tuner.task import Task
from tuner.te.dynamic import DynamicError, Symbol, symbol_var
from tuner.te.expr import Var, walk
from tuner.toolchain.library import open_library, pointer_array

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def dynamic_kernel(op: str, fixed: dict, symbolic: dict, symbols: tuple, bucket: dict, seed: int | None):
    """(bound task, its dims, the built library and index) of `op` whose parameters `symbolic`
    (name -> expression of the symbols) vary, scheduled as sampled (or by default, seed None) for
    the workload at the symbols' values `bucket`."""
    at = {symbol_var(k).name: s.hi for k, s in enumerate(symbols)}
    from tuner.te.dynamic import evaluate
    bound = make(op, {**fixed, **{p: evaluate(e, at) for p, e in symbolic.items()}})
    tuned = make(op, {**fixed, **{p: evaluate(e, bucket) for p, e in symbolic.items()}})
    small = Task(tuned, TARGET1)
    dec = small.space.default() if seed is None else small.space.sample(random.Random(seed))
    task = Task(bound, TARGET1)
    dims = task.dynamic_dims(symbolic, symbols)
    cand = task.candidate(small.space.steps(dec), func_name="dyn", dims=dims)
    [built] = build_batch([(cand.func_name, cand.source)], TARGET1, openmp=cand.openmp, jobs=1)
    assert not built.error, built.error
    return task, dims, built, cand


def run_at(task, built, op: str, fixed: dict, symbolic: dict, values: dict):
    """(the kernel's output, the reference of the static workload at `values`, return code): the
    inputs in buffers of the bound shape whose padding is NaN."""
    from tuner.te.dynamic import evaluate
    wl = make(op, {**fixed, **{p: evaluate(e, values) for p, e in symbolic.items()}}, task.workload.layout)
    inputs = wl.random_inputs(seed=sum(values.values()))
    ref = wl.reference(inputs)
    bound_ins, bound_out = task.workload.build()
    bufs = []
    for a, t in zip(inputs, bound_ins):
        b = np.full(t.shape, np.nan, np.float32)
        b[tuple(slice(0, n) for n in a.shape)] = a
        bufs.append(b)
    out = np.full(bound_out.shape, np.nan, np.float32)
    dims = np.array([values[symbol_var(k).name] for k in range(len(values))], np.int32)
    rc = open_library(built.lib).tuner_run(built.index, pointer_array(bufs + [out, dims]))
    return out, ref, rc


def _check(task, built, op, fixed, symbolic, values):
    out, ref, rc = run_at(task, built, op, fixed, symbolic, values)
    assert rc == 0
    inside = tuple(slice(0, n) for n in ref.shape)
    problem = check_output(out[inside], ref, 1e-3, 1e-4)      # the inputs' padding (NaN) never enters it
    assert not problem, f"at {values}: {problem}"


@SETTINGS
@given(c=st.integers(3, 40), k=st.sampled_from([8, 16, 24]), hi=st.integers(2, 70), bucket=st.integers(1, 70),
       relu=st.booleans(), seed=st.integers(0, 10**6), data=st.data())
def test_sampled_dense_schedules_for_one_row_count_compute_every_row_count_in_the_range(c, k, hi, bucket, relu, seed,
                                                                                        data):
    bucket = min(bucket, hi)
    fixed = dict(C=c, K=k, bias=1, relu=int(relu))
    symbols = (Symbol("rows", 1, hi),)
    task, dims, built, _ = dynamic_kernel("dense", fixed, {"N": symbol_var(0)}, symbols, {"_dyn0": bucket}, seed)
    values = {1, hi, bucket, data.draw(st.integers(1, hi))}
    for n in sorted(values):
        _check(task, built, "dense", fixed, {"N": symbol_var(0)}, {"_dyn0": n})


@SETTINGS
@given(b=st.integers(1, 4), fixed_dim=st.integers(1, 20), hi=st.integers(2, 40), bucket=st.integers(1, 40),
       which=st.sampled_from(["MN", "MK", "K", "N"]), seed=st.integers(0, 10**6), data=st.data())
def test_sampled_batch_matmul_schedules_compute_every_length_in_the_range(b, fixed_dim, hi, bucket, which, seed, data):
    """Q.K^T (rows and columns the sequence), P.V (rows and the reduction), and each alone."""
    bucket = min(bucket, hi)
    fixed = {"B": b, **{d: fixed_dim for d in "MNK" if d not in which}}
    symbolic = {d: symbol_var(0) for d in which}
    symbols = (Symbol("seq", 1, hi),)
    task, _, built, _ = dynamic_kernel("batch_matmul", fixed, symbolic, symbols, {"_dyn0": bucket}, seed)
    for n in sorted({1, hi, data.draw(st.integers(1, hi))}):
        _check(task, built, "batch_matmul", fixed, symbolic, {"_dyn0": n})


def test_a_guarded_tails_start_is_computed_once_at_entry_not_in_every_unrolled_statement():
    """A reduction over the sequence in tiles of 13, its guarded tail unrolled: the tail's start (a
    floor division of the symbol) is one constant computed after the symbol is read, and every
    length in the range computes the reference (copied into each of the tail's 208 statements, GCC
    spent 25 s on this kernel)."""
    fixed, symbolic = {"B": 4, "M": 2, "N": 2}, {"K": symbol_var(0)}
    task, _, built, cand = dynamic_kernel("batch_matmul", fixed, symbolic, (Symbol("seq", 1, 30),), {"_dyn0": 13}, 27210)
    lines = cand.source.splitlines()
    entry = max(k for k, line in enumerate(lines) if line.startswith("  const int tuner_sym"))
    assert "tuner_floordiv(" in "\n".join(lines[:entry + 1])
    assert not any("tuner_floordiv(" in line or "/ 13" in line for line in lines[entry + 1:])
    for n in (1, 12, 13, 14, 29, 30):
        _check(task, built, "batch_matmul", fixed, symbolic, {"_dyn0": n})


def test_rows_that_are_a_product_of_two_symbols_run_to_their_product():
    """M = batch * sequence: the extent fitted is the product, and every pair in the box computes."""
    symbols = (Symbol("batch", 1, 3), Symbol("seq", 1, 9))
    symbolic = {"N": symbol_var(0) * symbol_var(1)}
    fixed = dict(C=12, K=16, bias=1)
    task, dims, built, _ = dynamic_kernel("dense", fixed, symbolic, symbols, {"_dyn0": 2, "_dyn1": 5}, seed=3)
    assert str(dims.tensor("dense")[0]) == str(symbol_var(0) * symbol_var(1))
    for b, s in ((1, 1), (3, 9), (2, 7), (3, 1)):
        _check(task, built, "dense", fixed, symbolic, {"_dyn0": b, "_dyn1": s})


def test_a_kernel_whose_symbols_cannot_vary_has_the_static_kernels_loops():
    task = Task(make("dense", dict(N=8, C=16, K=16)), TARGET1)
    steps = task.space.steps(task.space.default())
    dims = task.dynamic_dims({"N": symbol_var(0)}, (Symbol("rows", 8, 8),))
    assert not dims.tensors and not dims.reduce
    dynamic = task.candidate(steps, "f", dims=dims).source.splitlines()
    static = task.candidate(steps, "f").source.splitlines()
    header = [line for line in dynamic if "tuner_dims" in line or "_dyn0" in line]
    assert len(header) == 3 and [line for line in dynamic if line not in header] == static


def test_a_value_outside_the_declared_range_is_refused_by_the_kernel():
    fixed = dict(C=8, K=8)
    task, _, built, _ = dynamic_kernel("dense", fixed, {"N": symbol_var(0)}, (Symbol("rows", 2, 6),),
                                       {"_dyn0": 4}, None)
    lib = open_library(built.lib)
    bound_ins, bound_out = task.workload.build()
    bufs = [np.zeros(t.shape, np.float32) for t in bound_ins] + [np.zeros(bound_out.shape, np.float32)]
    for n, rc in ((1, -2), (2, 0), (6, 0), (7, -2)):
        assert lib.tuner_run(built.index, pointer_array(bufs + [np.array([n], np.int32)])) == rc


@pytest.mark.parametrize("op, params, lo, says", [
    ("conv2d", dict(C=4, K=4, W=8, R=3, S=3, stride=2), 3, "multilinear|whole steps.*a step of their total stride"),
    ("conv2d", dict(C=4, K=4, W=8, R=3, S=3), 1, "narrow the range"),                   # no 3x3 window in 2 rows
])
def test_kernels_whose_computation_is_not_a_bounded_loop_over_the_symbol_are_refused(op, params, lo, says):
    task = Task(make(op, {**params, "H": 16}), TARGET1)
    with pytest.raises(DynamicError, match=says):
        task.dynamic_dims({"H": symbol_var(0)}, (Symbol("h", lo, 16),))


@SETTINGS
@given(hi=st.integers(2, 9), wide=st.integers(1, 9), bucket=st.integers(1, 9), seed=st.one_of(st.none(), st.integers(0, 10**6)),
       data=st.data())
def test_a_mean_over_a_varying_height_and_width_divides_by_the_runs_count_not_the_bounds(hi, wide, bucket, seed, data):
    """Global average pooling's 1/(H*W), a float at each shape, is fitted as 1.0 / (float)(H*W)."""
    fixed, symbolic = dict(C=8), {"H": symbol_var(0), "W": symbol_var(1)}
    symbols = (Symbol("h", 1, hi), Symbol("w", 1, wide))
    task, dims, built, _ = dynamic_kernel("global_avg_pool2d", fixed, symbolic, symbols,
                                          {"_dyn0": min(bucket, hi), "_dyn1": wide}, seed)
    assert dims.bodies
    for h, w in {(1, 1), (hi, wide), (data.draw(st.integers(1, hi)), data.draw(st.integers(1, wide)))}:
        _check(task, built, "global_avg_pool2d", fixed, symbolic, {"_dyn0": h, "_dyn1": w})


@SETTINGS
@given(stride=st.sampled_from([1, 2, 4]), r=st.sampled_from([1, 3]), hi=st.integers(2, 6), bucket=st.integers(1, 6),
       seed=st.one_of(st.none(), st.integers(0, 10**6)), data=st.data())
def test_a_strided_convolution_over_a_height_in_steps_of_its_stride_computes_every_height_in_the_range(
        stride, r, hi, bucket, seed, data):
    """H = 4n (a range with a step): every strided extent is a multiple of n, so it fits."""
    fixed, symbolic = dict(C=4, K=8, W=6, R=r, S=r, pad=r // 2, stride=stride), {"H": 4 * symbol_var(0)}
    task, dims, built, _ = dynamic_kernel("conv2d", fixed, symbolic, (Symbol("h", 1, hi, step=4),),
                                          {"_dyn0": min(bucket, hi)}, seed)
    for n in sorted({1, hi, data.draw(st.integers(1, hi))}):
        _check(task, built, "conv2d", fixed, symbolic, {"_dyn0": n})


@SETTINGS
@given(hi=st.integers(3, 20), bucket=st.integers(1, 20), pad=st.integers(1, 2), seed=st.one_of(st.none(), st.integers(0, 10**6)),
       data=st.data())
def test_a_padded_convolution_over_a_varying_height_computes_every_height_with_its_border_at_the_runs_edge(
        hi, bucket, pad, seed, data):
    """The bottom pad border moves with the height: an integer in the formula, fitted as H + pad."""
    fixed, symbolic = dict(C=4, K=8, W=7, R=3, S=3, pad=pad), {"H": symbol_var(0)}
    task, dims, built, _ = dynamic_kernel("conv2d", fixed, symbolic, (Symbol("h", 1, hi),),
                                          {"_dyn0": min(bucket, hi)}, seed)
    assert any(isinstance(n, Var) and n.name == "_dyn0" for body in dims.bodies.values() for n in walk(body))
    for h in sorted({1, hi, data.draw(st.integers(1, hi))}):
        _check(task, built, "conv2d", fixed, symbolic, {"_dyn0": h})


def _pad_nest(test, limit, extent: int = 8):
    """for i < limit (at most `extent`), o < 2, r < 3: y[i, o, r] = test ? x[4i + 2o + r] : 0, a
    dynamic kernel's (symbol _dyn0 from 4 to 16)."""
    from tuner.schedule import ir
    from tuner.te.expr import Const, Load, Select
    row = Var("i") * 4 + Var("o") * 2 + Var("r")
    store = ir.Store("y", (Var("i"), Var("o"), Var("r")), Select(test(row), Load("x", (row,)), Const(0.0)))
    body = ir.For("i", extent, ir.For("o", 2, ir.For("r", 3, store, kind="unroll"), kind="unroll"), limit=limit)
    return ir.Func("k", [], [], body, symbols=(Symbol("h", 4, 16),))


def _selects(s):
    from tuner.schedule import ir
    from tuner.te.expr import Select
    return [n for x in ir.stmts(s) if isinstance(x, ir.Store) for n in walk(x.value) if isinstance(n, Select)]


def test_a_pad_test_that_the_tile_loop_never_reaches_at_any_value_is_settled_and_one_it_reaches_is_kept():
    """A 3x3 stride-2 conv padded by 1 over 2n rows never reads its bottom pad row (2n + 1) in its
    n // 2 whole tiles: the test against the run's extent is settled at every n; a row the last
    tile reaches at some n (2n) keeps its test."""
    from tuner.schedule.peel import settle_tests
    from tuner.te.expr import Cmp, Const, FloorDiv
    n = symbol_var(0)
    whole = FloorDiv(n, Const(2))
    assert not _selects(settle_tests(_pad_nest(lambda row: Cmp("<", row, n * 2 + Const(1)), whole)).body)
    assert len(_selects(settle_tests(_pad_nest(lambda row: Cmp("<", row, n * 2), whole)).body)) == 1
    assert not _selects(settle_tests(_pad_nest(lambda row: Cmp("<", row, n * 2), whole - Const(1))).body)


def test_a_loop_whose_selects_test_the_runs_extent_runs_its_first_iterations_without_the_test():
    """A Winograd input transform's tile loop over the run's tiles reads the bottom pad only in its
    last tile: it runs as a loop up to there without the test, then the rest with it."""
    from tuner.schedule import ir
    from tuner.schedule.peel import peel_guards
    from tuner.te.dynamic import evaluate
    from tuner.te.expr import Cmp, Const
    n = symbol_var(0)
    func = peel_guards(_pad_nest(lambda row: Cmp("<", row, n * 2 + Const(1)), n, 16))
    loops = [x for x in func.body.stmts if isinstance(x, ir.For)]
    assert len(loops) == 2 and not _selects(loops[0]) and _selects(loops[1])
    for k in range(4, 17):      # the first loop runs every tile whose rows 4i..4i+4 stay above row 2n + 1
        assert evaluate(loops[0].limit, {"_dyn0": k}) == (2 * k - 4) // 4 + 1
        assert evaluate(loops[0].limit, {"_dyn0": k}) + evaluate(loops[1].limit, {"_dyn0": k}) == k


def test_a_parallel_loops_border_tile_clear_of_the_runs_edge_runs_without_its_test():
    """Tiles of a parallel loop are not cut at the run's extent: the border version of an
    unswitched nest (a tile on the top row: `1 <= row` fails for some of its taps) is split again on
    the tests against the run's edge, so a top tile clear of the bottom (`row < 2n + 1` holds for
    all its taps) runs without them, and one that reaches it keeps them."""
    from tuner.schedule import ir
    from tuner.schedule.peel import unswitch
    from tuner.te.expr import And, Cmp, Const, Load, Select, free_vars
    n, row = symbol_var(0), Var("t") * 4 + Var("o") * 2 + Var("r")
    test = And(Cmp("<=", Const(1), row), Cmp("<", row, n * 2 + Const(1)))
    store = ir.Store("y", (Var("t"), Var("o"), Var("r")), Select(test, Load("x", (row,)), Const(0.0)))
    nest = ir.Unswitch(ir.For("o", 2, ir.For("r", 3, store, kind="unroll"), kind="unroll"))
    func = unswitch(ir.Func("k", [], [], ir.For("t", 8, nest, kind="parallel"), symbols=(Symbol("h", 4, 16),)))
    tests = [frozenset(c for c in free_vars(n.cond) if c.startswith("_dyn")) for n in _selects(func.body)]
    assert len(tests) == 2 and set(tests) == {frozenset(), frozenset({"_dyn0"})}, tests


def test_a_symbolic_parameter_must_take_the_workloads_value_at_the_bound():
    task = Task(make("dense", dict(N=8, C=16, K=16)), TARGET1)
    with pytest.raises(DynamicError, match="not its value at the symbols' bounds"):
        task.dynamic_dims({"N": symbol_var(0)}, (Symbol("rows", 1, 9),))
    with pytest.raises(DynamicError, match="no parameter"):
        task.dynamic_dims({"Q": symbol_var(0)}, (Symbol("rows", 1, 8),))


# ------------------------------------------------------------ whole models (compile_model(dynamic=...))

def _attention_onnx(path, dims: list, seed: int = 0, hidden: int = 16, heads: int = 2, divide_by_length=False):
    """Self-attention with a residual and LayerNorm, as exporters write it, over x [dims..., hidden]
    whose dims may be dim_params ("batch", "seq")."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    d = hidden // heads
    inits = [numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.3, n)
             for n in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(np.array([0, -1, heads, d], np.int64), "heads"),
              numpy_helper.from_array(np.array([0, -1, hidden], np.int64), "merged"),
              numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale"),
              numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
              numpy_helper.from_array(np.zeros(hidden, np.float32), "beta")]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]), n("MatMul", ["x", "wv"], ["v"]),
             n("Reshape", ["q", "heads"], ["qh"]), n("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
             n("Reshape", ["k", "heads"], ["kh"]), n("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
             n("Reshape", ["v", "heads"], ["vh"]), n("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
             n("MatMul", ["qt", "kt"], ["s"]), n("Mul", ["s", "scale"], ["ss"]), n("Softmax", ["ss"], ["p"], axis=-1),
             n("MatMul", ["p", "vt"], ["c"]), n("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
             n("Reshape", ["ct", "merged"], ["cm"]), n("Add", ["cm", "x"], ["r"])]
    last = "r"
    if divide_by_length:            # r / its length: a value of the symbol, not a bound
        nodes += [n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "one"], ["len"], axis=0),
                  n("Cast", ["len"], ["lenf"], to=TensorProto.FLOAT), n("Div", ["r", "lenf"], ["rd"])]
        inits.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
        last = "rd"
    nodes.append(n("LayerNormalization", [last, "gamma", "beta"], ["out"], axis=-1))
    g = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims + [hidden])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims + [hidden])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _compile(path, dynamic, threads=1):
    import importlib
    return importlib.import_module("tuner.compiler.compile_model").compile_model(str(path), threads=threads,
                                                                                  dynamic=dynamic)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(lengths=st.lists(st.integers(1, 24), min_size=1, max_size=3), threads=st.sampled_from([1, 2]))
def test_an_attention_block_compiled_once_for_a_range_of_lengths_computes_what_onnx_runtime_does_at_each(
        tmp_path_factory, lengths, threads):
    from conftest import ort_run
    path = _attention_onnx(tmp_path_factory.mktemp("att") / "att.onnx", [1, "seq"])
    model = _compile(path, "x=1x[1..24]x16", threads)
    assert model.symbols == [{"name": "seq", "lo": 1, "hi": 24}] and any(s.dynamic for s in model.steps)
    for n in sorted({1, 13, 24, *lengths}):
        x = np.random.default_rng(n).standard_normal((1, n, 16)).astype(np.float32)
        [got], [want] = model.run(x), ort_run(path, x)
        assert got.shape == (1, n, 16)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"length {n}")


def test_a_batch_that_varies_at_a_fixed_length_runs_every_batch_size(tmp_path):
    from conftest import ort_run
    path = _attention_onnx(tmp_path / "att.onnx", ["batch", 6])
    model = _compile(path, {"x": [(1, 4), 6, 16]})
    for b in (1, 3, 4):
        x = np.random.default_rng(b).standard_normal((b, 6, 16)).astype(np.float32)
        np.testing.assert_allclose(model.run(x=x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4)


def test_a_length_outside_the_range_and_a_fixed_dim_that_differs_are_refused_in_one_line(tmp_path):
    from tuner.errors import UserError
    model = _compile(_attention_onnx(tmp_path / "att.onnx", [1, "seq"]), "x=1x[2..8]x16")
    for shape, says in (((1, 9, 16), r"has 9 in dim 1 \(seq\); this model runs seq from 2 to 8"),
                        ((1, 1, 16), "from 2 to 8"), ((1, 4, 15), "must have shape 1x4x16"),
                        ((4, 16), "must have 3 dims"), ((1, 1, 4, 16), "must have 3 dims")):
        with pytest.raises(UserError, match=says):
            model.run(np.zeros(shape, np.float32))


def test_a_model_that_divides_by_its_length_is_refused_with_the_reason(tmp_path):
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"], divide_by_length=True)     # r / S: S's value
    with pytest.raises(DynamicError, match="not the start of its value|depends on the value"):
        _compile(path, "x=1x[2..9]x16")


def test_attention_over_a_batch_and_a_length_that_both_vary_matches_onnx_runtime_at_every_pair(tmp_path):
    """Its heads' reshapes index [batch, seq] rows with the bound's strides; their formulas read the
    same at every value once integer division is normalised, and every pair computes what ONNX
    Runtime does."""
    from conftest import ort_run
    path = _attention_onnx(tmp_path / "att.onnx", ["batch", "seq"])
    model = _compile(path, "x=[1..3]x[2..6]x16")
    for b in (1, 2, 3):
        for n in (2, 5, 6):
            x = np.random.default_rng(b * 10 + n).standard_normal((b, n, 16)).astype(np.float32)
            np.testing.assert_allclose(model.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4,
                                       err_msg=f"batch {b}, length {n}")


def test_a_dense_over_batch_and_sequence_both_varying_covers_their_rows_and_matches_onnx_runtime(tmp_path):
    """[batch, seq] rows, both varying, are held with gaps in the bound layout; the dense kernel
    runs over the prefix of rows that covers them ((B - 1) * S_bound + S), its gap rows landing in
    padding, and every (batch, seq) pair computes what ONNX Runtime does."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from conftest import ort_run
    rng = np.random.default_rng(0)
    n = helper.make_node
    g = helper.make_graph([n("MatMul", ["x", "w"], ["y"]), n("Add", ["y", "b"], ["z"]), n("Relu", ["z"], ["r"]),
                           n("MatMul", ["r", "w2"], ["o"])], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                          [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["batch", "seq", 8])],
                          [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k)
                           for k, s in (("w", (16, 32)), ("b", (32,)), ("w2", (32, 8)))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "mlp.onnx"))
    for threads in (1, 2):
        m = _compile(tmp_path / "mlp.onnx", "x=[1..4]x[1..12]x16", threads)
        assert all(s.dynamic for s in m.steps)
        for b, length in ((1, 1), (4, 12), (2, 7), (3, 1), (1, 12), (4, 5)):
            x = rng.standard_normal((b, length, 16)).astype(np.float32)
            np.testing.assert_allclose(m.run(x)[0], ort_run(tmp_path / "mlp.onnx", x)[0], rtol=1e-4, atol=1e-4,
                                       err_msg=f"batch {b}, length {length}, {threads} threads")


def test_dynamic_needs_an_onnx_file_and_ranges_it_can_read(tmp_path):
    from tuner.errors import UserError
    from tuner.graph.ir import GraphError
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    with pytest.raises(UserError, match="needs an ONNX file"):
        _compile("tiny", "x=1x[1..4]")
    for bad, says in (("x=1x[1..4", "each dim is a number, a range"), ("y=1x[1..4]", "no input called"),
                      ("x=2x[1..4]x16", "dim 0 is 1 in the model"), ("x=1x[5..4]x16", "1 <= lo <= hi")):
        with pytest.raises(GraphError, match=says):
            _compile(path, bad)


def _cls_and_mask_onnx(path):
    """A learned token put before x [1, seq, 4], each position's sum times a mask [1, total] of
    seq + 1 positions, as the model's inputs say (dim_params seq and total)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    n = helper.make_node
    g = helper.make_graph([n("Concat", ["cls", "x"], ["c"], axis=1), n("ReduceSum", ["c", "axes"], ["s"], keepdims=0),
                           n("Mul", ["s", "mask"], ["out"])], "cls",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 4]),
                           helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, "total"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "total"])],
                          [numpy_helper.from_array(np.array([[[0.5, -1.0, 2.0, 0.25]]], np.float32), "cls"),
                           numpy_helper.from_array(np.array([2], np.int64), "axes")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_dim_that_follows_another_inputs_symbol_compiles_once_and_runs_every_length(tmp_path):
    from conftest import ort_run
    from tuner.errors import UserError
    path = _cls_and_mask_onnx(tmp_path / "cls.onnx")
    for spec in ("x=1x[1..12]x4; mask=1x[seq+1]", {"x": [1, (1, 12), 4], "mask": [1, "seq+1"]}):
        m = _compile(path, spec)
        assert m.symbols == [{"name": "seq", "lo": 1, "hi": 12}]
        assert m.meta["dynamic"] == {"x": [1, ["seq", 1, 12], 4], "mask": [1, "seq+1"]}     # as parse_dynamic reads it
        for length in (1, 5, 12):
            rng = np.random.default_rng(length)
            x, mask = rng.standard_normal((1, length, 4)).astype(np.float32), rng.uniform(0, 1, (1, length + 1)).astype(np.float32)
            [got], [want] = m.run(x, mask), ort_run(path, {"x": x, "mask": mask})
            assert got.shape == (1, length + 1)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"length {length}")
        with pytest.raises(UserError, match="input mask must have shape 1x6"):
            m.run(np.zeros((1, 5, 4), np.float32), np.zeros((1, 5), np.float32))


def test_a_dim_that_follows_a_symbol_must_name_one_with_a_range_and_stay_1_or_more(tmp_path):
    from tuner.graph.ir import GraphError
    path = _cls_and_mask_onnx(tmp_path / "cls.onnx")
    for bad, says in (("x=1x[1..12]x4; mask=1x[len+1]", r"'\[len\+1\]' is not a sum of symbols plus or minus a number"),
                      ("x=1x[1..12]x4; mask=1x[seq-1]", r"\[seq-1\] is 0 at seq=1"),
                      ("x=1x[seq]x4; mask=1x[seq+1]", "not a sum of symbols plus or minus a number"),
                      ("x=1x[1..12]x4; mask=1x[seq+seq]", "of distinct symbols"),
                      ("x=1x[1..12]x4; mask=1x[2+seq]", "cannot read --dynamic"),
                      ("x=1x4x[1..3]; mask=1x[seq+1]", "dim 2 is fixed at 4"),
                      ("x=1x[1..12]x4; mask=[seq+1]x[seq+1]", "dim 0 is fixed at 1")):
        with pytest.raises(GraphError, match=says):
            _compile(path, bad)


def _chunk_step_onnx(path, width=8, table=0):
    """S new tokens over a cache: keys [1, past+S, width] = concat(past, x), scores of the S rows over
    them, causal as Hugging Face builds it (key position <= query position, the query positions
    range(P, P+S), expanded to [1, S, P+S] by shapes read off the inputs; with `table`, GPT-Neo's
    way: rows P..P+S and columns ..P+S of a fixed lower triangle table x table), plus an additive
    mask [1, past+S] (dim_param total), softmax, times the keys."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    n = helper.make_node
    causal = [
        n("Range", ["p0", "total0", "one"], ["qpos"]), n("Range", ["zero", "total0", "one"], ["kpos"]),
        n("Unsqueeze", ["qpos", "axis1"], ["q2"]), n("Unsqueeze", ["kpos", "axis0"], ["k2"]),
        n("LessOrEqual", ["k2", "q2"], ["seen"]),
        n("Concat", ["one1", "seq", "total"], ["bst"], axis=0), n("Expand", ["seen", "bst"], ["seen3"])] if not table else [
        n("Sub", ["total", "seq"], ["start"]), n("Concat", ["start", "zero1"], ["starts"], axis=0),
        n("Concat", ["total", "total"], ["ends"], axis=0), n("Slice", ["tri", "starts", "ends", "axes01"], ["seen"]),
        n("Unsqueeze", ["seen", "axis0"], ["seen3"])]
    g = helper.make_graph([
        n("Concat", ["past", "x"], ["keys"], axis=1), n("Transpose", ["keys"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["x", "kt"], ["s"]),
        n("Shape", ["x"], ["xs"]), n("Gather", ["xs", "one1"], ["seq"], axis=0),
        n("Shape", ["past"], ["ps"]), n("Gather", ["ps", "one1"], ["p"], axis=0),
        n("Squeeze", ["p", "axis0"], ["p0"]), n("Squeeze", ["seq", "axis0"], ["seq0"]), n("Add", ["p0", "seq0"], ["total0"]),
        n("Add", ["p", "seq"], ["total"]), *causal,
        n("Where", ["seen3", "nothing", "hidden"], ["causal"]), n("Add", ["s", "causal"], ["s1"]), n("Unsqueeze", ["mask", "axis1"], ["m3"]), n("Add", ["s1", "m3"], ["s2"]),
        n("Softmax", ["s2"], ["a"], axis=-1), n("MatMul", ["a", "keys"], ["o"])], "chunk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", width]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, "past", width]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, "total"])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, "seq", width]),
         helper.make_tensor_value_info("keys", TensorProto.FLOAT, [1, "total", width])],
        [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("zero", 0), ("one", 1))]
        + [numpy_helper.from_array(np.array([v], np.int64), k) for k, v in (("axis0", 0), ("axis1", 1), ("one1", 1),
                                                                          ("zero1", 0))]
        + [numpy_helper.from_array(np.array([0, 1], np.int64), "axes01"),
           numpy_helper.from_array(np.tril(np.ones((max(table, 1),) * 2, bool)), "tri")]
        + [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("nothing", 0.0), ("hidden", -1e9))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("table", [0, 40])
def test_a_dim_that_is_a_sum_of_two_symbols_compiles_once_for_every_pair_of_them(tmp_path, table):
    """S new tokens over a past of P (speculative or chunked decoding): the mask is [1, P+S], the
    keys concat(past, x) [1, P+S, 8], each row causal from its own position (computed, or a window
    of a fixed triangle that moves with P and S, sliced at run time); one compile for S in 1..6 and
    P in 1..20 matches ONNX Runtime at every pair tried, and the ranges read back."""
    from conftest import ort_run
    from tuner.errors import UserError
    path = _chunk_step_onnx(tmp_path / "chunk.onnx", table=table)
    m = _compile(path, "x=1x[1..6]x8; past=1x[1..20]x8; mask=1x[past+seq]")
    assert m.meta["dynamic"]["mask"] == [1, "past+seq"] and {s["name"] for s in m.symbols} == {"seq", "past"}
    for s, p in ((6, 20), (1, 1), (3, 7), (1, 20), (6, 1), (2, 13)):
        rng = np.random.default_rng(10 * s + p)
        feeds = {"x": rng.standard_normal((1, s, 8)).astype(np.float32),
                 "past": rng.standard_normal((1, p, 8)).astype(np.float32),
                 "mask": np.where(rng.uniform(size=(1, p + s)) < 0.2, -1e9, 0).astype(np.float32)}
        feeds["mask"][0, -s:] = 0                   # the new tokens are never masked out
        got, want = m.run(**feeds), ort_run(path, feeds)
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"seq {s}, past {p}")
    assert [a.shape for a in m.random_inputs(shapes={"x": (1, 3, 8), "past": (1, 9, 8)})] == [(1, 3, 8), (1, 9, 8), (1, 12)]
    with pytest.raises(UserError, match="input mask must have shape 1x12"):
        m.run(np.zeros((1, 3, 8), np.float32), np.zeros((1, 9, 8), np.float32), np.zeros((1, 11), np.float32))


def test_the_command_line_compiles_a_range_and_runs_a_shape_in_it(tmp_path, capsys):
    from tuner.cli import main
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    assert main(["compile", str(path), "--dynamic", "x=1x[1..16]x16", "--threads", "1", "-o", str(tmp_path / "m")]) == 0
    assert "dynamic: seq from 1 to 16" in capsys.readouterr().out
    np.save(tmp_path / "x.npy", np.ones((1, 7, 16), np.float32))
    assert main(["run", str(tmp_path / "m"), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npy")]) == 0
    assert np.load(tmp_path / "y.npy").shape == (1, 7, 16)
    assert main(["run", str(tmp_path / "m"), "--input", f"x={tmp_path / 'x.npy'}"]) == 0
    np.save(tmp_path / "x.npy", np.ones((1, 17, 16), np.float32))
    assert main(["run", str(tmp_path / "m"), "--input", f"x={tmp_path / 'x.npy'}"]) == 2
    assert "runs seq from 1 to 16" in capsys.readouterr().err
    assert main(["bench", str(tmp_path / "m"), "--shapes", "x=1x1x16,1x9x16", "--threads", "1,2", "--rounds", "1",
                 "--json", str(tmp_path / "b.json")]) == 0
    import json
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [(r["threads"], r["shapes"]["x"][1]) for r in rows] == [(1, 1), (1, 9), (2, 1), (2, 9)]
    assert all(r["max_rel_error_vs_onnxruntime"] < 1e-4 for r in rows)
    assert main(["bench", str(tmp_path / "m"), "--shapes", "x=1x17x16"]) == 2
    assert "runs seq from 1 to 16" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name,dynamo,opset,batch", [("bert", False, 14, False), ("bert", True, 17, False),
                                                     ("gpt2", True, 18, False), ("bert", False, 14, True)])
def test_a_hugging_face_model_exported_with_a_dynamic_length_compiles_once_and_matches_onnx_runtime(tmp_path, name,
                                                                                                    dynamo, opset,
                                                                                                    batch):
    """BERT by both exporters, and with its batch varying too; GPT-2 by dynamo, which numbers
    positions and builds the causal mask from the length with CumSum and GatherND."""
    tf = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    if dynamo:
        pytest.importorskip("onnxscript")
    from conftest import ort_run
    if name == "bert":
        m = tf.BertModel(tf.BertConfig(vocab_size=100, max_position_embeddings=40, hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=4, intermediate_size=64))
    else:
        m = tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_positions=40, n_embd=32, n_layer=1, n_head=4))
        m.config.use_cache = False
    m.eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(input_ids=x).last_hidden_state

    path = tmp_path / f"{name}.onnx"
    axes = {0: "batch", 1: "seq"} if batch else {1: "seq"}
    torch.onnx.export(Hidden(), (torch.randint(0, 100, (2 if batch else 1, 7)),), str(path), input_names=["input_ids"],
                      output_names=["out"], opset_version=opset, dynamic_axes={"input_ids": axes, "out": axes},
                      dynamo=dynamo)
    model = _compile(path, "input_ids=[1..3]x[1..40]" if batch else "input_ids=1x[1..40]")
    assert all(s.dynamic for s in model.steps)
    for b, n in ((1, 1), (1, 7), (1, 23), (1, 40)) + (((3, 40), (2, 7), (3, 1)) if batch else ()):
        ids = np.random.default_rng(n).integers(0, 100, (b, n)).astype(np.int64)
        np.testing.assert_allclose(model.run(input_ids=ids)[0], ort_run(path, {"input_ids": ids})[0], rtol=1e-4,
                                   atol=1e-4, err_msg=f"length {n}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_hugging_face_decoders_step_over_a_kv_cache_compiles_once_for_every_past_length(tmp_path, name):
    """GPT-2 (learned positions, wpe[P]) and LLaMA (RoPE at P, grouped-query heads), one decoding
    step exported with the past length dynamic: one compile for 1..30 matches ONNX Runtime at
    every past length tried, the present keys and values included."""
    tf = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from conftest import ort_run
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=1, n_head=4)
    else:
        cfg = tf.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    net = (tf.GPT2Model if name == "gpt2" else tf.LlamaModel)(cfg).eval()
    heads = 4 if name == "gpt2" else 2

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, ids, mask, k, v):
            cache = tf.DynamicCache()
            cache.update(k, v, 0)
            out = self.net(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            layer = out.past_key_values.layers[0]
            return out.last_hidden_state, layer.keys, layer.values

    path = tmp_path / f"{name}_step.onnx"
    past = [torch.randn(1, heads, 5, 8) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step(), (torch.randint(0, 100, (1, 1)), torch.ones(1, 6, dtype=torch.int64), *past), str(path),
                          input_names=["ids", "mask", "k", "v"], output_names=["hidden", "present_k", "present_v"],
                          dynamic_axes={"mask": {1: "total"}, "k": {2: "past"}, "v": {2: "past"},
                                        "present_k": {2: "total"}, "present_v": {2: "total"}},
                          opset_version=17, dynamo=False)
    m = _compile(path, f"k=1x{heads}x[1..30]x8; mask=1x[past+1]")
    for p in (30, 1, 2, 11):
        rng = np.random.default_rng(p)
        feeds = {"ids": rng.integers(0, 100, (1, 1)).astype(np.int64), "mask": np.ones((1, p + 1), np.int64),
                 **{n: rng.standard_normal((1, heads, p, 8)).astype(np.float32) for n in ("k", "v")}}
        feeds["mask"][0, : p // 4] = 0
        got, want = m.run(**feeds), ort_run(path, feeds)
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"past length {p}")


@pytest.mark.slow
def test_a_t5_decoders_step_over_a_kv_cache_and_a_varying_encoder_output_compiles_once_for_every_pair(tmp_path):
    """T5's decoder, one step: its relative position bias at the past length (buckets of P - j by a
    log, clamped by a Min with a constant tensor) is computed at run time, the encoder's output
    and the past both vary; one compile matches ONNX Runtime at every pair tried, beyond the
    buckets' max distance too."""
    tf = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from conftest import ort_run
    torch.manual_seed(0)
    cfg = tf.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=12)
    cfg._attn_implementation = "eager"
    dec = tf.T5Model(cfg).eval().get_decoder()

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dec = dec

        def forward(self, ids, enc, k, v):
            cache = tf.EncoderDecoderCache(tf.DynamicCache(), tf.DynamicCache())
            cache.self_attention_cache.update(k, v, 0)
            out = self.dec(input_ids=ids, encoder_hidden_states=enc, past_key_values=cache, use_cache=True)
            layer = out.past_key_values.self_attention_cache.layers[0]
            return out.last_hidden_state, layer.keys, layer.values

    path = tmp_path / "t5_step.onnx"
    past = [torch.randn(1, 4, 5, 8) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step(), (torch.randint(0, 100, (1, 1)), torch.randn(1, 6, 32), *past), str(path),
                          input_names=["ids", "enc", "k", "v"], output_names=["hidden", "present_k", "present_v"],
                          dynamic_axes={"enc": {1: "enc"}, "k": {2: "past"}, "v": {2: "past"},
                                        "present_k": {2: "total"}, "present_v": {2: "total"}},
                          opset_version=17, dynamo=False)
    m = _compile(path, "enc=1x[1..16]x32; k=1x4x[1..30]x8")
    assert m.meta["run_time"]
    for e, p in ((16, 30), (1, 1), (7, 2), (3, 13), (16, 1)):
        rng = np.random.default_rng(p * 100 + e)
        feeds = {"ids": rng.integers(0, 100, (1, 1)).astype(np.int64),
                 "enc": rng.standard_normal((1, e, 32)).astype(np.float32),
                 **{n: rng.standard_normal((1, 4, p, 8)).astype(np.float32) for n in ("k", "v")}}
        got, want = m.run(**feeds), ort_run(path, feeds)
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"encoder length {e}, past length {p}")


def test_records_tuned_at_buckets_run_for_the_lengths_up_to_them_and_the_bounds_schedule_beyond(tmp_path):
    """A dynamic compile with a log takes, per task, the records of its workload at each bucket,
    as a version the kernel dispatches to for the lengths up to that bucket, and computes what
    ONNX Runtime does at lengths in every bucket's range."""
    import importlib
    import random

    from conftest import ort_run
    from tuner.database import records
    from tuner.database.result import MeasureResult
    from tuner.ops.workload import parse_spec
    from tuner.target import host_isa, parse_target
    compile_model = importlib.import_module("tuner.compiler.compile_model").compile_model
    target = parse_target(f"cpu -isa={host_isa()} -cores=2 -threads=1")
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    log, rng, tuned = tmp_path / "buckets.jsonl", random.Random(0), set()
    for n in (6, 12):
        for s in compile_model(str(path), target=str(target), input_shapes={"x": [1, n, 16]}, use_shipped=False).steps:
            if not s.anchor:
                continue
            spec, layout = s.workload.rsplit(" [", 1)
            wl = parse_spec(spec, layout.rstrip("]"))
            task = Task(wl, target)
            dec = task.space.sample(rng)
            steps = task.space.steps(dec)
            records.append(log, [records.make_record(wl, str(target), steps, MeasureResult("OK", costs=[1e-5] * 3),
                                                     task.candidate(steps).code_hash, "test", 0, decisions=dec)])
            tuned.add(s.index)
    assert tuned
    m = compile_model(str(path), log=str(log), target=str(target), use_shipped=False, dynamic="x=1x[1..24]x16",
                      buckets=[6, 12])
    versioned = [s for s in m.steps if s.versions]
    assert {s.index for s in versioned} == tuned
    assert all([v["upto"] for v in s.versions] == [6, 12] and s.versions[0]["source"] == str(log) for s in versioned)
    assert "if (n <= 6) return" in m.source and "records tuned at 6, 12" in m.report()
    for n in (1, 5, 6, 7, 12, 13, 24):
        x = np.random.default_rng(n).standard_normal((1, n, 16)).astype(np.float32)
        np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4, err_msg=f"length {n}")
    from tuner.errors import UserError
    with pytest.raises(UserError, match="outside seq's range"):
        compile_model(str(path), log=str(log), dynamic="x=1x[1..24]x16", buckets=[30])
    with pytest.raises(UserError, match="give --dynamic too"):
        compile_model(str(path), log=str(log), input_shapes={"x": [1, 4, 16]}, buckets=[2])


@pytest.mark.slow
def test_a_dynamic_tune_tunes_each_bucket_into_one_log_and_the_compile_runs_its_records(tmp_path, tmp_cache, capsys):
    from tuner.cli import main
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    log = tmp_path / "dyn.jsonl"
    assert main(["tune", str(path), "--dynamic", "x=1x[1..8]x16", "--buckets", "4", "--trials", "40", "--threads", "1",
                 "--log", str(log), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "at 4:" in out and "at 8:" in out
    from tuner.database import records
    contents = records.load(log)
    assert sorted(p.shapes["x"][1] for p in contents.plans if p.dynamic) == [4, 8]
    # run again, it resumes every bucket: nothing left to measure, no heat timed again
    assert main(["tune", str(path), "--dynamic", "x=1x[1..8]x16", "--buckets", "4", "--trials", "40", "--threads", "1",
                 "--log", str(log), "--no-progress"]) == 0
    assert len(records.load(log).records) == len(contents.records)
    by_key: dict = {}
    for r in contents.records:
        by_key.setdefault(r.workload.key, []).append(r)
    heats = {k: {r.code_hash for r in rs if r.heat == records.best_of(rs).heat} for k, rs in by_key.items()}
    assert all(len(h) >= 2 for h in heats.values())
    assert main(["compile", str(path), "--dynamic", "x=1x[1..8]x16", "--log", str(log), "--threads", "1",
                 "--no-fuse-attention", "--no-merge-dense", "-o", str(tmp_path / "m")]) == 0
    from conftest import ort_run
    from tuner.runtime import load
    m = load(tmp_path / "m")
    assert all(s.source != "default" for s in m.steps if s.anchor)
    # a version serves up to where the tune measured it handing over to the bound's (5, 6 or 7), else its bucket
    [plan4] = [p for p in contents.plans if p.shapes["x"][1] == 4]
    assert all(4 <= e["upto"] < 8 for e in plan4.ends.values())
    # each task's heat at 4 timed the code the bound's best gives there: a version only where it lost
    from tuner.graph.dynamic import load_at
    from tuner.graph.layout_plan import model_layouts
    from tuner.target import host_isa, parse_target
    target = parse_target(f"cpu -isa={host_isa()} -threads=1")
    pairs = [model_layouts(load_at(str(path), {"x": [1, n, 16]})).workloads() for n in (4, 8)]
    assert pairs[0] and len(pairs[0]) == len(pairs[1])
    for (w4, _), (w8, _) in zip(*pairs):
        assert Task(w4, target).candidate(records.best_of(by_key[w8.key]).steps).code_hash in heats[w4.key]
    at4 = {w8.key: w4.key for (w4, _), (w8, _) in zip(*pairs)}
    served = [(v["upto"], plan4.ends[at4[s.workload_key]]["upto"]) for s in m.steps for v in s.versions]
    assert bool(served) == bool(plan4.ends) and all(upto == end for upto, end in served)
    # a static compile from this log at another length says the plans are of other shapes (no conv to name)
    import importlib
    static = importlib.import_module("tuner.compiler.compile_model").compile_model
    with pytest.warns(UserWarning, match="none of this model at these input shapes on .*without one$"):
        static(str(path), log=str(log), threads=1, input_shapes={"x": [1, 5, 16]})
    assert main(["analyze", str(log), "--model", str(path), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "at x=1x4x16 (a bucket of a range of shapes)" in out and "across its range (2 tuned shapes" in out
    assert "no layout to choose" in out and "trials on conv tasks" not in out      # a model with no conv
    # each plan is read at its own shapes, as imported for the range, whatever --input-shape says
    assert main(["analyze", str(log), "--model", str(path), "--input-shape", "x=1x8x16", "--no-plot"]) == 0
    assert "across its range (2 tuned shapes" in capsys.readouterr().out
    for n in (1, 4, 5, 8):
        x = np.random.default_rng(n).standard_normal((1, n, 16)).astype(np.float32)
        np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4)


def test_a_buckets_kernel_serves_up_to_the_last_value_between_buckets_where_it_ran_faster_than_the_one_above(
        tmp_path):
    """handovers times each task's kernel of bucket 4 and of bucket 16 at 7, 10 and 13 (a quarter,
    half and three quarters of the way up), as static kernels there: a task's end is the last of
    them before the first where bucket 16's kernel is as fast, and every timing is in the log."""
    import types
    from tuner.database import records
    from tuner.graph.dynamic import load_at, parse_dynamic
    from tuner.graph.layout_plan import model_layouts
    from tuner.graph.onnx_frontend import input_dims
    from tuner.measure.runner import RunConfig
    from tuner.model_tuning import _contenders, handovers
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    dyn = parse_dynamic("x=1x[1..16]x16", input_dims(str(path)))
    at = {n: model_layouts(load_at(str(path), {"x": [1, n, 16]})).workloads() for n in (4, 7, 10, 13, 16)}
    assert at[4] and all(len(p) == len(at[4]) for p in at.values())

    def best(wl, seed):                  # a record's stand-in: the default schedule, or a sampled one
        space = Task(wl, TARGET1).space
        dec = space.default() if seed is None else space.sample(random.Random(seed))
        return types.SimpleNamespace(steps=space.steps(dec))
    mine = [types.SimpleNamespace(workload=w, best=best(w, None)) for w, _ in at[4]]
    above = types.SimpleNamespace(space=types.SimpleNamespace(workloads=lambda: at[16]), session=types.SimpleNamespace(
        tasks=[types.SimpleNamespace(workload=w, best=best(w, 3 + j)) for j, (w, _) in enumerate(at[16])]))
    theirs = _contenders(above, at[4])          # each task's best at 16, paired by place
    log = tmp_path / "h.jsonl"
    k, _ = dyn.buckets([4])
    ends = handovers(str(path), dyn, k, (4, 16), mine, at[4], theirs, None, RunConfig(number=1, repeat=3), str(log),
                     threads=1, progress=False)
    timed = [r for r in records.load(log).records if r.policy == records.HANDOVER]
    assert ends and timed and not any(r.trial for r in timed)
    # handed the ends it gave, it times nothing again; a pair of kernels changed since is timed again
    again = handovers(str(path), dyn, k, (4, 16), mine, at[4], theirs, None, RunConfig(number=1, repeat=3), str(log),
                      ends, threads=1, progress=False)
    assert again == ends and len(records.load(log).records) == len(timed)
    stale = {key: dict(e, above="0" * 20) for key, e in ends.items()}
    handovers(str(path), dyn, k, (4, 16), mine, at[4], theirs, None, RunConfig(number=1, repeat=3), str(log),
              stale, threads=1, progress=False)
    assert len(records.load(log).records) > len(timed)
    for j, (w4, _) in enumerate(at[4]):
        lo_steps, hi_steps = mine[j].best.steps, above.session.tasks[j].best.steps
        if w4.key not in ends:        # the same code at 4: no version, nothing to time
            t4 = Task(w4, TARGET1)
            assert t4.applied(lo_steps).code_hash == t4.applied(hi_steps).code_hash
            continue
        want = 4
        for x in (7, 10, 13):
            t = Task(at[x][j][0], TARGET1)
            lo, hi = t.applied(lo_steps).code_hash, t.applied(hi_steps).code_hash
            if lo == hi:
                want = x
                continue
            mine_x = [r for r in timed if r.workload.key == at[x][j][0].key]
            assert len(mine_x) == 4 and {r.code_hash for r in mine_x} == {lo, hi}
            slower = {h: max(r.latency for r in mine_x if r.code_hash == h) for h in (lo, hi)}
            if slower[lo] >= slower[hi]:
                break
            want = x
        assert ends[w4.key]["upto"] == want


def test_a_reduction_fused_then_split_keeps_the_padding_out_of_its_sum():
    """A fused loop whose inner part is a dynamic reduction axis skips the padding's iterations;
    split afterwards, the skip becomes a guard of the split loop."""
    wl = make("conv2d", dict(C=12, H=5, W=5, K=4, R=3, S=3), "NCHW")
    task = Task(wl, TARGET1)
    dims = task.dynamic_dims({"C": symbol_var(0)}, (Symbol("c", 1, 12),))
    from tuner.te.tensor import ComputeOp, topo_order
    stage = next(t for t in topo_order(wl.build()[1]) if isinstance(t.op, ComputeOp) and t.op.reduce_axes)
    r = [a.name for a in stage.op.reduce_axes]
    steps = [["reorder", stage.name, [a.name for a in stage.op.axes] + [r[1], r[0], r[2]]],
             ["fuse", stage.name, [r[1], r[0]]], ["split", stage.name, f"{r[1]}@{r[0]}", [4]]]
    cand = task.candidate(steps, func_name="fs", dims=dims)
    [built] = build_batch([(cand.func_name, cand.source)], TARGET1, jobs=1)
    assert not built.error, built.error
    fixed = dict(H=5, W=5, K=4, R=3, S=3)
    for c in (12, 5, 1):
        out, ref, rc = run_at(task, built, "conv2d", fixed, {"C": symbol_var(0)}, {"_dyn0": c})
        assert rc == 0 and not check_output(out[tuple(slice(0, n) for n in ref.shape)], ref, 1e-3, 1e-4), f"C={c}"


def test_a_slice_whose_length_stops_growing_inside_the_range_is_refused(tmp_path):
    """x[:, :16] over 1..64 is 16 rows from 16 up and fewer below: no bound layout serves it, and the
    fit's probe at the bottom of the range sees it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    ints = {"st": [0], "en": [16], "ax": [1]}
    g = helper.make_graph([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"]),
                           helper.make_node("Softmax", ["y"], ["z"], axis=1)], "s",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, None, 4])],
                          [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "s.onnx"))
    with pytest.raises(DynamicError, match="not a multilinear function of S"):
        _compile(tmp_path / "s.onnx", "x=1x[1..64]x4")


def test_a_tile_tuned_for_a_larger_value_stops_its_middle_loop_where_the_runs_rows_end():
    """Rows split [2 tiles, 8 register tiles of 8 rows]: at a run of 16 rows the middle loop runs 2
    of its 8 iterations (the trip count is a run-time expression), not 64 rows into the padding."""
    wl = make("dense", dict(N=128, C=16, K=16))
    task = Task(wl, TARGET1)
    dims = task.dynamic_dims({"N": symbol_var(0)}, (Symbol("rows", 1, 128),))
    steps = [["split", "dense", "n", [8, 8]], ["annotate", "dense", "n.2", "unroll"]]
    src = task.candidate(steps, "tl", dims=dims).source
    middle = next(line for line in src.splitlines() if "for (int n_1 = 0" in line)
    assert "_dyn0" in middle and "8" in middle, middle
    # its end lives in memory, read at each test: no register is held through the tile below
    assert "*(volatile int*)n_1_end" in middle, middle
    [built] = build_batch([("tl", src)], TARGET1, jobs=1)
    for n in (1, 16, 17, 64, 65, 128):
        _check(task, built, "dense", dict(C=16, K=16), {"N": symbol_var(0)}, {"_dyn0": n})


@settings(max_examples=60, deadline=None)
@given(hist=st.dictionaries(st.integers(1, 300), st.integers(0, 40), min_size=1).filter(lambda h: sum(h.values()) > 0),
       n=st.integers(1, 4), hi=st.sampled_from([300, 512]))
@example(hist={1: 5}, n=1, hi=300)          # every value seen is 1: no bucket
def test_buckets_cut_from_a_histogram_end_each_equal_share_of_its_time_at_a_value_seen(hist, n, hi):
    """With --shape-histogram the buckets are values seen, above 1 and below the bound, at most n;
    every j/n of the time (count x value) ends at one of them (or at 1), so each version serves
    about an equal share;
    the trials follow each bucket's share of that time, and the shares add up to one."""
    from tuner.graph.dynamic import histogram_buckets, shares
    sym = Symbol("seq", 1, hi)
    buckets = histogram_buckets(hist, sym, n)
    assert buckets == sorted(set(buckets)) and len(buckets) <= n and all(v in hist and v < hi for v in buckets)
    total = sum(c * v for v, c in hist.items())
    upto = lambda b: sum(c * v for v, c in hist.items() if v <= b)     # noqa: E731
    below = lambda b: sum(c * v for v, c in hist.items() if v < b)     # noqa: E731
    for j in range(1, n + 1):
        ends = [b for b in buckets + [hi] if below(b) * n < j * total <= upto(b) * n]
        at_one = upto(1) * n >= j * total          # no bucket at 1: the version above serves it
        assert ends or at_one, f"share {j}/{n} ends at no bucket"
    part = shares(buckets + [hi], sym, hist)
    assert abs(sum(part) - 1) < 1e-9 and all(x >= 0 for x in part)
    assert all((x > 0) == (upto(b) > upto(a)) for x, a, b in zip(part, [0] + buckets, buckets + [hi]))


def test_without_a_histogram_each_bucket_is_weighted_by_the_lengths_it_serves():
    from tuner.graph.dynamic import shares
    sym = Symbol("seq", 3, 40)
    part = shares([8, 20, 40], sym)
    brute = [sum(range(lo + 1, hi + 1)) for lo, hi in ((2, 8), (8, 20), (20, 40))]
    assert part == pytest.approx([w / sum(brute) for w in brute])


@pytest.mark.parametrize("text, says", [("77 3\n12x\n", "line 2: '12x' is not `VALUE [COUNT]`"),
                                        ("\u00b2 1\n", "line 1"), ("\u0663\n", "line 1"),
                                        ("77 3 4\n", "line 1"), ("600\n", "600 is outside seq's range"),
                                        ("# nothing\n77 0\n", "holds no value with a count above 0")])
def test_a_shape_histogram_that_is_not_value_count_lines_in_the_range_is_refused_naming_the_line(tmp_path, text, says):
    from tuner.errors import UserError
    from tuner.graph.dynamic import read_histogram
    f = tmp_path / "lengths.txt"
    f.write_text(text)
    with pytest.raises(UserError, match=re.escape(says)):
        read_histogram(str(f), Symbol("seq", 1, 512))
    f.write_text("# length count\n77 3\n128, 5\n77\n\n")
    assert read_histogram(str(f), Symbol("seq", 1, 512)) == {77: 4, 128: 5}


def test_a_dynamic_compile_takes_its_buckets_from_the_logs_plans_and_keeps_a_version_only_where_its_code_differs(
        tmp_path):
    """Without --buckets, a compile for a range runs versions at the values where the log holds a
    plan of this model made for the range (tune --dynamic), other models' plans and static plans
    ignored. A bucket whose best record gives the code that the version above it (or the bound's
    record) gives there has no version of its own: the one above serves its lengths."""
    import importlib

    from conftest import ort_run
    from tuner.database import records
    from tuner.database.result import MeasureResult
    from tuner.graph.dynamic import load_at
    from tuner.graph.ir import graph_digest
    from tuner.ops.workload import parse_spec
    from tuner.target import host_isa, parse_target
    compile_model = importlib.import_module("tuner.compiler.compile_model").compile_model
    target = parse_target(f"cpu -isa={host_isa()} -cores=2 -threads=1")
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    log, rng = tmp_path / "buckets.jsonl", random.Random(1)
    steps_at: dict = {}          # task (its place among the model's tasks) -> {length: steps}
    tasks_at: dict = {}          # task -> {length: Task}
    for n in (24, 12, 6):
        shapes = {"x": [1, n, 16]}
        seen: list = []
        for s in compile_model(str(path), target=str(target), input_shapes=shapes, use_shipped=False).steps:
            if not s.anchor or s.workload in seen:
                continue
            seen.append(s.workload)
            k = len(seen) - 1
            spec, layout = s.workload.rsplit(" [", 1)
            wl = parse_spec(spec, layout.rstrip("]"))
            task = Task(wl, target)
            above = steps_at.get(k, {}).get(12 if n == 6 else 24)
            steps = above if n == 6 and k % 2 == 0 else task.space.steps(task.space.sample(rng))
            records.append(log, [records.make_record(wl, str(target), steps, MeasureResult("OK", costs=[1e-5] * 3),
                                                     task.candidate(steps).code_hash, "test", 0)])
            steps_at.setdefault(k, {})[n] = steps
            tasks_at.setdefault(k, {})[n] = task
        records.append(log, [records.make_plan_record(str(path), graph_digest(load_at(str(path), shapes)),
                                                      str(target), {}, 1e-3, True, shapes=shapes, dynamic=True)])
    records.append(log, [records.make_plan_record(str(path), "0" * 16, str(target), {}, 1e-3, True,
                                                  shapes={"x": [1, 9, 16]}, dynamic=True),
                         records.make_plan_record(str(path), graph_digest(load_at(str(path), {"x": [1, 3, 16]})),
                                                  str(target), {}, 1e-3, True, shapes={"x": [1, 3, 16]})])
    said: list = []
    m = compile_model(str(path), log=str(log), target=str(target), use_shipped=False, dynamic="x=1x[1..24]x16",
                      progress=said.append)
    assert any("seq=9: the log's plan there is another model's" in line for line in said)
    order = list(dict.fromkeys(s.workload for s in m.steps if s.anchor))
    tuned = [s for s in m.steps if s.anchor]
    assert len(order) == len(steps_at) and all(s.dynamic for s in tuned)
    kept = []
    for s in tuned:
        k = order.index(s.workload)
        at, task = steps_at[k], tasks_at[k]
        code = lambda n, k: task[n].candidate(at[k]).code_hash      # noqa: E731  (steps logged at k, at n)
        want12 = code(12, 12) != code(12, 24)
        want6 = code(6, 6) != code(6, 12 if want12 else 24)
        assert [v["upto"] for v in s.versions] == [6] * want6 + [12] * want12, s.summary
        assert not want6 or k % 2 == 1       # the steps of the bucket above, logged at 6: no version
        kept.append(want6)
    assert any(kept) and not all(kept)
    for n in (1, 5, 6, 7, 12, 13, 24):
        x = np.random.default_rng(n).standard_normal((1, n, 16)).astype(np.float32)
        np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4, err_msg=f"length {n}")


def test_a_dynamic_tune_with_a_histogram_tunes_the_bound_first_then_its_buckets_with_trials_by_their_share(
        tmp_path, monkeypatch, capsys):
    """tune --dynamic --shape-histogram: buckets cut from the lengths seen, tuned from the bound down,
    each bucket's tune given the schedules of the one above as contenders, --trials by the share
    of the histogram's time each serves; bad histograms are one-line errors."""
    from tuner import model_tuning
    from tuner.cli import main
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    calls = []

    from types import SimpleNamespace

    def fake(graph, trials, contenders=None, **kw):
        n = graph.inputs[0].shape[1]
        calls.append((n, trials, contenders, kw.get("time_limit")))
        space = model_tuning.model_layouts(graph, ("NCHW16c",))
        best = [SimpleNamespace(workload=wl, best=SimpleNamespace(steps=[["tuned at", n, k]]))
                for k, (wl, _) in enumerate(space.workloads())]
        return SimpleNamespace(space=space, session=SimpleNamespace(interrupted=False, tasks=best))
    monkeypatch.setattr(model_tuning, "tune_model", fake)
    hist = tmp_path / "lengths.txt"
    hist.write_text("5 12\n9 10\n20 1\n")           # times 60, 90, 20: thirds end at 5, 9 and 20
    out = model_tuning.tune_dynamic(str(path), "x=1x[1..64]x16", 1000, time_limit=170.0, histogram=str(hist),
                                    layouts=("NCHW16c",))
    assert [v for v, _ in out] == [5, 9, 20, 64]
    assert [c[0] for c in calls] == [64, 20, 9, 5] and calls[0][2] == {}
    for (n, _, offered, _), (above, *_) in zip(calls[1:], calls):     # each task gets the one above's best
        from tuner.graph.dynamic import load_at
        keys = [wl.key for wl, _ in model_tuning.model_layouts(load_at(str(path), {"x": [1, n, 16]}),
                                                               ("NCHW16c",)).workloads()]
        assert keys and offered == {key: [[["tuned at", above, k]]] for k, key in enumerate(keys)}
    assert [c[1] for c in calls] == [None, round(1000 * 20 / 170), round(1000 * 90 / 170), round(1000 * 60 / 170)]
    # the time limit is shared the same way; the bound's first looks (no share of the time) get none
    assert [c[3] for c in calls] == [None, pytest.approx(20.0), pytest.approx(90.0), pytest.approx(60.0)]
    for text, says in (("5 10\n70 1\n", "70 is outside seq's range"), ("five\n", "line 1")):
        hist.write_text(text)
        assert main(["tune", str(path), "--dynamic", "x=1x[1..64]x16", "--shape-histogram", str(hist), "--trials",
                     "100", "--log", str(tmp_path / "l.jsonl")]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    assert main(["tune", str(path), "--shape-histogram", str(hist), "--log", str(tmp_path / "l.jsonl")]) == 2
    assert "--shape-histogram describes a --dynamic range: give --dynamic too" in capsys.readouterr().err


def _conv24_onnx(path):
    """Two convs of 24 output channels over an image of any height: whole 8-lane vectors, padded for 16."""
    from onnx import TensorProto, helper, numpy_helper
    import onnx
    r = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((r.standard_normal(shape) * 0.1).astype(np.float32), name)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2", "b2"], ["y"], kernel_shape=[1, 1])]
    g = helper.make_graph(nodes, "c24", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, "h", 16])],
                          [w("w1", 24, 3, 3, 3), w("b1", 24), w("w2", 24, 24, 1, 1), w("b2", 24)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_dynamic_tune_for_avx2_pairs_each_buckets_tasks_as_its_tunes_build_them_for_8_lanes(tmp_path, monkeypatch):
    """The bucket's task list that pairs with the one above is built for the target's vectors, as
    tune_model builds its space: 24 channels in NCHW16c run in blocks of 8 on AVX2, padded on AVX-512."""
    from types import SimpleNamespace
    from tuner import model_tuning
    from tuner.target import parse_target
    path = _conv24_onnx(tmp_path / "c24.onnx")
    calls = []

    def fake(graph, trials, contenders=None, target="cpu", threads=None, layouts=(), **kw):
        space = model_tuning.model_layouts(graph, layouts, parse_target(target, threads).lanes)
        calls.append((graph.inputs[0].shape[2], contenders, [wl.key for wl, _ in space.workloads()]))
        best = [SimpleNamespace(workload=wl, best=SimpleNamespace(steps=[["tuned", k]]))
                for k, (wl, _) in enumerate(space.workloads())]
        return SimpleNamespace(space=space, session=SimpleNamespace(interrupted=False, tasks=best))
    monkeypatch.setattr(model_tuning, "tune_model", fake)
    for target in ("cpu -isa=avx2", "cpu -isa=avx512"):
        calls.clear()
        model_tuning.tune_dynamic(str(path), "x=1x3x[8..16]x16", 1000, buckets=[8], target=target, threads=1,
                                  layouts=("NCHW16c",), progress=False)
        assert [(h, offered) for h, offered, _ in calls[:1]] == [(16, {})] and [h for h, *_ in calls] == [16, 8]
        keys = calls[1][2]
        assert keys and calls[1][1] == {key: [[["tuned", k]]] for k, key in enumerate(keys)}, target


def test_a_dynamic_tune_over_two_varying_dims_tunes_their_bounds_once_and_buckets_need_one(tmp_path, monkeypatch,
                                                                                          capsys):
    """Several new tokens over a past (seq and past both vary): with no buckets the tune runs once,
    at both bounds, and says so; buckets of one of them are refused in one line."""
    from types import SimpleNamespace
    from tuner import model_tuning
    from tuner.cli import main
    path = _chunk_step_onnx(tmp_path / "chunk.onnx")
    spec = "x=1x[1..6]x8; past=1x[1..20]x8; mask=1x[past+seq]"
    calls = []

    def fake(graph, trials, contenders=None, **kw):
        calls.append(({v.name: tuple(v.shape) for v in graph.inputs}, trials))
        space = model_tuning.model_layouts(graph, ("NCHW16c",))
        return SimpleNamespace(space=space, session=SimpleNamespace(interrupted=False, tasks=[]))
    monkeypatch.setattr(model_tuning, "tune_model", fake)
    out = model_tuning.tune_dynamic(str(path), spec, 300, layouts=("NCHW16c",))
    assert [v for v, _ in out] == [6] and calls == [({"x": (1, 6, 8), "past": (1, 20, 8), "mask": (1, 26)}, 300)]
    assert "2 dims vary (seq, past): tuning at their bounds only" in capsys.readouterr().out
    assert main(["tune", str(path), "--dynamic", spec, "--buckets", "4", "--trials", "10", "--log",
                 str(tmp_path / "l.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "buckets are values of one varying dimension; this model has 2" in err and err.count("\n") == 1


def test_a_model_compiled_at_one_shape_has_no_dynamic_step_and_no_run_time_dims(tmp_path):
    """The dynamic machinery stays out of a static compile: no symbols, no step reading the dims
    array, every kernel the static one."""
    import importlib
    compile_model = importlib.import_module("tuner.compiler.compile_model").compile_model
    path = _attention_onnx(tmp_path / "att.onnx", [1, "seq"])
    m = compile_model(str(path), threads=1, input_shapes={"x": [1, 24, 16]}, use_shipped=False)
    assert m.steps and not m.symbols and not any(s.dynamic or s.versions for s in m.steps)
    assert "tuner_dims" not in m.source and "_dyn" not in m.source
    assert "dynamic" not in m.report()


def test_a_vector_loop_too_short_to_vectorise_with_a_run_time_end_compiles_without_a_simd_pragma(tmp_path):
    """A loop annotated vectorize whose extent no vector width fits, and whose trip count is a
    run-time value, is written as a plain loop: OpenMP's simd pragma does not take a loop header
    that declares its end too."""
    import subprocess

    from tuner.codegen.c import generate_c
    from tuner.schedule import ir
    from tuner.te.expr import Const, Var
    out = ir.Buffer("out", (6,), "arg")
    body = ir.For("i", 6, ir.Store("out", (Var("i"),), Const(1.0)), "vectorize", limit=symbol_var(0) + Const(1))
    src, _ = generate_c(ir.Func("k", [out], [], body, {"out": out}, (Symbol("n", 1, 5),)))
    assert "omp simd" not in src and "i_end" in src, src
    f = tmp_path / "k.c"
    f.write_text(src)
    done = subprocess.run(["gcc", "-fopenmp-simd", "-fsyntax-only", "-Wall", str(f)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _decoder_step_onnx(path, heads=2, dim=8, positions=64):
    """One decoding step over a cache: the new token x [1, 1, heads*dim] plus its position's row of a
    learned table (the row at the past length, read off the past's shape), its key appended to the
    past keys [1, heads, past, dim] (the output `present`), and attention over them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    n, rng, width = helper.make_node, np.random.default_rng(0), heads * dim
    g = helper.make_graph([
        n("Shape", ["past"], ["shape"]), n("Gather", ["shape", "two"], ["p"], axis=0),
        n("Unsqueeze", ["p", "axes01"], ["pos"]), n("Gather", ["wpe", "pos"], ["row"], axis=0),
        n("Add", ["x", "row"], ["h"]),
        *(m for t in "kq" for m in (n("MatMul", ["h", f"w{t}"], [f"{t}1"]), n("Reshape", [f"{t}1", "heads"], [f"{t}2"]),
                                    n("Transpose", [f"{t}2"], [t], perm=[0, 2, 1, 3]))),
        n("Concat", ["past", "k"], ["present"], axis=2), n("Transpose", ["present"], ["kt"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["s"]), n("Softmax", ["s"], ["a"], axis=-1), n("MatMul", ["a", "present"], ["o"])],
        "step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, width]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, heads, "past", dim])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, heads, 1, dim]),
         helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, heads, "total", dim])],
        [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), f"w{t}") for t in "kq"]
        + [numpy_helper.from_array(rng.standard_normal((positions, width)).astype(np.float32), "wpe"),
           numpy_helper.from_array(np.array(2, np.int64), "two"),
           numpy_helper.from_array(np.array([0, 1], np.int64), "axes01"),
           numpy_helper.from_array(np.array([1, 1, heads, dim], np.int64), "heads")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_decoding_step_over_a_cache_of_any_past_length_compiles_once_and_matches_onnx_runtime(tmp_path):
    """The key appended at the past length (a concat at a varying offset) and the position's row
    read at it (a constant folded at each length, held: computed at run time) are integers in the
    kernels' formulas, fitted as the symbol; every past length computes what ONNX Runtime does, a
    short one after a long one too (the bound's buffers, kept between runs, still hold its data)."""
    from conftest import ort_run
    path = _decoder_step_onnx(tmp_path / "step.onnx")
    m = _compile(path, "past=1x2x[1..40]x8")
    assert m.symbols == [{"name": "past", "lo": 1, "hi": 40}] and m.meta["run_time"] == [["pos", "row"]]
    for past_length in (40, 1, 13, 39, 2):
        rng = np.random.default_rng(past_length)
        x, past = rng.standard_normal((1, 1, 16)).astype(np.float32), rng.standard_normal((1, 2, past_length, 8)).astype(np.float32)
        got, want = m.run(x, past), ort_run(path, {"x": x, "past": past})
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"past length {past_length}")


def test_the_points_of_a_range_hold_one_copy_of_the_weights(tmp_path, monkeypatch):
    """The model imported at each sample point of its range: the file is parsed once and every
    constant equal at two points is one array, so the weights are held once, not once per point
    (a 0.84 GB decoder over six points held 12 GiB and took 45 s)."""
    import onnx
    from tuner.compiler.compile_model import input_dims
    from tuner.graph.dynamic import load_range, parse_dynamic
    path = _decoder_step_onnx(tmp_path / "step.onnx", dim=16)
    dyn = parse_dynamic("past=1x2x[1..40]x16", input_dims(str(path)))
    parsed, load = [], onnx.load
    monkeypatch.setattr(onnx, "load", lambda *a, **k: parsed.append(a[0]) or load(*a, **k))
    graphs, _ = load_range(str(path), dyn)
    assert parsed == [str(path)]

    def consts(g):
        return {v.name: v.data for n in g.nodes for v in n.inputs if v.is_const and v.data.size > 16}
    first = consts(graphs[0])
    assert len(graphs) > 2 and len(first) >= 2
    for g in graphs[1:]:
        shared = [name for name, data in consts(g).items() if name in first and data is first[name]]
        assert sorted(shared) == sorted(first)


def test_values_whose_run_time_path_does_not_import_stay_folded_and_the_compile_names_the_constant(tmp_path):
    """y = x + floor(P / 2): the past length P, traced back, would be computed at run time through a
    Floor, which tuner imports only as a constant; the import keeps the last round that imported
    (the run-time pairs its graphs hold, nothing more) and the compile names the constant."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tuner.compiler.compile_model import input_dims
    from tuner.graph.dynamic import load_range, parse_dynamic
    n = helper.make_node
    g = helper.make_graph([
        n("Shape", ["past"], ["shape"]), n("Gather", ["shape", "two"], ["p"], axis=0), n("Cast", ["p"], ["pf"], to=1),
        n("Mul", ["pf", "half"], ["ph"]), n("Floor", ["ph"], ["fl"]), n("Add", ["x", "fl"], ["y"]),
        n("Concat", ["past", "x"], ["present"], axis=2)], "step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 1, 8]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, "past", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 8]),
         helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, 2, "total", 8])],
        [numpy_helper.from_array(np.array([2], np.int64), "two"), numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    path = tmp_path / "floor.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    graphs, run_time = load_range(str(path), parse_dynamic("past=1x2x[1..20]x8", input_dims(str(path))))
    assert graphs and all(sorted(run_time) == gr.meta.get("run_time", []) for gr in graphs), run_time
    with pytest.raises(DynamicError, match="constant .* is not the start of its value at the bounds"):
        _compile(path, "past=1x2x[1..20]x8")


def test_a_plan_of_a_decoding_step_names_what_its_import_computed_at_run_time_so_analyze_finds_its_model(tmp_path):
    """A bucket's plan keeps the pairs its import computed at run time (graph.dynamic.load_range):
    `tuner analyze` imports the model with them and finds the graph the plan was made for."""
    from tuner.analysis.model_report import _graph
    from tuner.database import records
    from tuner.errors import UserError
    from tuner.graph.dynamic import load_at, load_range, parse_dynamic
    from tuner.graph.ir import graph_digest
    from tuner.graph.onnx_frontend import input_dims
    path = str(_decoder_step_onnx(tmp_path / "step.onnx"))
    _, run_time = load_range(path, parse_dynamic("past=1x2x[1..40]x8", input_dims(path)))
    shapes = {"x": [1, 1, 16], "past": [1, 2, 20, 8]}
    graph = load_at(path, shapes, run_time)
    assert run_time == {("pos", "row")} and graph.meta["run_time"] == [("pos", "row")]
    plan = records.make_plan_record(path, graph_digest(graph), "cpu -threads=1", {}, 1e-3, True, shapes=shapes,
                                    dynamic=True, run_time=graph.meta["run_time"])
    plan = records.PlanRecord.from_json(plan.to_json())
    assert graph_digest(_graph(plan, path, None)) == plan.model_hash
    with pytest.raises(UserError, match="is not the model the log's plan was made for"):
        _graph(dataclasses.replace(plan, run_time=()), path, None)


def test_random_inputs_at_one_inputs_shape_give_the_others_the_shapes_its_symbols_say(tmp_path):
    """tuner bench --shapes names the input that carries a symbol; the inputs that share or follow
    it (a mask of seq + 1) take the values it gives, the rest their bounds."""
    m = _compile(_cls_and_mask_onnx(tmp_path / "cls.onnx"), "x=1x[1..12]x4; mask=1x[seq+1]")
    x, mask = m.random_inputs(shapes={"x": [1, 5, 4]})
    assert (x.shape, mask.shape) == ((1, 5, 4), (1, 6))
    assert [a.shape for a in m.random_inputs()] == [(1, 12, 4), (1, 13)]
    assert [a.shape for a in m.run(x, mask)] == [(1, 6)]


def test_one_query_rows_scores_are_a_dot_product_per_key_vectorised_along_the_head(tmp_path):
    """Scores of one row against K read in place (trans_b) are no tiled task, whose vector would
    gather K's rows lane by lane: each key's dot product is vectorised along the head dimension."""
    from conftest import ort_run
    path = _decoder_step_onnx(tmp_path / "step.onnx", dim=32)
    m = _compile(path, "past=1x2x[1..40]x32")
    [scores] = [st for st in m.steps if st.summary.startswith("batch_matmul") and "[1,2,1," in st.workload]
    assert scores.workload_key is None
    body = m.source[m.source.index(f" {scores.func}("):]
    assert "__acc" in body[:body.index("\n}\n")]        # codegen's vector reduction
    rng = np.random.default_rng(0)
    x, past = rng.standard_normal((1, 1, 64)).astype(np.float32), rng.standard_normal((1, 2, 17, 32)).astype(np.float32)
    for g, w in zip(m.run(x, past), ort_run(path, {"x": x, "past": past})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _cnn_onnx(path, seed: int = 0):
    """A small CNN over x [1, 3, h, w] (dim_params): a strided conv, a max pool, a residual block
    with a squeeze-excitation (ReduceMean over the image), a 1x3 conv padded along w only, a
    strided 1x1 conv to 20 channels (not whole blocks), global average pooling and a Gemm. Its
    total stride is 8."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    inits = [w("w1", 8, 3, 3, 3), w("b1", 8), w("w2", 8, 8, 3, 3), w("b2", 8), w("ws", 8, 8, 1, 1), w("w3", 20, 8, 1, 1),
             w("b3", 20), w("fc", 5, 20), w("fcb", 5), w("wr", 8, 8, 1, 3)]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("Relu", ["c1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("Conv", ["p1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             n("ReduceMean", ["c2"], ["m"], axes=[2, 3], keepdims=1), n("Conv", ["m", "ws"], ["e"], kernel_shape=[1, 1]),
             n("Sigmoid", ["e"], ["g"]), n("Mul", ["c2", "g"], ["se"]), n("Add", ["se", "p1"], ["res"]),
             n("Relu", ["res"], ["r2"]),
             n("Conv", ["r2", "wr"], ["row"], kernel_shape=[1, 3], pads=[0, 1, 0, 1]),    # a pad along w only
             n("Conv", ["row", "w3", "b3"], ["c3"], kernel_shape=[1, 1], strides=[2, 2]),
             n("GlobalAveragePool", ["c3"], ["gap"]), n("Flatten", ["gap"], ["flat"]),
             n("Gemm", ["flat", "fc", "fcb"], ["out"], transB=1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 5])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_cnn_compiled_for_image_sizes_in_steps_of_its_stride_matches_onnx_runtime_at_every_size(tmp_path):
    from conftest import ort_run
    path = _cnn_onnx(tmp_path / "cnn.onnx")
    model = _compile(path, "x=1x3x[16..40:8]x[16..40:8]")
    assert model.symbols == [{"name": "h", "lo": 2, "hi": 5, "step": 8}, {"name": "w", "lo": 2, "hi": 5, "step": 8}]
    assert any("K=32," in (s.workload or "") for s in model.steps)         # 20 channels computed as 2 whole blocks
    sizes = [(h, w) for h in range(16, 41, 8) for w in range(16, 41, 8)]
    assert len(sizes) == 16
    for h, w in sizes:
        x = np.random.default_rng(h * 100 + w).standard_normal((1, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(model.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4, err_msg=f"{h}x{w}")
    with pytest.raises(UserError, match=r"input x has 20 in dim 2 \(h\); this model runs h from 16 to 40 in steps of 8: "
                                        "pad or resize the input to a multiple of 8"):
        model.run(np.zeros((1, 3, 20, 16), np.float32))
    with pytest.raises(UserError, match="runs w from 16 to 40 in steps of 8: compile it for a wider range"):
        model.run(np.zeros((1, 3, 16, 48), np.float32))
    assert "dynamic: h from 16 to 40 in steps of 8, w from 16 to 40 in steps of 8" in model.report()


@pytest.mark.parametrize("spec, says", [
    ("x=1x3x[16..40]x[16..40]", r"whole steps.*give its range a step of their total stride, e\.g\. \[224\.\.640:32\]"),
    ("x=1x3x[20..40:8]x[16..40:8]", r"\[20\.\.40:8\] must start and end at multiples of its step, e\.g\. \[24\.\.40:8\]"),
    ("x=1x3x[0..40:8]x[16..40:8]", r"\[0\.\.40:8\] must start at one step or more, e\.g\. \[8\.\.40:8\]"),
])
def test_an_image_size_without_the_step_its_strides_need_is_refused_saying_what_to_write(tmp_path, spec, says):
    path = _cnn_onnx(tmp_path / "cnn.onnx")
    with pytest.raises(UserError, match=says):
        _compile(path, spec)


def test_a_range_in_steps_reads_back_as_written():
    from tuner.graph.dynamic import parse_dynamic
    dyn = parse_dynamic("x=1x3x[224..640:32]x[224..640:32]", {"x": [1, 3, "h", "w"]})
    assert [(s.name, s.lo, s.hi, s.step) for s in dyn.symbols] == [("h", 7, 20, 32), ("w", 7, 20, 32)]
    assert dyn.spec() == {"x": [1, 3, ["h", 224, 640, 32], ["w", 224, 640, 32]]}
    assert parse_dynamic(dyn.spec(), {"x": [1, 3, "h", "w"]}) == dyn
    assert dyn.shapes({"_dyn0": 7, "_dyn1": 20}) == {"x": [1, 3, 224, 640]}
    assert parse_dynamic({"x": [1, 3, (224, 640, 32), (224, 640, 32)]}, {"x": [1, 3, "h", "w"]}) == dyn


def _winograd_cnn_onnx(path, seed: int = 0):
    """x [1, 16, h, w] through three 3x3 convs of 16 channels, each half the size of the one
    before (max pools between), then global average pooling."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), f"{p}{k}")
             for k in range(3) for p, s in (("w", (16, 16, 3, 3)), ("b", (16,)))]
    n = helper.make_node
    nodes, x = [], "x"
    for k in range(3):
        nodes += [n("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name=f"conv{k}"),
                  n("Relu", [f"c{k}"], [f"r{k}"])]
        x = f"r{k}"
        if k < 2:
            nodes.append(n("MaxPool", [x], [f"p{k}"], kernel_shape=[2, 2], strides=[2, 2]))
            x = f"p{k}"
    nodes.append(n("GlobalAveragePool", [x], ["out"]))
    g = helper.make_graph(nodes, "wino", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, "h", "w"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16, 1, 1])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_dynamic_cnns_winograd_convs_take_the_largest_tile_whole_at_every_size_and_match_onnx_runtime(tmp_path):
    """At [28..56:4] the convs see 4n, 2n and n: F(4x4) whole at every size for the first, F(2x2)
    for the second where the bound's default is F(4x4), none for the third (n may be odd)."""
    from conftest import ort_run
    path = _winograd_cnn_onnx(tmp_path / "wino.onnx")
    model = _compile(path, "x=1x16x[28..56:4]x[28..56:4]")
    plan = model.meta["layout_plan"]
    assert sorted(v.split("@")[0] for v in plan.values()) == ["winograd2", "winograd4"], plan
    for h, w in ((28, 28), (56, 56), (32, 44), (44, 36), (52, 28)):
        x = np.random.default_rng(h * 100 + w).standard_normal((1, 16, h, w)).astype(np.float32)
        np.testing.assert_allclose(model.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4, err_msg=f"{h}x{w}")


def test_a_winograd_gemm_skips_the_tiles_of_rows_past_the_runs_tile_columns_and_matches_at_every_size(
        tmp_path, monkeypatch):
    """The GEMM's tiles lie in rows of the bound's 32 tile columns (128 / 4), the run's 2n of them
    first: its tile loop of 16 rows skips a tile wholly past them (a test of the row modulo 32 against 2n),
    and every size computes what ONNX Runtime does. The third conv sees 2n, n from 4 to 16: whole
    4s at every sample point of the fit (all even), not at every size, so F(2x2)."""
    import tuner.task
    from tuner.schedule import ir
    from tuner.te.expr import Cmp, FloorMod, free_vars
    from conftest import ort_run
    lowered = []
    real = tuner.task.lower
    monkeypatch.setattr(tuner.task, "lower", lambda *a, **k: lowered.append(real(*a, **k)) or lowered[-1])
    path = _winograd_cnn_onnx(tmp_path / "wino.onnx")
    for threads in (1, 2):          # at 2, the tile loop fused into the parallel loop: the test on its part
        lowered.clear()
        model = _compile(path, "x=1x16x[32..128:8]x[32..128:8]", threads)
        assert [model.meta["layout_plan"][f"conv{k}"].split("@")[0] for k in range(3)] == \
            ["winograd4", "winograd4", "winograd2"]
        assert any(isinstance(x, ir.IfThen) and any(isinstance(n, Cmp) and n.op == "<=" and "_dyn1" in free_vars(n.a)
                                                    and any(isinstance(m, FloorMod) for m in walk(n.b)) for n in walk(x.cond))
                   for f in lowered for x in ir.stmts(f.body)), \
            f"no GEMM skips the tiles past the run's columns (2n <= the tile's start modulo 32) at {threads} threads"
        for h, w in ((32, 32), (128, 128), (40, 96), (72, 48), (120, 32)):
            x = np.random.default_rng(h * 100 + w).standard_normal((1, 16, h, w)).astype(np.float32)
            np.testing.assert_allclose(model.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4,
                                       err_msg=f"{h}x{w}, {threads} threads")


def test_a_plan_given_to_a_dynamic_cnn_takes_the_winograd_tiles_its_sizes_allow(tmp_path, capsys):
    from conftest import ort_run
    path = _winograd_cnn_onnx(tmp_path / "wino.onnx")
    import importlib
    compile_model = importlib.import_module("tuner.compiler.compile_model").compile_model
    model = compile_model(str(path), threads=1, dynamic="x=1x16x[28..56:4]x[28..56:4]",
                          layout_plan={"conv1": "winograd4@NCHW16c", "conv2": "winograd2@NCHW16c"}, progress=print)
    assert model.meta["layout_plan"] == {"conv1": "winograd2@NCHW16c"}
    assert "Winograd tiles the outputs are whole multiples of at every size" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((1, 16, 44, 36)).astype(np.float32)
    np.testing.assert_allclose(model.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4)
