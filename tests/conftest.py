"""Shared helpers: build schedules in batches and run them in-process against NumPy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner.measure.builder import build_batch
from tuner.measure.worker import check_output
from tuner.ops import make
from tuner.target import parse_target
from tuner.task import Task
from tuner.toolchain.library import open_library, pointer_array

TARGET1 = parse_target("cpu", threads=1)

# the checked-in log that policies are tested against in replay mode (tests/data/make_replay_log.py)
REPLAY_LOG = Path(__file__).parent / "data" / "replay.jsonl"
REPLAY_TARGET = "cpu -isa=avx2 -cores=2 -threads=1"
MODEL_REPLAY_LOG = Path(__file__).parent / "data" / "model-replay.jsonl"
# the checked-in log was timed with the weights warm, so its tunes replay so (a cold one finds nothing)
MODEL_REPLAY = dict(model="tiny", trials=64, layouts=("NCHW", "NHWC", "NCHW16c"), warmup_batch=2, batch_size=4,
                    weights="warm")
REPLAY_WORKLOADS = [(make("conv2d", dict(C=8, H=6, W=6, K=8, R=3, S=3, pad=1), "NCHW8c"), 48),
                    (make("conv2d", dict(C=8, H=4, W=4, K=16, R=1, S=1), "NCHW8c"), 24)]


@pytest.fixture(autouse=True)
def _no_cost_model_pick(request, monkeypatch):
    """Compiles in tests run a task's default schedule where no record applies, as before the cost
    model's pick (search.predict ranks about 200 candidates per task: minutes over the suite);
    tests marked `predict`, and compiles in subprocesses, take the pick."""
    if "predict" not in request.keywords:
        monkeypatch.setattr("tuner.search.predict.shipped_model", lambda target: None)


@pytest.fixture(autouse=True)
def _tuned_plan_kept(request, monkeypatch):
    """A model tune's last check (model_tuning.untuned_check) times the model whole against its
    untuned compile and, where that is faster, leaves the log out of every compile of the model: on
    test models of a few microseconds either can win, so elsewhere the check reports a tie (the tuned
    plan kept) without timing; tests marked `untuned_check` run it."""
    if "untuned_check" not in request.keywords:
        monkeypatch.setattr("tuner.model_tuning.untuned_check",
                            lambda *args, **kwargs: {"tuned": 1e-3, "untuned": 1e-3, "ratio": 1.0})


def ort_run(path, feeds) -> list:
    """ONNX Runtime's outputs (CPU provider) of the model at `path`, for inputs by name or one array."""
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds if isinstance(feeds, dict) else {sess.get_inputs()[0].name: feeds})


def agree_with_onnxruntime(path, feeds: dict, threads: int = 1) -> None:
    """tuner's compiled model gives ONNX Runtime's outputs for `feeds`, to float32 rounding."""
    from tuner.compiler import compile_model
    ref = ort_run(path, feeds)
    out = compile_model(str(path), threads=threads).run(**feeds)
    assert len(out) == len(ref) >= 1
    for o, r in zip(out, ref):
        assert o.shape == r.shape
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4 * max(float(np.abs(r).max()), 1e-30))


def run_kernel(lib_path: str, index: int, arrays: list, out_shape: tuple) -> np.ndarray:
    lib = open_library(lib_path)
    out = np.full(out_shape, np.nan, np.float32)
    keep = [np.ascontiguousarray(a, dtype=np.float32) for a in arrays] + [out]
    assert lib.tuner_run(index, pointer_array(keep)) == 0
    return out


def check_schedules(cases: list, target=TARGET1) -> None:
    """cases: [(workload, steps or None for the default)]. Builds all in one batch, then checks each."""
    tasks = [Task(wl, target) for wl, _ in cases]
    cands = [t.candidate(steps if steps is not None else t.space.steps(t.space.default()), func_name=f"f{k}")
             for k, (t, (_, steps)) in enumerate(zip(tasks, cases))]
    built = build_batch([(c.func_name, c.source) for c in cands], target, openmp=any(c.openmp for c in cands))
    failures = []
    for t, c, b in zip(tasks, cands, built):
        if b.error:
            failures.append(f"{t.workload.label}: compile error {b.error}\n{c.source}")
            continue
        inputs, ref = t.data
        out = run_kernel(b.lib, b.index, inputs, ref.shape)
        problem = check_output(out, ref, 1e-3, 1e-4)
        if problem:
            failures.append(f"{t.workload.label} steps={c.steps}: {problem}")
    assert not failures, "\n\n".join(failures)


def start_tune(cmd: list, log, min_lines: int):
    """A `tuner tune` process (cmd) that has written at least `min_lines` lines to `log` (or 120 s passed)."""
    import subprocess
    import time
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < min_lines):
        time.sleep(0.05)
    return proc


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
