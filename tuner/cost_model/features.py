"""Ansor-style features: one fixed-length vector per store statement of a lowered loop nest.

For every store we look at the loops around it (extents, annotations) and at each buffer it
touches (how many bytes, how many distinct bytes and cache lines, the stride in the innermost
loop, and reuse: the innermost loop the access does not move with, how far apart the reuses
are and how many there are). Counts are per whole kernel (multiplied by the loop trip count) and
log2(1 + x)-scaled so that the model sees orders of magnitude. `feature_names()` documents every
column; a candidate is a matrix with one row per store (the model sums per-row predictions).
"""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import numpy as np

from ..codegen.c import is_float
from ..schedule.ir import vector_lanes
from ..codegen.cuda import launch_shape
from ..schedule import ir
from ..te.expr import (Add, And, Call, Cmp, Const, Div, Expr, FloorDiv, FloorMod, Load, Max, Min, Mul, Select, Sub, Var,
                       free_vars, walk)

MAX_BUFFERS = 5
CURVE_POINTS = 10
LINE_BYTES = 64

_STMT = ["float_addsub", "float_mul", "float_div", "float_maxmin", "float_select_cmp", "float_math", "int_ops",
         "trip_count", "num_loops", "innermost_extent", "outer_extent",
         "vec_len", "vec_depth", "num_vec_loops", "unroll_prod", "num_unroll_loops", "auto_unroll_max",
         "parallel_extent", "num_parallel_loops", "guarded", "is_reduction_update", "is_init", "alloc_floats",
         "num_allocs", "workload_flops",
         # the register tile of a reduction: loops inside the innermost reduction loop
         "acc_per_reduce_step", "loops_inside_reduce", "inner_reduce_extent", "inner_reduce_unrolled",
         "reduce_loops", "reduce_trip", "loads_per_step", "tile_footprint_bytes",
         # what the C generator makes of the vectorised loop: register width used, how many
         # registers per step (chunks), and loads it must gather lane by lane
         "vec_lanes_emitted", "vec_chunks", "vec_gathers"]
_BUF = ["is_read", "is_write", "is_local", "bytes", "unique_bytes", "lines", "stride_inner", "is_contiguous",
        "reuse_loop_carried", "reuse_distance_iters", "reuse_distance_bytes", "reuse_count", "bytes_per_iter",
        # the innermost loop that really steps (not vectorised, not unrolled): how far each of its
        # iterations jumps in this buffer and how far one pass of it reaches (prefetch, TLB)
        "stride_stepping", "span_stepping_bytes"]


@lru_cache(maxsize=1)
def feature_names() -> tuple:
    names = [f"stmt.{n}" for n in _STMT]
    for b in range(MAX_BUFFERS):
        names += [f"buf{b}.{n}" for n in _BUF]
    names += [f"intensity.{k}" for k in range(CURVE_POINTS)]
    return tuple(names)


def num_features() -> int:
    return len(feature_names())


FEATURES_VERSION = 1   # bump when a feature's meaning changes without its name changing


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """Identifies the feature set: a saved model is only valid for the features it was trained on."""
    import hashlib
    return hashlib.sha256(repr((FEATURES_VERSION, feature_names())).encode()).hexdigest()[:16]


def _log(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


_FLOAT_OPS = {Add: "addsub", Sub: "addsub", Mul: "mul", Div: "div", Max: "maxmin", Min: "maxmin"}


def _op_counts(e: Expr, counts: dict) -> bool:
    """Count e's operations into `counts` in one pass; returns whether e is float-valued."""
    t = type(e)
    if t is Const:
        return not e.is_int
    if t is Var:
        return False
    if t is Load:
        for i in e.indices:
            _op_counts(i, counts)
        return True
    if t is Call:
        for a in e.args:
            _op_counts(a, counts)
        counts["float"]["math"] += 1
        return True
    if t in (Select, Cmp, And):
        kids = (e.cond, e.then, e.other) if t is Select else (e.a, e.b)
        flt = [_op_counts(k, counts) for k in kids]
        counts["float"]["select_cmp"] += 1
        return any(flt[1:]) if t is Select else False
    if t in (FloorDiv, FloorMod):
        _op_counts(e.a, counts)
        _op_counts(e.b, counts)
        counts["int"]["div"] += 1
        return False
    if t in _FLOAT_OPS:
        flt = _op_counts(e.a, counts) | _op_counts(e.b, counts) or t is Div
        kind = _FLOAT_OPS[t]
        counts["float" if flt else "int"][kind if flt or kind != "div" else "div"] += 1
        return flt
    if hasattr(e, "value"):          # Cast
        _op_counts(e.value, counts)
        return True
    return False


def _lane_vectorisable(e: Expr, var: str) -> bool:
    """Whether the C generator can evaluate `e` for all lanes of loop `var` at once (its vexpr)."""
    if var not in free_vars(e) or isinstance(e, Load):
        return True
    if not is_float(e):
        return False
    if isinstance(e, (Add, Sub, Mul, Div, Max, Min)):
        return _lane_vectorisable(e.a, var) and _lane_vectorisable(e.b, var)
    if isinstance(e, Select) and var not in free_vars(e.cond):
        return _lane_vectorisable(e.then, var) and _lane_vectorisable(e.other, var)
    return False


class _Extractor:
    def __init__(self, func: ir.Func, flops: float, max_lanes: int):
        self.func = func
        self.flops = flops
        self.max_lanes = max_lanes
        self.rows: list = []

    def run(self) -> np.ndarray:
        self._visit(self.func.body, [], [], (), 0)
        if not self.rows:
            return np.zeros((1, num_features()), np.float32)
        return np.asarray(self.rows, np.float32)

    def _visit(self, s, loops: list, allocs: list, guards: tuple, budget: int):
        if isinstance(s, ir.Seq):
            for x in s.stmts:
                self._visit(x, loops, allocs, guards, budget)
        elif isinstance(s, ir.For):
            budget = max(budget, s.auto_unroll)
            if s.kind == "serial" and ir.unrolled(s, budget):
                s = dataclasses.replace(s, kind="unroll")     # what the C generator unrolls
            self._visit(s.body, loops + [s], allocs, guards, budget)
        elif isinstance(s, ir.IfThen):
            self._visit(s.body, loops, allocs, guards + (s.cond,), budget)
        elif isinstance(s, ir.Allocate):
            size = math.prod(s.shape)
            self._visit(s.body, loops, allocs + [size], guards, budget)
        elif isinstance(s, ir.Store):
            self.rows.append(self._store(s, loops, allocs, guards))

    def _offset(self, buffer: str, indices: tuple):
        """Flat element offset as a linear form ({term: coef}, const), or None if not affine.

        No simplification: index expressions are affine in the loop vars (div/mod of fused or
        re-laid axes stay opaque terms), which is all the stride and reuse features need.
        """
        return ir.flat_linear(*self.func.buffers[buffer].stored(indices))

    def _store(self, s: ir.Store, loops: list, allocs: list, guards: tuple) -> list:
        guarded = len(guards)
        ranges = {lp.var: (0, lp.extent - 1) for lp in loops}
        trip = float(math.prod([lp.extent for lp in loops])) if loops else 1.0
        counts = {"float": dict.fromkeys(("addsub", "mul", "div", "maxmin", "select_cmp", "math"), 0),
                  "int": dict.fromkeys(("addsub", "mul", "div", "maxmin"), 0)}
        _op_counts(s.value, counts)       # includes the index arithmetic of its loads
        for i in s.indices:
            _op_counts(i, counts)
        loads = [n for n in walk(s.value) if isinstance(n, Load)]
        is_update = any(ld.buffer == s.buffer and ld.indices == s.indices for ld in loads)
        vec = [k for k, lp in enumerate(loops) if lp.kind == "vectorize"]
        unrolled = [lp for lp in loops if lp.kind == "unroll"]
        par = [lp for lp in loops if lp.kind == "parallel"]
        row = [
            _log(counts["float"]["addsub"] * trip), _log(counts["float"]["mul"] * trip),
            _log(counts["float"]["div"] * trip), _log(counts["float"]["maxmin"] * trip),
            _log(counts["float"]["select_cmp"] * trip), _log(counts["float"]["math"] * trip),
            _log(sum(counts["int"].values()) * trip), _log(trip), len(loops),
            _log(loops[-1].extent if loops else 1), _log(loops[0].extent if loops else 1),
            _log(loops[vec[-1]].extent if vec else 0), (len(loops) - 1 - vec[-1]) if vec else 0, len(vec),
            _log(float(math.prod([lp.extent for lp in unrolled])) if unrolled else 0), len(unrolled),
            _log(max((lp.auto_unroll for lp in loops), default=0)),
            _log(par[0].extent if par else 0), len(par), guarded, float(is_update),
            float(not loads and isinstance(s.value, Const)), _log(sum(allocs)), len(allocs), _log(self.flops),
        ]
        row += self._reduction_features(s, loops, loads, is_update)
        accesses = {}
        for ld in loads:
            acc = accesses.setdefault((ld.buffer, ld.indices), {"read": 0, "write": 0})
            acc["read"] = 1
        accesses.setdefault((s.buffer, s.indices), {"read": 0, "write": 0})["write"] = 1
        feats, access_deps, lane_strides = [], [], []
        for (buf, idx), kind in accesses.items():
            strides, deps = self._strides(buf, idx, loops, ranges)
            access_deps.append(deps)
            lane_strides.append((kind["write"], strides[vec[-1]] if vec else 0))
            feats.append(self._buffer(buf, kind, loops, strides, trip))
        row += self._vector_features(s, loops, vec, guards, lane_strides)
        feats.sort(key=lambda f: -f[3])
        for f in feats[:MAX_BUFFERS]:
            row += f
        row += [0.0] * (len(_BUF) * (MAX_BUFFERS - min(len(feats), MAX_BUFFERS)))
        row += self._intensity_curve(loops, counts, access_deps)
        return row

    def _vector_features(self, s, loops, vec, guards, lane_strides) -> list:
        """Mirrors the C generator: only an innermost vector loop whose extent is a multiple of 4,
        whose store is contiguous, whose guards do not depend on the lane and whose value has only
        float arithmetic in the lane becomes vector code (else it falls back to `omp simd`)."""
        if not vec or vec[-1] != len(loops) - 1:
            return [0.0, 0.0, 0.0]
        var = loops[-1].var
        if any(var in free_vars(g) for g in guards) or not _lane_vectorisable(s.value, var):
            return [0.0, 0.0, 0.0]
        extent = loops[-1].extent
        lanes = vector_lanes(extent, self.max_lanes)
        # a None stride (div/mod of a packed layout) is usually contiguous within a register
        if not lanes or any(write and st not in (1, None) for write, st in lane_strides):
            return [0.0, 0.0, 0.0]
        gathers = sum(1 for write, st in lane_strides if not write and st not in (0, 1, None))
        return [float(lanes), _log(extent // lanes), float(gathers)]

    def _reduction_features(self, s, loops, loads, is_update) -> list:
        """How the work inside the innermost reduction loop is shaped (zeros for plain stores)."""
        if not is_update or not loops:
            return [0.0] * 8
        out_vars = set().union(*(free_vars(i) for i in s.indices)) if s.indices else set()
        red = [k for k, lp in enumerate(loops) if lp.var not in out_vars]
        if not red:
            return [0.0] * 8
        inner_k, outer_k = red[-1], red[0]
        inside = loops[inner_k + 1:]
        acc = float(math.prod([lp.extent for lp in inside])) if inside else 1.0
        unrolled = loops[inner_k].kind == "unroll" or any(
            lp.auto_unroll and lp.auto_unroll >= float(math.prod([x.extent for x in loops[j:]]))
            for j, lp in enumerate(loops[: inner_k + 1]))
        per_step = len({(ld.buffer, ld.indices) for ld in loads})
        tile = 0.0
        for ld in loads:
            deps = set().union(*(free_vars(i) for i in ld.indices)) if ld.indices else set()
            tile += 4.0 * float(math.prod([lp.extent for lp in loops[outer_k:] if lp.var in deps]) or 1.0)
        return [_log(acc), len(inside), _log(loops[inner_k].extent), float(unrolled), len(red),
                _log(float(math.prod([loops[k].extent for k in red]))), _log(per_step * acc), _log(tile)]

    def _strides(self, buf, idx, loops, ranges):
        """Element stride of the access in each enclosing loop (None: not affine), and its loop vars."""
        lin = self._offset(buf, idx)
        deps = set().union(*(free_vars(t) for t in lin[0])) if lin is not None else \
            set().union(*(free_vars(i) for i in idx))
        opaque = set().union(*(free_vars(t) for t in lin[0] if not isinstance(t, Var))) if lin is not None else set()
        strides = []
        for lp in loops:
            if lp.var not in deps:
                strides.append(0)
            elif lin is None:
                strides.append(None)
            else:
                coef = lin[0].get(Var(lp.var))
                strides.append(None if lp.var in opaque or coef is None else coef)
        return strides, deps

    def _buffer(self, buf, kind, loops, strides, trip) -> list:
        size = math.prod(self.func.buffers[buf].shape)
        unique = min(size, int(math.prod([lp.extent for lp, st in zip(loops, strides) if st != 0]) or 1))
        inner = strides[-1] if loops else 0
        contiguous = inner in (0, 1) if inner is not None else False
        elem_per_line = LINE_BYTES // 4 if contiguous else 1
        lines = max(1, unique // elem_per_line)
        reuse_k = next((k for k in range(len(loops) - 1, -1, -1) if strides[k] == 0), None)
        if reuse_k is None:
            carried, dist_iter, dist_bytes, count = 0.0, 0.0, 0.0, 0.0
        else:
            inside = loops[reuse_k + 1:]
            dist_iter = float(math.prod([lp.extent for lp in inside])) if inside else 1.0
            dist_bytes = 4.0 * min(size, float(math.prod([lp.extent for lp, st in zip(loops[reuse_k + 1:],
                                                                                    strides[reuse_k + 1:])
                                                        if st != 0]) if inside else 1.0))
            carried, count = 1.0, float(loops[reuse_k].extent)
        scope = self.func.buffers[buf].scope
        step_k = next((k for k in range(len(loops) - 1, -1, -1) if loops[k].kind in ("serial", "parallel")), None)
        if step_k is None:                       # nothing steps: the whole nest is one iteration
            stride_step, span_step = 0.0, 0.0
        elif strides[step_k] is None:            # not affine: as far as it gets
            stride_step, span_step = 10.0, 20.0
        else:
            stride_step = _log(abs(strides[step_k]))
            span_step = _log(4 * abs(strides[step_k]) * loops[step_k].extent)
        return [float(kind["read"]), float(kind["write"]), float(scope == "local"), _log(4 * trip), _log(4 * unique),
                _log(lines), _log(abs(inner)) if inner is not None else 10.0, float(contiguous), carried,
                _log(dist_iter), _log(dist_bytes), _log(count), 4.0 * (kind["read"] + kind["write"]),
                stride_step, span_step]

    def _intensity_curve(self, loops, counts, access_deps) -> list:
        """Float ops over distinct bytes touched, for the nest below each loop level (innermost first)."""
        flops_per = float(sum(counts["float"].values())) or 1.0
        points = []
        for level in range(len(loops), -1, -1):
            inner = loops[level:]
            iters = float(math.prod([lp.extent for lp in inner])) if inner else 1.0
            touched = 0.0
            for deps in access_deps:
                touched += 4.0 * float(math.prod([lp.extent for lp in inner if lp.var in deps]) if inner else 1.0)
            points.append(flops_per * iters / max(touched, 4.0))
        points = (points + [points[-1]] * CURVE_POINTS)[:CURVE_POINTS]
        return [_log(p) for p in points]


def extract(func: ir.Func, flops: float = 0.0, max_lanes: int = 16) -> np.ndarray:
    """(statements x num_features()) float32 matrix for one lowered kernel; `max_lanes` is the
    target's float32 vector width (Target.lanes)."""
    return _Extractor(func, flops, max_lanes).run()


# ---------------------------------------------------------------- GPU columns
# Per store: how the block's threads meet memory. Per kernel (the same on every row): the launch
# and what limits how many blocks an SM holds. Appended to the loop-nest columns for CUDA targets.
_GPU_STMT = ["global_thread_stride_max", "global_coalesced_share", "shared_thread_stride_max",
             "shared_bank_conflict", "trip_per_thread"]
_GPU_KERNEL = ["threads_per_block", "blocks", "waves", "blocks_per_sm", "occupancy", "shared_bytes",
               "local_floats", "syncs_per_thread", "work_per_thread"]
THREADS_PER_SM = 2048
SMEM_PER_SM = {"sm_70": 98304, "sm_75": 65536, "sm_80": 167936, "sm_86": 102400, "sm_89": 102400,
               "sm_90": 233472}


def gpu_feature_names() -> tuple:
    return tuple(f"gpu.{n}" for n in _GPU_STMT + _GPU_KERNEL)


class _GpuExtractor(_Extractor):
    def __init__(self, func: ir.Func, flops: float, target):
        super().__init__(func, flops, 1)
        self.target = target
        self.syncs = 0.0

    def _visit(self, s, loops, allocs, guards, budget):
        if isinstance(s, ir.Sync):
            self.syncs += float(math.prod([lp.extent for lp in loops if lp.kind not in _BOUND]))
        super()._visit(s, loops, allocs, guards, budget)

    def _store(self, s, loops, allocs, guards) -> list:
        row = super()._store(s, loops, allocs, guards)
        ranges = {lp.var: (0, lp.extent - 1) for lp in loops}
        thread = [k for k, lp in enumerate(loops) if lp.kind == "threadIdx.x"]
        g_strides, sh_strides = [], []
        accesses = [(n.buffer, n.indices) for n in walk(s.value) if isinstance(n, Load)] + [(s.buffer, s.indices)]
        for buf, idx in accesses:
            scope = self.func.buffers[buf].scope
            if scope == "local" or not thread:
                continue
            strides, _ = self._strides(buf, idx, loops, ranges)
            st = strides[thread[-1]]
            (sh_strides if scope == "shared" else g_strides).append(64 if st is None else abs(st))
        per_thread = float(math.prod([lp.extent for lp in loops if lp.kind not in _BOUND]))
        row += [_log(max(g_strides, default=0)),
                (sum(1 for x in g_strides if x <= 1) / len(g_strides)) if g_strides else 1.0,
                _log(max(sh_strides, default=0)),
                float(any(x > 1 and x % 2 == 0 for x in sh_strides)), _log(per_thread)]
        return row

    def run(self) -> np.ndarray:
        self._visit(self.func.body, [], [], (), 0)
        t = self.target
        grid, block, shared, local = launch_shape(self.func)
        regs = min(255, local + 24)          # accumulators plus a typical kernel's own
        smem_sm = SMEM_PER_SM.get(t.arch, 4 * t.smem)
        per_sm = min(THREADS_PER_SM // block, 32, smem_sm // shared if shared else 32, t.regs // (block * regs))
        occupancy = min(1.0, per_sm * block / THREADS_PER_SM)
        waves = grid / max(1, per_sm * t.sms)
        kernel = [_log(block), _log(grid), _log(waves), float(per_sm), occupancy, _log(shared),
                  _log(local), _log(self.syncs), _log(self.flops / (grid * block))]
        rows = np.asarray(self.rows, np.float32) if self.rows else np.zeros((1, num_features() + len(_GPU_STMT)),
                                                                          np.float32)
        return np.hstack([rows, np.tile(np.asarray(kernel, np.float32), (len(rows), 1))])


_BOUND = ("blockIdx.x", "threadIdx.x")


def extract_for(func: ir.Func, flops: float, target) -> np.ndarray:
    """The feature matrix of a lowered kernel for its target: the loop-nest columns, and for a
    CUDA target the GPU columns (gpu_feature_names) after them."""
    if target.kind == "cuda":
        return _GpuExtractor(func, flops, target).run()
    return extract(func, flops, target.lanes)


__all__ = ["extract", "extract_for", "feature_names", "fingerprint", "gpu_feature_names", "num_features"]
