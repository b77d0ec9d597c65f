"""Spilled accumulators: read from a kernel's object, and the untuned compile's lighter variants where
the default's code carries them through the stack."""
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import check_schedules
from tuner.ops import parse_spec
from tuner.space.sketch import SearchSpace
from tuner.target import host_isa, parse_target
from tuner.toolchain.spills import MIN_FMAS, SPILLED_FMAS, spilled_in

AVX2 = parse_target("cpu -isa=avx2 -threads=1", check_host=False)
needs_avx2 = pytest.mark.skipif(host_isa() not in ("avx2", "avx512"), reason="builds and runs AVX2 code")


def _listing(lines: list, start: int = 0x900) -> str:
    """objdump -d's text of one function whose instructions are `lines`, 4 bytes apart."""
    return "0000000000000000 <k>:\n" + "".join(f"     {start + 4 * k:x}:\t{op}\n" for k, op in enumerate(lines))


def _loop(body: list, start: int = 0x900) -> list:
    return body + [f"jne    {start:x} <k+0x{start:x}>"]


FMAS = [f"vfmadd231ps %ymm3,%ymm{k + 4},%ymm{k}" for k in range(MIN_FMAS)]


def test_an_accumulator_loaded_and_stored_round_one_fma_each_trip_is_a_spill():
    spilled = _loop(["vmovaps 0x128(%rsp),%ymm9", "vbroadcastss (%rax),%ymm3", "vfmadd231ps %ymm3,%ymm6,%ymm9",
                     "vmovaps %ymm9,0x128(%rsp)", *FMAS])
    assert spilled_in(_listing(spilled)) == 1
    # the load may sit below the store: the loop's top reloads what its bottom stored
    assert spilled_in(_listing(_loop(["vfmadd231ps %ymm3,%ymm6,%ymm9", "vmovaps %ymm9,-0x40(%rbp)", *FMAS,
                                      "vmovaps -0x40(%rbp),%ymm9"]))) == 1


def test_a_local_tile_kept_in_memory_many_products_a_trip_and_a_loop_without_fmas_hold_no_spill():
    tile = ["vmovaps 0x40(%rsp),%ymm0"] + ["vfmadd231ps (%rdx),%ymm3,%ymm0"] * (SPILLED_FMAS + 1) + \
        ["vmovaps %ymm0,0x40(%rsp)"] + FMAS
    assert spilled_in(_listing(_loop(tile))) == 0
    few = _loop(["vmovaps 0x40(%rsp),%ymm0", "vfmadd231ps %ymm3,%ymm6,%ymm0", "vmovaps %ymm0,0x40(%rsp)"])
    assert spilled_in(_listing(few)) == 0             # fewer than MIN_FMAS: no register tile's reduction
    assert spilled_in(_listing(["vmovaps 0x128(%rsp),%ymm9", "vfmadd231ps %ymm3,%ymm6,%ymm9",
                                "vmovaps %ymm9,0x128(%rsp)", *FMAS])) == 0        # no loop


def test_only_innermost_loops_are_read():
    """A slot that an outer loop stores and reloads around its inner loop is no spill of that loop."""
    inner = _loop(FMAS, start=0x908)
    outer = ["vmovaps 0x128(%rsp),%ymm9", "vmovaps %ymm0,%ymm1", *inner, "vfmadd231ps %ymm3,%ymm6,%ymm9",
             "vmovaps %ymm9,0x128(%rsp)", "jne    900 <k+0x900>"]
    assert spilled_in(_listing(outer)) == 0


@pytest.mark.parametrize("spec, first", [
    ("C=288,H=22,W=22,K=32,R=1,S=1,stride=1,pad=0", [1, 1, 1]),       # blocked, 2 rows a chunk: one row first
    ("C=64,H=14,W=14,K=64,R=3,S=3,stride=2,pad=1,groups=2", None),    # unblocked: the row one pixel shorter
    ("C=144,H=56,W=56,K=144,R=3,S=3,stride=1,pad=1,groups=144", None),  # depthwise: 8 pixels as 7
])
def test_lighter_variants_of_an_avx2_default_take_its_chunk_one_row_at_a_time_then_a_shorter_row(spec, first):
    space = SearchSpace(parse_spec(f"conv2d:N=1,{spec},bias=1,relu=1", "NCHW16c"), AVX2)
    dec = space.default()
    variants = space.lighter(dec)
    assert variants and all(space.valid(v) for v in variants)
    if first is not None:
        assert variants[0]["tile"][2] == first and variants[0]["tile"][3] == dec["tile"][3]
    short = variants[-1]["tile"][3]
    assert short[2] == dec["tile"][3][2] - 1
    avx512 = SearchSpace(space.workload, parse_target("cpu -isa=avx512 -threads=1", check_host=False))
    assert avx512.lighter(avx512.default()) == []           # 32 registers: the tile leaves room


@needs_avx2
@settings(max_examples=8, deadline=None)
@given(c=st.sampled_from([32, 288, 320]), k=st.sampled_from([32, 64, 96]), hw=st.sampled_from([14, 22, 26, 38]),
       r=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), groups=st.sampled_from([1, 2, "depthwise"]))
def test_every_lighter_variant_of_an_avx2_default_conv_computes_the_reference(c, k, hw, r, stride, groups):
    if groups == "depthwise":
        k = groups = c
    wl = parse_spec(f"conv2d:N=1,C={c},H={hw},W={hw},K={k},R={r},S={r},stride={stride},pad={r // 2},"
                    f"groups={groups},bias=1,relu=1", "NCHW16c")
    space = SearchSpace(wl, AVX2)
    variants = space.lighter(space.default())
    assert all(space.valid(v) for v in variants)
    if variants:
        check_schedules([(wl, space.steps(v)) for v in variants], AVX2)


def _one_conv(path, c: int, k: int, hw: int, r: int = 1, stride: int = 1, groups: int = 1):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((k, c // groups, r, r)) * 0.05).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[r, r], strides=[stride, stride],
                              pads=[r // 2] * 4, group=groups), helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _compile(path, isa: str):
    from tuner.compiler import compile_model
    return compile_model(str(path), target=f"cpu -isa={isa}", threads=1, use_shipped=False, layout="NCHW16c")


def _conv_step(model):
    steps = [s for s in model.steps if (s.workload or "").startswith("conv2d")]
    assert len(steps) == 1
    return steps[0]


@needs_avx2
@pytest.mark.parametrize("spills, lighter_spills, takes", [(3, 0, "lighter"), (1, 0, "default"), (3, 1, "default")])
def test_an_untuned_avx2_conv_whose_default_spills_accumulators_compiles_its_first_lighter_variant(
        tmp_path, tmp_cache, monkeypatch, spills, lighter_spills, takes):
    """Where the default's code spills MIN_SPILLS accumulators or more (here told so), the compile
    builds its lighter variants and takes the first that spills none; one spill keeps the default,
    and so do variants that all still spill. Each computes what ONNX Runtime does."""
    from conftest import ort_run
    import importlib
    cm = importlib.import_module("tuner.compiler.compile_model")
    asked = []

    def told(task, steps, func):
        asked.append(steps)
        return spills if steps == task.space.steps(task.space.default()) else lighter_spills
    monkeypatch.setattr(cm, "_spills", told)
    path = _one_conv(tmp_path / "conv.onnx", 288, 32, 22)
    model = _compile(path, "avx2")
    step = _conv_step(model)
    space = SearchSpace(parse_spec(step.workload.split(" [")[0], "NCHW16c"), parse_target("cpu -isa=avx2 -threads=1"))
    dec = space.default()
    want = space.steps(space.lighter(dec)[0]) if takes == "lighter" else space.steps(dec)
    assert step.steps == want and step.source == "default"
    assert len(asked) == (1 if spills == 1 else 2 if takes == "lighter" else 1 + len(space.lighter(dec)))
    x = np.random.default_rng(1).standard_normal((1, 288, 22, 22)).astype(np.float32)
    np.testing.assert_allclose(model.run(x)[0], ort_run(path, x)[0], rtol=1e-4, atol=1e-4)
    asked.clear()
    if host_isa() == "avx512":
        _compile(path, "avx512")
        assert asked == []                                  # 32 registers: no variant to take, nothing built


@needs_avx2
@pytest.mark.skipif(shutil.which("objdump") is None, reason="reads the kernel's code with objdump (binutils)")
def test_a_compiled_avx2_conv_carries_fewer_accumulators_through_the_stack_than_the_compile_takes_from_a_default(
        tmp_path, tmp_cache):
    """Xception's 1x1 conv of 736 channels at 38x38 in AVX2 code: GCC 12 spilled 3 accumulators of
    its default (2 rows a chunk) and none of one row a chunk (1.5x faster). Whatever the host's
    compiler does, the library's kernel spills fewer than MIN_SPILLS, or it is the default's code
    and no lighter variant spills none."""
    from tuner.compiler.compile_model import MIN_SPILLS, _spills
    from tuner.task import Task
    from tuner.toolchain.spills import spilled_accumulators
    path = _one_conv(tmp_path / "conv.onnx", 736, 736, 38)
    model = _compile(path, "avx2")
    step = _conv_step(model)
    task = Task(parse_spec(step.workload.split(" [")[0], "NCHW16c"), parse_target("cpu -isa=avx2 -threads=1"))
    default = _spills(task, task.space.steps(task.space.default()), "k")
    ran = spilled_accumulators(model._lib_path)
    assert ran is not None and default is not None
    assert ran < MIN_SPILLS or ran == default and all(_spills(task, task.space.steps(v), "k") != 0
                                                      for v in task.space.lighter(task.space.default()))
