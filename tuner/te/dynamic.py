"""Dimensions that vary from run to run, within declared ranges (issue 37).

A dynamic kernel is laid out at the symbols' upper bounds: every buffer has its bound shape and
constant strides, as XLA's bounded dynamic shapes are padded to their bound. Only its loops
change with a run: a loop over a dynamic dimension stops at that run's extent (a C expression of
the symbols), a tile past it only where the tile runs on, inside the bound shape, into padding
that no result reads; a reduction over a dynamic dimension stops exactly at it. Which dimensions
vary, and how, is found by building the tensor expression at a few values of the symbols and
fitting each extent as a multilinear function of them (M = B*S, a padded row S + 2); anything
else (a stride that halves a length) is refused rather than guessed.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import UserError
from .expr import Call, Cast, Cmp, Const, Div, Expr, FloorDiv, FloorMod, Load, Reduce, Var, as_expr, children, from_linear, \
    linear, rebuild, simplify, substitute, transform
from .tensor import ComputeOp, Tensor, topo_order

SYMBOL_PREFIX = "_dyn"       # a symbol's C name: _dyn0, _dyn1, ... (no axis name starts with "_")


class DynamicError(UserError):
    """A dynamic dimension tuner cannot compile as asked: the message says which and why."""


@dataclass(frozen=True)
class Symbol:
    """A named dimension that takes any value in [lo, hi] at run time; with a step, the dimension
    is step times the symbol's value (an image size in multiples of a CNN's total stride, which
    keeps every strided conv's and pool's extent a multiple of the symbol)."""
    name: str
    lo: int
    hi: int
    step: int = 1

    def __post_init__(self):
        if not (isinstance(self.lo, int) and isinstance(self.hi, int) and 1 <= self.lo <= self.hi):
            raise DynamicError(f"symbol {self.name}: its range [{self.lo}..{self.hi}] must be integers with "
                               f"1 <= lo <= hi")
        if not (isinstance(self.step, int) and self.step >= 1):
            raise DynamicError(f"symbol {self.name}: its step {self.step} must be a whole number, at least 1")


@dataclass
class DynamicDims:
    """Run-time extents of a kernel's dimensions: `tensors[name][d]` and `reduce[(stage, axis)]`
    are expressions of the symbols' vars (symbol_var(k)), or None where the extent is fixed;
    `bodies[stage]`: the stage's formula where integer constants in it vary with the symbols (a
    concat's offset, a slice's start), those constants expressions of the symbols' vars;
    `gaps[name][d]`: where a dim merges two that vary (a GEMM over [batch, seq] rows, a Winograd
    GEMM's tile rows and columns), the run's rows in it, period by period (Lowerer skips the tiles
    between them)."""
    symbols: tuple
    tensors: dict = field(default_factory=dict)
    reduce: dict = field(default_factory=dict)
    bodies: dict = field(default_factory=dict)
    gaps: dict = field(default_factory=dict)     # {tensor: {dim: (period, rows)}}: data at q*period + r, r < rows

    def tensor_gaps(self, name: str) -> dict:
        return self.gaps.get(_base(name), {})

    def tensor(self, name: str) -> tuple:
        return self.tensors.get(_base(name), ())

    def reduce_limit(self, stage: str, axis: str):
        return self.reduce.get((_base(stage), axis))


def symbol_var(k: int) -> Var:
    return Var(f"{SYMBOL_PREFIX}{k}")


def described(values: Mapping[str, int], symbols: tuple) -> str:
    """"seq=171, batch=2": the symbols' dims at `values` ({symbol var name: value}), for messages."""
    return ", ".join(f"{s.name}={values[symbol_var(k).name] * s.step}" for k, s in enumerate(symbols)
                     if symbol_var(k).name in values)


def _base(name: str) -> str:
    """The tensor a schedule's copy stands for ("C.local", "A.shared" -> "C", "A")."""
    for suffix in (".local", ".shared"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def evaluate(e: Expr, values: Mapping[str, int]) -> int:
    """An integer expression of symbol vars at the given values."""
    out = simplify(substitute(as_expr(e), {k: Const(int(v)) for k, v in values.items()}))
    if not (isinstance(out, Const) and out.is_int):
        raise DynamicError(f"{e} is not an integer at {dict(values)}")
    return out.value


def _extents(build: Callable, values: dict) -> tuple:
    """({("t", tensor, d) | ("r", stage, axis): extent}, {tensor: its formula}) of the DAG built at
    `values`; a formula is (axis names, body, table, its axes' ranges here)."""
    _, output = build(values)
    out, formulas = {}, {}
    for t in topo_order(output):
        for d, e in enumerate(t.shape):
            out[("t", t.name, d)] = e
        if isinstance(t.op, ComputeOp):
            for r in t.op.reduce_axes:
                out[("r", t.name, r.name)] = r.extent
            axes = (*t.op.axes, *t.op.reduce_axes)
            formulas[t.name] = (tuple(a.name for a in axes), t.op.body, tuple(sorted(t.op.table.items())),
                                {a.name: (0, a.extent - 1) for a in axes})
    return out, formulas


def _normalised(formula: tuple, bound_ranges: dict, ranges: dict) -> Expr:
    """A stage's body as formulas are compared: an axis of one iteration at the bounds or in
    `ranges` is 0 (a broadcast built at an extent of 1 reads index 0), the rest simplified over
    `ranges` (_normal); a reduction keeps its axes."""
    body = formula[1]
    zero = {a: Const(0) for a, (_, hi) in bound_ranges.items() if hi == 0 or ranges.get(a, (0, 1))[1] == 0}
    if isinstance(body, Reduce):
        return Reduce(body.combiner, _normal(substitute(body.source, zero), ranges), body.axes, body.init)
    return _normal(substitute(body, zero), ranges)


def _compared(e: Expr):
    """A normalised body with a reduction's axes by name (their extents vary)."""
    return Reduce(e.combiner, e.source, tuple(r.name for r in e.axes), e.init) if isinstance(e, Reduce) else e


_FIELD = {Var: "name", Cmp: "op", Call: "name", Cast: "dtype", Load: "buffer"}   # a node's own field, beside its children


def _head(e: Expr):
    """What a node is apart from its children (a reduction's axes by name: their extents vary; a
    constant by type only: _differing_constants compares its value)."""
    if isinstance(e, Reduce):
        return (Reduce, e.combiner, tuple(r.name for r in e.axes))
    if isinstance(e, Const):
        return (Const, type(e.value))
    return (type(e), getattr(e, _FIELD[type(e)]) if type(e) in _FIELD else None)


def _differing_constants(a: Expr, b: Expr) -> dict | None:
    """{path of child positions: (value in a, value in b)} of the integer constants where two
    formulas differ, the rest of them one; None where they differ otherwise."""
    out, stack = {}, [((), a, b)]
    while stack:
        path, x, y = stack.pop()
        if x is y or x == y:
            continue
        if _head(x) != _head(y):
            return None
        if isinstance(x, Const):
            out[path] = (x.value, y.value)
            continue
        kx, ky = children(x), children(y)
        if len(kx) != len(ky):
            return None
        stack.extend((path + (k,), p, q) for k, (p, q) in enumerate(zip(kx, ky)))
    return out


def _replaced(e: Expr, path: tuple, new: Expr) -> Expr:
    if not path:
        return new
    kids = list(children(e))
    kids[path[0]] = _replaced(kids[path[0]], path[1:], new)
    return rebuild(e, tuple(kids))


def _fitted_bodies(built: list, points: list, symbols: tuple) -> dict:
    """{stage: its formula at the bounds, integer constants that change with the symbols fitted
    (fit_table) as multilinear expressions of them} for the stages whose formulas differ between
    the sample points in such constants (a concat's offset, a slice's start at a position id).
    Each stage must compute at every point what its formula computes there, over the axes'
    ranges there: a view's index arithmetic in the bound shape, (i*32 + j) // (S*32) for i < S,
    is 0 there too; anything else that changes (a float: a mean's 1/n) is refused."""
    out = {}
    moving = ", ".join(s.name for s in symbols if s.lo < s.hi)
    for name, formula in built[0][1].items():
        bound_ranges = formula[3]
        heres = []
        for vals, (_, formulas) in zip(points[1:], built[1:]):
            here = formulas.get(name)
            if here is None or here[0] != formula[0] or here[2] != formula[2]:
                raise DynamicError(f"{name} has other axes at {described(vals, symbols)} than at the bounds")
            heres.append(here)
        if all(_compared(_normalised(formula, bound_ranges, h[3])) == _compared(_normalised(h, bound_ranges, h[3]))
               for h in heres):
            continue
        body = _normalised(formula, bound_ranges, bound_ranges)      # the kernel's: for every run's ranges
        table = [{}]
        for vals, here in zip(points[1:], heres):
            # each over its own ranges: a test that always holds there (a pad's h < H where h < H) is gone
            diff = _differing_constants(_compared(body), _compared(_normalised(here, bound_ranges, here[3])))
            fitted = None if diff is None else {path: _integers(pair) for path, pair in diff.items()}
            if fitted is None or None in fitted.values():
                raise DynamicError(f"what {name} computes depends on the value of {moving}, not only on how far "
                                   f"it runs (at {described(vals, symbols)})")
            table[0].update({(kind, name, path): v0 for path, (kind, (v0, _)) in fitted.items()})
            table.append({(kind, name, path): v for path, (kind, (_, v)) in fitted.items()})
        for row in table[1:]:
            for key, v0 in table[0].items():
                row.setdefault(key, v0)
        for (kind, _, path), e in fit_table(table, symbols, extents=False).items():
            body = _replaced(body, path, e if kind == "c" else Const(1.0) / Cast("float32", e))
        for vals, here in zip(points[1:], heres):
            at = {k: Const(v) for k, v in vals.items()}
            if _compared(_normalised((None, _reciprocals(substitute(body, at))), bound_ranges, here[3])) != \
                    _compared(_normalised(here, bound_ranges, here[3])):
                raise DynamicError(f"what {name} computes depends on the value of {moving}, not only on how far "
                                   f"it runs (at {described(vals, symbols)})")
        out[name] = body
    return out


def _integers(pair: tuple):
    """What the fit takes of a constant that differs between two points: ("c", the pair) of integers
    (an offset), ("1/", (n, m)) of floats 1/n and 1/m for whole n and m (a mean's divisor), None of
    any other float."""
    if all(isinstance(v, int) for v in pair):
        return "c", pair
    whole = [round(1.0 / v) for v in pair if isinstance(v, float) and v > 0 and abs(1.0 / v - round(1.0 / v)) <= 1e-9 / v]
    return ("1/", tuple(whole)) if len(whole) == 2 and min(whole) >= 1 else None


def _reciprocals(e: Expr) -> Expr:
    """`e` with each 1.0 / (float)n of a whole constant n as the float constant a static stage holds."""
    def rule(n):
        if isinstance(n, Div) and n.a == Const(1.0) and isinstance(n.b, Cast) \
                and isinstance(v := simplify(n.b.value), Const) and v.is_int:
            return Const(1.0 / v.value)
        return None
    return transform(e, rule)


def with_bodies(inputs: list, output: Tensor, bodies: dict) -> tuple:
    """(inputs, output) of the DAG with the stages named in `bodies` computing those formulas
    (DynamicDims.bodies), new tensors where they or what they read changed."""
    if not bodies:
        return inputs, output
    made: dict = {}
    for t in topo_order(output):
        if not isinstance(t.op, ComputeOp):
            continue
        ins = tuple(made.get(i.name, i) for i in t.op.inputs)
        if t.name in bodies or any(a is not b for a, b in zip(ins, t.op.inputs)):
            op = t.op
            made[t.name] = Tensor(t.name, t.shape, ComputeOp(op.name, op.axes, bodies.get(t.name, op.body), ins,
                                                             op.tag, dict(op.table)), t.dtype)
    return inputs, made.get(output.name, output)


def _normal(e: Expr, ranges: dict) -> Expr:
    """`e` simplified over `ranges`, with two more exact identities of integer division by positive
    constants applied until nothing changes: (a // b) // c = a // (b*c), and (q*c + r) // c =
    q + r // c, (q*c + r) % c = r % c for any r. Only for comparing formulas (_same_formulas): a
    view's index arithmetic in two shapes then reads as one; kernels keep their own forms."""
    def rule(n):
        if not (isinstance(n, (FloorDiv, FloorMod)) and isinstance(n.b, Const) and n.b.is_int and n.b.value > 0):
            return None
        c = n.b.value
        if isinstance(n, FloorDiv) and isinstance(n.a, FloorDiv) and isinstance(n.a.b, Const) and n.a.b.is_int \
                and n.a.b.value > 0:
            return FloorDiv(n.a.a, Const(n.a.b.value * c))
        ln = linear(n.a)
        if ln is None:
            return None
        terms, const = ln
        whole = {t: k // c for t, k in terms.items() if k % c == 0}
        if not whole:
            return None
        q_const, r_const = divmod(const, c)
        rest = FloorDiv(from_linear({t: k for t, k in terms.items() if k % c}, r_const), n.b)
        return from_linear(whole, q_const) + rest if isinstance(n, FloorDiv) else \
            FloorMod(from_linear({t: k for t, k in terms.items() if k % c}, r_const), n.b)

    prev = None
    for _ in range(8):
        e = simplify(transform(simplify(e, ranges), rule), ranges)
        if e == prev:
            break
        prev = e
    return e


EVERY_VALUE_LIMIT = 1 << 14     # more combinations of the symbols' values than this: not enumerated


def every_value(symbols: tuple) -> list | None:
    """Every combination of the symbols' values ({symbol var name: value}), or None where there are
    more than EVERY_VALUE_LIMIT (what holds at each is then not checked one by one)."""
    if not symbols or _count(symbols) > EVERY_VALUE_LIMIT:
        return None
    names = [symbol_var(k).name for k in range(len(symbols))]
    return [dict(zip(names, at)) for at in itertools.product(*(range(s.lo, s.hi + 1) for s in symbols))]


def _count(symbols: tuple) -> int:
    n = 1
    for s in symbols:
        n *= s.hi - s.lo + 1
    return n


def sample_points(symbols: tuple) -> list:
    """The values of the symbols ({symbol var name: value}) a fit builds at: the bound first, then
    every corner of the bounds and a second value per symbol, then probes inside the range that
    check the fit: one a third of the way up, one at the bottom (2 where the range starts at 1,
    whose broadcasts and simplifications differ harmlessly; a fit's break point above the bottom
    probe, min(S, 16), is found)."""
    names = [symbol_var(k).name for k in range(len(symbols))]
    moving = [k for k, s in enumerate(symbols) if s.lo < s.hi]
    bound = {n: s.hi for n, s in zip(names, symbols)}
    points = []
    for pick in itertools.product((0, 1), repeat=len(moving)):
        vals = dict(bound)
        for k, p in zip(moving, pick):
            vals[names[k]] = _second(symbols[k]) if p else symbols[k].hi
        points.append(vals)
    if moving:
        for probe in (_third, _bottom):
            vals = {**bound, **{names[k]: probe(symbols[k]) for k in moving}}
            if vals not in points:
                points.append(vals)
    return points


def fit_table(table: list, symbols: tuple, extents: bool = True) -> dict:
    """{key: multilinear expression of the symbols} for every key of the tables (one per point of
    sample_points, in its order: {key: int}) whose value changes with the symbols; DynamicError
    naming the key where no such function fits, or (extents) where it leaves [1, its value at the
    bounds] somewhere in the symbols' box."""
    names = [symbol_var(k).name for k in range(len(symbols))]
    moving = [k for k, s in enumerate(symbols) if s.lo < s.hi]
    if not moving:
        return {}
    n = len(moving)
    corners = dict(zip(itertools.product((0, 1), repeat=n), table[:2 ** n]))
    probes = list(zip(sample_points(symbols)[2 ** n:], table[2 ** n:]))
    bound = {nm: s.hi for nm, s in zip(names, symbols)}
    low = {nm: _second(s) for nm, s in zip(names, symbols)}
    at_bound = table[0]
    out = {}
    for key, ext in at_bound.items():
        if any(key not in c for c in table):
            raise DynamicError(f"{_label(key)} exists at some values of the symbols and not at others")
        if all(c[key] == ext for c in table):
            continue
        expr = _multilinear(key, corners, moving, names, bound, low, symbols, extents)
        if any(evaluate(expr, values) != at[key] for values, at in probes):
            raise DynamicError(f"{_label(key)} is not a multilinear function of "
                               f"{', '.join(symbols[k].name for k in moving)}{_STEP_HINT}")
        out[key] = expr
    return out


def fit_dims(build: Callable, symbols: tuple) -> DynamicDims:
    """The run-time extents of the DAG that `build({symbol var name: value})` makes, each fitted
    as a multilinear function of the symbols (fit_table) over the DAGs built at sample_points."""
    symbols = tuple(symbols)
    dims = DynamicDims(symbols)
    points = sample_points(symbols)
    built = []
    for vals in points:
        try:
            built.append(_extents(build, vals))
        except (ValueError, UserError) as e:     # a shape the computation has no meaning at
            raise DynamicError(f"at {described(vals, symbols)}: {e}; narrow the range to the values the model "
                               "runs at") from None
    dims.bodies = _fitted_bodies(built, points, symbols)
    table = [ext for ext, _ in built]
    for key, expr in fit_table(table, symbols).items():
        if key[0] == "t":
            rank = sum(1 for k in table[0] if k[0] == "t" and k[1] == key[1])
            dims.tensors.setdefault(key[1], [None] * rank)[key[2]] = expr
        else:
            dims.reduce[(key[1], key[2])] = expr
    dims.tensors = {name: tuple(shape) for name, shape in dims.tensors.items()}
    return dims


def monomials(expr: Expr, count: int) -> list:
    """A multilinear expression of `count` symbols as [[coefficient, [symbol index, ...]], ...]:
    what an artifact stores and the runtime evaluates (runtime.model), without expressions."""
    names = [symbol_var(k).name for k in range(count)]
    at = {}
    for pick in itertools.product((0, 1), repeat=count):
        at[pick] = evaluate(expr, dict(zip(names, pick)))
    out = []
    for mono in itertools.product((0, 1), repeat=count):      # Moebius inversion over {0, 1}^count
        c = sum((-1) ** (sum(mono) - sum(p)) * at[p] for p in at if all(x <= m for x, m in zip(p, mono)))
        if c:
            out.append([c, [k for k, m in enumerate(mono) if m]])
    return out


def box(shape: tuple, extents: tuple, values: dict):
    """The slices of a buffer of the bound `shape` that hold a run's data at `values`, given its
    dims' extents (None: the whole dimension)."""
    extents = tuple(extents) + (None,) * (len(shape) - len(extents))
    return tuple(slice(0, evaluate(e, values) if e is not None else n) for n, e in zip(shape, extents))


def _second(s: Symbol) -> int:
    """The second corner value: half the bound, not 1 where the range allows (see _bottom)."""
    v = max(s.lo, 2, s.hi // 2)
    return v if v < s.hi else s.lo


def _third(s: Symbol) -> int:
    """A value other than the two corners where the range has one, to check the fit."""
    for v in (s.lo + (s.hi - s.lo) // 3, (s.hi + _second(s)) // 2, _bottom(s)):
        if v not in (s.hi, _second(s)) and v >= min(2, s.hi):
            return v
    return s.hi


def _bottom(s: Symbol) -> int:
    """The lowest value probed: the range's bottom, or 2 where it is 1 and 2 is in it."""
    return max(s.lo, min(2, s.hi))


def _multilinear(key, corners: dict, moving: list, names: list, bound: dict, low: dict, symbols: tuple,
                 extents: bool = True) -> Expr:
    """The multilinear function of the moving symbols through the values at the corners, as a
    sum of products of the symbols with integer coefficients; DynamicError where none fits or
    (extents) where it leaves [1, its value at the bounds] somewhere in the symbols' box (a
    multilinear function takes its extremes at the box's vertices, so those are checked)."""
    n = len(moving)
    # f(x) = sum over subsets T of c_T * prod_{k in T} (x_k - low_k), c_T by finite differences;
    # then expanded into monomials: a_U = sum over T containing U of c_T * prod_{T \ U} (-low_k)
    c = {}
    for subset in itertools.product((0, 1), repeat=n):
        num = 0
        for pick in itertools.product((0, 1), repeat=n):       # pick 0: the bound, 1: the low value
            if any(p == 0 and s == 0 for p, s in zip(pick, subset)):
                continue
            num += (-1) ** sum(1 for p, s in zip(pick, subset) if s and p) * corners[pick][key]
        den = 1
        for k, s in zip(moving, subset):
            if s:
                den *= bound[names[k]] - low[names[k]]
        if num % den:
            raise DynamicError(f"{_label(key)} does not change by whole steps with the symbols{_STEP_HINT}")
        c[subset] = num // den
    a = {}
    for subset, ct in c.items():
        for mono in itertools.product((0, 1), repeat=n):
            if any(m and not s for m, s in zip(mono, subset)):
                continue
            coef = ct
            for k, s, m in zip(moving, subset, mono):
                if s and not m:
                    coef *= -low[names[k]]
            a[mono] = a.get(mono, 0) + coef
    out: Expr = Const(0)
    for mono, coef in sorted(a.items()):
        if coef:
            term: Expr = Const(coef)
            for k, m in zip(moving, mono):
                if m:
                    term = Var(names[k]) if term == Const(1) else term * Var(names[k])
            out = term if out == Const(0) else out + term
    out = simplify(out)
    if not extents:
        return out
    top = corners[(0,) * n][key]
    for vertex in itertools.product((0, 1), repeat=n):
        vals = {names[k]: (symbols[k].lo if v else symbols[k].hi) for k, v in zip(moving, vertex)}
        v = evaluate(out, vals)
        if v < 1:
            raise DynamicError(f"{_label(key)} would be {v} at {described(vals, symbols)}: narrow the range")
        if v > top:
            raise DynamicError(f"{_label(key)} is larger at {described(vals, symbols)} than at the bounds")
    return out


_STEP_HINT = ("; where strided convs or pools divide a varying size, give its range a step of their total stride, "
              "e.g. [224..640:32]")


def _label(key) -> str:
    said = {"t": "the extent of dimension {2} of {1}", "r": "the extent of reduction {2} of {1}",
            "v": "the extent of dimension {2} of {1}", "c": "a constant in the formula of {1}",
            "1/": "a divisor in the formula of {1}"}
    return said.get(key[0], "{1}").format(*key) if len(key) > 2 else str(key[1])
