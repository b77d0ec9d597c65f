"""The CUDA search space of a workload: Ansor's GPU sketch.

Tiled sketch, for a DAG with one reduction (conv2d, depthwise, dense, pooling):
  * pads and epilogue producers inlined; with no epilogue the reduction gets a register
    accumulator (`cache_write`), else the epilogue (bias, residual, activation, clip) is the
    output stage and is written from the accumulator tile in registers;
  * every output axis split four ways, [grid, vthread, threads, s3] in index order: the grid
    parts fused and bound to blockIdx.x, the thread parts to threadIdx.x, the vthread parts to
    "vthread" (schedule.vthread): a thread computes vthread x s3 outputs per axis, in vthread
    tiles of s3 that lie `threads` tiles apart, so that neighbouring threads touch neighbouring
    elements, all in registers (unrolled);
  * each reduction axis split [r0, r1]; every input the reduction reads is copied into shared
    memory (`cache_read`) at the innermost r0 loop, the copy's loops fused, split by the block's
    threads (and by `vec`, 1 or 4 elements per thread and step: float4 where the tile's rows and
    offsets allow, else unrolled) and bound to threadIdx.x (a cooperative load between two
    barriers); the loop order
    inside a thread is r0... r1... s2... s3..., an auto-unroll depth over it;
  * the padding is computed while filling the shared tile (pads are inlined into the copy);
  * each shared tile stored as the input is, or reduction-major: the dimensions that only the
    reduction indexes outermost (`storage_order`), so that a thread's outputs along the others
    read neighbouring words, which nvcc loads four at a time (a GEMM's A tile transposed).
Decisions, in the CPU tiled sketch's shape so that mutation and the Optuna table read them alike:
tile [[threads, vthread, s3] per output axis] (the grid part is what is left), reduce [r1 per axis],
unroll, vec (mutation leaves it as sampled), major [0 | 1 per input read, in `reads` order: 1
reduction-major; absent, all 0]. Injective sketch (layout transforms, elementwise): all axes fused, split by a block size.

A point is checked against the device's limits twice: here (threads per block, the thread's
tile against its registers, the shared tiles' bytes estimated from the block's region) so that
sampling and mutation stay inside them, and exactly by the builder after lowering.
"""
from __future__ import annotations

import math
import random
from functools import cached_property

from ..ops import Workload
from ..te.expr import Load, Var, free_vars, linear, walk
from .sketch import UNROLL_CHOICES, DagSketch, divisors

MAX_THREAD_TILE = 64        # accumulators per thread: beyond it, registers spill (255 per thread)
MIN_THREADS = 32            # a warp; fewer only where the output has fewer elements
BLOCK_SIZES = (64, 128, 256, 512)
VEC_CHOICES = (1, 4)         # elements each thread copies per step into a shared tile (4: float4)


class GpuSearchSpace(DagSketch):
    def __init__(self, workload: Workload | None, target, dag: tuple | None = None):
        super().__init__(workload, target, dag)
        if self.anchor and self.table:
            raise ValueError(f"{self.label}: Winograd's table stages have no CUDA sketch yet; tune the direct conv")
        self._pad_stages = self.pads
        self.pads = []                       # always inlined, into the shared copy: no decision
        self.epilogues = ()
        self.orders = ()          # the register tile's loop order is a CPU decision (space.sketch)
        self.parallel_orders = ()  # so is the order of the threads' parallel loop
        if self.anchor:
            self.reads = sorted({t.name for t in self.anchor_op.inputs})
            self._loads = [n for n in walk(self.anchor_op.body.source) if isinstance(n, Load)]
            self._shapes = {t.name: t.shape for t in self.anchor_op.inputs}
            self.majors = {t: self._reduction_major(t) for t in self.reads}

    def _reduction_major(self, tensor: str) -> list | None:
        """The axes of `tensor`'s shared copy with those only reduction axes index outermost, or
        None where that is the order it has (the decision would change nothing)."""
        red = {r for r, _ in self.reduce_axes}
        dims = range(len(self._shapes[tensor]))
        only = {d for d in dims if all((v := free_vars(ld.indices[d])) and v <= red
                                       for ld in self._loads if ld.buffer == tensor)}
        order = sorted(dims, key=lambda d: d not in only)
        return [f"ax{d}" for d in order] if order != list(dims) else None

    @cached_property
    def major_options(self) -> list:
        """Indices into `reads` of the tiles whose reduction-major order differs from their own."""
        return [k for k, t in enumerate(self.reads) if self.majors[t]]

    @property
    def kind(self) -> str:
        return "tiled" if self.anchor else "injective"

    # ------------------------------------------------------------ the protocol of space.sketch
    def choices(self) -> dict:
        if self.kind == "injective":
            return {"block": [b for b in BLOCK_SIZES if b <= self.target.max_threads], "unroll": [0, 1]}
        raise TypeError("the tiled sketch's decisions are not flat")

    @cached_property
    def last_options(self) -> list:
        """The thread's tile along the innermost output axis (mutation keeps s3 among them)."""
        return [d for d in divisors(self.out_shape[-1]) if d <= 16]

    def valid_tile(self, tile: list) -> bool:
        threads = math.prod(t[0] for t in tile)
        per_thread = math.prod(t[1] * t[2] for t in tile)
        return threads <= self.target.max_threads and per_thread <= MAX_THREAD_TILE

    def shared_bytes(self, dec: dict) -> int:
        """Bytes of the shared tiles of a block under `dec`, from the reduction's loads: each
        index's span over the block's outputs and one r1 tile of the reduction (the lowering's
        region, computed without lowering; a non-affine index takes its whole dimension)."""
        ext = {a: t[0] * t[1] * t[2] for a, t in zip(self.local_axes, dec["tile"])}
        ext.update({r: f for (r, _), f in zip(self.reduce_axes, dec["reduce"])})
        per_tensor: dict = {}
        for ld in self._loads:
            size = 1
            for d, idx in enumerate(ld.indices):
                full = self._shapes[ld.buffer][d]
                ln = linear(idx)
                if ln is None or any(not isinstance(t, Var) or t.name not in ext for t in ln[0]):
                    span = full
                else:
                    span = 1 + sum(abs(c) * (ext[t.name] - 1) for t, c in ln[0].items())
                size *= min(span, full)
            per_tensor[ld.buffer] = max(per_tensor.get(ld.buffer, 0), size)
        return 4 * sum(per_tensor.values())

    def valid(self, dec: dict) -> bool:
        if self.kind != "tiled":
            return True
        return self.valid_tile(dec["tile"]) and self.shared_bytes(dec) <= self.target.smem

    def sample(self, rng: random.Random) -> dict:
        if self.kind != "tiled":
            return {name: rng.choice(opts) for name, opts in self.choices().items()}
        total = math.prod(self.out_shape)
        want = min(MIN_THREADS, total)
        dec = None
        for _ in range(1000):
            tile = []
            for d, e in enumerate(self.out_shape):
                s3 = rng.choice(self.last_options if d == len(self.out_shape) - 1
                                else [x for x in divisors(e) if x <= 8])
                s2 = rng.choice([x for x in divisors(e // s3) if x <= 8])
                t = rng.choice(divisors(e // (s3 * s2)))
                tile.append([t, s2, s3])
            dec = {"tile": tile, "reduce": [rng.choice(divisors(e)) for _, e in self.reduce_axes],
                   "unroll": rng.choice(UNROLL_CHOICES), "vec": rng.choice(VEC_CHOICES),
                   "major": [rng.randrange(2) if k in self.major_options else 0 for k in range(len(self.reads))]}
            if math.prod(t[0] for t in tile) >= want and self.valid(dec):
                return dec
        return self.default()

    def default(self) -> dict:
        """Threads over the innermost axes (up to 128), a 4-wide thread tile along the last axis
        where it divides, reduction tiles of up to 8 that keep the shared tiles in bounds."""
        if self.kind == "injective":
            return {"block": 256 if 256 <= self.target.max_threads else self.target.max_threads, "unroll": 0}
        shape = self.out_shape
        tile = [[1, 1, 1] for _ in shape]
        tile[-1][2] = max(x for x in divisors(shape[-1]) if x <= 4)
        threads, cap = 1, min(128, self.target.max_threads)
        for d in range(len(shape) - 1, -1, -1):
            left = shape[d] // (tile[d][1] * tile[d][2])
            t = max(x for x in divisors(left) if threads * x <= cap)
            tile[d][0] = t
            threads *= t
        red = []
        for _, e in self.reduce_axes:
            red.append(max(x for x in divisors(e) if x <= 8))
        dec = {"tile": tile, "reduce": red, "unroll": 64, "vec": 1}
        while not self.valid(dec) and any(r > 1 for r in dec["reduce"]):
            j = max(range(len(red)), key=lambda k: dec["reduce"][k])
            dec["reduce"][j] = max(x for x in divisors(self.reduce_axes[j][1]) if x < dec["reduce"][j])
        while not self.valid(dec) and any(t[0] > 1 for t in tile):     # a tiny device: fewer threads
            d = max(range(len(tile)), key=lambda k: tile[k][0])
            tile[d][0] = max(x for x in divisors(tile[d][0]) if x < tile[d][0])
        return dec

    # ------------------------------------------------------------ decisions -> steps
    def steps(self, dec: dict) -> list:
        if self.kind == "injective":
            return self._injective_steps(dec)
        steps = [["compute_inline", s] for s in self._pad_stages + self.others + self.consumers]
        out, acc, out_axes = self.output.name, self.anchor, self.out_axes
        if self.cache_write:
            steps.append(["cache_write", self.anchor])
            out, acc, out_axes = self.anchor, f"{self.anchor}.local", [f"{a}_" for a in self.local_axes]
        for t in self.reads:
            steps.append(["cache_read", t, "shared", [acc]])
        for ax, (t, s2, s3) in zip(out_axes, dec["tile"]):
            steps.append(["split", out, ax, [s2, t, s3]])       # index order: grid, vthread, thread, s3
        lv = {name: [f"{a}.{k}" for a in out_axes] for k, name in enumerate(("grid", "vthread", "thread", "s3"))}
        steps.append(["reorder", out, lv["grid"] + lv["thread"] + lv["vthread"] + lv["s3"]])
        tiles = []
        for key, tag in (("grid", "blockIdx.x"), ("thread", "threadIdx.x"), ("vthread", "vthread")):
            if len(lv[key]) > 1:
                steps.append(["fuse", out, lv[key]])
            tiles.append("@".join(lv[key]))
            steps.append(["bind", out, tiles[-1], tag])
        for a, (_, _, s3) in zip(out_axes, dec["tile"]):
            if s3 > 1:
                steps.append(["annotate", out, f"{a}.3", "unroll"])
        steps.append(["compute_at", acc, out, tiles[-1]])       # one s3 tile per virtual thread
        for (r, _), r1 in zip(self.reduce_axes, dec["reduce"]):
            steps.append(["split", acc, r, [r1]])
        red = [r for r, _ in self.reduce_axes]
        steps.append(["reorder", acc, [f"{r}.0" for r in red] + [f"{r}.1" for r in red] + list(self.local_axes)])
        for a, (_, _, s3) in zip(self.local_axes, dec["tile"]):
            if s3 > 1:
                steps.append(["annotate", acc, a, "unroll"])
        if dec["unroll"]:
            steps.append(["pragma", acc, f"{red[0]}.0", "auto_unroll_max_step", dec["unroll"]])
        block = math.prod(t[0] for t in dec["tile"])
        major = dec.get("major") or [0] * len(self.reads)
        for t, m in zip(self.reads, major):
            sh = f"{t}.shared"
            steps.append(["compute_at", sh, acc, f"{red[-1]}.0"])
            if m and self.majors[t]:
                steps.append(["storage_order", sh, self.majors[t]])
            axes = [f"ax{k}" for k in range(len(self._shapes[t]))]
            leaf = axes[0]
            if len(axes) > 1:
                steps.append(["fuse", sh, axes])
                leaf = "@".join(axes)
            vec = dec.get("vec", 1)
            steps.append(["split", sh, leaf, [block, vec] if vec > 1 else [block]])
            steps.append(["bind", sh, f"{leaf}.1", "threadIdx.x"])
            if vec > 1:
                steps.append(["annotate", sh, f"{leaf}.2", "vectorize"])
        return steps

    def _injective_steps(self, dec: dict) -> list:
        steps = [["compute_inline", s] for s in self._pad_stages + self.others + self.consumers]
        out = self.output.name
        axes = list(self.out_axes)
        if len(axes) > 1:
            steps.append(["fuse", out, axes])
        leaf = "@".join(axes)
        steps.append(["split", out, leaf, [dec["block"]]])
        steps.append(["bind", out, f"{leaf}.0", "blockIdx.x"])
        steps.append(["bind", out, f"{leaf}.1", "threadIdx.x"])
        return steps



__all__ = ["GpuSearchSpace", "MAX_THREAD_TILE"]
