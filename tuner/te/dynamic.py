"""Dimensions that vary from run to run, within declared ranges (issue 37).

A dynamic kernel is laid out at the symbols' upper bounds: every buffer has its bound shape and
constant strides, as XLA's bounded dynamic shapes are padded to their bound. Only its loops
change with a run: a loop over a dynamic dimension stops at that run's extent (a C expression of
the symbols), and the padding beyond it is never read or written. Which dimensions vary, and how,
is found by building the tensor expression at a few values of the symbols and fitting each
extent as a multilinear function of them (M = B*S, a padded row S + 2); anything else (a stride
that halves a length) is refused rather than guessed.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .expr import Const, Expr, Reduce, Var, as_expr, simplify, substitute
from .tensor import ComputeOp, topo_order

SYMBOL_PREFIX = "_dyn"       # a symbol's C name: _dyn0, _dyn1, ... (no axis name starts with "_")


class DynamicError(ValueError):
    pass


@dataclass(frozen=True)
class Symbol:
    """A named dimension that takes any value in [lo, hi] at run time."""
    name: str
    lo: int
    hi: int

    def __post_init__(self):
        if not (isinstance(self.lo, int) and isinstance(self.hi, int) and 1 <= self.lo <= self.hi):
            raise DynamicError(f"symbol {self.name}: its range [{self.lo}..{self.hi}] must be integers with "
                               f"1 <= lo <= hi")


@dataclass
class DynamicDims:
    """Run-time extents of a kernel's dimensions: `tensors[name][d]` and `reduce[(stage, axis)]`
    are expressions of the symbols' vars (symbol_var(k)), or None where the extent is fixed."""
    symbols: tuple
    tensors: dict = field(default_factory=dict)
    reduce: dict = field(default_factory=dict)

    def tensor(self, name: str) -> tuple:
        return self.tensors.get(_base(name), ())

    def reduce_limit(self, stage: str, axis: str):
        return self.reduce.get((_base(stage), axis))

    @property
    def ranges(self) -> dict:
        """Var name -> (lo, hi) of each symbol, for simplification and bounds."""
        return {symbol_var(k).name: (s.lo, s.hi) for k, s in enumerate(self.symbols)}


def symbol_var(k: int) -> Var:
    return Var(f"{SYMBOL_PREFIX}{k}")


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


def _extents(build: Callable, values: dict) -> dict:
    """{("t", tensor, d) | ("r", stage, axis): extent, ("f", tensor): its formula} of the DAG built
    at `values`."""
    _, output = build(values)
    out = {}
    for t in topo_order(output):
        for d, e in enumerate(t.shape):
            out[("t", t.name, d)] = e
        if isinstance(t.op, ComputeOp):
            for r in t.op.reduce_axes:
                out[("r", t.name, r.name)] = r.extent
            body = t.op.body
            if isinstance(body, Reduce):       # its axes' extents are compared above
                body = Reduce(body.combiner, body.source, tuple(r.name for r in body.axes), body.init)
            out[("f", t.name)] = (tuple(a.name for a in t.op.axes), body, tuple(sorted(t.op.table.items())))
    return out


def fit_dims(build: Callable, symbols: tuple) -> DynamicDims:
    """The run-time extents of the DAG that `build({symbol var name: value})` makes, each fitted
    as a multilinear function of the symbols: exact at the two corner values of every symbol,
    checked at a third, with non-negative integer coefficients (so the bound shape is the largest).
    Raises DynamicError naming the dimension that no such function fits."""
    symbols = tuple(symbols)
    names = [symbol_var(k).name for k in range(len(symbols))]
    dims = DynamicDims(symbols)
    moving = [k for k, s in enumerate(symbols) if s.lo < s.hi]
    if not moving:
        return dims
    bound = {n: s.hi for n, s in zip(names, symbols)}
    low = {n: _second(s) for n, s in zip(names, symbols)}
    corners = {}
    for pick in itertools.product((0, 1), repeat=len(moving)):
        vals = dict(bound)
        for k, p in zip(moving, pick):
            vals[names[k]] = low[names[k]] if p else bound[names[k]]
        corners[pick] = _extents(build, vals)
    at_bound = corners[(0,) * len(moving)]
    probe = dict(bound)
    for k in moving:
        probe[names[k]] = _third(symbols[k])
    at_probe = _extents(build, probe)
    for key, ext in at_bound.items():
        if any(key not in c for c in corners.values()) or key not in at_probe:
            raise DynamicError(f"{_label(key)} exists at some values of the symbols and not at others")
        if all(c[key] == ext for c in corners.values()) and at_probe[key] == ext:
            continue
        if key[0] == "f":      # a value computed from a symbol (a pad's border, a mean's 1/n): not a bound
            raise DynamicError(f"what {key[1]} computes depends on the value of "
                               f"{', '.join(symbols[k].name for k in moving)}, not only on how far it runs")
        expr = _multilinear(key, corners, moving, names, bound, low, symbols)
        if evaluate(expr, probe) != at_probe[key]:
            raise DynamicError(f"the extent of {_label(key)} is not a multilinear function of "
                               f"{', '.join(symbols[k].name for k in moving)}")
        if key[0] == "t":
            rank = sum(1 for k in at_bound if k[0] == "t" and k[1] == key[1])
            shape = dims.tensors.setdefault(key[1], [None] * rank)
            shape[key[2]] = expr
        else:
            dims.reduce[(key[1], key[2])] = expr
    dims.tensors = {n: tuple(s) for n, s in dims.tensors.items()}
    return dims


def _second(s: Symbol) -> int:
    return max(s.lo, s.hi // 2) if max(s.lo, s.hi // 2) != s.hi else s.lo


def _third(s: Symbol) -> int:
    """A value other than the two corners where the range has one, to check the fit."""
    for v in (s.lo + (s.hi - s.lo) // 3, s.lo, (s.hi + _second(s)) // 2):
        if v not in (s.hi, _second(s)):
            return v
    return s.hi


def _multilinear(key, corners: dict, moving: list, names: list, bound: dict, low: dict, symbols: tuple) -> Expr:
    """The multilinear function of the moving symbols through the extents at the corners, as a
    sum of products of the symbols with integer coefficients; DynamicError where none fits or
    where it leaves [1, its value at the bounds] somewhere in the symbols' box (a multilinear
    function takes its extremes at the box's vertices, so those are checked)."""
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
            raise DynamicError(f"the extent of {_label(key)} does not change by whole steps with the symbols")
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
    top = corners[(0,) * n][key]
    for vertex in itertools.product((0, 1), repeat=n):
        vals = {names[k]: (symbols[k].lo if v else symbols[k].hi) for k, v in zip(moving, vertex)}
        v = evaluate(out, vals)
        if v < 1:
            raise DynamicError(f"{_label(key)} would be {v} at {_at(vals, symbols, names)}: narrow the range")
        if v > top:
            raise DynamicError(f"{_label(key)} is larger at {_at(vals, symbols, names)} than at the bounds")
    return out


def _at(vals: dict, symbols: tuple, names: list) -> str:
    return ", ".join(f"{s.name}={vals[n]}" for s, n in zip(symbols, names) if n in vals)


def _label(key) -> str:
    return {"t": lambda: f"dimension {key[2]} of {key[1]}", "r": lambda: f"reduction {key[2]} of {key[1]}",
            "f": lambda: f"the formula of {key[1]}"}[key[0]]()
