"""Software prefetch of an input's next panel or next tile (the `prefetch` step).

A GEMM-shaped kernel reads its weight panel by panel: the outermost loop that moves through the
weight (the panel loop) picks a panel, and the loops inside it read that panel again for every
row block (the reuse loops). The first row block of each panel reads it from memory at the rate
of its own compute, faster than one core's memory bandwidth, while the hardware prefetcher sees no
stream until the panel begins. The rule: while one panel is computed, the next is fetched into L2,
one line every few iterations, over the first half of the iterations inside the panel loop.

It applies where every read of the input has a flat offset affine in loop variables, one panel
loop (serial or parallel, a static extent) holds them all, some loop inside it does not move the
offset (the reuse), and a panel's offsets cover one range without gaps (a packed weight). Anything
else lowers as if the step were absent: the step only ever changes speed. A loop inside the panel
loop that ends at run time (a dynamic kernel's rows) is counted at its bound: a run that stops it
short fetches the first lines of the next panel, not all of them.

An activation is read tile by tile instead: each register tile reads its own window of it over the
whole reduction, strided across channel blocks the hardware prefetcher does not follow, and from
memory or L3 where the producer's output outgrew L2. The rule (`tile`): in each iteration of the
reduction loop the panel prefetch would sit in, fetch the lines that the same iteration of the
next tile (the innermost loop outside it that moves the read) will read and this one does not.
"""
from __future__ import annotations

import dataclasses
import math

from ..te.expr import Const, FloorDiv, FloorMod, Load, Var, linear, max_expr, min_expr, simplify, walk
from . import ir

LINE_FLOATS = 16        # floats in a 64-byte cache line
MAX_PER_ITERATION = 4   # prefetches in one iteration of the loop they sit in, at most
# no prefetch in a loop of this many iterations or fewer: in one around a register tile (a blocked
# 1x1 conv's 4 x 7, 16 iterations) GCC then kept the tile's accumulators in memory (2.2x slower);
# a GEMM's longer reduction loop kept them in registers
PEELED = 16
SPREAD = 0.5            # the share of a panel's iterations its successor's prefetches are spread over
TILE_LINES = 16         # a next tile's prefetches in one iteration, at most (else none)
TILE_OFFSETS = 4096     # offsets one iteration of a read may take, at most, to be enumerated


def prefetch_panels(fn: ir.Func, tensors: list) -> ir.Func:
    """`fn` with each (tensor, what) of `tensors` prefetched: its next panel or its next tile."""
    for t, what in tensors:
        fn = (_one if what == "panel" else _next_tile)(fn, t) or fn
    return fn


def _reads(s: ir.Stmt, buffer: str, path: list):
    """(the Load, the loops around it outermost first) of each read of `buffer`."""
    if isinstance(s, ir.For):
        yield from _reads(s.body, buffer, path + [s])
    elif isinstance(s, ir.Seq):
        for x in s.stmts:
            yield from _reads(x, buffer, path)
    elif isinstance(s, (ir.Allocate, ir.Unswitch)):
        yield from _reads(s.body, buffer, path)
    elif isinstance(s, (ir.Store, ir.IfThen)):
        exprs = (*s.indices, s.value) if isinstance(s, ir.Store) else (s.cond,)
        for e in exprs:
            for n in walk(e):
                if isinstance(n, Load) and n.buffer == buffer:
                    yield n, path
        if isinstance(s, ir.IfThen):
            yield from _reads(s.body, buffer, path)


def _digit(t, ranges: dict, nested: bool = False):
    """A term of a flat offset as (loop var, divisor, modulus, values it takes): v, v // c or
    v % c of one loop variable, and with `nested` (v // c) % m too (a fused parallel loop's middle
    axis); None for anything else."""
    if isinstance(t, Var) and t.name in ranges:
        return t.name, 1, 0, ranges[t.name][1] + 1
    if (nested and isinstance(t, FloorMod) and isinstance(t.b, Const) and t.b.is_int and t.b.value > 0
            and (d := _digit(t.a, ranges)) and d[2] == 0 and d[1] > 1):
        return d[0], d[1], t.b.value, min(t.b.value, d[3])
    if (isinstance(t, (FloorDiv, FloorMod)) and isinstance(t.a, Var) and t.a.name in ranges
            and isinstance(t.b, Const) and t.b.is_int and t.b.value > 0):
        n, c = ranges[t.a.name][1] + 1, t.b.value
        return (t.a.name, c, 0, -(-n // c)) if isinstance(t, FloorDiv) else (t.a.name, 1, c, min(c, n))
    return None


def _kept(path: list) -> list:
    """`path` cut after its innermost loop a prefetch may sit in: serial, longer than PEELED and
    not unrolled by codegen (a prefetch there would be copied)."""
    unrolled, budget = set(), 0
    for lp in path:
        budget = max(budget, lp.auto_unroll)
        if ir.unrolled(lp, budget):
            unrolled.add(id(lp))
    k = len(path)
    while k and (path[k - 1].kind != "serial" or path[k - 1].extent <= PEELED or id(path[k - 1]) in unrolled):
        k -= 1
    return path[:k]


def _gapless(terms: list) -> bool:
    """Whether sum(c * v) over v in [0, extent) for (c, extent) in `terms` fills a range without a
    gap: each coefficient at most one past the reach of the smaller ones."""
    reach = 1
    for c, e in sorted(terms):
        if c <= 0 or c > reach:
            return False
        reach += c * (e - 1)
    return True


def _form(buf: ir.Buffer, load: Load, path: list, nested: bool = False):
    """A read's flat offset as ([(digit, term, coefficient)], constant) over the loops of `path`
    (`_digit`'s digits), or None where a term is no digit."""
    ranges = {lp.var: (0, lp.extent - 1) for lp in path}
    indices, shape = buf.stored(load.indices)
    ln = ir.flat_linear(tuple(simplify(i, ranges) for i in indices), shape)
    if ln is None:
        return None
    digits = [(_digit(t, ranges, nested), t, c) for t, c in ln[0].items()]
    return None if any(d is None for d, _, _ in digits) else (digits, ln[1])


def _one(fn: ir.Func, tensor: str) -> ir.Func | None:
    buf = fn.buffers.get(tensor)
    if buf is None:
        return None
    reads = list(_reads(fn.body, tensor, []))
    if not reads:
        return None
    forms = []
    for load, path in reads:
        form = _form(buf, load, path)
        if form is None:
            return None
        forms.append(({d: c for d, _, c in form[0]}, form[1], path))
    panel = {id(next(lp for lp in path if any(d[0] == lp.var for d in terms)))
             for terms, _, path in forms if terms}
    if len(panel) != 1 or any(not terms for terms, _, _ in forms):
        return None
    outer = next(lp for lp in forms[0][2] if id(lp) in panel)
    # the panel loop moves every read's offset by one step per iteration, and only so
    steps = {tuple((d, c) for d, c in terms.items() if d[0] == outer.var) for terms, _, _ in forms}
    if (len(steps) != 1 or [d for d, _ in next(iter(steps))] != [(outer.var, 1, 0, outer.extent)]
            or outer.kind not in ("serial", "parallel") or outer.limit is not None or outer.extent < 2):
        return None
    step = next(iter(steps))[0][1]
    # per read, the loops from just inside the panel loop down to the one the prefetch sits in
    belows = []
    for _, _, path in forms:
        below = _kept(path)[[id(lp) for lp in path].index(id(outer)) + 1:]
        if below:
            belows.append(below)
    if not belows:
        return None
    # the copies over the most iterations carry it (a peeled last row of tiles, run once at the
    # panel's end, has fewer loops and none); they all run the same loops, so one count serves
    sig = lambda b: tuple((lp.var, lp.extent) for lp in b)     # noqa: E731
    inner = max(belows, key=lambda b: math.prod(lp.extent for lp in b))
    belows = [b for b in belows if sig(b) == sig(inner)]
    moved = {d[0] for terms, _, _ in forms for d in terms}
    if all(lp.var in moved for lp in inner):
        return None            # no loop inside reads the panel again: nothing to hide
    lo = hi = None
    for terms, const, _ in forms:
        own = [(c, d[3]) for d, c in terms.items() if d[0] != outer.var]
        if not _gapless(own):
            return None
        a, b = const, const + sum(c * (n - 1) for c, n in own)
        lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
    if step <= 0 or lo < 0 or hi - lo + 1 > 2 * step:
        return None            # panels overlap by more than one: no stream to get ahead of
    # every address inside the buffer (a digit-wise bound can overshoot a loop that v // c splits unevenly)
    size = math.prod(buf.shape)
    lines = min(-(-(hi - lo + 1) // LINE_FLOATS), (size - 1 - (outer.extent - 1) * step - lo) // LINE_FLOATS + 1)
    if lines < 1:
        return None
    iters = math.prod(lp.extent for lp in inner)
    count = Const(0)
    for lp in inner:
        count = count * Const(lp.extent) + Var(lp.var)
    per = -(-lines // iters)
    if per > MAX_PER_ITERATION:
        return None
    spacing = 1 if per > 1 else 1 << max(0, int(math.log2(iters * SPREAD / lines)))
    # no test in the loop: the last panel fetches itself again, and the last line is fetched again
    # where the iterations outnumber the lines
    base = min_expr(Var(outer.var) + Const(1), Const(outer.extent - 1)) * Const(step) + Const(lo)
    fetches = []
    for j in range(per):
        line = count * Const(per) + Const(j) if spacing == 1 else count // Const(spacing)
        fetches.append(ir.Prefetch(tensor, base + min_expr(line, Const(lines - 1)) * Const(LINE_FLOATS)))
    body = fn.body
    for target in {id(b[-1]): b[-1] for b in belows}.values():
        body = _place(body, target, fetches)
    return ir.Func(fn.name, fn.args, fn.temps, body, fn.buffers, fn.symbols)


def _next_tile(fn: ir.Func, tensor: str) -> ir.Func | None:
    """`fn` with `tensor`'s next tile fetched (module doc), or None where no read qualifies."""
    buf = fn.buffers.get(tensor)
    if buf is None:
        return None
    size = math.prod(buf.shape)
    sites = {}      # id(loop the prefetch sits in) -> (that loop, [(offset outside it, next tile's step, offsets inside)])
    for load, path in _reads(fn.body, tensor, []):
        kept = _kept(path)
        if len(kept) < 2 or any(lp.limit is not None for lp in path):
            continue
        at, inner = kept[-1], path[len(kept):]
        form = _form(buf, load, path, nested=True)
        if form is None:
            continue
        digits, const = form
        moving = {d[0] for d, _, _ in digits}
        if any(d[0] == at.var and abs(c) < LINE_FLOATS for d, _, c in digits) or at.var not in moving:
            continue        # a read that walks its lines in order (the hardware's stream), or stands still
        tile = next((lp for lp in reversed(kept[:-1]) if lp.var in moving), None)
        # the next tile: the tile loop's fastest digit in this read one step on (in a fused
        # parallel loop, the activation's fastest axis: (v // c) % m where the weights' is v % c)
        own_digits = sorted((d[1], c) for d, _, c in digits if tile is not None and d[0] == tile.var)
        if not own_digits or len(own_digits) > 1 and own_digits[1][0] == own_digits[0][0] or own_digits[0][1] <= 0:
            continue
        step = own_digits[0][1]
        here = {lp.var for lp in inner}
        own = [(d, c) for d, _, c in digits if d[0] in here]
        if math.prod(d[3] for d, _ in own) > TILE_OFFSETS:
            continue
        offsets = {0}
        for (*_, n), c in own:       # a digit's values: 0 .. n-1
            offsets = {o + c * v for o in offsets for v in range(n)}
        base = Const(const)
        for d, t, c in digits:
            if d[0] not in here:
                base = base + t * Const(c)
        sites.setdefault(id(at), (at, []))[1].append((base, step, offsets))
    body = fn.body
    for at, group in sites.values():
        base, step = group[0][0], group[0][1]
        shifts = [simplify(b - base) for b, _, _ in group]
        if any(st != step for _, st, _ in group) or not all(isinstance(d, Const) for d in shifts):
            continue        # reads whose windows differ by more than a constant: no one window
        cur = {o + d.value for d, (_, _, offs) in zip(shifts, group) for o in offs}
        new = sorted({o + step for o in cur} - cur)
        points = line_points(new, _aligned(base))
        if not points or len(points) > TILE_LINES:
            continue
        fetches = [ir.Prefetch(tensor, max_expr(min_expr(base + Const(o), Const(size - 1)), Const(0))) for o in points]
        body = _place(body, at, fetches)
    return None if body is fn.body else ir.Func(fn.name, fn.args, fn.temps, body, fn.buffers, fn.symbols)


def line_points(offsets: list, aligned: bool) -> list:
    """Offsets among sorted `offsets` that fall in every cache line the others do: where the base
    is a whole number of lines (`aligned`), the first in each line; else, whatever the base's place
    in its line, the ends of each run of consecutive offsets and points at most a line apart between."""
    if aligned:
        return sorted({o // LINE_FLOATS: o for o in reversed(offsets)}.values())
    points = []
    for k, o in enumerate(offsets):
        start, end = k == 0 or offsets[k - 1] != o - 1, k + 1 == len(offsets) or offsets[k + 1] != o + 1
        if start or end or o - points[-1] >= LINE_FLOATS:
            points.append(o)
    return points


def _aligned(e) -> bool:
    """Whether the flat offset `e` is a whole number of lines for every value of its variables."""
    ln = linear(simplify(e))
    return ln is not None and ln[1] % LINE_FLOATS == 0 and all(c % LINE_FLOATS == 0 for c in ln[0].values())


def _place(s: ir.Stmt, target: ir.For, fetches: list) -> ir.Stmt:
    """`s` with `fetches` first in the body of the loop `target` (found by identity)."""
    if s is target:
        return dataclasses.replace(s, body=ir.seq(fetches + [s.body]))
    if isinstance(s, ir.Seq):
        return ir.Seq([_place(x, target, fetches) for x in s.stmts])
    if isinstance(s, (ir.For, ir.IfThen, ir.Allocate, ir.Unswitch)):
        return dataclasses.replace(s, body=_place(s.body, target, fetches))
    return s

