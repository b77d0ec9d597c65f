"""Bad candidates become recorded errors and the tune goes on."""
import pytest
from conftest import TARGET1

from tuner.database import records
from tuner.measure.runner import RunConfig
from tuner.ops import make
from tuner.search import PolicyFactory
from tuner.search.random_search import RandomSearch
from tuner.task import Candidate, code_hash
from tuner.tuning import tune_op

pytestmark = pytest.mark.slow

SMALL = make("conv2d", dict(C=8, H=6, W=6, K=8, R=3, S=3, pad=1), "NCHW8c")
FAST = RunConfig(timeout=3.0, repeat=1, min_repeat_ms=0.5)
OUT_SIZE = SMALL.reference(SMALL.random_inputs(seed=0)).size

BAD_SOURCES = {
    "compile": "int {name}(float** restrict args) {{ return this is not C; }}\n",
    "crash": "int {name}(float** restrict args) {{ args[2][1L << 40] = 1.0f; return 0; }}\n",
    "hang": "int {name}(float** restrict args) {{ volatile int spin = 1; while (spin) {{}} return 0; }}\n",
    # writes every output element, and none beyond: a wrong answer, never a crash by memory layout
    "wrong": "int {name}(float** restrict args) {{ for (int i = 0; i < {size}; ++i) args[2][i] = 0.5f; return 0; }}\n",
}


class InjectingSearch(RandomSearch):
    """Random search that slips the broken kernels into its first batch, between good ones."""

    name = "injecting"

    def propose(self, n, seen, first=False):
        good = super().propose(n, seen, first)
        if not first:
            return good
        bad = []
        for kind, template in BAD_SOURCES.items():
            fname = f"bad_{kind}"
            src = template.format(name=fname, size=OUT_SIZE)
            bad.append(Candidate([["bad", kind]], src, fname, False, code_hash(src, fname)))
        mixed = good[:1] + bad[:2] + good[1:2] + bad[2:] + good[2:]
        return mixed[:max(n, len(bad) + 2)]


def test_broken_candidates_are_recorded_and_tuning_continues(tmp_path):
    log = tmp_path / "log.jsonl"
    s = tune_op(SMALL, target=TARGET1, trials=8, log=str(log), run_config=FAST, progress=False,
                batch_size=8, policy=PolicyFactory("injecting", InjectingSearch))
    recs = records.load(log).records
    kinds = {r.steps[0][1]: r for r in recs if r.steps and r.steps[0][0] == "bad"}
    assert kinds["compile"].error == "COMPILE_ERROR" and "error" in kinds["compile"].message
    assert kinds["crash"].error == "RUNTIME_ERROR" and "SIGSEGV" in kinds["crash"].message
    assert kinds["hang"].error == "TIMEOUT"
    assert kinds["wrong"].error == "WRONG_ANSWER" and "differ" in kinds["wrong"].message
    good_after = [r for r in recs[recs.index(kinds["hang"]) + 1:] if r.ok]
    assert good_after, "measurements after the hang must still succeed"
    assert s.trials == len(recs) >= 8
    assert s.best is not None and s.best.ok


def test_single_thread_measurements_stay_on_one_core_with_aligned_buffers():
    import os

    import numpy as np

    from tuner.measure.runner import CpuRunner
    from tuner.target import parse_target
    from tuner.toolchain.library import aligned_copy, aligned_empty

    one, two = parse_target("cpu", threads=1), parse_target("cpu", threads=2)
    with CpuRunner(one) as runner, CpuRunner(one) as other, CpuRunner(two) as multi, CpuRunner(one, RunConfig(pin=False)) as free:
        for r in (runner, other, multi, free):
            r._start()
        allowed = open(f"/proc/{runner._proc.pid}/status").read().split("Cpus_allowed_list:")[1].split()[0]
        assert runner.cpu in os.sched_getaffinity(0) and allowed == str(runner.cpu)
        # a second measuring process never shares the first one's core (unpinned if none is left;
        # claims are machine-wide, so another tuner running on this machine may hold a core too)
        assert other.cpu is None or other.cpu != runner.cpu
        assert multi.cpu is None and free.cpu is None
        first = runner.cpu
    with CpuRunner(one) as again:              # closing released the claim
        again._start()
        assert again.cpu == first
    for shape in [(3,), (5, 7), (1, 16, 3, 3, 16)]:
        a = np.random.default_rng(0).random(shape, dtype=np.float32)
        b = aligned_copy(a)
        assert b.ctypes.data % 64 == 0 and aligned_empty(shape).ctypes.data % 64 == 0
        np.testing.assert_array_equal(a, b)


def test_timing_a_built_op_hands_its_kernel_64_byte_aligned_buffers(monkeypatch, tmp_cache):
    """Kernel.time times on buffers aligned as the measuring worker and a compiled model align
    them: on NumPy's 16-byte alignment a 64-byte vector load straddles two cache lines."""
    import numpy as np

    import tuner.build
    from tuner.build import build_op

    k = build_op("dense:N=8,C=32,K=48,bias=1", use_shipped=False, quiet=True)
    x = [np.ascontiguousarray(a) for a in k.workload.random_inputs(seed=0)]
    shifted = np.empty(x[0].size + 1, np.float32)[1:].reshape(x[0].shape)   # 4 bytes off any line
    shifted[...] = x[0]
    seen = []
    real = tuner.build.pointer_array
    monkeypatch.setattr(tuner.build, "pointer_array", lambda arrays, *a: seen.extend(arrays) or real(arrays, *a))
    assert len(k.time(shifted, *x[1:], repeat=1, min_repeat_ms=0.0)) == 1
    assert len(seen) == 4 and all(a.ctypes.data % 64 == 0 for a in seen)
    np.testing.assert_allclose(k(shifted, *x[1:]), k.workload.reference(x), rtol=1e-4, atol=1e-4)


def test_cold_weights_evict_exactly_the_constant_inputs_and_still_check_the_output():
    """RunConfig.cold_weights times with the weights and bias evicted before each call
    (tuner_time_cold) and the activations kept; a wrong kernel is still caught first."""
    import numpy as np

    from tuner.measure.runner import CpuRunner
    from tuner.target import parse_target
    from tuner.task import Task
    wl = make("conv2d", dict(C=8, H=6, W=6, K=16, R=3, S=3, pad=1, bias=1, residual=1), "NCHW8c")
    assert wl.constant_inputs == (1, 2)                      # data, weight, bias, residual
    assert make("winograd_gemm", dict(C=8, H=6, W=6, K=8)).constant_inputs == (1,)
    assert make("layout_transform", dict(C=8, H=4, W=4, dst="NHWC")).constant_inputs == ()
    task = Task(wl, parse_target("cpu", threads=1))
    good = task.default_candidate()
    size = int(np.prod(wl.reference(task.data[0]).shape))
    src = BAD_SOURCES["wrong"].replace("args[2]", "args[4]").format(name="kbad", size=size)
    bad = Candidate([["bad", "wrong"]], src, "kbad", False, code_hash(src, "kbad"))
    with CpuRunner(task.target, RunConfig(cold_weights=True, repeat=2, min_repeat_ms=1.0)) as runner:
        results = [res for _, res in runner.measure(task, [good, bad])]
        inputs = task.data[0]
        assert runner._cold == [0, inputs[1].nbytes, inputs[2].nbytes, 0, 0]
    assert results[0].ok and len(results[0].costs) == 2 and min(results[0].costs) > 0
    assert results[1].error == "WRONG_ANSWER"
