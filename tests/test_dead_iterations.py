"""Reduction iterations that read only padding are skipped (schedule.peel.skip_dead_iterations)."""
import itertools
import math

import numpy as np
import pytest
from conftest import TARGET1, check_schedules
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tuner.ops import make
from tuner.schedule import ir
from tuner.schedule.lower import lower
from tuner.schedule.peel import BODY_OPS, DEAD_SHARE, dead_share, skip_dead_iterations
from tuner.space.sketch import PADDING_SHARE, SearchSpace
from tuner.target import parse_target
from tuner.te import expr as E
from tuner.te.expr import Cmp, Const, Load, Select, Var, all_of, free_vars


def _value(e, env, bufs):
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Load):
        return bufs[e.buffer][tuple(_value(i, env, bufs) for i in e.indices)]
    if isinstance(e, Select):                       # lazy: a failed test's read may be out of bounds
        return _value(e.then if _value(e.cond, env, bufs) else e.other, env, bufs)
    if isinstance(e, Cmp):
        a, b = _value(e.a, env, bufs), _value(e.b, env, bufs)
        return {"<": a < b, "<=": a <= b, "==": a == b}[e.op]
    if isinstance(e, E.And):
        return _value(e.a, env, bufs) and _value(e.b, env, bufs)
    ops = {E.Add: lambda a, b: a + b, E.Sub: lambda a, b: a - b, E.Mul: lambda a, b: a * b,
           E.FloorDiv: lambda a, b: a // b, E.FloorMod: lambda a, b: a % b, E.Max: max, E.Min: min}
    return ops[type(e)](_value(e.a, env, bufs), _value(e.b, env, bufs))


def _run(s, env, bufs, counts):
    """Runs a small IR nest on `bufs` ({name: {index: value}}); counts[0]: the stores made."""
    if isinstance(s, ir.Seq):
        for x in s.stmts:
            _run(x, env, bufs, counts)
    elif isinstance(s, ir.For):
        for v in range(s.extent):
            _run(s.body, {**env, s.var: v}, bufs, counts)
    elif isinstance(s, ir.IfThen):
        if _value(s.cond, env, bufs):
            _run(s.body, env, bufs, counts)
    else:
        counts[0] += 1
        bufs[s.buffer][tuple(_value(i, env, bufs) for i in s.indices)] = _value(s.value, env, bufs)


def _tap_nest(out, taps, dilation, pad, size, op, other, channels=2):
    """acc[o] = acc[o] op (x at o + r*d - pad, padded by `other`) * w[r, c]: a dilated 1-D conv's loops."""
    o, r, c = Var("o"), Var("r"), Var("c")
    at = o + r * Const(dilation)
    read = Select(all_of(Cmp("<=", Const(pad), at), Cmp("<", at, Const(size + pad))),
                  Load("x", (at - Const(pad), c)), Const(other))
    acc = Load("acc", (o,))
    value = E.Add(acc, E.Mul(read, Load("w", (r, c)))) if op == "add" else E.Max(acc, read)
    update = ir.Store("acc", (o,), value)
    body = ir.For("o", out, ir.seq([ir.Store("acc", (o,), Const(0.0 if op == "add" else -math.inf)),
                                    ir.For("r", taps, ir.For("c", channels, update))]))
    return ir.Func("f", [], [], body, {})


@settings(max_examples=150, deadline=None)
@given(out=st.integers(1, 14), taps=st.integers(1, 5), dilation=st.integers(1, 12), pad=st.integers(0, 14),
       size=st.integers(1, 14), op=st.sampled_from(["add", "max"]), identity=st.booleans(),
       channels=st.sampled_from([2, BODY_OPS]), seed=st.integers(0, 99))
@example(out=14, taps=3, dilation=2, pad=2, size=14, op="add", identity=True, channels=BODY_OPS, seed=0)  # 4 dead
@example(out=14, taps=3, dilation=1, pad=1, size=14, op="add", identity=True, channels=BODY_OPS, seed=0)  # 2 dead
def test_a_loop_whose_iterations_add_nothing_is_skipped_where_they_read_padding_and_stores_the_same(
        out, taps, dilation, pad, size, op, identity, channels, seed):
    """A sum (padding 0) or a max (padding -inf) over taps that read padding for some outputs: the
    same results after the pass, with exactly the live taps' updates run where at least
    DEAD_SHARE of the (output, tap) pairs read only padding, or, in a body of BODY_OPS updates, where
    the dead pairs number at least the taps; padded by anything else, nothing is skipped."""
    other = (0.0 if op == "add" else -math.inf) if identity else 1.5
    func = _tap_nest(out, taps, dilation, pad, size, op, other, channels)
    rng = np.random.default_rng(seed)
    x = {(i, c): float(rng.integers(-9, 9)) for i in range(size) for c in range(channels)}
    w = {(r, c): float(rng.integers(-9, 9)) for r in range(taps) for c in range(channels)}
    results = []
    for f in (func, skip_dead_iterations(func)):
        bufs, counts = {"x": x, "w": w, "acc": {}}, [0]
        _run(f.body, {}, bufs, counts)
        results.append((bufs["acc"], counts[0]))
    (want, ran), (got, ran_after) = results
    assert len(want) == out and got == want
    live = sum(pad <= o + r * dilation < size + pad for o in range(out) for r in range(taps))
    dead = 1 - live / (out * taps)
    tests = [s for s in ir.stmts(skip_dead_iterations(func).body) if isinstance(s, ir.IfThen)]
    if identity and (dead >= DEAD_SHARE or (channels >= BODY_OPS and 0 < out * taps - live and out * taps - live >= taps)):
        assert ran_after == out + channels * live and tests
    else:
        assert ran_after == ran == out + channels * out * taps and not tests


@settings(max_examples=200, deadline=None)
@given(coefs=st.lists(st.lists(st.integers(-5, 5), min_size=5, max_size=5), min_size=1, max_size=3),
       consts=st.lists(st.integers(-12, 12), min_size=3, max_size=3), ops=st.lists(st.sampled_from(["<", "<="]),
                                                                                 min_size=3, max_size=3),
       extents=st.lists(st.integers(1, 9), min_size=3, max_size=3))
def test_the_dead_share_of_linear_tests_is_the_share_of_loop_values_where_one_fails(coefs, consts, ops, extents):
    """Tests linear in three loops and in a fused loop's `a / 2` and `b % 3` (a parallel loop's
    row and column of tiles)."""
    names = ["a", "b", "c"]
    terms = [Var("a"), Var("b"), Var("c"), E.FloorDiv(Var("a"), Const(2)), E.FloorMod(Var("b"), Const(3))]
    tests = [Cmp(op, sum((t * Const(k) for t, k in zip(terms, row)), Const(k0)), Const(0))
             for row, k0, op in zip(coefs, consts, ops)]
    ranges = {n: (0, e - 1) for n, e in zip(names, extents)}
    points = list(itertools.product(*(range(e) for e in extents)))
    fails = sum(not all(_value(t, dict(zip(names, p)), {}) for t in tests) for p in points)
    assert points and dead_share(tests, ranges) == pytest.approx(fails / len(points))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_dilated_conv_on_a_small_image_skips_its_kernel_rows_that_read_only_padding(isa, threads):
    """Dilation 4 at 6x6, padded 4: 69% of the products read padding, so on either ISA the default
    inlines the pad, and the border tiles test each kernel row before the loops over channels (at
    2 threads, a row of the fused parallel loop's); the kernel computes the reference. A 3x3 conv
    at 56x56 keeps its padded copy on AVX2."""
    wl = make("conv2d", dict(C=16, H=6, W=6, K=32, R=3, S=3, pad=4, dilation=4, bias=1, relu=1), "NCHW16c")
    target = parse_target(f"cpu -isa={isa} -threads={threads}", check_host=False)
    space = SearchSpace(wl, target)
    assert space._padding_share >= PADDING_SHARE
    dec = space.default()
    assert dec["pad"] == {p: "interior" for p in space.pads}
    func = lower(space.schedule(space.steps(dec)))
    skips = [s for s in ir.stmts(func.body) if isinstance(s, ir.For) and s.var.startswith("rh")
             and isinstance(s.body, ir.IfThen) and s.var in free_vars(s.body.cond)]
    assert skips
    if isa == "avx2" or TARGET1.isa == "avx512":
        check_schedules([(wl, space.steps(dec))], target)
    wide = SearchSpace(make("conv2d", dict(C=64, H=56, W=56, K=64, R=3, S=3, pad=1), "NCHW16c"),
                       parse_target("cpu -isa=avx2 -threads=1", check_host=False))
    assert wide._padding_share < PADDING_SHARE and wide.default()["pad"] == {p: "root" for p in wide.pads}
