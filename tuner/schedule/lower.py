"""Lowering: a replayed Schedule becomes a loop nest (ir.Func).

Bound inference for compute_at works on interval forms: a value is `terms + [lo, hi]` where
`terms` is a symbolic linear part over the loops fixed at the attach point and `[lo, hi]` is the
constant range swept by the loops inside it. A producer computed at a consumer's loop gets a
local buffer covering exactly the region the consumer reads below that loop.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from ..te.dynamic import DynamicDims
from ..te.expr import (And, Cmp, Const, Expr, FloorDiv, FloorMod, Load, Max, Min, Reduce, Var, all_of, as_expr,
                       bounds, free_vars, from_linear, linear, simplify, substitute, transform, tree_size, walk)
from . import ir
from .schedule import Schedule, ScheduleError, Stage
from .peel import partition_selects, peel_guards, settle_tests, skip_dead_iterations, unswitch
from .prefetch import prefetch_panels
from .vthread import inject_virtual_threads

_NAME = re.compile(r"[^0-9A-Za-z_]")


def c_name(name: str) -> str:
    return _NAME.sub("_", name)


@dataclass
class Interval:
    terms: dict
    lo: int
    hi: int

    @property
    def exact(self) -> bool:
        return self.lo == self.hi


def _iv_add(a: Interval, b: Interval, sign: int = 1) -> Interval:
    terms = dict(a.terms)
    for t, c in b.terms.items():
        terms[t] = terms.get(t, 0) + sign * c
    terms = {t: c for t, c in terms.items() if c}
    if sign > 0:
        return Interval(terms, a.lo + b.lo, a.hi + b.hi)
    return Interval(terms, a.lo - b.hi, a.hi - b.lo)


def _iv_scale(a: Interval, k: int) -> Interval:
    lo, hi = sorted((a.lo * k, a.hi * k))
    return Interval({t: c * k for t, c in a.terms.items() if c * k}, lo, hi)


def interval_of(e: Expr, env: dict):
    """Interval form of an index expression, given interval forms of its vars; None if unknown."""
    if isinstance(e, Const):
        return Interval({}, e.value, e.value) if e.is_int else None
    if isinstance(e, Var):
        return env.get(e.name, Interval({e: 1}, 0, 0))
    ln = linear(e)
    if ln is not None and not (len(ln[0]) == 1 and next(iter(ln[0])) is e):
        out = Interval({}, ln[1], ln[1])
        for t, c in ln[0].items():
            sub = interval_of(t, env)
            if sub is None:
                return None
            out = _iv_add(out, _iv_scale(sub, c))
        return out
    if isinstance(e, (FloorDiv, FloorMod)) and isinstance(e.b, Const):
        c = e.b.value
        x = interval_of(e.a, env)
        if x is None:
            return None
        if x.exact:
            return Interval({type(e)(from_linear(x.terms, x.lo), e.b): 1}, 0, 0)
        if isinstance(e, FloorMod):
            return Interval({}, 0, c - 1)
        if all(k % c == 0 for k in x.terms.values()):
            return Interval({t: k // c for t, k in x.terms.items()}, x.lo // c, x.hi // c)
        return None
    # anything else (min/max/select of loop vars): exact only when all its vars are fixed
    ok = True

    def fix(n):
        nonlocal ok
        if isinstance(n, Var) and n.name in env:
            iv = env[n.name]
            if not iv.exact:
                ok = False
            return from_linear(iv.terms, iv.lo)
        return None

    fixed = transform(e, fix)
    return Interval({fixed: 1}, 0, 0) if ok else None


# nodes of a stage's body inlined where it is read, past which it is an error (chains of reshapes and
# slices of one tensor read twice grow as powers: Funnel's relative shifts); the caller computes it whole
INLINE_LIMIT = 20_000


class Lowerer:
    def __init__(self, sch: Schedule, func_name: str, dims: DynamicDims | None = None):
        self.sch = sch
        self.func_name = func_name
        self.dims = dims or DynamicDims(())
        self.buffers: dict = {}
        self.var_owner: dict = {}
        self.bodies = {s.name: self._inline(s.op.body) for s in sch.stages if s.attach[0] != "inline"}
        self.attached: dict = {}
        self.thread_vars: set = set()     # loop vars bound to threadIdx (relaxed for shared buffers)
        for s in sch.stages:
            if s.attach[0] == "at":
                self.attached.setdefault((s.attach[1], s.attach[2]), []).append(s)
        self._check_attachments()

    # ------------------------------------------------------------ inlining
    def _inline(self, body: Expr) -> Expr:
        inlined = {s.name: s for s in self.sch.stages if s.attach[0] == "inline"}
        if not inlined:
            return body

        def fn(n):
            if isinstance(n, Load) and n.buffer in inlined:
                st = inlined[n.buffer]
                body = substitute(st.op.body, {a.name: i for a, i in zip(st.op.axes, n.indices)})
                if (size := tree_size(body)) > INLINE_LIMIT:
                    raise ScheduleError(f"{st.name} inlined where it is read makes an expression of {size} nodes; "
                                        "compute it whole")
                return self._inline(body)
            return None

        if isinstance(body, Reduce):
            return Reduce(body.combiner, transform(body.source, fn), body.axes, body.init)
        return transform(body, fn)

    def _readers(self, name: str) -> list:
        return [s for s in self.sch.stages if s.name in self.bodies
                and any(isinstance(n, Load) and n.buffer == name for n in _walk_body(self.bodies[s.name]))]

    def _check_attachments(self):
        # a stage computed at a loop of `target` is read there only: by the target, or by stages
        # computed at the same loop after it (a softmax row: max, exp, sum at the output's row
        # loop); a shared (GPU block) stage by the target only
        for (target, _axis), stages in self.attached.items():
            for k, st in enumerate(stages):
                readers = {r.name for r in self._readers(st.name)}
                allowed = {target} | ({s.name for s in stages[k + 1:]} if st.scope != "shared" else set())
                if not readers or not readers <= allowed:
                    names = ", ".join(sorted(readers)) or "nothing"
                    raise ScheduleError(f"{st.name} is computed at {target} but is read by {names}; "
                                        f"compute_at needs its readers to be {target} or stages computed "
                                        f"at the same loop after it")
        # a stage computed at a stage that is itself (transitively) computed at it would never be built
        for s in self.sch.stages:
            seen, cur = set(), s
            while cur.attach[0] == "at":
                if cur.name in seen:
                    raise ScheduleError(f"compute_at cycle through {cur.name}")
                seen.add(cur.name)
                cur = self.sch.stage(cur.attach[1])

    # ------------------------------------------------------------ entry
    def lower(self) -> ir.Func:
        sch = self.sch
        args = [ir.Buffer(t.name, t.shape, "arg") for t in sch.inputs]
        args.append(ir.Buffer(sch.output_name, sch.shape_of(sch.output_name), "arg"))
        temps = []
        for b in args:
            self.buffers[b.name] = b
        nests = []
        for st in sch.stages:
            if st.attach[0] != "root":
                continue
            shape = sch.shape_of(st.name)
            if st.name != sch.output_name:
                buf = ir.Buffer(st.name, shape, "global")
                temps.append(buf)
                self.buffers[st.name] = buf
            region = [Interval({}, 0, e - 1) for e in shape]
            nests.append(self.build_stage(st, region, {}, {}, limits=self.dims.tensor(st.name),
                                          gaps=self.dims.tensor_gaps(st.name)))
        return ir.Func(self.func_name, args, temps, ir.seq(nests), self.buffers, self.dims.symbols)

    # ------------------------------------------------------------ one stage
    def build_stage(self, st: Stage, region: list, offsets: dict, outer_ranges: dict,
                    guards: tuple = (), limits: tuple = (), gaps: dict | None = None) -> ir.Stmt:
        """Loop nest of `st` over `region` (interval forms of its output dims, in outer loop vars).

        offsets: tensor name -> base expressions of local buffers visible here.
        outer_ranges: loop var -> extent of loops enclosing this nest (for guard elimination).
        guards: region guards this stage needs (its region may overrun its tensor's shape).
        limits: the run-time extents of the region's dims that are whole dynamic dimensions.
        gaps: {dim: (period, rows)} of the root's dims that merge two varying ones (_gap_tests).
        """
        op = st.op
        root_ext = {a.name: region[k].hi - region[k].lo + 1 for k, a in enumerate(op.axes)}
        root_ext.update({r.name: r.extent for r in op.reduce_axes})
        root_lim = {a.name: limits[k] for k, a in enumerate(op.axes) if k < len(limits) and limits[k] is not None}
        root_lim.update({r.name: lim for r in op.reduce_axes
                         if (lim := self.dims.reduce_limit(st.name, r.name)) is not None})
        leaf_ext, split_guards, leaf_lim, skips = self._leaf_extents(st, root_ext, root_lim)
        var = {leaf: self._var_name(st, leaf) for leaf in st.leaves}
        leaf_val = {leaf: (Var(var[leaf]) if leaf_ext[leaf] > 1 else Const(0)) for leaf in st.leaves}
        axis_val = self._axis_values(st, leaf_val, leaf_ext)
        gap_tests = _gap_tests(st, {op.axes[d].name: g for d, g in (gaps or {}).items()}, leaf_ext, axis_val)
        root_val = {n: axis_val[n] for n in st.root_names}
        base = {a.name: from_linear(region[k].terms, region[k].lo) for k, a in enumerate(op.axes)}
        ranges = dict(outer_ranges)
        ranges.update({var[leaf]: leaf_ext[leaf] for leaf in st.leaves if leaf_ext[leaf] > 1})
        self.thread_vars.update(var[leaf] for leaf in st.leaves if st.annotations.get(leaf) in _RELAXED)

        # producers computed at one of our loops: infer their regions first
        offsets = dict(offsets)
        at_leaf = {}
        for leaf in st.leaves:
            prods = self.attached.get((st.name, leaf), [])
            fixed_upto = st.leaves.index(leaf)
            regions = {}
            for k in range(len(prods) - 1, -1, -1):     # a producer's readers there come after it
                prod = prods[k]
                read = self._read_region(st, prod, fixed_upto, leaf_val, leaf_ext, base, ranges)
                shape = self.sch.shape_of(prod.name)
                for sib in prods[k + 1:]:
                    more = self._sibling_reads(sib, regions[sib.name][0], prod)
                    read = [_merge(x, y, n) for x, y, n in zip(read, more, shape)]
                regions[prod.name] = self._close_region(prod, read, ranges)
            for prod in prods:
                preg, pguards, plims = regions[prod.name]
                offsets[prod.name] = [from_linear(iv.terms, iv.lo) for iv in preg]
                at_leaf.setdefault(leaf, []).append((prod, preg, pguards, plims))

        local = st.attach[0] == "at"
        if st.storage and not local:
            raise ScheduleError(f"storage_order of {st.name}: only a stage computed at a loop has a buffer of its own")
        if local:
            scope = "shared" if st.scope == "shared" else "local"
            names = [a.name for a in op.axes]
            self.buffers[st.name] = ir.Buffer(st.name, tuple(root_ext[n] for n in names), scope,
                                              tuple(names.index(n) for n in st.storage))
        store_idx = tuple(root_val[a.name] for a in op.axes)
        global_val = {a.name: (root_val[a.name] + base[a.name]) if local else root_val[a.name] for a in op.axes}
        global_val.update({r.name: root_val[r.name] for r in op.reduce_axes})

        body = self.bodies[st.name]
        source = body.source if isinstance(body, Reduce) else body
        value = self._rebase_loads(substitute(source, global_val), offsets)
        spatial_guards = [g for g, kind in split_guards if kind == "spatial"] + list(guards)
        all_guards = spatial_guards + [g for g, kind in split_guards if kind == "reduce"]
        if isinstance(body, Reduce):
            current = Load(st.name, store_idx)
            combined = current + value if body.combiner == "sum" else Max(current, value)
            main = ir.Store(st.name, store_idx, combined)
            init = ir.Store(st.name, store_idx, body.init)
        else:
            main, init = ir.Store(st.name, store_idx, value), None
        main = _guard(main, all_guards, axis_val, global_val)
        init = _guard(init, spatial_guards, axis_val, global_val) if init is not None else None

        first_reduce = next((k for k, leaf in enumerate(st.leaves) if st.is_reduce(leaf)), None)
        stmt = main
        for prod, preg, pguards, plims in reversed(at_leaf.get(st.leaves[-1], [])):
            stmt = self._with_producer(prod, preg, pguards, plims, offsets, ranges, stmt)
        for k in range(len(st.leaves) - 1, -1, -1):
            leaf = st.leaves[k]
            if leaf in skips:
                stmt = ir.IfThen(all_of(*(Cmp("<", axis_val[p], lim) for p, lim in skips[leaf])), stmt)
            if leaf in gap_tests:
                stmt = ir.IfThen(gap_tests[leaf], stmt)
            if leaf_ext[leaf] > 1:
                stmt = ir.For(var[leaf], leaf_ext[leaf], stmt, st.annotations.get(leaf, "serial"),
                              st.auto_unroll.get(leaf, 0), leaf_lim.get(leaf))
            elif st.auto_unroll.get(leaf) and isinstance(stmt, ir.For):
                stmt.auto_unroll = max(stmt.auto_unroll, st.auto_unroll[leaf])
            if leaf in st.unswitch:
                stmt = ir.Unswitch(stmt)
            parts = []
            if init is not None and k == first_reduce:
                parts.append(self._init_nest(st, init, k, leaf_ext, var, leaf_lim))
            parts.append(stmt)
            stmt = ir.seq(parts)
            for prod, preg, pguards, plims in reversed(at_leaf.get(st.leaves[k - 1], []) if k > 0 else []):
                stmt = self._with_producer(prod, preg, pguards, plims, offsets, ranges, stmt)
        if init is not None and first_reduce is None:
            stmt = ir.seq([init, stmt])
        return stmt

    def _var_name(self, st: Stage, leaf: str) -> str:
        """The leaf's own name when no other stage uses it, else prefixed by the stage."""
        name = c_name(leaf)
        owner = self.var_owner.setdefault(name, st.name)
        return name if owner == st.name else f"{c_name(st.name)}_{name}"

    def _with_producer(self, prod, preg, pguards, plims, offsets, ranges, rest):
        nest = self.build_stage(prod, preg, offsets, ranges, pguards, plims)
        buf = self.buffers[prod.name]
        # a shared tile: every thread done with the last one before the fill, the fill complete after
        body = [ir.Sync(), nest, ir.Sync(), rest] if buf.scope == "shared" else [nest, rest]
        return ir.Allocate(prod.name, buf.shape, ir.seq(body), buf.scope)

    def _init_nest(self, st: Stage, init: ir.Stmt, k: int, leaf_ext: dict, var: dict, leaf_lim: dict) -> ir.Stmt:
        stmt = init
        for leaf in reversed(st.leaves[k:]):
            if st.is_reduce(leaf) or leaf_ext[leaf] == 1:
                continue
            stmt = ir.For(var[leaf], leaf_ext[leaf], stmt, st.annotations.get(leaf, "serial"), limit=leaf_lim.get(leaf))
        return stmt

    # ------------------------------------------------------------ axes
    def _leaf_extents(self, st: Stage, root_ext: dict, root_lim: dict):
        """(extent of every axis at the bound shape, guards, run-time trip counts of the dynamic
        axes, the tests that skip a fused loop's iterations past an inner part's trip count). A
        dynamic axis split runs ceil(limit / inner) iterations of its outermost child that loops
        (its middle children: _tile_limits); fused, it keeps its limit as the outermost part only. A spatial tile may run past the
        limit, inside the bound shape: what it computes there lands in the padding, which no
        result reads; where the tile is the whole dim and a register tile (unrolled, or vectorised
        over at most TILE_ROW_LANES), it runs whole, a run-time trip count would undo it. A
        reduction is guarded at the limit: the padding must not enter a sum."""
        ext, lim = dict(root_ext), dict(root_lim)
        guards, skips = [], {}
        for rel in st.relations:
            if rel[0] == "split":
                _, parent, children, factors = rel
                e = ext[parent]
                inner_exts = []
                for f in reversed(factors):
                    f = min(f, e)
                    inner_exts.append(f)
                    e = -(-e // f)
                exts = [e] + list(reversed(inner_exts))
                for c, x in zip(children, exts):
                    ext[c] = x
                covered = 1
                for x in exts:
                    covered *= x
                kind = "reduce" if st.is_reduce(parent) else "spatial"
                j = next((i for i, x in enumerate(exts) if x > 1), len(exts) - 1)
                if parent in lim and kind == "spatial" and j == len(children) - 1 and exts[j] <= TILE_ROW_LANES and \
                        st.annotations.get(children[j]) in _REGISTER_TILE:
                    lim.pop(parent)      # a register tile (the whole dim: 8 rows of 1..8) runs whole, into the padding
                if parent in lim:        # the outermost child that loops runs what the limit needs
                    inner = 1
                    for x in exts[j + 1:]:
                        inner *= x
                    lim[children[j]] = simplify((lim[parent] + Const(inner - 1)) // Const(inner))
                    lim.update(self._tile_limits(st, children, exts, j, lim[parent]))
                guards.extend(((p, limit), kind) for p, limit in skips.pop(parent, []))   # fused, then split
                if parent in lim and kind == "reduce" and covered != 1:
                    guards.append(((parent, lim[parent]), kind))
                elif covered != ext[parent]:
                    guards.append(((parent, ext[parent]), kind))
            else:
                _, parts, fused = rel
                e = 1
                for p in parts:
                    e *= ext[p]
                ext[fused] = e
                live = [p for p in parts if ext[p] > 1]
                if live and live[0] in lim:
                    lim[fused] = simplify(lim[live[0]] * Const(e // ext[live[0]]))
                # an inner dynamic part runs its bound extent: an iteration past its run-time one is
                # skipped at the top of the fused loop's body (one test per iteration, not one per
                # statement inside it, which would keep its loops from being vectorised)
                skip = [(p, lim[p]) for p in live[1:] if p in lim] + [g for p in parts for g in skips.pop(p, [])]
                if skip:
                    skips[fused] = skip
        return ext, guards, lim, skips

    def _tile_limits(self, st: Stage, children: list, exts: list, j: int, limit) -> dict:
        """Run-time trip counts of a dynamic axis's middle tile loops: in the tile where the run's
        extent ends, each stops at the last of its iterations that holds any of it, so a tile tuned
        for a larger value runs past the extent by less than one innermost tile (64 rows tuned at 64
        run at 16 as 16, not 64). Only for children that are loops of their own, nested in order."""
        if any(c not in st.leaves for c in children[j:]) or \
                [st.leaves.index(c) for c in children[j:]] != sorted(st.leaves.index(c) for c in children[j:]):
            return {}
        out, prefix = {}, None
        for i in range(j, len(children) - 1):
            stride = 1
            for x in exts[i + 1:]:
                stride *= x
            if i > j and exts[i] > 1:
                rest = limit - prefix
                out[children[i]] = simplify(Min(Const(exts[i]), (rest + Const(stride - 1)) // Const(stride)))
            if exts[i] > 1:
                term = Var(self._var_name(st, children[i])) * Const(stride)
                prefix = term if prefix is None else prefix + term
        return out

    def _axis_values(self, st: Stage, leaf_val: dict, ext: dict) -> dict:
        """Value of every axis (root, split and fused) as an expression of the leaf loop vars."""
        val = dict(leaf_val)
        for rel in reversed(st.relations):
            if rel[0] == "split":
                _, parent, children, _ = rel
                v = val[children[0]]
                for c in children[1:]:
                    v = v * Const(ext[c]) + val[c]
                val[parent] = v
            else:
                _, parts, fused = rel
                f = val[fused]
                stride = 1
                for p in reversed(parts):
                    val[p] = (f // Const(stride)) % Const(ext[p]) if p != parts[0] else f // Const(stride)
                    stride *= ext[p]
        return val

    def _root_intervals(self, st: Stage, fixed_upto: int, leaf_val: dict, ext: dict, relax=frozenset()) -> dict:
        """Interval forms of `st`'s root axes with its leaves up to `fixed_upto` fixed, except
        those in `relax` (swept, as the loops inside)."""
        iv = {}
        for k, leaf in enumerate(st.leaves):
            v = leaf_val[leaf]
            if (k <= fixed_upto and leaf not in relax) or ext[leaf] == 1:
                iv[leaf] = Interval({v: 1}, 0, 0) if isinstance(v, Var) else Interval({}, 0, 0)
            else:
                iv[leaf] = Interval({}, 0, ext[leaf] - 1)
        for rel in reversed(st.relations):
            if rel[0] == "split":
                _, parent, children, _ = rel
                cur = iv[children[0]]
                for c in children[1:]:
                    cur = _iv_add(_iv_scale(cur, ext[c]), iv[c])
                iv[parent] = cur
            else:
                _, parts, fused = rel
                f = iv[fused]
                stride = 1
                for p in reversed(parts):
                    if f.exact:
                        fe = from_linear(f.terms, f.lo)
                        e = FloorDiv(fe, Const(stride))
                        e = FloorMod(e, Const(ext[p])) if p != parts[0] else e
                        iv[p] = Interval({e: 1}, 0, 0)
                    else:
                        iv[p] = Interval({}, 0, ext[p] - 1)
                    stride *= ext[p]
        return iv

    # ------------------------------------------------------------ bound inference
    def _read_region(self, st, prod, fixed_upto, leaf_val, leaf_ext, base, ranges) -> list:
        """The region of `prod` that `st` reads below its leaf `fixed_upto` (None in a dimension it
        does not read). A shared buffer serves every thread of the block: its region is relaxed
        over the threadIdx and vthread loops, st's own and those its base depends on."""
        shared = prod.scope == "shared"
        relax = {leaf for leaf in st.leaves if st.annotations.get(leaf) in _RELAXED} if shared else set()
        root_iv = self._root_intervals(st, fixed_upto, leaf_val, leaf_ext, relax)
        env = {}
        local = st.attach[0] == "at"
        for a, extent in zip(st.op.axes, self.sch.shape_of(st.name)):
            b = linear(base[a.name]) if local else ({}, 0)
            b_iv = Interval(b[0], b[1], b[1])
            if shared:
                b_iv = self._relax_threads(b_iv, ranges) or Interval({}, 0, extent - 1)
            env[a.name] = _iv_add(b_iv, root_iv[a.name])
        for r in st.op.reduce_axes:
            env[r.name] = root_iv[r.name]
        return self._reads(st, prod, env)

    def _sibling_reads(self, sib, region: list, prod) -> list:
        """The region of `prod` that `sib`, computed over `region` at the same loop, reads."""
        env = {a.name: iv for a, iv in zip(sib.op.axes, region)}
        env.update({r.name: Interval({}, 0, r.extent - 1) for r in sib.op.reduce_axes})
        return self._reads(sib, prod, env)

    def _reads(self, st, prod, env: dict) -> list:
        shape = self.sch.shape_of(prod.name)
        region = [None] * len(shape)
        for load in (n for n in _walk_body(self.bodies[st.name]) if isinstance(n, Load) and n.buffer == prod.name):
            for d, idx in enumerate(load.indices):
                iv = interval_of(idx, env)
                region[d] = _merge(region[d], Interval({}, 0, shape[d] - 1) if iv is None else iv, shape[d])
        return region

    def _close_region(self, prod, region: list, ranges: dict) -> tuple:
        """(region with unread dimensions whole, guards where it may overrun the tensor, the
        run-time extents of its whole dynamic dimensions)."""
        shape = self.sch.shape_of(prod.name)
        dyn = self.dims.tensor(prod.name)
        region, guards, limits = list(region), [], [None] * len(shape)
        for d, iv in enumerate(region):
            lim = dyn[d] if d < len(dyn) else None
            if iv is None:
                iv = region[d] = Interval({}, 0, shape[d] - 1)
            ext = iv.hi - iv.lo + 1
            if ext >= shape[d]:
                region[d] = Interval({}, 0, shape[d] - 1)
                limits[d] = lim
                continue
            b = bounds(from_linear(iv.terms, iv.lo), {k: (0, e - 1) for k, e in ranges.items()})
            if b is None or b[0] < 0 or b[1] + ext > shape[d]:
                guards.append((d, shape[d]))
        return region, tuple(guards), tuple(limits)

    def _relax_threads(self, iv: Interval, ranges: dict):
        """`iv` with its terms that depend on a threadIdx loop replaced by their range (None where
        a term's bounds are unknown)."""
        terms, lo, hi = {}, iv.lo, iv.hi
        var_ranges = {k: (0, e - 1) for k, e in ranges.items()}
        for t, c in iv.terms.items():
            if free_vars(t) & self.thread_vars:
                b = bounds(t, var_ranges)
                if b is None:
                    return None
                lo += min(c * b[0], c * b[1])
                hi += max(c * b[0], c * b[1])
            else:
                terms[t] = c
        return Interval(terms, lo, hi)

    def _rebase_loads(self, e: Expr, offsets: dict) -> Expr:
        if not offsets:
            return e

        def fn(n):
            if isinstance(n, Load) and n.buffer in offsets:
                return Load(n.buffer, tuple(i - b for i, b in zip(n.indices, offsets[n.buffer])))
            return None

        return transform(e, fn)


def _guard(stmt, guards, axis_val, global_val):
    """Wrap `stmt` in the conditions that keep a non-divisible split or overrunning tile in bounds."""
    conds = []
    for g in guards:
        if isinstance(g[0], str):       # split guard: (split axis, its extent or run-time limit)
            conds.append(Cmp("<", axis_val[g[0]], as_expr(g[1])))
        else:                           # region guard: (dim, tensor extent or run-time limit)
            d, limit = g
            names = list(global_val)
            v = global_val[names[d]]
            conds.append(And(Cmp("<=", Const(0), v), Cmp("<", v, as_expr(limit))))
    if not conds:
        return stmt
    c = conds[0]
    for x in conds[1:]:
        c = And(c, x)
    return ir.IfThen(c, stmt)


def _merge(a, b, size: int):
    """The smallest interval form holding both (None: nothing read), the whole dimension where
    their terms differ."""
    if a is None or b is None:
        return b if a is None else a
    if a.terms != b.terms:
        return Interval({}, 0, size - 1)
    return Interval(a.terms, min(a.lo, b.lo), max(a.hi, b.hi))


def _walk_body(body: Expr):
    if isinstance(body, Reduce):
        yield from walk(body.source)
    else:
        yield from walk(body)


_RELAXED = ("threadIdx.x", "vthread")     # loops a shared buffer serves all of
_REGISTER_TILE = ("unroll", "vectorize")   # loops whose body is replicated: a run-time trip count undoes them
REGISTER_TILE = 512       # elements of a local tile the compiler may keep in registers (32 of 16 lanes)
TILE_ROW_LANES = 64       # lanes of a register tile's row: 4 vectors of 16
UNROLL_MAX = 1024         # statements (a vector op one) a loop over a local tile may unroll into


def _tile_uses(s: ir.Stmt, tiles: frozenset) -> set:
    """(tile, var) for each of `tiles` that `s` itself (not its body) reads or writes at an index moving with var."""
    exprs = [s.value, *s.indices] if isinstance(s, ir.Store) else [s.cond] if isinstance(s, ir.IfThen) else []
    uses = {(s.buffer, v) for i in s.indices for v in free_vars(i)} if isinstance(s, ir.Store) and s.buffer in tiles else set()
    return uses | {(n.buffer, v) for e in exprs for n in walk(e) if isinstance(n, Load) and n.buffer in tiles
                   for i in n.indices for v in free_vars(i)}


def unroll_register_tiles(s: ir.Stmt, tiles: frozenset = frozenset()) -> ir.Stmt:
    """Every serial loop over a small local tile (an accumulator of at most REGISTER_TILE elements)
    with nothing but unrolled or vector loops inside, unrolled: the epilogue that reads the
    accumulators back is such a loop, and left a loop, its index into the tile is not a constant,
    so the C compiler keeps the whole tile in memory, and every FMA of the reduction loads and
    stores it (a depthwise conv with a SiLU epilogue 1.6x slower: docs/history.md). A loop whose
    unrolled nest would pass UNROLL_MAX statements stays a loop: a reduction over a small padded
    input tile, unrolled whole, gave gcc a body it did not finish in 11 minutes."""
    return _unroll_tiles(s, tiles)[0]


def _unroll_tiles(s: ir.Stmt, tiles: frozenset) -> tuple:
    """(s rewritten, whether every loop in it unrolls or vectorizes, its tile uses): one walk, inner loops first."""
    if isinstance(s, ir.Allocate):
        small = s.scope == "local" and all(isinstance(d, int) for d in s.shape) and math.prod(s.shape) <= REGISTER_TILE
        body, straight, uses = _unroll_tiles(s.body, tiles | {s.buffer} if small else tiles)
        return dataclasses.replace(s, body=body), straight, uses
    if isinstance(s, ir.Seq):
        done = [_unroll_tiles(x, tiles) for x in s.stmts]
        return ir.Seq([d[0] for d in done]), all(d[1] for d in done), set().union(*(d[2] for d in done))
    if not isinstance(s, (ir.For, ir.IfThen, ir.Unswitch)):
        return s, True, _tile_uses(s, tiles)
    body, straight, uses = _unroll_tiles(s.body, tiles)
    s = dataclasses.replace(s, body=body)
    uses |= _tile_uses(s, tiles)
    if not isinstance(s, ir.For):
        return s, straight, uses
    if (straight and s.kind == "serial" and s.limit is None
            and any(b in tiles and v == s.var for b, v in uses) and ir.nest_steps(s, vector_ops=True) <= UNROLL_MAX):
        s = dataclasses.replace(s, kind="unroll")
    # a vector loop longer than a register tile's row (a reduction over a whole row: TopK's ranks) is
    # work to keep a loop, not lanes of the tile
    return s, straight and (s.kind == "unroll" or s.kind == "vectorize" and s.extent <= TILE_ROW_LANES), uses


# A dim that merges two varying ones (a Winograd GEMM's tile rows and columns, a dense over [batch,
# seq] rows) holds the run's rows in the first `rows` of each `period` (the inner dim's bound): the
# kernel runs the prefix that covers them, and its outermost tile loop over the dim skips each tile
# that lies wholly between them (ResNet-50's Winograd GEMMs at 224 in a 512 range: 18 of every 32
# tile columns). A tile of a period or more always holds some.
_GAP_LOOPS = ("serial", "parallel")


def _gap_tests(st: Stage, gaps: dict, ext: dict, value: dict) -> dict:
    """{leaf: the test that its tile holds some of the run's rows} for the root axes in `gaps`: at
    the loop of the axis's outermost looping tile, or of the parallel loop it is fused into (its
    value there an expression of the fused loop's; an iteration that holds part of the tile is
    skipped where the whole tile is)."""
    out = {}
    for axis, (period, rows) in gaps.items():
        split = next((rel for rel in st.relations if rel[0] == "split" and rel[1] == axis), None)
        children = split[2] if split else [axis]
        j = next((i for i, c in enumerate(children) if ext.get(c, 1) > 1), None)
        if j is None:
            continue
        leaf = children[j]
        while leaf not in st.leaves and (fuse := next((r for r in st.relations if r[0] == "fuse" and leaf in r[1]), None)):
            leaf = fuse[2]
        if leaf not in st.leaves or st.annotations.get(leaf, "serial") not in _GAP_LOOPS:
            continue
        tile = math.prod(ext[c] for c in children[j + 1:])
        if tile >= period:
            continue
        at = FloorMod(value[children[j]] * Const(tile), Const(period))      # where the tile starts in its period
        gap = Cmp("<=", rows, at) if period % tile == 0 else And(Cmp("<=", rows, at), Cmp("<=", at, Const(period - tile)))
        test = Cmp("==", gap, Const(0))
        out[leaf] = And(out[leaf], test) if leaf in out else test
    return out


def lower(sch: Schedule, func_name: str = "kernel", dims: DynamicDims | None = None) -> ir.Func:
    """The loop nest of a replayed schedule; with `dims`, a dynamic kernel (te.dynamic): its
    buffers at the bound shapes, its loops over the dynamic dimensions stopping at the run's."""
    func = settle_tests(peel_guards(partition_selects(skip_dead_iterations(inject_virtual_threads(unswitch(
        Lowerer(sch, func_name, dims).lower()))))))
    # unrolled first: a prefetch sits only in a loop that stays a loop
    return prefetch_panels(dataclasses.replace(func, body=unroll_register_tiles(func.body)), sch.prefetches)
