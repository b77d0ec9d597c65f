"""The CUDA path without a GPU: targets, GPU schedule steps, the GPU sketch, CUDA C that nvcc
compiles for sm_80 and sm_90, the limits check, and a serial CPU emulation of the generated
kernels' loop nests against NumPy. GPU tests at the end skip without pycuda and a device."""
from __future__ import annotations

import dataclasses
import math
import random
import re
import shutil

import numpy as np
import pytest
from conftest import TARGET1, run_kernel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.codegen.c import generate_c
from tuner.codegen.cuda import serial_copy
from tuner.codegen.cuda_emulate import build_emulation, emulate, small_workloads
from tuner.measure.builder import build_batch
from tuner.measure.worker import check_output
from tuner.ops import make, resolve
from tuner.schedule.schedule import ScheduleError
from tuner.target import CudaTarget, TargetError, parse_target
from tuner.task import Task

SM90 = parse_target("cuda -arch=sm_90")
needs_gxx = pytest.mark.skipif(not shutil.which("g++"), reason="g++ is not installed (the CUDA C emulation)")
needs_nvcc = pytest.mark.skipif(
    not (shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")),
    reason="nvcc (the CUDA toolkit) is not installed")

SMALL = small_workloads()


def _points(task: Task, n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    pts = [task.space.default()] + [task.space.sample(rng) for _ in range(n)]
    assert pts and all(task.space.valid(p) for p in pts)
    return pts


def _emulate(cases: list) -> None:
    """cases: [(task, steps)]; each loop nest run serially on the CPU (codegen.cuda.serial_copy)
    against the workload's NumPy reference, then (where g++ is) its CUDA C run thread by thread
    between barriers, in thread order and the other way (codegen.cuda_emulate)."""
    funcs = [generate_c(dataclasses.replace(serial_copy(t.lowered(s)), name=f"e{k}"), TARGET1.lanes, 1)
             for k, (t, s) in enumerate(cases)]
    built = build_batch([(f"e{k}", src) for k, (src, _) in enumerate(funcs)], TARGET1)
    failures = []
    for (t, steps), b in zip(cases, built):
        assert b.error is None, b.error
        inputs, ref = t.data
        problem = check_output(run_kernel(b.lib, b.index, inputs, ref.shape), ref, 1e-3, 1e-4)
        if problem:
            failures.append(f"{t.workload.label} steps={steps}: {problem}")
    if shutil.which("g++"):
        failures += [f"{t.workload.label} steps={steps} as CUDA C: {p}"
                     for (t, steps), p in zip(cases, _threads([(t, t.candidate(steps).launch) for t, steps in cases]))
                     if p]
    assert not failures, "\n".join(failures)


def _threads(kernels: list) -> list:
    """[(task, CudaKernel)] -> per kernel, what is wrong with it (None: nothing) when its CUDA C
    runs thread by thread on the CPU, in thread order and the other way."""
    lib = build_emulation([k for _, k in kernels])
    out = []
    for i, (t, k) in enumerate(kernels):
        inputs, ref = t.data
        problems = []
        for reverse in (False, True):
            got, err = emulate(lib, i, k, inputs, ref.shape, reverse)
            problem = err or check_output(got, ref, 1e-3, 1e-4)
            if problem:
                problems.append(f"{'reverse' if reverse else 'thread'} order: {problem}")
        out.append("; ".join(problems) or None)
    return out


# ---------------------------------------------------------------- target
def test_a_cuda_target_named_by_arch_needs_no_gpu_and_reads_back_the_same():
    t = parse_target("cuda -arch=sm_80 -sms=100")
    assert isinstance(t, CudaTarget) and (t.arch, t.sms, t.smem, t.max_threads) == ("sm_80", 100, 49152, 1024)
    assert parse_target(str(t)) == t
    assert (t.kind, t.isa, t.threads) == ("cuda", "sm_80", 1)     # how records group by target


@pytest.mark.parametrize("text, says", [
    ("cuda -arch=sm_12", "unknown CUDA arch 'sm_12'"),
    ("cuda -arch=sm_90 -isa=avx2", "CUDA options are"),
    ("cuda -arch=sm_90 -smem=lots", "-smem must be an integer"),
    ("cuda -arch=sm_90 -sms=0", "-sms must be at least 1"),
    ("tpu", "unknown target 'tpu'"),
])
def test_a_bad_cuda_target_is_one_clear_line(text, says):
    with pytest.raises(TargetError, match=says) as e:
        parse_target(text)
    assert "\n" not in str(e.value)


def test_threads_are_refused_for_a_cuda_target():
    with pytest.raises(TargetError, match="CPU setting"):
        parse_target("cuda -arch=sm_90", threads=2)


def test_cuda_alone_without_pycuda_says_what_to_install():
    try:
        import pycuda  # noqa: F401
        pytest.skip("pycuda is installed here: the message for its absence cannot be seen")
    except ImportError:
        pass
    with pytest.raises(TargetError, match=r"pip install -e '\.\[cuda\]'.*-arch=sm_90"):
        parse_target("cuda")


def test_model_tuning_and_compiling_refuse_a_cuda_target_clearly():
    from tuner.compiler import compile_model
    from tuner.errors import UserError
    from tuner.model_tuning import tune_model
    with pytest.raises(UserError, match="CPU targets"):
        tune_model("tiny", trials=100, target="cuda -arch=sm_90")
    with pytest.raises(UserError, match="CPU targets"):
        compile_model("tiny", target="cuda -arch=sm_90")


# ---------------------------------------------------------------- schedule steps
def _dense_space():
    return Task(make("dense", dict(N=8, C=32, K=24)), SM90).space


@pytest.mark.parametrize("step, says", [
    (["bind", "dense", "rc", "threadIdx.x"], "cannot bind reduction loop"),
    (["bind", "dense", "n", "threadIdx.y"], "unknown thread tag"),
    (["cache_read", "data", "texture", ["dense"]], "unknown scope"),
    (["cache_read", "nothing", "shared", ["dense"]], "no tensor 'nothing'"),
    (["cache_read", "data", "shared", []], "needs the stages"),
    (["storage_order", "dense", ["n"]], "must list every axis of dense once"),
    (["storage_order", "dense", ["n", "n"]], "must list every axis of dense once"),
])
def test_a_bad_gpu_step_is_refused_with_its_reason(step, says):
    sp = _dense_space()
    with pytest.raises(ScheduleError, match=says):
        sp.schedule([step])


def test_a_storage_order_needs_a_stage_with_a_buffer_of_its_own():
    t = Task(make("dense", dict(N=8, C=32, K=24)), SM90)
    with pytest.raises(ScheduleError, match="only a stage computed at a loop"):
        t.lowered([["storage_order", "dense", ["k", "n"]]])


@needs_gxx
def test_a_shared_tile_stored_reduction_major_is_filled_by_float4_loads_and_computes_the_same(tmp_cache):
    """The A tile of a GEMM transposed (its reduction axis outermost, what makes a thread's rows
    neighbours): one float4 load from global memory, four stores into the tile; emulated thread by
    thread against NumPy beside the same point stored as read."""
    t = Task(make("dense", dict(N=8, C=32, K=32)), SM90)
    sp = t.space
    assert sp.majors == {"data": ["ax1", "ax0"], "weight": ["ax1", "ax0", "ax2"]}
    d = dict(sp.default(), vec=4, major=[1, 1])
    steps = sp.steps(d)
    assert ["storage_order", "data.shared", ["ax1", "ax0"]] in steps
    src = t.candidate(steps).launch.source
    assert "float4 tuner_v; tuner_v = *(const float4*)&data[" in src
    assert src != t.candidate(sp.steps(dict(d, major=[0, 0]))).launch.source
    _emulate([(t, steps), (t, sp.steps(dict(d, major=[0, 0])))])


def test_cache_read_leaves_the_workloads_dag_as_it_was():
    sp = _dense_space()
    before = repr(sp.output.op.body)
    sp.schedule([["cache_read", "data", "shared", ["dense"]]])
    assert repr(sp.output.op.body) == before


# ---------------------------------------------------------------- codegen and nvcc
def _kernels(task: Task, n: int, seed: int = 0) -> list:
    return [task.candidate(task.space.steps(p), func_name=f"k{seed}_{k}") for k, p in enumerate(_points(task, n, seed))]


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sampled_schedules_of_every_operator_compile_with_nvcc(arch, tmp_cache):
    from tuner.measure.cuda_build import build_cuda_batch
    target = parse_target(f"cuda -arch={arch}")
    cands = []
    for k, wl in enumerate(SMALL + [resolve("r50.s1.conv3x3", "NHWC")]):
        cands += _kernels(Task(wl, target), 2, seed=k)
    built = build_cuda_batch(cands, target)
    assert len(built) == len(cands) > 0
    assert [b.error for b in built] == [None] * len(cands)
    assert len({b.lib for b in built}) == 1                      # one nvcc call for the batch


def test_a_kernel_reads_its_grid_and_block_and_fills_shared_memory_between_barriers():
    t = Task(resolve("r50.s1.conv3x3", "NCHW"), SM90)
    cand = t.default_candidate()
    k = cand.launch
    assert k.grid * k.block * math.prod(x[1] * x[2] for x in t.space.default()["tile"]) == 64 * 56 * 56
    src = cand.source
    assert f"__launch_bounds__({k.block})" in src and "blockIdx.x" in src and "threadIdx.x" in src
    assert src.count("__shared__") == 2 and "__syncthreads();" in src
    assert "for (int" in src and "parallel" not in src


def test_the_grid_is_part_of_a_cuda_kernels_code_hash():
    t = Task(make("dense", dict(N=8, C=32, K=24)), SM90)
    sp = t.space
    a = sp.default()
    b = dict(a, tile=[list(x) for x in a["tile"]])
    b["tile"][0] = [1, 1, 1]                         # fewer rows per block, more blocks
    ca, cb = t.candidate(sp.steps(a)), t.candidate(sp.steps(b))
    assert ca.launch.grid != cb.launch.grid and ca.code_hash != cb.code_hash


# ---------------------------------------------------------------- limits
def test_sampling_stays_inside_a_small_devices_limits():
    small = parse_target("cuda -arch=sm_90 -max_threads=64 -smem=4096")
    t = Task(resolve("r50.s1.conv3x3", "NCHW"), small)
    pts = _points(t, 20)
    for p in pts:
        k = t.candidate(t.space.steps(p)).launch
        assert k.block <= 64 and k.shared_bytes <= 4096


def test_a_candidate_over_the_limits_is_rejected_with_its_reason_not_built(monkeypatch):
    from tuner.measure import cuda_build
    big = Task(resolve("r50.s1.conv3x3", "NCHW"), SM90)
    cand = big.default_candidate()
    small = parse_target(f"cuda -arch=sm_90 -smem={cand.launch.shared_bytes - 4}")
    monkeypatch.setattr(cuda_build, "compile_cubin", lambda *a: pytest.fail("nvcc was called"))
    [res] = cuda_build.build_cuda_batch([cand], small)
    assert res.lib is None and "shared memory" in res.error and "not built" in res.error


def test_the_shared_estimate_is_the_lowered_size_for_affine_reads():
    t = Task(resolve("r50.s2.conv3x3s2", "NCHW"), SM90)
    for p in _points(t, 10):
        assert t.space.shared_bytes(p) == t.candidate(t.space.steps(p)).launch.shared_bytes


# ---------------------------------------------------------------- CPU emulation
@pytest.mark.slow
def test_every_operator_emulated_matches_numpy(tmp_cache):
    cases = []
    for k, wl in enumerate(SMALL):
        t = Task(wl, SM90)
        cases += [(t, t.space.steps(p)) for p in _points(t, 2, seed=k)]
    _emulate(cases)


def _sampled_kernels(n: int = 3) -> list:
    out = []
    for wl in SMALL:
        t = Task(wl, SM90)
        out += [(t, t.candidate(t.space.steps(p)).launch) for p in _points(t, n, seed=1)[1:]]
    return out


def _mutated(kernels: list, old: str, new: str, count: int = -1) -> list:
    return [(t, dataclasses.replace(k, source=k.source.replace(old, new, count))) for t, k in kernels
            if old in k.source]


@pytest.mark.slow
@needs_gxx
def test_the_thread_emulation_catches_missing_barriers_and_divergent_ones(tmp_cache):
    """The same kernels pass as generated; without their barriers nearly all go wrong (a thread
    reads a tile the others have not filled, or overwrites one they still read); a barrier only
    thread 0 reaches is named."""
    kernels = _sampled_kernels()
    assert not any(_threads(kernels))
    bare = _mutated(kernels, "__syncthreads();", "")
    caught = [p for p in _threads(bare) if p]
    assert len(bare) >= 20 and len(caught) >= 0.8 * len(bare)
    split = _mutated([(t, k) for t, k in kernels if k.block > 1], "__syncthreads();",
                     "if (threadIdx.x == 0) __syncthreads();", 1)
    problems = _threads(split)
    assert problems and all(p and "barrier divergence" in p for p in problems), problems


@pytest.mark.slow
@needs_gxx
def test_the_thread_emulation_catches_out_of_bounds_and_misaligned_float4(tmp_cache):
    kernels = _sampled_kernels()
    short = [(t, dataclasses.replace(k, source=re.sub(r"float (\w+)\[(\d+)\];",
                                                      lambda m: f"float {m[1]}[{int(m[2]) - 1}];", k.source, count=1)))
             for t, k in kernels if "__shared__" in k.source]
    problems = _threads(short)
    assert problems and all(p and "is out of bounds" in p for p in problems), problems
    dense = Task(make("dense", dict(N=8, C=32, K=32)), SM90)
    d = next(p for p in (dense.space.sample(random.Random(s)) for s in range(500))
             if "float4" in dense.candidate(dense.space.steps(p)).launch.source)
    k = dense.candidate(dense.space.steps(d)).launch
    assert _threads([(dense, k)]) == [None]
    shifted = re.sub(r"\(const float4\*\)&(\w+)\[", r"(const float4*)&\1[1 + ", k.source, count=1)
    (problem,) = _threads([(dense, dataclasses.replace(k, source=shifted))])
    assert problem and "misaligned" in problem, problem


def test_an_injective_workload_has_a_gpu_schedule_too(tmp_cache):
    t = Task(make("layout_transform", dict(C=16, H=5, W=5, dst="NCHW8c"), "NCHW"), SM90)
    assert t.space.kind == "injective"
    cand = t.default_candidate()
    assert cand.launch.block == 256 and "threadIdx.x" in cand.source
    _emulate([(t, t.space.steps(p)) for p in _points(t, 3)])


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), which=st.sampled_from(range(len(SMALL))))
def test_property_sampled_gpu_schedules_compute_the_reference(seed, which, tmp_cache):
    t = Task(SMALL[which], SM90)
    p = t.space.sample(random.Random(seed))
    _emulate([(t, t.space.steps(p))])


# ---------------------------------------------------------------- on a GPU
def _gpu_or_skip():
    try:
        import pycuda.driver as drv
        drv.init()
        if drv.Device.count() == 0:
            raise RuntimeError("no device")
    except Exception as e:      # no pycuda, no driver or no device
        pytest.skip(f"needs pycuda and an NVIDIA GPU ({type(e).__name__}: {e})")
    return parse_target("cuda")


@pytest.mark.gpu
def test_gpu_every_operator_measures_correct(tmp_cache):
    from tuner.measure.runner import CudaRunner, RunConfig
    target = _gpu_or_skip()
    with CudaRunner(target, RunConfig(repeat=2, min_repeat_ms=1)) as runner:
        n = 0
        for k, wl in enumerate(SMALL):
            t = Task(wl, target)
            for cand, res in runner.measure(t, _kernels(t, 2, seed=k)):
                assert res.ok, f"{wl.label}: {res.error} {res.message}"
                n += 1
    assert n == 3 * len(SMALL)


@pytest.mark.gpu
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), which=st.sampled_from(range(len(SMALL))))
def test_gpu_property_sampled_schedules_measure_correct(seed, which, tmp_cache):
    from tuner.measure.runner import CudaRunner, RunConfig
    target = _gpu_or_skip()
    t = Task(SMALL[which], target)
    cand = t.from_decisions(t.space.sample(random.Random(seed)))
    with CudaRunner(target, RunConfig(repeat=1, min_repeat_ms=1)) as runner:
        [(_, res)] = list(runner.measure(t, [cand]))
    assert res.ok, f"{t.workload.label} {cand.decisions}: {res.error} {res.message}"


@pytest.mark.gpu
def test_gpu_a_crashing_and_a_hanging_kernel_become_records_and_measuring_goes_on(tmp_cache):
    from tuner.measure.runner import CudaRunner, RunConfig
    target = _gpu_or_skip()
    t = Task(make("dense", dict(N=8, C=32, K=24)), target)
    good = t.default_candidate()
    crash = dataclasses.replace(good, func_name="crash", source=good.source.replace(
        good.func_name, "crash").replace("{\n", "{\n  dense[1 << 30] = 1.0f;\n", 1))
    hang = dataclasses.replace(good, func_name="hang", source=good.source.replace(
        good.func_name, "hang").replace("{\n", "{\n  while (dense[0] == dense[0]) dense[0] += 0.0f;\n", 1))
    with CudaRunner(target, RunConfig(timeout=5, repeat=2, min_repeat_ms=1)) as runner:
        kinds = [res.error for _, res in runner.measure(t, [crash, hang, good])]
    assert kinds == ["RUNTIME_ERROR", "TIMEOUT", "OK"]



# ---------------------------------------------------------------- the tuning loop on a CUDA target
class EmulatingRunner:
    """Stands in for the GPU: builds each candidate's loop nest as serial C, checks it against
    NumPy and gives a cost from its launch shape (more blocks and threads in flight, less time),
    so the policies' proposals on the GPU space go through the whole loop without a device."""

    ahead = 0

    def __init__(self):
        self.seen = []

    def measure(self, task, batch):
        from tuner.database.result import OK, WRONG_ANSWER, MeasureResult
        cases = [(task, c.steps) for c in batch]
        funcs = [generate_c(dataclasses.replace(serial_copy(t.lowered(s)), name=f"e{k}"), TARGET1.lanes, 1)
                 for k, (t, s) in enumerate(cases)]
        built = build_batch([(f"e{k}", src) for k, (src, _) in enumerate(funcs)], TARGET1)
        inputs, ref = task.data
        for cand, b in zip(batch, built):
            self.seen.append(cand)
            problem = check_output(run_kernel(b.lib, b.index, inputs, ref.shape), ref, 1e-3, 1e-4)
            k = cand.launch
            cost = 1e-3 / min(k.grid * k.block, 132 * 1024) * (1 + k.shared_bytes / 49152)
            yield cand, (MeasureResult(WRONG_ANSWER, problem) if problem else MeasureResult(OK, costs=[cost] * 3))

    def status(self):
        return ""

    def close(self):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["random", "evolutionary", "optuna:tpe"])
def test_every_policy_tunes_a_cuda_task_through_the_loop(policy, tmp_cache, tmp_path):
    from tuner.database import records
    from tuner.tuning import tune
    wl = SMALL[0]
    runner = EmulatingRunner()
    log = tmp_path / "gpu.jsonl"
    session = tune([wl], target=SM90, trials=12, log=str(log), policy=policy, batch_size=6, runner=runner,
                   progress=False, cost_model_from=["none"])
    recs = records.load(str(log), warn=False).records
    assert len(recs) == 12 == len(runner.seen) and session.tasks[0].errors.get("OK") == 12
    assert {r.target for r in recs} == {str(SM90)}
    space = Task(wl, SM90).space
    assert all(c.decisions is None or space.valid(c.decisions) for c in runner.seen)
    again = tune([wl], target=SM90, trials=12, log=str(log), policy=policy, runner=runner, progress=False,
                 cost_model_from=["none"])
    assert again.new == 0 and len(runner.seen) == 12            # resumed: nothing measured twice


@pytest.mark.gpu
def test_gpu_features_see_the_launch_and_how_threads_meet_memory():
    from tuner.cost_model.dataset import features_or_none
    from tuner.cost_model.features import gpu_feature_names, num_features
    t = Task(make("dense", dict(N=64, C=64, K=64)), SM90)
    names = list(gpu_feature_names())
    width = num_features() + len(names)
    a = t.space.default()
    b = dict(a, tile=[[1, 1, 1], [64, 1, 1]])                   # 64 threads, one output each, 64 blocks
    fa, fb = features_or_none(t, t.space.steps(a)), features_or_none(t, t.space.steps(b))
    assert fa.shape[1] == fb.shape[1] == width
    col = {n: num_features() + k for k, n in enumerate(names)}
    ka, kb = t.candidate(t.space.steps(a)).launch, t.candidate(t.space.steps(b)).launch
    assert (ka.block, kb.block, kb.grid) != (kb.block, ka.block, ka.grid)
    assert fb[0, col["gpu.threads_per_block"]] == pytest.approx(math.log2(1 + kb.block))
    assert fb[0, col["gpu.blocks"]] == pytest.approx(math.log2(1 + kb.grid))
    assert fa[0, col["gpu.shared_bytes"]] == pytest.approx(math.log2(1 + ka.shared_bytes))
    assert fa[0, col["gpu.syncs_per_thread"]] > 0
    assert not np.array_equal(fa[:, num_features():], fb[:, num_features():])


@needs_nvcc
def test_build_op_for_cuda_builds_then_says_what_running_it_needs(tmp_cache):
    from tuner.build import build_op
    from tuner.errors import UserError
    try:
        import pycuda.driver  # noqa: F401
        pytest.skip("pycuda is installed here: the message for its absence cannot be seen")
    except ImportError:
        pass
    with pytest.raises(UserError, match=r"needs pycuda.*pip install -e '\.\[cuda\]'"):
        build_op("dense:N=8,C=32,K=24", target="cuda -arch=sm_90", use_shipped=False, quiet=True)
    assert list((tmp_cache / "cuda").glob("*.cubin"))         # it was compiled before it was refused


@pytest.mark.gpu
def test_gpu_build_op_runs_on_numpy_and_on_gpu_arrays(tmp_cache):
    from tuner.build import build_op
    _gpu_or_skip()
    import pycuda.gpuarray as ga
    wl = make("conv2d", dict(C=8, H=10, W=10, K=16, R=3, S=3, pad=1, bias=1, relu=1), "NHWC")
    k = build_op(wl, target="cuda", use_shipped=False, quiet=True)
    arrays = wl.random_inputs(seed=3)
    ref = wl.reference(arrays)
    assert check_output(k(*arrays), ref, 1e-3, 1e-4) is None
    out = k(*[ga.to_gpu(a) for a in arrays])
    assert isinstance(out, ga.GPUArray) and check_output(out.get(), ref, 1e-3, 1e-4) is None
    assert len(k.time(*arrays, repeat=2, min_repeat_ms=1)) == 2


@pytest.mark.slow
def test_shared_tiles_fill_with_float4_where_rows_and_offsets_allow(tmp_cache):
    dense = Task(make("dense", dict(N=64, C=128, K=96)), SM90)
    d = dict(dense.space.default(), vec=4)
    src = dense.candidate(dense.space.steps(d)).source
    assert src.count("*(const float4*)&") == 2                  # both tiles: data and weight
    conv = Task(make("conv2d", dict(C=8, H=10, W=10, K=16, R=3, S=3, pad=1), "NHWC"), SM90)
    c = dict(conv.space.default(), vec=4)
    lines = conv.candidate(conv.space.steps(c)).source.splitlines()
    fills = {buf: [ln for ln in lines if f" {buf}[" in f" {ln.strip()}" or f"&{buf}[" in ln] for buf in
             ("conv_pad_shared", "weight_shared")}
    assert fills["conv_pad_shared"] and not any("float4" in ln for ln in fills["conv_pad_shared"])  # padded: scalar
    assert any("float4" in ln for ln in fills["weight_shared"])
    _emulate([(dense, dense.space.steps(d)), (conv, conv.space.steps(c))])


def test_virtual_threads_share_the_blocks_tiles_and_keep_their_own_accumulators(tmp_cache):
    t = Task(make("dense", dict(N=64, C=128, K=96)), SM90)
    plain = {"tile": [[4, 1, 2], [16, 1, 3]], "reduce": [16], "unroll": 16, "vec": 1}
    vthread = {**plain, "tile": [[4, 2, 2], [16, 1, 3]]}              # two tiles per thread along N
    a, b = (t.candidate(t.space.steps(d)) for d in (plain, vthread))
    assert b.launch.block == a.launch.block and b.launch.grid * 2 == a.launch.grid
    assert b.launch.local_floats == 2 * a.launch.local_floats      # an accumulator per virtual thread
    assert b.source.count("__syncthreads") == a.source.count("__syncthreads")   # one fill for both
    assert b.launch.shared_bytes > a.launch.shared_bytes
    assert "vthread" not in b.source
    _emulate([(t, t.space.steps(vthread))])


def test_a_barrier_that_depends_on_a_virtual_thread_is_refused():
    from tuner.schedule import ir
    from tuner.schedule.vthread import inject_virtual_threads
    from tuner.te.expr import Cmp, Const, Var
    out = ir.Buffer("out", (2,), "arg")
    body = ir.For("v", 2, ir.seq([ir.Store("out", (Var("v"),), Const(0.0)),
                                  ir.IfThen(Cmp("<", Var("v"), Const(1)), ir.Sync())]), "vthread")
    with pytest.raises(ScheduleError, match="barrier depends on virtual thread v"):
        inject_virtual_threads(ir.Func("k", [out], [], body, {"out": out}))
