"""Timings faster than the target allows are refused; the kernel cache holds one library per source; a
compiler call that does not finish or takes too much memory fails its kernel alone."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import REPLAY_WORKLOADS, TARGET1

from tuner.database import records
from tuner.database.result import OK, RUNTIME_ERROR, MeasureResult
from tuner.measure import plausible
from tuner.measure.runner import CpuRunner
from tuner.ops import make
from tuner.tuning import tune

SMALL = REPLAY_WORKLOADS[0][0]
GFLOP = make("dense", dict(N=1000, C=500, K=1000))          # 1 GFLOP a call


def test_a_forged_local_timing_is_logged_as_a_runtime_error(tmp_path, tmp_cache, monkeypatch):
    monkeypatch.setattr(CpuRunner, "_attempt", lambda self, message: (MeasureResult(OK, costs=[1e-12, 1e-12]), False))
    log = tmp_path / "f.jsonl"
    tune([SMALL], target=TARGET1, trials=4, log=str(log), policy="random", progress=False, batch_size=4)
    recs = records.load(str(log), warn=False).records
    assert len(recs) == 4
    assert all(r.error == RUNTIME_ERROR and r.message.startswith("timing refused: 1e-12 s per call") for r in recs)


def test_a_timing_beyond_twice_the_measured_peak_is_refused_after_measuring_the_peak_again(monkeypatch):
    peaks = [10.0, 12.0, 11.0]          # a busy host measures it low, then less low
    monkeypatch.setattr(plausible, "_PEAKS", {})
    monkeypatch.setattr("tuner.measure.peak.peak_gflops", lambda target, threads, iters: peaks.pop(0))
    assert GFLOP.flops == pytest.approx(1e9)
    fine = plausible.check(GFLOP, TARGET1, MeasureResult(OK, costs=[1 / 15, 1 / 14]), here=True)
    assert fine.ok                                  # 15 GFLOPS: within 2 x 10, measured once
    kept = plausible.check(GFLOP, TARGET1, MeasureResult(OK, costs=[1 / 22]), here=True)
    assert kept.ok                                  # 22: beyond 2 x 10, within 2 x 12 measured again
    refused = plausible.check(GFLOP, TARGET1, MeasureResult(OK, costs=[1 / 30], host="h"), here=True)
    assert refused.error == RUNTIME_ERROR and "timing refused (from h)" in refused.message
    assert "2x this host's measured peak" in refused.message and "(24 GFLOPS" in refused.message
    assert refused.host == "h" and not peaks        # measured again before refusing: the highest peak counts
    elsewhere = plausible.check(GFLOP, TARGET1, MeasureResult(OK, costs=[1 / 30]))
    assert elsewhere.ok                             # timed elsewhere: only the target's ceiling bounds it
    ceiling = plausible.ceiling_gflops(TARGET1)
    beyond = plausible.check(GFLOP, TARGET1, MeasureResult(OK, costs=[0.9 / ceiling]))
    assert beyond.error == RUNTIME_ERROR and "the ceiling of its ISA and threads" in beyond.message


def test_a_conv_that_skips_its_padding_is_judged_by_the_products_that_read_the_input(monkeypatch):
    """DeepLab's dilation-12 conv at 14x14: 18% of its products read the input, and its kernel
    skips the rest (schedule.peel), so it runs at over twice the peak counted by all of them; its
    timing is judged by the 18%, and one faster than the peak allows for those is still refused."""
    monkeypatch.setattr(plausible, "_PEAKS", {})
    monkeypatch.setattr("tuner.measure.peak.peak_gflops", lambda target, threads, iters: 100.0)
    wl = make("conv2d", dict(C=960, H=14, W=14, K=256, R=3, S=3, pad=12, dilation=12), "NCHW16c")
    assert wl.live_flops == pytest.approx(wl.flops * 9 / 49)           # 3 of 7 rows and columns' taps live
    assert wl.flops / 2.6e-3 / 1e9 > 2 * 100
    assert plausible.check(wl, TARGET1, MeasureResult(OK, costs=[2.6e-3]), here=True).ok
    too_fast = plausible.check(wl, TARGET1, MeasureResult(OK, costs=[0.7e-3]), here=True)
    assert too_fast.error == RUNTIME_ERROR and "2x this host's measured peak" in too_fast.message
    plain = make("conv2d", dict(C=64, H=56, W=56, K=64, R=1, S=1), "NCHW16c")
    assert plain.live_flops == plain.flops
    from types import SimpleNamespace

    from tuner.tuning import TuneSummary          # the GFLOPS a tune prints count the same products
    s = TuneSummary(wl, TARGET1, "log.jsonl", best=SimpleNamespace(latency=2.6e-3))
    assert s.best_gflops == pytest.approx(wl.live_flops / 2.6e-3 / 1e9) and s.best_gflops < 2 * 100


def test_a_winograd_transform_is_judged_by_the_operations_it_cannot_do_without(monkeypatch):
    """A transform's FLOPs count a product and an add per non-zero entry, but its entries are +-1
    (m=2): a kernel of additions ran at 1.12x this host's FMA peak in those FLOPs, and a busy host
    measuring half its peak refused it (a flaky test). Judged by a quarter of them, it passes; a
    timing too fast for those is still refused."""
    monkeypatch.setattr(plausible, "_PEAKS", {})
    monkeypatch.setattr("tuner.measure.peak.peak_gflops", lambda target, threads, iters: 59.0)
    wl = make("winograd_input", dict(C=24, H=14, W=14, pad=1, m=2), "NCHW16c")
    assert wl.least_flops == pytest.approx(wl.flops / 4) and wl.live_flops == wl.flops
    assert wl.flops / 1.14e-6 / 1e9 > 2 * 59
    assert plausible.check(wl, TARGET1, MeasureResult(OK, costs=[1.14e-6]), here=True).ok
    too_fast = plausible.check(wl, TARGET1, MeasureResult(OK, costs=[0.3e-6]), here=True)
    assert too_fast.error == RUNTIME_ERROR and "2x this host's measured peak" in too_fast.message
    for spec in (dict(H=14, W=14, K=16, pad=1, m=2), dict(H=28, W=28, K=64, pad=1, m=4)):
        out = make("winograd_output", spec, "NCHW16c")        # AT's rows all computed: (alpha + m) of each
        assert 0 < out.least_flops < out.flops / 2
    conv = make("conv2d", dict(C=64, H=56, W=56, K=64, R=3, S=3, pad=1), "NCHW16c")
    assert conv.least_flops == conv.live_flops


@pytest.mark.parametrize("costs", [[], [0.0], [-1.0], [math.nan], [math.inf], ["0.001"], [True], None])
def test_costs_that_are_not_positive_seconds_are_refused(costs):
    r = plausible.check(GFLOP, TARGET1, MeasureResult(OK, costs=costs))
    assert r.error == RUNTIME_ERROR and "not positive finite seconds" in r.message


def test_a_failed_measurement_passes_unchanged():
    r = MeasureResult("WRONG_ANSWER", "x differs")
    assert plausible.check(GFLOP, TARGET1, r, here=True) is r


PLANT = "__attribute__((constructor)) static void planted(void) {}\nint tuner_count(void) { return 0; }\n"


def _fake_compiler(tmp_path, on_marker: str) -> str:
    """A C compiler that runs `on_marker` (shell) where the source holds RUNAWAY, else gcc."""
    script = tmp_path / "cc"
    script.write_text("#!/bin/sh\nfor a in \"$@\"; do case $a in *.c) src=$a;; esac; done\n"
                      f"if [ -n \"$src\" ] && grep -q RUNAWAY \"$src\"; then {on_marker}; fi\nexec gcc \"$@\"\n")
    script.chmod(0o755)
    return str(script)


KERNELS = [(f"f{k}", f"{'/* RUNAWAY */ ' if k == 1 else ''}int f{k}(float** a) {{ (void)a; return {k}; }}\n")
           for k in range(3)]


def test_a_kernel_the_compiler_does_not_finish_is_stopped_with_its_passes_and_fails_alone(tmp_path, tmp_cache,
                                                                                          monkeypatch):
    from tuner.measure import builder
    from tuner.toolchain import cc
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    pids = tmp_path / "pids"
    monkeypatch.setattr(cc, "compiler", lambda: (_fake_compiler(tmp_path, f"sleep 300 & echo $! >> {pids}; wait"),
                                                 "fake 1"))
    monkeypatch.setattr(builder, "LIMIT_S", 1.5)
    t = time.monotonic()
    built = builder.build_batch(KERNELS, TARGET1, jobs=1)
    assert time.monotonic() - t < 60
    assert [b.error is None for b in built] == [True, False, True]
    assert built[1].error.startswith(cc.RAN_PAST)
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 1       # the kernel alone, stopped with the pass it started
    for pid in started:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1][0] in "ZX", f"process {pid} still runs"


def test_a_compiler_call_that_outgrows_its_memory_cap_fails_its_kernel_alone(tmp_path, tmp_cache, monkeypatch):
    from tuner.measure import builder
    from tuner.toolchain import cc
    if not shutil.which("gcc") or not sys.platform.startswith("linux"):
        pytest.skip("no gcc, or not Linux (the cap is set by the shell's ulimit -v there)")
    grow = f"{sys.executable} -c 'bytearray(3 << 30)' || exit 1"     # 3 GiB, where the cap is 1 GiB
    monkeypatch.setattr(cc, "compiler", lambda: (_fake_compiler(tmp_path, grow), "fake 2"))
    monkeypatch.setattr(cc, "memory_cap", lambda: 1 << 30)
    built = builder.build_batch(KERNELS, TARGET1, jobs=1)
    assert [b.error is None for b in built] == [True, False, True]
    assert "MemoryError" in built[1].error


def test_a_kernel_built_before_is_neither_compiled_nor_linked_again_while_its_files_are_sound(tmp_cache, monkeypatch):
    """A heat's second timing of a tune's kernel, or a compiled model's, does not compile it again:
    each kernel is an object named by its code, whatever the caller named it. In the process that
    linked it, its library and index come back (the library touched, as a cache hit is); elsewhere
    its object is linked into the new batch's library. An object or library gone or changed, or
    another cache, builds anew."""
    from tuner.measure import builder
    from tuner.toolchain import cc
    from tuner.toolchain.library import open_library, pointer_array
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    compiles = []             # the kernel sources the compiler ran on
    real = cc.run_limited
    monkeypatch.setattr(cc, "run_limited", lambda cmd, *a: compiles.extend(
        Path(x).read_text() for x in cmd if x.endswith(".c") and "tuner_table" not in Path(x).read_text()) or real(cmd, *a))
    libs = set()

    def built(*kernels, jobs=1):
        out = builder.build_batch(list(kernels), TARGET1, jobs=jobs)
        libs.update(b.lib for b in out)
        return [(b.index, open_library(b.lib).tuner_run(b.index, pointer_array([]))) for b in out]

    renamed = ("g0", KERNELS[0][1].replace("f0", "g0"))                 # another Task's name for the same kernel
    assert built(KERNELS[0], KERNELS[2]) == [(0, 0), (1, 2)] and len(compiles) == 2 and len(libs) == 1
    os.utime(next(iter(libs)), (1e9, 1e9))
    assert built(KERNELS[2], renamed, KERNELS[2], jobs=2) == [(1, 2), (0, 0), (1, 2)] and len(libs) == 1
    assert len(compiles) == 2 and os.path.getmtime(next(iter(libs))) > time.time() - 600    # touched: kept
    Path(next(iter(libs))).unlink()                                     # gone: linked anew
    assert built(KERNELS[2], renamed) == [(0, 2), (1, 0)] and len(compiles) == 2 and len(libs) == 2

    builder._LINKED.clear()                                             # another process: its objects serve
    kernel_objects = [o for o in (tmp_cache / "objects").glob("*.o") if b"tuner_table" not in o.read_bytes()
                      and b"tk_" in o.read_bytes()]
    assert len(kernel_objects) == 2
    assert built(renamed, KERNELS[2]) == [(0, 0), (1, 2)] and len(compiles) == 2
    kernel_objects[0].unlink()                                          # gone: compiled anew
    builder._LINKED.clear()
    assert sorted(built(KERNELS[0], KERNELS[2])) == [(0, 0), (1, 2)] and len(compiles) == 3
    for o in (tmp_cache / "objects").glob("*.o"):
        o.write_bytes(o.read_bytes()[:100])                             # changed on disk: never linked
    builder._LINKED.clear()
    assert built(KERNELS[0], KERNELS[2]) == [(0, 0), (1, 2)] and len(compiles) == 5
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_cache.parent / "other"))
    assert built(KERNELS[0]) == [(0, 0)] and len(compiles) == 6


def test_two_libraries_for_one_source_are_warned_of_and_the_stranger_removed(tmp_path, tmp_cache):
    from tuner.toolchain.cc import compile_library
    from tuner.toolchain.library import content_hash
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    flags = list(TARGET1.cflags)
    real, err = compile_library("int f(void) { return 1; }\n", flags)
    assert err is None
    (tmp_path / "p.c").write_text(PLANT)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "p.so"), str(tmp_path / "p.c")], check=True)
    data = (tmp_path / "p.so").read_bytes()
    digest, real_hash = Path(real).stem.split("-")
    while content_hash(data) > real_hash:          # its name sorts first, as the builder looks them up
        data += b"\0"
    planted = Path(real).with_name(f"{digest}-{content_hash(data)}.so")
    planted.write_bytes(data)
    assert sorted(Path(real).parent.glob(f"{digest}-*.so"))[0] == planted
    with pytest.warns(UserWarning, match=r"holds 2 libraries built from one source .*removing the others"):
        again, _ = compile_library("int f(void) { return 1; }\n", flags)
    assert again == real and not planted.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_library("int f(void) { return 1; }\n", flags)[0] == real


def test_the_kernel_cache_keeps_under_its_limit_by_removing_the_least_recently_used_never_one_used_within_the_hour(
        tmp_cache, monkeypatch, capsys):
    """Builds prune the cache (on a process's first build, then every PRUNE_EVERY): the least
    recently used files go first, down to PRUNE_TO of TUNER_CACHE_SIZE; a cache hit counts as a
    use; a file used within IN_USE_S stays whatever the limit, and so does a fresh build directory
    (a stale one, a killed build's, goes). `tuner cache` says the size; --clear removes all."""
    import os
    import time

    from tuner.cli import main
    from tuner.toolchain import cc
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    flags, hour = list(TARGET1.cflags), 3600
    src = [f"int f{k}(void) {{ return {k}; }}\n" for k in range(6)]
    libs = [Path(cc.compile_library(s, flags)[0]) for s in src]
    now = time.time()
    for k, p in enumerate(libs[:5]):            # used 6 .. 2 hours ago; the last one just now
        os.utime(p, (now - (6 - k) * hour,) * 2)
    stale, fresh = libs[0].parent / ".build-stale", libs[0].parent / ".build-fresh"
    stale.mkdir(), fresh.mkdir()
    os.utime(stale, (now - 2 * hour,) * 2)
    assert cc.compile_library(src[0], flags)[0] == str(libs[0])      # a hit: now the most recently used
    size = {p: p.stat().st_size for p in libs}
    limit = (size[libs[0]] + size[libs[4]] + size[libs[5]] + 1) / cc.PRUNE_TO
    assert cc.prune_cache(int(limit)) == (3, size[libs[1]] + size[libs[2]] + size[libs[3]])
    assert [p.exists() for p in libs] == [True, False, False, False, True, True]
    assert fresh.exists() and not stale.exists()
    monkeypatch.setenv("TUNER_CACHE_SIZE", "1")                  # a build's own prune: all but the hour's
    monkeypatch.setattr(cc, "_builds", 0)
    cc.compile_library("int g(void) { return 7; }\n", flags)
    assert [p.exists() for p in libs] == [True, False, False, False, False, True]
    assert main(["cache"]) == 0 and "3 built file(s)" in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0 and "removed 3 file(s)" in capsys.readouterr().out
    assert not cc.built_files() and fresh.exists()          # a running build's directory stays
    monkeypatch.setenv("TUNER_CACHE_SIZE", "lots")
    assert main(["cache"]) == 2
    assert "TUNER_CACHE_SIZE='lots' is not a size" in capsys.readouterr().err


def test_the_peak_runner_reports_the_flops_its_microbenchmark_does():
    """bench.models times it beside the models, round by round: its FLOPs over the call's wall time
    cannot exceed the rate the microbenchmark measures inside the call, and not fall far below it."""
    import time

    from tuner.measure.peak import peak_runner
    run, flops = peak_runner(TARGET1, 1, iters=1_000_000)
    assert flops == 2 * 12 * TARGET1.lanes * 1_000_000
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        inside = run(None)
        rates.append((flops / 1e9 / (time.perf_counter() - t0), inside))
    assert all(0.2 * inside <= outside <= 1.01 * inside for outside, inside in rates), rates


def test_the_fraction_of_peak_pairs_each_round_with_the_peak_timed_in_it():
    from tuner.measure.peak import fraction_of_peak
    # 2 GFLOP in 1 s against a 4 GFLOPS peak, then in 0.5 s against 2: 0.5 and 2.0 of peak
    assert fraction_of_peak(2.0, [1.0, 0.5, 0.25], [4.0, 2.0, 16.0]) == 0.5
    with pytest.raises(ValueError):
        fraction_of_peak(2.0, [1.0, 0.5], [4.0])


def test_a_compiled_model_links_the_objects_a_tune_built_and_timed_for_its_kernels(tmp_cache, monkeypatch):
    """A model's kernel is named by its code, as the builder names a tune's candidate: a model
    compiled after its tasks' candidates were built compiles none of them again."""
    from tuner.graph.models import tiny
    from tuner.graph.passes import optimize
    from tuner.measure import builder
    from tuner.task import Task
    from tuner.toolchain import cc
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    g = tiny()
    tasks = [Task(t.workload, TARGET1) for t in optimize(g, layout="NCHW16c").meta["tasks"] if t.tunable]
    cands = [t.default_candidate() for t in tasks]
    assert cands and not any(b.error for b in builder.build_batch(
        [(c.func_name, c.source, c.openmp) for c in cands], TARGET1))
    compiled = []
    real = cc.run_limited
    monkeypatch.setattr(cc, "run_limited", lambda cmd, *a: compiled.extend(
        Path(x).read_text() for x in cmd if x.endswith(".c")) or real(cmd, *a))
    from tuner.compiler import compile_model
    m = compile_model(g, target=str(TARGET1), layout="NCHW16c", use_shipped=False, predict=False)
    tuned = [s for s in m.steps if s.workload_key is not None]
    assert {s.code_hash for s in tuned} == {c.code_hash for c in cands}
    assert all(s.func == f"tk_{s.code_hash}" for s in tuned)
    assert compiled and not any(f"tk_{c.code_hash}(float** restrict args) {{" in src for c in cands for src in compiled)
