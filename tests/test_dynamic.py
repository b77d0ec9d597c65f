"""Dynamic kernels (issue 37): buffers laid out at the symbols' bounds, loops that stop at the run's
extents. A schedule tuned at one value of a symbol, replayed on the kernel for its range, computes
what the static workload at any value in the range computes, and never touches the padding."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TARGET1
from tuner.measure.builder import build_batch
from tuner.measure.worker import check_output
from tuner.ops import make
from tuner.task import Task
from tuner.te.dynamic import DynamicError, Symbol, symbol_var
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
    inputs in buffers of the bound shape whose padding is NaN, the output buffer NaN before."""
    from tuner.te.dynamic import evaluate
    wl = make(op, {**fixed, **{p: evaluate(e, values) for p, e in symbolic.items()}})
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
    problem = check_output(out[inside], ref, 1e-3, 1e-4)
    assert not problem, f"at {values}: {problem}"
    outside = np.ones(out.shape, bool)
    outside[inside] = False
    assert np.isnan(out[outside]).all(), f"at {values}: the kernel wrote the padding beyond the run's extents"


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


@pytest.mark.parametrize("params, symbolic, says", [
    (dict(C=4, K=4, W=8, R=3, S=3, pad=1), "H", "depends on the value"),           # the pad's border moves
    (dict(C=4, K=4, W=8, R=3, S=3, stride=2), "H", "multilinear|whole steps"),      # the rows halve
    (dict(C=4, K=4, W=8, R=3, S=3), "H", "narrow the range"),                       # H - 2 rows at H = 1
])
def test_kernels_whose_computation_is_not_a_bounded_loop_over_the_symbol_are_refused(params, symbolic, says):
    task = Task(make("conv2d", {**params, symbolic: 16}), TARGET1)
    with pytest.raises(DynamicError, match=says):
        task.dynamic_dims({symbolic: symbol_var(0)}, (Symbol("h", 1, 16),))


def test_a_symbolic_parameter_must_take_the_workloads_value_at_the_bound():
    task = Task(make("dense", dict(N=8, C=16, K=16)), TARGET1)
    with pytest.raises(DynamicError, match="not its value at the symbols' bounds"):
        task.dynamic_dims({"N": symbol_var(0)}, (Symbol("rows", 1, 9),))
    with pytest.raises(DynamicError, match="no parameter"):
        task.dynamic_dims({"Q": symbol_var(0)}, (Symbol("rows", 1, 8),))
