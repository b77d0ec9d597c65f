"""The CPU search space of a workload: Ansor-style sketches plus sampled annotations.

A sketch fixes the structure of a schedule; a point in the space (a small JSON-able dict of
decisions) fills in its numbers; `steps(decisions)` turns the two into a replayable step list.

Tiled sketch, for a DAG with one reduction (conv2d, dense, pooling):
  * pad producers are inlined, computed at root, computed per tile, or inlined with an interior
    version (a decision, `pad`): per tile, the padded copy covers what one output tile reads and
    is made at the reduction's outermost loop, so it is written and read while in cache, where a
    copy at root goes through memory first; inlined, the pad's bounds test sits in the innermost
    loop (docs/history.md); `interior` inlines it and writes the reduction twice, without the
    test for the tiles whose reads all lie inside the input and with it for the border tiles
    (the unswitch pragma), so that neither a copy nor a test is paid away from the border;
  * elementwise consumers (the epilogue: bias, residual, activation) are inlined into the output
    stage; with none, `cache_write` makes a local accumulator;
  * the epilogue is fused or apart (a decision, when there is one): fused, the output stage is
    tiled S0 S1 | T over every spatial axis and the reduction is computed at its S1 tile, so the
    epilogue runs on each tile while it is in cache; apart, the reduction gets its own
    accumulator (`cache_write`) and that tiling, and the epilogue is a second loop nest over the
    whole output (vectorised, parallel), the cost of running it as its own kernel without the call;
  * the reduction is tiled "SSRSRS": R0 S2 R1 S3 over its tile, S3 being the register tile
    (innermost axis vectorised, the others unrolled) and an auto-unroll depth;
  * the register tile's unrolled loops run in the output's axis order or reversed (a decision,
    `order`; the vector axis stays innermost): for NCHW[x]c, reversed puts the pixels outside
    the channel blocks, so each input broadcast feeds every channel block while the weight
    vectors stay in registers, as MLAS's AVX-512 kernels do, and wider tiles fit the registers;
    by default an output whose vector axis the broadcast operand does not index either (a
    Winograd GEMM's or an NHWC conv's channels) takes up to 4 vectors of it by rows of the axes
    not every operand reads; a conv whose row is padded where a column is not (1x7) runs its tile
    down the columns, where that is as long, so that no tile holds a border test; a row of 7 to 9
    pixels (7, 17, 35 or 8 wide outputs) takes 3 or 4 channel blocks where their accumulators fit,
    and an unpadded row of 14 (a 1x1 conv's) 4 blocks by 7 pixels; where such a tile's weights
    over the whole reduction reach PANEL_BYTES, the reduction is blocked into L1-sized chunks,
    each serving rows of tiles (`_block_reduction`);
  * outer tiles in the output's axis order or with the axes that index only the activation first
    (a decision, `parallel`, where the two differ), fused and parallel when the target has more
    than one thread: each thread then takes its own rows of the activation and reads all the
    weights, rather than its share of the weights and all the activation; by default where the
    activation is the larger (ResNet-50's early 1x1 convs) and the channels do not index it too
    (a grouped or depthwise conv, whose channel blocks split both operands); at one thread, where
    the activation outgrows L2, a register tile's weights L1 and the weights are a quarter of the
    activation or less (`_input_first_alone`), so that the activation is read once rather than
    once per block of output channels;
  * prefetches (a decision, `prefetch`, PREFETCH_LEVELS; schedule.prefetch): none, the weight's
    next panel, or that and the activation's next tile where a reduction loop longer than PEELED
    reads it a line or more apart (NCHW[x]c's channel blocks), by default the most there is;
Table sketch, for a reduction over a small constant matrix (the Winograd transforms: its stage's
`table` names the axes that pick matrix entries): those axes and the reduction are unrolled, so
that the C compiler folds the entries into constants (the tiled sketch leaves them as select
chains evaluated on every element); the innermost axis is split by a vector length (a decision;
by default the widest that is one register and no wider than the input's contiguous run,
`vector_run`) and vectorised inside them, pad producers inlined or at root (a decision), the
epilogue computed from the unrolled tile, the outer loops fused and parallel. A blocked output
transform (NCHW[x]c: a channel-block axis outside the tile axes) also decides where that block
loop runs (`blocks`): outside the tile loops, or inside them so that each tile reads its rows of
the product once for all blocks (the default).
Injective sketch, for DAGs without a reduction: producers inlined, innermost axis vectorised,
the rest fused and parallel; where an input is read transposed (its contiguous dimension indexed
by another output axis: NCHW16c -> NCHW), that axis tiled just outside the vector loop (a
decision, `transpose`: the tile or none; by default the tile).

The injective and table sketches are flat: a point is one option per `choices()` entry, and
sampling, mutation and the Optuna parameter table read those options; only the tiled sketch
has structured decisions (a tile per axis).
"""
from __future__ import annotations

import math
import random
from functools import cached_property

from ..ops import Workload
from ..ops.dense import WIDE_ACTIVATION_BYTES
from ..ops.workload import CONSTANT_INPUTS
from ..schedule.ir import tail_widths, vector_split
from ..schedule.peel import concat_test
from ..schedule.prefetch import LINE_FLOATS, PEELED
from ..schedule.schedule import Schedule, ScheduleError, replay
from ..te.expr import (Const, FloorDiv, FloorMod, Load, Select, Var, bounds, children, free_vars, linear, simplify,
                       substitute, walk)

MAX_ACCUMULATORS = 32        # vector registers of AVX-512 (AVX2 has 16; spills only cost speed)
MAX_TILE_FLOATS = 16384      # a 64 KiB accumulator tile stays on the stack and in L1/L2
UNROLL_CHOICES = (0, 16, 64, 512)
PANEL_BYTES = 256 * 1024     # a register tile's constant panel over the whole reduction from which it is blocked
GEMM_PANEL_BYTES = 1 << 20   # ... a GEMM column tile's (a core's share of L2: its row tiles read it from L3)
GEMM_CHUNK_BYTES = 64 * 1024  # ... into chunks of this panel, each kept in L2 while the row tiles pass over it
WIDE_TILES = 4              # column tiles one pass over a GEMM's activation past WIDE_ACTIVATION_BYTES serves
RESIDENT_BYTES = 1 << 20      # constants that a GEMM re-reads per row tile from L2 or L3, rather than its activation from memory
LONG_REDUCTION = 128         # a GEMM's reduction from which its default tile may put the columns inside the rows
STREAMED_BYTES = 8 << 20     # an activation past this is read from memory: twice a server core's share of L3 or more
L1_SETS, L1_SET_ROWS = 64, 8   # an L1 cache's sets (32 KiB of 8 ways, 48 KiB of 12), and the rows of a register tile one may hold
GATHER_LINES = 256           # lines of a transposed read touched between two uses of each: half a 32 KiB L1
PARALLEL_GRAIN = 16          # iterations per thread of an injective kernel's fused parallel loop, at least
L1_BYTES = 32 * 1024         # a core's L1 data cache, the smallest of the x86 server cores
PANEL_CHUNK = 16 * 1024      # ... into chunks of this panel, each kept in L1 while rows of tiles pass over it
TILE_ROWS = 7                # rows of register tiles that one chunk serves, at most
BLOCKED_TILE_BYTES = 32 * 1024   # ... and the local tile they accumulate
LOAD_ACCUMULATORS = 8       # with 16 registers, a tile whose every FMA loads its operands (a depthwise conv)
LATENCY_ACCUMULATORS = 8    # independent FMAs that hide an FMA's latency: 4 cycles on 2 pipes
PADDING_SHARE = 0.5         # this share of a conv's products in padding or more: its pad inlined, its rows halved
TILE_COPIES = 5             # a blocked conv's pad copied per chunk where that copies at most this many times the input
COPY_READS = 100            # with 16 registers a pad read fewer times per element than this is not copied first
PAD_PLACES = ("inline", "root", "tile", "interior")   # where a pad producer is computed (tile: per output tile)
PREFETCH_LEVELS = (0, 1, 2)     # decision `prefetch`: none, the weights' next panel, that and the activation's next tile
ORDERS = ("axes", "reversed")  # the register tile's unrolled loops: the output's axis order, or reversed
PARALLEL_ORDERS = ("axes", "input")  # the fused parallel loop: outer tiles in axis order, or the activation's axes first
# the CPU space's version, in every pre-trained model's metadata: bumped when the space gains a
# structure that a model trained before ranks blind (2: pad interior, also the default's)
SPACE_VERSION = 2
BLOCK_PLACES = ("outside", "inside")   # a table sketch's channel-block loop: outside its tile loops, or inside
# what steps() and their replay raise for decisions that are no point of a space (another
# target's, an older version's, a hand-edited log's)
FOREIGN = (ScheduleError, KeyError, IndexError, TypeError, ValueError)


def guarded_length(extent: int, per: int, cap: int) -> int:
    """The register tiles' length along a row of `extent`, the last tile guarded, each position
    `per` accumulators, at most `cap` in a tile: the one that takes the fewest FMA cycles, a tile of
    `a` accumulators costing max(a, LATENCY_ACCUMULATORS) + 1 a reduction step (throughput, else
    the FMAs' latency, and the tile's stores); of equal costs the longest. With AVX2's 12
    accumulators by 2 vectors a row of 7 goes as 4 + 3 rather than 6 + 1, whose last tile waits
    on its 2 FMAs' latency (RegNetX's 400-channel 1x1 convs at 7x7: 0.83x the time), 14 as 5 + 5 + 4
    (0.93x). Tiles of more vectors fill the room: by 4 (a Winograd GEMM's columns) a row of 16 in
    tiles of 2 ran 1.3x the time of 3 + 3 + 3 + 3 + 3 + 1, against the 0.97x this count predicts."""
    room = max(1, min(extent, cap // per))
    if per > 2:
        return room

    def cycles(r: int) -> int:
        full, rest = divmod(extent, r)
        return full * (max(r * per, LATENCY_ACCUMULATORS) + 1) + (rest > 0) * (max(rest * per, LATENCY_ACCUMULATORS) + 1)
    return min(range(room, 0, -1), key=cycles)


def register_length(extent: int, fit: int, padded: bool = False) -> int:
    """The default register tile along an output axis of `extent` with room for `fit` tiles: its
    largest divisor that fits, unless that fills under a quarter of the room (a prime width:
    Inception's 17 and 71); then as few tiles as fit, of equal length but the last, which is guarded
    (lowering peels it off): 17 as 9 + 8, or 6 + 6 + 5 where padded (a 1x7 conv at 17x17: 0.59
    against 0.67 ms for 7 + 7 + 3 at 1 thread, 0.31 against 0.44 at 2).
    With an interior version (`padded`), no axis in exactly two tiles: both would be border tiles
    with a one-sided test, which GCC compiled to spills (a 3x3 conv at 28x28 in two 14-pixel
    tiles: 0.70 of peak; in four of 7 by two rows: 0.96)."""
    fit = max(1, fit)
    ok = lambda x: not (padded and -(-extent // x) == 2)          # noqa: E731
    fits = [x for x in divisors(extent) if x <= fit]
    best = max([x for x in fits if ok(x)] or fits)
    if 4 * best >= fit or fit >= extent:
        return best
    n = -(-extent // fit)
    n += padded and n == 2
    return -(-extent // n)


def divisors(n: int) -> list:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


class DagSketch:
    """What every sketch reads off a compute DAG: its reduction (the anchor), pad stages, the
    elementwise stages after the anchor (its epilogue) and the others, and the axes it tiles.
    The CPU sketches below and the CUDA ones (space.gpu) are built on it."""

    prefetched: tuple = ()      # the inputs a kernel may prefetch (decision `prefetch`): the CPU tiled sketch's

    def __init__(self, workload: Workload | None, target, dag: tuple | None = None):
        """The space of `workload`'s compute DAG, or of `dag` = (inputs, output) when given (a fused
        group that no workload describes, compiled by `tuner compile`)."""
        self.workload = workload
        self.target = target
        self.inputs, self.output = dag or workload.build()
        sch = Schedule(self.inputs, self.output)
        stages = sch.stages
        reductions = [s for s in stages if s.op.is_reduction]
        self.label = workload.label if workload else self.output.name
        if len(reductions) > 1:
            raise ValueError(f"{self.label}: more than one reduction stage is not supported yet")
        self.anchor = reductions[0].name if reductions else None
        out = sch.output_name
        self.pads = [s.name for s in stages if s.op.tag == "pad" and s.name != out]   # an output pad is computed
        anchor_pos = next((k for k, s in enumerate(stages) if s.name == self.anchor), -1)
        self.consumers = [s.name for s in stages[anchor_pos + 1:] if s.name != out] if self.anchor else []
        self.others = [s.name for s in stages if s.name not in self.pads and s.name != out
                       and s.name != self.anchor and s.name not in self.consumers]
        self.cache_write = self.anchor == out
        self.out_shape = self.output.shape
        self.out_axes = [a.name for a in sch.output.op.axes]
        if self.anchor:
            anchor_stage = sch.stage(self.anchor)
            self.anchor_op = anchor_stage.op
            self.local_axes = [a.name for a in anchor_stage.op.axes]
            self.reduce_axes = [(r.name, r.extent) for r in anchor_stage.op.reduce_axes]
            self.table = dict(anchor_stage.op.table)

    def schedule(self, steps: list) -> Schedule:
        return replay(self.inputs, self.output, steps)

    def register_options(self, d: int) -> list:
        """Register-tile lengths of output axis `d`: the innermost axis's `last_options`, else the
        divisors of its extent that fit the accumulators."""
        if d == len(self.out_shape) - 1:
            return list(self.last_options)
        return [x for x in divisors(self.out_shape[d]) if x <= MAX_ACCUMULATORS]

    def tile_options(self, d: int) -> list:
        """Every (S1, S2, S3) tiling of output axis `d`: S3 a register length, S2 and S1 dividing
        the number of register tiles."""
        if d not in self._tilings:
            e, out = self.out_shape[d], []
            for s3 in self.register_options(d):
                n = -(-e // s3)
                out += [[s1, s2, s3] for s2 in divisors(n) for s1 in divisors(n // s2)]
            self._tilings[d] = out
        return self._tilings[d]

    @cached_property
    def _tilings(self) -> dict:
        return {}


class SearchSpace(DagSketch):
    """The CPU sketches (module doc)."""

    major_options = ()          # shared tiles that may be stored reduction-major: a GPU decision (space.gpu)

    @property
    def kind(self) -> str:
        return "injective" if not self.anchor else "table" if self.table else "tiled"

    def choices(self) -> dict:
        """The options of each decision of a flat sketch (injective, table): name -> options. The
        pad placement is {pad stage: "inline" | "root"}, as in the tiled sketch's points."""
        if self.kind == "injective":
            tiles = self.transposed[1] if self.transposed else []
            return {"vec": list(self.injective_vecs), "unroll": [0, 1], **({"transpose": [1, *tiles]} if tiles else {})}
        if self.kind == "table":
            pads = [{p: where for p in self.pads} for where in self.pad_places] if self.pads else []
            return {"vec": list(self.last_options), **({"pad": pads} if pads else {}),
                    **({"acc": ["local", "direct"]} if self.cache_write else {}),
                    **({"blocks": list(BLOCK_PLACES)} if self.block_axes else {})}
        raise TypeError("the tiled sketch's decisions are not flat")

    @cached_property
    def block_axes(self) -> frozenset:
        """The table sketch's output axes, besides the vector's, that run outside its tiles and not
        just once (the channel blocks of an NCHW[x]c output): the decision `blocks` runs them
        outside the tile loops or inside them. Empty without tiles (no table axis with a period)."""
        if self.kind != "table" or not any(self.table.get(a) for a in self.local_axes[:-1]):
            return frozenset()
        return frozenset(a for a, e in zip(self.local_axes[:-1], self.out_shape) if a not in self.table and e > 1)

    def valid(self, dec: dict) -> bool:
        """Whether a point proposed by mutation or a sampler is legal in this space."""
        return self.valid_tile(dec["tile"]) if self.kind == "tiled" else True

    def reduction_stage(self, dec: dict) -> str:
        """The stage that computes the reduction under `dec`: its accumulator when it has one."""
        return f"{self.anchor}.local" if self.cache_write or dec.get("epilogue") == "apart" else self.anchor

    @property
    def epilogues(self) -> tuple:
        """Where the epilogue can run: ("fused", "apart") when there is one, else ()."""
        return ("fused", "apart") if self.anchor and not self.cache_write else ()

    @property
    def pad_places(self) -> tuple:
        """Where a pad producer can be computed: PAD_PLACES in the tiled sketch; the table sketch
        has no tile to compute it at."""
        return PAD_PLACES if self.kind == "tiled" else PAD_PLACES[:2]

    @property
    def orders(self) -> tuple:
        """The register tile's loop orders (decision `order`): ORDERS for the tiled sketch, else ()."""
        return ORDERS if self.kind == "tiled" else ()

    @cached_property
    def parallel_orders(self) -> tuple:
        """The outer tiles' orders (decision `parallel`, fused into the parallel loop where there is
        more than one thread): PARALLEL_ORDERS where `input` moves an axis, else ()."""
        if self.kind != "tiled":
            return ()
        moved = [d for d in self._input_first if self.out_shape[d] > 1]     # axes of one tile move nothing
        return PARALLEL_ORDERS if moved != sorted(moved) else ()

    @cached_property
    def prefetch_options(self) -> tuple:
        """Values of the decision `prefetch`: PREFETCH_LEVELS up to the activation's next tile where
        a next-tile prefetch serves a read of it (`_activations`), else up to the weights' panel."""
        return PREFETCH_LEVELS if self._activations else PREFETCH_LEVELS[:2]

    @cached_property
    def prefetched(self) -> tuple:
        """The constant inputs the reduction reads, whose next panel the tiled sketch's kernel may
        fetch ahead (decision `prefetch`: schedule.prefetch); () for the other sketches."""
        if self.kind != "tiled":
            return ()
        return tuple(sorted(b for b, _ in self._reads if b in self._constants))

    @cached_property
    def _activation_reads(self) -> tuple:
        """(pad stage or None, input, strided) of each activation the reduction reads, itself or
        through a pad producer; strided: by a reduction axis longer than PEELED that steps a line
        or more (NCHW[x]c's channel blocks)."""
        sch = Schedule(self.inputs, self.output)
        inputs = {t.name: t.shape for t in self.inputs if t.name not in self._constants}
        long = {r for r, e in self.reduce_axes if e > PEELED}
        found = []
        for n in walk(self.anchor_op.body):
            if not isinstance(n, Load):
                continue
            if n.buffer in inputs:
                shape, reads = inputs[n.buffer], [(None, n.buffer)]
            elif n.buffer in self.pads:
                op = sch.stage(n.buffer).op
                shape, reads = [a.extent for a in op.axes], [(n.buffer, t.name) for t in op.inputs if t.name in inputs]
            else:
                continue
            strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
            strided = any(t.name in long and abs(c) * st >= LINE_FLOATS
                          for i, st in zip(n.indices, strides) for t, c in (linear(i) or ({}, 0))[0].items()
                          if isinstance(t, Var))
            found += [(p, t, strided) for p, t in reads]
        return tuple(dict.fromkeys(found))

    @cached_property
    def _activations(self) -> tuple:
        """(pad stage or None, input) of each activation whose reads a next-tile prefetch
        (schedule.prefetch) serves: strided ones."""
        return tuple(dict.fromkeys((p, t) for p, t, strided in self._activation_reads if strided))

    @cached_property
    def _views(self) -> dict:
        """The op of each stage inlined into the anchor's reads (self.others: reshapes, merged heads)."""
        sch = Schedule(self.inputs, self.output)
        return {s: sch.stage(s).op for s in self.others}

    @cached_property
    def _reduction_input_bytes(self) -> int:
        """Bytes of the activations the reduction reads, itself, through a pad or through inlined
        views (merged heads), not the epilogue's (a residual)."""
        names = {t.name for t in self.inputs} - self._constants
        read = {t for _, t, _ in self._activation_reads}
        todo = [n.buffer for n in walk(self.anchor_op.body) if isinstance(n, Load) and n.buffer in self._views]
        while todo:
            for n in walk(self._views[todo.pop()].body):
                if isinstance(n, Load) and n.buffer in self._views:
                    todo.append(n.buffer)
                elif isinstance(n, Load) and n.buffer in names:
                    read.add(n.buffer)
        return sum(4 * math.prod(t.shape) for t in self.inputs if t.name in read)

    @cached_property
    def _constants(self) -> frozenset:
        """Names of the inputs that are a model's constants (the weights); the others are the activation."""
        return frozenset(t.name for t in self.inputs if t.name in CONSTANT_INPUTS)

    @cached_property
    def _operand_axes(self) -> tuple:
        """(the axes the activation's reads use, the axes the constants' reads use)."""
        return (frozenset().union(*(v for b, v in self._reads if b not in self._constants)),
                frozenset().union(*(v for b, v in self._reads if b in self._constants)))

    @cached_property
    def _input_first(self) -> list:
        """Output axis positions, those that index the activation and no constant first, each group
        in axis order."""
        acts, weights = self._operand_axes
        first = [d for d, a in enumerate(self.local_axes) if a in acts and a not in weights]
        return first + [d for d in range(len(self.local_axes)) if d not in first]

    @cached_property
    def _shared_axes(self) -> bool:
        """Whether an output axis indexes both the activation and the weights (a grouped or
        depthwise conv's channels)."""
        acts, weights = self._operand_axes
        return any(a in acts and a in weights for a in self.local_axes)

    @cached_property
    def _input_first_by_default(self) -> bool:
        """Whether `parallel: input` is the default: the activation's bytes exceed the constants'
        (the weights'), and a thread given a share of the output axes that index the weights would
        read all of the activation. A grouped or depthwise conv's channels index both: split by
        them, each thread reads its share of either, and the producer's threads wrote by channels
        too (ResNeXt-50's grouped convs at 2 threads, in the model: 0.93x the time; docs/history.md)."""
        return not self._shared_axes and self._input_elements(False) > self._input_elements(True)

    def _input_elements(self, constant: bool) -> int:
        """Elements of the constant inputs (the weights, a bias), or of the others (the activation)."""
        return sum(math.prod(t.shape) for t in self.inputs if (t.name in self._constants) == constant)

    # ------------------------------------------------------------ per-axis options
    @cached_property
    def last_options(self) -> list:
        """Register-tile lengths of the innermost output axis: vector multiples when it has any."""
        e = self.out_shape[-1]
        vec = [d for d in divisors(e) if d % 4 == 0 and d <= 4 * self.target.lanes]
        return vec or [d for d in divisors(e) if d <= 16]

    @cached_property
    def injective_vecs(self) -> list:
        """The injective sketch's inner lengths: last_options, and the whole innermost axis where no
        vector length divides it but the C generator vectorises it with a scalar tail (ViT's 197
        tokens), rather than one element at a time."""
        e, opts = self.out_shape[-1], list(self.last_options)
        if e not in opts and not any(v % 4 == 0 for v in opts) and vector_split(e, self.target.lanes)[0] > 0:
            opts.append(e)
        return opts

    def register_options(self, d: int) -> list:
        """DagSketch's; for a GEMM's column axis also one, two and three whole vectors where they do
        not divide it, and for its row axis the lengths that fill the accumulator budget of one, two
        or three vectors of columns (6 and 12 rows with AVX2) and the default's, each with a guarded
        last tile; for another tiled output, the default's guarded length (register_length), and
        along a broadcast axis 2, 3 and 4 where `_pairs` allows them with a guarded last tile (25
        channel blocks by 4)."""
        opts = super().register_options(d)
        if d == len(self.out_shape) - 1 and self.gemm_shaped:
            opts += [w for w in self._guarded_columns if w not in opts]
        elif d == len(self.out_shape) - 2 and self.gemm_shaped:
            extra = {self.accumulator_budget // v for v in (1, 2, 3)} | {self._gemm_rows()[1]}
            opts += sorted(x for x in extra - set(opts) if x < self.out_shape[d])
        elif self.kind == "tiled" and d < len(self.out_shape) - 1:
            extra = [self._default_tile[d][2]] + [m for m in (2, 3, 4) if d in self._broadcast_axes and self._pairs(d, m)]
            opts += [x for x in dict.fromkeys(extra) if x not in opts]
        return opts

    @cached_property
    def _default_tile(self) -> list:
        return self.default()["tile"]

    @property
    def accumulator_budget(self) -> int:
        """Vector registers a GEMM's register tile may hold as accumulators: 3/4 of them (16 with
        AVX2, 32 with AVX-512); the rest hold the column vectors and a row's broadcast."""
        return (32 if self.target.lanes >= 16 else 16) * 3 // 4

    @cached_property
    def gemm_shaped(self) -> bool:
        """A tiled reduction with a ([batch,] rows, cols) output and more than one row (dense, batch_matmul)."""
        shape = self.out_shape
        return (self.kind == "tiled" and len(shape) in (2, 3) and shape[-2] > 1 and bool(self.reduce_axes)
                and not self.table)

    def _vectors(self, s3_last: int) -> int:
        """Registers a row of `s3_last` columns takes as the C generator vectorises it (vector_split,
        tail_widths): whole vectors, narrower ones, one per lane left (60 columns with AVX-512: 7 of
        8 lanes and one of 4)."""
        width, tail = vector_split(s3_last, self.target.lanes)
        if not width:
            return s3_last
        narrower, left = tail_widths(tail, width)
        return (s3_last - tail) // width + len(narrower) + left

    @cached_property
    def _guarded_columns(self) -> list:
        """A GEMM's column tiles of one, two and three whole vectors that do not divide its columns
        (the last tile guarded; lowering peels it off)."""
        lanes, e = self.target.lanes, self.out_shape[-1]
        return [k * lanes for k in (1, 2, 3) if k * lanes < e and e % (k * lanes)]

    def valid_tile(self, tile: list) -> bool:
        """Whether a tiling fits the registers and the stack (mutations and Optuna propose others)."""
        acc = self._vectors(tile[-1][2])   # accumulator vectors of the register tile
        size = 1                            # floats in the local tile
        for _, _, s3 in tile[:-1]:
            acc *= s3
        for _, s2, s3 in tile:
            size *= s2 * s3
        return acc <= MAX_ACCUMULATORS and size <= MAX_TILE_FLOATS

    # ------------------------------------------------------------ sampling
    def sample(self, rng: random.Random) -> dict:
        if self.kind != "tiled":
            return {name: rng.choice(opts) for name, opts in self.choices().items()}
        for _ in range(1000):
            tile = []
            for d, e in enumerate(self.out_shape):
                s3 = rng.choice(self.register_options(d))
                s2 = rng.choice(divisors(-(-e // s3)))
                s1 = rng.choice(divisors(-(-e // s3) // s2))
                tile.append([s1, s2, s3])
            if self.valid_tile(tile):
                break
        dec = {
            "pad": {p: rng.choice(self.pad_places) for p in self.pads},
            "tile": tile,
            "reduce": [rng.choice(divisors(e)) for _, e in self.reduce_axes],
            "unroll": rng.choice(UNROLL_CHOICES),
        }
        if self.epilogues:
            dec["epilogue"] = rng.choice(self.epilogues)
        dec["order"] = rng.choice(self.orders)
        if self.parallel_orders:
            dec["parallel"] = rng.choice(self.parallel_orders)
        if self.prefetched:
            dec["prefetch"] = rng.choice(self.prefetch_options)
        return dec

    def default(self) -> dict:
        """A reasonable untuned point: a vector-wide, register-sized tile, cache blocking only where
        a register tile's weights reach PANEL_BYTES (_block_reduction)."""
        if self.kind == "injective":
            return {"vec": max(self.injective_vecs), "unroll": 0, **({"transpose": self.transposed[1][-1]} if self.transposed else {})}
        if self.kind == "table":
            # each decision's first option (the pad read in place, a register accumulator), but a
            # blocked output transform's block loop inside its tiles, so that each tile reads its
            # rows of the product once for all blocks and its threads split the tiles as the
            # producer's did (ResNet-50's at 2 threads in the model: 0.53x the time of outside);
            # one vector register per table entry, no wider than the input's contiguous run (16
            # lanes of an 8c input are gathered one by one: docs/history.md)
            fits = [v for v in self.last_options if v <= self.target.lanes]
            vec = [v for v in fits if v <= (self.vector_run or v)] or fits
            return {**{name: opts[0] for name, opts in self.choices().items()}, "vec": max(vec or self.last_options),
                    **({"blocks": "inside"} if self.block_axes else {})}
        shape = self.out_shape
        # the pad inlined with an interior version where the border tiles' tests have registers to
        # spare (32: AVX-512), or where a copy is not paid back: each padded element read fewer
        # than COPY_READS times (a pool, a depthwise conv, a 3-channel stem), or half the products
        # or more read padding, which the border tiles then skip (schedule.peel's dead iterations:
        # a dilated conv on a small image). Else, with 16 (AVX2),
        # a padded copy first: there the border tiles' tests made 3x3 convs 1.4-2x slower than the
        # copy, and the copy made a max pool 6x and depthwise convs 3-7x slower than their
        # interior versions (docs/history.md)
        wide_regs = self.target.lanes >= 16      # 32 vector registers (AVX-512), else 16 (AVX2)
        pair_cap = MAX_ACCUMULATORS - 4 if wide_regs else self.accumulator_budget   # a paired tile's accumulators
        place = "interior" if self.pads and (wide_regs or self._pad_reads_each < COPY_READS
                                             or self._padding_share >= PADDING_SHARE) else "root"
        last = [d for d in self.last_options if d <= self.target.lanes]
        tile = [[1, 1, 1] for _ in shape]
        order = self.orders[0]
        others = [d for d in range(len(shape) - 1) if shape[d] > 1]
        pair = None
        if self.gemm_shaped:
            self._gemm_tile(tile)
        elif not others:
            wide = [d for d in self.last_options if d <= 4 * self.target.lanes]
            run = self.vector_run
            # whole blocks of an input's contiguous run: a tile ending inside one shares its lines
            if wide and run and max(wide) % run and run <= 4 * self.target.lanes:
                wide = [run * v for v in range(1, 4 * self.target.lanes // run + 1)]
            tile[-1][2] = max(wide) if wide else 1
        else:
            tile[-1][2] = max(last) if last else 1
            acc = self._vectors(tile[-1][2])

            # the vector axis's tiles of whole vectors, up to 4 (16 registers pair only those)
            whole = [d for d in self.last_options if d % self.target.lanes == 0 and d <= 4 * self.target.lanes]

            def fit(row) -> tuple:
                """(accumulators a tile along `row` may hold, the axis paired with it, or None)."""
                if wide_regs or not whole:
                    pair = self._broadcast_axis(row, (2, 3)) if wide_regs else None
                elif (pair := self._broadcast_axis(row, guarded=False)) is None and self._vectors(shape[-1]) == 1:
                    # 16 registers: blocks that divide, or 3 blocks of one vector that are the
                    # whole axis (24 channels in blocks of 8), each broadcast feeding 3 FMAs, as
                    # MLAS's FMA3 tile
                    three = self._broadcast_axis(row, (3,), guarded=False)
                    pair = three if three is not None and self._reuse(three) == 3 else None
                return (24, None) if pair is None else (pair_cap, pair)

            # register tile along the axis next to the vector axis (the output row, as in the
            # classic NCHW[x]c schedule), then widen along the largest other axis until enough
            # independent accumulators hide the FMA latency. With 32 vector registers, first two
            # blocks of an axis that the broadcast operand does not index (a conv's output
            # channel blocks), each broadcast feeding two FMAs, the pixels outside them
            # (reversed), up to 28 accumulators, then rows: MLAS's AVX-512 tile (docs/history.md)
            row = len(shape) - 2 if shape[-2] > 1 else max(others, key=lambda d: (shape[d], d))
            reads, padded = self._pad_reads if place == "interior" else (set(), set())
            if row in padded and (free := [d for d in others if d in reads and d not in padded]):
                # the border only along the row (a 1x7 conv): the tile runs down the columns instead,
                # so that no tile holds a border test, where it is as long there (docs/history.md)
                alt = max(free, key=lambda d: (shape[d], d))
                cap, pair = fit(alt)
                room = cap // (acc if pair is None else 2 * acc)
                if register_length(shape[alt], room) >= register_length(shape[row], room, True):
                    row = alt
            rest = sorted((d for d in others if d != row), key=lambda d: -shape[d])
            (cap, pair), enough = fit(row), 12
            if not (wide_regs or self._broadcast_read):
                # 16 registers and every FMA loading its input (a depthwise conv, a pool): up to
                # LOAD_ACCUMULATORS pixels of the row, two border tiles allowed (a row of 14 as 7 +
                # 7), never along axes that every operand reads (a channel block adds a weight
                # register, no reuse): MobileNetV2's depthwise convs 0.5-0.8x the time of 14 pixels
                # by rows or blocks, MobileNetV3's 5x5 ones at 14x14 0.54x the time of 14 whole
                cap = enough = LOAD_ACCUMULATORS
                rest, padded = [d for d in rest if d not in self._batch_axes], set()
            guarded, vectors = False, 0     # 16 registers: the row in tiles of what the accumulators leave, the last guarded
            # with no axis to pair but a broadcast read, a vector axis of 2 to 4 whole vectors (a
            # conv's single 16-channel block) is taken whole per broadcast in the 16-register tile
            # below (0.56x the time of 14 pixels by one vector on MobileNetV2's 32 -> 16 1x1 conv)
            whole_axis = pair is None and self._broadcast_read and self.out_shape[-1] in whole \
                and self._vectors(self.out_shape[-1]) > 1
            if (pair is not None or whole_axis) and not wide_regs:
                # 16 registers: 4 vectors of FMAs per broadcast (the vector axis's whole vectors,
                # then blocks of `pair`) by 3 pixels of the row, the last tile guarded: 12
                # accumulators, the weights read as FMA operands (MLAS's FMA3 conv tile: 0.61-0.84x
                # the time of 14 pixels by one vector on ResNet-50's convs; docs/history.md)
                tile[-1][2] = max(whole)
                acc = self._vectors(tile[-1][2])
                if pair is not None:
                    m = max(k for k in (4 // acc, 3 if self._reuse(pair) == 3 else 1, 2, 1)
                            if k * acc <= 4 and self._reuse(pair) % k == 0)
                    tile[pair][2], acc = m, acc * m
                    rest.remove(pair)
                order, cap, enough, guarded = "reversed", pair_cap, pair_cap, True
            elif pair is not None:
                m = 2 if self._pairs(pair, 2) else 3      # 3 blocks: by 3 (192 -> 48 at 28x28: 2x one by 14)
                tile[pair][2], acc, order = m, m * acc, "reversed"
                enough = cap
                rest.remove(pair)
            elif vectors := self._broadcast_vectors():
                # no such axis, but the broadcast operand does not index the vector axis either
                # (a Winograd GEMM's columns): up to 4 vectors of it per broadcast, then rows of
                # axes that not every operand reads (its 6x6 positions are a batch: no reuse)
                # (16 registers: by 3 rows, as a conv's; ResNet-50's Winograd GEMMs alone 0.66-0.95x
                # the time of 14 rows by one vector)
                tile[-1][2], acc, cap = vectors * self.target.lanes, vectors, pair_cap
                enough, guarded = cap, not wide_regs and row not in self._batch_axes
                rest = [d for d in rest if d not in self._batch_axes]
            for d in [row] + rest:
                if acc >= enough:
                    break
                tile[d][2] = (guarded_length(shape[d], acc, cap) if guarded and d == row
                              else register_length(shape[d], cap // acc, d in padded))
                acc *= tile[d][2]
            if vectors and self._batch_axes and self._batch_constant_bytes >= RESIDENT_BYTES // 2:
                # a batched GEMM (a Winograd GEMM's positions) whose weights per position outgrow
                # a core's share of L2: every row tile inside each column tile, as a GEMM's
                # (_gemm_tile), so that the column's panel stays in cache while the rows pass over
                # it rather than each row tile streaming the position's weights again (VGG's 512 x
                # 512 ones in AVX2 code: 0.77-0.80x the time in the model; with 256 x 256 or
                # less, where L2 holds them, 1.10-1.17x: docs/history.md); as many row tiles kept
                # outside as give each thread 4 outer iterations
                outer = math.prod(-(-e // t[2]) for d, (e, t) in enumerate(zip(shape, tile)) if d != row)
                split = -(-self._outer_tiles_needed // outer)
                tile[row][0] = -(-shape[row] // (tile[row][2] * split))
            if pair is not None and wide_regs and acc < enough:
                # a short row (7, 17, 35 or 8 wide: 7, 9, 7 or 8 pixels) leaves registers: 3 or 4
                # blocks of the broadcast axis, each broadcast feeding as many FMAs, where the
                # accumulators fit; 4 x 7 of them leave one register short for the 4 weight vectors
                # and the broadcast, and still beat 2 x 7 (the compiler reads one operand from L1:
                # docs/history.md)
                per = acc // tile[pair][2]
                if wider := self._widest_pair(pair, cap // per):
                    tile[pair][2], acc = wider, per * wider
            elif pair is not None and wide_regs and tile[row][2] == 14 and (wider := self._widest_pair(pair, 4)) \
                    and (row not in padded or shape[row] >= 56 or self._padding_share >= PADDING_SHARE):
                # an unpadded row (a 1x1 conv's), or a padded one of 56 or more pixels (a quarter
                # of its 7-pixel tiles hold a border): 4 blocks by 7 pixels rather than 2 by 14,
                # each broadcast feeding 4 FMAs (MLAS's 4 blocks); a padded row of 14, a border
                # test in both halves, lost, unless most reads are padding: then each half skips
                # the taps that read only padding for its pixels (docs/history.md); 3 blocks where
                # they divide the axis and 4 do not (9 blocks: 3 x 7, 1.6x the speed of 1 x 14)
                tile[pair][2], tile[row][2] = wider, 7
            if pair is not None and shape[pair] % tile[pair][2] and shape[row] % tile[row][2] and (whole := [
                    m for m in range(2, tile[pair][2]) if shape[pair] % m == 0 and self._pairs(pair, m)]):
                # a guarded row too (17 as 9 + 8): a guarded block tile beside it ran 1.17-1.33x
                # slower at 2 threads than 2 blocks (Inception's 7x1 convs of 8 and 10 blocks by 3),
                # so blocks that divide where some do (25 blocks by 3 beside 9 + 8 beat 1 x 17 1.6x)
                tile[pair][2] = max(whole)
        reduce = list(self._reduce_periods)
        blocked_gemm = self._block_gemm(tile, reduce) if self.gemm_shaped else None
        if blocked_gemm:
            tile, reduce = blocked_gemm
        # blocked where each weight vector feeds few pixels (4 blocks by 7, or 16 registers' 3
        # pixels; a 3x3 conv's 2 x 14 tile blocked ran 1.03-1.3x slower), and where no tile has a
        # border or every one has (a padded row in one tile: no interior to keep apart), the pad
        # then copied first: with a border test in the chunk's loops, a blocked 3x3 conv ran 1.2-2x
        # slower (docs/history.md)
        if pair is not None and (tile[pair][2] >= 4 or not wide_regs) \
                and (not self.pads or place == "root" or (row in padded and tile[row][2] >= shape[row])) \
                and (blocked := self._block_reduction(tile, row, copied=place == "root")):
            # a padded copy past a core's L2 is read back from L3: with 16 registers and one
            # thread each chunk copies its own window instead, in cache when its reduction reads
            # it, where that copies at most TILE_COPIES times as much (stride-2 3x3 convs of 32-128
            # channels at 56-256 pixels 0.79-0.97x the time; 6-17 times as much 0.99-1.14x; at 2
            # threads, the copy shared, 0.89-1.04x: docs/history.md)
            tile, reduce = blocked
            place = "tile" if self.pads and not wide_regs and self.target.threads == 1 \
                and self._pad_bytes > RESIDENT_BYTES and self._tile_pad_copies(tile, reduce) <= TILE_COPIES else "root"
        dec = {"pad": {p: place for p in self.pads}, "tile": tile,
               "reduce": reduce, "unroll": 64, "order": order}
        if self.epilogues:
            dec["epilogue"] = "fused"
        if self.parallel_orders:
            dec["parallel"] = PARALLEL_ORDERS[self._input_first_by_default if self.target.threads > 1
                                              else self._input_first_alone(dec["tile"])]
        if self.prefetched:
            # not in a blocked GEMM: a prefetch call in the chunk's loop kept GCC from holding the
            # accumulators in registers (each FMA loaded and stored its own: 0.6x the speed)
            dec["prefetch"] = 0 if blocked_gemm else self.prefetch_options[-1]
        return dec

    def _block_reduction(self, tile: list, row: int, copied: bool = False) -> tuple | None:
        """Cache blocking over the reduction, where the constant operand's panel that one register
        tile reads over the whole reduction reaches PANEL_BYTES (a 1x1 conv's 4 channel blocks with
        1024 or more input channels), or with 16 registers outgrows L1 (2 blocks of 16 output
        channels over more than 256 input channels: each weight vector feeds 3 pixels, not 7, so
        its reads from L2 cost more): (`tile` widened so that each chunk serves whole rows of
        register tiles while it is in L1: S2 the row, then up to TILE_ROWS rows, the local tile
        within BLOCKED_TILE_BYTES and 4 outer tiles per thread; the reduce decision that splits the
        outermost reduction axis into chunks whose panel fits PANEL_CHUNK, every other reduction
        axis inside them). Without blocking, every register tile reads the panel from L2 again: a
        1x1 conv with 1024 input channels ran 0.85-0.9x slower (docs/history.md). None: no
        blocking; so too where a chunk would serve one register tile (nothing to reuse), or where
        blocking would copy first a pad read in place (not `copied`: 16 registers copy it anyway)
        and the copy is over a quarter of the panel (its pass cost what the blocking saved: a
        stride-2 3x3 conv), or where the outermost axis's steps are small enough
        for two to a chunk but no divisor of their count groups them so (a prime count of channel
        blocks: 1040 channels in AVX-512, blocked one block at a time, ran 1.12x the time of whole)."""
        if not self.reduce_axes:
            return None
        panel = self._panel_bytes(tile)
        small = panel < PANEL_BYTES if self.target.lanes >= 16 else panel <= L1_BYTES
        if small or (self.pads and not copied and 4 * self._pad_bytes > panel):
            return None
        first, extent = self.reduce_axes[0]
        per = panel // extent                            # bytes of one step of the outermost axis
        chunk = max(d for d in divisors(extent) if d * per <= PANEL_CHUNK or d == 1)
        if chunk == 1 < extent and 2 * per <= PANEL_CHUNK:
            return None      # one small step a chunk (a prime count of blocks): the tile stored every step
        tiles = [-(-e // s3) for e, (_, _, s3) in zip(self.out_shape, tile)]
        new = [list(t) for t in tile]
        new[row][1] = tiles[row]
        rows = [d for d in range(len(new) - 1) if d != row and tiles[d] > 1 and new[d][2] == 1]
        if rows:
            d = max(rows, key=lambda d: (self.out_shape[d], d))
            floats = math.prod(s2 * s3 for _, s2, s3 in new)
            outer = math.prod(t // s2 for t, (_, s2, _) in zip(tiles, new))
            fits = [x for x in divisors(tiles[d]) if x <= TILE_ROWS and floats * x * 4 <= BLOCKED_TILE_BYTES
                    and outer // x >= self._outer_tiles_needed]
            new[d][1] = max(fits, default=1)
        if math.prod(s2 for _, s2, _ in new) < 2:
            return None
        return new, [chunk if r == first else e for r, e in self.reduce_axes]

    def _panel_bytes(self, tile: list) -> int:
        """Bytes of the constant operand's panel that one register tile of `tile` reads over the
        whole reduction."""
        red = dict(self.reduce_axes)
        return max([math.prod(s3 for a, (_, _, s3) in zip(self.local_axes, tile) if a in axes)
                    * math.prod(e for r, e in red.items() if r in axes) * 4
                    for buf, axes in self._reads if buf in self._constants], default=0)

    def _input_first_alone(self, tile: list) -> bool:
        """Whether `parallel: input` is the default at one thread, where it orders the outer tiles
        only: where the activation the reduction reads outgrows L2 (RESIDENT_BYTES), so that each
        sweep of it per block of output channels comes from L3 or memory; one register tile's
        weight panel outgrows L1 (L1_BYTES), so that the weights come from L2 in either order; and
        the weights, which each row of tiles then reads again, are a quarter of the activation or
        less. Where a condition failed, a 1x1 conv of ResNet-50 ran slower input-first in the
        model (docs/history.md)."""
        return (not self._shared_axes and self._reduction_input_bytes > RESIDENT_BYTES and self._panel_bytes(tile) > L1_BYTES
                and 16 * self._input_elements(True) <= self._reduction_input_bytes)

    def lighter(self, dec: dict) -> list:
        """Variants of the default `dec` that ask fewer registers of GCC, for a compile to take where
        the default's code spilled accumulators (compile_model's _unspilled), in order: its blocked
        chunk's 2-trip row loop taken one row at a time (GCC copied the tile's code per trip), then its
        row one pixel shorter (beside paired blocks 8 accumulators of 16 registers, not 12; a
        depthwise conv's 8 pixels as 7)."""
        if self.kind != "tiled" or self.target.lanes >= 16:     # 32 vector registers: the tile leaves room
            return []
        tile, out = dec["tile"], []
        inner = [d for d in range(len(tile) - 1) if tile[d][2] > 1]
        row = max(inner, key=lambda d: (tile[d][2], d), default=None)
        rows = [d for d in range(len(tile) - 1) if d != row and tile[d][1] == 2 and tile[d][2] == 1]
        if rows and dec.get("reduce") != list(self._reduce_periods):
            out.append({**dec, "tile": [[1, 1, 1] if d == rows[0] else list(t) for d, t in enumerate(tile)]})
        if row is not None and tile[row][2] >= 3:
            s1, s2, s3 = tile[row]
            e = self.out_shape[row]
            whole = s2 > 1 and s2 == -(-e // s3)            # the chunk holds the whole row (_block_reduction)
            short = [s1, -(-e // (s3 - 1)) if whole else s2, s3 - 1]
            out.append({**dec, "tile": [short if d == row else list(t) for d, t in enumerate(tile)]})
        return [d for d in out if self.valid_tile(d["tile"])]

    @cached_property
    def _pad_reads_each(self) -> float:
        """Reads of each padded element by the reduction: its iterations over the padded copies' size."""
        return math.prod(self.out_shape) * math.prod(e for _, e in self.reduce_axes) * 4 / self._pad_bytes

    @cached_property
    def _padding_share(self) -> float:
        """The share of the workload's products that read padding (Workload.live_flops: a conv's)."""
        flops = self.workload.flops
        return 1.0 - self.workload.live_flops / flops if flops else 0.0

    @cached_property
    def _pad_ops(self) -> dict:
        sch = Schedule(self.inputs, self.output)
        return {p: sch.stage(p).op for p in self.pads}

    @cached_property
    def _pad_axes(self) -> dict:
        """Each pad's (axis, extent) pairs, outermost first."""
        return {p: [(a.name, a.extent) for a in op.axes] for p, op in self._pad_ops.items()}

    @cached_property
    def _lane_pads(self) -> dict:
        """{pad: its innermost axis} of each pad whose innermost axis is read contiguously and never
        tested (a channel block or NHWC's channels): copied into a tile, a row of it is one vector select."""
        out = {}
        for p, op in self._pad_ops.items():
            body, last = op.body, op.axes[-1].name
            if (isinstance(body, Select) and last not in free_vars(body.cond) and isinstance(body.then, Load)
                    and body.then.indices[-1] == Var(last)):
                out[p] = last
        return out

    @cached_property
    def _pad_bytes(self) -> int:
        """Bytes of the padded copies of the inputs (what a pad at root writes and the reduction reads)."""
        return sum(4 * math.prod(e for _, e in axes) for axes in self._pad_axes.values())

    @cached_property
    def _input_reads(self) -> list:
        """(buffer, indices in the output's axes) of every read of a DAG input, through the stages
        between (a blocked layout's c // 16 and c % 16 where the output's axis is c)."""
        sch = Schedule(self.inputs, self.output)
        stages = {s.name: s.op for s in sch.stages}
        reads, seen = [], set()
        todo = [(self.output.name, {a: Var(a) for a in self.out_axes})]
        # simplified at each stage: composed unsimplified, the index math of a chain of reshapes and
        # slices grows with every view (80,000 characters through BAT's attention in timm's bat_resnext26ts)
        ranges = {a: (0, e - 1) for a, e in zip(self.out_axes, self.out_shape)}
        while todo:
            name, env = todo.pop()
            for n in walk(stages[name].body):
                if not isinstance(n, Load):
                    continue
                idx = [simplify(substitute(i, env), ranges, keep_mods=True) for i in n.indices]
                key = (n.buffer, tuple(idx))
                if key in seen:
                    continue
                seen.add(key)
                if n.buffer in stages and n.buffer != name:
                    todo.append((n.buffer, {a.name: i for a, i in zip(stages[n.buffer].axes, idx)}))
                else:
                    reads.append((n.buffer, idx))
        return reads

    @cached_property
    def vector_run(self) -> int | None:
        """Elements of an input that the innermost output axis reads contiguously, through the
        stages between (a blocked layout's c % 8: 8); None where every read is unbounded along it.
        A vector wider than that gathers its lanes one by one from several blocks."""
        last = self.out_axes[-1]
        runs = [idx[-1].b.value for _, idx in self._input_reads if idx and isinstance(idx[-1], FloorMod)
                and isinstance(idx[-1].b, Const) and last in free_vars(idx[-1].a)]
        return min(runs) if runs else None

    @cached_property
    def transposed(self) -> tuple | None:
        """(output axis position, tile lengths) where an input's contiguous dimension is indexed by
        one output axis a other than the vector's, which that read also uses, and the loops inside
        a touch more than GATHER_LINES of its lines before the next a reuses them (NCHW16c -> NCHW
        reads c % 16 while h and w run inside c): a tiled by one of those lengths (the block where
        the index is a % block, else 4, 8 or 16; the last tile guarded) just outside the vector loop,
        so that each line the vector's lanes gather is used whole before it leaves L1
        (docs/history.md). None where no read is transposed so."""
        axes, last = self.out_axes, self.out_axes[-1]
        for _, idx in self._input_reads:
            if not idx:
                continue
            inner = free_vars(idx[-1]) & set(axes)
            if len(inner) != 1 or last in inner or not any(last in free_vars(i) for i in idx[:-1]):
                continue
            (a,) = inner
            d = axes.index(a)
            e, i = self.out_shape[d], idx[-1]
            if e == 1 or math.prod(self.out_shape[d + 1:]) <= GATHER_LINES:
                continue        # the lines touched before the next a reuses them stay in L1
            if isinstance(i, FloorMod) and i.a == Var(a) and isinstance(i.b, Const) and 1 < i.b.value:
                return d, [min(i.b.value, e)]
            return d, [t for t in (4, 8) if t < e] + [min(e, 16)]
        return None

    @cached_property
    def _reduce_periods(self) -> tuple:
        """Per reduction axis, the shortest period at which a read through an inlined view turns over
        (the merged heads' channel c read as [c // 64, ..., c % 64]) where it divides the axis, else
        1: split there, the inner loop reads affinely (the simplifier drops the div and mod)."""
        views = self._views
        exprs = [self.anchor_op.body]
        for n in walk(self.anchor_op.body):
            if isinstance(n, Load) and n.buffer in views:
                op = views[n.buffer]
                exprs.append(substitute(op.body, {a.name: i for a, i in zip(op.axes, n.indices)}))
        periods = [{n.b.value for e in exprs for n in walk(e) if isinstance(n, (FloorDiv, FloorMod))
                    and isinstance(n.b, Const) and name in free_vars(n.a) and 1 < n.b.value < extent
                    and extent % n.b.value == 0} for name, extent in self.reduce_axes]
        return tuple(min(c) if c else 1 for c in periods)

    @cached_property
    def _pad_reads(self) -> tuple:
        """(output axis positions that index a dimension a pad producer tests, those that index one
        it pads): a 1x7 conv tests rows and columns but pads its columns only, so its rows have no
        border; a depthwise conv's channels it does not test."""
        sch = Schedule(self.inputs, self.output)
        reads, padded = set(), set()
        for n in walk(self.anchor_op.body):
            if not (isinstance(n, Load) and n.buffer in self.pads):
                continue
            op = sch.stage(n.buffer).op
            tested = frozenset().union(*(free_vars(e.cond) for e in walk(op.body) if isinstance(e, Select)))
            src = op.inputs[0].shape if len(op.inputs) == 1 and len(op.inputs[0].shape) == len(op.axes) else None
            for d, idx in enumerate(n.indices):
                if op.axes[d].name in tested:
                    reads |= free_vars(idx)
                    if src is None or op.axes[d].extent != src[d]:
                        padded |= free_vars(idx)
        pos = lambda names: {d for d, a in enumerate(self.local_axes) if a in names}   # noqa: E731
        return pos(reads), pos(padded)

    def _tile_pad_copies(self, tile: list, reduce: list) -> float:
        """What pads copied per chunk ("tile": at the reduction's outermost chunk loop) copy in all,
        over what they copy once at root: the chunks along axes the window does not follow (output
        channel blocks) copy it again, and neighbouring chunks share its halo."""
        extents = [s2 * s3 for _, s2, s3 in tile]
        loops = math.prod(-(-e // c) for e, c in zip(self.out_shape, extents))
        red = self.reduce_axes
        if red:
            loops *= -(-red[0][1] // reduce[0])
        ranges = {a: (0, c - 1) for a, c in zip(self.local_axes, extents)}
        ranges.update({r: (0, (reduce[0] if i == 0 else e) - 1) for i, (r, e) in enumerate(red)})
        copied = once = 0
        for n in walk(self.anchor_op.body):
            if isinstance(n, Load) and n.buffer in self.pads:
                window = [bounds(i, ranges) for i in n.indices]
                full = [e for _, e in self._pad_axes[n.buffer]]
                copied += loops * math.prod(min(b[1] - b[0] + 1, e) if b else e for b, e in zip(window, full))
                once += math.prod(full)
        return copied / once if once else math.inf

    def _broadcast_axis(self, row: int, lengths: tuple = (2,), guarded: bool = True) -> int | None:
        """An output axis other than `row` and the vector axis along which an operand read without
        the vector axis (one element broadcast to all lanes) keeps its element while another
        operand moves, over runs that a register tile of one of `lengths` fits (`_pairs`; 3 only
        where the run is the whole axis: an ungrouped conv's 3 channel blocks); else None."""
        return next((d for d in self._broadcast_axes if d != row and any(
            self._pairs(d, m, guarded) and (m == 2 or self._reuse(d) == self.out_shape[d]) for m in lengths)), None)

    @cached_property
    def _broadcast_axes(self) -> list:
        """Output axes, other than the first and the vector axis, that some read indexes (an anchor's)."""
        if not self.anchor:
            return []
        names, loads = self.local_axes, [v for _, v in self._reads]
        return [d for d in range(1, len(names) - 1) if any(names[d] in v for v in loads)]

    def _pairs(self, d: int, m: int, guarded: bool = True) -> bool:
        """Whether a register tile of `m` along broadcast axis `d` keeps one broadcast element: it
        divides the element's run (`_reuse`), or (`guarded`) the run is the whole axis (an ungrouped
        conv's output channel blocks) and holds two whole tiles, the last tile guarded and peeled
        off by lowering (3 blocks by 2, half a tile wasted, ran 0.8-0.9x as fast as one block by a
        row). The 16-register default pairs only blocks that divide: guarded, RegNetX-400MF's 25
        blocks of 16 channels by 2 ran 1.15x slower in AVX2 code than one block by 4 pixels."""
        e = self.out_shape[d]
        return 1 < m <= e and (self._reuse(d) % m == 0 or (guarded and self._reuse(d) == e and e >= 2 * m))

    def _widest_pair(self, d: int, room: int) -> int | None:
        """Of 4 and 3, the length along broadcast axis `d` that `_pairs` allows within `room`
        accumulator multiples: one that divides the axis, else the one of fewest tiles (12 channel
        blocks by 4, 9 by 3, 25 by 4 with a last tile of 1, 10 by 4); None where neither fits."""
        fits = [m for m in (4, 3) if m <= room and self._pairs(d, m)]
        e = self.out_shape[d]
        return min(fits, key=lambda m: (e % m != 0, -(-e // m))) if fits else None

    def _reuse(self, d: int) -> int:
        return self._reuses[d]

    @cached_property
    def _reuses(self) -> list:
        """Per output axis, the aligned steps over which some broadcast read (one without the vector
        axis) keeps its element: the axis's extent where it does not index that read, m where it
        does only as d // m (a grouped conv's output channel blocks: m blocks per group), else 1."""
        last = self.local_axes[-1]
        broadcast = [n for n in walk(self.anchor_op.body)
                     if isinstance(n, Load) and last not in frozenset().union(*(free_vars(i) for i in n.indices))]

        def period(e, name: str) -> int:
            if isinstance(e, FloorDiv) and e.a == Var(name) and isinstance(e.b, Const):
                return e.b.value
            if e == Var(name):
                return 1
            inner = [period(c, name) for c in children(e) if name in free_vars(c)]
            return math.gcd(*inner) if inner else 0

        out = []
        for name, extent in zip(self.local_axes, self.out_shape):
            best = 1
            for n in broadcast:
                m = math.gcd(*(period(i, name) for i in n.indices))   # 0: the read does not use the axis
                best = max(best, math.gcd(m, extent) if m else extent)
            out.append(best)
        return out

    def _broadcast_vectors(self) -> int:
        """The whole vectors (up to 4) of the vector axis that each broadcast element feeds, where an
        operand read without the vector axis (the broadcast one) and another that reads it both
        exist; else 0 (docs/history.md: a Winograd GEMM's default). With 16 registers only where
        there are batch axes (a Winograd GEMM's positions): an NHWC 1x1 conv's ran 1.45x slower."""
        if self.target.lanes < 16 and not self._batch_axes:
            return 0
        if not (self._broadcast_read and any(self.local_axes[-1] in v for _, v in self._reads)):
            return 0
        lanes, e = self.target.lanes, self.out_shape[-1]
        return max([v for v in (2, 3, 4) if e % (v * lanes) == 0], default=0)

    @cached_property
    def _reads(self) -> list:
        """(buffer, the axes its indices use) for each read in the reduction's body."""
        return [(n.buffer, frozenset().union(*(free_vars(i) for i in n.indices)))
                for n in walk(self.anchor_op.body) if isinstance(n, Load)]

    @cached_property
    def _lane_reductions(self) -> list:
        """Reduction axes shorter than a vector in the same index of a read as the vector axis:
        unrolled, so that the lanes' permutation of that read is a constant (a grouped conv's block
        of whole groups: one vpermilps by an immediate, not a permutation computed in a register;
        docs/history.md)."""
        last = self.local_axes[-1]
        return [r for r, e in self.reduce_axes
                if e <= self.target.lanes and any(last in free_vars(i) and r in free_vars(i)
                       for n in walk(self.anchor_op.body) if isinstance(n, Load) for i in n.indices)]

    @cached_property
    def _broadcast_read(self) -> bool:
        """Whether the reduction reads an operand without the vector axis (one element to all lanes)."""
        return any(self.local_axes[-1] not in v for _, v in self._reads)

    @cached_property
    def _batch_axes(self) -> set:
        """Output axis positions that every operand of the reduction reads."""
        return {d for d, a in enumerate(self.local_axes) if all(a in v for _, v in self._reads)}

    def _gemm_tile(self, tile: list) -> None:
        """The default tile of a GEMM-shaped output (_gemm_rows), with every row tile inside each
        column tile, so that the constant operand's panel for those columns stays in cache while
        all rows pass over it; or, where _columns_inside holds, every column tile inside each row
        tile, so that the activation is read once and the weights from L2."""
        cols, r = self._gemm_rows()
        tile[-1][2] = cols
        if self._columns_inside:
            tile[-1][0] = -(-self.out_shape[-1] // cols)
            tile[-2] = [1, 1, r]
        else:
            tile[-2] = [-(-self.out_shape[-2] // r), 1, r]

    def _block_gemm(self, tile: list, reduce: list) -> tuple | None:
        """K-blocking of a GEMM's default where one column tile's panel of the constant operand over
        the whole reduction reaches GEMM_PANEL_BYTES, so that each row tile passing over it would
        read it from L3 or memory again: the row tiles of a local tile (within BLOCKED_TILE_BYTES,
        4 outer tiles per thread) pass over each chunk of the panel (within GEMM_CHUNK_BYTES; one
        period of a view where the reduction has one) while L2 holds it, their accumulators stored between
        chunks (ALBERT's 128 x 16384 -> 4096 FFN: 0.61x the time; where the panel fits in L2, as
        BERT's 3072 -> 768, no gain: docs/history.md). Where the activation outgrows every core's
        L2 (WIDE_ACTIVATION_BYTES), a 2-D one, each pass over it serves up to WIDE_TILES column
        tiles: the local tile holds them and every row (within MAX_TILE_FLOATS), so that the
        weights too are read once (128 x 4096 -> 4096: 0.94x the time, 0.88x as AVX2 code; with
        row blocks, which read the weights again, 1.07-1.2x: docs/history.md); where too few
        column tiles are left for the threads and the activation is read through a view (packed
        rows, in_heads: unblocked, its reads would stride across blocks), one column tile and row
        blocks. None where no such chunk or no local tile of two register tiles (through a view,
        one) exists."""
        panel = self._panel_bytes(tile)
        wide = panel > 0 and len(tile) == 2 and self._reduction_input_bytes >= WIDE_ACTIVATION_BYTES
        if panel < GEMM_PANEL_BYTES and not wide or self._columns_inside or len(self.reduce_axes) != 1:
            return None
        (_, extent), period = self.reduce_axes[0], reduce[0]
        d, (_, _, r), cols = len(tile) - 2, tile[-2], tile[-1][2]
        tiles, ctiles = -(-self.out_shape[d] // r), -(-self.out_shape[-1] // cols)
        outer = math.prod(-(-e // t[2]) for e, t in zip(self.out_shape, tile)) // tiles
        for w in sorted((x for x in divisors(ctiles) if x <= (WIDE_TILES if wide else 1)
                         and (x > 1 or panel >= GEMM_PANEL_BYTES or period > 1)), reverse=True):
            # a period's multiple would read across a turn of the view inside the chunk (c // 64, c % 64)
            chunks = [c for c in ([period] if period > 1 else divisors(extent))
                      if c * panel // extent * w <= GEMM_CHUNK_BYTES and c < extent]
            limit = MAX_TILE_FLOATS * 4 if w > 1 else BLOCKED_TILE_BYTES
            # several column tiles take every row, so that the weights are read once
            fits = [x for x in divisors(tiles) if x * r * w * cols * 4 <= limit and (x == tiles or w == 1)
                    and outer // w * (tiles // x) >= self._outer_tiles_needed]
            if chunks and fits and max(fits) * w >= (1 if period > 1 else 2):
                break
        else:
            return None
        new = [list(t) for t in tile]
        new[d] = [tiles // max(fits), max(fits), r]
        if w > 1:
            new[-1] = [1, w, cols]
        return new, [max(chunks)]

    @property
    def _outer_tiles_needed(self) -> int:
        """Outer tiles a default that moves tiles inward keeps outside: 4 per thread where there
        are several, so that the fused parallel loop still feeds them all."""
        return 4 * self.target.threads if self.target.threads > 1 else 1

    @cached_property
    def _batch_constant_bytes(self) -> int:
        """Bytes of the constants per step of the batch axes (a Winograd GEMM's weights at one of
        its positions)."""
        batch = math.prod(self.out_shape[d] for d in self._batch_axes)
        return 4 * self._input_elements(True) // max(1, batch)

    @cached_property
    def _columns_inside(self) -> bool:
        """Whether the constants (weights and bias) fit RESIDENT_BYTES, the activation is read from
        memory (STREAMED_BYTES), and the reduction is long (LONG_REDUCTION): rows outside, the
        activation would be read from memory again for each column tile (Swin2SR's 180 x 180
        dense over 50,176 tokens). Over a short reduction (32, 64), or an activation a cache holds
        (MobileViT's 784 tokens; the 4.8 MB of ConvNeXt's 3136 x 384 at 1 thread), rows outside ran as
        fast or faster (docs/history.md). Over two activations (attention's scores), where the output
        is written to memory (STREAMED_BYTES) from a short reduction whose column operand L2 holds:
        the columns inside, so that the output is written row after row, not in column strips 4
        KiB apart (0.63-0.95x the time: docs/history.md)."""
        reduction = math.prod(e for _, e in self.reduce_axes)
        if not self._constants:
            return reduction < LONG_REDUCTION and 4 * reduction * self.out_shape[-1] <= RESIDENT_BYTES \
                and 4 * math.prod(self.out_shape) > STREAMED_BYTES
        return 4 * self._input_elements(True) <= RESIDENT_BYTES \
            and 4 * self._input_elements(False) > STREAMED_BYTES and reduction >= LONG_REDUCTION

    def _gemm_rows(self) -> tuple:
        """(columns, rows) of the default GEMM register tile ([batch,] rows, cols: dense,
        batch_matmul): up to 3 vectors of columns by as many rows as the accumulator budget holds.
        Columns that no multiple of the vector up to 3 divides (Whisper's 1500, which had 60 as 7
        vectors of 8 lanes and 4 lanes, by one row) and rows with no divisor near the register
        budget (ViT's 197) get 3 vectors, or the budget's rows, with a guarded last tile, which
        lowering peels off. (Two vectors by 6 rows, the BLAS micro-kernel's shape, ran faster alone
        but not inside BERT: docs/history.md.)"""
        lanes, rows = self.target.lanes, self.out_shape[-2]
        wide = [d for d in self.last_options if d % lanes == 0 and d <= 3 * lanes]
        guarded = [w for w in self._guarded_columns if w == 3 * lanes]
        # columns with no divisor a vector wide (37 classes, 17 keypoints): whole vectors, the last
        # tile guarded, rather than a tile of a few columns (one column at a time for a prime count)
        narrow = self._guarded_columns if max(self.last_options) < lanes else []
        cols = max(wide or guarded or narrow or self.last_options)
        fit = max(1, self.accumulator_budget // max(1, self._vectors(cols)))
        # no more rows than an L1 set holds where the rows' reads fall in one set (a row stride of
        # 4 KiB: a 1024-long reduction); 16 such rows ran 1.7x slower than 8 (docs/history.md)
        fit = max(k for k in range(1, fit + 1) if self._rows_per_set(k) <= L1_SET_ROWS)
        r = max(x for x in divisors(rows) if x <= fit)
        if 2 * r <= fit < rows:
            r = fit
        return cols, r

    def _rows_per_set(self, rows: int) -> int:
        """The most of `rows` rows of the broadcast operand (_row_stride) whose first reads share
        an L1 set; 1 where the stride is unknown."""
        stride = self._row_stride
        if not stride:
            return 1
        sets = [(k * stride // (4 * LINE_FLOATS)) % L1_SETS for k in range(rows)]
        return max(sets.count(x) for x in sets)

    @cached_property
    def _row_stride(self) -> int | None:
        """Bytes between consecutive rows of a GEMM's broadcast operand (the read without the vector
        axis that moves with the rows), or None where no read is such, or its index is not affine."""
        row, col = Var(self.local_axes[-2]), self.local_axes[-1]
        shapes = {t.name: t.shape for t in self.anchor_op.inputs}
        for n in walk(self.anchor_op.body):
            if not isinstance(n, Load) or n.buffer not in shapes:
                continue
            used = frozenset().union(*(free_vars(i) for i in n.indices))
            if col in used or row.name not in used:
                continue
            stride, inner = 0, 1
            for i, e in zip(reversed(n.indices), reversed(shapes[n.buffer])):
                ln = linear(simplify(i))
                if ln is None or any(row.name in free_vars(t) for t in ln[0] if t != row):
                    return None
                stride, inner = stride + ln[0].get(row, 0) * inner, inner * e
            return 4 * stride
        return None

    # ------------------------------------------------------------ decisions -> steps
    def steps(self, dec: dict) -> list:
        if self.kind == "injective":
            return self._injective_steps(dec)
        if self.kind == "table":
            return self._table_steps(dec)
        steps = []
        for p in self.pads:
            if dec["pad"][p] in ("inline", "interior"):
                steps.append(["compute_inline", p])
        for s in self.consumers + self.others:
            steps.append(["compute_inline", s])
        apart = dec.get("epilogue") == "apart"      # points logged before the decision existed: fused
        out, local = self.output.name, self.reduction_stage(dec)
        if local != self.anchor:
            steps.append(["cache_write", self.anchor])
            out, out_axes = self.anchor, [f"{a}_" for a in self.local_axes]   # the tiled stage
        else:
            out_axes = self.out_axes
        tile = dec["tile"]
        for ax, (s1, s2, s3) in zip(out_axes, tile):
            steps.append(["split", out, ax, [s1, s2 * s3]])
        outer = [f"{a}.0" for a in out_axes]       # points logged before `parallel` was a decision: axes
        if dec.get("parallel") == "input":
            outer = [outer[d] for d in self._input_first]
        order = outer + [f"{a}.{lvl}" for lvl in (1, 2) for a in out_axes]
        steps.append(["reorder", out, order])
        steps.append(["compute_at", local, out, f"{out_axes[-1]}.1"])
        for ax, (_, _, s3) in zip(self.local_axes, tile):
            steps.append(["split", local, ax, [s3]])
        for (ax, _), r1 in zip(self.reduce_axes, dec["reduce"]):
            steps.append(["split", local, ax, [r1]])
        red = [r for r, _ in self.reduce_axes]
        unrolled = self.local_axes[:-1]        # points logged before `order` was a decision: axes
        if dec.get("order") == "reversed":
            unrolled = unrolled[::-1]
        steps.append(["reorder", local, [f"{r}.0" for r in red] + [f"{a}.0" for a in self.local_axes]
                      + [f"{r}.1" for r in red] + [f"{a}.1" for a in unrolled + self.local_axes[-1:]]])
        first = f"{red[0]}.0" if red else f"{self.local_axes[0]}.0"     # the reduction's outermost loop
        steps += [["compute_at", p, local, first] for p in self.pads if dec["pad"][p] == "tile"]
        # left to the register-tile unroll, a tile's pad was hundreds of scalar selects, which GCC
        # compiled with its indices spilled (a 3x3 conv 1.6x MetaSchedule's time: docs/history.md)
        steps += [["annotate", p, ax, "vectorize"] for p, ax in self._lane_pads.items() if dec["pad"][p] == "tile"]
        if any(dec["pad"][p] == "interior" for p in self.pads):
            steps.append(["pragma", local, first, "unswitch", 1])
        if tile[-1][2] % 4 == 0:
            steps.append(["annotate", local, f"{self.local_axes[-1]}.1", "vectorize"])
        elif tile[-1][2] > 1:
            steps.append(["annotate", local, f"{self.local_axes[-1]}.1", "unroll"])
        for ax, (_, _, s3) in zip(self.local_axes[:-1], tile[:-1]):
            if s3 > 1:
                steps.append(["annotate", local, f"{ax}.1", "unroll"])
        steps += [["annotate", local, f"{r}.{k}", "unroll"] for r in self._lane_reductions for k in (0, 1)]
        if dec["unroll"]:
            steps.append(["pragma", local, f"{red[0]}.0" if red else f"{self.local_axes[0]}.0",
                          "auto_unroll_max_step", dec["unroll"]])
        t_last = tile[-1][1] * tile[-1][2]
        if t_last % 4 == 0:
            steps.append(["annotate", out, f"{out_axes[-1]}.2", "vectorize"])
        if self.target.threads > 1:
            steps.append(["fuse", out, outer])
            steps.append(["annotate", out, "@".join(outer), "parallel"])
        steps += self._root_pad_steps(dec)
        if dec.get("prefetch"):     # points logged before the decision existed: none
            steps += [["prefetch", local, t] for t in self.prefetched]
        if dec.get("prefetch") == 2:
            read = [t for p, t in self._activations if p is None or dec["pad"][p] in ("inline", "interior")]
            steps += [["prefetch", local, t, "tile"] for t in dict.fromkeys(read)]
        if apart:                   # the epilogue's own loop nest, as the injective sketch writes it
            steps += self._injective_steps({"vec": max(self.injective_vecs), "unroll": 1}, inline=False)
        return steps

    def _table_steps(self, dec: dict) -> list:
        """The output's axes that map to table axes split by their period, the innermost by
        `vec`; the anchor computes each such tile (into a local accumulator when it is the output
        itself and `acc` says so) with its table axes and the reduction unrolled around the vector."""
        steps = [["compute_inline", p] for p in self.pads if dec["pad"][p] == "inline"]
        steps += [["compute_inline", s] for s in self.consumers + self.others]
        vec = dec["vec"]
        out, anchor = self.output.name, self.anchor
        axes = self.out_axes
        if out == anchor and dec["acc"] == "local":        # `acc` is a decision exactly when out == anchor
            steps.append(["cache_write", anchor])
            anchor, axes = f"{anchor}.local", [f"{a}_" for a in self.local_axes]
        outer, inner = [], []            # the output's loops outside and inside the anchor's tile
        table, rest = [], []             # the anchor's axes that pick matrix entries, and the others
        blocks = []                      # loops outside the tiles that `blocks: inside` moves inside them
        for a, ax in zip(self.local_axes[:-1], axes[:-1]):
            (table if a in self.table else rest).append(a)
            period = self.table.get(a)
            if period:
                steps.append(["split", out, ax, [period]])
                outer.append(f"{ax}.0")
                inner.append(f"{ax}.1")
            elif period == 0:
                inner.append(ax)
            elif a in self.block_axes and dec.get("blocks", BLOCK_PLACES[0]) == "inside":
                blocks.append(ax)
            else:
                outer.append(ax)
        outer += blocks
        last = axes[-1]
        steps.append(["split", out, last, [vec]])
        outer.append(f"{last}.0")
        red = [r for r, _ in self.reduce_axes]
        if out == anchor:            # accumulated in place
            steps.append(["reorder", out, outer + inner + red + [f"{last}.1"]])
            unrolled = [(out, ax) for ax in inner + red]
        else:                        # the output stage is tiled; the anchor computes each tile
            steps.append(["reorder", out, outer + inner + [f"{last}.1"]])
            steps.append(["compute_at", anchor, out, outer[-1]])
            steps.append(["reorder", anchor, rest + table + red + [self.local_axes[-1]]])   # rest: extent 1 here
            unrolled = [(out, ax) for ax in inner] + [(anchor, a) for a in table + red]
            if vec % 4 == 0:
                steps.append(["annotate", anchor, self.local_axes[-1], "vectorize"])
        steps += [["annotate", st, ax, "unroll"] for st, ax in unrolled]
        if vec % 4 == 0:
            steps.append(["annotate", out, f"{last}.1", "vectorize"])
        spread = outer[:-1]          # the anchor is computed at the innermost outer loop: not fused
        if self.target.threads > 1 and spread:
            if len(spread) > 1:
                steps.append(["fuse", out, spread])
            steps.append(["annotate", out, "@".join(spread), "parallel"])
        return steps + self._root_pad_steps(dec)

    def _injective_steps(self, dec: dict, inline: bool = True) -> list:
        steps = [["compute_inline", s] for s in self.pads + self.others] if inline else []
        out = self.output.name
        axes = list(self.out_axes)
        vec, tile = dec["vec"], dec.get("transpose", 1)
        steps.append(["split", out, axes[-1], [vec]])
        inner = f"{axes[-1]}.1"
        outer = axes[:-1] + [f"{axes[-1]}.0"]
        if tile > 1:                 # the transposed axis's tile just outside the vector loop
            a = axes[self.transposed[0]]
            steps.append(["split", out, a, [tile]])
            outer = [f"{a}.0" if x == a else x for x in outer]
            steps.append(["reorder", out, outer + [f"{a}.1", inner]])
        if vec % 4 == 0 or (vec == self.out_shape[-1] and vector_split(vec, self.target.lanes)[0] > 0):
            steps.append(["annotate", out, inner, "vectorize"])
        elif dec["unroll"] and vec > 1:
            steps.append(["annotate", out, inner, "unroll"])
        if self.target.threads > 1 and len(outer) > 1:
            sizes = [*self.out_shape[:-1], -(-self.out_shape[-1] // vec)]
            if tile > 1:
                sizes[self.transposed[0]] = -(-sizes[self.transposed[0]] // tile)
            steps += self._spread(out, outer, sizes, self._concat_axes)
        return steps

    @cached_property
    def _concat_axes(self) -> frozenset:
        """The output axes along which the output's formula is a concat: a select between two reads
        on a test of that axis alone (schedule.peel.partition_selects cuts a serial loop there)."""
        found = set()
        for n in walk(self.output.op.body):
            if (ln := concat_test(n)) is not None:
                axes = [t.name for t in ln[0] if isinstance(t, Var) and t.name in self.out_axes]
                if len(axes) == 1 and ln[0][Var(axes[0])] == 1:
                    found.add(axes[0])
        return frozenset(found)

    def _spread(self, stage: str, loops: list, sizes: list, serial: frozenset = frozenset()) -> list:
        """Steps that run `stage`'s `loops` (outermost first, `sizes` iterations each) across the
        threads: fused until they give each thread PARALLEL_GRAIN iterations; those inside stay
        loops, with affine indices (not one vector's div and mod per iteration). A loop in `serial`
        (a concat's axis, cut into a loop per input) stays outside the fusion where the loops
        around it already give every thread an iteration."""
        k = next((k for k in range(1, len(loops)) if math.prod(sizes[:k]) >= PARALLEL_GRAIN * self.target.threads
                  or loops[k] in serial and math.prod(sizes[:k]) >= self.target.threads), len(loops))
        return ([["fuse", stage, loops[:k]]] if k > 1 else []) + [["annotate", stage, "@".join(loops[:k]), "parallel"]]

    def _root_pad_steps(self, dec: dict) -> list:
        """A pad copied first (`root`) runs across the threads too, its innermost loop (a
        channel block) whole: a serial copy before the parallel loop was what kept 2-thread AVX2
        3x3 convs from scaling (docs/history.md)."""
        steps = []
        for p in self.pads:
            outer = self._pad_axes[p][:-1]
            if self.target.threads > 1 and dec["pad"][p] == "root" and outer:
                names, sizes = zip(*outer)
                steps += self._spread(p, list(names), list(sizes))
        return steps
