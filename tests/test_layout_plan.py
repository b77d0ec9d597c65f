"""Graph-level layout selection: the solver against brute force, and plans on real graphs."""
from __future__ import annotations

import dataclasses
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.graph.layout_plan import LayoutProblem, brute_force, solve

LAYOUTS = ("NCHW", "NHWC", "NCHW8c", "NCHW16c")


def _problem(draw, edges: list, n: int) -> LayoutProblem:
    cost = st.floats(0.0, 10.0, allow_nan=False)
    domains = {f"v{i}": tuple(draw(st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=4, unique=True)))
               for i in range(n)}
    unary = {v: {lay: draw(cost) for lay in d} for v, d in domains.items()}
    pairs = {(f"v{a}", f"v{b}"): {(x, y): (0.0 if x == y else draw(cost))
                                  for x in domains[f"v{a}"] for y in domains[f"v{b}"]} for a, b in edges}
    return LayoutProblem(domains, unary, pairs)


@st.composite
def chains(draw):
    n = draw(st.integers(1, 6))
    return _problem(draw, [(i, i + 1) for i in range(n - 1)], n)


@st.composite
def residual_graphs(draw):
    """Blocks of ResNet: x -> a -> b -> c, and x joins c's residual add (the edge x -> c);
    downsampling blocks add a shortcut convolution d (x -> d -> c)."""
    n, edges, x = 1, [], 0
    for _ in range(draw(st.integers(1, 3))):
        a, b, c = n, n + 1, n + 2
        edges += [(x, a), (a, b), (b, c)]
        n += 3
        if draw(st.booleans()):
            edges += [(x, n), (n, c)]
            n += 1
        else:
            edges.append((x, c))
        x = c
    return _problem(draw, edges, n)


@st.composite
def branchy_graphs(draw):
    """Random DAGs in graph order: each variable joins up to three earlier ones (inception-like)."""
    n = draw(st.integers(2, 6))
    edges = {(a, b) for b in range(1, n) for a in draw(st.lists(st.integers(0, b - 1), max_size=3))}
    return _problem(draw, sorted(edges), n)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.one_of(chains(), residual_graphs(), branchy_graphs()))
def test_the_plan_is_as_cheap_as_brute_force(problem):
    plan, best = solve(problem), brute_force(problem)
    assert plan.exact
    assert math.isclose(plan.cost, best.cost, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(problem.cost(plan.layouts), plan.cost, rel_tol=1e-9, abs_tol=1e-12)
    assert set(plan.layouts) == set(problem.domains)
    assert all(plan.layouts[v] in d for v, d in problem.domains.items())


def _chain3(transform: float) -> LayoutProblem:
    """a -> b -> c; b is faster in NHWC, a and c in NCHW16c."""
    d = ("NHWC", "NCHW16c")
    unary = {"a": {"NHWC": 2.0, "NCHW16c": 1.0}, "b": {"NHWC": 1.0, "NCHW16c": 1.5},
             "c": {"NHWC": 2.0, "NCHW16c": 1.0}}
    t = {("NHWC", "NCHW16c"): transform, ("NCHW16c", "NHWC"): transform}
    return LayoutProblem({"a": d, "b": d, "c": d}, unary, {("a", "b"): t, ("b", "c"): t})


def test_the_plan_follows_the_measured_transform_costs():
    assert solve(_chain3(0.1)).layouts == {"a": "NCHW16c", "b": "NHWC", "c": "NCHW16c"}    # cheap transforms
    assert solve(_chain3(0.5)).layouts == {"a": "NCHW16c", "b": "NCHW16c", "c": "NCHW16c"}  # dear ones


def test_a_frontier_past_the_state_limit_is_cut_and_the_plan_says_so():
    n = 8           # v0 joins every later one and they form a chain: frontier (v0, v_i), 16 states
    domains = {f"v{i}": LAYOUTS for i in range(n)}
    unary = {v: {lay: 1.0 + k for k, lay in enumerate(LAYOUTS)} for v in domains}
    pairs = {("v0", f"v{i}"): {(a, b): 0.5 for a in LAYOUTS for b in LAYOUTS if a != b} for i in range(1, n)}
    pairs.update({(f"v{i}", f"v{i + 1}"): pairs[("v0", "v1")] for i in range(1, n - 1)})
    p = LayoutProblem(domains, unary, pairs)
    cut, full = solve(p, max_states=8), solve(p)
    assert not cut.exact and full.exact
    assert cut.states <= 8 * len(LAYOUTS)
    assert full.layouts == dict.fromkeys(domains, "NCHW") and cut.cost >= full.cost


# ---------------------------------------------------------------- plans on real graphs

import random  # noqa: E402

from tuner.graph.layout_plan import model_layouts  # noqa: E402
from tuner.graph.models import googlenet, mobilenet_v2, resnet, tiny  # noqa: E402

pytest.importorskip("onnxruntime")
from test_runtime import _inception_like, assert_matches_onnxruntime  # noqa: E402

from tuner.compiler import compile_model  # noqa: E402


def _kernels_as_priced(m, space, plan: dict) -> tuple:
    """(the compiled model's anchored non-dense steps, {workload key: how often the solver priced
    it}), asserting every such step runs a kernel the plan was priced with."""
    priced = space.used(plan)
    tasks = [s for s in m.steps if s.anchor and not s.workload.startswith("dense")]
    assert all(s.workload_key in priced for s in tasks), [s.workload for s in tasks if s.workload_key not in priced]
    return tasks, priced


@pytest.mark.slow
@pytest.mark.parametrize("make", [tiny, _inception_like, lambda: resnet(18, image=32), lambda: googlenet(image=32),
                                  lambda: mobilenet_v2(image=32)],
                         ids=["tiny", "inception", "resnet18", "googlenet", "mobilenet_v2"])
def test_a_mixed_layout_plan_compiles_to_the_same_output_and_to_the_tasks_it_was_priced_with(tmp_cache, make):
    g = make()
    space = model_layouts(g)
    rng = random.Random(0)
    assert len(space.domains) >= 3 and any(len(d) > 2 for d in space.domains.values())
    plan = {v: rng.choice(d) for v, d in space.domains.items()}
    assert len(set(plan.values())) > 1
    m = compile_model(g, threads=1, layout_plan=plan)
    assert_matches_onnxruntime(m, g)
    assert m.meta["layout_plan"] == plan
    # every kernel the plan runs is one the solver priced it with (MobileNetV2 adds the skip first:
    # its residual add once followed the skip's layout and left the conv's fused task unrun)
    tasks, priced = _kernels_as_priced(m, space, plan)
    assert tasks
    runs = {k: sum(s.workload_key == k for s in tasks) for k in {s.workload_key for s in tasks}}
    assert all(n <= priced[k] for k, n in runs.items())


@pytest.mark.slow
def test_winograd_is_a_conv_choice_the_plan_prices_and_compiles(tmp_cache):
    """3x3 stride-1 convs may run as Winograd F(2x2,3x3) or F(4x4,3x3): three kernels priced as
    the conv's cost in that choice, NHWC around it (no transform to an NHWC neighbour)."""
    g = resnet(18, image=32)
    space = model_layouts(g, ("NCHW", "NHWC", "NCHW16c", "winograd2", "winograd4"))
    wino = [v for v, d in space.domains.items() if "winograd2" in d]
    others = [v for v, d in space.domains.items() if "winograd2" not in d]
    assert len(wino) >= 8 and others                    # the 7x7 stem and the strided convs cannot
    assert all(d == ("NCHW", "NHWC", "NCHW16c") for v, d in space.domains.items() if v in others)
    v = wino[0]
    assert [wl.op for wl in space.unary[v]["winograd4"]] == ["winograd_input", "winograd_gemm", "winograd_output"]
    assert all(not {("NHWC", "winograd2"), ("winograd2", "NHWC")} & set(t) for t in space.pairs.values())
    assert any(("NCHW16c", "winograd2") in t for t in space.pairs.values())
    rng = random.Random(3)
    plan = {v: rng.choice(d) for v, d in space.domains.items()}
    assert {"winograd2", "winograd4"} <= set(plan.values())
    m = compile_model(g, threads=1, layout_plan=plan)
    assert_matches_onnxruntime(m, g)
    tasks, _ = _kernels_as_priced(m, space, plan)
    assert sum(s.workload.startswith("winograd_gemm") for s in tasks) == \
        sum(lay.startswith("winograd") for lay in plan.values())


@pytest.mark.slow
def test_a_blocked_winograd_choice_needs_no_transform_among_blocked_convs(tmp_cache):
    """winograd<m>@NCHW16c reads and writes NCHW16c: beside NCHW16c convs its edges cost nothing,
    its transforms are tasks in that layout, and a plan of it compiles with no transform between
    convs and matches ONNX Runtime (a mix of blocks included)."""
    from tuner.graph.passes import optimize
    from tuner.graph.passes.convert_layout import data_path_transforms
    g = resnet(18, image=32)
    space = model_layouts(g, ("NCHW16c", "winograd2@NCHW16c", "winograd4@NCHW8c", "winograd4"))
    wino = [v for v, d in space.domains.items() if "winograd2@NCHW16c" in d]
    assert len(wino) >= 8
    v = wino[0]
    assert [(wl.op, wl.layout) for wl in space.unary[v]["winograd2@NCHW16c"]] == \
        [("winograd_input", "NCHW16c"), ("winograd_gemm", "NHWC"), ("winograd_output", "NCHW16c")]
    assert [wl.layout for wl in space.unary[v]["winograd4@NCHW8c"]][::2] == ["NCHW8c", "NCHW8c"]
    pairs = [t for t in space.pairs.values() if ("winograd2@NCHW16c", "winograd4@NCHW8c") in t]
    assert pairs and all(("NCHW16c", "winograd2@NCHW16c") not in t for t in pairs)
    assert all([wl.layout, wl.p["dst"]] == ["NCHW16c", "NHWC"] for t in pairs for wl in t[("winograd2@NCHW16c", "winograd4")])
    every = {v: ("winograd2@NCHW16c" if v in wino else "NCHW16c") for v in space.domains}
    plain = optimize(g, layout="NCHW16c")
    assert data_path_transforms(optimize(g, layout="NCHW16c", layout_plan=every)) == data_path_transforms(plain)
    assert_matches_onnxruntime(compile_model(g, threads=1, layout_plan=every), g)
    rng = random.Random(5)
    mixed = {v: rng.choice(d) for v, d in space.domains.items()}
    assert {"winograd2@NCHW16c", "winograd4@NCHW8c", "winograd4"} <= set(mixed.values())
    m = compile_model(g, threads=1, layout_plan=mixed)
    assert_matches_onnxruntime(m, g)
    _kernels_as_priced(m, space, mixed)


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: resnet(18, image=32), lambda: mobilenet_v2(image=32), _inception_like],
                         ids=["resnet18", "mobilenet_v2", "inception"])
def test_a_conv_reading_another_block_fuses_the_transform_into_its_loads(tmp_cache, make):
    """NCHW16c>NCHW8c: a groups=1 conv reads NCHW16c and writes NCHW8c, its task the NCHW8c conv
    with ib=16; after an NCHW16c conv its data edge costs nothing; a random plan of such choices
    runs the tasks it was priced with and matches ONNX Runtime; depthwise convs do not take them."""
    g = make()
    choices = ("NCHW8c", "NCHW16c", "NCHW16c>NCHW8c", "NCHW8c>NCHW16c")
    space = model_layouts(g, choices)
    fused = [v for v, d in space.domains.items() if "NCHW16c>NCHW8c" in d]
    assert fused and all(set(space.domains[v]) <= set(choices) and "NCHW8c" in space.domains[v] for v in fused)
    assert all("NCHW16c>NCHW8c" not in d for v, d in space.domains.items()
               if next(n for n in g.nodes if n.name == v).attrs.get("groups", 1) > 1)
    wls = {wl.key: wl for v in fused for wl in space.unary[v]["NCHW16c>NCHW8c"] if wl.op == "conv2d"}
    assert any(wl.p.get("ib") == 16 and wl.layout == "NCHW8c" for wl in wls.values())
    # into a conv reading NCHW16c, a data edge from an NCHW16c conv is free (a residual operand still
    # goes to the NCHW8c it writes); from an NCHW8c conv the data edge needs NCHW16c
    into = [t for (u, v), t in space.pairs.items() if v in fused]
    assert into and all(wl.p["dst"] == "NCHW8c" for t in into for wl in t.get(("NCHW16c", "NCHW16c>NCHW8c"), []))
    assert any(wl.p["dst"] == "NCHW16c" for t in into for wl in t.get(("NCHW8c", "NCHW16c>NCHW8c"), []))
    rng = random.Random(1)
    mixed = next(p for p in ({v: rng.choice(d) for v, d in space.domains.items()} for _ in range(50))
                 if {"NCHW16c>NCHW8c", "NCHW8c>NCHW16c"} <= set(p.values()))
    m = compile_model(g, threads=1, layout_plan=mixed)
    assert_matches_onnxruntime(m, g)
    tasks, _ = _kernels_as_priced(m, space, mixed)
    assert any("ib=16" in s.workload for s in tasks)


@pytest.mark.slow
def test_with_fused_reads_a_mixed_block_plan_keeps_no_transform_between_convs():
    """Synthetic prices: a conv is cheap in NCHW8c when it has 64 or 256 output channels, else in
    NCHW16c; a transform costs 1 (so a plan's cost counts its transforms). Without fused reads ResNet-18's plan pays for transforms between
    the stages (or runs a conv in its dear block); with them it keeps only the two at the model's
    NCHW boundaries, as a single layout does."""
    from tuner.graph.passes import optimize
    from tuner.graph.passes.convert_layout import data_path_transforms
    g = resnet(18, image=32)

    def price(wl):
        if wl.op == "layout_transform":
            return 1.0
        if wl.op == "conv2d" and wl.layout.startswith("NCHW"):
            return 0.0 if wl.layout == ("NCHW8c" if wl.p["K"] in (64, 256) else "NCHW16c") else 5.0
        return 0.0
    plain, fused = (solve(model_layouts(g, ch).problem(price)) for ch in
                    (("NCHW8c", "NCHW16c"), ("NCHW8c", "NCHW16c", "NCHW16c>NCHW8c", "NCHW8c>NCHW16c")))
    single = data_path_transforms(optimize(g, layout="NCHW16c"))
    assert fused.cost == single < plain.cost
    assert {"NCHW16c>NCHW8c", "NCHW8c>NCHW16c"} <= set(fused.layouts.values())
    assert data_path_transforms(optimize(g, layout="NCHW16c", layout_plan=fused.layouts)) == single
    assert data_path_transforms(optimize(g, layout="NCHW16c", layout_plan=plain.layouts)) > single


@pytest.mark.slow
def test_a_conv_whose_channels_a_block_does_not_take_still_reads_it(tmp_cache):
    """MobileNetV2's convs writing 24 channels cannot write NCHW16c; with NCHW8c and NCHW16c among
    the choices they also get NCHW16c>NCHW8c (and no other conv does), so when NCHW16c is cheaper
    everywhere (synthetic prices) the plan runs the whole model in NCHW16c blocks and keeps only
    the model's NCHW boundaries: no transform between convs, none for 24 channels whose NCHW8c and
    NCHW16c blocks are the same 8 (te.layouts.same_data), in the plan's price or in the compiled
    model, which matches ONNX Runtime."""
    from tuner.graph.passes import optimize
    from tuner.graph.passes.convert_layout import data_path_transforms
    g = mobilenet_v2(image=32)
    space = model_layouts(g, ("NCHW8c", "NCHW16c"))
    k = {n.name: n.inputs[1].shape[0] for n in g.nodes if n.op == "conv2d"}
    reads = {v for v, d in space.domains.items() if "NCHW16c>NCHW8c" in d}
    assert reads and reads == {v for v in space.domains if k[v] % 16 and k[v] % 8 == 0}
    assert all(space.domains[v] == ("NCHW8c", "NCHW16c>NCHW8c") for v in reads)

    def price(wl):
        if wl.op == "layout_transform":
            return 1.0
        return 0.0 if wl.op != "conv2d" or wl.layout == "NCHW16c" or wl.p.get("ib") == 16 else 5.0
    plan = solve(space.problem(price))
    assert {v for v, lay in plan.layouts.items() if lay == "NCHW16c>NCHW8c"} == reads
    assert plan.cost == data_path_transforms(optimize(g, layout="NCHW16c")) == 2
    m = compile_model(g, threads=1, layout_plan=plan.layouts)
    assert_matches_onnxruntime(m, g)
    assert sum(s.workload.startswith("layout_transform") for s in m.steps) == 2


@given(st.integers(1, 64), st.sampled_from(["NCHW", "NHWC", "NCHW4c", "NCHW8c", "NCHW16c"]),
       st.sampled_from(["NCHW", "NHWC", "NCHW4c", "NCHW8c", "NCHW16c"]))
@settings(max_examples=60, deadline=None)
def test_layouts_are_the_same_data_exactly_when_their_arrays_are(c, a, b):
    """te.layouts.same_data, which lets a plan and ConvertLayout skip a transform, holds exactly when
    the two layouts lay out c channels as the same array (for blocked layouts; NCHW and NHWC only
    with themselves)."""
    import numpy as np

    from tuner.te import layouts as L
    x = np.random.default_rng(c).standard_normal((1, c, 3, 2)).astype(np.float32)
    xa, xb = L.act_from_nchw(x, a), L.act_from_nchw(x, b)
    same = xa.shape == xb.shape and np.array_equal(xa, xb)
    if L.same_data(a, b, c):
        assert same
    elif L.block_of(a) and L.block_of(b):
        assert not same


@pytest.mark.slow
def test_a_dense_weight_packing_is_a_choice_of_the_plan(tmp_cache):
    """With packings among the choices, a dense is a variable of its own (no edges: its packing
    moves no activation); the plan's packing is the task the compiled model runs; a packing given
    to a conv, or a layout to a dense, is refused by name."""
    g = tiny()
    space = model_layouts(g, ("NCHW16c", "OI", "OI8o"))
    dense = [v for v, d in space.domains.items() if d == ("OI", "OI8o")]
    assert len(dense) == 1 and all("OI" not in d for v, d in space.domains.items() if v not in dense)
    d = dense[0]
    assert [[(wl.op, wl.layout) for wl in space.unary[d][p]] for p in ("OI", "OI8o")] == \
        [[("dense", "OI")], [("dense", "OI8o")]]
    assert not any(d in e for e in space.pairs) and all(wl.op != "dense" for wl in space.fixed)
    assert [wl.layout for wl in model_layouts(g, ("NCHW16c",)).fixed if wl.op == "dense"] == ["OI16o"]
    for packing in ("OI", "OI8o"):
        plan = {v: dom[0] if v != d else packing for v, dom in space.domains.items()}
        m = compile_model(g, threads=1, layout_plan=plan)
        assert_matches_onnxruntime(m, g)
        ran = {s.workload_key for s in m.steps if s.workload.startswith("dense")}
        assert ran == {space.unary[d][packing][0].key}
        assert "1 " + packing + " (dense)" in m.report()
    conv = next(v for v in space.domains if v != d)
    for bad, why in [({conv: "OI8o"}, f"conv2d {conv!r} cannot run as OI8o"),
                     ({d: "NCHW16c"}, f"dense {d!r} cannot run as NCHW16c: it takes a weight packing")]:
        with pytest.raises(UserError, match=why):
            compile_model(g, threads=1, layout_plan=bad)


def test_a_plan_that_runs_a_strided_conv_as_winograd_is_refused(tmp_cache):
    g = resnet(18, image=32)
    strided = next(n.name for n in g.nodes if n.op == "conv2d" and n.attrs["strides"] == [2, 2])
    with pytest.raises(UserError, match=f"{strided}.*cannot run as winograd2"):
        compile_model(g, threads=1, layout_plan={strided: "winograd2"})
    for bad, why in [("winograd3", "winograd2 or winograd4"), ("winograd2@NCHW", "not 'NCHW'"),
                     ("winograd2@NCHW0c", "block size 0")]:
        with pytest.raises(UserError, match=why):
            compile_model(g, threads=1, layout_plan={strided: bad})


# ---------------------------------------------------------------- a whole-model tune, replayed

from conftest import MODEL_REPLAY, MODEL_REPLAY_LOG, REPLAY_TARGET  # noqa: E402

from tuner.database import records  # noqa: E402
from tuner.errors import UserError  # noqa: E402
from tuner.model_tuning import OUT_OF_PLAN_WEIGHT, TUNED_TRIALS, _latencies, _weights, reachable_prices, tune_model  # noqa: E402


def _replayed(log, **kw):
    return tune_model(target=REPLAY_TARGET, log=str(log), policy="random", replay=str(MODEL_REPLAY_LOG),
                      progress=False, **dict(MODEL_REPLAY, **kw))


@pytest.mark.slow
def test_a_model_tune_replays_plans_resumes_and_compiles_with_its_plan(tmp_cache, tmp_path):
    out = tmp_path / "tiny.jsonl"
    res = _replayed(out)
    c = records.load(out)
    assert len(c.records) == MODEL_REPLAY["trials"] and all(r.replayed_from for r in c.records)
    measured = {r.workload.key for r in c.records if r.ok}
    assert measured == {wl.key for wl, _ in res.space.workloads()}        # every task got its first look
    assert res.plan is not None and c.plans == [res.record]
    best = {k: records.first_that_replays(c.for_task(k, REPLAY_TARGET)).latency for k in measured}
    expect = solve(res.space.problem(lambda wl: best[wl.key]))
    assert expect.layouts == res.plan.layouts and math.isclose(expect.cost, res.plan.cost)
    assert math.isclose(res.estimate_s, expect.cost + sum(best[wl.key] for wl in res.space.fixed))
    again = _replayed(out)                                                 # resume: nothing measured again
    assert again.session.new == 0 and again.plan.layouts == res.plan.layouts
    assert len(records.load(out).plans) == 1 and not again.appended        # and no copy of its plan appended
    m = compile_model("tiny", log=str(out), target=REPLAY_TARGET)
    assert m.meta["layout_plan"] == res.plan.layouts and m.meta["layout_plan_from"] == str(out)
    assert "layout plan" in m.report()
    moved = [s for s in m.steps if s.summary == "layout_transform"]        # transforms run their tuned records
    assert moved and all(s.source == str(out) and s.workload_key in measured for s in moved)
    assert_matches_onnxruntime(m, tiny())


def test_a_model_budget_smaller_than_its_tasks_is_refused(tmp_path):
    with pytest.raises(UserError, match="less than the 29 tasks of tiny"):
        _replayed(tmp_path / "t.jsonl", trials=10)


def test_tasks_outside_the_plan_weigh_a_tenth():
    space = model_layouts(tiny(), ("NCHW", "NHWC"))

    def lat(wl):
        return 0.01 if wl.op == "layout_transform" else 1.0 if wl.layout == "NHWC" or wl.op == "dense" else 1.2
    plan = solve(space.problem(lat))
    assert set(plan.layouts.values()) == {"NHWC"}

    class T:
        def __init__(self, wl, w):
            self.workload, self.weight, self.best_latency, self.trials = wl, w, lat(wl), TUNED_TRIALS
            self.curve = [self.best_latency] * self.trials
    tasks = [T(wl, n) for wl, n in space.workloads()]
    w = _weights(space, plan, tasks)
    assert any(x == OUT_OF_PLAN_WEIGHT * t.weight for x, t in zip(w, tasks))
    for x, t in zip(w, tasks):
        if t.workload.op == "conv2d":
            assert (x >= 1) == (t.workload.layout == "NHWC")


@pytest.mark.parametrize("slower, pruned", [(1.1, False), (2.0, True)])
def test_a_layout_clearly_slower_than_the_chosen_one_is_pruned(slower, pruned, monkeypatch):
    """PRUNE_RATIO alone: no duels at equal effort (DUEL_OPS empty), as between a direct and a
    Winograd layout."""
    from tuner import model_tuning
    from tuner.model_tuning import PRUNE_RATIO
    monkeypatch.setattr(model_tuning, "DUEL_OPS", ())
    space = model_layouts(tiny(), ("NCHW", "NHWC"))

    def lat(wl):
        return slower if wl.layout == "NCHW" and wl.op == "conv2d" else 1.0 if wl.op == "conv2d" else 0.01

    class T:
        def __init__(self, wl, n):
            self.workload, self.weight, self.best_latency, self.trials = wl, n, lat(wl), TUNED_TRIALS
            self.curve = [self.best_latency] * self.trials
    tasks = [T(wl, n) for wl, n in space.workloads()]
    plan = solve(space.problem(lat))
    assert set(plan.layouts.values()) == {"NHWC"} and (slower > PRUNE_RATIO) == pruned
    convs = [(x, t) for x, t in zip(_weights(space, plan, tasks), tasks)
             if t.workload.op == "conv2d" and t.workload.layout == "NCHW"]
    assert convs and all(x == (0.0 if pruned else OUT_OF_PLAN_WEIGHT * t.weight) for x, t in convs)


@pytest.mark.parametrize("trials, pruned", [(4, False), (TUNED_TRIALS, True)])
def test_a_layout_seen_only_in_a_first_look_is_judged_on_what_it_could_reach(trials, pruned, monkeypatch):
    """NCHW convs measured 2x slower than NHWC ones are pruned once tuned; while they have had only a
    first look, one NCHW conv reaching nearly the NHWC FLOP rate says the others could too, so they
    keep their out-of-plan weight and get a second look (reach alone: no duel before dismissal)."""
    from tuner import model_tuning
    monkeypatch.setattr(model_tuning, "DUEL_BEFORE_DISMISS", False)
    space = model_layouts(tiny(), ("NCHW", "NHWC"))
    nchw = [wl for wl, _ in space.workloads() if wl.op == "conv2d" and wl.layout == "NCHW"]
    tuned = max(nchw, key=lambda wl: wl.flops).key

    def lat(wl):
        if wl.op != "conv2d":
            return 1e-7
        return (1.0 if wl.layout == "NHWC" else 1.01 if wl.key == tuned else 2.0) * wl.flops / 1e10

    class T:
        def __init__(self, wl, n):
            self.workload, self.weight, self.best_latency = wl, n, lat(wl)
            self.trials = TUNED_TRIALS if wl.key == tuned or wl.layout != "NCHW" else trials
            self.curve = [self.best_latency] * self.trials
    tasks = [T(wl, n) for wl, n in space.workloads()]
    plan = solve(space.problem(lat))
    reach = reachable_prices([(t.workload, t.best_latency, t.trials) for t in tasks])
    slow = [(x, t) for x, t in zip(_weights(space, plan, tasks), tasks)
            if t.workload.layout == "NCHW" and t.workload.op == "conv2d" and t.workload.key != tuned]
    assert slow and all(plan.layouts[v] == "NHWC" for v in plan.layouts)
    assert all(x == (0.0 if pruned else OUT_OF_PLAN_WEIGHT * t.weight) for x, t in slow)
    assert all(math.isclose(reach[t.workload.key], t.best_latency / (1.0 if pruned else 2.0 / 1.01))
               for _, t in slow)


def _nchw_weights_after(nchw_curve: list, nhwc_curve: list) -> list:
    """(weight, task) of tiny()'s NCHW conv tasks when its NCHW and NHWC conv tasks progressed along
    these curves (best latency after each trial) and the plan is all NHWC."""
    space = model_layouts(tiny(), ("NCHW", "NHWC"))

    class T:
        def __init__(self, wl, n):
            self.workload, self.weight = wl, n
            self.curve = (nchw_curve if wl.layout == "NCHW" else nhwc_curve) if wl.op == "conv2d" \
                else [0.01] * TUNED_TRIALS
            self.best_latency, self.trials = self.curve[-1], len(self.curve)
    tasks = [T(wl, n) for wl, n in space.workloads()]
    plan = solve(space.problem(lambda wl: next(t.best_latency for t in tasks if t.workload.key == wl.key)))
    assert set(plan.layouts.values()) == {"NHWC"}
    nchw = [(x, t) for x, t in zip(_weights(space, plan, tasks), tasks)
            if t.workload.op == "conv2d" and t.workload.layout == "NCHW"]
    assert nchw
    return nchw


@pytest.mark.parametrize("first_look, explored", [(1.3, True), (2.5, False)])
def test_a_layout_ahead_at_equal_effort_is_tuned_like_the_plans(first_look, explored, monkeypatch):
    """The plan's NHWC convs fell from 2.0 after 4 trials to 1.0 after 40. NCHW convs at 1.3 after
    their 4-trial first look were ahead at equal effort, so they get their full weight until their
    own trials say otherwise; at 2.5 they were behind even then (a tenth, or pruned; exploration
    alone, no duel before dismissal)."""
    from tuner import model_tuning
    monkeypatch.setattr(model_tuning, "DUEL_BEFORE_DISMISS", False)
    nchw = _nchw_weights_after([first_look] * 4, [2.0] * 4 + [1.5] * 16 + [1.0] * 20)
    assert all((x == t.weight) == explored for x, t in nchw)


@pytest.mark.parametrize("trials, best, lost", [(24, 0.95, True), (24, 0.85, False), (12, 0.95, False)])
def test_a_direct_layout_behind_at_equal_effort_loses_its_duel(trials, best, lost):
    """The plan's NHWC convs were at 0.9 after 24 trials and 0.8 after 40. An NCHW conv at 0.95
    after 24 trials is behind at equal effort and is pruned, though within PRUNE_RATIO of 0.8;
    at 0.85 it was ahead after as many trials, and after 12 trials it has not had a fair duel."""
    nchw = _nchw_weights_after([2.0] * 4 + [best] * (trials - 4), [2.0] * 4 + [0.9] * 20 + [0.8] * 16)
    assert all((x == 0.0) == lost for x, _ in nchw)


@pytest.mark.parametrize("best, before_dismiss, weight", [(0.95, True, 1.0), (1000.0, True, 0.0),
                                                          (0.95, False, OUT_OF_PLAN_WEIGHT)])
def test_a_direct_layout_short_of_its_duel_is_tuned_to_it(best, before_dismiss, weight, monkeypatch):
    """The plan's NHWC convs had 40 trials; NCHW convs with 12, at 0.95 (within PRUNE_RATIO of the
    chosen 0.8 but behind it at equal effort), are tuned with their full weight to their duel; far
    behind, even at the best FLOP rate an NCHW task reached, they are pruned; without
    DUEL_BEFORE_DISMISS they keep a tenth."""
    from tuner import model_tuning
    monkeypatch.setattr(model_tuning, "DUEL_BEFORE_DISMISS", before_dismiss)
    nchw = _nchw_weights_after([2.0] * 4 + [best] * 8, [2.0] * 4 + [0.9] * 20 + [0.8] * 16)
    assert all(x == weight * t.weight for x, t in nchw)


def test_steering_weights_do_not_compound_over_rounds(tmp_path):
    seen = []

    def on_round(tasks):
        seen.append([t.weight for t in tasks])
        return [0.1 * t.weight for t in tasks], None
    from tuner.tuning import RoundHook, tune
    space = model_layouts(tiny(), ("NCHW", "NHWC"))
    tune(space.workloads()[:3], target=REPLAY_TARGET, trials=6, log=str(tmp_path / "w.jsonl"), policy="random",
         replay=str(MODEL_REPLAY_LOG), progress=False, batch_size=2, callbacks=[RoundHook(on_round)])
    assert len(seen) > 1 and all(w == seen[0] for w in seen)     # the occurrence counts, every round


@pytest.mark.slow
def test_a_model_tune_stops_at_its_time_limit_within_one_measurement(tmp_path):
    from tuner.measure.replay import ReplayRunner

    class Slow(ReplayRunner):          # replayed costs, 0.3 s a candidate: the first batch of 8 takes 2.4 s
        def measure(self, task, batch):
            for item in super().measure(task, batch):
                time.sleep(0.3)
                yield item
    res = _replayed(tmp_path / "t.jsonl", trials=400, warmup_batch=8, batch_size=8,
                    runner=Slow(str(MODEL_REPLAY_LOG)), time_limit=1.0)
    s = res.session
    # at most the measurements that fit in the limit and the one in hand (a whole batch of 8 before)
    assert 0 < s.trials <= math.ceil(1.0 / 0.3) + 1 and s.seconds >= 1.0
    assert len(records.load(tmp_path / "t.jsonl").records) == s.trials


def test_no_plan_while_a_needed_transform_is_unmeasured():
    """Every conv has a measured layout, but the only ones measured need a transform between them that
    is not: no finite plan yet, which a tune must take as 'not yet', not as an error."""
    from types import SimpleNamespace as W

    from tuner.graph.layout_plan import ModelLayouts, NoPlan
    a_x, b_y, t_xy = W(key="a.X"), W(key="b.Y"), W(key="t.XY")
    space = ModelLayouts("g", {"a": ("X", "Y"), "b": ("X", "Y")},
                         {"a": {"X": [a_x], "Y": [W(key="a.Y")]}, "b": {"X": [W(key="b.X")], "Y": [b_y]}},
                         {("a", "b"): {("X", "Y"): [t_xy], ("Y", "X"): [W(key="t.YX")]}})
    assert space.plan({"a.X": 1.0, "b.Y": 1.0}) == (None, math.inf)
    with pytest.raises(NoPlan):
        solve(space.problem(lambda wl: {"a.X": 1.0, "b.Y": 1.0}.get(wl.key, math.inf)))
    plan, est = space.plan({"a.X": 1.0, "b.Y": 1.0, "t.XY": 0.5})
    assert plan.layouts == {"a": "X", "b": "Y"} and est == 2.5


def _counting_cold_prices(monkeypatch):
    """The workload keys model_tuning.cold_prices times again (with the weights evicted)."""
    import tuner.model_tuning as MT
    from tuner.measure.runner import CpuRunner
    timed = []

    class Counting(CpuRunner):
        def measure(self, task, batch):
            assert self.config.cold_weights
            timed.append(task.workload.key)
            yield from super().measure(task, batch)
    real = MT.cold_prices

    def counting_cold_prices(*args, **kwargs):       # its CpuRunner counts; confirm_bests' does not
        with monkeypatch.context() as m:
            m.setattr(MT, "CpuRunner", Counting)
            return real(*args, **kwargs)
    monkeypatch.setattr(MT, "cold_prices", counting_cold_prices)
    return timed


@pytest.mark.slow
def test_a_model_tune_times_its_weights_cold_by_default(tmp_cache, tmp_path, monkeypatch):
    """Every task with weights is searched with them evicted before each timed call, and its records
    say so; the others (pools, transforms) have none to evict. Each front-runner is timed a second
    time (confirm_bests); the plan is solved with those prices, nothing is timed warm, and a
    resume measures nothing."""
    from collections import Counter

    import tuner.model_tuning as MT
    from tuner.target import parse_target
    from tuner.task import Task
    timed = _counting_cold_prices(monkeypatch)
    log = tmp_path / "cold.jsonl"
    res = tune_model("tiny", trials=9, log=str(log), target="cpu -threads=1", layouts=("NCHW16c",),
                     warmup_batch=1, progress=False)
    weighted = {wl.key for wl, _ in res.space.workloads() if wl.op in ("conv2d", "dense")}
    recs = records.load(log).records
    tried = [r for r in recs if r.policy != records.CONFIRM]
    assert len(weighted) == 5 and len(tried) == 9 and not timed
    heats = 0
    for wl, _ in res.space.workloads():               # a heat per task searched: its front-runners
        mine = [r for r in tried if r.workload.key == wl.key and r.ok]       # and its default, twice
        if not mine:
            continue
        heat = [r for r in recs if r.policy == records.CONFIRM and r.workload.key == wl.key]
        front = {r.code_hash for r in records.fastest_that_replay(mine, MT.CONFIRM_TOP)}
        default = Task(wl, parse_target("cpu -threads=1")).default_candidate().code_hash
        assert len({r.heat for r in heat}) == 1 and heat[0].heat
        assert Counter(r.code_hash for r in heat) == {c: 2 for c in front | {default}}
        heats += 1
    assert heats >= 5
    assert {r.workload.key for r in recs if r.cold} == weighted
    assert all(r.cold == (r.workload.key in weighted) for r in recs)
    rec = res.record
    assert rec.priced == "cold" and rec.cold == {} and records.load(log).plans[-1] == rec
    assert math.isclose(res.estimate_s, res.space.estimate(rec.layouts, _latencies(res.session.tasks)))
    assert "the 5 with weights timed with them evicted before each call" in res.table()
    again = tune_model("tiny", trials=9, log=str(log), target="cpu -threads=1", layouts=("NCHW16c",),
                       progress=False)
    assert again.session.new == 0 and not timed and again.record.layouts == rec.layouts
    assert len(records.load(log).records) == len(recs)                  # nothing timed a third time
    with pytest.raises(UserError, match="--weights 'tepid' is not one of cold, warm"):
        tune_model("tiny", trials=9, log=str(log), weights="tepid", progress=False)


@pytest.mark.slow
def test_a_warm_model_tune_prices_its_plan_with_weights_cold_too(tmp_cache, tmp_path, monkeypatch):
    """With weights="warm" the search times kernels with their weights in cache; after it, every task
    with weights has its best kernel timed again with them evicted (RunConfig.cold_weights); the plan
    line keeps those prices and the plan's estimate under them, and a resume re-times nothing it
    already priced. A cold tune of the same log does not take the warm records (5 tried, and
    their heats) for its own: it
    measures the weighted tasks again, cold."""
    timed = _counting_cold_prices(monkeypatch)
    log = tmp_path / "warm.jsonl"
    res = tune_model("tiny", trials=9, log=str(log), target="cpu -threads=1", layouts=("NCHW16c",),
                     warmup_batch=1, progress=False, weights="warm")
    weighted = {wl.key for wl, _ in res.space.workloads() if wl.op in ("conv2d", "dense")}
    assert len(weighted) == 5 and sorted(timed) == sorted(weighted)
    assert not any(r.cold for r in records.load(log).records)
    rec = res.record
    assert rec.priced == "warm" and set(rec.cold) == weighted and records.load(log).plans[-1] == rec
    best = {s.workload.key: s.best for s in res.session.tasks}
    assert all(h == best[k].code_hash and s > 0 for k, (h, s) in rec.cold.items())
    cold_best = dict(res.prices, **{k: s for k, (_, s) in rec.cold.items()})
    assert math.isclose(rec.cold_estimate_s, res.space.estimate(rec.layouts, cold_best))
    assert math.isclose(res.estimate_s, res.space.estimate(rec.layouts, res.prices))
    assert "with the weights of its 5 kernels cold" in res.table()
    timed.clear()
    again = tune_model("tiny", trials=9, log=str(log), target="cpu -threads=1", layouts=("NCHW16c",),
                       progress=False, weights="warm")
    assert again.session.new == 0 and not timed and again.record.cold == rec.cold   # prices reused
    warm = sum(r.workload.key in weighted for r in records.load(log).records)   # 5 tried, and their heats
    assert warm > 5
    with pytest.warns(UserWarning, match=rf"{warm} records of these tasks were timed with the weights warm; this tune "
                                         r"times them cold and does not count those \(--weights warm resumes them\)"):
        cold = tune_model("tiny", trials=9, log=str(log), target="cpu -threads=1", layouts=("NCHW16c",),
                          warmup_batch=1, progress=False)
    assert cold.session.new == 5 and not timed and cold.record.priced == "cold"
    assert {r.workload.key for r in records.load(log).records if r.cold} == weighted


@pytest.mark.slow
def test_a_plan_applies_to_the_same_model_exported_to_onnx_and_is_named_where_it_does_not(tmp_cache, tmp_path):
    import onnx

    from tuner.graph.models import resnet
    from tuner.graph.onnx_frontend import to_onnx
    out = tmp_path / "tiny.jsonl"
    res = _replayed(out)
    onnx_path = tmp_path / "tiny.onnx"
    onnx.save(to_onnx(tiny()), str(onnx_path))
    m = compile_model(str(onnx_path), log=str(out), target=REPLAY_TARGET)
    assert m.meta["layout_plan"] == res.plan.layouts and m.meta["layout_plan_from"] == str(out)
    with pytest.warns(UserWarning, match="holds a layout plan of tiny but none of this model"):
        other = compile_model(resnet(18, image=32), log=str(out), target=REPLAY_TARGET)
    assert other.meta["layout_plan"] == {}
    with pytest.raises(UserError, match="names 1 conv or dense node.* does not have: nowhere"):
        compile_model(tiny(), target=REPLAY_TARGET, layout_plan=dict(res.plan.layouts, nowhere="NHWC"))
    records.append(out, [dataclasses.replace(res.record, layouts=dict(res.plan.layouts, nowhere="NHWC"), anonymous="",
                                             order=())])
    with pytest.warns(UserWarning, match="names 1 conv or dense node.* compiling without it"):
        m = compile_model(tiny(), log=str(out), target=REPLAY_TARGET)      # a log's plan that does not fit: none
    assert not m.meta["layout_plan"] and m.meta["layout_plan_from"] is None


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_one_layout_plan_runs_every_conv_that_can_in_the_compile_default_layout(seed):
    """Whatever the prices, the plan a joint plan is checked against puts every conv whose domain
    holds the compile's default layout (NCHW16c) there and the rest in their own best; a tune of
    only Winograd layouts has no such plan."""
    from tuner.model_tuning import one_layout_plan
    layouts = ("NCHW8c", "NCHW16c", "winograd2@NCHW16c")
    space = model_layouts(tiny(), layouts)
    rng = random.Random(seed)
    prices = {wl.key: rng.uniform(1e-5, 1e-3) for wl, _ in space.workloads()}
    one = one_layout_plan(space, layouts, prices)
    assert one is not None and set(one.layouts) == set(space.domains)
    holds = [v for v, d in space.domains.items() if "NCHW16c" in d]
    assert holds and all(one.layouts[v] == "NCHW16c" for v in holds)
    assert all(one.layouts[v] in d for v, d in space.domains.items())
    assert one_layout_plan(space, ("winograd2@NCHW16c",), prices) is None


@pytest.mark.parametrize("winner", ["one layout", "joint", "default"])
def test_a_solved_plan_that_loses_to_one_layout_or_the_untuned_plan_in_the_whole_model_is_not_the_plan_kept(
        tmp_path, monkeypatch, winner):
    """After the search, the solved plan, the plan of one layout and the untuned compile's plan are
    compiled and timed whole (check_plan); the log's plan line, the result and its estimate are the
    fastest one's, and the table says which was kept."""
    import itertools
    import tuner.model_tuning as MT
    calls = []

    def differing(space, prices, avoid):            # a plan whose layouts differ from each of `avoid`
        names = sorted(space.domains)
        for pick in itertools.product(*(space.domains[v] for v in names)):
            plan, est = space.restricted(dict(zip(names, pick))).plan(prices)
            if plan is not None and math.isfinite(est) and all(plan.layouts != a.layouts for a in avoid):
                return plan
        raise AssertionError("no plan differs from those given")

    def other_layout(space, layouts, prices):
        solved, _ = space.plan(prices)
        for base in ("NCHW8c", "NCHW16c"):
            plan, _ = space.restricted({v: base for v in space.domains}).plan(prices)
            if plan.layouts != solved.layouts:
                return plan
        raise AssertionError("no one-layout plan differs from the solved plan")

    def untuned(space, graph, layouts, prices, lanes):
        return differing(space, prices, [space.plan(prices)[0], other_layout(space, layouts, prices)])

    def timed(graph, log, tgt, plans, progress=True):
        calls.append({k: dict(p) for k, p in plans.items()})
        return {k: (1e-3 if k == winner else 2e-3) for k in plans}
    monkeypatch.setattr(MT, "one_layout_plan", other_layout)
    monkeypatch.setattr(MT, "default_layout_plan", untuned)
    monkeypatch.setattr(MT, "check_plan", timed)
    log = tmp_path / "plan.jsonl"
    res = tune_model("tiny", trials=19, log=str(log), target="cpu -threads=1", layouts=("NCHW8c", "NCHW16c"),
                     warmup_batch=1, progress=False)
    assert len(calls) == 1 and set(calls[0]) == {"joint", "one layout", "default"}
    assert len({tuple(sorted(p.items())) for p in calls[0].values()}) == 3
    kept = calls[0][winner]
    assert res.plan.layouts == kept and records.load(log).plans[-1].layouts == kept
    assert math.isclose(res.estimate_s, res.space.estimate(kept, _latencies(res.session.tasks)))
    assert res.plan_check == {k: 1e-3 if k == winner else 2e-3 for k in ("joint", "one layout", "default")}
    said = {"joint": "the solved plan", "one layout": "one layout", "default": "the untuned compile's plan"}
    assert f"{said[winner]} kept" in res.table()


def test_the_untuned_plan_a_tune_checks_is_the_default_plans_winograd_convs_and_the_default_layout_elsewhere():
    """default_layout_plan: with 8 or 16 lanes, the convs graph.layout_plan.default_plan names take
    its Winograd layouts and the others NCHW16c; a tune without those layouts has no such plan; with
    4 lanes it is the one-layout plan."""
    from tuner.graph.layout_plan import default_plan
    from tuner.model_tuning import default_layout_plan, one_layout_plan
    g = resnet(18, image=64)
    layouts = ("NCHW8c", "NCHW16c", "winograd2@NCHW16c", "winograd4@NCHW16c")
    space = model_layouts(g, layouts)
    prices = {wl.key: 1e-3 for wl, _ in space.workloads()}
    wino = default_plan(g, "NCHW16c", 16)
    assert wino and set(wino.values()) <= set(layouts)
    plan = default_layout_plan(space, g, layouts, prices, 16)
    assert plan is not None and set(plan.layouts) == set(space.domains)
    assert all(plan.layouts[v] == wino.get(v, "NCHW16c") for v in space.domains)
    direct = ("NCHW8c", "NCHW16c")
    assert default_layout_plan(model_layouts(g, direct), g, direct, prices, 16) is None
    assert default_layout_plan(space, g, layouts, prices, 8).layouts == plan.layouts
    assert default_layout_plan(space, g, layouts, prices, 4).layouts == one_layout_plan(space, layouts, prices).layouts


def test_check_plan_times_each_plan_compiled_whole(tmp_path):
    """check_plan compiles the model once per plan (with the log's records) and gives each a
    positive median time."""
    from tuner.model_tuning import check_plan
    from tuner.target import parse_target
    g = tiny()
    space = model_layouts(g, ("NCHW8c", "NCHW16c"))
    prices = {wl.key: 1e-4 for wl, _ in space.workloads()}
    plans = {b: space.restricted({v: b for v in space.domains}).plan(prices)[0].layouts for b in ("NCHW8c", "NCHW16c")}
    assert plans["NCHW8c"] != plans["NCHW16c"]
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    out = check_plan(g, str(log), parse_target("cpu -threads=1"), plans, progress=False)
    assert set(out) == {"NCHW8c", "NCHW16c"} and all(0 < v < 1 for v in out.values())


def _renamed(g):
    """The same graph with every node renamed, as another exporter names it."""
    from tuner.graph.builder import rebuild
    return rebuild(g, lambda b, n, ins: b.add(n.op, ins, n.attrs, f"other/{n.name}/Conv"))


def test_a_layout_plan_applies_to_another_export_of_the_same_architecture_conv_by_conv(tmp_path):
    """torchvision's ResNet-50 and the built-in one are the same graph with other node names: a plan of
    one names the other's convs in order; a graph of another architecture gets none."""
    from tuner.compiler import compile_model
    from tuner.graph.ir import graph_digest, graph_structure
    from tuner.graph.layout_plan import anonymous_structure
    from tuner.graph.models import tiny
    from tuner.target import host_isa
    g, other = tiny(), _renamed(tiny())
    convs = [n.name for n in g.nodes if n.op == "conv2d"]
    plan = {c: ("NCHW8c" if k == 0 else "NCHW16c") for k, c in enumerate(convs)}
    assert graph_structure(other) != graph_structure(g) and anonymous_structure(other)[0] == anonymous_structure(g)[0]
    log = tmp_path / "plan.jsonl"
    target = f"cpu -isa={host_isa()} -cores=2 -threads=1"
    records.append(log, [records.make_plan_record("tiny", graph_digest(g), target, plan, 1e-4, True,
                                                  structure=graph_structure(g), anonymous=anonymous_structure(g))])
    assert records.load(log).plans[0].order == tuple(anonymous_structure(g)[1])
    m = compile_model(other, log=str(log), threads=1, use_shipped=False, predict=False)
    mine = [n.name for n in other.nodes if n.op == "conv2d"]
    assert m.meta["layout_plan"] == {mine[k]: lay for k, lay in enumerate(plan.values())}
    assert any("[NCHW8c]" in (s.workload or "") for s in m.steps)
    import numpy as np
    from tuner.graph.builder import GraphBuilder
    wider = GraphBuilder("wider")          # a different architecture: no plan, every conv in the default
    x = wider.input("x", (1, 3, 8, 8), layout="NCHW")
    w = wider.const(np.ones((16, 3, 3, 3), np.float32))
    wider = wider.finish([wider.add("conv2d", [x, w], {"strides": [1, 1], "pads": [1, 1, 1, 1],
                                                       "dilations": [1, 1], "groups": 1}, convs[0])])
    with pytest.warns(UserWarning, match="holds a layout plan of tiny but none of this model"):
        m = compile_model(wider, log=str(log), threads=1, use_shipped=False, predict=False)
    assert not m.meta.get("layout_plan")


@pytest.mark.parametrize("bad", [{"anonymous": 5, "order": []}, {"anonymous": "h", "order": ["a", "a"]},
                                 {"anonymous": "h", "order": [""]}, {"anonymous": "h", "order": "conv1"}])
def test_a_plan_whose_anonymous_structure_or_order_is_malformed_is_refused(bad):
    from tuner.database.records import PlanRecord, RecordError
    good = {"model": "m", "model_hash": "x", "target": "cpu -isa=avx2 -threads=1", "layouts": {}, "estimate_s": 1.0}
    assert PlanRecord.from_json(dict(good, anonymous="h", order=["a", "b"])).order == ("a", "b")
    with pytest.raises(RecordError, match="anonymous/order"):
        PlanRecord.from_json(dict(good, **bad))


def test_shipped_conv_records_apply_only_with_a_shipped_plan_that_fits_the_model(tmp_path, monkeypatch):
    """A shipped conv record was tuned inside its model's plan; a model no shipped plan fits runs
    its defaults (records without their plan ran 0.97-1.07x the defaults' time), one it fits takes them."""
    import random as _random

    from tuner.compiler import compile_model
    from tuner.database.result import MeasureResult
    from tuner.graph.ir import graph_digest, graph_structure
    from tuner.graph.layout_plan import anonymous_structure
    from tuner.graph.models import tiny
    from tuner.graph.passes import optimize as _optimize
    from tuner.target import parse_target
    from tuner.task import Task
    g = tiny()
    tgt = parse_target("cpu", 1)
    shipped = tmp_path / "cpu.jsonl"
    for t in [t for t in _optimize(g, layout="NCHW16c").meta["tasks"] if t.tunable]:
        task = Task(t.workload, tgt)
        steps = task.space.steps(task.space.sample(_random.Random(0)))
        records.append(shipped, [records.make_record(t.workload, str(tgt), steps, MeasureResult("OK", costs=[1e-5] * 3),
                                                     task.candidate(steps).code_hash, "test", 0)])
    monkeypatch.setattr(records, "shipped_database", lambda target: shipped)
    m = compile_model(g, threads=1, predict=False)
    assert {s.source for s in m.steps if s.anchor} == {"default"}
    plan = {n.name: "NCHW16c" for n in g.nodes if n.op == "conv2d"}
    records.append(shipped, [records.make_plan_record("tiny", graph_digest(g), str(tgt), plan, 1e-4, True,
                                                      structure=graph_structure(g), anonymous=anonymous_structure(g))])
    m = compile_model(g, threads=1, predict=False)
    assert m.meta["layout_plan_from"] == "shipped" and "shipped" in {s.source for s in m.steps if s.anchor}


def test_a_compile_with_no_plan_runs_wide_3x3_convs_as_winograd_where_the_target_has_8_lanes_or_more(tmp_cache):
    """No plan measured: a 3x3 stride-1 conv of 16 input channels or more runs as Winograd F(4x4)
    from 28 output pixels a side and F(2x2) from 14 where the target has 8 lanes or more (AVX2,
    AVX-512), in the compile's block; strided convs, small images and narrow inputs run directly,
    and so does every conv with 4 lanes, an unblocked layout or a layout the user chose. Channels padded to
    whole blocks stay padded under that plan. The compiled model matches ONNX Runtime."""
    import numpy as np
    from tuner.graph.builder import GraphBuilder
    from tuner.graph.layout_plan import default_plan
    from tuner.target import parse_target
    b = GraphBuilder("winograd_default")
    rng = np.random.default_rng(0)
    v = b.input("x", (1, 8, 28, 28), layout="NCHW")
    for name, (c, k, stride) in dict(narrow=(8, 20, 1), w4=(20, 16, 1), down=(16, 32, 2), w2=(32, 32, 1),
                                     down2=(32, 32, 2), small=(32, 32, 1)).items():
        w = b.const(rng.standard_normal((k, c, 3, 3)).astype(np.float32) * 0.2)
        v = b.add("conv2d", [v, w], {"strides": [stride] * 2, "pads": [1] * 4, "dilations": [1, 1], "groups": 1}, name)
        v = b.add("relu", [v], {}, f"{name}_relu")
    g = b.finish([v])
    want = {"w4": "winograd4@NCHW16c", "w2": "winograd2@NCHW16c"}
    assert default_plan(g, "NCHW16c", 16) == want
    assert default_plan(g, "NCHW8c", 16) == {k: lay.replace("16c", "8c") for k, lay in want.items()}
    assert default_plan(g, "NCHW16c", 8) == want
    assert default_plan(g, "NCHW16c", 4) == default_plan(g, "NCHW", 16) == default_plan(g, "NHWC", 16) == {}
    host = parse_target("cpu", 1)
    m = compile_model(g, threads=1, use_shipped=False, predict=False)
    assert m.meta["layout_plan"] == (want if host.lanes >= 8 else {})
    assert m.meta["layout_plan_from"] == ("default" if host.lanes >= 8 else None)
    assert any("winograd_gemm" in (s.workload or "") for s in m.steps) == (host.lanes >= 8)
    # the 20 channels the narrow conv writes run as 32 (PadChannels), read as such by the Winograd one
    assert any("C=8,H=28,W=28,K=32," in (s.workload or "") for s in m.steps)
    assert_matches_onnxruntime(m, g)
    chosen = compile_model(g, threads=1, use_shipped=False, predict=False, layout="NCHW16c")
    assert not chosen.meta["layout_plan"] and not any("winograd" in (s.workload or "") for s in chosen.steps)
    assert (m.meta["layout_given"], chosen.meta["layout_given"]) == (False, True)   # tuner bench recompiles alike


@pytest.mark.slow
def test_compile_quick_measures_the_tasks_of_the_default_plan_and_keeps_its_winograd_convs(tmp_cache):
    """compile --quick with no plan anywhere and no --layout tunes the default plan's tasks (its
    Winograd convs fixed), so the plan it appends, which the compile then applies, keeps them; and
    it measures N candidates of each task, a Winograd GEMM's too (a tune's first look of one is 16)."""
    import collections

    from tuner.graph.layout_plan import default_plan
    from tuner.model_tuning import quick_tune
    from tuner.target import parse_target
    g = resnet(18, image=64)
    want = default_plan(g, "NCHW16c", parse_target("cpu", 1).lanes)
    log = tmp_cache.parent / "quick.jsonl"
    res = quick_tune(g, 1, str(log), None, use_shipped=False, threads=1, progress=False)
    assert res.plan is not None and {v: res.plan.layouts.get(v) for v in want} == want
    assert any(t.workload.op == "winograd_gemm" for t in res.session.tasks) == bool(want)
    codes = collections.defaultdict(set)       # (a candidate is logged again by the checks that time it again)
    logged = records.load(log).records
    for r in logged:
        codes[r.workload.key].add(r.code_hash)
    assert codes and {len(c) for c in codes.values()} == {1}
    shares = {t.workload.key: t.workload.flops * t.weight for t in res.session.tasks}
    assert shares[logged[0].workload.key] == max(shares.values())    # the largest share measured first


def test_a_quick_tunes_minor_tasks_stop_after_their_probe_while_together_they_stay_a_small_share():
    """MinorTasks: a task with a large share of the FLOPs is measured whole; another stops after its
    probe where it takes under MINOR_SHARE of the model's time so far, until those stopped would
    pass MINOR_TOTAL together; a task with nothing measured OK goes on."""
    from types import SimpleNamespace as NS

    from tuner.model_tuning import MAJOR_FLOPS, MINOR_PROBE, MINOR_SHARE, MINOR_TOTAL, MinorTasks

    def task(key, flops, ms, weight=1):
        return NS(workload=NS(key=key, flops=flops), weight=weight, best_latency=ms * 1e-3)
    big = task("big", 1000, 100.0)
    tiny = [task(f"t{k}", 1, 0.9 * MINOR_SHARE * 100) for k in range(20)]
    pairs = [(t.workload, t.weight) for t in [big, *tiny]]
    cut = MinorTasks(pairs)
    tasks = [big, *tiny]
    assert cut.probe(tasks, 0) == 0 and MAJOR_FLOPS * 1020 <= 1000
    assert cut.probe(tasks, 1) == MINOR_PROBE
    decided = [cut.go_on(tasks, k) for k in range(1, len(tasks))]
    stopped = decided.index(True)
    assert 0 < stopped < len(tiny) and not any(decided[:stopped])
    total = sum(t.best_latency for t in tasks)
    assert sum(cut.cut.values()) < MINOR_TOTAL * total <= sum(cut.cut.values()) + tiny[0].best_latency * 1.5
    assert cut.go_on([big, task("twice", 1, 0.9 * MINOR_SHARE * 100, weight=2)], 1)   # its occurrences count
    assert cut.go_on([big, task("failed", 1, math.inf)], 1)
    assert not MinorTasks(pairs).go_on([big, task("small", 1, 0.5)], 1)
    assert cut.describe(tasks).startswith(f"{stopped} minor tasks (4.6% of the model together)")


def _narrow_then_wide(image: int = 14, narrow: int = 20):
    """A conv writing `narrow` channels (20: padded to 32 in NCHW16c) read by a 3x3 conv that runs
    as Winograd by default with 8 lanes or more."""
    import numpy as np
    from tuner.graph.builder import GraphBuilder
    b = GraphBuilder("narrow_then_wide")
    rng = np.random.default_rng(0)
    v = b.input("x", (1, 8, image, image), layout="NCHW")
    for name, (c, k) in dict(narrow=(8, narrow), wide=(narrow, 16)).items():
        w = b.const(rng.standard_normal((k, c, 3, 3)).astype(np.float32) * 0.2)
        v = b.add("conv2d", [v, w], {"strides": [1, 1], "pads": [1] * 4, "dilations": [1, 1], "groups": 1}, name)
        v = b.add("relu", [v], {}, f"{name}_relu")
    return b.finish([v])


@pytest.mark.slow
def test_compile_quick_with_no_plan_measures_the_padded_convs_the_compile_runs_and_logs_a_plan_that_keeps_them_padded(
        tmp_cache, monkeypatch):
    """With no plan, a compile pads a conv's 20 channels to 32 (PadChannels); compile --quick tunes
    those padded tasks and appends the model's plan marked padded (a solved plan would compile
    unpadded), so the compile after it still pads, still runs the default plan's Winograd convs, and
    takes every kernel from the quick log (the in-model check faked: no record loses there)."""
    import tuner.model_tuning as MT
    from tuner.graph.ir import graph_digest
    from tuner.graph.layout_plan import default_plan, padded_graph
    from tuner.target import parse_target
    monkeypatch.setattr(MT, "in_model_defaults", lambda *args, **kwargs: {})
    g = _narrow_then_wide()
    want = default_plan(g, "NCHW16c", parse_target("cpu", 1).lanes)
    assert padded_graph(g, "NCHW16c", want) is not None and padded_graph(tiny(), "NCHW16c", {}) is None
    log = tmp_cache.parent / "quick.jsonl"
    res = MT.quick_tune(g, 1, str(log), None, use_shipped=False, threads=1, progress=False)
    assert any("K=32" in t.workload.spec for t in res.session.tasks if t.workload.op == "conv2d")
    [plan] = records.load(log).plans
    assert plan == res.record and plan.padded and not plan.untuned and plan.model_hash == graph_digest(g)
    MT.quick_tune(g, 1, str(log), None, use_shipped=False, threads=1, progress=False)
    assert records.load(log).plans == [plan]            # run again, nothing new measured: its verdicts stand
    m = compile_model(g, threads=1, use_shipped=False, predict=False, log=str(log))
    assert m.meta["layout_plan"] == want and m.meta["layout_plan_from"] == str(log)
    anchors = [s for s in m.steps if s.anchor]
    assert anchors and all(s.source == str(log) for s in anchors)
    assert any("C=8,H=14,W=14,K=32," in (s.workload or "") for s in anchors)
    assert_matches_onnxruntime(m, g)


@pytest.mark.slow
def test_a_tune_keeps_the_untuned_compiles_padded_plan_where_it_runs_fastest_whole(tmp_cache, monkeypatch):
    """A model whose untuned compile pads conv channels: the plan check compiles that rival as the
    untuned compile does (only its Winograd convs named, channels padded); where it is fastest the
    plan line is marked padded, and a compile from the log pads and runs its Winograd convs again."""
    import tuner.model_tuning as MT
    from tuner.graph.layout_plan import default_plan
    from tuner.target import parse_target
    g = _narrow_then_wide()
    want = default_plan(g, "NCHW16c", parse_target("cpu", 1).lanes)
    calls = []

    def timed(graph, log, tgt, plans, progress=True):
        calls.append(dict(plans))
        return {k: (1e-3 if k == "default" else 2e-3) for k in plans}
    monkeypatch.setattr(MT, "check_plan", timed)
    # one first look per task: where it fails (a loaded host), the task is unpriced, no plan has an
    # estimate and nothing is checked; priced here at a millisecond so that the check always runs
    measured = MT._latencies
    monkeypatch.setattr(MT, "_latencies", lambda tasks: {k: v if v is not None and v < float("inf") else 1e-3
                                                         for k, v in measured(tasks).items()})
    log = tmp_cache.parent / "tune.jsonl"
    res = tune_model(g, None, log=str(log), target="cpu -threads=1", layouts=("NCHW16c", "winograd2@NCHW16c"),
                     warmup_batch=1, progress=False)
    assert len(calls) == 1 and calls[0]["default"] == want and "joint" in calls[0]
    assert res.padded and res.record.padded and records.load(log).plans[-1].padded
    assert set(res.record.layouts) == set(res.space.domains)        # the whole plan, for tuner analyze
    assert "padded to whole blocks" in res.table()
    m = compile_model(g, threads=1, use_shipped=False, predict=False, log=str(log))
    assert m.meta["layout_plan"] == want and m.meta["layout_plan_from"] == str(log)
    assert any("C=8,H=14,W=14,K=32," in (s.workload or "") for s in m.steps)
    assert_matches_onnxruntime(m, g)
    # compile --quick on that log measures the padded tasks that compile runs, and appends that plan
    # again with its own checks' verdicts
    plans = records.load(log).plans
    quick = MT.quick_tune(g, 1, str(log), None, use_shipped=False, threads=1, progress=False)
    specs = [t.workload.spec for t in quick.session.tasks]
    assert any("K=32," in s for s in specs) and not any(k in s for s in specs for k in ("K=20,", "C=20,")), specs
    after = records.load(log).plans
    assert len(after) == len(plans) + 1 and after[-1].padded and after[-1].layouts == plans[-1].layouts


@pytest.mark.slow
def test_compile_quick_for_avx2_tunes_24_channels_unpadded_in_blocks_of_8_and_the_compile_takes_them(
        tmp_cache, monkeypatch):
    """On 8 lanes a compile runs a conv's 24 channels unpadded in NCHW16c (blocks of 8 fill them:
    PadChannels), so compile --quick prices and tunes that conv as the compile runs it and logs the
    model's plan (its Winograd conv kept), and the compile after it takes every kernel from the
    quick log and matches ONNX Runtime."""
    import tuner.model_tuning as MT
    from tuner.graph.layout_plan import default_plan, padded_graph
    monkeypatch.setattr(MT, "in_model_defaults", lambda *args, **kwargs: {})
    g = _narrow_then_wide(narrow=24)
    want = default_plan(g, "NCHW16c", 8)
    assert want and padded_graph(g, "NCHW16c", want, 8) is None and padded_graph(g, "NCHW16c", want, 16) is not None
    log = tmp_cache.parent / "quick.jsonl"
    res = MT.quick_tune(g, 1, str(log), None, use_shipped=False, target="cpu -isa=avx2", threads=1, progress=False)
    assert any("K=24," in t.workload.spec for t in res.session.tasks if t.workload.op == "conv2d")
    m = compile_model(g, target="cpu -isa=avx2", threads=1, use_shipped=False, predict=False, log=str(log))
    assert m.meta["layout_plan_from"] == str(log) and {v: m.meta["layout_plan"].get(v) for v in want} == want
    anchors = [s for s in m.steps if s.anchor]
    assert anchors and all(s.source == str(log) for s in anchors), [(s.workload, s.source) for s in anchors]
    assert any("K=24," in (s.workload or "") for s in anchors)
    assert_matches_onnxruntime(m, g)
    from tuner.analysis.model_report import analyze_model          # its report prices the plan as the tune did
    [report] = analyze_model(str(log), g)
    assert report.plan.layouts == m.meta["layout_plan"]


@pytest.mark.slow
def test_a_quick_tune_whose_one_look_at_a_task_was_refused_times_that_tasks_default_and_logs_the_plan(
        tmp_cache, monkeypatch):
    """compile --quick 1 takes one timing a task; where that one is refused (a busy host measures
    its peak low, measure.plausible), the task's default is timed in the heat after the search, so
    the model still has a price, a plan is logged, and the compile takes it."""
    import tuner.measure.runner as R
    import tuner.model_tuning as MT
    from tuner.database import records
    from tuner.database.result import RUNTIME_ERROR, MeasureResult
    monkeypatch.setattr(MT, "in_model_defaults", lambda *args, **kwargs: {})
    check, refused = R.plausible.check, []

    def refuse_first_input_transform(workload, target, result, here=False):
        if workload.op == "winograd_input" and not refused:
            refused.append(workload.key)
            return MeasureResult(RUNTIME_ERROR, "timing refused: as a busy host would")
        return check(workload, target, result, here)
    monkeypatch.setattr(R.plausible, "check", refuse_first_input_transform)
    g = _narrow_then_wide(narrow=24)
    log = tmp_cache.parent / "quick.jsonl"
    MT.quick_tune(g, 1, str(log), None, use_shipped=False, target="cpu -isa=avx2", threads=1, progress=False)
    recs = [r for r in records.load(str(log)).records if r.workload.key == refused[0]]
    assert recs[0].error == RUNTIME_ERROR and any(r.ok and r.policy == records.CONFIRM for r in recs)
    assert records.load(str(log)).plans
    m = compile_model(g, target="cpu -isa=avx2", threads=1, use_shipped=False, predict=False, log=str(log))
    assert m.meta["layout_plan_from"] == str(log)


def _squeeze_excitation(reduced: int = 4):
    """A conv writing 20 channels (padded to 32 in NCHW16c), then squeeze-excitation: global pool, a
    1x1 conv down to `reduced` channels (which no block of 8 or 16 divides), a 1x1 conv back up
    with a sigmoid, the gate times the conv's output."""
    import numpy as np
    from tuner.graph.builder import GraphBuilder
    b = GraphBuilder("squeeze_excitation")
    rng = np.random.default_rng(0)
    w = lambda *s: b.const(rng.standard_normal(s).astype(np.float32) * 0.3)  # noqa: E731
    conv = lambda v, wt, name, pad: b.add("conv2d", [v, wt], {"strides": [1, 1], "pads": [pad] * 4,  # noqa: E731
                                                              "dilations": [1, 1], "groups": 1}, name)
    x = b.add("relu", [conv(b.input("x", (1, 8, 10, 10), layout="NCHW"), w(20, 8, 3, 3), "body", 1)], {}, "body_relu")
    s = b.add("relu", [conv(b.add("global_avg_pool2d", [x], {}, "squeeze"), w(reduced, 20, 1, 1), "down", 0)], {}, "dr")
    gate = b.add("sigmoid", [conv(s, w(20, reduced, 1, 1), "up", 0)], {}, "gate")
    return b.finish([b.add("mul", [x, gate], {}, "excite")])


def test_a_conv_whose_channels_no_block_divides_is_priced_in_the_fitted_block_a_one_layout_compile_runs_it_in():
    from tuner.te.layouts import fit_block
    space = model_layouts(_squeeze_excitation(4), ("NCHW", "NCHW8c", "NCHW16c"))
    assert space.domains["down"] == ("NCHW", "NCHW16c")           # 4 channels: blocks of 4 either way, once
    assert fit_block(4, 16) == fit_block(4, 8) == 4
    assert any(wl.layout == "NCHW16c" and wl.p["K"] == 4 for wl in space.unary["down"]["NCHW16c"])
    # 10 channels: blocks of 10 or 2 would run as scalars, so a compile in either pads them to 16
    # (PadChannels), which the solver does not price
    assert model_layouts(_squeeze_excitation(10), ("NCHW", "NCHW8c", "NCHW16c")).domains["down"] == ("NCHW",)


@pytest.mark.slow
def test_compile_quick_measures_every_task_the_compile_runs_squeeze_excitation_convs_included(tmp_cache, monkeypatch):
    """The compile pads the 20 channels (so quick's plan line is marked padded) and runs the conv
    down to 4 channels in NCHW16c, blocks of 4: quick measures that task, not the conv in NCHW."""
    import tuner.model_tuning as MT
    from tuner.graph.layout_plan import padded_graph
    monkeypatch.setattr(MT, "in_model_defaults", lambda *args, **kwargs: {})     # no record loses in the model
    g = _squeeze_excitation(4)
    assert padded_graph(g, "NCHW16c", {}) is not None
    log = tmp_cache.parent / "quick.jsonl"
    MT.quick_tune(g, 1, str(log), None, use_shipped=False, threads=1, progress=False)
    m = compile_model(g, threads=1, use_shipped=False, predict=False, log=str(log))
    anchors = [s for s in m.steps if s.anchor]
    assert any("K=4," in (s.workload or "") for s in anchors)
    assert anchors and all(s.source == str(log) for s in anchors), [(s.workload, s.source) for s in anchors]
    assert_matches_onnxruntime(m, g)


@pytest.mark.slow
def test_a_quick_log_of_a_padded_model_runs_the_default_of_each_task_its_in_model_check_found_faster(
        tmp_cache, monkeypatch):
    """compile --quick of a model whose compile pads its channels times its records beside their
    defaults in the model as the compile pads it (faked here: the first task that differs loses);
    the plan line names that task, and the compile from the log runs its default there."""
    import tuner.model_tuning as MT
    from tuner.runtime.artifact import IN_MODEL
    picked = {}

    def in_model_defaults(graph, log, tgt, layouts, choices, progress=True, **opts):
        m = compile_model(graph, log=log, target=str(tgt), layout_plan=layouts, **opts, **choices)
        picked.update(next({s.workload_key: s.code_hash} for s in m.steps if s.source == log and s.anchor))
        return dict(picked)
    monkeypatch.setattr(MT, "in_model_defaults", in_model_defaults)
    g = _narrow_then_wide()
    log = tmp_cache.parent / "quick.jsonl"
    res = MT.quick_tune(g, 1, str(log), None, use_shipped=False, threads=1, progress=False)
    assert res.record.defaults == picked and len(picked) == 1
    m = compile_model(g, threads=1, use_shipped=False, predict=False, log=str(log))
    [key] = picked
    assert {s.source for s in m.steps if s.workload_key == key} == {IN_MODEL}
    assert str(log) in {s.source for s in m.steps if s.workload_key != key}
    assert_matches_onnxruntime(m, g)


@pytest.mark.slow
@pytest.mark.untuned_check
def test_a_quick_log_of_a_padded_model_that_runs_slower_whole_than_no_log_is_left_out_of_its_compiles(
        tmp_cache, monkeypatch):
    """compile --quick of a model whose compile pads its channels times the model as the quick log
    compiles it against the compile with no log (the timing faked: the untuned compile 0.9 ms a
    round, the quick log's 1 ms); the untuned compile winning, the plan line says so, and a compile
    from that log warns and is the untuned compile, step for step."""
    import warnings

    import tuner.model_tuning as MT
    real, timed = MT.whole_times, []

    def whole_times(built, rounds=MT.CHOICE_ROUNDS):
        if set(built) != {"tuned", "untuned"}:
            return real(built, rounds)
        timed.append(built)
        return {"tuned": [1e-3] * rounds, "untuned": [0.9e-3] * rounds}
    monkeypatch.setattr(MT, "whole_times", whole_times)
    monkeypatch.setattr(MT, "in_model_defaults", lambda *args, **kwargs: {})
    g = _narrow_then_wide()
    log = tmp_cache.parent / "quick.jsonl"
    res = MT.quick_tune(g, 1, str(log), None, use_shipped=False, threads=1, progress=False)
    assert len(timed) == 1 and res.untuned_check["ratio"] == pytest.approx(0.9)
    assert res.record.untuned and records.load(log).plans[-1].untuned
    assert str(log) in {s.source for s in timed[0]["tuned"].steps}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_log = compile_model(g, log=str(log), threads=1)
    assert [s.code_hash for s in from_log.steps] == [s.code_hash for s in timed[0]["untuned"].steps]
    assert from_log.meta["logs"] == [] and any("untuned compile faster" in str(w.message) for w in caught)


def _record_beside_its_default(tmp_path, defaults: bool):
    """tiny in NCHW16c, a log with one conv task's record that is not its default schedule and a
    plan line that names that record as slower than the default in the model (or names none):
    (graph, log, target, the task's workload, the record's code hash, the default's code hash)."""
    from tuner.database.result import MeasureResult
    from tuner.graph.ir import graph_digest
    from tuner.target import parse_target
    from tuner.task import Task
    g, tgt = tiny(), parse_target("cpu -threads=1")
    wl = next(w for w, _ in model_layouts(g, ("NCHW16c",)).workloads() if w.op == "conv2d")
    task = Task(wl, tgt)
    default = task.default_candidate().code_hash
    rng = random.Random(0)
    cand = next(c for c in (task.from_decisions(task.space.sample(rng)) for _ in range(50)) if c.code_hash != default)
    log = tmp_path / "in_model.jsonl"
    plan = {n.name: "NCHW16c" for n in g.nodes if n.op == "conv2d"}
    records.append(log, [records.make_record(wl, str(tgt), cand.steps, MeasureResult("OK", costs=[1e-5] * 3),
                                             cand.code_hash, "random", 1, cand.decisions),
                         records.make_plan_record("tiny", graph_digest(g), str(tgt), plan, 1e-4, True,
                                                  defaults={wl.key: cand.code_hash} if defaults else {})])
    return g, log, tgt, wl, cand.code_hash, default


@pytest.mark.parametrize("defaults", [True, False])
def test_a_plan_runs_the_default_schedule_where_its_tune_timed_the_record_slower_in_the_model(tmp_cache, tmp_path,
                                                                                                defaults):
    from tuner.runtime.artifact import IN_MODEL
    g, log, tgt, wl, rec_hash, default = _record_beside_its_default(tmp_path, defaults)
    m = compile_model(g, log=str(log), threads=1, use_shipped=False, predict=False)
    mine = [s for s in m.steps if s.workload_key == wl.key]
    assert mine and all(s.code_hash == (default if defaults else rec_hash) for s in mine)
    assert all((s.source == IN_MODEL) == defaults for s in mine)
    if defaults:                 # a faster record of other code than the one the plan timed: it runs
        from tuner.database.result import MeasureResult
        from tuner.task import Task
        task, rng = Task(wl, tgt), random.Random(1)
        cand = next(c for c in (task.from_decisions(task.space.sample(rng)) for _ in range(50))
                    if c.code_hash not in (rec_hash, default))
        records.append(log, [records.make_record(wl, str(tgt), cand.steps, MeasureResult("OK", costs=[5e-6] * 3),
                                                 cand.code_hash, "random", 1, cand.decisions)])
        m = compile_model(g, log=str(log), threads=1, use_shipped=False, predict=False)
        assert {s.code_hash for s in m.steps if s.workload_key == wl.key} == {cand.code_hash}


@pytest.mark.untuned_check
@pytest.mark.parametrize("untuned_s", [0.9e-3, 0.99e-3])
def test_a_tune_whose_untuned_compile_runs_faster_whole_is_left_out_of_every_compile_of_that_model(
        tmp_cache, tmp_path, monkeypatch, untuned_s):
    """Last of all a tune times the model as it leaves it (its plan, choices and in-model defaults:
    one task's, faked here) against `tuner compile` with no log (untuned_check; the timing faked: the
    tuned model 1 ms a round, the untuned `untuned_s`). Where the untuned compile took at most
    UNTUNED_MARGIN of the time, the plan line is marked untuned, the table and `tuner analyze` say so,
    and a compile of the model warns and leaves the log out, step for step the untuned compile;
    otherwise a compile from the log is the tuned model that was timed."""
    import warnings

    import tuner.model_tuning as MT
    from tuner.analysis.model_report import analyze_model
    from tuner.runtime.artifact import IN_MODEL
    real, timed, picked = MT.whole_times, [], {}

    def whole_times(built, rounds=MT.CHOICE_ROUNDS):
        if set(built) != {"tuned", "untuned"}:
            return real(built, rounds)
        timed.append(built)
        return {"tuned": [1e-3] * rounds, "untuned": [untuned_s] * rounds}

    def in_model_defaults(graph, log, tgt, layouts, choices, progress=True):      # one record loses in the model
        m = compile_model(graph, log=log, target=str(tgt), layout_plan=layouts, **choices)
        picked.update(next({s.workload_key: s.code_hash} for s in m.steps if s.source == log))
        return dict(picked)
    monkeypatch.setattr(MT, "whole_times", whole_times)
    monkeypatch.setattr(MT, "in_model_defaults", in_model_defaults)
    log = tmp_path / "tiny.jsonl"
    res = tune_model("tiny", trials=19, log=str(log), target="cpu -threads=1", layouts=("NCHW8c",),
                     warmup_batch=1, progress=False)      # NCHW8c: not the untuned compile's layout
    lost = untuned_s <= MT.UNTUNED_MARGIN * 1e-3
    assert len(timed) == 1 and res.untuned_check["ratio"] == pytest.approx(untuned_s / 1e-3)
    assert res.record.untuned is lost and records.load(log).plans[-1].untuned is lost
    assert res.record.defaults == picked and len(picked) == 1
    assert ("the untuned compile kept" in res.table()) is lost and ("the tuned plan kept" in res.table()) is not lost
    code = {k: [s.code_hash for s in m.steps] for k, m in timed[0].items()}
    assert code["tuned"] != code["untuned"]
    assert [s.source for s in timed[0]["tuned"].steps].count(IN_MODEL) == 1
    assert str(log) in {s.source for s in timed[0]["tuned"].steps}
    assert str(log) not in {s.source for s in timed[0]["untuned"].steps}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_log = compile_model("tiny", log=str(log), threads=1)
    assert [s.code_hash for s in from_log.steps] == code["untuned" if lost else "tuned"]
    assert [s.code_hash for s in compile_model("tiny", threads=1).steps] == code["untuned"]
    assert (from_log.meta["layout_plan_from"] == str(log)) is not lost and (from_log.meta["logs"] == []) is lost
    assert any("untuned compile faster" in str(w.message) for w in caught) is lost
    [rep] = analyze_model(str(log))
    assert any("takes neither" in line for line in rep.sections()[0].notes) is lost


@pytest.mark.parametrize("tuned_s", [2e-3, 1e-3])
def test_in_model_defaults_names_the_records_whose_defaults_ran_faster_where_they_run(tmp_cache, tmp_path,
                                                                                      monkeypatch, tuned_s):
    """in_model_defaults compiles the plan with the log's records and with every default, times
    each step in the model (profile, faked here: the task's record takes `tuned_s` a step, every
    other step 1 ms) and names the task whose default took at most IN_MODEL_MARGIN of its time."""
    import numpy as np

    from tuner.model_tuning import IN_MODEL_ROUNDS, in_model_defaults
    from tuner.runtime.model import CompiledModel
    g, log, tgt, wl, rec_hash, _ = _record_beside_its_default(tmp_path, False)
    profiled = []

    def profile(self, inputs=None, runs=20):
        profiled.append(self)
        row = [tuned_s if s.code_hash == rec_hash else 1e-3 for s in self.steps]
        return np.array([row] * runs), np.full(runs, sum(row))
    monkeypatch.setattr(CompiledModel, "profile", profile)
    plan = records.load(log).plans[-1].layouts
    out = in_model_defaults(g, str(log), tgt, plan, {}, progress=False)
    assert out == ({wl.key: rec_hash} if tuned_s > 1e-3 else {})
    assert len(profiled) == 2 * IN_MODEL_ROUNDS and len({id(m) for m in profiled}) == 2
