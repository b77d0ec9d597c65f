"""The loop-nest IR that lowering produces and codegen prints."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..te.expr import Const, Expr, linear


class Stmt:
    pass


@dataclass
class For(Stmt):
    var: str
    extent: int
    body: Stmt
    kind: str = "serial"      # serial | parallel | vectorize | unroll
    auto_unroll: int = 0      # unroll every loop below whose whole nest has at most this many steps
    limit: Expr | None = None  # a dynamic loop's run-time trip count (te.dynamic), at most `extent`


@dataclass
class Seq(Stmt):
    stmts: list


@dataclass
class Store(Stmt):
    buffer: str
    indices: tuple
    value: Expr


@dataclass
class IfThen(Stmt):
    cond: Expr
    body: Stmt


@dataclass
class Unswitch(Stmt):
    """A nest to be written twice, without and with its selects' bounds tests (schedule.peel
    replaces it before codegen)."""
    body: Stmt


@dataclass
class Sync(Stmt):
    """A barrier among a GPU block's threads (around the filling of a shared buffer); nothing on
    a CPU, where one thread runs the whole block's loops."""


@dataclass
class Prefetch(Stmt):
    """A hint, no effect on results: fetch the cache line holding `buffer`'s element at the flat
    offset `offset` into L2 (schedule.prefetch); nothing on a GPU."""
    buffer: str
    offset: Expr


@dataclass
class Allocate(Stmt):
    """A buffer local to `body` (a tile computed at a loop of its consumer)."""
    buffer: str
    shape: tuple
    body: Stmt
    scope: str = "local"      # "local" | "shared" (a GPU block's memory, filled between barriers)


@dataclass
class Buffer:
    name: str
    shape: tuple
    scope: str  # "arg" | "global" (temporary for the whole call) | "local" | "shared" (GPU block)
    order: tuple = ()   # its dimensions in storage order, outermost first (schedule's storage_order); () row-major

    def stored(self, indices: tuple) -> tuple:
        """(indices, shape) in storage order: what flat_index / flat_linear of an access take."""
        if not self.order:
            return tuple(indices), tuple(self.shape)
        return tuple(indices[d] for d in self.order), tuple(self.shape[d] for d in self.order)


@dataclass
class Func:
    name: str
    args: list            # Buffers passed in, inputs then output
    temps: list           # global temporaries
    body: Stmt
    buffers: dict = field(default_factory=dict)  # every buffer by name, for flattening
    symbols: tuple = ()   # te.dynamic.Symbol of a dynamic kernel: the values it reads at run time


def flat_index(indices: tuple, shape: tuple) -> Expr:
    """Row-major element offset of a multi-dimensional index into a buffer of `shape` (unsimplified)."""
    off, stride = Const(0), 1
    for idx, ext in zip(reversed(indices), reversed(shape)):
        off = idx * Const(stride) + off
        stride *= ext
    return off


def flat_linear(indices: tuple, shape: tuple):
    """linear() of flat_index(indices, shape), from the indices' own linear forms (no big tree to
    walk); None where an index is not an integer expression."""
    terms: dict = {}
    const, stride = 0, 1
    for idx, ext in zip(reversed(indices), reversed(shape)):
        ln = linear(idx)
        if ln is None:
            return None
        for t, c in ln[0].items():
            terms[t] = terms.get(t, 0) + c * stride
        const += ln[1] * stride
        stride *= ext
    return {t: c for t, c in terms.items() if c != 0}, const


def stmts(s: Stmt):
    """`s` and every statement inside it, outermost first."""
    yield s
    if isinstance(s, Seq):
        for x in s.stmts:
            yield from stmts(x)
    elif isinstance(s, (For, IfThen, Allocate, Unswitch)):
        yield from stmts(s.body)


def map_loops(s: Stmt, fn) -> Stmt:
    """`s` rebuilt with `fn` applied to every loop, innermost first (a loop's body is mapped
    before the loop is given to `fn`, which returns the statement that replaces it)."""
    import dataclasses
    if isinstance(s, For):
        return fn(dataclasses.replace(s, body=map_loops(s.body, fn)))
    if isinstance(s, Seq):
        return Seq([map_loops(x, fn) for x in s.stmts])
    if isinstance(s, (IfThen, Allocate, Unswitch)):
        return dataclasses.replace(s, body=map_loops(s.body, fn))
    return s


def nest_steps(s: Stmt, vector_ops: bool = False) -> int:
    """Statement executions in a loop nest: the C generator unrolls a nest that has at most its
    auto_unroll_max_step (the cost model's features must see the same loops unrolled); a prefetch
    is a hint and counts for nothing (adding one never changes what is unrolled); vector_ops: a
    vector loop's body counted once, not once per lane."""
    if isinstance(s, For):
        return (1 if vector_ops and s.kind == "vectorize" else s.extent) * nest_steps(s.body, vector_ops)
    if isinstance(s, Seq):
        return sum(nest_steps(x, vector_ops) for x in s.stmts)
    if isinstance(s, (IfThen, Allocate)):
        return nest_steps(s.body, vector_ops)
    return 0 if isinstance(s, Prefetch) else 1


def unrolled(s: For, budget: int) -> bool:
    """Whether the C generator unrolls loop `s` (neither vectorised nor run on threads) under the
    auto_unroll_max_step `budget` of the loops around it and its own."""
    return s.kind == "unroll" or bool(budget and nest_steps(s) <= budget)


def seq(stmts: list) -> Stmt:
    flat = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(flat)


# ------------------------------------------------------------ how a vectorised loop is written (codegen.c)
def vector_lanes(extent: int, max_lanes: int) -> int:
    """The register width a vector loop of `extent` is written with (0: it cannot be)."""
    return next((w for w in (16, 8, 4) if w <= max_lanes and extent % w == 0), 0)


def vector_split(extent: int, max_lanes: int) -> tuple:
    """(width, scalar remainder) a loop of `extent` is vectorised with: the width of fewest
    operations, a whole vector or a remainder lane each (1500 as 93 vectors of 16 and 12 lanes, not
    375 of 4), a dividing width on a tie; a width that does not divide needs two whole vectors;
    (0, extent) when no width fits."""
    fits = [(extent // w + extent % w, extent % w, -w) for w in (16, 8, 4)
            if w <= max_lanes and (extent % w == 0 or 2 * w <= extent)]
    if not fits:
        return 0, extent
    _, tail, w = min(fits)
    return -w, tail


def tail_widths(tail: int, lanes: int) -> tuple:
    """(narrower vector widths, lanes left) the remainder after whole vectors of `lanes` is run
    with: one vector of 8, then one of 4, where each fits, then lane by lane (197 columns of
    AVX-512: 12 vectors, one of 4 and one lane)."""
    widths = []
    for w in (8, 4):
        if w < lanes and tail >= w:
            widths.append(w)
            tail -= w
    return tuple(widths), tail
