"""Guard peeling and unswitching: loops whose bounds tests hold for most of their iterations run
in a version without them.

Peeling: a serial loop whose guards hold for a prefix of its range runs as two loops.

A tile that does not divide its axis (six rows of a 128-row GEMM) leaves a bounds check on every
statement of the tile; inside a register tile the check stops GCC from keeping the accumulators
in registers. Where every check the loop's variable enters holds for all of its first `p`
iterations (whatever the other loops' values), the loop becomes one of `p` iterations in which
those checks are gone and one of the rest that keeps them, as TVM's LoopPartition does.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..te.dynamic import SYMBOL_PREFIX, every_value
from ..te.expr import (Add, And, Cast, Cmp, Const, Div, FloorDiv, FloorMod, Load, Max, Min, Mul, Select, Sub, Var, all_of,
                       bounds, free_vars, from_linear, linear, simplify, substitute, transform, walk)
from . import ir

_PEELED = ("serial",)        # loops bound to threads, unrolled or vectorised keep their single form


def peel_guards(func: ir.Func) -> ir.Func:
    if not func.symbols and not any(isinstance(s, ir.IfThen) for s in ir.stmts(func.body)):
        return func
    return dataclasses.replace(func, body=_peel(func.body, {}))


def _peel(s: ir.Stmt, ranges: dict, peel: bool = True) -> ir.Stmt:
    """`s` with its loops peeled, outermost first, and the guards the ranges decide removed;
    `ranges`: var -> (lo, hi) of the loops around. A remainder is not peeled again, so k guarded
    loops make at most k + 1 copies of a body, not 2^k."""
    if isinstance(s, ir.Seq):
        return ir.seq([_peel(x, ranges, peel) for x in s.stmts])
    if isinstance(s, ir.IfThen):
        cond = simplify(s.cond, ranges)
        if isinstance(cond, Const):
            return _peel(s.body, ranges, peel) if cond.value else ir.Seq([])
        return ir.IfThen(cond, _peel(s.body, ranges, peel))
    if isinstance(s, ir.Allocate):
        return dataclasses.replace(s, body=_peel(s.body, ranges, peel))
    if not isinstance(s, ir.For):
        return s
    if s.kind == "vectorize" and s.limit is None and (q := _live_extent(s, ranges)) is not None and q < s.extent:
        if q == 0:
            return ir.Seq([])
        s = dataclasses.replace(s, extent=q)
    inner = {**ranges, s.var: (0, s.extent - 1)}
    if peel and s.kind == "parallel" and (split := _split_parallel(s, inner)) is not None:
        return split
    if peel and s.kind in _PEELED and _symbolic_guards(s):
        return _peel_symbolic(s, inner)
    p = _true_prefix(s, inner) if peel and s.kind in _PEELED else None
    if p is None or not 0 < p < s.extent:
        return dataclasses.replace(s, body=_peel(s.body, inner, peel))
    # a run-time trip count (a dynamic kernel's tile loop over guards at the bound) runs up to p of
    # its iterations unguarded, then what is left of it, if any
    lim = s.limit
    main = dataclasses.replace(s, extent=p, body=_peel(s.body, {**ranges, s.var: (0, p - 1)}),
                               limit=None if lim is None else simplify(Min(lim, Const(p))))
    if s.extent - p == 1:
        rest = _peel(_substitute(s.body, {s.var: Const(p)}), ranges, False)
        if lim is not None:
            rest = ir.IfThen(Cmp("<", Const(p), lim), rest)
    else:
        body = _substitute(s.body, {s.var: Var(s.var) + Const(p)})
        rest = dataclasses.replace(s, extent=s.extent - p, limit=None if lim is None else simplify(lim - Const(p)),
                                   body=_peel(body, {**ranges, s.var: (0, s.extent - p - 1)}, False))
    return ir.seq([main] + ([rest] if any(isinstance(x, ir.Store) for x in ir.stmts(rest)) else []))


# A parallel loop runs its iterations on several threads, in no order, so it is not cut in two:
# each iteration tests once whether its tile is whole (every guard on the loop's variable holds
# for all values of the loops inside it, _worst_case) and runs a copy without those guards if so.
# A guarded tile axis fused into the parallel loop (tile index = fused / n % m) is split this way.

def _split_parallel(s: ir.For, ranges: dict) -> ir.Stmt | None:
    guards = dict.fromkeys(c for st in ir.stmts(s.body) if isinstance(st, ir.IfThen) for c in _conjuncts(st.cond)
                           if s.var in free_vars(c))
    gone, interior = _interior(guards, _loop_ranges(s.body), ranges)
    if not interior:
        return None
    cond = all_of(*interior)
    whole, part = _peel(_drop(s.body, gone), ranges), _peel(_pin(s.body, interior, ranges), ranges)
    return dataclasses.replace(s, body=ir.seq([ir.IfThen(cond, whole), ir.IfThen(Cmp("==", cond, Const(0)), part)]))


def _pin(body: ir.Stmt, interior: list, ranges: dict) -> ir.Stmt:
    """`body` where one whole-tile test, increasing in one term (the tile index `f % tiles`),
    fails: that term at the one value its range leaves then (the last tile) wherever it occurs,
    so the partial tile's own guards become constant bounds (_live_extent)."""
    if len(interior) != 1 or (ln := _difference(interior[0])) is None or len(ln[0]) != 1:
        return body
    ((term, coef),), const = ln[0].items(), ln[1]
    b = bounds(term, ranges)
    if coef <= 0 or b is None:
        return body
    # coef*t + const < 0 (<= 0) fails: t >= ceil(-const / coef) (t > -const / coef)
    low = -(const // coef) if interior[0].op == "<" else -const // coef + 1
    if max(low, b[0]) != b[1]:
        return body
    return _replace(body, lambda e: transform(simplify(e, ranges), lambda n: Const(b[1]) if n == term else None))


def _replace(s: ir.Stmt, fn, bound=()) -> ir.Stmt:
    """`s` with `fn` applied to every expression in it, except under a loop that rebinds a name in
    `bound` (the names `fn` replaces: inside such a loop they are not ours)."""
    if isinstance(s, ir.Store):
        return ir.Store(s.buffer, tuple(fn(i) for i in s.indices), fn(s.value))
    if isinstance(s, ir.IfThen):
        return ir.IfThen(fn(s.cond), _replace(s.body, fn, bound))
    if isinstance(s, ir.Seq):
        return ir.Seq([_replace(x, fn, bound) for x in s.stmts])
    if isinstance(s, ir.For) and s.var in bound:
        return s
    if isinstance(s, ir.For) and s.limit is not None:       # a run-time trip count reads the loops around
        return dataclasses.replace(s, body=_replace(s.body, fn, bound), limit=fn(s.limit))
    if isinstance(s, (ir.For, ir.Allocate)):
        return dataclasses.replace(s, body=_replace(s.body, fn, bound))
    return s


# A dynamic kernel's guards compare with the run's extents (te.dynamic): the prefix of a loop where
# they hold is an expression, evaluated each time the loop starts (of the symbols and the loops
# around it). The first version runs that many iterations without the guards it was computed
# from, the second the rest with them.

def _symbolic_guards(loop: ir.For) -> bool:
    """Whether a guard, or in a loop over a run's extent a select's test, on `loop`'s variable
    compares with a symbol (a run's extent)."""
    return any(loop.var in free_vars(c) and any(n.startswith(SYMBOL_PREFIX) for n in free_vars(c))
               for c in _tests(loop))


def _tests(loop: ir.For):
    """The conjuncts of the guards in `loop`'s body, and of its selects' tests where the loop runs
    to a run-time trip count (a tile loop over a dynamic dim; a kernel row's 3 taps, cut at run
    time, ran a grouped conv's border 7% slower than with the test), in order."""
    for st in ir.stmts(loop.body):
        if isinstance(st, ir.IfThen):
            yield from _conjuncts(st.cond)
        elif isinstance(st, ir.Store) and loop.limit is not None:
            for n in walk(st.value):
                if isinstance(n, Select):
                    yield from _conjuncts(n.cond)


def _peel_symbolic(s: ir.For, ranges: dict) -> ir.Stmt:
    inner = _loop_ranges(s.body)
    prefixes, gone = [], set()
    for c in _tests(s):
        if s.var in free_vars(c) and c not in gone:
            q = _symbolic_prefix(c, s.var, inner)
            if q is not None:
                gone.add(c)
                if q not in prefixes:
                    prefixes.append(q)
    body = _peel(s.body, ranges)
    if not prefixes:
        return dataclasses.replace(s, body=body)
    trips = s.limit if s.limit is not None else Const(s.extent)
    p = prefixes[0]
    for q in prefixes[1:]:
        p = Min(p, q)
    p = simplify(Max(Const(0), Min(p, trips)))
    main = dataclasses.replace(s, limit=p, body=_peel(_set_true(_drop(s.body, gone), gone), ranges))
    rest = dataclasses.replace(s, limit=simplify(trips - p), body=_substitute(s.body, {s.var: Var(s.var) + p}))
    return ir.seq([main, rest])


def _symbolic_prefix(c, var: str, inner: dict):
    """For a guard `a < b` / `a <= b` increasing in `var`, linear in it and in the loops inside
    (`inner`), whatever else it holds (symbols, loops around): the expression p such that it holds
    for var < p and every value of the inner loops; None for any other guard."""
    ln = _difference(c)
    if ln is None:
        return None
    terms, const = ln
    coef = terms.get(Var(var), 0)
    if coef <= 0:
        return None
    others = {t: k for t, k in terms.items() if t != Var(var)}
    if any(var in free_vars(t) for t in others) or (parts := _by_loops(others, inner)) is None:
        return None
    own, fixed = parts
    b = _span(own, inner)
    if b is None:
        return None
    # coef*v + fixed + const + own < 0 for every own: v <= (-fixed - const - own_hi - 1) // coef
    top = from_linear({t: -k for t, k in fixed.items()}, -const - b[1] - (1 if c.op == "<" else 0))
    return FloorDiv(top, Const(coef)) + Const(1)


def _span(terms: dict, ranges: dict):
    """The bounds of a sum of terms times their coefficients; a select (a Winograd tap's offset in
    its tile, by tap and row) spans both its sides."""
    def one(e):
        if isinstance(e, Select):
            a, b = one(e.then), one(e.other)
            return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
        return bounds(e, ranges)
    lo = hi = 0
    for t, k in terms.items():
        if (b := one(t)) is None:
            return None
        lo, hi = lo + min(k * b[0], k * b[1]), hi + max(k * b[0], k * b[1])
    return lo, hi


def _by_loops(terms: dict, inner: dict):
    """(the terms over the `inner` loops only, the others), or None where a term mixes the two."""
    own, rest = {}, {}
    for t, k in terms.items():
        names = free_vars(t)
        if names & inner.keys():
            if not names <= inner.keys():
                return None
            own[t] = k
        else:
            rest[t] = k
    return own, rest


def _drop(s: ir.Stmt, gone: set) -> ir.Stmt:
    """`s` with the guard conjuncts in `gone` removed."""
    if isinstance(s, ir.IfThen):
        rest = [c for c in _conjuncts(s.cond) if c not in gone]
        body = _drop(s.body, gone)
        return ir.IfThen(all_of(*rest), body) if rest else body
    if isinstance(s, ir.Seq):
        return ir.Seq([_drop(x, gone) for x in s.stmts])
    if isinstance(s, (ir.For, ir.Allocate)):
        return dataclasses.replace(s, body=_drop(s.body, gone))
    return s


def _true_prefix(loop: ir.For, ranges: dict) -> int | None:
    """The iterations 0..p-1 of `loop` for which every guard on its variable holds, whatever the
    other loops' values; None when no guard depends on it."""
    var, p = loop.var, None
    inner = _loop_ranges(loop.body, dict(ranges))
    for st in ir.stmts(loop.body):
        if not isinstance(st, ir.IfThen):
            continue
        for c in _conjuncts(st.cond):
            if var not in free_vars(c):
                continue
            q = _prefix(c, var, inner)
            if q is not None:
                p = q if p is None else min(p, q)
    return p


# A vectorised loop whose every store is guarded by a test that fails from some iteration on,
# whatever the other loops' values (the last, partial column tile of a GEMM: 48 lanes under
# `n + 192 < 200`), runs only up to there: its guard then folds away and the loop is vectorised,
# where the guard on the lane had sent all 48 lanes to a scalar loop under `omp simd`.

def _live_extent(loop: ir.For, ranges: dict) -> int | None:
    """The iterations of `loop` before the last point from which each store's guards fail; None
    when a store is not so guarded."""
    var, inner, ends = loop.var, _loop_ranges(loop.body, dict(ranges)), []

    def visit(st, conds):
        if isinstance(st, ir.Store):
            ends.append(min((q for c in conds if (q := _dead_from(c, var, inner)) is not None), default=None))
        elif isinstance(st, ir.IfThen):
            visit(st.body, conds + list(_conjuncts(st.cond)))
        elif isinstance(st, ir.Seq):
            for x in st.stmts:
                visit(x, conds)
        elif isinstance(st, (ir.For, ir.Allocate)):
            visit(st.body, conds)
        else:
            ends.append(None)
    visit(loop.body, [])
    return None if not ends or None in ends else max(ends)


def _dead_from(c, var: str, ranges: dict) -> int | None:
    """For an increasing-in-`var` guard `a < b` or `a <= b`: the first value of `var` from which it
    fails for every value of the other variables; None for any other guard."""
    if (form := _in_var(c, var, ranges)) is None:
        return None
    coef, const, (lo, _) = form
    # coef*v + const + rest >= 0 (> 0 for <=) for every rest once coef*v >= -const - lo (+ 1)
    need = -const - lo + (1 if c.op == "<=" else 0)
    return max(0, -(-need // coef))


def _loop_ranges(body: ir.Stmt, out: dict | None = None) -> dict:
    """`out` (or {}) with the ranges of the loops inside `body`; a name bound twice: the wider range."""
    out = {} if out is None else out
    for st in ir.stmts(body):
        if isinstance(st, ir.For):
            out[st.var] = (0, max(st.extent - 1, out.get(st.var, (0, 0))[1]))
    return out


def _conjuncts(c):
    if isinstance(c, And):
        yield from _conjuncts(c.a)
        yield from _conjuncts(c.b)
    else:
        yield c


def _difference(c):
    """linear(a - b) of a test `a < b` or `a <= b`; None for any other test or a non-linear one."""
    if not isinstance(c, Cmp) or c.op not in ("<", "<="):
        return None
    return linear(c.a - c.b)


def _prefix(c, var: str, ranges: dict) -> int | None:
    """For `a < b` or `a <= b` increasing-in-`var` guards: how many of var's first values satisfy
    it for every value of the other variables (0 when none does); None for any other guard."""
    if (form := _in_var(c, var, ranges)) is None:
        return None
    coef, const, (_, hi) = form
    # coef*v + const + rest < 0 (or <= 0) for every rest: v <= (-const - hi - 1) // coef (or without the -1)
    limit = -const - hi - (1 if c.op == "<" else 0)
    return max(0, limit // coef + 1)


def _in_var(c, var: str, ranges: dict) -> tuple | None:
    """(coef, const, bounds of the rest) of a guard `coef*var + const + rest < 0` (or <= 0) with
    coef > 0 and the rest free of `var`; None for any other guard."""
    ln = _difference(c)
    if ln is None:
        return None
    terms, const = ln
    coef = terms.get(Var(var), 0)
    if coef <= 0 or any(var in free_vars(t) for t in terms if t != Var(var)):
        return None
    rest = bounds(from_linear({t: k for t, k in terms.items() if t != Var(var)}, 0), ranges)
    return None if rest is None else (coef, const, rest)


def _substitute(s: ir.Stmt, mapping: dict) -> ir.Stmt:
    return _replace(s, lambda e: substitute(e, mapping), mapping)


# ------------------------------------------------------------ unswitching
# An inlined pad reads `cond ? x[i] : 0` in the innermost loop; for the output tiles away from the
# border every such test holds for every iteration of the tile's nest. An Unswitch nest (the
# unswitch pragma) becomes `if (interior) nest-without-those-tests else nest`, the interior test
# being each test's worst case over the nest's own loops, evaluated once per entry, as Halide and
# TVM's LoopPartition split a loop at its boundary conditions.

def unswitch(func: ir.Func) -> ir.Func:
    if not any(isinstance(s, ir.Unswitch) for s in ir.stmts(func.body)):
        return func
    return dataclasses.replace(func, body=_unswitch(func.body, {}))


def _unswitch(s: ir.Stmt, ranges: dict) -> ir.Stmt:
    if isinstance(s, ir.Unswitch):
        return _split_interior(_unswitch(s.body, ranges), ranges)
    if isinstance(s, ir.Seq):
        return ir.seq([_unswitch(x, ranges) for x in s.stmts])
    if isinstance(s, ir.For):
        return dataclasses.replace(s, body=_unswitch(s.body, {**ranges, s.var: (0, s.extent - 1)}))
    if isinstance(s, (ir.IfThen, ir.Allocate)):
        return dataclasses.replace(s, body=_unswitch(s.body, ranges))
    return s


def _split_interior(body: ir.Stmt, outer: dict, symbolic: bool = False) -> ir.Stmt:
    """`body` as `if (interior) clean else body`: `clean` has every select test that holds for all
    values of body's own loops wherever `interior` (a test of the loops around) holds, set true.
    In a dynamic kernel the border version is split again on its tests against the run's extent
    (`symbolic`): a tile on the top border runs without the bottom's tests where it is clear of
    the bottom (a parallel loop's tiles, unlike a serial loop's, are not cut at the run's extent)."""
    tests = {c for st in ir.stmts(body) if isinstance(st, ir.Store)
             for n in walk(st.value) if isinstance(n, Select) for c in _conjuncts(n.cond)
             if not symbolic or any(v.startswith(SYMBOL_PREFIX) for v in free_vars(c))}
    gone, interior = _interior(sorted(tests, key=repr), _loop_ranges(body), outer)   # a stable order
    if not gone:
        return body
    clean = _set_true(body, gone)
    if not interior:
        return clean
    cond = all_of(*interior)
    border = body if symbolic else _split_interior(body, outer, True)
    return ir.seq([ir.IfThen(cond, clean), ir.IfThen(Cmp("==", cond, Const(0)), border)])


def _interior(tests, inner: dict, outer: dict) -> tuple:
    """(the `tests` that hold for every value of the `inner` loops wherever the interior holds,
    the interior: their worst cases over those loops, tests of the `outer` ones, in the order of
    `tests`: the same code for the same schedule)."""
    gone, interior = set(), []
    for c in tests:
        test = _worst_case(c, inner)
        if test is None:
            continue
        test = simplify(test, outer)
        if isinstance(test, Const):
            if test.value:               # holds everywhere already
                gone.add(c)
            continue                     # fails for every entry: the clean version could never run
        gone.add(c)
        if test not in interior:
            interior.append(test)
    return gone, interior


def _worst_case(c, inner: dict):
    """For a test `a < b` / `a <= b` linear in the loop variables, the test on the outer variables
    alone under which it holds for every value of the `inner` ones; None when it mixes the two in
    one term or is of another form, or is decided by the outer loops alone (the C compiler hoists it)."""
    return _case(c, inner, worst=True)


def _case(c, inner: dict, worst: bool):
    """_worst_case, or (not worst) _best_case."""
    ln = _difference(c)
    if ln is None or (parts := _by_loops(ln[0], inner)) is None:
        return None
    own, rest = parts
    if worst and not own:
        return None
    b = bounds(from_linear(own, 0), inner) if own else (0, 0)
    if b is None:
        return None
    return Cmp(c.op, from_linear(rest, ln[1] + b[1 if worst else 0]), Const(0))


def _set_true(s: ir.Stmt, gone: set) -> ir.Stmt:
    def fix(e):
        if isinstance(e, Select):
            rest = [c for c in _conjuncts(e.cond) if c not in gone]
            return Select(all_of(*rest), e.then, e.other) if rest else e.then
        return None
    if isinstance(s, ir.Store):
        return ir.Store(s.buffer, s.indices, transform(s.value, fix))
    if isinstance(s, ir.Seq):
        return ir.Seq([_set_true(x, gone) for x in s.stmts])
    if isinstance(s, (ir.For, ir.IfThen, ir.Allocate)):
        return dataclasses.replace(s, body=_set_true(s.body, gone))
    return s


# ------------------------------------------------------------ dead reduction iterations
# A border tile reads an inlined pad as `acc = acc + (cond ? x : 0) * w`. Where a test of `cond`
# fails for every value of the loops inside a reduction loop (a kernel row above the image for
# this output row; a dilated conv's outer taps at a small image: most of them), those iterations
# add nothing: the loop's body runs under that test's best case over the loops inside, as ONNX
# Runtime's NCHWc convs skip the kernel rows outside the image.

# Skipped where at least DEAD_SHARE of the loop's iterations are dead, or, in a body of BODY_OPS
# vector operations or more, where they add up to a whole run of the loop or more over the
# values of the loops around (a 3x3 conv padded by 1 has 2 dead kernel rows, above the first
# output row and below the last, never skipped; padded by 2 at dilation 2, 4). Fewer: the weights
# a skipped iteration reads, the next output row reads anyway, and the gaps in the first, cold
# sweep of a weight panel cost more than they save (ResNet-50's 3x3 convs at 7x7: 1.16x slower
# in the model); a depthwise conv's body (a kernel row: 5 to 7 vectors a pixel) pays the test
# itself (its 5x5 ones at 28x28 in AVX2, 4% dead, 1.13x slower). Measured: docs/history.md.
DEAD_SHARE = 0.25
BODY_OPS = 128
_IDENTITY = {Add: 0.0, Max: float("-inf"), Min: float("inf")}   # what an update folds in that leaves it as it is


def skip_dead_iterations(func: ir.Func) -> ir.Func:
    if not any(isinstance(n, Select) for st in ir.stmts(func.body) if isinstance(st, ir.Store) for n in walk(st.value)):
        return func
    return dataclasses.replace(func, body=_skip(func.body, {})[0])


_ANY = object()      # the idle tests of a statement that stores nothing: whatever the others' are


def _skip(s: ir.Stmt, ranges: dict) -> tuple:
    """(s with its dead iterations skipped, the tests under which every store in it leaves its
    buffer as it is when the test fails (common to all of them, in a stable order; None: none, or a
    statement of another kind), the ranges of the loops inside it): one walk, inner loops first."""
    if isinstance(s, ir.Store):
        return s, _update_tests(s) or None, {}
    if isinstance(s, ir.Prefetch):
        return s, _ANY, {}
    if isinstance(s, ir.Seq):
        done = [_skip(x, ranges) for x in s.stmts]
        tests, own = _ANY, {}
        for _, t, o in done:
            tests = t if tests is _ANY else None if t is None or tests is None else \
                tests if t is _ANY else [c for c in tests if c in t]
            _widen(own, o)
        return ir.seq([d[0] for d in done]), tests or None, own
    if isinstance(s, (ir.IfThen, ir.Allocate)):
        body, tests, own = _skip(s.body, ranges)
        return dataclasses.replace(s, body=body), tests, own
    if not isinstance(s, ir.For):
        return s, None, {}          # a barrier: every thread must reach it
    inner = {**ranges, s.var: (0, s.extent - 1)}
    body, tests, own = _skip(s.body, inner)
    mine = _widen(dict(own), {s.var: (0, s.extent - 1)})
    if s.kind != "serial" or s.limit is not None or tests in (None, _ANY):
        return dataclasses.replace(s, body=body), tests, mine
    live = []
    for c in tests:
        if s.var not in free_vars(c) or (t := _best_case(c, own)) is None or s.var not in free_vars(t) \
                or _holds(t, inner) or (t := simplify(t, inner)) in live:
            continue
        if not (isinstance(t, Const) and t.value):      # false everywhere: the body never adds anything
            live.append(t)
    if live and _worth_skipping(live, s.var, inner, body):
        body = ir.IfThen(all_of(*live), body)
    return dataclasses.replace(s, body=body), tests, mine


def _holds(t: Cmp, ranges: dict) -> bool:
    """Whether a test `e < 0` / `e <= 0` holds for every value of the loops (its bounds say so:
    cheaper than simplify, which would fold it to true)."""
    b = bounds(t.a, ranges)
    return b is not None and (b[1] < 0 if t.op == "<" else b[1] <= 0)


def _widen(out: dict, ranges: dict) -> dict:
    """`out` with `ranges` added; a name bound twice: the wider range (as _loop_ranges)."""
    for k, (_, hi) in ranges.items():
        out[k] = (0, max(hi, out.get(k, (0, 0))[1]))
    return out


def _worth_skipping(tests: list, var: str, ranges: dict, body: ir.Stmt) -> bool:
    share = dead_share(tests, ranges)
    if share >= DEAD_SHARE:
        return True
    return share > 0 and ir.nest_steps(body, vector_ops=True) >= BODY_OPS and share * _runs(tests, var, ranges) >= 1 - 1e-9


def _runs(tests: list, var: str, ranges: dict) -> int:
    """How many runs of loop `var` the tests tell apart: the distinct values of their parts free
    of it (an output row, also where it is a fused parallel loop's `f / n % m`); 0 where unknown."""
    forms = [_difference(t) for t in tests]
    if None in forms:
        return 0
    rest = [({k: c for k, c in terms.items() if var not in free_vars(k)}, 0) for terms, _ in forms]
    values = _on_loops(rest, ranges)
    if values is None:
        return 0
    return len(np.unique(np.stack([v.ravel() for v in values]), axis=1).T) if values else 1


def dead_share(tests: list, ranges: dict) -> float:
    """The share of the values of the loops `tests` read (each test linear in terms of them: a
    fused loop's `f / n % m` too) for which one of them fails; 0 where that is not known (a term
    of another form, a loop without a range, too many values)."""
    if any(isinstance(t, Const) and not t.value for t in tests):
        return 1.0
    tests = [t for t in tests if not isinstance(t, Const)]
    forms = [_difference(t) for t in tests]
    if None in forms or (values := _on_loops(forms, ranges)) is None:
        return 0.0
    ok = np.ones((), bool)
    for t, v in zip(tests, values):
        ok = ok & (v < 0 if t.op == "<" else v <= 0)
    return 1.0 - float(ok.mean())


def _on_loops(forms: list, ranges: dict, points: int = 1 << 20) -> list | None:
    """The values of linear forms (terms, const) over every value of the loops they read, as
    arrays of one shape; None where a term is of another form, a loop has no range, or there are
    more than `points` values."""
    names = sorted({n for terms, _ in forms for k in terms for n in free_vars(k)})
    if any(n not in ranges for n in names):
        return None
    shape = [ranges[n][1] - ranges[n][0] + 1 for n in names]
    if math.prod(shape) > points:
        return None
    grid = dict(zip(names, np.meshgrid(*(np.arange(ranges[n][0], ranges[n][1] + 1) for n in names),
                                       indexing="ij", sparse=True)))
    values = []
    for terms, const in forms:
        v = np.full(shape, const, np.int64)
        for term, k in terms.items():
            if (x := _on_grid(term, grid)) is None:
                return None
            v = v + k * x
        values.append(v)
    return values


_GRID_OPS = {Add: np.add, Sub: np.subtract, Mul: np.multiply, FloorDiv: np.floor_divide, FloorMod: np.mod}


def _on_grid(e, grid: dict):
    """An integer expression's values over `grid` (numpy arrays by loop name); None for another form."""
    if isinstance(e, Const):
        return e.value if e.is_int else None
    if isinstance(e, Var):
        return grid[e.name]
    if type(e) in _GRID_OPS and (a := _on_grid(e.a, grid)) is not None and (b := _on_grid(e.b, grid)) is not None:
        return _GRID_OPS[type(e)](a, b)
    return None


def _update_tests(st: ir.Store) -> list:
    """The tests whose failure makes `st` (acc = acc op term) fold in op's identity."""
    v, acc = st.value, Load(st.buffer, st.indices)
    if type(v) not in _IDENTITY or acc not in (v.a, v.b):
        return []
    term, unit = v.b if v.a == acc else v.a, _IDENTITY[type(v)]
    return [c for c in dict.fromkeys(c for n in walk(term) if isinstance(n, Select) for c in _conjuncts(n.cond))
            if _yields(term, c, unit)]


def _yields(e, c, unit: float) -> bool:
    """Whether `e` is `unit` wherever test `c` fails."""
    if isinstance(e, Const):
        return e.value == unit
    if isinstance(e, Select):
        return _yields(e.other, c, unit) and (c in tuple(_conjuncts(e.cond)) or _yields(e.then, c, unit))
    if isinstance(e, Cast):
        return _yields(e.value, c, unit)
    if unit != 0.0:
        return False
    if isinstance(e, Mul):
        return _yields(e.a, c, 0.0) or _yields(e.b, c, 0.0)
    if isinstance(e, Div):
        return _yields(e.a, c, 0.0)
    if isinstance(e, (Add, Sub)):
        return _yields(e.a, c, 0.0) and _yields(e.b, c, 0.0)
    return False


def _best_case(c, inner: dict):
    """For a test `a < b` / `a <= b` linear in the loop variables: the test on the others alone
    that holds wherever it holds for some value of the `inner` loops; None for another form."""
    return _case(c, inner, worst=False)


# ------------------------------------------------------------ partitioning at a select
# A concat is a select on the position along its axis: `i < P ? past[i] : new[i - P]` (a decoding
# step's keys appended at the past length P), evaluated for every element, both sides where it
# is vectorised. A serial loop over i whose statements select on a test increasing in i alone (its
# other terms are constants, symbols and the loops around, none inside) runs as two loops, before
# and after the point where the test turns false, each with that side only, as TVM's
# LoopPartition does; the second is partitioned again at the next such test. A select with a
# constant side (a pad's border) is left to the guards and unswitching above.

def partition_selects(func: ir.Func) -> ir.Func:
    if not any(concat_test(n) for st in ir.stmts(func.body) if isinstance(st, ir.Store) for n in walk(st.value)):
        return func
    return dataclasses.replace(func, body=_partition(func.body))


def concat_test(n):
    """linear(a - b) of a concat select's test `a < b` or `a <= b` (two sides that are not
    constants, a test that reads no data), else None: where a loop may be cut (space.sketch asks
    which output axes those are)."""
    if not isinstance(n, Select) or isinstance(n.then, Const) or isinstance(n.other, Const) \
            or any(isinstance(x, Load) for x in walk(n.cond)):
        return None
    return _difference(n.cond)


def _partition(s: ir.Stmt) -> ir.Stmt:
    if isinstance(s, ir.Seq):
        return ir.seq([_partition(x) for x in s.stmts])
    if isinstance(s, (ir.IfThen, ir.Allocate)):
        return dataclasses.replace(s, body=_partition(s.body))
    if not isinstance(s, ir.For):
        return s
    if s.kind in _PEELED and (cut := _select_cut(s)) is not None:
        cond, p = cut
        trips = s.limit if s.limit is not None else Const(s.extent)
        p = simplify(Max(Const(0), Min(p, trips)))
        first = _resolved(s.body, cond, True)
        second = _substitute(_resolved(s.body, cond, False), {s.var: Var(s.var) + p})
        if isinstance(p, Const) and s.limit is None:
            parts = [dataclasses.replace(s, extent=p.value, body=first) if p.value else None,
                     dataclasses.replace(s, extent=s.extent - p.value, body=second) if p.value < s.extent else None]
        else:
            parts = [dataclasses.replace(s, limit=p, body=first),
                     dataclasses.replace(s, limit=simplify(trips - p), body=second)]
        return ir.seq([_partition(x) for x in parts if x is not None])
    return dataclasses.replace(s, body=_partition(s.body))


def _select_cut(loop: ir.For):
    """(test, p) of the first concat select in `loop`'s statements whose test holds exactly for
    loop.var < p, p free of the loops inside (an expression); None where there is none."""
    inner = _loop_ranges(loop.body)
    for st in ir.stmts(loop.body):
        if not isinstance(st, ir.Store):
            continue
        for n in walk(st.value):
            if (ln := concat_test(n)) is None:
                continue
            terms, const = ln
            coef = terms.get(Var(loop.var), 0)
            rest = {t: k for t, k in terms.items() if t != Var(loop.var)}
            if coef != 1 or any(free_vars(t) & (inner.keys() | {loop.var}) for t in rest):
                continue
            # v + rest + const < 0 (<= 0): v < -rest - const (+ 1)
            return n.cond, from_linear({t: -k for t, k in rest.items()}, -const + (1 if n.cond.op == "<=" else 0))
    return None


def _resolved(s: ir.Stmt, cond, truth: bool) -> ir.Stmt:
    """`s` with every select on `cond` replaced by its side for that truth."""
    return _replace(s, lambda e: transform(e, lambda n: (n.then if truth else n.other)
                                            if isinstance(n, Select) and n.cond == cond else None))


# ------------------------------------------------------------ tests settled by the run's values
# In a dynamic kernel a border tile's pad test compares with the run's extent (`row < 2*n + 1`):
# interval bounds, with the symbols and the loops apart, cannot tell that a loop stopping at
# `(n - 2) / 2 + 1` tiles never reaches it, and the test stays in the innermost loop, where a
# static kernel has none (ResNet-50's 3x3 stride-2 convs: the border tiles 1.4x slower). Each
# test of the symbols and loops is bounded at every value the symbols can take (the loops' ends
# evaluated there), and one that holds, or fails, at all of them is settled. More values than
# te.dynamic.every_value enumerates: left as it is.
_INTERVAL_OPS = {Add: lambda a, b: (a[0] + b[0], a[1] + b[1]), Sub: lambda a, b: (a[0] - b[1], a[1] - b[0]),
                 Min: lambda a, b: (np.minimum(a[0], b[0]), np.minimum(a[1], b[1])),
                 Max: lambda a, b: (np.maximum(a[0], b[0]), np.maximum(a[1], b[1]))}


def settle_tests(func: ir.Func) -> ir.Func:
    if (points := every_value(func.symbols)) is None:
        return func
    env = {}
    for name in points[0]:
        v = np.array([p[name] for p in points])
        env[name] = (v, v)
    return dataclasses.replace(func, body=_settle(func.body, env, np.ones(len(points), bool)))


def _settle(s: ir.Stmt, env: dict, live):
    """`s` with the tests settled over the points where it runs (`live`), the loops around it and
    the symbols in `env` (name -> (lows, highs), an array over the points each)."""
    if isinstance(s, ir.Seq):
        return ir.seq([_settle(x, env, live) for x in s.stmts])
    if isinstance(s, ir.Store):
        value = transform(s.value, lambda n: _settled_select(n, env, live) if isinstance(n, Select) else None)
        return s if value is s.value else ir.Store(s.buffer, s.indices, value)
    if isinstance(s, ir.IfThen):
        cond = _settled(s.cond, env, live)
        if isinstance(cond, Const):
            return _settle(s.body, env, live) if cond.value else ir.Seq([])
        return ir.IfThen(cond, _settle(s.body, env, live))
    if isinstance(s, ir.For):
        hi = np.full(live.shape, s.extent - 1)
        if s.limit is not None and (b := _interval(s.limit, env)) is not None:
            hi = np.minimum(hi, b[1] - 1)
        runs = live & (hi >= 0)
        body = _settle(s.body, {**env, s.var: (np.zeros_like(hi), np.maximum(hi, 0))}, runs) if runs.any() else s.body
        return dataclasses.replace(s, body=body)
    if isinstance(s, ir.Allocate):
        return dataclasses.replace(s, body=_settle(s.body, env, live))
    return s


def _settled_select(n: Select, env: dict, live):
    cond = _settled(n.cond, env, live)
    if isinstance(cond, Const):
        return n.then if cond.value else n.other
    return None if cond is n.cond else Select(cond, n.then, n.other)


def _settled(cond, env: dict, live):
    """`cond` with each of its `a < b` / `a <= b` tests that holds (fails) at every live point
    replaced by true (false), folded; `cond` itself where none is."""
    def decide(n):
        if not isinstance(n, Cmp) or (ln := _difference(n)) is None:
            return None
        b = _interval(from_linear(*ln), env)
        if b is None:
            return None
        lo, hi = b[0][live], b[1][live]
        if (hi < 0).all() if n.op == "<" else (hi <= 0).all():
            return Const(1)
        if (lo >= 0).all() if n.op == "<" else (lo > 0).all():
            return Const(0)
        return None
    out = transform(cond, decide)
    if out == cond:
        return cond
    out = simplify(out)
    if isinstance(out, Cmp) and out.op == "==" and isinstance(out.a, Const) and isinstance(out.b, Const):
        return Const(int(out.a.value == out.b.value))        # the other side of a settled split
    return out


def _interval(e, env: dict):
    """(lows, highs) of an integer expression at each point, from the ranges in `env`; None for
    an expression of another form or a name not in `env`."""
    if isinstance(e, Const):
        return (e.value, e.value) if e.is_int else None
    if isinstance(e, Var):
        return env.get(e.name)
    if isinstance(e, (FloorDiv, FloorMod)) and isinstance(e.b, Const) and e.b.is_int and e.b.value > 0:
        if (a := _interval(e.a, env)) is None:
            return None
        c = e.b.value
        if isinstance(e, FloorDiv):
            return (np.floor_divide(a[0], c), np.floor_divide(a[1], c))
        one = np.floor_divide(a[0], c) == np.floor_divide(a[1], c)      # one period: mod is monotone there
        return (np.where(one, np.mod(a[0], c), 0), np.where(one, np.mod(a[1], c), c - 1))
    if isinstance(e, Mul) and (isinstance(e.a, Const) or isinstance(e.b, Const)):
        k, x = (e.a, e.b) if isinstance(e.a, Const) else (e.b, e.a)
        if not k.is_int or (a := _interval(x, env)) is None:
            return None
        return (a[0] * k.value, a[1] * k.value) if k.value >= 0 else (a[1] * k.value, a[0] * k.value)
    if type(e) in _INTERVAL_OPS and (a := _interval(e.a, env)) is not None and (b := _interval(e.b, env)) is not None:
        return _INTERVAL_OPS[type(e)](a, b)
    return None
