"""Property: every legal schedule the space (or a user) can write computes the reference.

Schedules are drawn from the sketch space and then pushed past what the space itself samples:
split factors that do not divide their axis (guards; for the Winograd transforms' table sketch a
vector length that does not divide the channels), and the pad stage computed inside the
accumulator's loops at a random depth (bound inference over overlapping windows).
"""
import random

import pytest
from conftest import TARGET1, check_schedules
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tuner.ops import make
from tuner.space.sketch import SearchSpace

pytestmark = pytest.mark.slow

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def conv_workloads(draw):
    layout = draw(st.sampled_from(["NCHW", "NHWC", "NCHW8c", "NCHW16c"]))
    r = draw(st.sampled_from([1, 3]))
    depthwise = draw(st.booleans()) and layout != "NCHW" and r == 3
    c = draw(st.sampled_from([8, 16]))
    k = c if depthwise else draw(st.sampled_from([8, 16]))
    p = dict(C=c, H=draw(st.integers(5, 9)), W=draw(st.integers(5, 9)), K=k, R=r, S=r,
             stride=draw(st.sampled_from([1, 2])), pad=draw(st.sampled_from([0, 1])) if r == 3 else 0,
             groups=c if depthwise else 1, bias=int(draw(st.booleans())), relu=int(draw(st.booleans())))
    if layout.startswith("NCHW") and layout != "NCHW" and not depthwise:
        p["ib"] = draw(st.sampled_from([4, 8, 16]).filter(lambda b: c % b == 0))   # the input read in another block
    return make("conv2d", p, layout)


def _perturbed_steps(wl, seed: int, odd_splits: bool, pad_at: bool) -> list:
    space = SearchSpace(wl, TARGET1)
    rng = random.Random(seed)
    dec = space.sample(rng)
    if odd_splits and space.kind == "table":      # a vector length that need not divide the channels
        if wl.p["m"] == 2:        # F(4,3)'s unrolled 6x6 tables with such a length take GCC minutes
            dec["vec"] = rng.randint(1, 12)
    elif odd_splits:
        dec["tile"] = [[rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 5)] if d != len(dec["tile"]) - 1
                       else t for d, t in enumerate(dec["tile"])]
        dec["reduce"] = [rng.randint(1, 4) for _ in dec["reduce"]]
    steps = space.steps(dec)
    if pad_at and space.kind == "tiled" and space.pads and dec["pad"][space.pads[0]] == "root":
        local = space.reduction_stage(dec)
        sch = space.schedule(steps)
        leaves = sch.stage(local).leaves
        steps.append(["compute_at", space.pads[0], local, rng.choice(leaves)])
    return steps


@SETTINGS
@given(wl=conv_workloads(), seed=st.integers(0, 10**6), odd=st.booleans(), pad_at=st.booleans())
def test_sampled_conv_schedules_compute_the_reference(wl, seed, odd, pad_at):
    check_schedules([(wl, _perturbed_steps(wl, seed, odd, pad_at))])


@SETTINGS
@given(n=st.integers(1, 3), c=st.integers(3, 40), k=st.sampled_from([8, 12, 16, 20, 32]),
       layout=st.sampled_from(["OI", "OI16o", "OI4o"]), bias=st.booleans(), seed=st.integers(0, 10**6),
       odd=st.booleans())
def test_sampled_dense_schedules_compute_the_reference(n, c, k, layout, bias, seed, odd):
    wl = make("dense", dict(N=n, C=c, K=k, bias=int(bias)), layout)
    check_schedules([(wl, _perturbed_steps(wl, seed, odd, False))])


@SETTINGS
@given(n=st.integers(1, 20), c=st.integers(3, 40), k=st.sampled_from([8, 16, 24]), residual=st.booleans(),
       seed=st.integers(0, 10**6), odd=st.booleans())
def test_sampled_dense_schedules_over_rows_with_a_residual_compute_the_reference(n, c, k, residual, seed, odd):
    wl = make("dense", dict(N=n, C=c, K=k, bias=1, residual=int(residual)), "OI16o")
    check_schedules([(wl, _perturbed_steps(wl, seed, odd, False))])


@SETTINGS
@given(b=st.integers(1, 6), m=st.integers(1, 20), k=st.integers(1, 24), n=st.integers(1, 20),
       layout=st.sampled_from(["NN", "NT"]), seed=st.integers(0, 10**6), odd=st.booleans())
def test_sampled_batch_matmul_schedules_compute_the_reference(b, m, k, n, layout, seed, odd):
    wl = make("batch_matmul", dict(B=b, M=m, K=k, N=n), layout)
    check_schedules([(wl, _perturbed_steps(wl, seed, odd, False))])


@SETTINGS
@given(lead=st.integers(1, 2), heads=st.integers(1, 4), m=st.integers(1, 12), k=st.integers(1, 12),
       n=st.integers(1, 12), a_heads=st.booleans(), b_heads=st.booleans(), layout=st.sampled_from(["NN", "NT"]),
       seed=st.integers(0, 10**6), odd=st.booleans())
def test_sampled_batch_matmul_schedules_reading_operands_as_heads_compute_the_reference(
        lead, heads, m, k, n, a_heads, b_heads, layout, seed, odd):
    """An operand stored [B / heads, rows, heads * cols] (a projection's output) and read as its
    heads gives the product of the heads split beforehand, under any sampled schedule."""
    p = dict(B=lead * heads, M=m, K=k, N=n)
    p.update({key: heads for key, on in (("a_heads", a_heads), ("b_heads", b_heads)) if on})
    check_schedules([(make("batch_matmul", p, layout), _perturbed_steps(make("batch_matmul", p, layout), seed, odd,
                                                                         False))])


@SETTINGS
@given(lead=st.integers(1, 3), heads=st.integers(1, 4), rows=st.integers(1, 10), d=st.integers(1, 8),
       k=st.sampled_from([8, 16, 24]), seed=st.integers(0, 10**6), odd=st.booleans())
def test_sampled_dense_schedules_reading_their_data_as_merged_heads_compute_the_reference(lead, heads, rows, d, k,
                                                                                           seed, odd):
    """Data stored as heads [lead, heads, rows, d] and read as rows of heads * d (attention's
    context into its output projection) under any sampled schedule."""
    p = dict(N=lead * rows, C=heads * d, K=k, bias=1, residual=1, in_heads=heads)
    if lead > 1:
        p["in_rows"] = rows
    wl = make("dense", p, "OI16o")
    check_schedules([(wl, _perturbed_steps(wl, seed, odd, False))])


@st.composite
def winograd_workloads(draw):
    """One of the three Winograd kernels of a small 3x3 convolution, F(2,3) or F(4,3)."""
    op = draw(st.sampled_from(["winograd_input", "winograd_gemm", "winograd_output"]))
    p = dict(C=draw(st.sampled_from([8, 16])), H=draw(st.integers(3, 9)), W=draw(st.integers(3, 9)),
             K=draw(st.sampled_from([8, 16])), pad=draw(st.sampled_from([0, 1, 2])), m=draw(st.sampled_from([2, 4])))
    if op == "winograd_output":
        del p["C"]
        p.update(bias=int(draw(st.booleans())), residual=int(draw(st.booleans())), relu=int(draw(st.booleans())))
    elif op == "winograd_input":
        del p["K"]
    return make(op, p)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wl=winograd_workloads(), seed=st.integers(0, 10**6), odd=st.booleans())
def test_sampled_winograd_schedules_compute_the_reference(wl, seed, odd):
    check_schedules([(wl, _perturbed_steps(wl, seed, odd, False))])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(["NCHW", "NHWC", "NCHW4c", "NCHW8c", "NCHW16c"]),
       dst=st.sampled_from(["NCHW", "NHWC", "NCHW4c", "NCHW8c", "NCHW16c"]),
       c=st.sampled_from([16, 32, 48]), seed=st.integers(0, 10**6), vec=st.integers(1, 20))
def test_layout_transform_schedules_compute_the_reference(src, dst, c, seed, vec):
    """Blocked layouts read in another block size are where the simplifier turns (cc*8 + cb) // 16
    into cc // 2 (a vector load); a vector length that straddles blocks must stay exact."""
    if src == dst:
        return
    wl = make("layout_transform", dict(C=c, H=3, W=4, dst=dst), src)
    inner = {"NCHW": "w", "NHWC": "c"}.get(dst, "cb")
    steps = [["split", "layout_transform", inner, [vec]], ["annotate", "layout_transform", f"{inner}.1", "vectorize"]]
    sampled = SearchSpace(wl, TARGET1)
    check_schedules([(wl, steps), (wl, sampled.steps(sampled.sample(random.Random(seed))))])


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(["NCHW", "NHWC", "NCHW8c", "NCHW16c"]), dst=st.sampled_from(["NCHW", "NHWC", "NCHW16c"]),
       c=st.sampled_from([3, 16, 20, 48]), h=st.integers(12, 16), w=st.integers(22, 30), threads=st.integers(1, 3))
def test_a_transposed_layout_transform_computes_the_reference_with_every_tile_and_thread_count(src, dst, c, h, w,
                                                                                            threads):
    """A read whose contiguous dimension another output axis indexes (NCHW16c -> NCHW) tiles that
    axis inside the loops that run over the rest; the outer loops fused up to a grain per thread."""
    assume(src != dst)
    from tuner.target import parse_target
    wl = make("layout_transform", dict(C=c, H=h, W=w, dst=dst), src)
    space = SearchSpace(wl, parse_target("cpu", threads=threads))
    tiles = space.choices().get("transpose", [1])
    decs = [{**space.default(), "vec": vec, "transpose": t} for t in tiles for vec in space.injective_vecs[-2:]]
    check_schedules([(wl, space.steps(dec)) for dec in decs], target=space.target)
