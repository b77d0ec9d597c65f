"""Scalar expression nodes shared by tensor expressions and the loop-nest IR.

Nodes are frozen dataclasses, so structurally equal expressions compare and hash equal;
that is what lets the simplifier collect like terms and lets bound inference union the
regions of two reads with the same symbolic base.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping, Union

Number = Union[int, float]


class Expr:
    """Base of all expression nodes; arithmetic operators build new nodes."""

    __slots__ = ()

    def __add__(self, o): return Add(self, as_expr(o))
    def __radd__(self, o): return Add(as_expr(o), self)
    def __sub__(self, o): return Sub(self, as_expr(o))
    def __rsub__(self, o): return Sub(as_expr(o), self)
    def __mul__(self, o): return Mul(self, as_expr(o))
    def __rmul__(self, o): return Mul(as_expr(o), self)
    def __floordiv__(self, o): return FloorDiv(self, as_expr(o))
    def __mod__(self, o): return FloorMod(self, as_expr(o))
    def __truediv__(self, o): return Div(self, as_expr(o))
    def __neg__(self): return Mul(Const(-1), self)
    def __lt__(self, o): return Cmp("<", self, as_expr(o))
    def __le__(self, o): return Cmp("<=", self, as_expr(o))
    def __gt__(self, o): return Cmp("<", as_expr(o), self)
    def __ge__(self, o): return Cmp("<=", as_expr(o), self)


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: Number

    @property
    def is_int(self) -> bool:
        return isinstance(self.value, int)

    # 1 and 1.0 are different constants (an index and a float): equal values of another type
    # must not meet in a dict of expressions (the memo of `linear`, the simplifier's terms); nor
    # 0.0 and -0.0 (x + 0.0 turns -0.0 into 0.0, x + -0.0 is x)
    def __eq__(self, other):
        return (type(other) is Const and type(self.value) is type(other.value) and self.value == other.value
                and (type(self.value) is not float or math.copysign(1.0, self.value) == math.copysign(1.0, other.value)))

    def __hash__(self):
        return hash((type(self.value), self.value))


@dataclass(frozen=True, eq=True)
class Var(Expr):
    name: str


@dataclass(frozen=True, eq=True)
class Add(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Sub(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Mul(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Div(Expr):
    """Floating-point division."""
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class FloorDiv(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class FloorMod(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Min(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Max(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Cmp(Expr):
    op: str  # "<", "<=", "=="
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class And(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Select(Expr):
    cond: Expr
    then: Expr
    other: Expr


@dataclass(frozen=True, eq=True)
class Call(Expr):
    """A pure math function: exp, sqrt, ..."""
    name: str
    args: tuple


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    dtype: str
    value: Expr


@dataclass(frozen=True, eq=True)
class Load(Expr):
    """A read of `buffer` (a tensor name) at a multi-dimensional index."""
    buffer: str
    indices: tuple


@dataclass(frozen=True, eq=True)
class Reduce(Expr):
    """Top-level body of a reduction compute: combiner over `axes` (IterVar names)."""
    combiner: str  # "sum" | "max"
    source: Expr
    axes: tuple
    init: Expr


def _cache_hash(cls):
    """Nodes are immutable trees that are hashed again and again (memo keys, term dicts): hash each once."""
    structural = cls.__hash__

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = structural(self)
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):        # a cached hash is only valid in the process that computed it
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls


for _cls in (Const, Var, Add, Sub, Mul, Div, FloorDiv, FloorMod, Min, Max, Cmp, And, Select, Call, Cast, Load, Reduce):
    _cache_hash(_cls)


def as_expr(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(int(x))
    if isinstance(x, (int, float)):
        return Const(x)
    raise TypeError(f"cannot use {type(x).__name__} {x!r} as an expression")


def min_expr(a, b) -> Expr:
    return Min(as_expr(a), as_expr(b))


def max_expr(a, b) -> Expr:
    return Max(as_expr(a), as_expr(b))


def all_of(*conds) -> Expr:
    conds = [as_expr(c) for c in conds]
    out = conds[0]
    for c in conds[1:]:
        out = And(out, c)
    return out


def select(cond, then, other) -> Expr:
    return Select(as_expr(cond), as_expr(then), as_expr(other))


def children(e: Expr) -> tuple:
    return _CHILDREN[type(e)](e)


def _pair(e):
    return (e.a, e.b)


def _leaf(e):
    return ()


# children by exact node type: tree walks are the hot loop of lowering, codegen and features
_CHILDREN = {Const: _leaf, Var: _leaf, Call: lambda e: e.args, Load: lambda e: e.indices,
             Cast: lambda e: (e.value,), Select: lambda e: (e.cond, e.then, e.other),
             Reduce: lambda e: (e.source, e.init),
             **{t: _pair for t in (Add, Sub, Mul, Div, FloorDiv, FloorMod, Min, Max, Cmp, And)}}


def rebuild(e: Expr, new_children: tuple) -> Expr:
    if isinstance(e, (Const, Var)):
        return e
    if isinstance(e, Call):
        return Call(e.name, tuple(new_children))
    if isinstance(e, Load):
        return Load(e.buffer, tuple(new_children))
    if isinstance(e, Cast):
        return Cast(e.dtype, new_children[0])
    if isinstance(e, Select):
        return Select(*new_children)
    if isinstance(e, Reduce):
        return Reduce(e.combiner, new_children[0], e.axes, new_children[1])
    if isinstance(e, Cmp):
        return Cmp(e.op, *new_children)
    return type(e)(*new_children)


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Post-order rewrite: `fn` returns a replacement or None to keep the node."""
    kids = children(e)
    if kids:
        new = tuple(transform(k, fn) for k in kids)
        if any(n is not k for n, k in zip(new, kids)):
            e = rebuild(e, new)
    out = fn(e)
    return e if out is None else out


def tree_size(e: Expr) -> int:
    """Nodes of `e` written out: a subexpression shared by reference counts once per use."""
    memo: dict = {}

    def size(n: Expr) -> int:
        if id(n) not in memo:
            memo[id(n)] = 1 + sum(size(c) for c in children(n))
        return memo[id(n)]
    return size(e)


def substitute(e: Expr, mapping: Mapping[str, Expr]) -> Expr:
    if not mapping:
        return e
    return transform(e, lambda n: mapping.get(n.name) if isinstance(n, Var) else None)


def walk(e: Expr):
    """Every node of `e`, parents before children (an explicit stack: deep trees, no recursion)."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        kids = children(n)
        if kids:
            stack.extend(reversed(kids))


MEMO_SIZE = 1 << 19      # expressions remembered by the memoised analyses below


@lru_cache(maxsize=MEMO_SIZE)
def free_vars(e: Expr) -> frozenset:
    """Names of the variables in `e` (memoised: features and codegen ask about the same indices)."""
    if isinstance(e, Var):
        return frozenset((e.name,))
    return frozenset().union(*(free_vars(k) for k in children(e)))


# ---------------------------------------------------------------- affine analysis

@lru_cache(maxsize=MEMO_SIZE)
def linear(e: Expr):
    """Split `e` into ({term: coef}, const) where terms are non-constant sub-expressions.

    Vars are terms; anything non-affine (a div, a load, a product of two vars) is one opaque
    term. Returns None for float-valued expressions, and where a term that reads a tensor would
    cancel (_reads_a_tensor: x - x of a NaN is NaN, not 0). Memoised: the simplifier asks again for
    every node on the way up a tree, and lowering, codegen and features ask about the same
    indices. Callers must not mutate the returned dict.
    """
    if isinstance(e, Const):
        return ({}, e.value) if e.is_int else None
    if isinstance(e, Add) or isinstance(e, Sub):
        la, lb = linear(e.a), linear(e.b)
        if la is None or lb is None:
            return None
        sign = 1 if isinstance(e, Add) else -1
        terms = dict(la[0])
        for t, c in lb[0].items():
            terms[t] = terms.get(t, 0) + sign * c
        out = {t: c for t, c in terms.items() if c != 0}
        if len(out) < len(terms) and _reads_a_tensor(t for t in terms if t not in out):
            return None
        return out, la[1] + sign * lb[1]
    if isinstance(e, Mul):
        la, lb = linear(e.a), linear(e.b)
        if la is not None and lb is not None:
            for lc, lt in ((la, lb), (lb, la)):
                if not lc[0]:
                    if lc[1] == 0 and _reads_a_tensor(lt[0]):
                        return None
                    return {t: c * lc[1] for t, c in lt[0].items() if c * lc[1] != 0}, la[1] * lb[1]
        return {e: 1}, 0
    if isinstance(e, (Div, Call, Cast)):
        return None
    return {e: 1}, 0


def _reads_a_tensor(terms) -> bool:
    """Whether one of `terms` reads a tensor (a float value in an integer linear form): such a term
    must not cancel, as x - x and 0 * x are NaN, not 0, where x is NaN or infinite. Asked only
    when a term's coefficient came out 0; index terms never read a tensor."""
    return any(isinstance(n, Load) for t in terms for n in walk(t))


def from_linear(terms: Mapping, const: int) -> Expr:
    """Rebuild an expression from a linear form, in a stable, readable order."""
    out = None
    for t, c in sorted(terms.items(), key=lambda tc: _term_order(tc[0])):
        piece = t if c == 1 else Mul(t, Const(c)) if c > 0 else None
        if c < 0:
            out = Sub(out if out is not None else Const(0), t if c == -1 else Mul(t, Const(-c)))
            continue
        out = piece if out is None else Add(out, piece)
    if out is None:
        return Const(const)
    if const > 0:
        return Add(out, Const(const))
    if const < 0:
        return Sub(out, Const(-const))
    return out


def _term_order(t: Expr):
    return (0, t.name) if isinstance(t, Var) else (1, repr(t))


Ranges = Mapping[str, tuple]  # var name -> (lo, hi) inclusive


def bounds(e: Expr, ranges: Ranges):
    """Inclusive integer interval of `e` given var intervals; None where unknown."""
    if isinstance(e, Const):
        return (e.value, e.value) if e.is_int else None
    if isinstance(e, Var):
        return ranges.get(e.name)
    if isinstance(e, (Add, Sub, Mul, Min, Max, FloorDiv, FloorMod)):
        a, b = bounds(e.a, ranges), bounds(e.b, ranges)
        if a is None or b is None:
            if isinstance(e, FloorMod) and b is not None and b[0] == b[1] and b[0] > 0:
                return (0, b[0] - 1)
            return None
        if isinstance(e, Add):
            return (a[0] + b[0], a[1] + b[1])
        if isinstance(e, Sub):
            return (a[0] - b[1], a[1] - b[0])
        if isinstance(e, Mul):
            p = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
            return (min(p), max(p))
        if isinstance(e, Min):
            return (min(a[0], b[0]), min(a[1], b[1]))
        if isinstance(e, Max):
            return (max(a[0], b[0]), max(a[1], b[1]))
        if b[0] != b[1] or b[0] <= 0:
            return None
        c = b[0]
        if isinstance(e, FloorDiv):
            return (a[0] // c, a[1] // c)
        if a[0] >= 0 and a[1] < c:
            return a
        if a[1] - a[0] < c and a[0] // c == a[1] // c:
            return (a[0] % c, a[1] % c)
        return (0, c - 1)
    return None


def _div_mod(a: Expr, c: int, ranges: Ranges, want_div: bool):
    """(q*c + r) // c -> q + r//c and (q*c + r) % c -> r when r's range fits one period; else
    (q*g + r) // c -> q // (c/g) and (q*g + r) % c -> (q % (c/g))*g + r for a divisor g of c
    with r in [0, g), e.g. (cc*8 + cb) // 16 -> cc // 2 for cb < 8: a blocked layout read in
    another block size, whose innermost index then has a unit stride (a vector load)."""
    la = linear(a)
    if la is None:
        return None
    terms, const = la

    def split(g: int):
        """a = g*(sum of the q terms + q_const) + (the r terms + r_const), and the latter's range."""
        q_terms = {t: k // g for t, k in terms.items() if k % g == 0}
        r_terms = {t: k for t, k in terms.items() if k % g != 0}
        q_const, r_const = divmod(const, g)
        return q_terms, r_terms, q_const, r_const, bounds(from_linear(r_terms, r_const), ranges)

    q_terms, r_terms, q_const, r_const, rb = split(c)
    if rb is not None and rb[0] // c == rb[1] // c:
        k = rb[0] // c
        if want_div:
            return from_linear(q_terms, q_const + k)
        return from_linear(r_terms, r_const - k * c)
    if q_terms and rb is not None and rb[0] >= 0:      # (q*c + r) // c -> q + r // c, % c -> r % c (r >= 0)
        r = from_linear(r_terms, r_const)
        return from_linear({**q_terms, FloorDiv(r, Const(c)): 1}, q_const) if want_div else FloorMod(r, Const(c))
    for g in (g for g in range(c - 1, 1, -1) if c % g == 0):
        q_terms, r_terms, q_const, r_const, rb = split(g)
        if not q_terms or rb is None or rb[0] < 0 or rb[1] >= g:
            continue
        q = from_linear(q_terms, q_const)
        if want_div:
            return FloorDiv(q, Const(c // g))
        return from_linear({FloorMod(q, Const(c // g)): g, **r_terms}, r_const)
    return None


def simplify(e: Expr, ranges: Ranges | None = None, keep_mods: bool = False) -> Expr:
    """Fold constants, collect affine terms and remove div/mod that the ranges make exact;
    keep_mods: an x % c that strips no multiple of c from x stays, though x's range fits (C code
    for GCC, which reads the bound from it)."""
    ranges = ranges or {}

    def step(n: Expr):
        if isinstance(n, (Add, Sub, Mul)):
            ln = linear(n)
            if ln is not None:
                return from_linear(*ln)
            if isinstance(n.a, Const) and isinstance(n.b, Const):
                return Const(_fold(type(n), n.a.value, n.b.value))
            if isinstance(n, Mul):
                for x, y in ((n.a, n.b), (n.b, n.a)):
                    if isinstance(x, Const) and x.value == 1:
                        return y
            if isinstance(n, Add):
                for x, y in ((n.a, n.b), (n.b, n.a)):
                    if isinstance(x, Const) and x.value == 0:
                        return y
            return None
        if isinstance(n, (FloorDiv, FloorMod)) and isinstance(n.b, Const) and n.b.is_int:
            c = n.b.value
            if isinstance(n.a, Const) and n.a.is_int:
                return Const(n.a.value // c if isinstance(n, FloorDiv) else n.a.value % c)
            if c == 1:
                return n.a if isinstance(n, FloorDiv) else Const(0)
            if isinstance(n, FloorDiv) and isinstance(n.a, FloorDiv) and isinstance(n.a.b, Const) and n.a.b.is_int \
                    and c > 0 and n.a.b.value > 0:         # (x // a) // b -> x // (a*b)
                return simplify(FloorDiv(n.a.a, Const(n.a.b.value * c)), ranges, keep_mods)
            if keep_mods and isinstance(n, FloorMod) and (ln := linear(n.a)) is not None and \
                    not any(k % c == 0 for k in ln[0].values()) and 0 <= ln[1] < c:
                return None
            out = _div_mod(n.a, c, ranges, isinstance(n, FloorDiv))
            return simplify(out, ranges, keep_mods) if out is not None else None
        if isinstance(n, (Min, Max)):
            ba, bb = bounds(n.a, ranges), bounds(n.b, ranges)
            if ba is not None and bb is not None:
                if isinstance(n, Min):
                    if ba[1] <= bb[0]:
                        return n.a
                    if bb[1] <= ba[0]:
                        return n.b
                else:
                    if ba[0] >= bb[1]:
                        return n.a
                    if bb[0] >= ba[1]:
                        return n.b
            return None
        if isinstance(n, Cmp):
            ba, bb = bounds(n.a, ranges), bounds(n.b, ranges)
            if ba is not None and bb is not None:
                if n.op == "<":
                    if ba[1] < bb[0]:
                        return Const(1)
                    if ba[0] >= bb[1]:
                        return Const(0)
                elif n.op == "<=":
                    if ba[1] <= bb[0]:
                        return Const(1)
                    if ba[0] > bb[1]:
                        return Const(0)
            return None
        if isinstance(n, And):
            for x, y in ((n.a, n.b), (n.b, n.a)):
                if isinstance(x, Const):
                    return y if x.value else Const(0)
            return None
        if isinstance(n, Select) and isinstance(n.cond, Const):
            return n.then if n.cond.value else n.other
        if isinstance(n, (Div,)) and isinstance(n.a, Const) and isinstance(n.b, Const) and n.b.value != 0:
            return Const(n.a.value / n.b.value)      # x / 0 stays for C (inf or NaN; Python would raise)
        return None

    return transform(e, step)


def _fold(kind, a, b):
    if kind is Add:
        return a + b
    if kind is Sub:
        return a - b
    return a * b


def coefficient(e: Expr, var: str, ranges: Ranges | None = None):
    """Stride of `e` in `var`: an int when `e` is affine in it, else None."""
    ln = linear(simplify(e, ranges))
    if ln is None:
        return None
    coef = 0
    for t, c in ln[0].items():
        if isinstance(t, Var) and t.name == var:
            coef = c
        elif var in free_vars(t):
            return None
    return coef
