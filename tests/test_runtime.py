"""tuner compile / run: whole models against ONNX Runtime, the memory plan, apply-best, artifacts, errors."""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.compiler import compile_model
from tuner.compiler.memory import Lifetime, peak_live_bytes, plan
from tuner.database import records
from tuner.graph.builder import GraphBuilder
from tuner.graph.models import _Net, googlenet, mobilenet_v2, resnet, tiny
from tuner.runtime import load

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from test_graph import _torch_style_model  # noqa: E402

from tuner.compare.peers import onnxruntime_runner  # noqa: E402


def assert_matches_onnxruntime(m, graph, onnx_path=None, seed=0):
    x = m.random_inputs(seed)
    ours = m.run(*x)
    ref = onnxruntime_runner(graph, 1, onnx_path)(x)
    assert len(ours) == len(ref) > 0
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= 1e-4 * max(np.ptp(b), 1e-3), np.abs(a - b).max()
    return ours


# ---------------------------------------------------------------- models against ONNX Runtime

@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: resnet(18, image=32), lambda: resnet(50, image=32),
                                  lambda: mobilenet_v2(image=32), lambda: googlenet(image=32)],
                         ids=["resnet18", "resnet50", "mobilenet_v2", "googlenet"])
def test_builtin_models_match_onnxruntime(tmp_cache, make):
    g = make()
    m = compile_model(g, threads=1)
    assert_matches_onnxruntime(m, g)
    assert m.meta["kernels"] < len(m.steps)              # equal kernels are built once and shared
    assert m.arena_bytes < m.meta["intermediate_bytes"]   # tensors that never live together share memory


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NCHW8c"])
def test_other_layouts_and_two_threads(tmp_cache, layout):
    g = tiny()
    assert_matches_onnxruntime(compile_model(g, threads=2, layout=layout), g)


def _inception_like():
    net = _Net("inception", 1)
    x = net.b.input("input", (2, 8, 10, 10), layout="NCHW")             # batch 2
    x = net.relu(net.bn(net.conv(x, 8, 16, 3), 16))
    a = net.relu(net.bn(net.conv(x, 16, 8, 1), 8))
    b = net.relu(net.bn(net.conv(net.relu(net.bn(net.conv(x, 16, 4, 1), 4)), 4, 8, 3), 8))
    c = net.b.add("max_pool2d", [x], {"kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "layout": "NCHW"},
                  "pool")
    c = net.relu(net.bn(net.conv(c, 16, 8, 1), 8))
    y = net.b.add("concat", [a, b, c], {"axis": 1}, "cat")             # branches joined on channels
    return net.b.finish([net.head(y, 24, 10)])


def _squeeze_excitation():
    net = _Net("se", 2)
    x = net.b.input("input", (1, 3, 12, 12), layout="NCHW")
    x = net.relu(net.bn(net.conv(x, 3, 32, 3, 2), 32))
    s = net.b.add("global_avg_pool2d", [x], {"layout": "NCHW"}, "squeeze")
    s = net.relu(net.conv(s, 32, 8, 1))
    s = net.b.add("sigmoid", [net.conv(s, 8, 32, 1)], {}, "gate")
    x = net.b.add("mul", [x, s], {}, "excite")                          # per-channel scale
    x = net.b.add("hard_swish", [net.bn(net.conv(x, 32, 16, 1), 16)], {}, "hswish")
    return net.b.finish([net.head(x, 16, 5)])


@pytest.mark.slow
@pytest.mark.parametrize("make", [_inception_like, _squeeze_excitation], ids=["inception", "squeeze_excitation"])
def test_branchy_models_match_onnxruntime(tmp_cache, make):
    g = make()
    assert_matches_onnxruntime(compile_model(g, threads=1), g)


def test_a_conv_after_a_concat_of_fitted_blocks_reads_them_as_they_are(tmp_cache):
    """Two 8-channel branches run in NCHW16c with blocks of 8 (16 does not divide 8, and padding 8
    channels to 16 would cost as much as the small block); their 16-channel concat keeps blocks of
    8, and the conv after it reads those (ib=8), its weight laid out to match, rather than the 16
    its layout would give 16 channels."""
    net = _Net("fitted", 3)
    x = net.b.input("input", (1, 8, 6, 6), layout="NCHW")
    y = net.b.add("concat", [net.conv(x, 8, 8, 1), net.conv(x, 8, 8, 1)], {"axis": 1}, "cat")
    g = net.b.finish([net.conv(y, 16, 32, 1)])
    m = compile_model(g, threads=1, layout="NCHW16c")
    assert any(s.anchor and "C=16" in s.workload and "ib=8" in s.workload for s in m.steps)
    assert_matches_onnxruntime(m, g)


def _concat_of_small_blocks(tail: str):
    """MixNet's block: a 48-channel conv split in two, a depthwise conv on each 24 (blocks of 8 in
    NCHW16c), concatenated to 48 (held in blocks of 8, where 16 divides 48), then `tail`."""
    net = _Net("small_blocks", 4)
    x = net.b.input("input", (1, 8, 6, 6), layout="NCHW")
    h = net.conv(x, 8, 48, 1)
    halves = [net.b.add("slice", [h], {"begin": [0, c, 0, 0], "step": [1] * 4, "shape": [1, 24, 6, 6]}, f"half{c}")
              for c in (0, 24)]
    parts = [net.relu(net.conv(v, 24, 24, k, groups=24)) for v, k in zip(halves, (3, 5))]
    y = net.b.add("concat", parts, {"axis": 1}, "cat")
    if tail == "depthwise":
        y = net.conv(y, 48, 48, 3, groups=48)
    elif tail in ("max_pool2d", "avg_pool2d"):
        y = net.b.add(tail, [y], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "layout": "NCHW"}, "pool")
    elif tail == "winograd":
        y = net.b.add("conv2d", [y, net.b.const(net.rng.normal(0, 0.2, (16, 48, 3, 3)).astype(np.float32), "w")],
                      {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "groups": 1, "layout": "NCHW",
                       "kernel_layout": "OIHW"}, "tail")
    else:                           # squeeze-excitation: the gate's 48 channels arrive in blocks of 16
        s = net.b.add("global_avg_pool2d", [y], {"layout": "NCHW"}, "squeeze")
        s = net.b.add("sigmoid", [net.conv(net.relu(net.conv(s, 48, 8, 1)), 8, 48, 1)], {}, "gate")
        y = net.b.add("mul", [y, s] if tail == "excite" else [s, y], {}, "excite")
    return net.b.finish([y])


@pytest.mark.parametrize("tail", ["depthwise", "max_pool2d", "avg_pool2d", "excite", "excite_gate_first", "winograd"])
def test_what_reads_a_concat_held_in_smaller_blocks_than_its_layout_gets_its_data_as_it_is(tmp_cache, tail):
    """MixNet's mixed-kernel depthwise convs: branches of 120 channels run in NCHW16c in blocks of 8,
    and so is their 240-channel concat, where NCHW16c's own block would be 16. A task that reads its
    layout's block (a depthwise conv, a pooling, a Winograd input transform) gets the data re-laid
    to it, and an elementwise op's operands come in one block, never a kernel reading 8-channel
    blocks as 16 (the garbage this gave) nor a failed compile."""
    g = _concat_of_small_blocks(tail)
    plan = {"tail": "winograd2@NCHW16c"} if tail == "winograd" else None
    for threads in (1, 2):
        m = compile_model(g, threads=threads, layout="NCHW16c", layout_plan=plan)
        assert_matches_onnxruntime(m, g)
    if tail == "winograd":
        assert any(s.workload.startswith("winograd_input") for s in m.steps), [s.workload for s in m.steps]


@pytest.mark.slow
def test_an_onnx_file_with_many_operators_matches_onnxruntime(tmp_cache, tmp_path):
    path = str(_torch_style_model(tmp_path / "torchish.onnx"))     # clip, hard_swish, concat, pad, softmax, ...
    from tuner.graph import load as load_graph
    m = compile_model(path, threads=1)
    assert_matches_onnxruntime(m, load_graph(path), path)
    assert any(s.source == "generic" and "softmax" in s.summary for s in m.steps)


def test_a_torch_exported_grouped_conv_runs_in_a_block_its_groups_take_and_matches_onnxruntime(tmp_cache, tmp_path):
    """A grouped 3x3 conv of group width 8 (RegNet's, ResNeXt's) compiles in blocks of 8, not in
    NCHW, when the default layout's block (16 on AVX-512) is wider than its groups."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the [bench] extra)")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 24, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=3), torch.nn.ReLU(),
                              torch.nn.Conv2d(24, 48, 1, groups=3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(48, 4)).eval()
    path = str(tmp_path / "grouped.onnx")
    torch.onnx.export(net, (torch.randn(1, 3, 10, 10),), path, input_names=["input"], dynamo=False)
    from tuner.graph import load as load_graph
    for layout in ("NCHW16c", "NCHW8c"):
        m = compile_model(path, threads=1, layout=layout)
        grouped = [s.workload for s in m.steps if "groups=3" in s.workload]
        assert len(grouped) == 2 and not any(w.endswith("[NCHW]") for w in grouped), grouped
        assert_matches_onnxruntime(m, load_graph(path), path)


def test_a_torch_exported_resnext_stage_keeps_its_narrow_groups_in_its_neighbours_block(tmp_cache, tmp_path):
    """Group width 4 (ResNeXt-50's first stage), strided too, in NCHW16c and NCHW8c: each block
    holds whole groups, so the grouped convs run in their neighbours' layout with no transform
    between them (only the input's and the output's remain), and the model matches ONNX Runtime."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the [bench] extra)")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                        nn.Conv2d(32, 32, 3, padding=1, groups=8), nn.BatchNorm2d(32), nn.ReLU(),
                        nn.Conv2d(32, 64, 1), nn.ReLU(), nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=16), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 4)).eval()
    path = str(tmp_path / "resnext.onnx")
    torch.onnx.export(net, (torch.randn(1, 3, 10, 10),), path, input_names=["input"], dynamo=False)
    from tuner.graph import load as load_graph
    for layout in ("NCHW16c", "NCHW8c"):
        m = compile_model(path, threads=1, layout=layout)
        grouped = [s.workload for s in m.steps if "groups=" in s.workload]
        assert len(grouped) == 2 and all(w.endswith(f"[{layout}]") for w in grouped), grouped
        assert sum("layout_transform" in s.summary for s in m.steps) == 2, [s.summary for s in m.steps]
        assert_matches_onnxruntime(m, load_graph(path), path)


def test_a_torch_exported_model_matches_onnxruntime(tmp_cache, tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (the [bench] extra)")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU6(),
                              torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.Hardswish(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 4)).eval()
    path = str(tmp_path / "torch.onnx")
    torch.onnx.export(net, (torch.randn(1, 3, 8, 8),), path, input_names=["input"], dynamo=False)
    from tuner.graph import load as load_graph
    m = compile_model(path, threads=1)
    ours = assert_matches_onnxruntime(m, load_graph(path), path)
    x = m.random_inputs(0)[0]
    with torch.no_grad():
        np.testing.assert_allclose(ours[0], net(torch.from_numpy(x)).numpy(), atol=1e-4)


# ---------------------------------------------------------------- every schedule is right in context

@pytest.mark.slow
def test_random_legal_schedules_give_the_default_output(tmp_cache):
    """apply-best applies what it is given, and any legal schedule of any task is correct next to its
    neighbours' layouts: random points of every task's space give the default schedules' output."""
    g = mobilenet_v2(image=32)
    base = compile_model(g, threads=1)
    x = base.random_inputs(4)
    want = base.run(*x)[0]
    rng = random.Random(0)
    m = compile_model(g, threads=1, choose=lambda task: task.space.steps(task.space.sample(rng)))
    chosen = [s for s in m.steps if s.source == "chosen"]
    assert len(chosen) == sum(s.anchor for s in m.steps) > 30
    got = m.run(*x)[0]
    assert np.abs(got - want).max() <= 1e-4 * np.ptp(want)


# ---------------------------------------------------------------- the memory plan

lifetimes = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 6)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(lifetimes)
def test_tensors_alive_together_never_share_memory(items):
    ts = [Lifetime(f"t{k}", n, a, a + d) for k, (n, a, d) in enumerate(items)]
    offsets, size = plan(ts)
    assert set(offsets) == {t.name for t in ts}
    for i, t in enumerate(ts):
        assert offsets[t.name] % 64 == 0 and offsets[t.name] + t.nbytes <= size
        for u in ts[i + 1:]:
            if t.first <= u.last and u.first <= t.last:
                a0, b0 = offsets[t.name], offsets[u.name]
                assert a0 + t.nbytes <= b0 or b0 + u.nbytes <= a0, (t, u)
    assert size >= peak_live_bytes(ts)


# each array: a length, and a pattern that makes it equal to another drawn alike, or unlike
# it only outside the sampled elements of _sample_hash (a 200,000-long array sampled every 3rd)
weight_arrays = st.lists(st.tuples(st.sampled_from([0, 1, 5, 16, 200_000]), st.integers(0, 2),
                                   st.sampled_from(["same", "sign of zero", "off the sample"])), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(weight_arrays)
def test_weights_are_laid_out_each_content_once_and_read_back_as_they_were(items):
    from tuner.compiler.compile_model import _Weights
    arrays = []
    for n, seed, change in items:
        a = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        if n and change == "sign of zero":
            a[0] = -0.0 if seed % 2 else 0.0          # equal as floats, not as bytes: stored apart
        elif n > 3 and change == "off the sample":
            a[1] += seed                              # index 1 is outside the sample of a long array
        arrays.append(a)
    w = _Weights()
    offsets = [w.add(a) for a in arrays]
    out = np.full(w.size + 64, 0xAB, np.uint8)
    w.fill(out)
    assert (out[w.size:] == 0xAB).all() and w.size % 64 == 0
    for a, off in zip(arrays, offsets):
        assert off % 64 == 0
        assert out[off:off + a.nbytes].tobytes() == a.tobytes()
    for a, off in zip(arrays, offsets):         # one offset per content, one content per offset
        assert all((off == o) == (a.tobytes() == b.tobytes()) for b, o in zip(arrays, offsets) if a.nbytes and b.nbytes)


def test_a_dense_weight_is_packed_into_the_storage_once_per_source_and_block():
    from tuner.compiler.compile_model import _Packed, _Weights
    from tuner.te.layouts import dense_weight_from_oi
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((20, 8)).astype(np.float32), rng.standard_normal((20, 8)).astype(np.float32)
    w = _Weights()
    items = [_Packed(a, 16), _Packed(a.copy(), 16), _Packed(a, 8), a, _Packed(b, 16)]
    offs = [w.add(x) for x in items]
    assert offs[0] == offs[1] and len(set(offs)) == 4       # equal sources packed alike share; nothing else does
    out = np.zeros(w.size, np.uint8)
    w.fill(out)
    for x, off in zip(items, offs):
        want = dense_weight_from_oi(x.source, x.block) if isinstance(x, _Packed) else x
        assert out[off:off + want.nbytes].tobytes() == want.tobytes()


# ---------------------------------------------------------------- apply-best, reports, --strict

def _record_for(task, target: str, cost: float):
    steps = task.space.steps(task.space.default())
    cand = task.candidate(steps, func_name="kernel")
    from tuner.database.result import MeasureResult
    return records.make_record(task.workload, target, steps, MeasureResult("OK", costs=[cost] * 3), cand.code_hash,
                               "test", 0)


@pytest.mark.slow
def test_a_record_applies_on_any_core_count_with_the_same_isa_and_threads(tmp_cache, tmp_path):
    from tuner.graph.passes import optimize
    from tuner.target import host_isa, parse_target
    from tuner.task import Task
    g = tiny()
    tasks = [t for t in optimize(g, layout="NCHW16c").meta["tasks"] if t.tunable]
    log = tmp_path / "tiny.jsonl"
    here = parse_target("cpu -cores=7 -threads=1")
    recs = [_record_for(Task(t.workload, here), f"cpu -isa={host_isa()} -cores=2 -threads=1", 1e-5) for t in tasks]
    recs.append(_record_for(Task(tasks[0].workload, here), f"cpu -isa={host_isa()} -cores=2 -threads=2", 1e-9))
    records.append(log, recs)
    m = compile_model(g, log=str(log), target="cpu -cores=7 -threads=1", use_shipped=False)
    anchors = [s for s in m.steps if s.anchor]
    assert anchors and all(s.source == str(log) and s.expected_s == pytest.approx(1e-5) for s in anchors)
    assert "warning" not in m.report()
    assert_matches_onnxruntime(m, g)
    two = compile_model(g, log=str(log), threads=2, use_shipped=False)       # the 2-thread record: one task only
    assert sum(s.source == str(log) for s in two.steps) == sum(s.workload == tasks[0].workload.label
                                                                for s in two.steps)


@pytest.mark.slow
def test_a_thread_count_with_no_records_runs_another_counts_decisions_parallelised_and_its_plan(tmp_cache, tmp_path):
    """A log with records and a layout plan for 1 thread of this ISA and none for 2: a 2-thread
    compile renders each record's decisions with the 2-thread space (its outer loops parallel),
    names the source 'other threads' and promises no time, counts those tasks in the one untuned
    warning (--strict refuses them), takes the 1-thread plan, and computes what ONNX Runtime does."""
    from tuner.compiler import UntunedError
    from tuner.database.result import MeasureResult
    from tuner.graph.ir import graph_digest, graph_structure
    from tuner.graph.passes import optimize
    from tuner.target import host_isa, parse_target
    from tuner.task import Task
    g = tiny()
    one, two = (parse_target(f"cpu -isa={host_isa()} -cores=2 -threads={n}") for n in (1, 2))
    tasks = [t for t in optimize(g, layout="NCHW16c").meta["tasks"] if t.tunable]
    log, rng, points = tmp_path / "one-thread.jsonl", random.Random(0), {}
    for t in tasks:
        task = Task(t.workload, one)
        points[t.workload.key] = dec = task.space.sample(rng)
        steps = task.space.steps(dec)
        records.append(log, [records.make_record(t.workload, str(one), steps, MeasureResult("OK", costs=[1e-5] * 3),
                                                 task.candidate(steps).code_hash, "test", 0, decisions=dec)])
    plan = {n.name: "NCHW16c" for n in g.nodes if n.op == "conv2d"}
    records.append(log, [records.PlanRecord("tiny", graph_digest(g), str(one), plan, 1e-4, structure=graph_structure(g))])
    m = compile_model(g, log=str(log), target=str(two), use_shipped=False)
    anchors = [s for s in m.steps if s.anchor]
    assert len({s.workload_key for s in anchors}) == len(tasks) > 2
    for s in anchors:
        space = Task(next(t.workload for t in tasks if t.workload.key == s.workload_key), two).space
        assert s.source == "other threads" and s.expected_s is None
        assert s.steps == space.steps(points[s.workload_key]) and any("parallel" in st for st in s.steps)
    assert m.meta["layout_plan"] == plan and m.meta["layout_plan_from"] == f"{log}, 1 thread"
    assert f"{len(tasks)} run a record of another thread count, parallelised for this one" in m.report()
    assert_matches_onnxruntime(m, g)
    with pytest.raises(UntunedError, match=f"--strict: {len(tasks)} task"):
        compile_model(g, log=str(log), target=str(two), use_shipped=False, strict=True)


def test_untuned_tasks_are_named_in_one_warning_and_strict_fails(tmp_cache):
    from tuner.compiler import UntunedError
    m = compile_model(tiny(), threads=1, use_shipped=False)
    report = m.report()
    assert report.count("warning:") == 1 and "7 task(s)" in report and "99.9% of the model's FLOPs" in report
    with pytest.raises(UntunedError, match="--strict: 7 task"):
        compile_model(tiny(), threads=1, use_shipped=False, strict=True)


@pytest.mark.predict
def test_a_task_with_no_record_runs_the_cost_models_pick_the_same_one_at_every_compile(tmp_cache):
    """With no record (no log, nothing shipped) each task of an operator the pre-trained model learnt
    runs its pick, named 'predicted' in the report and counted in its one warning (the others run
    their defaults); two compiles give the same kernels,
    which compute what ONNX Runtime computes; predict=False runs the default schedules."""
    from tuner.search.predict import Predictor
    from tuner.target import parse_target
    ops = Predictor(parse_target("cpu", 1)).ops
    if "conv2d" not in ops:
        pytest.skip("no pre-trained cost model ships for this host's ISA at 1 thread and this version of the space")
    g = tiny()
    m = compile_model(g, threads=1, use_shipped=False)
    tasks = {s.workload: s.source for s in m.steps if s.anchor and s.workload_key}
    picked = {w for w in tasks if w.split(":")[0] in ops}
    assert picked and all(tasks[w] == ("predicted" if w in picked else "default") for w in tasks)
    left = f" and {len(tasks) - len(picked)} run the default schedule" if len(tasks) > len(picked) else ""
    assert f"{len(tasks)} task(s)" in m.report() and f"{len(picked)} run the cost model's pick (predicted, not " \
        f"measured){left}" in m.report()
    assert [s.code_hash for s in compile_model(g, threads=1, use_shipped=False).steps] == [s.code_hash for s in m.steps]
    assert_matches_onnxruntime(m, g)
    plain = compile_model(g, threads=1, use_shipped=False, predict=False)
    assert all(s.source == "default" for s in plain.steps if s.anchor and s.workload_key)
    assert "7 run the default schedule" in plain.report()


# ---------------------------------------------------------------- the artifact

def test_save_load_run_and_input_checks(tmp_cache, tmp_path, monkeypatch):
    g = tiny()
    m = compile_model(g, threads=1)
    x = m.random_inputs(1)
    want = m.run(*x)[0]
    m.save(tmp_path / "art")
    m2 = load(tmp_path / "art")
    np.testing.assert_array_equal(m2.run(input=x[0])[0], want)
    prof, runs = m2.profile(x, runs=3)              # every step timed in context, every run
    assert prof.shape == (3, len(m2.steps)) and (prof > 0).all() and np.isfinite(prof).all()
    assert runs.shape == (3,) and (runs >= prof.sum(axis=1)).all()
    meta = json.loads((tmp_path / "art" / "model.json").read_text())
    assert meta["model_hash"] and meta["target"].startswith("cpu -isa=") and meta["tool"].startswith("tuner ")
    from tuner.errors import UserError
    with pytest.raises(UserError, match="inputs are input; unknown: image; missing: input"):
        m2.run(image=x[0])
    with pytest.raises(UserError, match="must have shape 1x3x16x16, got 1x3x8x8"):
        m2.run(x[0][:, :, :8, :8])
    with pytest.raises(UserError, match="must be float32, got float64"):
        m2.run(x[0].astype(np.float64))
    monkeypatch.setattr("tuner.runtime.model.host_isa", lambda: "sse")
    with pytest.raises(UserError, match="compiled for .* this host supports sse"):
        load(tmp_path / "art")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_compile_quick_measures_n_candidates_per_task_into_a_log_beside_the_model_and_resumes(tmp_cache, tmp_path,
                                                                                             capsys):
    """tuner compile --quick N: a tune in which each task measures N candidates (the default and the
    cost model's picks), logged to OUTPUT.jsonl, then the compile applies that log; run again it
    measures nothing new; a bad N and a --time-limit without --quick are one-line errors."""
    from tuner.cli import main
    from tuner.runtime.artifact import IN_MODEL
    art = tmp_path / "tiny"
    assert main(["compile", "tiny", "--threads", "1", "--quick", "2", "-o", str(art)]) == 0
    log = tmp_path / "tiny.jsonl"
    measured = [r for r in records.load(log).records if r.policy != "confirm"]
    per_task = {}
    for r in measured:
        per_task[r.workload.key] = per_task.get(r.workload.key, 0) + 1
    assert per_task and max(per_task.values()) == 2 and all(r.ok for r in measured)
    steps = json.loads((art / "model.json").read_text())["steps"]
    named = records.load(log).plans[-1].defaults          # a record that lost to its default in the model
    assert all(s["source"] == str(log) or (s["source"] == IN_MODEL and s["workload_key"] in named)
               for s in steps if s["workload_key"])
    out = capsys.readouterr().out
    assert "--quick 2:" in out and f"{len(measured)} candidates measured" in out
    assert main(["compile", "tiny", "--threads", "1", "--quick", "2", "-o", str(art)]) == 0
    assert "0 candidates measured" in capsys.readouterr().out
    for bad, why in ((["--quick", "0"], "--quick 0: give a number"), (["--time-limit", "5"], "give --quick too")):
        assert main(["compile", "tiny", "-o", str(tmp_path / "x"), *bad]) == 2
        assert why in capsys.readouterr().err


@pytest.mark.slow
def test_quick_measures_the_tasks_of_the_plan_the_compile_applies_even_one_of_another_thread_count(tmp_cache, tmp_path):
    """A log holds a 1-thread layout plan of tiny (its first conv in NCHW8c): --quick at 2 threads
    measures that plan's tasks (the conv's NCHW8c task, not its NCHW16c one), its log's plan is the
    same plan, and the compile applies it."""
    from tuner.graph.ir import graph_digest, graph_structure
    from tuner.graph.layout_plan import model_layouts
    from tuner.model_tuning import quick_tune
    from tuner.runtime.artifact import IN_MODEL
    from tuner.target import host_isa
    g = tiny()
    convs = [n.name for n in g.nodes if n.op == "conv2d"]
    plan = {c: ("NCHW8c" if c == convs[0] else "NCHW16c") for c in convs}
    space = model_layouts(g, ("NCHW16c", "NCHW8c"))
    fixed = space.restricted(plan)
    assert fixed.domains[convs[0]] == ("NCHW8c",) and set(fixed.unary[convs[0]]) == {"NCHW8c"}
    mine = {wl.key for wl, _ in fixed.workloads()}
    only16 = {wl.key for wl in space.unary[convs[0]]["NCHW16c"]} - mine
    assert only16 and mine < {wl.key for wl, _ in space.workloads()}
    planlog, log = tmp_path / "plans.jsonl", tmp_path / "quick.jsonl"
    records.append(planlog, [records.PlanRecord("tiny", graph_digest(g), f"cpu -isa={host_isa()} -cores=2 -threads=1", plan,
                                                1e-4, structure=graph_structure(g))])
    quick_tune(g, 1, str(log), "NCHW16c", plan_logs=[str(planlog)], use_shipped=False, threads=2, progress=False)
    logged = records.load(log)
    assert {r.workload.key for r in logged.records} == mine
    assert logged.plans[-1].layouts == plan
    m = compile_model(g, log=[str(log), str(planlog)], threads=2, use_shipped=False)
    assert m.meta["layout_plan"] == plan and m.meta["layout_plan_from"] == str(log)
    named = logged.plans[-1].defaults              # records that lost to their defaults in the model
    assert all(s.source == str(log) or (s.source == IN_MODEL and s.workload_key in named) for s in m.steps if s.anchor)


@pytest.mark.slow
def test_cli_compile_run_and_errors(tmp_path):
    import os
    env = dict(os.environ, TUNER_CACHE_DIR=str(tmp_path / "cache"))
    art = tmp_path / "tiny"
    p = _cli("compile", "tiny", "--threads", "1", "-o", str(art), env=env)
    assert p.returncode == 0, p.stderr
    assert re.search(r"conv2d \+ add \+ relu\s+(shipped|predicted|default)\s", p.stdout), p.stdout   # each task's source
    assert "default" not in p.stdout or "run the default schedule (tune them: tuner tune)" in p.stdout
    p = _cli("run", str(art), "--random", "-o", str(tmp_path / "y.npy"), env=env)
    assert p.returncode == 0 and "fc_bias: 1x10" in p.stdout
    assert np.load(tmp_path / "y.npy").shape == (1, 10)
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 4, 4), np.float32))
    p = _cli("run", str(art), "--input", f"input={tmp_path / 'bad.npy'}", env=env)
    assert p.returncode == 2 and "must have shape 1x3x16x16" in p.stderr and "Traceback" not in p.stderr
    p = _cli("bench", str(art), "--compare", "onnxruntime", "--threads", "1", "--rounds", "1", env=env)
    assert p.returncode == 0 and "onnxruntime" in p.stdout and "executor overhead" in p.stdout, p.stderr
    p = _cli("bench", str(art), "--threads", "1,x", env=env)
    assert p.returncode == 2 and "--threads must be numbers" in p.stderr
    p = _cli("run", str(tmp_path), "--random", env=env)
    assert p.returncode == 2 and "is not a compiled model" in p.stderr
    # an operator tuner cannot compile is named with its node: at import (a 4-D convolution), and where
    # the kernel library meets a node it has no kernel for (a pad that crops, built directly)
    from onnx import TensorProto, helper, numpy_helper

    from tuner.ops.registry import Unsupported
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv4d")], "odd",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.ones((3, 2, 1, 1, 1, 1), np.float32), "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "odd.onnx")
    p = _cli("compile", str(tmp_path / "odd.onnx"), "-o", str(tmp_path / "odd"), env=env)
    assert p.returncode == 2 and "'conv4d' (Conv): only 1-D, 2-D and 3-D convolutions" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    b = GraphBuilder("odd")
    x = b.input("x", (1, 4, 6, 6), layout="NCHW")
    y = b.add("relu", [b.add("pad", [x], {"pads": [0, 0, -1, 0, 0, 0, 0, 0]}, "croppad")])
    with pytest.raises(Unsupported, match="pad node .croppad.: negative pads .* the kernel library cannot compile it"):
        compile_model(b.finish([y]), use_shipped=False)


def _vm_flags(address: int) -> list:
    """The VmFlags of the mapping of this process that holds `address` (Linux /proc/self/smaps)."""
    flags, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    return flags


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are a Linux feature")
def test_weights_and_arena_of_2_mib_or_more_are_advised_huge_pages_and_small_ones_are_not():
    """Storage of 2 MiB or more starts on a 2 MiB boundary in a mapping advised MADV_HUGEPAGE
    (VmFlags `hg`), zeroed and writable; smaller storage is 64-byte aligned and not asked for (its
    heap mapping may share flags with a neighbour, so its VmFlags are not checked)."""
    import mmap

    from tuner.runtime.model import HUGE_PAGE, _aligned_bytes
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("this Python's mmap has no MADV_HUGEPAGE")
    big, huge = _aligned_bytes(HUGE_PAGE + 100)
    assert huge and big.ctypes.data % HUGE_PAGE == 0 and big.nbytes >= HUGE_PAGE + 100
    assert not big.any()
    big[-1] = 1.0
    assert "hg" in _vm_flags(big.ctypes.data)
    small, huge = _aligned_bytes(1000)
    assert not huge and small.ctypes.data % 64 == 0 and small.nbytes >= 1000


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5), rounds=st.integers(1, 12))
def test_interleaved_timing_rotates_the_turn_so_every_runner_takes_every_place_alike(n, rounds):
    from tuner.compare.peers import interleaved
    order = []
    runners = {f"r{k}": (lambda _inputs, k=k: order.append(k)) for k in range(n)}
    out = interleaved(runners, None, rounds=rounds, min_seconds=0.0, settle=0.0)
    assert all(len(v) == rounds for v in out.values()) and len(out) == n
    each = len(order) // (n * rounds)                   # time_call's calls per turn (a warm-up, then 3)
    assert each >= 3 and len(order) == each * n * rounds
    turns = [order[i:i + each * n:each] for i in range(0, len(order), each * n)]
    assert len(turns) == rounds
    for r, turn in enumerate(turns):
        assert turn == [(k + r) % n for k in range(n)]


def test_interleaved_timing_idles_before_every_turn_so_no_runner_meets_the_last_ones_spinning_threads(monkeypatch):
    from tuner.measure import interleave
    events = []
    monkeypatch.setattr(interleave.time, "sleep", lambda s: events.append(("idle", s)))
    runners = {name: (lambda _inputs, name=name: events.append(("run", name))) for name in ("tuner", "onnxruntime")}
    interleave.interleaved(runners, None, rounds=3, min_seconds=0.0)
    turns = [k for k in range(1, len(events)) if events[k][0] == "run" and events[k - 1][0] != "run"]
    assert len(turns) == 6
    assert all(events[k - 1] == ("idle", interleave.SETTLE_S) for k in turns) and interleave.SETTLE_S >= 0.1
    events.clear()
    interleave.interleaved(runners, None, rounds=2, min_seconds=0.0, settle=0.0)
    assert {e for e in events if e[0] == "idle"} <= {("idle", 0.0)}


def test_bench_settle_times_a_model_right_after_onnx_runtime_and_after_the_pause(tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx

    from bench import settle
    from tuner.graph.onnx_frontend import to_onnx
    from tuner.measure.interleave import SETTLE_S
    path = tmp_path / "tiny.onnx"
    onnx.save(to_onnx(tiny()), path)
    out = tmp_path / "settle.json"
    assert settle.main(["--models", str(path), "--threads", "1", "--rounds", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["settle_s"] == SETTLE_S and [r["way"] for r in res["rows"]] == list(settle.WAYS)
    for r in res["rows"]:
        assert len(r["tuner_rounds_s"]) == len(r["onnxruntime_rounds_s"]) == 2
        assert r["tuner_ms"] > 0 and r["onnxruntime_ms"] > 0 and r["tuner_vs_onnxruntime"] > 0


def test_importing_tuner_and_its_cost_model_leaves_the_openmp_wait_policy_alone():
    """xgboost's OpenMP runtime starts passive; the variable is put back, so a compiled model's
    own OpenMP runtime, loaded later in the process, spins between steps instead of sleeping
    (passive, each of MobileNetV2's 56 steps paid a wake-up: 2 threads ran slower than 1)."""
    code = ("import os, tuner; from tuner.cost_model.model import _xgboost; _xgboost(); "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"


def test_steps_ab_pairs_the_steps_two_artifacts_schedule_differently_and_refuses_two_models(tmp_path):
    """bench.steps_ab: two compiles of one model whose first conv task runs another schedule
    differ in that task's steps only; it lists them, pairs their sum beside the unchanged steps'
    and writes both to JSON. Artifacts of two models are refused."""
    from bench import steps_ab
    g = tiny()
    first = []

    def choose(task):
        sp = task.space
        if sp.kind == "tiled" and not first:
            first.append(task.workload.key)
        dec = sp.default()
        if task.workload.key in first:
            dec = dict(dec, unroll=0 if dec.get("unroll") else 16)
        return sp.steps(dec)

    a, b = tmp_path / "a", tmp_path / "b"
    compile_model(g, threads=1, use_shipped=False, predict=False).save(a)
    compile_model(g, threads=1, use_shipped=False, predict=False, choose=choose).save(b)
    out = tmp_path / "ab.json"
    assert steps_ab.main([f"old={a}", f"new={b}", "--rounds", "1", "--runs", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    m = load(b)
    changed = [i for i, s in enumerate(m.steps) if s.workload_key in first]
    assert changed and [r["step"] for r in res["rows"]] == changed
    assert res["changed_steps"] == len(changed) and res["unchanged_steps"] == len(m.steps) - len(changed)
    assert res["changed_a_ms"] > 0 and res["changed_b_ms"] > 0 and res["changed_paired"] > 0
    other = tmp_path / "other"
    compile_model(resnet(18, 8, 1), threads=1, use_shipped=False, predict=False).save(other)
    with pytest.raises(SystemExit, match="not one model's plan"):
        steps_ab.main([f"old={a}", f"new={other}", "--rounds", "1"])
    with pytest.raises(SystemExit, match="the same code, in place in the same steps"):
        steps_ab.main([f"old={a}", f"new={a}", "--rounds", "1"])
