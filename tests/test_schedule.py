"""Schedule primitives, their errors, replay determinism, and the simplifier they rely on."""
import itertools
import math
import json
import random
import re

import numpy as np
import pytest
from conftest import TARGET1, check_schedules
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tuner.codegen.c import generate_c
from tuner.ops import make, parse_spec
from tuner.schedule.lower import lower
from tuner.schedule.schedule import Schedule, ScheduleError, replay
from tuner.space.mutation import mutate
from tuner.schedule import ir
from tuner.schedule.ir import vector_split
from tuner.space.sketch import (COPY_READS, LOAD_ACCUMULATORS, PAD_PLACES, RESIDENT_BYTES, TILE_COPIES, SearchSpace,
                                 guarded_length)
from tuner.target import host_isa, parse_target
from tuner.task import Task
from tuner.te.expr import Cmp, Const, FloorDiv, FloorMod, Select, Var, coefficient, simplify, walk

CONV = make("conv2d", dict(C=16, H=6, W=6, K=16, R=3, S=3, pad=1), "NCHW16c")


def _sched(steps):
    ins, out = CONV.build()
    return replay(ins, out, steps)


@pytest.mark.parametrize("steps, message", [
    ([["split", "conv", "nope", [2]]], r"step 0 .*'nope' is not a loop of conv"),
    ([["split", "conv", "ow", [0]]], r"step 0 .*positive integers"),
    ([["fuse", "conv", ["n", "oh"]]], r"consecutive"),
    ([["fuse", "conv", ["kb", "rcc"]]], r"reduction loop with a spatial loop"),
    ([["annotate", "conv", "rh", "parallel"]], r"cannot parallelise reduction loop rh"),
    ([["annotate", "conv", "oh", "sparkle"]], r"unknown annotation"),
    ([["compute_inline", "conv"]], r"output stage cannot be inlined"),
    ([["reorder", "conv", ["n"]]], r"every loop"),
    ([["split", "conv", "ow", [2]], ["cache_write", "conv"]], r"step 1 .*before any other step"),
    ([["teleport", "conv"]], r"unknown primitive"),
    ([["compute_at", "conv_pad", "conv", "zz"]], r"'zz' is not a loop"),
    ([["compute_at", "conv_pad", "conv", "ow"], ["split", "conv", "ow", [2]]], r"step 1 .*conv_pad is computed at"),
    ([["compute_at", "conv_pad", "conv", "oh"], ["fuse", "conv", ["oh", "ow"]]], r"step 1 .*split or fuse that loop"),
])
def test_illegal_steps_name_the_step_and_reason(steps, message):
    with pytest.raises(ScheduleError, match=message):
        _sched(steps)


def test_compute_at_a_stage_that_is_not_the_reader_is_rejected_at_lowering():
    w = make("conv2d", dict(C=16, H=6, W=6, K=16, R=3, S=3, pad=1, relu=1), "NCHW16c")
    ins, out = w.build()
    sch = replay(ins, out, [["compute_at", "conv_pad", "relu", "relu_i2"]])
    with pytest.raises(ScheduleError, match="read by conv"):
        lower(sch)


def test_replay_gives_identical_code():
    steps = [["cache_write", "conv"], ["split", "conv", "ow_", [3]],
             ["compute_at", "conv.local", "conv", "ow_.0"], ["annotate", "conv.local", "kb", "vectorize"]]
    a = generate_c(lower(_sched(steps)))[0]
    b = generate_c(lower(_sched([list(s) for s in steps])))[0]
    assert a == b


def test_non_divisible_splits_are_guarded_and_correct():
    steps = [["split", "conv", "ow", [4]], ["split", "conv", "rcb", [5]], ["split", "conv", "oh", [4, 3]]]
    src = generate_c(lower(_sched(steps)))[0]
    assert "if (" in src
    check_schedules([(CONV, steps)])


def test_a_tile_that_does_not_divide_its_axis_runs_its_full_tiles_without_bounds_checks():
    """Lowering peels a guarded loop: the iterations whose checks always hold run in a loop without
    them, the last tile keeps them, and the code still computes the reference."""
    from tuner.schedule import ir
    wl = make("dense", dict(N=13, C=16, K=16, bias=1), "OI16o")
    space = SearchSpace(wl, parse_target("cpu -isa=avx2 -threads=1", check_host=False))
    dec = space.default()
    dec["tile"][-2] = [3, 1, 6]                       # rows 0-5, 6-11 in full; 12 alone
    func = lower(space.schedule(space.steps(dec)))
    rows = [s for s in ir.stmts(func.body) if isinstance(s, ir.For) and s.var.endswith("i0_1")]
    assert [r.extent for r in rows] == [2]            # the full tiles: one loop of 2
    assert not [s for s in ir.stmts(rows[0]) if isinstance(s, ir.IfThen)]
    assert [s for s in ir.stmts(func.body) if isinstance(s, ir.IfThen)]     # the last tile's checks
    check_schedules([(wl, space.steps(dec))], TARGET1)


@pytest.mark.parametrize("kind", ["unroll", "vectorize"])
@given(st.integers(1, 40), st.integers(1, 9), st.integers(1, 3), st.sampled_from(["<", "<="]), st.integers(0, 8))
@settings(max_examples=80, deadline=None)
def test_peeling_keeps_every_store_of_a_guarded_loop_nest(kind, extent, factor, rows, op, cap):
    """Over every extent, split factor, outer row count, comparison and second guard, a peeled nest
    stores exactly the elements, with exactly the values, that the guarded nest stores (run by a
    small interpreter of the IR); the outer row shifts the bound, so remainders of several
    iterations occur. A vectorised inner loop is also cut short where its guard fails for every
    row, so its remainder runs fewer lanes."""
    from tuner.schedule import ir
    from tuner.schedule.peel import peel_guards
    from tuner.te.expr import And, Cmp
    outer = -(-extent // factor)
    idx = Var("o") * Const(factor) + Var("i")
    bound = Cmp(op, idx + Var("j"), Const(extent if op == "<" else extent - 1))
    cond = And(bound, Cmp("<", Var("o"), Const(cap))) if cap else bound
    store = ir.Store("y", (Var("j"), idx), idx * Const(2) + Var("j"))
    body = ir.For("j", rows, ir.For("o", outer, ir.For("i", factor, ir.IfThen(cond, store), kind)))
    func = ir.Func("f", [], [], body, {})

    want = _run_ir(func.body, {}, {})
    assert len(want) == sum(min(extent - j, cap * factor if cap else extent) for j in range(rows) if extent > j)
    peeled = peel_guards(func)
    assert _run_ir(peeled.body, {}, {}) == want
    loops = [s for s in ir.stmts(peeled.body) if isinstance(s, ir.For) and s.var == "o"]
    assert len(loops) <= 2          # the main loop and at most one remainder


@given(st.integers(1, 40), st.integers(1, 9), st.integers(1, 3), st.sampled_from(["<", "<="]), st.integers(0, 8))
@settings(max_examples=80, deadline=None)
def test_a_guarded_tile_axis_fused_into_a_parallel_loop_stores_what_the_guarded_nest_stores(extent, factor, rows,
                                                                                             op, cap):
    """A parallel loop over rows x tiles (the tile index is fused % tiles) is not cut in two: each
    iteration runs a copy without the tile's guards where its tile is whole. Over every extent,
    factor, row count, comparison and second guard, the split nest stores exactly what the guarded
    one stores, and the whole tiles' copy holds no guard on the tile."""
    from tuner.schedule.peel import peel_guards
    from tuner.te.expr import And
    tiles = -(-extent // factor)
    f = Var("f")
    idx = FloorMod(f, Const(tiles)) * Const(factor) + Var("i")
    row = FloorDiv(f, Const(tiles))
    bound = Cmp(op, idx, Const(extent if op == "<" else extent - 1))
    cond = And(bound, Cmp("<", row, Const(cap))) if cap else bound
    store = ir.Store("y", (row, idx), idx * Const(3) + row)
    func = ir.Func("f", [], [], ir.For("f", rows * tiles, ir.For("i", factor, ir.IfThen(cond, store), "vectorize"),
                                       "parallel"), {})
    want = _run_ir(func.body, {}, {})
    assert len(want) == (min(rows, cap) if cap else rows) * extent
    split = peel_guards(func)
    assert _run_ir(split.body, {}, {}) == want
    (par,) = [s for s in ir.stmts(split.body) if isinstance(s, ir.For) and s.kind == "parallel"]
    if extent % factor and extent > factor:      # whole tiles and a part one: a copy for the whole ones
        whole = par.body.stmts[0]
        assert isinstance(whole, ir.IfThen)
        assert not [c for x in ir.stmts(whole.body) if isinstance(x, ir.IfThen) for c in walk(x.cond)
                    if isinstance(c, Var) and c.name == "i"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cols", [100, 197, 200, 1500 // 8])
def test_the_last_partial_column_tile_of_a_gemm_runs_vector_code_over_its_own_columns(cols, threads):
    """A GEMM's guarded column tile of 3 vectors (ViT's 200 scores: 4 tiles of 48 and 8 columns)
    ran its last tile as 48 guarded lanes under `omp simd`, one at a time; the vector loop now stops
    where its guard fails for every row, so the part runs vectors too, and computes the reference.
    With 2 threads the tile index is fused into the parallel loop, and the part's copy takes the
    last tile's index as a constant, which its guard needs to fold."""
    wl = make("batch_matmul", dict(B=2, M=11, N=cols, K=16), "NN")
    target = parse_target("cpu", threads=threads)
    space = SearchSpace(wl, target)
    dec = space.default()
    dec["tile"][2] = [1, 1, 3 * TARGET1.lanes]
    steps = space.steps(dec)
    src = Task(wl, target).candidate(steps).source
    assert ("omp parallel" in src) == (threads > 1)
    part = cols % (3 * TARGET1.lanes)
    lane_loops = [int(e) for e in re.findall(r"omp simd\s+for \(int \w+ = 0; \w+ < (\d+);", src)]
    assert "f32x" in src and all(e <= part for e in lane_loops), (part, lane_loops)
    assert bool(lane_loops) == (vector_split(part, TARGET1.lanes)[0] == 0)    # 5 columns: no vector fits
    check_schedules([(wl, steps)], target)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("cols", [17, 21, 37])
def test_a_gemm_whose_columns_no_vector_divides_takes_whole_vectors_by_default_not_single_columns(cols, isa):
    """A CRNN's 37 classes took one column per tile (37 is prime: 11x the time of 2 vectors and a
    guarded tail); now whole vectors, the last tile guarded, and the kernel computes the reference."""
    wl = make("dense", dict(N=32, C=64, K=cols, bias=1))
    target = parse_target(f"cpu -isa={isa}", threads=1, check_host=False)
    space = SearchSpace(wl, target)
    dec = space.default()
    assert dec["tile"][-1][2] % target.lanes == 0 and dec["tile"][-1][2] < cols, dec["tile"]
    if isa == host_isa() or host_isa() == "avx512":
        check_schedules([(wl, space.steps(dec))], target)


@pytest.mark.parametrize("op, width, shared", [("relu", 16, False), ("sigmoid", 64, False), ("relu", 1024, True),
                                                ("sigmoid", 256, True)])
def test_a_kernel_too_small_to_share_runs_on_the_calling_thread_and_a_big_one_on_all(op, width, shared):
    """Waking a second thread cost an LSTM step's gates (256 elements) 10x their time: a parallel
    loop with less than PARALLEL_MIN_WORK to share (a math call weighing more than a store) runs
    on one thread; the kernel computes the reference either way."""
    wl = make(op, dict(C=16, H=1, W=width), "NCHW")
    target = parse_target("cpu", threads=2)
    steps = SearchSpace(wl, target).steps(SearchSpace(wl, target).default())
    assert any(st[0] == "annotate" and st[-1] == "parallel" for st in steps)
    src = Task(wl, target).candidate(steps).source
    assert ("omp parallel" in src) == shared
    check_schedules([(wl, steps)], target)


@pytest.mark.parametrize("shift, blended", [(0, True), (1, False)])
def test_a_select_per_lane_is_blended_only_where_both_arms_read_inside_their_buffers(shift, blended):
    """y[i] = x[i] < 0 ? x[i - shift] : 0: blending computes both arms for every lane, so an arm
    whose read the condition may guard (x[i - 1] at i = 0 is before x) keeps the test per element."""
    from tuner.codegen.c import PRELUDE
    from tuner.te.expr import Const, select
    from tuner.te.tensor import compute, placeholder
    x = placeholder((64,), "x")
    y = compute((64,), lambda i: select(x[i] < Const(0.0), x[i - Const(shift)], Const(0.0)), "y", inputs=[x],
                axis_names=["i"])
    steps = [["split", "y", "i", [16]], ["annotate", "y", "i.1", "vectorize"]]
    src, _ = generate_c(lower(replay([x], y, steps)), 16, 1)
    assert ("TUNER_VSEL" in src.replace(PRELUDE, "")) == blended


def test_a_select_whose_condition_differs_per_lane_is_a_vector_blend(tmp_path, tmp_cache):
    """GPT-2's attention mask (where(mask == 0, -inf, scores)) and TopK's ranks: a mask of float
    compares blends the arms, and the model computes what ONNX Runtime computes."""
    onnx = pytest.importorskip("onnx")
    from conftest import ort_run
    from onnx import TensorProto, helper, numpy_helper

    from tuner.codegen.c import PRELUDE
    from tuner.compiler import compile_model
    g = helper.make_graph([helper.make_node("Less", ["x", "zero"], ["neg"]),
                           helper.make_node("Where", ["neg", "x", "half"], ["y"])], "w",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
                           numpy_helper.from_array(np.full(64, 0.5, np.float32), "half")])
    path = tmp_path / "w.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_array_equal(m.run(x)[0], ort_run(path, x)[0])
    m.save(str(tmp_path / "built"))
    assert "TUNER_VSEL(" in (tmp_path / "built" / "model.c").read_text().replace(PRELUDE, "")


def test_simplifier_removes_exact_div_and_mod():
    ko, ki = Var("ko"), Var("ki")
    ranges = {"ko": (0, 9), "ki": (0, 7)}
    assert simplify((ko * 8 + ki) // 8, ranges) == ko
    assert simplify((ko * 8 + ki) % 8, ranges) == ki
    assert simplify((ko * 16 + ki) // 8, ranges) == simplify(ko * 2, ranges)
    assert coefficient((ko * 8 + ki) % 8 + ko * 3, "ki", ranges) == 1
    # not exact when the remainder can cross a period
    assert isinstance(simplify((ki + 3) // 8, ranges), FloorDiv)
    assert isinstance(simplify((ki + 3) % 8, ranges), FloorMod)


@pytest.mark.parametrize("wl", [make("conv2d", dict(C=8, H=6, W=6, K=16, R=3, S=3, pad=1, bias=1, residual=1, relu=1),
                                     "NCHW8c"),
                                make("conv2d", dict(C=8, H=5, W=5, K=8, R=1, S=1, bias=1), "NHWC"),
                                make("dense", dict(N=2, C=12, K=16, bias=1, relu=1), "OI16o")],
                         ids=["conv-residual-relu", "conv-bias", "dense"])
def test_an_epilogue_fused_or_apart_computes_the_reference(wl):
    """The epilogue placement is a decision of the sketch: fused into the reduction's tiles, or apart
    as a second loop nest over the whole output after the reduction's own accumulator."""
    import random

    from conftest import TARGET1

    from tuner.space.mutation import mutate
    from tuner.space.sketch import SearchSpace
    space = SearchSpace(wl, TARGET1)
    assert space.epilogues == ("fused", "apart") and space.default()["epilogue"] == "fused"
    fused = space.default()
    apart = dict(fused, epilogue="apart")
    steps = {e: space.steps(d) for e, d in (("fused", fused), ("apart", apart))}
    assert ["cache_write", space.anchor] in steps["apart"] and ["cache_write", space.anchor] not in steps["fused"]
    assert not any(s[0] == "compute_at" and s[2] == space.output.name for s in steps["apart"])   # not at its tiles
    assert space.steps({k: v for k, v in fused.items() if k != "epilogue"}) == steps["fused"]    # older logs
    check_schedules([(wl, steps["fused"]), (wl, steps["apart"])])
    rng = random.Random(0)
    flips = [m for m in (mutate(space, fused, rng) for _ in range(200)) if m and m["epilogue"] == "apart"]
    assert flips and all(dict(m, epilogue="fused") == fused for m in flips)     # a flip changes nothing else
    assert SearchSpace(make("conv2d", dict(C=8, H=6, W=6, K=16, R=3, S=3, pad=1), "NCHW8c"), TARGET1).epilogues == ()


@pytest.mark.parametrize("wl", [make("conv2d", dict(C=16, H=4, W=8, K=32, R=1, S=1, bias=1, relu=1), "NCHW16c"),
                                make("conv2d", dict(C=8, H=6, W=6, K=16, R=3, S=3, pad=1, stride=2), "NCHW8c"),
                                make("conv2d", dict(C=8, H=5, W=6, K=8, R=3, S=3, pad=1, bias=1), "NHWC")],
                         ids=["conv1x1", "conv3x3-stride2", "conv3x3-nhwc"])
def test_the_register_tiles_loop_order_is_a_decision_that_computes_the_reference(wl):
    """`order`: the register tile's unrolled loops in the output's axis order or reversed, the vector
    axis innermost either way; a point logged without it is the axis order; a mutation can flip it
    alone; both orders compute the reference."""
    space = SearchSpace(wl, TARGET1)
    tile = [[1, 1, 1] for _ in space.out_shape]
    unrolled = [d for d, e in enumerate(space.out_shape[:-1]) if e > 1][:2]
    assert len(unrolled) == 2
    for d in unrolled:
        tile[d][2] = 2
    tile[-1][2] = max(space.last_options)
    axes = dict(space.default(), tile=tile, order="axes")
    rev = dict(axes, order="reversed")
    steps = {o: space.steps(d) for o, d in (("axes", axes), ("reversed", rev))}
    local = space.reduction_stage(axes)
    inner = {o: [a for a in next(s for s in st if s[:2] == ["reorder", local])[2] if a.endswith(".1")]
             for o, st in steps.items()}
    names = [f"{space.local_axes[d]}.1" for d in unrolled]
    assert [a for a in inner["axes"] if a in names] == names
    assert [a for a in inner["reversed"] if a in names] == names[::-1]
    assert inner["axes"][-1] == inner["reversed"][-1] == f"{space.local_axes[-1]}.1"
    assert space.steps({k: v for k, v in axes.items() if k != "order"}) == steps["axes"]     # older logs
    check_schedules([(wl, steps["axes"]), (wl, steps["reversed"])])
    rng = random.Random(0)
    flips = [m for m in (mutate(space, axes, rng) for _ in range(200)) if m and m["order"] == "reversed"]
    assert flips and all(dict(m, order="axes") == axes for m in flips)
    assert {space.sample(rng)["order"] for _ in range(40)} == {"axes", "reversed"}
    from tuner.search.optuna_search import _parameter_table
    assert ("order", ("order",), ["axes", "reversed"]) in _parameter_table(space)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("wl", [make("conv2d", dict(C=8, H=9, W=9, K=16, R=3, S=3, pad=1, stride=2, bias=1, relu=1),
                                     "NCHW8c"),
                                make("conv2d", dict(C=8, H=6, W=5, K=8, R=3, S=3, pad=1, groups=8), "NHWC"),
                                make("max_pool2d", dict(C=16, H=7, W=7, R=3, S=3, stride=2, pad=1), "NCHW16c")],
                         ids=["conv3x3-stride2", "depthwise-nhwc", "max_pool2d"])
def test_a_pad_computed_per_tile_computes_the_reference(wl, threads):
    """`pad: tile`: the padded copy is made at the reduction's outermost loop and covers what one
    output tile reads (a buffer smaller than the padded input when there are several tiles); with
    the epilogue fused or apart, on one thread or two, it computes the reference; sampling,
    mutation and the Optuna table all offer it."""
    target = parse_target("cpu", threads=threads)
    space = SearchSpace(wl, target)
    (pad,) = space.pads
    dec = space.default()
    rows = 2 if len(space.out_shape) == 5 else 1       # the output rows' axis (NCHW[x]c, NHWC)
    dec["tile"][rows] = [1, 1, 1]                     # one output row per tile: several tiles
    tiled = dict(dec, pad={pad: "tile"})
    steps = space.steps(tiled)
    local = space.reduction_stage(tiled)
    red = [r for r, _ in space.reduce_axes]
    assert [s for s in steps if s[0] == "compute_at" and s[1] == pad] == [["compute_at", pad, local, f"{red[0]}.0"]]
    buf = lower(space.schedule(steps)).buffers[pad]
    full = space.schedule(steps).shape_of(pad)
    assert buf.scope == "local" and buf.shape[rows] < full[rows]
    cases = [(wl, steps), (wl, space.steps(dict(tiled, pad={pad: "root"})))]
    if space.epilogues:
        cases.append((wl, space.steps(dict(tiled, epilogue="apart"))))
    check_schedules(cases, target)
    rng = random.Random(0)
    assert {space.sample(rng)["pad"][pad] for _ in range(80)} == set(PAD_PLACES)
    moved = [m["pad"][pad] for m in (mutate(space, tiled, rng) for _ in range(300)) if m and m["pad"] != tiled["pad"]]
    assert set(moved) == set(PAD_PLACES) - {"tile"}
    from tuner.search.optuna_search import _parameter_table
    assert (f"pad.{pad}", ("pad", pad), list(PAD_PLACES)) in _parameter_table(space)


def _bounds_tests(stmt) -> int:
    """The most comparisons in the condition of a select that `stmt` stores."""
    return max((sum(isinstance(c, Cmp) for c in walk(n.cond)) for s in ir.stmts(stmt) if isinstance(s, ir.Store)
                for n in walk(s.value) if isinstance(n, Select)), default=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("wl", [make("conv2d", dict(C=8, H=9, W=9, K=16, R=3, S=3, pad=1, stride=2, bias=1, relu=1),
                                     "NCHW8c"),
                                make("conv2d", dict(C=16, H=12, W=12, K=32, R=3, S=3, pad=1, bias=1, relu=1), "NCHW16c"),
                                make("conv2d", dict(C=3, H=20, W=20, K=16, R=7, S=7, pad=3, stride=2), "NCHW16c"),
                                make("conv2d", dict(C=8, H=6, W=5, K=8, R=3, S=3, pad=1, groups=8), "NHWC"),
                                make("max_pool2d", dict(C=16, H=7, W=7, R=3, S=3, stride=2, pad=1), "NCHW16c")],
                         ids=["conv3x3-stride2", "conv3x3", "conv7x7-pad3", "depthwise-nhwc", "max_pool2d"])
def test_a_pad_inlined_with_an_interior_version_computes_the_reference(wl, threads):
    """`pad: interior`: the pad is inlined and the reduction is written twice, its bounds tests
    gone from the version that the tiles away from the border run (an output row per tile, so
    that there are such tiles); one thread or two, it computes the reference."""
    target = parse_target("cpu", threads=threads)
    space = SearchSpace(wl, target)
    (pad,) = space.pads
    dec = space.default()
    rows = 2 if len(space.out_shape) == 5 else 1
    dec["tile"][rows] = [1, 1, 1]
    inside = dict(dec, pad={pad: "interior"})
    steps = space.steps(inside)
    assert ["compute_inline", pad] in steps and any(s[0] == "pragma" and s[3] == "unswitch" for s in steps)
    func, inline = (lower(space.schedule(space.steps(d))) for d in (inside, dict(dec, pad={pad: "inline"})))
    assert pad not in func.buffers
    interior = [s for s in ir.stmts(func.body) if isinstance(s, ir.IfThen) and _bounds_tests(s) < _bounds_tests(inline.body)]
    assert interior, "no version without the pad's bounds tests"
    check_schedules([(wl, steps), (wl, space.steps(dict(inside, epilogue="apart")) if space.epilogues else steps)],
                    target)


@settings(max_examples=12, deadline=None)
@given(h=st.integers(3, 11), w=st.integers(3, 11), r=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2),
       pad=st.integers(0, 2), rows=st.integers(1, 3), threads=st.integers(1, 2))
def test_every_conv_with_its_pad_interior_computes_the_reference(h, w, r, stride, pad, rows, threads):
    """For any input size, kernel, stride and pad, and tiles of any number of rows (dividing or
    not), the interior and border versions together compute what the reference does."""
    assume(min(h, w) + 2 * pad >= r)
    wl = make("conv2d", dict(C=8, H=h, W=w, K=16, R=r, S=r, pad=pad, stride=stride, bias=1), "NCHW8c")
    target = parse_target("cpu", threads=threads)
    space = SearchSpace(wl, target)
    dec = space.default()
    oh = space.out_shape[2]
    dec["tile"][2] = [1, 1, max(d for d in range(1, rows + 1) if oh % d == 0)]
    check_schedules([(wl, space.steps(dict(dec, pad={p: "interior" for p in space.pads})))], target)


@settings(max_examples=15, deadline=None)
@given(hw=st.integers(2, 60), r=st.sampled_from([1, 3, 5]), kb=st.integers(1, 4), threads=st.integers(1, 2))
def test_the_default_avx512_conv_tile_splits_no_padded_axis_in_two_and_computes_the_reference(hw, r, kb, threads):
    """With an interior version, the default register tile puts no padded output axis in exactly two
    tiles where a smaller tile fits (both tiles would be border tiles), and holds at most 28
    accumulators; it computes the reference where this host runs AVX-512."""
    pad = r // 2
    wl = make("conv2d", dict(C=16, H=hw, W=hw, K=16 * kb, R=r, S=r, pad=pad, bias=1, relu=1), "NCHW16c")
    target = parse_target(f"cpu -isa=avx512 -threads={threads}", check_host=False)
    space = SearchSpace(wl, target)
    dec = space.default()
    assert space.valid(dec) and dec["pad"] == {p: "interior" for p in space.pads}
    reg = [t[2] for t in dec["tile"]]
    assert reg[-1] == 16 and reg[0] * reg[1] * reg[2] * reg[3] <= 28
    padded = space._pad_reads[1]
    assert (2 in padded and 3 in padded) == (pad > 0)
    for d in padded & {2, 3}:
        n = space.out_shape[d]
        assert n != 2 * reg[d] or not [x for x in range(1, reg[d]) if n % x == 0], (d, n, reg)
    if TARGET1.isa == "avx512":
        check_schedules([(wl, space.steps(dec))], target)


@settings(max_examples=12, deadline=None)
@given(w=st.sampled_from([17, 19, 23, 29, 31, 35, 37, 71, 73]), h=st.integers(1, 24),
       rs=st.sampled_from([(1, 1), (1, 7), (7, 1), (3, 3)]), isa=st.sampled_from(["avx2", "avx512"]),
       threads=st.integers(1, 2))
def test_a_default_conv_tile_over_a_prime_width_fills_its_registers_and_computes_the_reference(w, h, rs, isa,
                                                                                             threads):
    """Inception's 17-, 35- and 71-pixel rows have no divisor near the register budget: the default
    tile takes a guarded last tile rather than one pixel per tile (a quarter of peak), and computes
    the reference where this host runs the ISA."""
    r, s = rs
    lanes = 16 if isa == "avx512" else 8
    wl = make("conv2d", dict(C=lanes, H=h + r - 1, W=w, K=2 * lanes, R=r, S=s, pad=(0, s // 2, 0, s // 2) if s > 1 else 0,
                             bias=1, relu=1), f"NCHW{lanes}c")
    target = parse_target(f"cpu -isa={isa} -threads={threads}", check_host=False)
    space = SearchSpace(wl, target)
    dec = space.default()
    assert space.valid(dec)
    n, kb, oh, ow, _ = [t[2] for t in dec["tile"]]
    assert max(oh, ow) > 1 and kb * oh * ow >= min(8, space.out_shape[1] * space.out_shape[2] * w), dec["tile"]
    if TARGET1.isa == "avx512" or isa == TARGET1.isa:
        check_schedules([(wl, space.steps(dec))], target)


@pytest.mark.parametrize("spec, tile", [
    ("C=160,H=17,W=17,K=192,R=1,S=7,pad=0.3.0.3", (3, 9, 1)),     # columns padded: the tile runs down the rows
    ("C=160,H=17,W=17,K=160,R=7,S=1,pad=3.0.3.0", (2, 1, 9)),     # rows padded: along the row, no border in it
    ("C=400,H=17,W=17,K=400,R=1,S=1,pad=0", (3, 1, 9)),            # 25 blocks beside a guarded row: by 3 (none divides)
    ("C=384,H=8,W=8,K=384,R=1,S=3,pad=0.1.0.1", (3, 8, 1)),
    ("C=64,H=35,W=35,K=96,R=3,S=3,pad=1", (3, 1, 7)),              # a 7-pixel row: three channel blocks
    ("C=160,H=7,W=7,K=960,R=1,S=1,pad=0", (4, 1, 7)),              # 4 blocks of 7 before 3: 28 accumulators
    ("C=512,H=7,W=7,K=2048,R=1,S=1,pad=0", (4, 1, 7)),             # with their weights, 33 registers: still faster
    ("C=512,H=7,W=7,K=2080,R=1,S=1,pad=0", (4, 1, 7)),             # 130 blocks: by 4, the last tile of 2 guarded
    ("C=400,H=7,W=7,K=400,R=1,S=1,pad=0", (4, 1, 7)),              # 25 blocks (odd): by 4, the last of 1
    ("C=192,H=28,W=28,K=48,R=1,S=1,pad=0", (3, 1, 7)),             # 3 blocks: all 3 by a row of 7
    ("C=32,H=56,W=56,K=144,R=1,S=1,pad=0", (3, 1, 7)),             # 9 blocks: by 3, which divides them, not 4
    ("C=64,H=14,W=14,K=64,R=3,S=3,pad=1", (2, 1, 14)),              # padded: a border test in each half of 4x7
    ("C=64,H=56,W=56,K=64,R=3,S=3,pad=1", (4, 1, 7)),               # 56 wide: a quarter of 7-pixel tiles hold one
    ("C=128,H=56,W=56,K=128,R=3,S=3,pad=1,groups=2", (4, 1, 7)),     # 4 blocks of one group share each broadcast
    ("C=96,H=14,W=14,K=96,R=3,S=3,pad=1,groups=2", (1, 1, 14)),      # 3 blocks a group: none paired
    ("C=1024,H=14,W=14,K=256,R=1,S=1,pad=0", (4, 1, 7)),           # unpadded: 4 blocks by 7, not 2 by 14
    ("C=256,H=56,W=56,K=32,R=1,S=1,pad=0", (2, 1, 14)),            # 2 blocks only
    ("C=96,H=7,W=7,K=96,R=5,S=5,pad=2,groups=96", (3, 1, 7)),       # depthwise: its channels are no row
])
def test_the_default_avx512_conv_tile_keeps_borders_out_of_its_rows_and_fills_short_rows_with_channel_blocks(
        spec, tile):
    """With an interior version, the register tile runs along an output axis whose input dimension
    is not padded where the row's is (a 1x7 conv: down its rows, so that no tile holds a border
    test); a row of 7 to 9 pixels takes 4 or 3 blocks of output channels where they divide them
    and the accumulators fit their 28 registers, and an unpadded row of 14, or a padded one 56
    wide or more, 4 blocks by 7. Each computes the reference where this host runs AVX-512."""
    wl = parse_spec(f"conv2d:N=1,{spec},stride=1,bias=1,relu=1", "NCHW16c")
    for threads in (1, 2):
        target = parse_target(f"cpu -isa=avx512 -threads={threads}", check_host=False)
        space = SearchSpace(wl, target)
        dec = space.default()
        _, kb, oh, ow, _ = [t[2] for t in dec["tile"]]
        assert space.valid(dec) and (kb, oh, ow) == tile, dec["tile"]
        assert kb * oh * ow <= 28
        if TARGET1.isa == "avx512":
            check_schedules([(wl, space.steps(dec))], target)


def test_a_row_is_cut_into_register_tiles_that_keep_enough_fmas_in_flight():
    """With 16 registers (12 accumulators) a row's tiles, the last guarded, are as long as take the
    fewest FMA cycles, a tile under LATENCY_ACCUMULATORS accumulators waiting on their latency: by
    2 vectors 7 as 4 + 3 (not 6 + 1, whose last tile waits on 2 FMAs) and 14 as 5 + 5 + 4; by 4
    vectors 3 pixels wide whatever the row (2 by 4 vectors ran slower); a row shorter than the room
    whole; never past it."""
    assert [guarded_length(n, 2, 12) for n in (7, 14, 28, 56)] == [4, 5, 6, 6]
    assert {guarded_length(n, 4, 12) for n in (7, 14, 16, 28, 49, 56, 196, 784)} == {3}
    assert guarded_length(5, 2, 12) == 5 and guarded_length(7, 1, 12) == 7 and guarded_length(9, 16, 12) == 1


@pytest.mark.parametrize("spec, layout, tile, chunk", [
    ("C=256,H=56,W=56,K=64,R=1,S=1,pad=0", "NCHW16c", (2, 3, 16), None),  # 2 vectors of a block by 2 blocks
    ("C=512,H=7,W=7,K=512,R=3,S=3,pad=1", "NCHW16c", (2, 3, 16), 1),      # 7 as 3 + 3 + 1; blocked: a block a chunk
    ("C=2048,H=7,W=7,K=512,R=1,S=1,pad=0", "NCHW16c", (2, 3, 16), 8),     # blocked: 128 channels a chunk
    ("C=512,H=28,W=28,K=128,R=1,S=1,pad=0", "NCHW8c", (4, 3, 8), 16),     # blocked: 128 channels a chunk
    ("C=256,H=14,W=14,K=256,R=3,S=3,pad=1", "NCHW8c", (4, 3, 8), 1),      # one vector a block: 4 blocks; blocked
    ("C=64,H=14,W=14,K=24,R=1,S=1,pad=0", "NCHW8c", (3, 4, 8), None),     # 3 blocks of one vector: all three
    ("C=64,H=14,W=14,K=48,R=1,S=1,pad=0", "NCHW16c", (1, 5, 16), None),   # 3 blocks: a block's 2 vectors, 14 as 5+5+4
    ("C=64,H=7,W=7,K=48,R=1,S=1,pad=0", "NCHW16c", (1, 4, 16), None),     # 7 as 4 + 3, not 6 + 1
    ("C=832,H=7,W=7,K=48,R=1,S=1,pad=0", "NCHW16c", (1, 4, 16), None),    # 3 blocks of 2 vectors: never 3 by 2 vectors
    ("C=64,H=28,W=28,K=48,R=1,S=1,pad=0", "NCHW16c", (1, 6, 16), None),   # 28 as 6 x 4 + 4
    ("C=32,H=28,W=28,K=16,R=1,S=1,pad=0", "NCHW16c", (1, 6, 16), None),   # one block
    ("C=64,H=2,W=2,K=64,R=1,S=1,pad=0", "NCHW16c", (2, 2, 16), None),     # a row of 2: the rows fill the rest
])
def test_the_default_avx2_conv_tile_feeds_four_vectors_from_each_broadcast_by_three_pixels(spec, layout, tile, chunk):
    """With 16 vector registers, a conv whose input element is broadcast to several output channel
    blocks holds the block's whole vectors and as many blocks as make 4 vectors per broadcast, by 3
    pixels of the row (the last tile guarded), reversed: 12 accumulators at most, the pad copied
    first; 3 blocks of one vector that are the whole axis (24 channels in blocks of 8) all three,
    by 4 pixels (alone 0.56-0.87x the time of one block by a row: docs/history.md); with no pair
    of blocks, a block of 2 vectors by up to 6 pixels, as many as take the
    fewest FMA cycles over the row (guarded_length). The reduction is blocked in
    chunks of 16 KiB of weights (at least one input-channel block) where a register tile's weights
    outgrow L1, a padded conv's too (its pad is copied first in any case), the tile then widened to
    whole rows. Each computes the reference where this host runs AVX2."""
    wl = parse_spec(f"conv2d:N=1,{spec},stride=1,bias=1,relu=1", layout)
    for threads in (1, 2):
        space = SearchSpace(wl, parse_target(f"cpu -isa=avx2 -threads={threads}", check_host=False))
        dec = space.default()
        _, kb, oh, ow, vec = [t[2] for t in dec["tile"]]
        assert space.valid(dec) and (kb, ow, vec) == tile, dec["tile"]
        first, *rest = space.reduce_axes
        blocked = [chunk] + [e for _, e in rest] if chunk else [1] * len(space.reduce_axes)
        assert kb * oh * ow * vec // 8 <= 16 and dec["reduce"] == blocked, dec["reduce"]
        assert (chunk is not None) == (math.prod(t[1] for t in dec["tile"]) > 1)     # blocked: rows of tiles per chunk
        assert set(dec["pad"].values()) <= {"root"} and (dec["order"] == "reversed") == (kb > 1 or vec > 8)
        if kb > 1 or vec > 8:
            assert kb * oh * ow * vec // 8 <= 12
        check_schedules([(wl, space.steps(dec))], space.target)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_pad_read_few_times_per_element_is_read_in_place_where_a_conv_with_16_registers_copies_it_first(isa):
    """A reduction that reads each padded element fewer than COPY_READS times (a max pool, a
    depthwise conv, a 3-channel stem) takes the interior version of its pad with 16 registers as
    with 32; a conv over many channels copies its pad first with 16 (AVX2) and reads it in place
    with 32. Each computes the reference where this host runs the ISA."""
    target = parse_target(f"cpu -isa={isa} -threads=1", check_host=False)
    in_place = [parse_spec("max_pool2d:N=1,C=32,H=14,W=14,R=3,S=3,stride=2,pad=1", "NCHW16c"),
                parse_spec("conv2d:N=1,C=32,H=14,W=14,K=32,R=3,S=3,stride=2,pad=1,groups=32,bias=1", "NCHW8c"),
                parse_spec("conv2d:N=1,C=3,H=32,W=32,K=16,R=3,S=3,stride=2,pad=1,bias=1", "NCHW16c")]
    copied = parse_spec("conv2d:N=1,C=32,H=14,W=14,K=32,R=3,S=3,stride=1,pad=1,bias=1", "NCHW16c")
    for wl in in_place:
        space = SearchSpace(wl, target)
        assert space._pad_reads_each < COPY_READS and set(space.default()["pad"].values()) == {"interior"}, wl
    space = SearchSpace(copied, target)
    assert space._pad_reads_each >= COPY_READS
    assert set(space.default()["pad"].values()) == {"interior" if isa == "avx512" else "root"}
    if TARGET1.isa == "avx512" or isa == TARGET1.isa:
        check_schedules([(wl, (sp := SearchSpace(wl, target)).steps(sp.default())) for wl in in_place + [copied]],
                        target)


@pytest.mark.parametrize("spec, layout", [("conv2d:N=1,C=32,H=56,W=56,K=32,R=3,S=3,stride=2,pad=1,bias=1", "NCHW16c"),
                                          ("winograd_input:N=1,C=16,H=36,W=36,pad=1,m=4", "NCHW8c")])
def test_a_pad_copied_first_is_copied_by_every_thread_and_computes_the_reference(spec, layout):
    """With 2 threads a pad at root runs its outer loops fused in parallel, its channel block
    whole (a serial copy before the parallel loop kept AVX2's 3x3 convs from scaling), in the
    tiled and the table sketch alike; with 1 thread it is the loop nest it was. (Pads big enough
    to share: PARALLEL_MIN_WORK.)"""
    wl = parse_spec(spec, layout)
    for threads in (1, 2):
        target = parse_target(f"cpu -isa=avx2 -threads={threads}", check_host=False)
        space = SearchSpace(wl, target)
        (pad,) = space.pads
        dec = dict(space.default(), pad={pad: "root"})
        steps = space.steps(dec)
        spread = [s for s in steps if s[1] == pad and s[0] in ("fuse", "annotate")]
        if threads == 1:
            assert spread == []
            continue
        axes = [a for a, _ in space._pad_axes[pad]]
        assert spread[-1][2:] == ["@".join(axes[:len(spread[-1][2].split("@"))]), "parallel"] and axes[-1] not in spread[-1][2]
        code, _ = generate_c(lower(space.schedule(steps)), target.lanes, threads)
        assert code.count("#pragma omp parallel for") == 2 and \
            code.index("#pragma omp parallel for") < code.index(f"{pad}[")
        if TARGET1.isa in ("avx2", "avx512"):        # AVX2 code runs on this host
            check_schedules([(wl, steps)], target)


@pytest.mark.parametrize("c, hw, r, stride, pixels", [
    (32, 112, 3, 1, LOAD_ACCUMULATORS),
    (144, 56, 3, 2, 7),          # 28 wide: the largest divisor in 8
    (576, 14, 3, 1, 7),          # 7 + 7: two border tiles
    (240, 14, 5, 1, 7),
    (960, 7, 3, 1, 7),
])
def test_a_depthwise_conv_with_16_registers_holds_one_row_of_few_accumulators(c, hw, r, stride, pixels):
    """Every FMA of a depthwise conv loads its own input vector (no broadcast read), so with 16
    vector registers its default tile is one vector by up to LOAD_ACCUMULATORS pixels of the row,
    never by channel blocks (each would hold its own weights), the pad read in place. Each computes
    the reference where this host runs AVX2."""
    for layout in ("NCHW8c", "NCHW16c"):
        wl = make("conv2d", dict(C=c, H=hw, W=hw, K=c, R=r, S=r, stride=stride, pad=r // 2, groups=c, bias=1,
                                 relu=1), layout)
        space = SearchSpace(wl, parse_target("cpu -isa=avx2 -threads=1", check_host=False))
        dec = space.default()
        assert not space._broadcast_read and space.valid(dec)
        assert [t[2] for t in dec["tile"]] == [1, 1, 1, pixels, 8], dec["tile"]
        assert set(dec["pad"].values()) == {"interior"}
        check_schedules([(wl, space.steps(dec))], space.target)


@settings(max_examples=12, deadline=None)
@given(per=st.integers(1, 5), groups=st.integers(2, 4), hw=st.sampled_from([7, 14, 28]), r=st.sampled_from([1, 3]),
       threads=st.integers(1, 2))
def test_a_grouped_conv_pairs_only_channel_blocks_of_one_group_in_its_default_tile(per, groups, hw, r, threads):
    """Output channel blocks of one group read the same input element: the default AVX-512 tile
    takes 2 or more of them per broadcast (reversed order) where their count in a group is even
    (RegNet's 64-wide groups: 0.57-0.9x the time of one block), never blocks of two groups, and
    computes the reference where this host runs AVX-512."""
    c = 16 * per * groups
    wl = parse_spec(f"conv2d:N=1,C={c},H={hw},W={hw},K={c},R={r},S={r},stride=1,pad={r // 2},groups={groups},"
                    "bias=1,relu=1", "NCHW16c")
    space = SearchSpace(wl, parse_target(f"cpu -isa=avx512 -threads={threads}", check_host=False))
    dec = space.default()
    kb = dec["tile"][1][2]
    assert space.valid(dec) and space._reuse(1) == per
    assert (kb > 1 and dec["order"] == "reversed") == (per % 2 == 0), dec
    if dec["order"] == "reversed":
        assert per % kb == 0
    if TARGET1.isa == "avx512":
        check_schedules([(wl, space.steps(dec))], space.target)


@pytest.mark.parametrize("spec, threads, rows, chunk", [
    ("C=1024,H=14,W=14,K=256,R=1,S=1,stride=1,pad=0", 1, 7, 4),     # 4 blocks x 1024 channels: 256 KiB
    ("C=1024,H=14,W=14,K=256,R=1,S=1,stride=1,pad=0", 2, 7, 4),
    ("C=1024,H=14,W=14,K=256,R=1,S=1,stride=1,pad=0", 16, 1, 4),    # 4 outer tiles per thread: one row
    ("C=2048,H=7,W=7,K=512,R=1,S=1,stride=1,pad=0", 2, 7, 4),
    ("C=1024,H=14,W=14,K=2048,R=1,S=1,stride=2,pad=0", 1, 7, 4),
    ("C=512,H=28,W=28,K=128,R=1,S=1,stride=1,pad=0", 1, None, None),   # 128 KiB: not blocked
    ("C=512,H=7,W=7,K=512,R=3,S=3,stride=1,pad=1", 2, 7, 1),         # every tile holds both borders
    ("C=256,H=14,W=14,K=256,R=3,S=3,stride=1,pad=1", 1, None, None),    # 2 blocks by 14: not blocked
    ("C=512,H=14,W=14,K=512,R=3,S=3,stride=2,pad=1", 1, None, None),    # the padded copy: 4 x 0.5 > 1.2 MiB
    ("C=192,H=7,W=7,K=384,R=3,S=3,stride=1,pad=1", 2, None, None),      # one 7-pixel tile per chunk at 2 threads
])
def test_the_default_blocks_the_reduction_where_a_register_tiles_weights_reach_256_kib(spec, threads, rows, chunk):
    """A conv whose 4 channel blocks read 256 KiB of weights or more over the reduction: the
    input-channel blocks in chunks of 16 KiB of weights (4 blocks of 16 channels; a 3x3 conv's
    36 KiB block alone), the rest of the reduction inside them, and each chunk serving the whole
    row and up to 7 rows, as many as leave 4 outer tiles per thread. Smaller panels keep the full
    reduction per tile, and so do padded convs, but where every register tile holds both borders
    of its row (a 7x7 output), unless their padded copy is over a quarter of the panel (stride 2)
    or a chunk would serve one register tile; blocked, those copy the pad first. Blocked, each
    computes the reference where this host runs AVX-512."""
    wl = parse_spec(f"conv2d:N=1,{spec},bias=1,relu=1", "NCHW16c")
    target = parse_target(f"cpu -isa=avx512 -threads={threads}", check_host=False)
    space = SearchSpace(wl, target)
    dec = space.default()
    assert space.valid(dec)
    tile = dec["tile"]
    if rows is None:
        assert dec["reduce"] == [1] * len(space.reduce_axes) and all(s2 == 1 for _, s2, _ in tile)
        assert all(place == "interior" for place in dec["pad"].values())
        return
    assert dec["reduce"] == [chunk, *[e for _, e in space.reduce_axes[1:]]]
    assert all(place == "root" for place in dec["pad"].values())      # a padded copy first: no border tests
    assert tile[2][1] == rows and tile[3][1] * tile[3][2] == space.out_shape[3]
    outer = math.prod(e // (s2 * s3) for e, (_, s2, s3) in zip(space.out_shape, tile))
    assert rows == 1 or outer >= 4 * threads             # one row: as many outer tiles as the conv has
    if TARGET1.isa == "avx512" and threads <= 2:
        check_schedules([(wl, space.steps(dec))], target)


@pytest.mark.parametrize("spec, threads, rows, chunked, place", [
    ("C=128,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1", 1, 7, True, "tile"),   # 144 KiB of weights per tile
    ("C=128,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1", 16, 1, True, "root"),  # 4 outer tiles per thread: one row
    ("C=128,H=56,W=56,K=256,R=3,S=3,stride=2,pad=1", 1, 7, True, "root"),   # 8 chunks of channels copy each window
    ("C=32,H=128,W=128,K=64,R=3,S=3,stride=2,pad=1", 1, 2, True, "tile"),
    ("C=32,H=128,W=128,K=64,R=3,S=3,stride=2,pad=1", 2, 2, True, "root"),   # the copy shared by 2 threads
    ("C=512,H=14,W=14,K=512,R=3,S=3,stride=2,pad=1", 2, 7, True, "root"),
    ("C=256,H=14,W=14,K=256,R=3,S=3,stride=1,pad=1", 1, 7, True, "root"),
    ("C=64,H=56,W=56,K=64,R=5,S=5,stride=1,pad=2", 2, 4, True, "root"),
    ("C=16,H=28,W=28,K=32,R=3,S=3,stride=1,pad=1", 1, None, False, "root"),  # 18 KiB: L1 holds it
])
def test_with_16_registers_a_padded_conv_copied_first_blocks_its_reduction_where_its_panel_outgrows_l1(
        spec, threads, rows, chunked, place):
    """AVX2 copies a 3x3 conv's pad first in any case, so where a register tile's weights over the
    whole reduction outgrow L1 it blocks the reduction as an unpadded conv does: one input-channel
    block a chunk (a 3x3 conv's block of 32 output channels is 18 KiB), the taps and channels
    inside, each chunk serving the whole row and up to 7 rows (ResNet-50's stride-2 convs and
    GoogLeNet-like 3x3 convs alone 0.87-0.98x the time unblocked: docs/history.md). Blocked, on
    one thread, a padded copy past a core's L2 (RESIDENT_BYTES) is made per chunk instead, where
    the chunks copy at most TILE_COPIES times the input in all (not with 8 chunks of output
    channels, nor with 16 threads' one row a chunk). AVX-512's default of the same conv keeps its pad inside the tiles and is not blocked
    where the copy would be new (over a quarter of the panel). Blocked, each computes the reference."""
    wl = parse_spec(f"conv2d:N=1,{spec},bias=1,relu=1", "NCHW16c")
    space = SearchSpace(wl, parse_target(f"cpu -isa=avx2 -threads={threads}", check_host=False))
    dec = space.default()
    tile = dec["tile"]
    assert space.valid(dec) and set(dec["pad"].values()) == {place}, dec["pad"]
    copies = space._tile_pad_copies(tile, dec["reduce"])
    assert (place == "tile") == (threads == 1 and space._pad_bytes > RESIDENT_BYTES and copies <= TILE_COPIES), copies
    if not chunked:
        assert dec["reduce"] == [1] * len(space.reduce_axes) and all(s2 == 1 for _, s2, _ in tile)
        return
    assert dec["reduce"] == [1, *[e for _, e in space.reduce_axes[1:]]]
    assert tile[2][1] == rows and tile[3][1] * tile[3][2] >= space.out_shape[3] > (tile[3][1] - 1) * tile[3][2]
    wide = SearchSpace(wl, parse_target(f"cpu -isa=avx512 -threads={threads}", check_host=False)).default()
    if "stride=2" in spec:      # the copy would be new there: over a quarter of the panel
        assert all(place == "interior" for place in wide["pad"].values())
        assert wide["reduce"] == [1] * len(space.reduce_axes)
    if threads <= 2 and TARGET1.isa in ("avx2", "avx512"):
        check_schedules([(wl, space.steps(dec))], space.target)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_tile_buffer_too_big_for_the_stack_is_allocated_once_outside_parallel_loops(threads):
    """A pad computed per tile of 16 output rows, 64 channels x 18 x 34 (153 KiB), is no stack
    array: on one thread the kernel allocates it once, before its first loop, for both tiles;
    inside a parallel loop each iteration allocates its own. Both compute the reference."""
    wl = make("conv2d", dict(C=64, H=32, W=32, K=16, R=3, S=3, pad=1), "NCHW16c")
    target = parse_target("cpu", threads=threads)
    space = SearchSpace(wl, target)
    dec = dict(space.default(), pad={"conv_pad": "tile"})
    dec["tile"] = [[1, e // s3, s3] for e, (_, _, s3) in zip(space.out_shape, dec["tile"])]
    dec["tile"][2] = [1, 16, 1]                                   # two tiles of 16 output rows
    dec["tile"][3] = [1, 4, 8]                                    # every column (not the host's default tile)
    dec["reduce"] = [e for _, e in space.reduce_axes]             # every input channel in one step
    steps = space.steps(dec)
    src, _ = generate_c(lower(space.schedule(steps)), target.lanes, target.threads)
    lines = src.splitlines()
    allocs = [k for k, line in enumerate(lines) if "conv_pad = (float*)aligned_alloc(64, 156672)" in line]
    first_loop = next(k for k, line in enumerate(lines) if line.lstrip().startswith(("for (", "#pragma")))
    assert len(allocs) == 1 and src.count("free(conv_pad)") == 1
    if threads == 1:
        assert allocs[0] < first_loop
        assert lines[allocs[0] + 1].strip() == "if (!conv_pad) return -1;"
    else:
        parallel = next(k for k, line in enumerate(lines) if "omp parallel for" in line)
        assert allocs[0] > parallel
    check_schedules([(wl, steps)], target)


WINOGRAD_TRANSFORMS = [make("winograd_input", dict(C=16, H=9, W=9, pad=1, m=4)),
                       make("winograd_input", dict(C=12, H=7, W=7, pad=1, m=2)),
                       make("winograd_output", dict(K=16, H=9, W=9, pad=1, m=4, bias=1, relu=1)),
                       make("winograd_output", dict(K=12, H=7, W=7, pad=1, m=2, bias=1, residual=1)),
                       make("winograd_output", dict(K=8, H=6, W=6, pad=0, m=4)),   # no epilogue: an accumulator
                       # read and written in blocked layouts: the layout transform fused into the loads and stores
                       make("winograd_input", dict(C=16, H=7, W=7, pad=1, m=2), "NCHW8c"),
                       make("winograd_output", dict(K=24, H=9, W=9, pad=1, m=4, bias=1, residual=1, relu=1),
                            "NCHW16c")]


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_every_point_of_the_winograd_transforms_table_sketch_computes_the_reference(threads):
    """The transforms' spaces are small enough to check whole: vector lengths, pad placement and
    accumulator, on tiles that do not divide the output (7x7 by 2, 9x9 by 4), with one and two
    threads (the outer loops fused and parallel around the unrolled tile). With two threads, one
    vector length per point of the other decisions: the parallel loops do not depend on it."""
    target = parse_target("cpu", threads=threads)
    cases = []
    for wl in WINOGRAD_TRANSFORMS:
        space = SearchSpace(wl, target)
        assert space.kind == "table"
        choices = space.choices()
        assert choices["vec"] and ("pad" in choices) == (wl.op == "winograd_input")
        assert ("acc" in choices) == (space.anchor == space.output.name)
        assert ("blocks" in choices) == (wl.op == "winograd_output" and wl.layout != "NHWC")
        if threads > 1:
            choices["vec"] = choices["vec"][-1:]
        cases += [(wl, space.steps(dict(zip(choices, point)))) for point in itertools.product(*choices.values())]
    assert len(cases) >= (20 if threads == 1 else 12)
    check_schedules(cases, target)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_transform_of_a_blocked_input_defaults_to_vectors_no_wider_than_its_blocks(threads):
    """An NCHW8c input read by an AVX-512 input transform: 16 lanes would gather from two blocks
    one element at a time; the default takes 8, loaded whole. 16c and NHWC inputs keep 16. (Run
    where the host has AVX-512; the code is checked everywhere.)"""
    avx512 = parse_target("cpu -isa=avx512", threads=threads, check_host=False)
    cases = []
    for layout, run, vec in (("NCHW8c", 8, 8), ("NCHW16c", 16, 16), ("NHWC", None, 16)):
        wl = make("winograd_input", dict(C=32, H=9, W=9, pad=1, m=4), layout)
        space = SearchSpace(wl, avx512)
        dec = space.default()
        assert (space.vector_run, dec["vec"]) == (run, vec)
        if layout == "NCHW8c":
            src = Task(wl, avx512).candidate(space.steps(dec)).source
            assert re.search(r"\(f32x8\*\)&data\[", src) and not re.search(r"\(f32x\d+\)\{data\[", src)
            wide = Task(wl, avx512).candidate(space.steps({**dec, "vec": 16})).source
            assert re.search(r"\(f32x16\)\{data\[", wide)         # the gather the default avoids
        cases.append((wl, space.steps(dec)))
    if host_isa() == "avx512":
        check_schedules(cases, avx512)


def test_a_winograd_gemm_defaults_to_several_column_vectors_per_broadcast_and_no_batch_position_in_registers():
    """With 32 vector registers a Winograd GEMM's default register tile takes up to 4 vectors of
    its output channels (each broadcast input feeds them all) by rows of tiles (the tiles' one
    axis), not its 6x6 positions, which both operands read (no reuse); an NCHW16c conv keeps its
    two channel blocks. With 16 registers (AVX2) 4 vectors by 3 rows (12 accumulators), 49 tiles
    as 16 x 3 + 1 rows, and an NHWC conv, which has no batch position, keeps one vector by 14
    pixels. Values checked where the host has AVX-512."""
    avx512 = parse_target("cpu -isa=avx512", threads=1, check_host=False)
    cases = []
    for params, vectors, rows in ((dict(C=64, H=14, W=14, K=64, pad=1, m=4), 4, 4),
                                  (dict(C=32, H=7, W=7, K=96, pad=1, m=4), 3, 4)):
        wl = make("winograd_gemm", params, "NHWC")
        space = SearchSpace(wl, avx512)
        tile = space.default()["tile"]
        assert space.out_axes == ["a", "b", "t", "k"] and space._batch_axes == {0, 1}
        assert tile[-1][2] == vectors * 16 and [t[2] for t in tile[:2]] == [1, 1] and tile[2][2] == rows
        cases.append((wl, space.steps(space.default())))
    conv = SearchSpace(make("conv2d", dict(C=32, H=14, W=14, K=64, R=3, S=3, stride=1, pad=1, bias=1), "NCHW16c"), avx512)
    assert conv._broadcast_vectors() == 0 and [t[2] for t in conv.default()["tile"]][1:] == [2, 1, 14, 16]
    avx2 = parse_target("cpu -isa=avx2", threads=1, check_host=False)
    wl = make("winograd_gemm", dict(C=64, H=14, W=14, K=64, pad=1, m=4), "NHWC")
    assert [t[2] for t in SearchSpace(wl, avx2).default()["tile"]] == [1, 1, 3, 32]
    seven = SearchSpace(make("winograd_gemm", dict(C=64, H=14, W=14, K=64, pad=1), "NHWC"), avx2)
    assert seven.out_shape[2] == 49 and seven.default()["tile"][2] == [1, 1, 3]
    nhwc = make("conv2d", dict(C=64, H=14, W=14, K=64, R=1, S=1, stride=1, pad=0, bias=1), "NHWC")
    assert [t[2] for t in SearchSpace(nhwc, avx2).default()["tile"]] == [1, 1, 14, 8]
    if host_isa() == "avx512":
        check_schedules(cases, avx512)


def test_a_winograd_gemm_whose_weights_at_a_position_outgrow_l2_passes_all_its_rows_over_each_column_panel():
    """Where one position's weights reach half of RESIDENT_BYTES (512 x 256 and wider), the default
    puts every row tile inside each column tile, so that the column's panel stays in cache; with
    more threads than the outer tiles then feed 4 each, some row tiles stay outside. Narrower
    weights, which L2 holds, keep the rows outside. Both compute the reference (AVX2 code, which
    every host that runs the tests runs)."""
    def target(threads):
        return parse_target(f"cpu -isa=avx2 -cores={threads}", threads=threads, check_host=False)
    wide = make("winograd_gemm", dict(C=512, H=6, W=6, K=256, pad=1), "NHWC")      # 16 positions, 9 rows
    narrow = make("winograd_gemm", dict(C=256, H=6, W=6, K=256, pad=1), "NHWC")
    assert SearchSpace(wide, target(1))._batch_constant_bytes == 512 * 256 * 4
    assert SearchSpace(wide, target(1)).default()["tile"][2] == [3, 1, 3]
    assert SearchSpace(wide, target(2)).default()["tile"][2] == [3, 1, 3]
    assert SearchSpace(wide, target(64)).default()["tile"][2] == [2, 1, 3]      # 16 x 8 outer tiles < 4 x 64
    assert SearchSpace(narrow, target(1)).default()["tile"][2] == [1, 1, 3]
    assert all(s.valid(s.default()) for s in (SearchSpace(w, target(t)) for w in (wide, narrow) for t in (1, 64)))
    check_schedules([(wide, None), (narrow, None)], parse_target("cpu -isa=avx2", threads=2))


def test_two_threads_split_the_larger_operand_of_a_conv_first_and_both_orders_compute_the_reference():
    """At 2 threads the fused parallel loop runs the outer tiles of the axes that index only the
    activation (rows, columns) first where the activation outweighs the weights, so each thread
    takes its own rows; else the output channel blocks first, each thread its share of the
    weights; and so for a grouped or depthwise conv, whose channel blocks split the activation
    too. Both are points of the space; a point logged before the decision runs the axes' order,
    and a DAG without constants has no such decision."""
    two = parse_target("cpu", threads=2)
    wide = make("conv2d", dict(C=32, H=14, W=14, K=32, R=1, S=1, stride=1, pad=0, bias=1), "NCHW16c")
    deep = make("conv2d", dict(C=256, H=2, W=2, K=64, R=1, S=1, stride=1, pad=0, bias=1), "NCHW16c")
    grouped = make("conv2d", dict(C=64, H=14, W=14, K=64, R=3, S=3, stride=1, pad=1, groups=16, bias=1), "NCHW4c")
    depthwise = make("conv2d", dict(C=32, H=14, W=14, K=32, R=3, S=3, stride=1, pad=1, groups=32, bias=1), "NCHW16c")
    cases = []
    for wl, default in ((wide, "input"), (deep, "axes"), (grouped, "axes"), (depthwise, "axes")):
        space = SearchSpace(wl, two)
        dec = space.default()
        assert space.parallel_orders == ("axes", "input") and dec["parallel"] == default
        n, k, h, w, b = (f"{a}.0" for a in space.out_axes)
        fused = {p: next(s for s in space.steps({**dec, "parallel": p}) if s[0] == "fuse")[2] for p in ("axes", "input")}
        assert fused == {"axes": [n, k, h, w, b], "input": [n, h, w, k, b]}
        old = {key: v for key, v in dec.items() if key != "parallel"}
        assert space.steps(old) == space.steps({**dec, "parallel": "axes"})
        cases += [(wl, space.steps({**dec, "parallel": p})) for p in ("axes", "input")]
    rng = random.Random(0)
    flips = [m for m in (mutate(space, dec, rng) for _ in range(300)) if m and m["parallel"] != dec["parallel"]]
    assert flips and all(dict(m, parallel=dec["parallel"]) == dec for m in flips)
    assert {space.sample(rng)["parallel"] for _ in range(40)} == {"axes", "input"}
    from tuner.search.optuna_search import _parameter_table
    assert ("parallel", ("parallel",), ["axes", "input"]) in _parameter_table(space)
    assert SearchSpace(wide, TARGET1).default()["parallel"] == "axes"        # one thread: its activation fits L2
    assert SearchSpace(make("max_pool2d", dict(C=16, H=8, W=8, R=3, S=3, stride=2, pad=1), "NCHW16c"),
                       two).parallel_orders == ()
    check_schedules(cases, two)


def test_one_thread_reads_an_activation_past_l2_once_where_each_register_tiles_weights_outgrow_l1():
    """At one thread the outer tiles run the activation's axes first (each channel block of the
    output inside them) where the activation the reduction reads outgrows L2, a register tile's
    weight panel L1, and the weights are a quarter of it or less; a residual read by the epilogue
    does not count (with it, the 22x22 conv's would pass L2)."""
    wide = make("conv2d", dict(C=512, H=28, W=28, K=512, R=1, S=1, stride=1, pad=0, bias=1), "NCHW16c")
    past = make("conv2d", dict(C=512, H=28, W=28, K=128, R=1, S=1, stride=1, pad=0, bias=1), "NCHW16c")
    residual = make("conv2d", dict(C=512, H=22, W=22, K=128, R=1, S=1, stride=1, pad=0, bias=1, residual=1), "NCHW16c")
    narrow = make("conv2d", dict(C=64, H=56, W=56, K=256, R=1, S=1, stride=1, pad=0, bias=1), "NCHW16c")
    for isa in ("avx2", "avx512"):
        one = parse_target(f"cpu -isa={isa} -threads=1")
        spaces = {name: SearchSpace(wl, one) for name, wl in
                  (("past", past), ("residual", residual), ("narrow", narrow), ("wide", wide))}
        assert {name: sp.default()["parallel"] for name, sp in spaces.items()} == \
            {"past": "input", "residual": "axes", "narrow": "axes", "wide": "axes"}, isa
        n, k, h, w, b = (f"{a}.0" for a in spaces["past"].out_axes)
        order = next(s for s in spaces["past"].steps(spaces["past"].default()) if s[0] == "reorder")[2]
        assert order[:5] == [n, h, w, k, b] and not any(s[0] == "fuse" for s in spaces["past"].steps(spaces["past"].default()))
    small = make("conv2d", dict(C=32, H=14, W=14, K=48, R=3, S=3, stride=1, pad=1, bias=1, relu=1), "NCHW16c")
    space = SearchSpace(small, TARGET1)
    check_schedules([(small, space.steps({**space.default(), "parallel": p})) for p in ("axes", "input")], TARGET1)


def test_a_blocked_output_transform_can_run_its_channel_blocks_inside_the_tiles():
    """`blocks: inside` moves an NCHW16c output transform's channel-block loop inside the tile
    loops, so each tile reads its alpha^2 rows of M once, contiguously, rather than a 64-byte
    piece of each in every channel block's pass (ResNet-50's 64-channel F(4,3) output transform
    at 56x56, AVX-512: 0.073 ms against 0.139), and so does the default (in the model at 2 threads
    its threads then split the tiles as the producer's did: 0.53x). A point logged before the
    decision existed gives the same steps as `outside`."""
    wl = make("winograd_output", dict(K=32, H=8, W=8, pad=1, m=2, bias=1, relu=1), "NCHW16c")
    space = SearchSpace(wl, TARGET1)
    assert space.choices()["blocks"] == ["outside", "inside"]
    dec = space.default()
    assert dec["blocks"] == "inside"
    dec = {**dec, "blocks": "outside"}
    old = {k: v for k, v in dec.items() if k != "blocks"}
    assert space.steps(old) == space.steps(dec)

    def loop_order(d):
        src = Task(wl, TARGET1).candidate(space.steps(d)).source
        return [line.split("int ")[1].split(" ")[0] for line in src.splitlines() if line.lstrip().startswith("for (int ")]
    _, kk, oh, ow, _ = space.out_axes           # n, channel blocks, rows, columns, block
    outside, inside = loop_order(dec), loop_order({**dec, "blocks": "inside"})
    assert outside.index(kk) < outside.index(f"{oh}_0") and inside.index(kk) > inside.index(f"{ow}_0")
    check_schedules([(wl, space.steps({**dec, "blocks": b})) for b in ("outside", "inside")], TARGET1)


def test_the_table_sketch_unrolls_the_matrix_axes_so_the_entries_are_constants():
    """In the output transform, the row of AT is the output index modulo m: split by m and
    unrolled, the modulo disappears from the C (the tiled sketch leaves it to run time)."""
    wl = make("winograd_output", dict(K=16, H=8, W=8, pad=1, m=2, bias=1))
    task = Task(wl, TARGET1)
    steps = task.space.steps(task.space.default())
    unrolled = {(s[1], s[2]) for s in steps if s[0] == "annotate" and s[3] == "unroll"}
    assert {("winograd_output", a) for a in ("oh", "ow", "i", "j")} <= unrolled
    assert " % " not in task.candidate(steps).source
    tiled = SearchSpace(wl, TARGET1)
    tiled.table = {}                       # the same DAG under the tiled sketch
    assert " % " in task.candidate(tiled.steps(tiled.default())).source


@pytest.mark.parametrize("wl", [make("conv2d", dict(C=16, H=6, W=20, K=16, R=3, S=3, pad=1, groups=16, bias=1,
                                                  act="silu"), "NCHW16c"),
                                make("dense", dict(N=12, C=16, K=64, bias=1, act="gelu"), "OI16o")],
                         ids=["depthwise-silu", "dense-gelu"])
def test_the_epilogue_over_a_register_sized_accumulator_tile_is_unrolled_and_over_a_larger_one_is_not(wl):
    """A loop over a local tile of at most REGISTER_TILE elements, with only unrolled or vector
    loops inside (the epilogue reading the accumulators back), is unrolled, so that every index
    into the tile is a constant; the reduction loops around the tile's FMAs are not, nor is the
    epilogue of a tile too large for the registers. Both compute the reference."""
    from tuner.schedule.lower import REGISTER_TILE
    space = SearchSpace(wl, TARGET1)
    small = space.default()
    out = space.out_shape
    big = dict(small, tile=[[1, 1, e] for e in out])            # the whole output in one tile
    assert math.prod(out) > REGISTER_TILE >= math.prod(t[2] for t in small["tile"])
    epilogue = {}
    for name, dec in (("small", small), ("big", big)):
        steps = space.steps(dec)
        f = lower(replay(*wl.build(), steps))
        [tile] = {s.buffer for s in ir.stmts(f.body) if isinstance(s, ir.Allocate)}
        loops = [s for s in ir.stmts(f.body) if isinstance(s, ir.For)]
        # the output stage's loops inside the register tile: its axes' innermost level, not vectorised
        epilogue[name] = [s for s in loops if s.var.startswith(space.output.name) and s.var.endswith("_2")
                          and s.kind != "vectorize" and s.extent > 1]
        reductions = [s for s in loops if s.var.rstrip("_01") in {r for r, _ in space.reduce_axes}]
        assert reductions and all(s.kind == "serial" for s in reductions if s.extent > 1)
        assert tile and epilogue[name]
        check_schedules([(wl, steps)])
    assert all(s.kind == "unroll" for s in epilogue["small"])
    assert all(s.kind == "serial" for s in epilogue["big"])


@pytest.mark.slow
def test_loops_over_a_small_padded_input_tile_unroll_only_up_to_a_bound_and_still_compute_the_reference():
    """A reduction over an input tile padded per tile (a local tile as small as a register tile)
    is unrolled only while the unrolled nest stays within UNROLL_MAX statements: this point of
    ResNet-50's last 3x3 conv, a tune's sample, unrolled 9504 vector FMAs behind bounds tests,
    and gcc had not finished it after 11 minutes."""
    from tuner.schedule.lower import UNROLL_MAX
    wl = make("conv2d", dict(C=512, H=7, W=7, K=512, R=3, S=3, pad=1, bias=1, relu=1), "NCHW16c")
    space = SearchSpace(wl, TARGET1)
    dec = {"pad": {"conv_pad": "tile"}, "tile": [[1, 1, 1], [1, 11, 3], [7, 1, 1], [7, 1, 1], [2, 1, 8]],
           "reduce": [2, 1, 3, 8], "unroll": 512, "epilogue": "apart", "order": "reversed", "parallel": "input",
           "prefetch": 1}
    steps = space.steps(dec)
    f = lower(replay(*wl.build(), steps))
    unrolled = [s for s in ir.stmts(f.body) if isinstance(s, ir.For) and s.kind == "unroll"]   # outermost: the largest
    reductions = [s for s in ir.stmts(f.body) if isinstance(s, ir.For) and s.var.rstrip("_01") in ("rh", "rcb")]
    assert unrolled and max(ir.nest_steps(s, vector_ops=True) for s in unrolled) <= UNROLL_MAX
    assert any(s.kind == "serial" and s.extent > 1 for s in reductions)     # the loops past the bound stay loops
    assert any(s.kind == "unroll" for s in reductions)                      # those within it are unrolled
    check_schedules([(wl, steps)])


@settings(max_examples=12, deadline=None)
@given(layout=st.sampled_from(["NCHW16c", "NCHW8c", "NHWC", "NCHW"]), c=st.sampled_from([16, 32, 48]),
       w=st.integers(5, 12), stride=st.sampled_from([1, 2]), grouped=st.booleans())
def test_a_tile_s_padded_input_is_copied_a_vector_row_at_a_time_where_its_innermost_axis_is_never_tested(
        layout, c, w, stride, grouped):
    """A pad copied per tile (`pad: tile`): its innermost axis, where the padding never falls
    (a channel block, NHWC's channels), is one vector select per row, not one scalar select per
    element (which the register-tile unroll took whole: GCC spilled their indices and the conv ran
    1.6x MetaSchedule's time); NCHW pads its innermost axis and stays scalar. Either way the
    reference."""
    wl = make("conv2d", dict(C=c, H=9, W=w, K=c, R=3, S=3, pad=1, stride=stride, groups=c // 16 if grouped else 1,
                             bias=1), layout)
    space = SearchSpace(wl, TARGET1)
    # the default's tiles: a sampled point may unroll more than GCC finishes in a test's time
    dec = {**space.default(), "pad": {"conv_pad": "tile"}}
    fn = lower(replay(*wl.build(), space.steps(dec)))
    copies = [s for s in ir.stmts(fn.body) if isinstance(s, ir.For) and s.var.startswith("conv_pad_")]
    innermost = [s for s in copies if not any(isinstance(x, ir.For) for x in ir.stmts(s.body))]
    assert innermost
    lanes = layout != "NCHW"
    assert all((s.kind == "vectorize") == lanes for s in innermost), [(s.var, s.kind) for s in innermost]
    code = generate_c(fn, TARGET1.lanes, TARGET1.threads)[0]
    assert bool(re.search(r"^\s*\*\(f32x\d+\*\)&conv_pad\[", code, re.M)) == (lanes and any(   # a vector store
        vector_split(s.extent, TARGET1.lanes)[0] for s in innermost))
    check_schedules([(wl, space.steps(dec))])


def test_a_flat_sketch_mutates_one_decision_to_another_legal_option():
    for wl in (WINOGRAD_TRANSFORMS[0], make("relu", dict(C=16, H=4, W=4), "NCHW16c")):
        space = SearchSpace(wl, TARGET1)
        choices, rng = space.choices(), random.Random(0)
        dec, seen = space.default(), set()
        for _ in range(200):
            new = mutate(space, dec, rng)
            changed = [k for k in choices if new[k] != dec[k]]
            assert len(changed) == 1 and new[changed[0]] in choices[changed[0]] and set(new) == set(choices)
            dec = new
            seen.add(json.dumps(dec, sort_keys=True))
        assert len(seen) == len(list(itertools.product(*choices.values())))


def test_simplifier_reads_a_block_in_another_block_size():
    cc, cb = Var("cc"), Var("cb")
    ranges = {"cc": (0, 31), "cb": (0, 7)}
    assert simplify((cc * 8 + cb) // 16, ranges) == cc // 2
    assert coefficient((cc * 8 + cb) % 16, "cb", ranges) == 1      # a unit stride: one vector load
    # a remainder that can reach the next block keeps the division
    assert isinstance(simplify((cc * 8 + cb + 1) // 16, ranges), FloorDiv)
    assert simplify((cc * 8 + cb + 1) // 16, ranges) != cc // 2


def _run_ir(s, env, out):
    """{indices: value} of every store a small IR nest makes (a store made twice fails)."""
    if isinstance(s, ir.Seq):
        for x in s.stmts:
            _run_ir(x, env, out)
    elif isinstance(s, ir.For):
        for v in range(s.extent):
            _run_ir(s.body, {**env, s.var: v}, out)
    elif isinstance(s, ir.IfThen):
        if _value(s.cond, env):
            _run_ir(s.body, env, out)
    else:
        k = tuple(_value(i, env) for i in s.indices)
        assert k not in out
        out[k] = _value(s.value, env)
    return out


def _value(e, env):
    from tuner.te import expr as E
    ops = {E.Add: lambda a, b: a + b, E.Sub: lambda a, b: a - b, E.Mul: lambda a, b: a * b,
           E.FloorDiv: lambda a, b: a // b, E.FloorMod: lambda a, b: a % b}
    if isinstance(e, E.Const):
        return e.value
    if isinstance(e, E.Var):
        return env[e.name]
    if isinstance(e, E.Cmp):
        a, b = _value(e.a, env), _value(e.b, env)
        return {"<": a < b, "<=": a <= b, "==": a == b}[e.op]
    if isinstance(e, E.And):
        return _value(e.a, env) and _value(e.b, env)
    return ops[type(e)](_value(e.a, env), _value(e.b, env))


@pytest.mark.slow
@given(coefs=st.lists(st.integers(-24, 24), min_size=1, max_size=3), const=st.integers(-20, 20),
       his=st.lists(st.integers(0, 9), min_size=3, max_size=3), c=st.integers(2, 24))
@settings(max_examples=300, deadline=None)
def test_simplified_div_and_mod_equal_the_original_everywhere(coefs, const, his, c):
    names = [f"v{i}" for i in range(len(coefs))]
    a = Const(const)
    for k, n in zip(coefs, names):
        a = a + Var(n) * k
    ranges = {n: (0, hi) for n, hi in zip(names, his)}
    d, m = simplify(a // c, ranges), simplify(a % c, ranges)
    for point in itertools.product(*(range(hi + 1) for hi in his[:len(names)])):
        env = dict(zip(names, point))
        assert _value(d, env) == _value(a, env) // c and _value(m, env) == _value(a, env) % c


@pytest.mark.slow
@given(coefs=st.lists(st.integers(0, 40), min_size=1, max_size=3), his=st.lists(st.integers(0, 9), min_size=3, max_size=3),
       c1=st.integers(2, 12), c2=st.integers(2, 12))
@settings(max_examples=200, deadline=None)
def test_divisions_of_divisions_simplify_to_the_original_everywhere(coefs, his, c1, c2):
    """A reshape chain's index, ((i + c*3136) / 56) / 56 and its remainders, as the C generator reads it."""
    names = [f"v{i}" for i in range(len(coefs))]
    a = Const(0)
    for k, n in zip(coefs, names):
        a = a + Var(n) * k
    ranges = {n: (0, hi) for n, hi in zip(names, his)}
    forms = [(a // c1) // c2, (a // c1) % c2, ((a // c1) // c2) % c1, a % (c1 * c2) // c1]
    simple = [simplify(f, ranges) for f in forms]
    for point in itertools.product(*(range(hi + 1) for hi in his[:len(names)])):
        env = dict(zip(names, point))
        assert [_value(f, env) for f in simple] == [_value(f, env) for f in forms]


def test_a_reshape_chains_index_loses_its_divisions_where_the_ranges_allow():
    i, c = Var("i"), Var("c")
    flat = i + c * 3136                  # (c, i) of a [128, 3136] tensor, read as [128, 56, 56] blocked by 16
    ranges = {"i": (0, 3135), "c": (0, 127)}
    assert simplify(((flat // 56) // 56) // 16, ranges) == c // 16
    assert simplify(flat % 56, ranges) == i % 56
    assert simplify((flat // 56) % 56, ranges) == i // 56


GEMMS = [make("dense", dict(N=12, C=40, K=48, bias=1, act="gelu")), make("dense", dict(N=7, C=30, K=10)),
         make("batch_matmul", dict(B=3, M=8, K=16, N=24)), make("dense", dict(N=16, C=8, K=64, bias=1, residual=1)),
         make("dense", dict(N=13, C=16, K=48, bias=1)), make("batch_matmul", dict(B=2, M=9, K=16, N=100))]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_default_gemm_tile_fits_the_registers_runs_every_row_under_a_column_tile_and_computes_the_reference(isa):
    """Accumulators in at most 3/4 of the vector registers (16 with AVX2, 32 with AVX-512), the
    columns in up to 3 vectors, and all row tiles at the second level, inside each column tile; rows
    with no divisor near the register budget (13) get full tiles and a guarded last one."""
    target = parse_target(f"cpu -isa={isa} -threads=1", check_host=False)
    cases = []
    for wl in GEMMS:
        space = SearchSpace(wl, target)
        dec = space.default()
        (r1, r2, r3), (c1, c2, c3) = dec["tile"][-2:]
        rows = space.out_shape[-2]
        assert space.valid(dec) and (r1 - 1) * r3 < rows <= r1 * r3 and r2 == c1 == c2 == 1
        assert c3 <= 3 * target.lanes and r3 * space._vectors(c3) <= (32 if target.lanes >= 16 else 16) * 3 // 4
        cases.append((wl, space.steps(dec)))
    assert cases
    if isa == TARGET1.isa or (isa == "avx2" and TARGET1.isa == "avx512"):      # runnable here
        check_schedules(cases, target)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_gemm_whose_column_panel_outgrows_l2_passes_its_row_tiles_over_each_chunk_of_it_and_computes_the_reference(
        isa):
    """Where one column tile's weight panel over the whole reduction reaches GEMM_PANEL_BYTES, the
    default blocks the reduction: the row tiles of a local tile inside each chunk of the panel
    (within GEMM_CHUNK_BYTES), with no prefetch call in the chunk's loop (it kept GCC from holding
    the accumulators in registers); a panel below it is not blocked."""
    from tuner.space import sketch
    target = parse_target(f"cpu -isa={isa} -threads=1", check_host=False)
    layout = "OI16o" if target.lanes == 16 else "OI8o"
    cases = []
    for n, c, blocked in ((32, 2 * sketch.GEMM_PANEL_BYTES // 64, True), (20, 2 * sketch.GEMM_PANEL_BYTES // 64, True),
                          (32, sketch.GEMM_PANEL_BYTES // 512, False)):
        wl = make("dense", dict(N=n, C=c, K=2 * target.lanes, bias=1), layout)
        space = SearchSpace(wl, target)
        dec = space.default()
        (r1, r2, r3), _ = dec["tile"]
        panel = space._panel_bytes(dec["tile"])
        assert space.valid(dec) and (panel >= sketch.GEMM_PANEL_BYTES) == blocked
        if blocked:
            [chunk] = dec["reduce"]
            assert (r1 * r2 - 1) * r3 < n <= r1 * r2 * r3 and r2 >= 2 and chunk < c and c % chunk == 0   # 20: guarded
            assert chunk * panel // c <= sketch.GEMM_CHUNK_BYTES and dec["prefetch"] == 0
            assert "__builtin_prefetch" not in Task(wl, target).candidate(space.steps(dec)).source
            cases.append((wl, space.steps(dec)))
        else:
            assert r2 == 1 and dec["reduce"] == [1]
    assert cases
    if isa == TARGET1.isa or (isa == "avx2" and TARGET1.isa == "avx512"):      # runnable here
        check_schedules(cases, target)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_a_gemm_whose_activation_outgrows_every_l2_passes_it_once_per_several_column_tiles_and_computes_the_reference(
        isa):
    """Where a 2-D GEMM's activation reaches WIDE_ACTIVATION_BYTES and every row fits one local
    tile beside two column tiles or more, the default's local tile holds every row and up to
    WIDE_TILES column tiles (within MAX_TILE_FLOATS), and the reduction is blocked so that a chunk
    of those columns' panel fits GEMM_CHUNK_BYTES; read through merged heads, a chunk is one head,
    so the inner loop reads affinely. Rows that need two local tiles, which would read the weights
    twice, are not blocked so."""
    from tuner.space import sketch
    target = parse_target(f"cpu -isa={isa} -threads=1", check_host=False)
    layout, cols = ("OI16o" if target.lanes == 16 else "OI8o"), 2 * target.lanes
    c = sketch.WIDE_ACTIVATION_BYTES // (4 * 32)
    cases = []
    for n, c, heads, wide in ((32, c, 0, True), (36, c, 0, True), (32, c, c // 64, True),
                              (sketch.MAX_TILE_FLOATS // (2 * cols) + 8, 2048, 0, False)):
        params = dict(N=n, C=c, K=4 * cols, bias=1, **({"in_heads": heads} if heads else {}))
        wl = make("dense", params, layout)
        space = SearchSpace(wl, target)
        assert (space._reduction_input_bytes >= sketch.WIDE_ACTIVATION_BYTES) == (4 * n * c >= sketch.WIDE_ACTIVATION_BYTES)
        dec = space.default()
        (r1, r2, r3), (c1, c2, c3) = dec["tile"]
        assert space.valid(dec)
        if not wide:
            assert 4 * n * c >= sketch.WIDE_ACTIVATION_BYTES and c2 == 1 and dec["reduce"] == [1]
            continue
        [chunk] = dec["reduce"]
        assert r1 == 1 and (r2 - 1) * r3 < n <= r2 * r3 and 2 <= c2 <= sketch.WIDE_TILES and c1 == 1
        assert r2 * r3 * c2 * c3 <= sketch.MAX_TILE_FLOATS and chunk * c2 * c3 * 4 <= sketch.GEMM_CHUNK_BYTES
        assert chunk == 64 if heads else (chunk < c and c % chunk == 0)
        source = Task(wl, target).candidate(space.steps(dec)).source
        assert " / 64" not in source and " % 64" not in source
        cases.append((wl, space.steps(dec)))
    assert len(cases) == 3
    if isa == TARGET1.isa or (isa == "avx2" and TARGET1.isa == "avx512"):      # runnable here
        check_schedules(cases, target)
    # with too few column tiles for 16 threads, one column tile a pass; rows read through heads still
    # go by chunks of one head, in row blocks (unblocked, a row tile's reads would stride across them)
    many = parse_target(f"cpu -isa={isa} -threads=16", check_host=False)
    c = sketch.WIDE_ACTIVATION_BYTES // (4 * 128)       # a column tile's panel under GEMM_PANEL_BYTES
    for heads in (c // 64, 0):
        wl = make("dense", dict(N=128, C=c, K=8 * cols, bias=1, **({"in_heads": heads} if heads else {})), layout)
        assert SearchSpace(wl, many)._panel_bytes(SearchSpace(wl, many).default()["tile"]) < sketch.GEMM_PANEL_BYTES
        dec = SearchSpace(wl, many).default()
        (r1, r2, _), (_, c2, _) = dec["tile"]
        assert c2 == 1 and (not heads or dec["reduce"] == [64] and r1 > 1 and r2 > 1)


@pytest.mark.parametrize("n, c, k, inside", [(12000, 180, 96, True), (12000, 64, 24, False), (784, 192, 192, False),
                                             (12000, 1024, 96, True), (12000, 1024, 384, False)])
def test_a_dense_over_a_streamed_activation_with_small_weights_runs_its_columns_inside_each_row_tile(n, c, k, inside):
    """Weights in L2 or L3, an activation read from memory (STREAMED_BYTES) and a long reduction:
    every column tile inside each row tile, so the activation is read once; else (a short reduction,
    an activation a cache holds, weights past RESIDENT_BYTES) the rows inside each column tile."""
    from tuner.space import sketch
    target = parse_target("cpu -threads=1")
    wl = make("dense", dict(N=n, C=c, K=k, bias=1))
    space = SearchSpace(wl, target)
    assert (4 * n * c > sketch.STREAMED_BYTES and 4 * c * k <= sketch.RESIDENT_BYTES
            and c >= sketch.LONG_REDUCTION) == inside
    dec = space.default()
    (r1, _, r3), (c1, _, c3) = dec["tile"][-2:]
    assert (r1, c1) == ((1, -(-k // c3)) if inside else (-(-n // r3), 1))
    if inside:
        check_schedules([(wl, space.steps(dec))], target)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("op, params, layout, aliased", [
    ("batch_matmul", dict(B=2, M=64, N=16, K=1024), "NN", True), ("batch_matmul", dict(B=2, M=64, N=16, K=2048), "NN", True),
    ("batch_matmul", dict(B=2, M=64, N=16, K=1040), "NN", False), ("dense", dict(N=64, C=1024, K=16, bias=0), "OI16o", True),
    ("batch_matmul", dict(B=2, M=64, N=16, K=1024), "NT", True)])
def test_a_gemm_tile_takes_no_more_rows_than_an_l1_set_holds_where_its_rows_reads_share_one(isa, op, params, layout, aliased):
    """16 rows of a 1024-long reduction (a row stride of 4 KiB: every row's read in one L1 set of 8
    ways) ran 1.7x the time of 8; a stride off 4 KiB (1040) keeps 16."""
    from tuner.space import sketch
    target = parse_target(f"cpu -isa={isa}", threads=1, check_host=False)
    wl = make(op, params, layout)
    space = SearchSpace(wl, target)
    rows = space.default()["tile"][-2][2]
    assert (space._rows_per_set(rows) > 1) == aliased and space._rows_per_set(rows) <= sketch.L1_SET_ROWS
    if not aliased and isa == "avx512":      # one vector of columns: the budget's 16 rows
        assert rows == 16
    if isa == host_isa() or host_isa() == "avx512":
        check_schedules([(wl, space.steps(space.default()))], target)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("params, inside", [(dict(B=8, M=1024, N=1024, K=16), True), (dict(B=12, M=128, N=128, K=64), False),
                                            (dict(B=8, M=1024, N=1024, K=256), False)])
def test_attention_scores_written_to_memory_run_their_columns_inside_each_row_tile(isa, params, inside):
    """Q x K^T of 1024 tokens by 16 (32 MB of scores) wrote its output in column strips 4 KiB apart
    (1.2-1.4x the time of row after row); scores a cache holds (BERT's 128 tokens) or a long
    reduction keep the rows inside each column tile."""
    from tuner.space import sketch
    target = parse_target(f"cpu -isa={isa}", threads=1, check_host=False)
    wl = make("batch_matmul", params, "NN")
    space = SearchSpace(wl, target)
    assert (4 * math.prod(space.out_shape) > sketch.STREAMED_BYTES and params["K"] < sketch.LONG_REDUCTION) == inside
    (r1, _, r3), (c1, _, c3) = space.default()["tile"][-2:]
    assert (r1, c1) == ((1, -(-params["N"] // c3)) if inside else (-(-params["M"] // r3), 1))


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("cols", [100, 1500, 200])
def test_gemm_columns_that_no_whole_vectors_divide_get_a_tile_of_three_vectors_with_a_guarded_last_one(isa, cols):
    """Whisper's 1500 keys had tiles of 60 columns (7 vectors of 8 lanes and 4 single lanes with
    AVX-512) by one row, the accumulators being counted as 15 vectors of 4; now 3 whole vectors and
    the rows the registers hold, the last column tile guarded, and the guarded widths are in the space."""
    target = parse_target(f"cpu -isa={isa} -threads=1", check_host=False)
    lanes = target.lanes
    space = SearchSpace(make("batch_matmul", dict(B=1, M=64, K=8, N=cols), "NT"), target)
    if any(cols % (k * lanes) == 0 for k in (1, 2, 3)):
        pytest.skip(f"{cols} columns take whole vectors with {isa}")
    (_, _, r3), (_, _, c3) = space.default()["tile"][-2:]
    assert c3 == 3 * lanes and r3 * 3 <= space.accumulator_budget and r3 >= space.accumulator_budget // 3 - 2
    assert {lanes, 2 * lanes, 3 * lanes} <= set(space.register_options(2))
    assert space._vectors(60) == 8           # 7 vectors of 8 lanes and one of 4, with either ISA


@pytest.mark.parametrize("heads,d,lead", [(12, 16, 1), (3, 8, 2), (1, 24, 1)])
def test_a_gemm_reading_merged_heads_splits_its_reduction_at_the_head_size_and_reads_them_without_division(
        heads, d, lead):
    """The output projection reads attention's context [heads, rows, d] as rows of heads * d: by
    default its reduction is split at d, so the whole tiles index the heads affinely (ViT's ran at
    2/3 the speed of its Q, K and V projections with a division and a remainder per element);
    with one head there is no period. The default computes the reference."""
    rows = 5
    p = dict(N=lead * rows, C=heads * d, K=32, bias=1, residual=1, in_heads=heads, **({"in_rows": rows} if lead > 1 else {}))
    wl = make("dense", p, "OI16o")
    space = SearchSpace(wl, TARGET1)
    dec = space.default()
    assert dec["reduce"] == [d if heads > 1 else 1]
    src = Task(wl, TARGET1).candidate(space.steps(dec)).source
    hot = [line for line in src.splitlines() if "data[" in line and " if (" not in line]
    assert hot
    if lead == 1 and heads > 1:                  # (with lead rows, the row index is divided: not the reduction's)
        assert not any("/" in line or "%" in line for line in hot), hot
    check_schedules([(wl, space.steps(dec))])


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 4), n=st.integers(1, 19), shift=st.integers(0, 2), target_reads=st.booleans())
def test_stages_computed_at_one_loop_cover_what_the_target_and_the_later_stages_there_read(rows, n, shift, target_reads):
    """a and b computed at the output's row loop: a is read by b at an offset (a[i, j + shift]) and,
    or not, by the output itself; a's row buffer covers both reads, whatever the offset."""
    import numpy as np

    from tuner.measure.builder import build_batch
    from tuner.te.tensor import compute, placeholder
    from tuner.toolchain.library import open_library, pointer_array
    x = placeholder((rows, n + shift), "x")
    a = compute((rows, n + shift), lambda i, j: x[i, j] * Const(2.0), "a", inputs=[x])
    b = compute((rows, n), lambda i, j: a[i, j] + a[i, j + shift], "b", inputs=[a])
    out = compute((rows, n), (lambda i, j: b[i, j] * a[i, j]) if target_reads else (lambda i, j: b[i, j] * Const(3.0)),
                  "out", inputs=[b, a] if target_reads else [b])
    steps = [["compute_at", "a", "out", "i0"], ["compute_at", "b", "out", "i0"]]
    fn = lower(replay([x], out, steps), "f")
    assert fn.buffers["a"].scope == "local" and fn.buffers["a"].shape[-1] == n + shift
    src, _ = generate_c(fn, TARGET1.lanes, 1)
    built = build_batch([("f", src)], TARGET1, jobs=1)[0]
    assert not built.error, built.error
    xs = np.random.default_rng(rows * 100 + n).standard_normal((rows, n + shift)).astype(np.float32)
    got = np.empty((rows, n), np.float32)
    assert open_library(built.lib).tuner_run(built.index, pointer_array([xs, got])) == 0
    av = xs * 2
    bv = av[:, :n] + av[:, shift:shift + n]
    np.testing.assert_allclose(got, bv * av[:, :n] if target_reads else bv * 3, rtol=1e-6)


@pytest.mark.parametrize("wl", [make("winograd_input", dict(C=16, H=9, W=9, pad=1, m=4), "NCHW8c"),
                                make("conv2d", dict(N=1, C=8, H=6, W=6, K=16, R=3, S=3, stride=1, pad=1))])
def test_a_threaded_loop_tells_the_c_compiler_its_range(wl):
    """OpenMP hands each thread its chunk at run time, so in the outlined body GCC knows nothing of
    the loop variable's range and cannot fold the index arithmetic and bounds tests over it (a
    Winograd input transform ran four times slower on two threads than on one): the body states it.
    Its index is a long, so that the / and % of a fused index reach the addresses unextended."""
    for threads in (1, 2):
        space = SearchSpace(wl, parse_target("cpu", threads=threads))
        src, _ = generate_c(lower(space.schedule(space.steps(space.default()))), space.target.lanes, threads)
        lines = src.splitlines()
        loops = [k for k, line in enumerate(lines) if "omp parallel for" in line]
        assert len(loops) == (threads > 1) == src.count("__builtin_unreachable")
        for k in loops:
            assert lines[k + 1].strip().startswith("for (long ")
            var, extent = lines[k + 1].split("long ")[1].split(" = 0; ")[0], lines[k + 1].split(" < ")[1].split(";")[0]
            assert lines[k + 2].strip() == f"if ({var} < 0 || {var} >= {extent}) __builtin_unreachable();"


def test_a_threaded_convs_weights_are_read_through_one_pointer_and_constant_offsets(tmp_path):
    """The ResNet stem's default in AVX2 code at 2 threads fuses output rows, columns and channel
    blocks into its parallel loop, and each weight vector's address holds the / and % of that index.
    Sign-extended from an int, each got a base register of its own in the register tile's loop (12
    for 12 FMAs) and the accumulators spilled; from a long, GCC folds them into one pointer."""
    import subprocess
    from tuner.codegen.c import PRELUDE
    from tuner.toolchain.cc import compiler
    task = Task(parse_spec("conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3", "NCHW16c"),
                parse_target("cpu -isa=avx2", threads=2))
    src = tmp_path / "k.c"
    src.write_text(PRELUDE + task.default_candidate().source)
    subprocess.run([compiler()[0], *task.target.cflags, "-fopenmp", "-S", str(src), "-o", str(tmp_path / "k.s")],
                   check=True, capture_output=True)
    blocks = re.split(r"\n\.L\d+:", (tmp_path / "k.s").read_text())
    hot = max(blocks, key=lambda b: b.count("vfmadd"))
    fmas = [line for line in hot.splitlines() if "vfmadd" in line and "(" in line]
    assert hot.count("vfmadd") >= 12 and fmas
    assert len({re.search(r"\((%\w+)", line).group(1) for line in fmas}) <= 2, hot


def test_an_index_condition_is_simplified_in_its_loops_ranges_before_it_reaches_c():
    """A concat read through a reshape tests ((i*28 + j) // 28) < 4: in the loops' ranges that is
    i < 4, and the C must say so (GCC kept the divisions: ShuffleNet's channel shuffles ran 1.7x
    slower with them)."""
    from tuner.te.expr import Const, FloorDiv, select
    from tuner.te.tensor import compute, placeholder
    a, b = placeholder((4, 28), "a"), placeholder((4, 28), "b")
    out = compute((8, 28), lambda i, j: select(FloorDiv(i * 28 + j, Const(28)) < 4, a[i, j], b[i - 4, j]), "cat",
                  inputs=[a, b])
    src, _ = generate_c(lower(Schedule([a, b], out)), 8, 1)
    body = src[src.index("cat["):]
    assert "? a[" in body and "/ 28" not in body and "28) < 4" not in body, body


def test_a_remainder_that_strips_nothing_stays_in_a_simplified_condition():
    """(t // 4) % 4 for t < 16 is t // 4, but GCC reads the bound from the remainder: a 2-thread
    Winograd input transform ran 1.7x slower without it. simplify keeps it when asked, and still
    strips what a remainder removes (multiples of its divisor)."""
    from tuner.te.expr import Const, FloorDiv, FloorMod, Var, simplify, walk
    t, k = Var("t"), Var("k")
    cond = FloorMod(FloorDiv(t, Const(4)), Const(4)) * Const(4) < k
    has_mod = lambda e: any(isinstance(n, FloorMod) for n in walk(e))       # noqa: E731
    assert not has_mod(simplify(cond, {"t": (0, 15)})) and has_mod(simplify(cond, {"t": (0, 15)}, keep_mods=True))
    assert simplify(FloorMod(t * Const(8) + Var("u"), Const(8)), {"t": (0, 15), "u": (0, 7)}, keep_mods=True) == Var("u")


def test_a_stage_too_big_to_inline_is_a_schedule_error_and_a_generic_group_computes_it_whole(monkeypatch, tmp_path,
                                                                                              tmp_cache):
    """Inlined reads copy a stage's body into its reader, indices and all: chains of reshapes of a tensor
    read twice grow as powers (Funnel's relative shifts took a compile past ten minutes). Past
    INLINE_LIMIT nodes the inline is an error, and the generic group falls back to computing each stage
    whole, with the same values."""
    import numpy as np
    import onnx
    from conftest import ort_run
    from onnx import TensorProto, helper, numpy_helper

    import tuner.schedule.lower as lowering
    from tuner.compiler import compile_model
    ins, out = CONV.build()
    sch = replay(ins, out, [["compute_inline", "conv_pad"]])
    lower(sch)
    monkeypatch.setattr(lowering, "INLINE_LIMIT", 5)
    with pytest.raises(ScheduleError, match=r"conv_pad inlined where it is read makes an expression of \d+ nodes"):
        lower(replay(ins, out, [["compute_inline", "conv_pad"]]))
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]),
             helper.make_node("Slice", ["r", "lo", "hi", "ax"], ["s"]),
             helper.make_node("Mul", ["s", "s"], ["y"])]
    inits = {"shape": np.array([1, 12, 10], np.int64), "lo": np.array([1], np.int64), "hi": np.array([11], np.int64),
             "ax": np.array([1], np.int64)}
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = np.random.default_rng(0).standard_normal((1, 10, 12)).astype(np.float32)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-6)


@pytest.mark.parametrize("src, dst, axis, tile", [("NCHW16c", "NCHW", "c", 16), ("NHWC", "NCHW", "c", 16),
                                                    ("NCHW", "NHWC", None, None), ("NCHW", "NCHW16c", None, None)])
def test_a_layout_transform_that_reads_across_its_rows_tiles_the_axis_its_input_is_contiguous_in(src, dst, axis, tile):
    """NCHW16c -> NCHW read c % 16 once per pass of the vector over a 56x56 plane, so each line came
    from L2 sixteen times; tiled, c's 16 run just outside the vector. NCHW -> NCHW16c and NCHW ->
    NHWC already use each line whole at neighbouring w: no tile."""
    space = SearchSpace(make("layout_transform", dict(C=64, H=56, W=56, dst=dst), src), parse_target("cpu -threads=1"))
    dec = space.default()
    assert dec.get("transpose") == tile
    if tile is None:
        assert "transpose" not in space.choices()
        return
    assert space.choices()["transpose"][0] == 1 and tile in space.choices()["transpose"]
    loops = space.schedule(space.steps(dec)).stage("layout_transform").leaves
    assert loops[-2:] == [f"{axis}.1", f"{space.out_axes[-1]}.1"]
    assert f"{axis}.0" in loops[:-2]


def test_an_injective_kernel_fuses_its_outer_loops_only_until_each_thread_has_a_grain_of_them():
    """All fused, NCHW -> NCHW16c at 2 threads ran one 16-lane vector per iteration of the parallel
    loop, with a div and a mod per index, slower than 1 thread; (n, cc, h) give 224 rows."""
    from tuner.space.sketch import PARALLEL_GRAIN
    space = SearchSpace(make("layout_transform", dict(C=64, H=56, W=56, dst="NCHW16c"), "NCHW"),
                        parse_target("cpu -threads=2"))
    steps = space.steps(space.default())
    par = [s for s in steps if s[0] == "annotate" and s[-1] == "parallel"]
    assert len(par) == 1 and par[0][2] == "n@cc@h"
    assert 4 < PARALLEL_GRAIN * 2 <= 4 * 56
    assert space.schedule(steps).stage("layout_transform").leaves[1:] == ["w", "cb.0", "cb.1"]


@pytest.mark.parametrize("k, block", [(180, 16), (1000, 16), (360, 16), (192, 16), (12, 4), (10, 10)])
def test_a_dense_weight_is_packed_in_the_layouts_block_the_last_one_padded_unless_it_covers_k(k, block):
    """K=180 in blocks of 4 had each 16-lane vector of weights gathered from four blocks, one lane at
    a time: Swin2SR's dense layers ran at 43 GFLOP/s; padded to 192 in blocks of 16, 82."""
    wl = make("dense", dict(N=3, C=20, K=k, bias=1), "OI16o")
    assert wl.blocks == (0, block)
    space = SearchSpace(wl, TARGET1)
    weight = next(t for t in space.inputs if len(t.shape) == 3)
    assert weight.shape == (-(-k // block), 20, block)
    check_schedules([(wl, space.steps(space.default()))])


@pytest.mark.parametrize("c, k", [(2048, 1000), (64, 100)])
def test_a_matrix_vector_products_column_tile_ends_where_a_packed_block_does(c, k):
    """A GEMV over weights packed in blocks of 16: a tile of 40 columns ended inside a block, so two
    tiles read each of its lines (2048 -> 1000: 1.14-1.19x the time of whole blocks)."""
    wl = make("dense", dict(N=1, C=c, K=k, bias=1), "OI16o")
    space = SearchSpace(wl, TARGET1)
    cols = space.default()["tile"][-1][2]
    assert space.vector_run == 16 and cols % 16 == 0 and cols <= 4 * TARGET1.lanes
    check_schedules([(wl, space.steps(space.default()))])


def _c_loops(code: str) -> list:
    """(pragma line or "", trip count, [indices of the loops inside]) of every `for` of generated C, in order."""
    lines = code.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("for (")]
    ends, depth = {}, []
    for i, ln in enumerate(lines):
        for ch in ln:
            if ch == "{":
                depth.append(i)
            elif ch == "}":
                ends[depth.pop()] = i
    return [(lines[h - 1].strip() if lines[h - 1].lstrip().startswith("#pragma") else "",
             re.search(r"< ([^;]+);", lines[h]).group(1), [k for k, g in enumerate(heads) if h < g < ends[h]])
            for h in heads]


@settings(max_examples=40, deadline=None)
@given(spec=st.sampled_from(["conv2d:N=1,C=64,H=7,W=7,K=64,R=1,S=1", "conv2d:N=1,C=512,H=7,W=7,K=64,R=1,S=1",
                             "conv2d:N=1,C=32,H=14,W=14,K=32,R=3,S=3,pad=1", "dense:N=6,C=96,K=48"]),
       isa=st.sampled_from(["avx2", "avx512"]), threads=st.sampled_from([1, 2]), seed=st.integers(-1, 10**6))
def test_generated_c_keeps_whole_every_loop_that_holds_a_loop_it_keeps(spec, isa, threads, seed):
    """A loop that the C keeps as a loop (no unroll or OpenMP pragma) and that holds another such
    loop is marked `unroll 1`, and no other is: GCC peels a short loop whole otherwise, and with it
    the register tile inside spilled (docs/history.md)."""
    layout = "NCHW16c" if spec.startswith("conv") else "OI16o"
    target = parse_target(f"cpu -isa={isa} -threads={threads}", check_host=False)
    task = Task(parse_spec(spec, layout), target)
    dec = task.space.default() if seed < 0 else task.space.sample(random.Random(seed))
    loops = _c_loops(generate_c(task.lowered(task.space.steps(dec)), target.lanes, threads)[0])
    assert loops
    # (a loop of one trip that the lowering unrolls is `unroll 1` too: a loop only in name)
    kept = [p in ("", "#pragma GCC unroll 1") and trips != "1" for p, trips, _ in loops]
    for (pragma, _, inside), keep in zip(loops, kept):
        if keep:
            assert (pragma == "#pragma GCC unroll 1") == any(kept[k] for k in inside), (pragma, inside)


@pytest.mark.parametrize("isa, c", [("avx2", 464), ("avx512", 1040)])
def test_a_reduction_over_a_prime_count_of_channel_blocks_is_not_cache_blocked(isa, c):
    """A 1x1 conv whose register tile's weights call for cache blocking, but whose 29 or 65 input
    channel blocks divide into no chunk of two blocks or more that fits PANEL_CHUNK, keeps its
    reduction whole: chunks of one block store and reload the tile every 16 channels (65 blocks in
    AVX-512: 1.12x the time). Twice the channels, two blocks a chunk at least, are blocked."""
    for channels, blocked in ((c, False), (2 * c, True)):
        wl = parse_spec(f"conv2d:N=1,C={channels},H=14,W=14,K=256,R=1,S=1,bias=1,relu=1", "NCHW16c")
        space = SearchSpace(wl, parse_target(f"cpu -isa={isa} -threads=1", check_host=False))
        dec = space.default()
        assert (dec["reduce"] != [1] * len(space.reduce_axes)) == blocked, dec["reduce"]
        if blocked:
            assert dec["reduce"][0] >= 2


@settings(max_examples=30, deadline=None)
@given(blocks=st.integers(17, 66), hw=st.integers(2, 15), kb=st.integers(1, 6), stride=st.sampled_from([1, 2]),
       layout=st.sampled_from(["NCHW16c", "NCHW8c"]), isa=st.sampled_from(["avx2", "avx512"]),
       threads=st.sampled_from([1, 2]), residual=st.booleans())
def test_the_default_1x1_conv_over_many_channels_computes_the_reference_blocked_or_not(
        blocks, hw, kb, stride, layout, isa, threads, residual):
    """A 1x1 conv over 272 to 1056 input channels, whose default may block its reduction (chunks of
    16 KiB of weights, rows of tiles widened, odd and prime counts of blocks, rows that no register
    tile divides), computes the reference in AVX2 and AVX-512 code at 1 and 2 threads."""
    assume(isa == "avx2" or host_isa() == "avx512")
    wl = parse_spec(f"conv2d:N=1,C={16 * blocks},H={hw},W={hw},K={16 * kb},R=1,S=1,stride={stride},bias=1,"
                    f"relu=1{',residual=1' if residual else ''}", layout)
    check_schedules([(wl, None)], parse_target(f"cpu -isa={isa} -threads={threads}", check_host=False))


def test_the_reads_through_a_chain_of_views_keep_their_index_math_small():
    """Views composed without simplifying grow their index math with each one (80,000 characters
    through BAT's attention in timm's bat_resnext26ts: 3.6 s a sketch): reshapes between 4-D and
    5-D, 3-D and channels-last, and a concat of two swapped channel halves, twice over, read x
    through indices of under a hundred nodes, and the reads still name both halves."""
    from tuner.ops.shape import concat, reshape, strided_slice
    from tuner.te.tensor import placeholder
    x = y = placeholder((1, 64, 8, 8), "x")
    for i, shape in enumerate([(1, 4, 16, 8, 8), (1, 64, 64), (1, 8, 8, 64), (1, 64, 8, 8)] * 2):
        y = reshape(y, shape, f"r{i}")
        if len(shape) == 4 and shape[1] == 64:
            halves = [strided_slice(y, [0, c, 0, 0], [1, 1, 1, 1], (1, 32, 8, 8), f"s{i}_{c}") for c in (0, 32)]
            y = concat(halves[::-1], 1, f"c{i}")
    space = SearchSpace(None, parse_target("cpu -isa=avx512", threads=1, check_host=False), ([x], y))
    reads = space._input_reads
    assert len(reads) >= 2 and {b for b, _ in reads} == {"x"}
    assert max(sum(1 for _ in walk(i)) for _, idx in reads for i in idx) < 100


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=2, max_size=4), width=st.integers(1, 20))
def test_a_concat_along_a_serial_loop_runs_as_a_loop_per_input_without_selects(sizes, width):
    """Concat along axis 0 of inputs [n_k, width]: the select chain on the row is cut where each
    test turns (schedule.peel.partition_selects), so no row runs a select, and every row is its
    input's."""
    from tuner.ops.shape import concat
    from tuner.te.tensor import placeholder
    from tuner.toolchain.library import open_library, pointer_array
    from tuner.measure.builder import build_batch
    ins = [placeholder((n, width), f"x{k}") for k, n in enumerate(sizes)]
    out = concat(ins, 0, "cat")
    fn = lower(replay(ins, out, []), "cat_kernel")
    selects = [n for s in ir.stmts(fn.body) if isinstance(s, ir.Store) for n in walk(s.value) if isinstance(n, Select)]
    assert not selects
    assert sum(isinstance(s, ir.Store) for s in ir.stmts(fn.body)) == len(sizes)     # one per input
    src, omp = generate_c(fn, TARGET1.lanes, 1)
    [built] = build_batch([("cat_kernel", src)], TARGET1, openmp=omp, jobs=1)
    assert not built.error, built.error
    rng = np.random.default_rng(sum(sizes) * width)
    xs = [rng.standard_normal((n, width)).astype(np.float32) for n in sizes]
    got = np.full((sum(sizes), width), np.nan, np.float32)
    assert open_library(built.lib).tuner_run(built.index, pointer_array(xs + [got])) == 0
    np.testing.assert_array_equal(got, np.concatenate(xs))


def test_a_concat_at_two_threads_runs_its_heads_in_parallel_and_its_axis_as_a_loop_per_input():
    """[1, 8, 40, 64] keys and one new row appended: the eight heads give each of two threads
    work, so the concat's axis is not fused into the parallel loop and stays cut (no select)."""
    from tuner.ops.shape import concat
    from tuner.te.tensor import placeholder
    ins = [placeholder((1, 8, 40, 64), "past"), placeholder((1, 8, 1, 64), "new")]
    out = concat(ins, 2, "present")
    space = SearchSpace(None, parse_target("cpu -threads=2"), (ins, out))
    steps = space.steps(space.default())
    assert ["annotate", "present", "present_i0@present_i1", "parallel"] in steps
    fn = lower(replay(ins, out, steps), "present_kernel")
    assert not [n for s in ir.stmts(fn.body) if isinstance(s, ir.Store) for n in walk(s.value) if isinstance(n, Select)]
