"""Whether a lowered kernel may write its output over one of its inputs (memory.plan's in-place
steps: a softmax or LayerNorm whose input dies with it writes back what it read).

Sound and conservative: an access set is bounded by its hull (the range of its flat offset over
the loops inside the level looked at), and anything the rules cannot bound is refused (an index
that reads a dynamic kernel's symbols among them). A dynamic kernel's loops run a prefix of their
extents, and a subset of the accesses proven apart is apart: it is checked at its bounds.

- The body is walked down while one statement holds every read of the input and write of the
  output; the loops passed on the way are the level's loops.
- Over the level's loops (run in any order, or in parallel), every access must share one offset
  in their variables (its `base`), which every loop of more than one iteration moves; the reads'
  hull must lie inside the writes' hull, and the writes' hulls of two iterations must not meet
  (the base's independent parts as digits of a mixed radix: each part's gap wider than the spans
  of those below it).
- Inside one iteration, statements run in order: a statement that reads the input may not read
  what an earlier one wrote; one that reads and writes is checked the same way, a level down (a
  single store reads where it writes). A test (IfThen) that reads the input is a read before its
  body.
"""
from __future__ import annotations

import math

import numpy as np

from ..te.expr import Add, Const, Expr, FloorDiv, FloorMod, Load, Max, Min, Mul, Sub, Var, free_vars, walk
from . import ir

ENUMERATE_LIMIT = 1 << 20       # iterations a base part is evaluated over, at most


def writes_over(fn: ir.Func, src: str) -> bool:
    """Whether `fn` computes the same when its output (its last argument) is `src`'s memory."""
    out = fn.args[-1].name
    if src == out or src not in fn.buffers:
        return False
    return _safe(_Accesses(fn, src, out), fn.body, [])


class _Accesses:
    """The reads of `src` and writes of `out` under each statement, as (kind, flat linear form,
    {loop var: extent} of the loops between the statement and the access, the Store or IfThen
    that holds it)."""

    def __init__(self, fn: ir.Func, src: str, out: str):
        self.fn, self.src, self.out, self.ok = fn, src, out, True
        self.memo: dict = {}

    def flat(self, buffer: str, indices: tuple):
        return ir.flat_linear(*self.fn.buffers[buffer].stored(indices))

    def opens(self, s: ir.Stmt) -> bool:
        """Whether `s` only wraps its body: an Allocate, an Unswitch, or an IfThen whose test does
        not read the input (one that does is a read before its body)."""
        return isinstance(s, (ir.Allocate, ir.Unswitch)) or (
            isinstance(s, ir.IfThen) and not any(True for _ in self._reads(s.cond, {}, s)))

    def under(self, s: ir.Stmt) -> list:
        if id(s) not in self.memo:
            self.memo[id(s)] = list(self._walk(s, {}))
        return self.memo[id(s)]

    def _reads(self, e: Expr, loops: dict, holder: ir.Stmt):
        for n in walk(e):
            if isinstance(n, Load) and n.buffer == self.src:
                yield "r", self.flat(n.buffer, n.indices), loops, id(holder)

    def _walk(self, s: ir.Stmt, loops: dict):
        if isinstance(s, ir.Store):
            for e in (*s.indices, s.value):
                yield from self._reads(e, loops, s)
            if s.buffer == self.src:
                self.ok = False                 # the kernel writes its input: never over it
            if s.buffer == self.out:
                yield "w", self.flat(s.buffer, s.indices), loops, id(s)
        elif isinstance(s, ir.Seq):
            for x in s.stmts:
                yield from self._walk(x, loops)
        elif isinstance(s, ir.For):         # a dynamic loop's run is a prefix of its extent: a subset
            yield from self._walk(s.body, {**loops, s.var: s.extent})
        elif isinstance(s, ir.IfThen):
            yield from self._reads(s.cond, loops, s)
            yield from self._walk(s.body, loops)
        elif isinstance(s, (ir.Allocate, ir.Unswitch)):
            yield from self._walk(s.body, loops)
        elif not isinstance(s, ir.Sync):
            self.ok = False


def _safe(a: _Accesses, s: ir.Stmt, level: list) -> bool:
    """Whether `s`, run once for every iteration of the loops `level` (outermost first), never reads
    an element of the input after the output was written there."""
    while True:                                   # down while one statement holds every access
        if isinstance(s, ir.For):
            level = level + [s]
            s = s.body
        elif a.opens(s):
            s = s.body
        elif isinstance(s, ir.Seq) and len(kids := [x for x in s.stmts if a.under(x)]) == 1:
            s = kids[0]
        else:
            break
    acc = a.under(s)
    if not a.ok or any(f is None for _, f, _, _ in acc):
        return False
    if not acc:
        return True
    outer = {f.var: f.extent for f in level}
    split = [_split(f, loops, outer) for _, f, loops, _ in acc]
    if any(p is None for p in split):
        return False
    if level and not _separate(split, [k for k, _, _, _ in acc], outer):
        return False
    if isinstance(s, ir.Store):
        return True
    if isinstance(s, ir.IfThen):                  # its test reads before its body writes
        return _safe(a, s.body, level)
    written: list = []                            # hulls of what earlier statements wrote
    for piece in _pieces(a, s):
        holders = {id(x) for x in ir.stmts(piece)}
        mine = [(k, p) for (k, _, _, h), p in zip(acc, split) if h in holders]
        reads = [p[1] for k, p in mine if k == "r"]
        writes = [p[1] for k, p in mine if k == "w"]
        if reads and any(_meet(r, w) for r in reads for w in written):
            return False
        if reads and writes and not _safe(a, piece, level):
            return False
        written += writes
    return True


def _pieces(a: _Accesses, s: ir.Stmt):
    """The loops, stores and tests of the input under `s` in the order they run (Seq, Allocate and
    the IfThens whose test does not read the input opened)."""
    if isinstance(s, ir.Seq):
        for x in s.stmts:
            yield from _pieces(a, x)
    elif a.opens(s):
        yield from _pieces(a, s.body)
    else:
        yield s


def _split(form, loops: dict, outer: dict):
    """(the terms of the level's loops, (lo, hi) of the rest over the loops inside), or None where
    a term mixes the two or is not a loop variable."""
    terms, const = form
    base, lo, hi = {}, const, const
    for t, c in terms.items():
        names = free_vars(t)
        if not names:                             # a constant left unfolded (max(13, 3))
            v = _evaluate(t, {})
            if v is None:
                return None
            lo, hi = lo + c * v, hi + c * v
        elif names <= outer.keys():
            base[t] = c
        elif isinstance(t, Var) and t.name in loops:
            span = c * (loops[t.name] - 1)
            lo, hi = lo + min(0, span), hi + max(0, span)
        else:
            return None
    return base, (lo, hi)


def _meet(x: tuple, y: tuple) -> bool:
    return x[0] <= y[1] and y[0] <= x[1]


def _separate(split: list, kinds: list, outer: dict) -> bool:
    """Every access has one base; the reads lie inside the writes' hull; no two iterations' write
    hulls meet."""
    writes = [h for (_, h), k in zip(split, kinds) if k == "w"]
    reads = [h for (_, h), k in zip(split, kinds) if k == "r"]
    if not writes:
        return not reads
    lo, hi = min(h[0] for h in writes), max(h[1] for h in writes)
    if any(r[0] < lo or r[1] > hi for r in reads):
        return False
    bases = [b for b, _ in split]
    if any(n > 1 and v not in {x for b in bases for t in b for x in free_vars(t)} for v, n in outer.items()):
        return False                              # a loop that no access follows repeats them
    parts = _parts(bases, outer)
    if parts is None:
        return False
    reach = hi - lo                               # how far the parts below the next one spread
    for gap, span in sorted(parts):
        if gap <= reach:
            return False
        reach += span
    return True


def _parts(bases: list, outer: dict):
    """[(smallest gap between two of its values, their span)] of the parts of the bases that share
    no variable, each evaluated over its loops; None where the bases differ in value, a part
    repeats a value, or one is too big to evaluate."""
    groups: list = []                              # sets of variable names
    for t in {t for b in bases for t in b}:
        names = set(free_vars(t))
        for g in [g for g in groups if g & names]:
            groups.remove(g)
            names |= g
        groups.append(names)
    out = []
    for names in groups:
        order = sorted(names)
        size = math.prod(outer[n] for n in order)
        if size > ENUMERATE_LIMIT:
            return None
        grid = dict(zip(order, np.meshgrid(*[np.arange(outer[n], dtype=np.int64) for n in order],
                                           indexing="ij", sparse=True)))
        values = []
        for b in bases:
            value = np.zeros([outer[n] for n in order], dtype=np.int64)
            for t, c in b.items():
                if free_vars(t) <= names:
                    v = _evaluate(t, grid)
                    if v is None:
                        return None
                    value = value + c * v
            values.append(value)
        if any(not np.array_equal(values[0], v) for v in values[1:]):
            return None
        v = np.unique(values[0])
        if v.size != size:
            return None
        out.append((int(np.diff(v).min()) if v.size > 1 else math.inf, int(v[-1] - v[0])))
    return out


_OPS = {Add: np.add, Sub: np.subtract, Mul: np.multiply, FloorDiv: np.floor_divide, FloorMod: np.mod,
        Min: np.minimum, Max: np.maximum}


def _evaluate(e: Expr, grid: dict):
    """An integer index expression over arrays of its loop variables' values; None if it is not one."""
    if isinstance(e, Var):
        return grid.get(e.name)
    if isinstance(e, Const):
        return e.value if e.is_int else None
    op = _OPS.get(type(e))
    if op is None:
        return None
    x, y = _evaluate(e.a, grid), _evaluate(e.b, grid)
    if x is None or y is None or (op in (np.floor_divide, np.mod) and not (isinstance(y, int) and y > 0)):
        return None
    return op(x, y)
