"""Loop-nest IR -> C with OpenMP for parallel loops and GCC vector extensions for SIMD.

Every kernel has the signature `int name(float** args)` (inputs, then output), so one harness
can run and time any of them. Vectorised loops become explicit vector statements: a load whose
address moves by one element per lane is a vector load, one that does not move is a scalar that
broadcasts, one whose lanes all fall in one aligned vector is that vector permuted (a grouped
conv's block of whole groups), anything else is gathered lane by lane, unless its address is read
from memory (a resize's index tables). A body that cannot be vectorised (such a read, a condition
or a math call other than erf, tanh, exp and sigmoid that depends on the lane) falls back to a
scalar loop under `omp simd`: GCC calls the C library lane by lane there, so these four have
vector versions here.
"""
from __future__ import annotations

import math

from ..schedule import ir
from ..schedule.ir import tail_widths, unrolled, vector_split
from ..schedule.lower import c_name
from ..te.dynamic import symbol_var
from ..te.expr import (Add, And, Call, Cast, Cmp, Const, Div, Expr, FloorDiv, FloorMod, Load, Max, Min, Mul, Select,
                       Sub, Var, bounds, free_vars, from_linear, linear, simplify, substitute, walk)

STACK_LIMIT_BYTES = 64 * 1024
VECTOR_UNROLL = 32           # a vector loop's chunks unrolled at most this far (a 50257-wide axis is a loop)
ACCUMULATORS = 4             # independent partial vectors of a long vectorised reduction
PARALLEL_MIN_WORK = 16384    # a loop shares work among threads from this many weighted stores (_work)
CALL_WORK = 3                # a math call's weight beside its store's (sigmoid's break-even at 1/4 of add's)

PRELUDE = """#include <math.h>
#include <stdlib.h>
#include <string.h>
typedef float f32x16 __attribute__((vector_size(64), aligned(4)));
typedef float f32x8 __attribute__((vector_size(32), aligned(4)));
typedef float f32x4 __attribute__((vector_size(16), aligned(4)));
typedef int i32x16 __attribute__((vector_size(64), aligned(4)));
typedef int i32x8 __attribute__((vector_size(32), aligned(4)));
typedef int i32x4 __attribute__((vector_size(16), aligned(4)));
#define TUNER_VSEL(W, m, a, b) ((f32x##W)((((i32x##W)(a)) & (m)) | (((i32x##W)(b)) & ~(m))))
/* float max and min propagate a NaN from either operand, as np.maximum and ONNX Runtime do: a is
   taken where it is greater (or, for min, smaller) or unordered with b (a is NaN), unless b is
   NaN. With a constant b (ReLU's 0, a clip bound) b == b folds away: one compare, as before. */
static inline f32x16 tuner_max16(f32x16 a, f32x16 b) { return TUNER_VSEL(16, ~(a <= b) & (b == b), a, b); }
static inline f32x8 tuner_max8(f32x8 a, f32x8 b) { return TUNER_VSEL(8, ~(a <= b) & (b == b), a, b); }
static inline f32x4 tuner_max4(f32x4 a, f32x4 b) { return TUNER_VSEL(4, ~(a <= b) & (b == b), a, b); }
static inline f32x16 tuner_min16(f32x16 a, f32x16 b) { return TUNER_VSEL(16, ~(a >= b) & (b == b), a, b); }
static inline f32x8 tuner_min8(f32x8 a, f32x8 b) { return TUNER_VSEL(8, ~(a >= b) & (b == b), a, b); }
static inline f32x4 tuner_min4(f32x4 a, f32x4 b) { return TUNER_VSEL(4, ~(a >= b) & (b == b), a, b); }
static inline float tuner_fmax(float a, float b) { return (!(a <= b) && b == b) ? a : b; }
static inline float tuner_fmin(float a, float b) { return (!(a >= b) && b == b) ? a : b; }
/* Clamps for the W-lane math below: max/min instructions where the ISA has them (one cycle, where
   a compare and a blend take four), with x second, so that a NaN x comes through. GCC's builtins,
   not <immintrin.h>, which takes half a second to compile in every kernel's file. */
#if defined(__AVX512F__)
#define TUNER_VMAX16(lo, x) __builtin_ia32_maxps512_mask(lo, x, lo, (unsigned short)-1, 4)
#define TUNER_VMIN16(hi, x) __builtin_ia32_minps512_mask(hi, x, hi, (unsigned short)-1, 4)
#else
#define TUNER_VMAX16(lo, x) TUNER_VSEL(16, (x) < (lo), lo, x)
#define TUNER_VMIN16(hi, x) TUNER_VSEL(16, (x) > (hi), hi, x)
#endif
#if defined(__AVX__)
#define TUNER_VMAX8(lo, x) __builtin_ia32_maxps256(lo, x)
#define TUNER_VMIN8(hi, x) __builtin_ia32_minps256(hi, x)
#else
#define TUNER_VMAX8(lo, x) TUNER_VSEL(8, (x) < (lo), lo, x)
#define TUNER_VMIN8(hi, x) TUNER_VSEL(8, (x) > (hi), hi, x)
#endif
#if defined(__SSE__)
#define TUNER_VMAX4(lo, x) __builtin_ia32_maxps(lo, x)
#define TUNER_VMIN4(hi, x) __builtin_ia32_minps(hi, x)
#else
#define TUNER_VMAX4(lo, x) TUNER_VSEL(4, (x) < (lo), lo, x)
#define TUNER_VMIN4(hi, x) TUNER_VSEL(4, (x) > (hi), hi, x)
#endif
#define TUNER_VABS(W, x) ((f32x##W)((i32x##W)(x) & 0x7fffffff))
#define TUNER_VCLAMP(W, x, lo, hi) TUNER_VMIN##W((f32x##W){0} + (hi), TUNER_VMAX##W((f32x##W){0} + (lo), x))
/* erf, tanh, exp and sigmoid of W lanes, for vectorised loops (the C library's are called lane by lane).
   erf: x P(x^2) / Q(x^2) on [-4, 4], where float erf is +-1 beyond (the rational approximation
   Eigen and XLA use), 4.2e-7 from erf at most. tanh: likewise on [-7.9, 7.9], x itself below
   0.0004, 3.9e-7 at most. exp: 2^n e^r with n = round(x / ln 2) and
   r = x - n ln 2 (ln 2 in two parts), e^r by Cephes' degree-5 polynomial, 8.4e-8 relative at
   most; y 2^n by AVX-512's scalef, else as two powers made in the exponent bits, so that x up to
   88.8 (clamped there) overflows to inf in the product; 0 below the normal floats (y zeroed before
   the scaling, which is slow where it makes a subnormal; only an |x| below 1e-19, whose square
   is subnormal, still makes one). sigmoid: 1 / (1 + e^-x), e^-x = 2^n e^r by the same
   polynomial (in -r: its odd terms negated, so x is not), x clamped to [-86, 86] so that 2^n is
   one normal float, made by shifting the rounding's magic sum (1.5 2^23 + 127 + n) into the
   exponent bits: two operations, where exp's two powers take nine, and no select for underflow;
   a product, not an integer added to e^r's bits, so that a NaN's payload cannot turn it into a
   number. 0 below -86 (exactly, so that SiLU of -inf is NaN as x / (1 + e^-x) makes it). NaN stays NaN in all four.
   Polynomials are evaluated in pairs of terms (Estrin), not term by term (Horner): the chain of
   dependent operations, which bounds how many of these run at once, is about half as long. Their
   |x| is raised to 1e-4 (erf: under half an ulp of the quotient) and 0.0004 (tanh, which returns x
   below): the powers of a smaller one underflow, and so would x P for a tiny x (erf takes
   x (P / Q), tanh |x| P / Q with x's sign), and each operation on a subnormal takes a
   microcode assist (FocalNet's GELUs of values near 0 ran 5-20x slower). */
#define TUNER_VMATH(W) \\
static inline f32x##W tuner_erf##W(f32x##W x) { \\
  f32x##W c = TUNER_VCLAMP(W, x, -4.0f, 4.0f), a = TUNER_VMAX##W((f32x##W){0} + 1e-4f, TUNER_VABS(W, c)); \\
  f32x##W z = a * a, z2 = z * z, z4 = z2 * z2; \\
  f32x##W p = (z * -2.95459980854025e-03f - 1.60960333262415e-02f) + z2 * (z * -5.69250639462346e-05f - 7.34990630326855e-04f) \\
    + z4 * ((z * 2.77068142495902e-08f - 2.10102402082508e-06f) + z2 * -2.72614225801306e-10f); \\
  f32x##W q = (z * -7.37332916720468e-03f - 1.42647390514189e-02f) + z2 * (z * -2.13374055278905e-04f - 1.68282697438203e-03f) \\
    + z4 * -1.45660718464996e-05f; \\
  return c * (p / q); \\
} \\
static inline f32x##W tuner_tanh##W(f32x##W x) { \\
  f32x##W c = TUNER_VCLAMP(W, x, -7.90531110763549805f, 7.90531110763549805f), ax = TUNER_VABS(W, x); \\
  f32x##W a = TUNER_VMAX##W((f32x##W){0} + 0.0004f, TUNER_VABS(W, c)), z = a * a, z2 = z * z, z4 = z2 * z2; \\
  f32x##W p = (z * 6.37261928875436e-04f + 4.89352455891786e-03f) + z2 * (z * 5.12229709037114e-08f + 1.48572235717979e-05f) \\
    + z4 * ((z * 2.00018790482477e-13f - 8.60467152213735e-11f) + z2 * -2.76076847742355e-16f); \\
  f32x##W q = (z * 2.26843463243900e-03f + 4.89352518554385e-03f) + z2 * (z * 1.19825839466702e-06f + 1.18534705686654e-04f); \\
  f32x##W t = (f32x##W)((i32x##W)(a * p / q) | ((i32x##W)c & (int)0x80000000)); \\
  return TUNER_VSEL(W, ax < 0.0004f, x, t); \\
} \\
static inline f32x##W tuner_exp_r##W(f32x##W q, float s) { \\
  f32x##W q2 = q * q; \\
  f32x##W p01 = q * (s * 1.9875691500e-4f) + 1.3981999507e-3f, p23 = q * (s * 8.3334519073e-3f) + 4.1665795894e-2f; \\
  f32x##W p = (p01 * q2 + p23) * q2 + (q * (s * 1.6666665459e-1f) + 5.0000001201e-1f); \\
  return p * q2 + q * s + 1.0f; \\
} \\
static inline f32x##W tuner_exp##W(f32x##W x) { \\
  f32x##W c = TUNER_VCLAMP(W, x, -87.3365479f, 88.8f); \\
  f32x##W n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; \\
  f32x##W y = tuner_exp_r##W(c - n * 0.693359375f + n * 2.12194440e-4f, 1.0f); \\
  y = tuner_pow2_##W(TUNER_VSEL(W, x < -87.3365479f, (f32x##W){0}, y), n); \\
  return TUNER_VSEL(W, x == x, y, x); \\
} \\
static inline f32x##W tuner_sigmoid##W(f32x##W x) { \\
  f32x##W c = TUNER_VCLAMP(W, x, -86.0f, 86.0f); \\
  f32x##W f = c * -1.44269504088896341f + 12583039.0f, n = f - 12583039.0f; \\
  f32x##W y = tuner_exp_r##W(c + n * 0.693359375f - n * 2.12194440e-4f, -1.0f); \\
  f32x##W e = y * (f32x##W)((i32x##W)f << 23); \\
  return (f32x##W)((i32x##W)(1.0f / (1.0f + e)) & ~(x < -86.0f)); \\
}
#define TUNER_POW2(W) static inline f32x##W tuner_pow2_##W(f32x##W y, f32x##W n) { \\
  i32x##W k = __builtin_convertvector(n, i32x##W), h = k >> 1; \\
  return y * (f32x##W)((h + 127) << 23) * (f32x##W)((k - h + 127) << 23); \\
}
#if defined(__AVX512F__)
static inline f32x16 tuner_pow2_16(f32x16 y, f32x16 n) { return __builtin_ia32_scalefps512_mask(y, n, y, (unsigned short)-1, 4); }
#else
TUNER_POW2(16)
#endif
TUNER_POW2(8)
TUNER_POW2(4)
TUNER_VMATH(16)
TUNER_VMATH(8)
TUNER_VMATH(4)
static inline float tuner_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline int tuner_floordiv(int a, int b) { int q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int tuner_floormod(int a, int b) { int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
"""

_CALLS = {"exp": "expf", "sqrt": "sqrtf", "tanh": "tanhf", "log": "logf", "erf": "erff", "pow": "powf",
          "trunc": "truncf", "fmod": "fmodf", "sigmoid": "tuner_sigmoid", "sin": "sinf", "cos": "cosf"}
VECTOR_CALLS = ("erf", "tanh", "exp", "sigmoid")      # with a W-lane version in PRELUDE (tuner_erfW, ...)


class NotVectorizable(Exception):
    pass


def is_float(e: Expr) -> bool:
    if isinstance(e, Const):
        return not e.is_int
    if isinstance(e, Cast):
        return not e.dtype.startswith("int")
    if isinstance(e, (Load, Call, Div)):
        return True
    if isinstance(e, Var):
        return False
    if isinstance(e, Select):
        return is_float(e.then) or is_float(e.other)
    if isinstance(e, (Cmp, And)):
        return False
    return is_float(e.a) or is_float(e.b)


def c_float(v: float) -> str:
    if math.isinf(v):
        return "-INFINITY" if v < 0 else "INFINITY"
    if math.isnan(v):
        return "NAN"
    return f"{float(v)!r}f"


# an integer expression of the symbols, read from no buffer, hoisted where it divides or clamps
_SYMBOL_OPS = (Add, Sub, Mul, FloorDiv, FloorMod, Min, Max)
_SYMBOL_COSTLY = {FloorDiv, FloorMod, Min, Max}


class CGen:
    def __init__(self, func: ir.Func, max_lanes: int = 16, threads: int = 1, aliased: frozenset = frozenset()):
        self.func = func
        self.aliased = aliased       # arguments that may share memory (an in-place step): not restrict
        self.max_lanes = max_lanes
        self.threads = threads
        self.lines: list = []
        self.ranges: dict = {}       # loop var -> extent of enclosing loops
        self.in_parallel = False
        self.unroll_budget = 0
        self.uses_openmp = False
        self.hoisted = _hoistable(func.body, threads)
        # a dynamic kernel's integer expressions of its symbols alone (a guarded tail's start), each
        # computed once at entry: copied into every statement of an unrolled tail, GCC took 25 s
        # over one batch_matmul of 68 lines (docs/dynamic-shapes.md)
        self.symbol_names = {symbol_var(k).name for k in range(len(func.symbols))}
        self.symbol_exprs: dict = {}     # C text -> the name it is computed into

    # ------------------------------------------------------------ entry
    def generate(self) -> str:
        f = self.func
        self.emit(0, f"int {f.name}(float** restrict args) {{")
        for k, b in enumerate(f.args):
            self.emit(1, f"float*{'' if b.name in self.aliased else ' restrict'} {c_name(b.name)} = args[{k}];")
        if f.symbols:          # a dynamic kernel: the run's values of its symbols follow the buffers
            self.emit(1, f"const int* restrict tuner_dims = (const int*)args[{len(f.args)}];")
            for k, sym in enumerate(f.symbols):
                v = c_name(symbol_var(k).name)
                self.emit(1, f"const int {v} = tuner_dims[{k}];")
                self.emit(1, f"if ({v} < {sym.lo} || {v} > {sym.hi}) return -2;")
        at = len(self.lines)
        heap = [(t.name, t.shape) for t in f.temps] + list(self.hoisted.items())
        for name, shape in heap:
            self.emit(1, f"float* restrict {c_name(name)} = (float*)aligned_alloc(64, {_alloc_bytes(shape)});")
            self.emit(1, f"if (!{c_name(name)}) return -1;")
        self.stmt(f.body, 1)
        for name, _ in heap:
            self.emit(1, f"free({c_name(name)});")
        self.emit(1, "return 0;")
        self.emit(0, "}")
        self.lines[at:at] = [f"  const int {name} = {text};" for text, name in self.symbol_exprs.items()]
        return "\n".join(self.lines) + "\n"

    def emit(self, depth: int, text: str):
        self.lines.append("  " * depth + text)

    # ------------------------------------------------------------ statements
    def stmt(self, s: ir.Stmt, d: int):
        if isinstance(s, ir.Seq):
            for x in s.stmts:
                self.stmt(x, d)
        elif isinstance(s, ir.For):
            self.loop(s, d)
        elif isinstance(s, ir.Store):
            self.emit(d, f"{self.lvalue(s.buffer, s.indices)} = {self.expr(s.value)};")
        elif isinstance(s, ir.IfThen):
            cond = simplify(s.cond, self._bounds())
            if isinstance(cond, Const):
                if cond.value:
                    self.stmt(s.body, d)
                return
            self.emit(d, f"if ({self.expr(cond)}) {{")
            self.stmt(s.body, d + 1)
            self.emit(d, "}")
        elif isinstance(s, ir.Allocate):
            name = c_name(s.buffer)
            nbytes = _alloc_bytes(s.shape)
            self.emit(d, "{")
            if s.buffer in self.hoisted:          # allocated once, at the top of the function
                self.stmt(s.body, d + 1)
            elif nbytes <= STACK_LIMIT_BYTES:
                self.emit(d + 1, f"float {name}[{nbytes // 4}] __attribute__((aligned(64)));")
                self.stmt(s.body, d + 1)
            else:
                self.emit(d + 1, f"float* restrict {name} = (float*)aligned_alloc(64, {nbytes});")
                self.stmt(s.body, d + 1)
                self.emit(d + 1, f"free({name});")
            self.emit(d, "}")
        elif isinstance(s, ir.Sync):
            pass                      # one thread runs the whole block's loops: nothing to wait for
        elif isinstance(s, ir.Prefetch):
            self.emit(d, f"__builtin_prefetch(&{c_name(s.buffer)}[{self.expr(simplify(s.offset, self._bounds()))}], 0, 2);")
        else:
            raise TypeError(f"cannot generate C for {type(s).__name__}")

    def loop(self, s: ir.For, d: int):
        saved_budget = self.unroll_budget
        if s.auto_unroll:
            self.unroll_budget = max(self.unroll_budget, s.auto_unroll)
        threaded = s.kind != "vectorize" and _threaded(s, self.threads) and not self.in_parallel
        plain_end = s.limit is None or isinstance(s.limit, (Const, Var))   # else a run-time header (_runtime_for)
        if s.kind == "vectorize":
            try:
                lines = self.vector_loop(s, d)
                self.lines.extend(lines)
                self.unroll_budget = saved_budget
                return
            except NotVectorizable:
                if not _carried(s) and plain_end:     # simd takes no header that declares its end too
                    self.emit(d, "#pragma omp simd")
        elif threaded:
            self.emit(d, f"#pragma omp parallel for num_threads({self.threads})")
            self.uses_openmp = True
        elif unrolled(s, self.unroll_budget):
            self.emit(d, f"#pragma GCC unroll {s.extent}")
        elif _keeps_loop(s.body, self.unroll_budget):
            # never peeled whole: GCC's complete peeling of a 2-trip tile loop around a register
            # tile's reduction spilled its accumulators (a 7x7 1x1 conv in AVX2 2.0x slower)
            self.emit(d, "#pragma GCC unroll 1")
        v = c_name(s.var)
        if plain_end or threaded:
            trips = s.extent if s.limit is None else self.expr(s.limit)
            self.emit(d, f"for ({'long' if threaded else 'int'} {v} = 0; {v} < {trips}; ++{v}) {{")
        else:                   # a run-time trip count, evaluated once, kept in memory
            self.emit(d, _runtime_for(v, "0", self.expr(s.limit), in_memory=True) + " {")
        if threaded:
            # OpenMP's outlined body gets its chunk from the runtime: without the range, GCC cannot
            # fold the index arithmetic and bounds tests (a Winograd transform ran 4x slower). Its
            # index is a long: with an int, the / and % of a fused loop's index were sign-extended
            # into each address, and GCC kept a base register per operand vector rather than one
            # pointer and constant offsets (the ResNet stem in AVX2 code spilled its accumulators:
            # 0.8x the time at 2 threads; docs/history.md)
            self.emit(d + 1, f"if ({v} < 0 || {v} >= {s.extent}) __builtin_unreachable();")
        was_parallel = self.in_parallel
        self.in_parallel = self.in_parallel or _threaded(s, self.threads)
        self.ranges[s.var] = s.extent
        self.stmt(s.body, d + 1)
        del self.ranges[s.var]
        self.in_parallel = was_parallel
        self.emit(d, "}")
        self.unroll_budget = saved_budget

    # ------------------------------------------------------------ expressions
    def _bounds(self, extra: dict | None = None) -> dict:
        b = {symbol_var(k).name: (sym.lo, sym.hi) for k, sym in enumerate(self.func.symbols)}
        b.update({k: (0, e - 1) for k, e in self.ranges.items()})
        if extra:
            b.update(extra)
        return b

    def offset(self, buffer: str, indices: tuple, extra_ranges: dict | None = None) -> Expr:
        ranges = self._bounds(extra_ranges)
        indices, shape = self.func.buffers[buffer].stored(indices)
        # the simplified flat offset is the collected sum of the simplified indices (the same
        # expression simplify(flat_index(...)) gives, without simplifying a tree of every dimension)
        ln = ir.flat_linear(tuple(simplify(i, ranges) for i in indices), shape)
        if ln is None:
            return simplify(ir.flat_index(indices, shape), ranges)
        return from_linear(*ln)

    def lvalue(self, buffer: str, indices: tuple) -> str:
        return f"{c_name(buffer)}[{self.expr(self.offset(buffer, indices))}]"

    def expr(self, e: Expr) -> str:
        if self.symbol_names and isinstance(e, _SYMBOL_OPS) and free_vars(e) and free_vars(e) <= self.symbol_names \
                and not is_float(e) and _SYMBOL_COSTLY & (kinds := {type(n) for n in walk(e)}) \
                and not {Load, Call} & kinds:
            text = self._expr(e)
            return self.symbol_exprs.setdefault(text, f"tuner_sym{len(self.symbol_exprs)}")
        return self._expr(e)

    def _expr(self, e: Expr) -> str:
        if isinstance(e, Const):
            return c_float(e.value) if not e.is_int else str(e.value)
        if isinstance(e, Var):
            return c_name(e.name)
        if isinstance(e, Load):
            return f"{c_name(e.buffer)}[{self.expr(self.offset(e.buffer, e.indices))}]"
        if isinstance(e, (Add, Sub, Mul, Div)):
            op = {Add: "+", Sub: "-", Mul: "*", Div: "/"}[type(e)]
            return f"({self.expr(e.a)} {op} {self.expr(e.b)})"
        if isinstance(e, (FloorDiv, FloorMod)):
            nb = bounds(e.a, self._bounds())
            if nb is not None and nb[0] >= 0 and isinstance(e.b, Const) and e.b.value > 0:
                return f"({self.expr(e.a)} {'/' if isinstance(e, FloorDiv) else '%'} {self.expr(e.b)})"
            fn = "tuner_floordiv" if isinstance(e, FloorDiv) else "tuner_floormod"
            return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, (Min, Max)):
            a, c = self.expr(e.a), self.expr(e.b)
            if is_float(e):          # NaN from either operand propagates (PRELUDE)
                return f"tuner_f{'min' if isinstance(e, Min) else 'max'}({a}, {c})"
            op = "<" if isinstance(e, Min) else ">"
            return f"(({a}) {op} ({c}) ? ({a}) : ({c}))"
        if isinstance(e, (Cmp, And)):
            c = _fewer_divisions(e, self._bounds())
            return self._cond(e if c is None else c)
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.then)} : {self.expr(e.other)})"
        if isinstance(e, Call):
            return f"{_CALLS[e.name]}({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, Cast):
            return f"(({'int' if e.dtype.startswith('int') else 'float'})({self.expr(e.value)}))"
        raise TypeError(f"cannot generate C for {type(e).__name__}")

    def _cond(self, c: Expr) -> str:
        """A condition as C, its parts printed as they are (expr decided on the whole)."""
        if isinstance(c, Const):
            return str(int(bool(c.value)))
        if isinstance(c, Cmp):
            return f"({self.expr(c.a)} {c.op} {self.expr(c.b)})"
        if isinstance(c, And):
            return f"({self._cond(c.a)} && {self._cond(c.b)})"
        return self.expr(c)

    # ------------------------------------------------------------ vectorisation
    def vector_loop(self, s: ir.For, d: int) -> list:
        """A vectorised loop: whole vectors, then, where the width of fewest operations does not
        divide the extent (a softmax over 197 or 1500 columns), the remainder as one vector of 8
        and one of 4 where they fit and the rest lane by lane (schedule.ir.vector_split, tail_widths;
        cost_model.features sees the loop as vector_lanes says)."""
        lanes, tail = vector_split(s.extent, self.max_lanes)
        if not lanes:
            raise NotVectorizable("extent below two vectors of 4 and not a multiple of 4")
        stores = _straight_stores(s.body)
        for guard_conds, _ in stores:
            if any(s.var in free_vars(g) for g in guard_conds):
                raise NotVectorizable("condition depends on the lane")
        if _reduction(s, stores):
            return self.vector_reduction(s, d, lanes, tail, stores[0][1])
        chunks = s.extent // lanes
        lane, chunk = f"{s.var}__lane", f"{s.var}__chunk"
        dynamic = s.limit is not None        # a run-time trip count: its whole vectors, then the rest lane by lane
        value_of_var = Var(lane) if chunks == 1 and not dynamic else Var(chunk) * Const(lanes) + Var(lane)
        saved = dict(self.ranges)
        if chunks > 1 or dynamic:
            self.ranges[chunk] = chunks
        try:
            body = self._vector_stores(s, stores, lanes, value_of_var)
        finally:
            self.ranges = saved
        out = []
        inner = d
        if dynamic:
            out.append("  " * d + _runtime_for(c_name(chunk), "0", self._whole(s, lanes)) + " {")
            inner = d + 1
        elif chunks > 1:
            out.append("  " * d + f"#pragma GCC unroll {min(chunks, VECTOR_UNROLL)}")
            out.append("  " * d + f"for (int {c_name(chunk)} = 0; {c_name(chunk)} < {chunks}; ++{c_name(chunk)}) {{")
            inner = d + 1
        out += self._guarded(body, inner)
        if chunks > 1 or dynamic:
            out.append("  " * d + "}")
        if dynamic:
            return out + self.scalar_tail(s, d, tail, lanes)
        narrower, left = tail_widths(tail, lanes)
        base = s.extent - tail
        for w in narrower:
            out += self._guarded(self._vector_stores(s, stores, w, Const(base) + Var(lane)), d)
            base += w
        return out + self.scalar_tail(s, d, left, lanes)

    def _vector_stores(self, s: ir.For, stores: list, lanes: int, value_of_var: Expr) -> list:
        """(guard conditions, vector store line) of each store of loop `s` with its variable
        replaced by `value_of_var`, `lanes` wide."""
        lane = f"{s.var}__lane"
        extra = {lane: (0, lanes - 1)}
        body = []
        for guard_conds, st in stores:
            idx = tuple(substitute(i, {s.var: value_of_var}) for i in st.indices)
            stride, base0 = _lane_form(self.offset(st.buffer, idx, extra), lane)
            if stride != 1:
                raise NotVectorizable("store is not contiguous")
            code, is_vec = self.vexpr(substitute(st.value, {s.var: value_of_var}), lane, lanes, extra)
            if not is_vec:
                code = f"((f32x{lanes}){{0}} + ({code}))"
            line = f"*(f32x{lanes}*)&{c_name(st.buffer)}[{self.expr(base0)}] = {code};"
            body.append(([self.expr(simplify(g, self._bounds())) for g in guard_conds], line))
        return body

    @staticmethod
    def _guarded(body: list, d: int) -> list:
        """Lines of (guard conditions, statement) pairs at depth d: each under an `if` of its guards."""
        return ["  " * d + (f"if ({' && '.join(conds)}) {line}" if conds else line) for conds, line in body]

    def _whole(self, s: ir.For, lanes: int) -> str:
        """The number of whole vectors in a dynamic loop's run-time trip count."""
        return f"(({self.expr(s.limit)}) / {lanes})"

    def scalar_tail(self, s: ir.For, d: int, tail: int, lanes: int = 0) -> list:
        """The lines of loop `s`'s last `tail` iterations (of a dynamic loop: those after its whole
        vectors of `lanes`), lane by lane."""
        if not tail and s.limit is None:
            return []
        saved_lines, self.lines = self.lines, []
        v = c_name(s.var)
        if s.limit is not None:
            self.emit(d, _runtime_for(v, f"{self._whole(s, lanes)} * {lanes}", self.expr(s.limit)) + " {")
        else:
            self.emit(d, f"for (int {v} = {s.extent - tail}; {v} < {s.extent}; ++{v}) {{")
        self.ranges[s.var] = s.extent
        self.stmt(s.body, d + 1)
        del self.ranges[s.var]
        self.emit(d, "}")
        lines, self.lines = self.lines, saved_lines
        return lines

    def vector_reduction(self, s: ir.For, d: int, lanes: int, tail: int, st: ir.Store) -> list:
        """`b[i] = b[i] + f(r)` (or max) over a vectorised reduction loop r: vectors of partial
        results over whole vectors of r, combined lane by lane in log2(lanes) rotations and folded
        into b[i], then the remainder (a vector of 8 and one of 4 where they fit, each combined and
        folded alike, then lane by lane). With at least 2 * ACCUMULATORS vectors, ACCUMULATORS
        independent partial vectors, so that consecutive vectors do not wait on each other's add or
        max (Whisper's 1500-long softmax rows: one chain of 93). A sum is reassociated; a max is
        exact, NaN included."""
        op = _REDUCERS[type(st.value)]
        value = st.value.b if st.value.a == Load(st.buffer, st.indices) else st.value.a
        chunks = s.extent // lanes
        lane, chunk = f"{s.var}__lane", f"{s.var}__chunk"
        dynamic = s.limit is not None
        vt, acc = f"f32x{lanes}", f"{c_name(s.var)}__acc"
        k = ACCUMULATORS if not dynamic and chunks >= 2 * ACCUMULATORS else 1

        def vec(index: Expr, loops: dict, w: int = lanes) -> str:
            saved = dict(self.ranges)
            self.ranges.update(loops)
            try:
                code, is_vec = self.vexpr(substitute(value, {s.var: index}), lane, w, {lane: (0, w - 1)})
            finally:
                self.ranges = saved
            return code if is_vec else f"((f32x{w}){{0}} + ({code}))"

        def step(a: str, v: str, w: int = lanes) -> str:
            return f"{a} = {op[1].format(acc=a, v=v, w=w)};"
        ind = "  " * (d + 1)
        accs = [acc] + [f"{acc}{j}" for j in range(1, k)]
        out = ["  " * d + "{", ind + f"{vt} " + ", ".join(f"{a} = ({vt}){{0}} + ({op[0]})" for a in accs) + ";"]
        if k > 1:
            q, rounds = f"{s.var}__round", chunks // k
            body = " ".join(step(a, vec((Var(q) * Const(k) + Const(j)) * Const(lanes) + Var(lane), {q: rounds}))
                            for j, a in enumerate(accs))
            out.append(ind + f"for (int {c_name(q)} = 0; {c_name(q)} < {rounds}; ++{c_name(q)}) {{ {body} }}")
            out += [ind + step(acc, vec(Const(c * lanes) + Var(lane), {})) for c in range(rounds * k, chunks)]
            while len(accs) > 1:
                out += [ind + step(a, b) for a, b in zip(accs[::2], accs[1::2])]
                accs = accs[::2]
        elif dynamic:
            out.append(ind + _runtime_for(c_name(chunk), "0", self._whole(s, lanes))
                       + f" {step(acc, vec(Var(chunk) * Const(lanes) + Var(lane), {chunk: chunks}))}")
        elif chunks > 1:
            out.append(ind + f"for (int {c_name(chunk)} = 0; {c_name(chunk)} < {chunks}; ++{c_name(chunk)}) "
                       + step(acc, vec(Var(chunk) * Const(lanes) + Var(lane), {chunk: chunks})))
        else:
            out.append(ind + step(acc, vec(Var(lane), {})))
        target = self.lvalue(st.buffer, st.indices)

        def fold(a: str, w: int) -> list:      # every lane ends with the whole: lane i takes in lane i + half
            lines, half = [], w // 2
            while half:
                rot = ", ".join(str((i + half) % w) for i in range(w))
                lines.append(ind + step(a, f"__builtin_shuffle({a}, (i32x{w}){{{rot}}})", w))
                half //= 2
            return lines + [ind + f"{target} = {op[2].format(a=target, b=f'{a}[0]')};"]
        out += fold(acc, lanes)
        if dynamic:
            out.append("  " * d + "}")
            return out + self.scalar_tail(s, d, tail, lanes)
        narrower, left = tail_widths(tail, lanes)
        base = s.extent - tail
        for w in narrower:
            part = f"{acc}_w{w}"
            out.append(ind + f"f32x{w} {part} = {vec(Const(base) + Var(lane), {}, w)};")
            out += fold(part, w)
            base += w
        out.append("  " * d + "}")
        return out + self.scalar_tail(s, d, left, lanes)

    def vexpr(self, e: Expr, lane: str, lanes: int, extra: dict):
        """(C code, is_vector) of `e` evaluated for all lanes at once."""
        if lane not in free_vars(e):
            return self.expr(simplify(e, self._bounds())), False
        vt = f"f32x{lanes}"
        if isinstance(e, Load):
            off = self.offset(e.buffer, e.indices, extra)
            coef, base = _lane_form(off, lane)
            if coef == 0:
                return f"{c_name(e.buffer)}[{self.expr(off)}]", False
            if coef == 1:
                return f"(*({vt}*)&{c_name(e.buffer)}[{self.expr(base)}])", True
            if (shuffled := self._permuted(e.buffer, off, lane, lanes, extra)) is not None:
                return shuffled, True
            if any(isinstance(n, Load) for n in walk(off)):
                # an address read from memory (a resize's tables): the scalar loop under omp simd
                # ran a bilinear upsample 1.9x and a nearest one 1.4x faster than vectors built
                # from one load per lane (docs/history.md)
                raise NotVectorizable("an address read from memory")
            elems = [f"{c_name(e.buffer)}[{self.expr(simplify(substitute(off, {lane: Const(j)}), self._bounds()))}]"
                     for j in range(lanes)]
            return f"(({vt}){{{', '.join(elems)}}})", True
        if not is_float(e):
            raise NotVectorizable("integer value depends on the lane")
        if isinstance(e, (Add, Sub, Mul, Div)):      # scalar where neither operand moves with the lane
            a, av = self.vexpr(e.a, lane, lanes, extra)
            b, bv = self.vexpr(e.b, lane, lanes, extra)
            op = {Add: "+", Sub: "-", Mul: "*", Div: "/"}[type(e)]
            return f"({a} {op} {b})", av or bv
        if isinstance(e, (Max, Min)):
            a, b = (self.vector(x, lane, lanes, extra) for x in (e.a, e.b))
            return f"tuner_{'max' if isinstance(e, Max) else 'min'}{lanes}({a}, {b})", True
        if isinstance(e, Call) and e.name in VECTOR_CALLS:
            return f"tuner_{e.name}{lanes}({self.vector(e.args[0], lane, lanes, extra)})", True
        if isinstance(e, Select) and lane not in free_vars(e.cond):
            a, b = (self.vector(x, lane, lanes, extra) for x in (e.then, e.other))
            return f"({self.expr(e.cond)} ? {a} : {b})", True
        if isinstance(e, Select) and self._unguarded(e, extra):   # a condition per lane: a mask of float
            a, b = (self.vector(x, lane, lanes, extra) for x in (e.then, e.other))   # compares blends the arms
            return f"TUNER_VSEL({lanes}, {self.vmask(e.cond, lane, lanes, extra)}, {a}, {b})", True
        raise NotVectorizable(f"{type(e).__name__} depends on the lane")

    def vector(self, e: Expr, lane: str, lanes: int, extra: dict) -> str:
        """vexpr's code of `e` as a vector: a value the same in every lane broadcast."""
        c, is_vector = self.vexpr(e, lane, lanes, extra)
        return c if is_vector else f"((f32x{lanes}){{0}} + ({c}))"

    def _unguarded(self, e: Select, extra: dict) -> bool:
        """Whether both arms of a select may be evaluated for every lane, both blended: each read in
        them is inside its buffer for every value of the loops (an arm's read may be what the
        condition guards: a pad's, out of bounds)."""
        ranges = self._bounds(extra)
        for n in walk(Select(Const(0), e.then, e.other)):
            if isinstance(n, Load):
                shape = self.func.buffers[n.buffer].shape
                for idx, size in zip(n.indices, shape):
                    b = bounds(simplify(idx, ranges), ranges)
                    if b is None or b[0] < 0 or b[1] >= size:
                        return False
        return True

    def vmask(self, c: Expr, lane: str, lanes: int, extra: dict) -> str:
        """An i32 lane mask (-1 where it holds) of a condition on float values (an index compared
        per lane, which a lane does not hold as a float, is not vectorised)."""
        if isinstance(c, And):
            return f"({self.vmask(c.a, lane, lanes, extra)} & {self.vmask(c.b, lane, lanes, extra)})"
        if not isinstance(c, Cmp) or not (is_float(c.a) and is_float(c.b)):
            raise NotVectorizable("condition on the lane's index")
        a, b = (self.vector(x, lane, lanes, extra) for x in (c.a, c.b))
        return f"({a} {c.op} {b})"

    def _permuted(self, buffer: str, off: Expr, lane: str, lanes: int, extra: dict) -> str | None:
        """A read whose lanes all fall in one aligned vector of the buffer (offset = a multiple of
        `lanes` + a part in [0, lanes) that moves with the lane): that vector loaded once and its
        lanes permuted (a grouped conv's block of whole groups, each lane reading its group's
        channel: one vpermilps where every lane stays in its 128 bits), else None."""
        ln, shape = linear(off), self.func.buffers[buffer].shape
        if ln is None or not all(isinstance(d, int) for d in shape) or math.prod(shape) % lanes:
            return None
        base, within = {}, {}
        for t, c in ln[0].items():
            (base if c % lanes == 0 and lane not in free_vars(t) else within)[t] = c
        part = from_linear(within, ln[1] % lanes)
        lo_hi = bounds(part, self._bounds(extra))
        if lo_hi is None or lo_hi[0] < 0 or lo_hi[1] >= lanes:
            return None
        idx = [self.expr(simplify(substitute(part, {lane: Const(j)}), self._bounds())) for j in range(lanes)]
        vec = f"(*(f32x{lanes}*)&{c_name(buffer)}[{self.expr(from_linear(base, ln[1] - ln[1] % lanes))}])"
        return vec if idx == [str(j) for j in range(lanes)] else f"__builtin_shuffle({vec}, (i32x{lanes}){{{', '.join(idx)}}})"


def _divisions(e: Expr) -> int:
    return sum(isinstance(n, (FloorDiv, FloorMod)) for n in walk(e))


def _fewer_divisions(cond: Expr, ranges: dict) -> Expr | None:
    """`cond` simplified in the loops' ranges where that removes at least half of its divisions and
    remainders (a concat's test read through a chain of reshapes: ShuffleNet's channel shuffle kept a
    dozen, and GCC kept them too), else None: printed as built. A remainder that strips nothing stays
    (keep_mods): without it GCC lost the bound it gave (a 2-thread Winograd input transform whose
    `(t / 4) % 4` became `t / 4` ran 1.7x slower)."""
    n = _divisions(cond)
    if not n:
        return None
    c = simplify(cond, ranges, keep_mods=True)
    return c if 2 * _divisions(c) <= n else None


# a reduction's (identity, vector step, scalar fold) by its combining expression
_REDUCERS = {Add: ("0.0f", "{acc} + {v}", "{a} + {b}"),
             Max: ("-INFINITY", "tuner_max{w}({acc}, {v})", "tuner_fmax({a}, {b})")}


def _reduction(s: ir.For, stores: list) -> bool:
    """Whether loop `s` only accumulates into one element: `b[i] = b[i] + f` (or max) with i
    independent of the loop, unguarded."""
    if len(stores) != 1 or stores[0][0]:
        return False
    st = stores[0][1]
    if type(st.value) not in _REDUCERS or any(s.var in free_vars(i) for i in st.indices):
        return False
    own = Load(st.buffer, st.indices)
    other = st.value.b if st.value.a == own else st.value.a if st.value.b == own else None
    return other is not None and not any(isinstance(n, Load) and n.buffer == st.buffer for n in walk(other))


def _runtime_for(v: str, start: str, end: str, in_memory: bool = False) -> str:
    """The header of a loop from `start` to a run-time `end`, each evaluated once. in_memory: the
    end lives on the stack, read at each test, so that no register holds it through the body (a
    tile loop's: GCC may park the end in a vector register the register tile needs, and spill an
    accumulator in the innermost loop; docs/history.md)."""
    if in_memory:
        return f"for (int {v} = {start}, *{v}_end = (int[1]){{{end}}}; {v} < *(volatile int*){v}_end; ++{v})"
    return f"for (int {v} = {start}, {v}_end = {end}; {v} < {v}_end; ++{v})"


def _carried(s: ir.For) -> bool:
    """Whether a store in loop `s` writes one element on every iteration (a dependence that
    `#pragma omp simd` would break)."""
    return any(isinstance(x, ir.Store) and not any(s.var in free_vars(i) for i in x.indices) for x in ir.stmts(s.body))


def _lane_form(off: Expr, lane: str):
    """(stride of the already simplified offset `off` in `lane`, offset at lane 0) or (None, None)."""
    ln = linear(off)
    if ln is None:
        return None, None
    lane_var = Var(lane)
    coef = ln[0].get(lane_var, 0)
    if any(lane in free_vars(t) for t in ln[0] if t != lane_var):
        return None, None
    return coef, from_linear({t: c for t, c in ln[0].items() if t != lane_var}, ln[1])


def _straight_stores(s: ir.Stmt, conds=()) -> list:
    """The stores of a loop body made only of stores and ifs: [(conditions, store)]."""
    if isinstance(s, ir.Store):
        return [(list(conds), s)]
    if isinstance(s, ir.Seq):
        out = []
        for x in s.stmts:
            out.extend(_straight_stores(x, conds))
        return out
    if isinstance(s, ir.IfThen):
        return _straight_stores(s.body, tuple(conds) + (s.cond,))
    raise NotVectorizable(f"body has a {type(s).__name__}")


def _keeps_loop(s: ir.Stmt, budget: int) -> bool:
    """Whether `s` is or holds a loop that the C keeps a loop (of more than one trip, neither
    unrolled nor vectorised), under `budget`, the auto_unroll of the loops around it."""
    if isinstance(s, ir.For):
        inner = max(budget, s.auto_unroll)
        return (s.kind in ("serial", "parallel") and s.extent > 1 and not unrolled(s, inner)
                or _keeps_loop(s.body, inner))
    if isinstance(s, ir.Seq):
        return any(_keeps_loop(x, budget) for x in s.stmts)
    return isinstance(s, (ir.IfThen, ir.Allocate, ir.Unswitch)) and _keeps_loop(s.body, budget)


def _threaded(s: ir.For, threads: int) -> bool:
    """Whether the C runs loop `s` on the target's threads (an OpenMP parallel for): a parallel
    loop with PARALLEL_MIN_WORK or more to share (_work); a smaller one runs on the calling thread,
    where waking the team would cost more than it saves."""
    return s.kind == "parallel" and threads > 1 and _work(s) >= PARALLEL_MIN_WORK


def _work(s: ir.Stmt) -> int:
    """Element stores `s` makes (at most: loops at their full extent, both arms of a test), each
    weighted 1 + CALL_WORK per math call in its value."""
    if isinstance(s, ir.For):
        return s.extent * _work(s.body)
    if isinstance(s, ir.Seq):
        return sum(_work(x) for x in s.stmts)
    if isinstance(s, ir.Store):
        return 1 + CALL_WORK * sum(isinstance(e, Call) for e in walk(s.value))
    return _work(s.body) if isinstance(s, (ir.IfThen, ir.Allocate, ir.Unswitch)) else 0


def _hoistable(body: ir.Stmt, threads: int) -> dict:
    """{buffer: shape} of the local buffers too big for the stack that no threaded loop encloses:
    the kernel allocates each once, at its top, rather than on every iteration of the loops
    around it (a pad computed per tile: one allocation per tile otherwise). Inside a threaded
    loop each thread needs its own, so those stay where they are."""
    per_thread = {id(x) for s in ir.stmts(body) if isinstance(s, ir.For) and _threaded(s, threads)
                  for x in ir.stmts(s.body)}
    return {s.buffer: s.shape for s in ir.stmts(body) if isinstance(s, ir.Allocate)
            and id(s) not in per_thread and _alloc_bytes(s.shape) > STACK_LIMIT_BYTES}


def _alloc_bytes(shape: tuple) -> int:
    n = 4
    for e in shape:
        n *= e
    return -(-n // 64) * 64


def generate_c(func: ir.Func, max_lanes: int = 16, threads: int = 1, aliased: frozenset = frozenset()) -> tuple:
    """(C source of one kernel function, whether it needs OpenMP); `aliased`: the names of
    arguments that may share memory, declared without restrict."""
    g = CGen(func, max_lanes, threads, aliased)
    src = g.generate()
    return src, g.uses_openmp
