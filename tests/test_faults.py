"""Hostile input and broken environments: every bad thing is a clear one-line error or a skipped,
counted line, never a traceback, a poisoned result or a lost record (bench/faults.py runs the slow
cases many times)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TARGET1, start_tune
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.analysis.distill import distill
from tuner.analysis.report import analyze
from tuner.build import build_op
from tuner.database import records
from tuner.ops import make

SMALL = make("conv2d", dict(C=8, H=6, W=6, K=8, R=3, S=3, pad=1), "NCHW8c")
SPEC = "conv2d:N=1,C=8,H=6,W=6,K=8,R=3,S=3,stride=1,pad=1"


def tuner(*args, **kw):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, **kw)


def _valid_record(seed=0, cost=1e-4) -> dict:
    """A record of SMALL's default schedule as the tuner writes it (not measured: costs given)."""
    from tuner.database.result import MeasureResult
    from tuner.task import Task
    cand = Task(SMALL, TARGET1).default_candidate()
    rec = records.make_record(SMALL, TARGET1, cand.steps, MeasureResult("OK", "", [cost]), cand.code_hash,
                              "random", seed)
    return rec.to_json()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                    max_leaves=8)
FIELDS = ["workload", "target", "steps", "costs", "error", "code_hash", "message", "build_s", "run_s", "seed",
          "decisions", "policy", "format", "replayed_from"]


@st.composite
def hostile(draw):
    rec = _VALID.copy()
    rec["workload"] = dict(rec["workload"])
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(FIELDS + ["workload.key", "workload.spec", "workload.layout", "costs.0"]))
        value = draw(JSON | st.sampled_from([[None], ["1e-12"], [0.0], [-1.0], [float("inf")], "OK", {}, []]))
        if where.startswith("workload."):
            if isinstance(rec["workload"], dict):
                rec["workload"][where.split(".")[1]] = value
        elif where == "costs.0":
            rec["costs"] = [value]
        else:
            rec[where] = value
    return rec


_VALID = _valid_record()


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(hostile(), min_size=1, max_size=4))
def test_hostile_records_are_skipped_or_read_never_a_traceback(tmp_path, recs):
    log = tmp_path / "hostile.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [_VALID] + recs))
    contents = records.load(log, warn=False)
    assert len(contents.records) + contents.skipped == 1 + len(recs)
    for r in contents.records:          # whatever was read is typed as a record says
        assert isinstance(r.workload.key, str) and isinstance(r.steps, list)
        assert all(isinstance(c, float) and 0 < c < float("inf") for c in r.costs)
    rep = analyze(str(log))
    assert rep.tasks and all(t.best_gflops < 1e6 for t in rep.tasks)
    best = records.best_of(contents.applicable(SMALL.key, str(TARGET1)))
    assert best is not None and records.replays(best)


@pytest.mark.slow
def test_a_junk_record_with_a_tiny_cost_is_passed_over_everywhere(tmp_path):
    """The fastest record's steps do not replay: apply-best, distill and analyze take the next one."""
    good = _valid_record(cost=1e-4)
    junk = dict(good, steps=[["split", "nope", "x", [1]]], costs=[1e-12])
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(junk) + "\n" + json.dumps(good) + "\n")
    k = build_op(SMALL, target=TARGET1, log=str(log), use_shipped=False)
    assert k.tuned and k.steps == good["steps"]
    out = tmp_path / "db.jsonl"
    assert distill([str(log)], str(out)) == 1
    assert [r.steps for r in records.load(out).records] == [good["steps"]]
    (t,) = analyze(str(log)).tasks
    assert t.best_latency == 1e-4 and t.best_trial == 2
    show = tuner("show", "--log", str(log), "--workload", SPEC, "--layout", "NCHW8c", "--threads", "1")
    assert show.returncode == 0 and "0.1000 ms" in show.stdout, show.stderr


def test_lines_that_are_not_records_are_counted_with_their_reason(tmp_path):
    log = tmp_path / "log.jsonl"
    huge = "x" * (records.MAX_LINE + 10)
    log.write_text("\n".join([json.dumps(_VALID), "{not json", json.dumps(dict(_VALID, costs=[0.0])),
                              huge, json.dumps(dict(_VALID, workload="conv")), json.dumps(_VALID)]) + "\n")
    c = records.load(log, warn=False)
    assert len(c.records) == 2 and c.skipped == 4
    assert c.reasons == {"not JSON": 1, "costs is not a list of positive finite numbers": 1,
                         f"longer than {records.MAX_LINE} bytes": 1, "workload is not an object": 1}


def test_a_failed_append_leaves_no_torn_line_and_says_why(tmp_path, monkeypatch):
    """The disk fills halfway through a record: the half that was written is cut off again."""
    import errno
    import os
    log = tmp_path / "log.jsonl"
    rec = records.Record.from_json(_VALID)
    records.append(log, [rec])
    before = log.read_bytes()
    real_write = os.write
    calls = []

    def half_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(records.SetupError, match="No space left on device"):
        records.append(log, [rec, rec])
    monkeypatch.setattr(os, "write", real_write)
    assert len(calls) == 2 and log.read_bytes() == before
    records.append(log, [rec])
    assert len(records.load(log).records) == 2


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["tune", "--workload", SPEC, "--timeout", "0"], "--timeout must be more than 0"),
    (["tune", "--workload", SPEC, "--repeat", "-1"], "--repeat must be at least 1"),
    (["tune", "--workload", SPEC, "--batch-size", "0"], "--batch-size must be at least 1"),
    (["tune", "--workload", SPEC, "--time-limit", "nan"], "--time-limit must be more than 0"),
    (["analyze", "/dev/full"], "is not a regular file"),
    (["analyze", "/tmp"], "is not a regular file"),
    (["tune", "--workload", SPEC, "--log", "/tmp"], "is not a regular file"),
    (["tune", "--workload", SPEC, "--log", "/proc/tuner/log.jsonl"], "choose another --log"),
    (["tune", "tiny", "--trials", "5", "--log", "/tmp/tuner-never.jsonl"], "--trials 5 is less than the 43 tasks"),
    (["tune", "tiny", "--layouts", "NCHW,NCWH"], "unknown layout 'NCWH'"),
    (["tune", "tiny", "--workload", SPEC], "give a MODEL or --workload"),
    (["tune", "no_such_model"], "no built-in model or file 'no_such_model'"),
])
def test_bad_options_and_log_paths_are_refused_before_any_work(args, message):
    out = tuner(*args, timeout=60)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_internal_bug_is_not_dressed_as_a_user_error(tmp_path):
    script = ("import sys, tuner.cli as c\n"
              "def boom(args): raise KeyError('internal')\n"
              "p = c.build_parser(); c.build_parser = lambda: p\n"
              "p._subparsers._group_actions[0].choices['workloads'].set_defaults(fn=boom)\n"
              "sys.exit(c.main(['workloads']))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={
        **__import__("os").environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 70, out.stderr
    assert "internal error: KeyError" in out.stderr and "bug in tuner" in out.stderr
    report = next(tmp_path.glob("tuner-crash-*.txt"))
    assert "Traceback" in report.read_text() and "boom" in report.read_text()


# ---------------------------------------------------------------- the kernel cache

PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) { FILE* f = fopen(getenv("PLANT_MARK"), "w"); if (f) fclose(f); }
int tuner_count(void) { return 0; }
"""


def _cached(tmp_cache):
    return sorted((tmp_cache / "kernels").glob("*.so"))


@pytest.mark.slow
def test_planted_truncated_and_empty_libraries_are_rebuilt_never_loaded(tmp_cache, tmp_path, monkeypatch):
    import numpy as np
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("PLANT_MARK", str(mark))
    wl = SMALL
    build_op(wl, target=TARGET1, use_shipped=False, quiet=True)
    (lib,) = _cached(tmp_cache)
    other = tmp_path / "planted.c"
    other.write_text(PLANTED)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "planted.so"), str(other)], check=True)

    def replace(data: bytes):         # a new file under the cached name (not the mapped one rewritten)
        lib.unlink()
        lib.write_bytes(data)
    for damage in (lambda: replace((tmp_path / "planted.so").read_bytes()),   # another library
                   lambda: replace(lib.read_bytes()[:1000]),                   # truncated
                   lambda: replace(b"")):                                      # empty
        good = lib.read_bytes()
        damage()
        k = build_op(wl, target=TARGET1, use_shipped=False, quiet=True)
        x = wl.random_inputs(seed=1)
        np.testing.assert_allclose(k(*x), wl.reference(x), rtol=1e-4, atol=1e-4)
        assert not mark.exists(), "a planted library's constructor ran"
        assert [p.read_bytes() for p in _cached(tmp_cache)] == [good]
        lib = _cached(tmp_cache)[0]


def _two_convs(extra: bool = False):
    """A small graph of two convs (three where `extra`: a third after them, of another width)."""
    import numpy as np

    from tuner.graph.builder import GraphBuilder
    b = GraphBuilder("two_convs")
    rng = np.random.default_rng(0)
    v = b.input("x", (1, 8, 6, 6), layout="NCHW")
    for k, (c, o) in enumerate([(8, 8), (8, 16), (16, 24)][:3 if extra else 2]):
        w = b.const(rng.standard_normal((o, c, 3, 3)).astype(np.float32) * 0.2)
        v = b.add("conv2d", [v, w], {"strides": [1, 1], "pads": [1] * 4, "dilations": [1, 1], "groups": 1}, f"conv{k}")
        v = b.add("relu", [v], {}, f"relu{k}")
    return b.finish([v])


def test_a_models_kernels_are_cached_apart_and_a_planted_object_is_rebuilt_never_linked(tmp_cache, tmp_path,
                                                                                         monkeypatch):
    """A model's library is linked from one cached object per kernel and one for the executor: a
    second model sharing kernels with it compiles only its new kernels and its executor, and an
    object in the cache whose bytes are not the ones its name promises is rebuilt, never linked."""
    import numpy as np

    from tuner.compiler import compile_model
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("PLANT_MARK", str(mark))
    objects = lambda: {p.name: p.read_bytes() for p in (tmp_cache / "objects").glob("*.o")}   # noqa: E731
    first = compile_model(_two_convs(), target=str(TARGET1), use_shipped=False)
    before = objects()
    assert len(before) == len({s.func for s in first.steps}) + 1 >= 3
    second = compile_model(_two_convs(extra=True), target=str(TARGET1), use_shipped=False)
    added = set(objects()) - set(before)
    new_kernels = {(s.func, s.code_hash) for s in second.steps} - {(s.func, s.code_hash) for s in first.steps}
    assert len(added) == len(new_kernels) + 1 and 1 <= len(new_kernels) < len({s.func for s in second.steps})
    (other := tmp_path / "planted.c").write_text(PLANTED)
    subprocess.run([os.environ.get("CC", "gcc"), "-c", "-fPIC", "-o", str(tmp_path / "planted.o"), str(other)],
                   check=True)
    victim = sorted(tmp_cache.joinpath("objects").glob("*.o"))[0]
    good = victim.read_bytes()
    victim.unlink()
    victim.write_bytes((tmp_path / "planted.o").read_bytes())
    for lib in (tmp_cache / "kernels").glob("*.so"):
        lib.unlink()                                    # the links run again, from the objects
    for graph, want in ((_two_convs(), first), (_two_convs(extra=True), second)):
        x = want.random_inputs(seed=1)
        np.testing.assert_array_equal(compile_model(graph, target=str(TARGET1), use_shipped=False).run(*x)[0],
                                      want.run(*x)[0])
    assert not mark.exists(), "a planted object's constructor ran"
    assert victim.read_bytes() == good


def test_the_cache_is_private_and_a_foreign_or_open_one_is_refused(tmp_path, monkeypatch):
    import os

    from tuner.errors import SetupError
    from tuner.toolchain.cc import cache_dir
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "mine"))
    d = cache_dir()
    assert d.stat().st_mode & 0o777 == 0o700 and d.parent.stat().st_mode & 0o777 == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(open_dir))
    with pytest.raises(SetupError, match="may be written by other users"):
        cache_dir()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(SetupError, match="is not a directory"):
        cache_dir()
    if os.geteuid() == 0:             # root can chown a directory to show a foreign owner
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 12345, 12345)
        monkeypatch.setenv("TUNER_CACHE_DIR", str(foreign))
        with pytest.raises(SetupError, match="belongs to another user"):
            cache_dir()


def test_a_temp_dir_on_another_file_system_still_builds(tmp_cache, monkeypatch, tmp_path):
    """/dev/shm is a tmpfs: before, the final rename crossed file systems (EXDEV) on every compile."""
    import os
    import tempfile
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_cache.parent).st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's temp directory")
    tmp = tempfile.mkdtemp(dir=shm)
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setattr(tempfile, "tempdir", tmp)
    k = build_op(SMALL, target=TARGET1, use_shipped=False, quiet=True)
    assert k.code_hash


@pytest.mark.slow
def test_a_machine_that_cannot_compile_stops_the_tune_and_records_nothing(tmp_cache, tmp_path):
    """A compiler that fails on everything is the machine's fault: exit 3, no COMPILE_ERROR records."""
    import os
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'fatal error: cannot write: No space left on device' >&2\nexit 1\n")
    fake.chmod(0o755)
    log = tmp_path / "log.jsonl"
    out = tuner("tune", "--workload", SPEC, "--threads", "1", "--trials", "4", "--log", str(log), "--no-progress",
                env={**os.environ, "CC": str(fake), "TUNER_CACHE_DIR": str(tmp_cache)}, timeout=120)
    assert out.returncode == 3, out.stderr
    assert "No space left on device" in out.stderr and "Traceback" not in out.stderr
    assert not log.exists() or not records.load(log).records


# ---------------------------------------------------------------- signals, orphans, two tuners

HANG_SCRIPT = r"""
import sys
from tuner.measure.runner import RunConfig
from tuner.search import PolicyFactory
from tuner.search.random_search import RandomSearch
from tuner.task import Candidate, code_hash
from tuner.ops import make
from tuner.tuning import tune
from tuner.target import parse_target


class Hang(RandomSearch):
    name = "hang"
    def propose(self, n, seen, first=False):
        src = "int hang(float** restrict a) { volatile int s = 1; while (s) {} return 0; }\n"
        return [Candidate([["hang"]], src, "hang", False, code_hash(src, "hang"))]

wl = make("conv2d", dict(C=8, H=6, W=6, K=8, R=3, S=3, pad=1), "NCHW8c")
t = parse_target("cpu", threads=1)
tune([wl], target=t, trials=1, log=sys.argv[1], run_config=RunConfig(timeout=120), progress=False,
     policy=PolicyFactory("hang", Hang))
"""


def _workers_of(pid: int) -> list:
    import os
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline").read()
                env = open(f"/proc/{d}/environ", "rb").read()
            except OSError:
                continue
            if "tuner.measure.worker" in cmd and f"TUNER_PARENT_PID={pid}".encode() in env:
                out.append(int(d))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_hung_kernel_never_outlives_the_tuner(tmp_path, tmp_cache, sig):
    import os
    import signal
    import time
    proc = subprocess.Popen([sys.executable, "-c", HANG_SCRIPT, str(tmp_path / "log.jsonl")],
                            stderr=subprocess.PIPE, text=True)
    deadline, workers = time.time() + 60, []
    while time.time() < deadline and not workers:
        time.sleep(0.1)
        workers = _workers_of(proc.pid)
    assert workers, "the measurement process never started"
    time.sleep(0.5)                                   # the worker is now spinning in the hung kernel
    proc.send_signal(getattr(signal, sig))
    if sig == "SIGTERM":                              # asks for a stop after the candidate in hand ...
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)              # ... and a second one stops at once
    proc.wait(timeout=30)
    deadline = time.time() + 10
    while time.time() < deadline and any(os.path.exists(f"/proc/{w}") for w in workers):
        time.sleep(0.1)
    alive = [w for w in workers if os.path.exists(f"/proc/{w}") and open(f"/proc/{w}/stat").read().split()[2] != "Z"]
    assert not alive, f"measurement process(es) {alive} outlived the tuner"
    assert "BrokenPipe" not in proc.stderr.read()


@pytest.mark.slow
def test_sigterm_stops_the_tune_as_cleanly_as_ctrl_c(tmp_path, tmp_cache):
    import signal
    log = tmp_path / "term.jsonl"
    proc = start_tune([sys.executable, "-m", "tuner.cli", "tune", "--workload", SPEC, "--threads", "1", "--trials",
                       "400", "--batch-size", "4", "--log", str(log), "--no-progress", "--repeat", "1",
                       "--min-repeat-ms", "0.5", "--search", "random"], log, 4)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (out, err)
    assert "terminated (SIGTERM)" in out and "Traceback" not in err
    lines = log.read_text().splitlines()
    assert len(lines) >= 4 and all(records.Record.from_json(json.loads(line)) for line in lines)


@pytest.mark.slow
def test_a_second_tuner_on_the_same_workload_and_log_is_refused(tmp_path, tmp_cache):
    import time
    log = tmp_path / "shared.jsonl"
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--workload", SPEC, "--threads", "1", "--trials", "400",
           "--batch-size", "4", "--log", str(log), "--no-progress", "--repeat", "1", "--min-repeat-ms", "0.5",
           "--search", "random"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not log.exists():
            time.sleep(0.05)
        second = tuner(*cmd[3:], timeout=60)
        assert second.returncode == 2 and "another tuner is already tuning" in second.stderr, second.stderr
        other = tuner(*cmd[3:cmd.index(SPEC)], "conv2d:N=1,C=8,H=4,W=4,K=8,R=1,S=1,stride=1,pad=0",
                      *cmd[cmd.index(SPEC) + 1:cmd.index("400")], "6", *cmd[cmd.index("400") + 1:], timeout=120)
        assert other.returncode == 0, other.stderr           # another workload may share the log
    finally:
        first.terminate()
        first.communicate(timeout=60)
    recs = records.load(log).records
    hashes = [(r.workload.key, r.code_hash) for r in recs]
    assert len(recs) > 6 and len(set(hashes)) == len(hashes)


# ---------------------------------------------------------------- hostile specs and ONNX files

INTS = st.integers(-3, 9) | st.sampled_from([0, 10**6, 10**20])


@settings(max_examples=120, deadline=None)
@given(op=st.sampled_from(["conv2d", "dense", "max_pool2d", "avg_pool2d", "global_avg_pool2d"]),
       params=st.dictionaries(st.sampled_from(["N", "C", "H", "W", "K", "R", "S", "stride", "pad", "dilation",
                                                "groups", "bias", "relu", "zz"]), INTS, max_size=12),
       layout=st.sampled_from([None, "NCHW", "NHWC", "NCHW8c", "NCHW0c", "NCHW999c", "OI", "OI16o", "OI0o", "x"]))
def test_hostile_specs_are_a_workload_or_a_user_error(op, params, layout):
    from tuner.errors import UserError
    from tuner.ops import resolve
    spec = f"{op}:" + ",".join(f"{k}={v}" for k, v in params.items())
    try:
        wl = resolve(spec, layout)
    except UserError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert wl.flops >= 0


def _onnx_model(path, attrs: dict, pool_attrs: dict, weight_hw=(3, 3)):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.ones((4, 2, *weight_hw), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", **attrs),
             helper.make_node("Relu", ["c"], ["r"], "relu"),
             helper.make_node("MaxPool", ["r"], ["y"], "pool", **pool_attrs)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


PAIRS = st.lists(st.integers(-1, 4), min_size=1, max_size=5)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=st.fixed_dictionaries({}, optional={"strides": PAIRS, "dilations": PAIRS, "pads": PAIRS,
                                                "kernel_shape": PAIRS, "group": st.integers(-1, 3)}),
       pool=st.fixed_dictionaries({"kernel_shape": PAIRS}, optional={"strides": PAIRS, "pads": PAIRS}))
def test_hostile_onnx_attributes_import_or_give_a_user_error(tmp_path, conv, pool):
    from tuner.errors import UserError
    from tuner.graph import load
    from tuner.graph.passes import optimize
    path = tmp_path / "m.onnx"
    _onnx_model(path, conv, pool)
    try:
        optimize(load(str(path)), layout="NCHW8c")
    except UserError as e:
        assert str(e) and "\n" not in str(e)


@pytest.mark.slow
@pytest.mark.parametrize("conv, pool, message", [
    ({"strides": [0, 0]}, {"kernel_shape": [2, 2]}, "strides must be two positive integers"),
    ({}, {"kernel_shape": [2, 2], "strides": [0, 0]}, "strides must be two positive integers"),
    ({"kernel_shape": [5, 5]}, {"kernel_shape": [2, 2]}, "disagrees with the weight"),
    ({"pads": [-1, 0, 0, 0]}, {"kernel_shape": [2, 2]}, "pads must be four non-negative integers"),
])
def test_bad_onnx_attributes_are_named(tmp_path, conv, pool, message):
    path = tmp_path / "m.onnx"
    _onnx_model(path, conv, pool)
    out = tuner("inspect", str(path), timeout=60)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["random", "evolutionary", "optuna:tpe"])
def test_every_policy_resumes_from_a_log_with_junk_records(tmp_path, policy):
    """Junk decisions, steps that do not replay and tiny costs in the log a tune resumes from."""
    from conftest import REPLAY_LOG, REPLAY_TARGET, REPLAY_WORKLOADS

    from tuner.target import TargetError, parse_target
    from tuner.tuning import tune
    try:
        parse_target(REPLAY_TARGET)
    except TargetError:
        pytest.skip(f"this host cannot read back {REPLAY_TARGET}")
    wl = REPLAY_WORKLOADS[0][0]
    good = [json.loads(line) for line in REPLAY_LOG.read_text().splitlines()[:12]]
    junk = [dict(good[0], decisions={"tile": 3, "pad": "x"}, code_hash="a1"),
            dict(good[1], decisions={"tile": [[1, 2, 3]] * 9, "reduce": [0], "unroll": -1}, code_hash="a2"),
            dict(good[2], steps=[["split", "nope", "x", [1]]], costs=[1e-12], code_hash="a3"),
            dict(good[3], decisions=[], code_hash="a4")]
    log = tmp_path / "resume.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in good + junk))
    s = tune([wl], target=REPLAY_TARGET, trials=len(good) + 3 + 8, log=str(log), policy=policy,
             replay=str(REPLAY_LOG), progress=False, batch_size=4, cost_model_from=["none"])
    assert s.tasks[0].new == 8 and s.tasks[0].best.costs != (1e-12,)


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["export-onnx", "tiny", "-o", "/proc/tuner/x.onnx"], "cannot create"),
    (["analyze", "LOG", "--plot", "/proc/tuner/x.png"], "cannot create"),
    (["pretrain", "LOG", "-o", "/tmp"], "is a directory"),
])
def test_bad_output_paths_are_one_line_errors(args, message):
    from conftest import REPLAY_LOG
    out = tuner(*[str(REPLAY_LOG) if a == "LOG" else a for a in args], timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_distill_remeasure_keeps_what_is_fast_now_not_the_lucky_record(tmp_path, monkeypatch):
    """The fastest logged record of a task was a lucky measurement: re-timed with the runner-up,
    interleaved, the runner-up is kept, as a new record of that measurement."""
    import random as _random

    from tuner.build import Kernel
    from tuner.database.result import MeasureResult
    from tuner.task import Task

    task = Task(SMALL, TARGET1)
    rng = _random.Random(0)
    other = next(s for s in (task.space.steps(task.space.sample(rng)) for _ in range(50))
                 if task.candidate(s, "k").code_hash != task.default_candidate().code_hash)
    cand = task.candidate(other, "k")
    lucky = records.make_record(SMALL, TARGET1, cand.steps, MeasureResult("OK", "", [1e-6]), cand.code_hash, "random", 1)
    steady = _valid_record(cost=2e-6)                      # the default schedule, logged slower
    log = tmp_path / "log.jsonl"
    records.append(log, [lucky])
    with open(log, "a") as f:
        f.write(json.dumps(steady) + "\n")
    now = {cand.code_hash: 5e-6}                          # what each schedule takes "now"
    monkeypatch.setattr(Kernel, "time", lambda self, *a, **kw: [now.get(self.code_hash, 3e-6)] * kw.get("repeat", 5))
    lines = []
    out = tmp_path / "db.jsonl"
    assert distill([str(log)], str(out), remeasure_top=2, rounds=3, progress=lines.append) == 1
    (kept,) = records.load(out).records
    assert kept.steps == steady["steps"] and kept.policy == "remeasure" and kept.costs == (3e-6,) * 3
    assert "best logged 0.001 ms, kept 0.003 ms now (rank 2 of 2)" in lines[0]
    assert records.fastest_that_replay(records.load(log).records, 5)[0].code_hash == cand.code_hash
    monkeypatch.undo()                                     # and for real: one measurement per round
    out2 = tmp_path / "db2.jsonl"
    assert distill([str(log)], str(out2), remeasure_top=2, rounds=2) == 1
    (real,) = records.load(out2).records
    assert real.policy == "remeasure" and len(real.costs) == 2 and all(0 < c < 1 for c in real.costs)


def test_distill_remeasure_keeps_this_versions_default_where_it_beats_every_logged_schedule(tmp_path, monkeypatch):
    """A record tuned against an older version's defaults (here the only one, logged cold) loses to
    this version's default when both are timed again: the default's steps are kept, timed cold as
    the record was, so a compile takes them rather than a slower record of another file."""
    import random as _random

    from tuner.build import Kernel
    from tuner.database.result import MeasureResult
    from tuner.task import Task

    task = Task(SMALL, TARGET1)
    default = task.default_candidate()
    rng = _random.Random(1)
    other = next(s for s in (task.space.steps(task.space.sample(rng)) for _ in range(50))
                 if task.candidate(s, "k").code_hash != default.code_hash)
    cand = task.candidate(other, "k")
    old = records.make_record(SMALL, TARGET1, cand.steps, MeasureResult("OK", "", [1e-6], cold=True), cand.code_hash,
                              "evolutionary", 1)
    assert old.cold
    log, out = tmp_path / "log.jsonl", tmp_path / "db.jsonl"
    records.append(log, [old])
    timed = []

    def fake_time(self, *a, **kw):
        timed.append((self.code_hash, kw.get("cold")))
        return [{cand.code_hash: 4e-6, default.code_hash: 2e-6}[self.code_hash]] * kw.get("repeat", 5)

    monkeypatch.setattr(Kernel, "time", fake_time)
    lines = []
    assert distill([str(log)], str(out), remeasure_top=3, rounds=2, progress=lines.append) == 1
    (kept,) = records.load(out).records
    assert kept.steps == default.steps and kept.code_hash == default.code_hash and records.replays(kept)
    assert kept.policy == "remeasure" and kept.cold and kept.costs == (2e-6, 2e-6)
    assert kept.decisions == task.space.default() and task.candidate(task.space.steps(kept.decisions)).code_hash \
        == default.code_hash
    assert sorted(set(timed)) == sorted({(cand.code_hash, True), (default.code_hash, True)}) and len(timed) == 4
    assert "kept 0.002 ms now (this version's default, beside 1 logged)" in lines[0]
    timed.clear()                                         # faster than the default: the record stays
    monkeypatch.setattr(Kernel, "time", lambda self, *a, **kw: [1e-6 if self.code_hash == cand.code_hash else 2e-6] * 3)
    assert distill([str(log)], str(tmp_path / "db2.jsonl"), remeasure_top=1, rounds=2) == 1
    (kept,) = records.load(tmp_path / "db2.jsonl").records
    assert kept.code_hash == cand.code_hash and kept.policy == "remeasure"
    monkeypatch.undo()                                     # and for real, the weights evicted before each call
    assert distill([str(log)], str(tmp_path / "db3.jsonl"), remeasure_top=1, rounds=2) == 1
    (real,) = records.load(tmp_path / "db3.jsonl").records
    assert real.cold and len(real.costs) == 2 and all(0 < c < 1 for c in real.costs)


def test_distill_only_given_remeasures_the_given_logs_tasks_and_keeps_the_output_files_others(tmp_path, monkeypatch):
    """Refreshing some tasks of a shipped file: with only_given, the tasks of the given logs are
    timed again beside the default; a task only the output file holds keeps its record untouched.
    Without it, both are timed."""
    import random as _random

    from tuner.build import Kernel
    from tuner.database.result import MeasureResult
    from tuner.task import Task

    other_wl = make("conv2d", dict(C=8, H=6, W=6, K=16, R=1, S=1), "NCHW8c")
    recs = []
    for wl in (SMALL, other_wl):
        task = Task(wl, TARGET1)
        rng = _random.Random(2)
        steps = next(s for s in (task.space.steps(task.space.sample(rng)) for _ in range(50))
                     if task.candidate(s, "k").code_hash != task.default_candidate().code_hash)
        cand = task.candidate(steps, "k")
        recs.append(records.make_record(wl, TARGET1, cand.steps, MeasureResult("OK", "", [5e-6]), cand.code_hash,
                                        "evolutionary", 1))
    shipped, given = tmp_path / "shipped.jsonl", tmp_path / "given.jsonl"
    records.append(shipped, recs)
    records.append(given, recs[:1])
    timed = []

    def fake_time(self, *a, **kw):              # every default beats every logged schedule
        timed.append(self.workload.key)
        return [1e-6 if self.record is None else 4e-6] * kw.get("repeat", 5)

    monkeypatch.setattr(Kernel, "time", fake_time)
    assert distill([str(given)], str(shipped), remeasure_top=1, rounds=2, only_given=True) == 2
    kept = {r.workload.key: r for r in records.load(shipped).records}
    assert set(timed) == {SMALL.key}
    assert kept[SMALL.key].policy == "remeasure" and kept[SMALL.key].code_hash == Task(SMALL, TARGET1).default_candidate().code_hash
    assert kept[other_wl.key].to_json() == recs[1].to_json()
    timed.clear()
    assert distill([str(given)], str(shipped), remeasure_top=1, rounds=2) == 2
    assert set(timed) == {SMALL.key, other_wl.key}
    assert records.load(shipped).records[0].policy == "remeasure" == records.load(shipped).records[1].policy


def test_distill_lower_isa_times_an_avx2_record_on_an_avx512_host_and_the_new_record_names_this_host(
        tmp_path, monkeypatch):
    """AVX2 records tuned against older defaults, on an AVX-512 host: distill leaves them as logged
    (this host is not an AVX2 host); with lower_isa it times them beside this version's AVX2
    default and the kept record says which host timed it. On an AVX2 host they name no host."""
    import random as _random

    from tuner.analysis import distill as D
    from tuner.build import Kernel
    from tuner.database.result import MeasureResult
    from tuner.target import parse_target
    from tuner.task import Task

    avx2 = parse_target("cpu -isa=avx2", threads=1, check_host=False)
    task = Task(SMALL, avx2)
    rng = _random.Random(3)
    steps = next(s for s in (task.space.steps(task.space.sample(rng)) for _ in range(50))
                 if task.candidate(s, "k").code_hash != task.default_candidate().code_hash)
    cand = task.candidate(steps, "k")
    old = records.make_record(SMALL, avx2, cand.steps, MeasureResult("OK", "", [1e-6]), cand.code_hash,
                              "evolutionary", 1)
    log = tmp_path / "log.jsonl"
    records.append(log, [old])
    monkeypatch.setattr(D, "host_isa", lambda: "avx512")
    monkeypatch.setattr(D, "host_kind", lambda: "AuthenticAMD-25-17")
    timed = []

    def fake_time(self, *a, **kw):                 # this version's default wins
        timed.append(self.code_hash)
        return [2e-6 if self.record is None else 4e-6] * kw.get("repeat", 5)

    monkeypatch.setattr(Kernel, "time", fake_time)
    assert distill([str(log)], str(tmp_path / "a.jsonl"), remeasure_top=1, rounds=2) == 1
    (kept,) = records.load(tmp_path / "a.jsonl").records
    assert not timed and kept.to_json() == old.to_json()
    assert distill([str(log)], str(tmp_path / "b.jsonl"), remeasure_top=1, rounds=2, lower_isa=True) == 1
    (kept,) = records.load(tmp_path / "b.jsonl").records
    assert len(timed) == 4 and kept.code_hash == task.default_candidate().code_hash
    assert kept.host == "AuthenticAMD-25-17" and kept.target == old.target and kept.policy == "remeasure"
    timed.clear()                                               # the logged schedule wins: it names this host too
    monkeypatch.setattr(Kernel, "time", lambda self, *a, **kw: [1e-6 if self.record else 2e-6] * kw.get("repeat", 5))
    assert distill([str(log)], str(tmp_path / "w.jsonl"), remeasure_top=1, rounds=2, lower_isa=True) == 1
    (won,) = records.load(tmp_path / "w.jsonl").records
    assert won.code_hash == cand.code_hash and won.host == "AuthenticAMD-25-17" and won.costs == (1e-6, 1e-6)
    monkeypatch.setattr(D, "host_isa", lambda: "avx2")         # an AVX2 host's own timing names none,
    assert distill([str(tmp_path / "w.jsonl")], str(tmp_path / "c.jsonl"), remeasure_top=1, rounds=2) == 1
    (kept,) = records.load(tmp_path / "c.jsonl").records       # not even the stand-in that timed it before
    assert kept.policy == "remeasure" and kept.host == "" and kept.code_hash == cand.code_hash


def test_distill_only_given_checks_only_the_given_logs_plans(tmp_path, monkeypatch):
    """Refreshing one plan of a shipped file: with only_given, check_plans times the plans the given
    logs hold and leaves the output file's others as they are; without it, every plan."""
    from tuner.analysis import distill as D

    def plan(model: str, digest: str):
        return records.PlanRecord(model, digest, "cpu -isa=avx2 -cores=2 -threads=1", {"conv0": "NCHW8c"}, 1e-3,
                                  timestamp="2026-12-02T00:00:00+00:00", candidates=("NCHW8c",))
    mine, other = plan("resnet50", "a" * 16), plan("googlenet", "b" * 16)
    shipped, given = tmp_path / "shipped.jsonl", tmp_path / "given.jsonl"
    records.append(shipped, [mine, other])
    records.append(given, [mine])
    checked = []
    monkeypatch.setattr(D, "recheck_plan", lambda p, *a, **kw: checked.append((p.model, kw, a[2:])))
    distill([str(given)], str(shipped), check_plans=True, only_given=True, lower_isa=True)
    assert [c[0] for c in checked] == ["resnet50"] and checked[0][2] == (None, True)
    assert {p.model for p in records.load(shipped).plans} == {"resnet50", "googlenet"}
    checked.clear()
    distill([str(given)], str(shipped), check_plans=True)
    assert sorted(c[0] for c in checked) == ["googlenet", "resnet50"] and all(c[2] == (None, False) for c in checked)


def test_distill_keeps_a_task_whose_records_no_longer_replay_and_retimes_it_as_this_versions_code(tmp_path):
    """A record whose steps this version builds as other code (its logged hash is an older
    version's) is no reason to lose the task: distill keeps it as logged, or with --retime-stale
    times its steps as this version's code and logs that code's hash."""
    from tuner.task import Task
    task = Task(SMALL, TARGET1)
    old = dict(_valid_record(cost=2e-6), code_hash="0" * 20)      # the default's steps, another code's hash
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(old) + "\n")
    assert not records.replays(records.load(log).records[0])
    kept_out, new_out = tmp_path / "kept.jsonl", tmp_path / "new.jsonl"
    assert distill([str(log)], str(kept_out)) == 1
    (kept,) = records.load(kept_out).records
    assert kept.code_hash == "0" * 20 and kept.costs == (2e-6,) * len(kept.costs)
    lines = []
    assert distill([str(log)], str(new_out), rounds=2, retime_stale=True, progress=lines.append) == 1
    (new,) = records.load(new_out).records
    assert new.policy == "retimed" and new.code_hash == task.default_candidate().code_hash and records.replays(new)
    assert len(new.costs) == 2 and all(0 < c < 1 for c in new.costs) and "as this version's" in lines[0]


def test_a_logged_layout_that_is_no_layout_is_reported_not_a_traceback(tmp_path):
    """Found by the property above: a record whose layout names no layout (here 'OK')."""
    from tuner.analysis.report import analyze
    log = tmp_path / "bad.jsonl"
    rec = {"workload": {"key": "k", "spec": "conv2d:C=8,H=4,W=4,K=8,R=1,S=1", "layout": "OK"},
           "target": "cpu -isa=avx2 -cores=2 -threads=1", "steps": [], "costs": [1e-6], "error": "OK"}
    log.write_text(json.dumps(rec) + "\n")
    rep = analyze(str(log))
    assert len(rep.tasks) == 1 and math.isnan(rep.tasks[0].flops)


def test_distill_leaves_out_records_of_a_workload_this_version_defines_otherwise_and_says_so(tmp_path):
    """A record whose key is not the one this version gives its spec (an operator redefined since it
    was logged) can apply to no compile: distill leaves it out, warns with the count, and keeps the
    others."""
    log = tmp_path / "log.jsonl"
    ok = _valid_record(cost=2e-6)
    moved = dict(ok, workload=dict(ok["workload"], key="0123456789abcdef"))
    log.write_text(json.dumps(ok) + "\n" + json.dumps(moved) + "\n")
    out = tmp_path / "db.jsonl"
    with pytest.warns(UserWarning, match=r"1 task\(s\) whose workload this version defines otherwise \(conv2d"):
        assert distill([str(log)], str(out)) == 1
    (kept,) = records.load(out).records
    assert kept.workload.key == SMALL.key
