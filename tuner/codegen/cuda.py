"""Loop-nest IR -> CUDA C: one `__global__` kernel per lowered function.

The loop bound to blockIdx.x is the grid and the outermost loop bound to threadIdx.x the block:
neither is written as a loop, each thread reads its index instead (a nest with neither is a
grid of one thread, slow but correct). A later threadIdx.x loop (the
cooperative fill of a shared buffer) must not be longer than the block; a shorter one is guarded.
Shared buffers are declared once at the top of the kernel; the barriers around their filling are
the IR's Sync statements. Local buffers (the accumulator tile) are arrays in the thread, which
nvcc keeps in registers when every index is a constant after unrolling. Expressions print as in
the C generator (one printer for index arithmetic), with device versions of its helpers: float
max and min propagate a NaN from either operand (tuner_fmax, tuner_fmin, never fmaxf, which drops
it). nvcc's --use_fast_math is --ftz=true --prec-div=false --prec-sqrt=false --fmad=true and fast
intrinsics (__expf): none lets nvcc assume a value is not NaN, so the comparisons keep their IEEE
unordered results and a NaN still propagates.

Every kernel takes its buffers as `(const float* __restrict__ in..., float* __restrict__ out)`
and is launched with `CudaKernel.grid` blocks of `CudaKernel.block` threads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..schedule import ir
from ..schedule.lower import c_name
from ..schedule.schedule import ScheduleError
from ..te.expr import Cmp, Const, Load, Var, free_vars, from_linear, linear, simplify, substitute
from .c import CGen, NotVectorizable, _straight_stores

PRELUDE = r"""#define TUNER_INF __int_as_float(0x7f800000)
__device__ __forceinline__ float tuner_fmax(float a, float b) { return (!(a <= b) && b == b) ? a : b; }
__device__ __forceinline__ float tuner_fmin(float a, float b) { return (!(a >= b) && b == b) ? a : b; }
__device__ __forceinline__ float tuner_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ int tuner_floordiv(int a, int b) { int q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
__device__ __forceinline__ int tuner_floormod(int a, int b) { int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
"""


@dataclass(frozen=True)
class CudaKernel:
    name: str
    source: str           # the kernel alone; PRELUDE goes once at the top of its file
    grid: int             # blocks
    block: int            # threads per block
    shared_bytes: int     # static shared memory per block
    local_floats: int     # floats of thread-local arrays (a lower bound on its registers)


def launch_shape(func: ir.Func) -> tuple:
    """(grid, block, shared bytes, local floats) of a lowered kernel: the extent of its
    blockIdx.x loop, of its outermost threadIdx.x loop (1 where lowering dropped a loop of
    extent 1, or none was bound), and the sizes of its shared and local buffers. The one rule,
    for the generator and the cost model's features."""
    grid = block = None
    shared = local = 0
    for s in ir.stmts(func.body):
        if isinstance(s, ir.For) and s.kind == "blockIdx.x" and grid is None:
            grid = s.extent
        elif isinstance(s, ir.For) and s.kind == "threadIdx.x" and block is None:
            block = s.extent
        elif isinstance(s, ir.Allocate):
            if s.scope == "shared":
                shared += 4 * math.prod(s.shape)
            else:
                local += math.prod(s.shape)
    return grid or 1, block or 1, shared, local


class CudaGen(CGen):
    def __init__(self, func: ir.Func):
        super().__init__(func, max_lanes=1, threads=1)
        self.grid, self.block, self.shared_bytes, self.local_floats = launch_shape(func)
        self._grid_seen = False
        self.shared: list = []        # shared buffers, each declared once at the top

    def generate(self) -> CudaKernel:
        f = self.func
        if f.temps:
            names = ", ".join(t.name for t in f.temps)
            raise ScheduleError(f"stages computed at root ({names}) would need kernels of their own; "
                                "the CUDA generator writes one kernel: inline them or compute them at a loop")
        self.stmt(f.body, 1)
        body, self.lines = self.lines, []
        params = [f"const float* __restrict__ {c_name(b.name)}" for b in f.args[:-1]]
        params.append(f"float* __restrict__ {c_name(f.args[-1].name)}")
        self.emit(0, f"// launch: {self.grid} blocks of {self.block} threads")   # not in the code: hashed with it
        self.emit(0, f'extern "C" __global__ void __launch_bounds__({self.block}) {f.name}({", ".join(params)}) {{')
        for a in self.shared:
            self.emit(1, f"__shared__ __align__(16) float {c_name(a.buffer)}[{math.prod(a.shape)}];")
        self.lines.extend(body)
        self.emit(0, "}")
        return CudaKernel(f.name, "\n".join(self.lines) + "\n", self.grid, self.block, self.shared_bytes,
                          self.local_floats)

    # ------------------------------------------------------------ statements
    def stmt(self, s: ir.Stmt, d: int):
        if isinstance(s, ir.Prefetch):
            return                    # a CPU cache hint
        if isinstance(s, ir.Sync):
            if not self.lines or self.lines[-1].strip() != "__syncthreads();":
                self.emit(d, "__syncthreads();")
        elif isinstance(s, ir.Allocate):
            if s.scope == "shared":
                if any(a.buffer == s.buffer for a in self.shared):
                    raise ScheduleError(f"shared buffer {s.buffer} is allocated twice")
                self.shared.append(s)
                self.stmt(s.body, d)
            else:
                self.emit(d, "{")
                self.emit(d + 1, f"float {c_name(s.buffer)}[{math.prod(s.shape)}];")
                self.stmt(s.body, d + 1)
                self.emit(d, "}")
        else:
            super().stmt(s, d)

    def loop(self, s: ir.For, d: int):
        v = c_name(s.var)
        if s.kind == "blockIdx.x":
            if self._grid_seen:
                raise ScheduleError(f"loop {s.var}: a second loop bound to blockIdx.x")
            self._grid_seen = True
            self._index_scope(s, d, f"const int {v} = blockIdx.x;", None)
            return
        if s.kind == "threadIdx.x":
            if s.extent > self.block:
                raise ScheduleError(f"loop {s.var} of {s.extent} threads is longer than the block ({self.block})")
            guard = f"if ({v} < {s.extent}) " if s.extent < self.block else None
            self._index_scope(s, d, f"const int {v} = threadIdx.x;", guard)
            return
        if s.kind == "parallel":
            raise ScheduleError(f"loop {s.var} is marked parallel, a CPU annotation; bind it to a GPU index")
        if s.kind == "vectorize":
            lines = self._float4_copy(s, d)
            if lines is not None:
                self.lines.extend(lines)
                return
        saved = self.unroll_budget
        if s.auto_unroll:
            self.unroll_budget = max(self.unroll_budget, s.auto_unroll)
        if s.kind == "vectorize" or ir.unrolled(s, self.unroll_budget):
            self.emit(d, "#pragma unroll")
        self.emit(d, f"for (int {v} = 0; {v} < {s.extent}; ++{v}) {{")
        self.ranges[s.var] = s.extent
        self.stmt(s.body, d + 1)
        del self.ranges[s.var]
        self.emit(d, "}")
        self.unroll_budget = saved

    def _float4_copy(self, s: ir.For, d: int):
        """A 4-lane loop of plain copies (a shared tile's fill) as float4 loads and stores, when
        every store and load moves by one element per lane and starts on a multiple of 4
        elements (16 bytes: pycuda's allocations and the shared buffers are aligned to it); a
        load that does, into a store that does not (a tile stored in another order), as one
        float4 load and four stores; else None, and the loop is written unrolled."""
        if s.extent != 4:
            return None
        try:
            stores = _straight_stores(s.body)
        except NotVectorizable:
            return None
        self.ranges[s.var] = 4
        try:
            out = []
            for conds, st in stores:
                if not isinstance(st.value, Load):
                    return None
                guards = []
                for g in conds:
                    g = self._lane_free(simplify(g, self._bounds()), s.var)
                    if g is None:
                        return None
                    guards.append(g)
                off = self.offset(st.buffer, st.indices)
                dst = _aligned_base(off, s.var)
                src = _aligned_base(self.offset(st.value.buffer, st.value.indices), s.var)
                if src is None:
                    return None
                load = f"*(const float4*)&{c_name(st.value.buffer)}[{self.expr(src)}]"
                if dst is not None:
                    line = f"*(float4*)&{c_name(st.buffer)}[{self.expr(dst)}] = {load};"
                else:
                    lanes = [f"{c_name(st.buffer)}[{self.expr(simplify(substitute(off, {s.var: Const(k)}), self._bounds()))}]"
                             f" = tuner_v.{'xyzw'[k]};" for k in range(4)]
                    line = f"{{ float4 tuner_v; tuner_v = {load}; {' '.join(lanes)} }}"
                out.append("  " * d + (f"if ({' && '.join(self.expr(g) for g in guards)}) " if guards else "") + line)
            return out
        finally:
            del self.ranges[s.var]

    def _lane_free(self, g, lane: str):
        """A guard without the lane: as it is if it does not read it; `4q + lane < 4m` is `4q < 4m`."""
        if lane not in free_vars(g):
            return g
        if isinstance(g, Cmp) and g.op == "<" and isinstance(g.b, Const) and g.b.is_int and g.b.value % 4 == 0:
            base = _aligned_base(g.a, lane)
            if base is not None:
                return Cmp("<", base, g.b)
        return None

    def _index_scope(self, s: ir.For, d: int, decl: str, guard: str | None):
        self.emit(d, "{")
        self.emit(d + 1, decl)
        self.ranges[s.var] = s.extent
        if guard:
            self.emit(d + 1, guard + "{")
            self.stmt(s.body, d + 2)
            self.emit(d + 1, "}")
        else:
            self.stmt(s.body, d + 1)
        del self.ranges[s.var]
        self.emit(d, "}")

    # ------------------------------------------------------------ expressions
    def expr(self, e):
        if isinstance(e, Const) and not e.is_int and math.isinf(e.value):
            return "(-TUNER_INF)" if e.value < 0 else "TUNER_INF"
        return super().expr(e)


def _aligned_base(off, lane: str):
    """The offset at lane 0 of an offset that moves by one element per lane and is a multiple of
    4 elements there, else None."""
    ln = linear(off)
    if ln is None:
        return None
    terms, const = ln
    lane_var = Var(lane)
    if terms.get(lane_var) != 1 or const % 4:
        return None
    rest = {t: c for t, c in terms.items() if t != lane_var}
    if any(lane in free_vars(t) or c % 4 for t, c in rest.items()):
        return None
    return from_linear(rest, const)


def generate_cuda(func: ir.Func) -> CudaKernel:
    """The CUDA C of one lowered function (raises ScheduleError for a loop nest that is not a
    kernel: no grid or block index, a CPU annotation, a temporary at root, dynamic dimensions)."""
    if func.symbols:
        raise ScheduleError("dynamic dimensions are built for the CPU only; give the CUDA kernel fixed shapes")
    return CudaGen(func).generate()


def serial_copy(func: ir.Func) -> ir.Func:
    """The same loop nest with the grid and block indices as plain loops: a CPU runs every
    thread of every block in turn. Honest for the index arithmetic of any kernel here: a shared
    buffer's fill loop covers the whole block's tile, so each emulated thread refills it whole
    before reading it (what the barriers guarantee on the GPU)."""
    import dataclasses
    bound = ("blockIdx.x", "threadIdx.x")
    body = ir.map_loops(func.body, lambda f: dataclasses.replace(f, kind="serial") if f.kind in bound else f)
    return dataclasses.replace(func, body=body)
