"""Trials and time to a good schedule: tuner's tune against TVM MetaSchedule's on the same operators.

Each workload (issue 3's: ResNet-50 convs in NCHW16c, the classifier's dense in OI16o) is given to
both tools with the same input and output layouts (the TE below is tuner's reference, checked
against it), one thread, the same trial budget:
- tuner: evolutionary search from scratch (no pre-trained cost model, no default schedule seeded),
  and, `--as-shipped`, as `tuner tune` runs (the default first, the shipped cost model, which was
  trained on records of these very workloads: not a fair search race, shown beside it);
- MetaSchedule (`tvm.s_tir.meta_schedule.tune_tir`, its defaults: evolutionary search, XGBoost,
  64 candidates a round, LLVM for this host's CPU);
- tuner's default schedule, untuned (the row at 0 trials).
Each tool times candidates its own way (tuner cold, MetaSchedule warm), so a curve's own figures
are not compared across tools. Instead, at each checkpoint (trials 8, 16, 32, ...) the best
schedule so far by the tool's own timing is kept, and after both tunes every kept kernel is
checked against the reference and timed in one harness (warm, interleaved rounds, medians): the
table gives that latency and the wall seconds each tool had spent to reach the checkpoint.

Needs `pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1` (0.1.15's ffi crashed in
tune_tir here); it is not a dependency of tuner.

    python -m bench.vs_metaschedule --trials 256
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")   # before tvm starts its thread pool

import numpy as np  # noqa: E402

from bench.common import SEARCH_WORKLOADS, bench_workload, write_results  # noqa: E402
from tuner.measure.builder import build_batch  # noqa: E402
from tuner.measure.interleave import interleaved  # noqa: E402
from tuner.measure.runner import RunConfig  # noqa: E402
from tuner.measure.worker import check_output  # noqa: E402
from tuner.target import parse_target  # noqa: E402
from tuner.task import Task  # noqa: E402
from tuner.toolchain.library import aligned_copy, aligned_empty, open_library, pointer_array  # noqa: E402
from tuner.tuning import MeasureCallback, tune  # noqa: E402


def checkpoints(trials: int) -> list:
    ks, k = [], 8
    while k < trials:
        ks.append(k)
        k *= 2
    return ks + [trials]


def te_workload(wl):
    """The workload as a TVM PrimFunc in tuner's layouts, its output shaped as tuner's."""
    from tvm import te, tirx
    p = dict(wl.params)
    ins, out = wl.build()
    if wl.op == "dense":
        (n, c), (kb, _, lanes) = ins[0].shape, ins[1].shape
        data, weight = te.placeholder((n, c), name="data"), te.placeholder((kb, c, lanes), name="weight")
        bias = te.placeholder((p["K"],), name="bias")
        r = te.reduce_axis((0, c), name="r")
        mm = te.compute((n, p["K"]), lambda i, k: te.sum(data[i, r] * weight[k // lanes, r, k % lanes], axis=r),
                        name="matmul")
        o = te.compute((n, p["K"]), lambda i, k: mm[i, k] + bias[k], name="out")
        args = [data, weight, bias, o]
    elif wl.op == "conv2d" and wl.layout.startswith("NCHW") and wl.layout.endswith("c"):
        assert (p["bias"], p["relu"], p["residual"], p["groups"], p["dilation"]) == (0, 0, 0, 1, 1), wl.label
        (n, cb, h, w, ci), (_, _, rr, ss, _, _) = ins[0].shape, ins[1].shape
        st, pad = p["stride"], p["pad"]
        data, weight = te.placeholder(ins[0].shape, name="data"), te.placeholder(ins[1].shape, name="weight")
        padded = te.compute((n, cb, h + 2 * pad, w + 2 * pad, ci), lambda a, b, y, x, c: tirx.if_then_else(
            tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad), data[a, b, y - pad, x - pad, c], 0.0),
            name="pad")
        rb, rc = te.reduce_axis((0, cb), "rb"), te.reduce_axis((0, ci), "rc")
        ry, rx = te.reduce_axis((0, rr), "ry"), te.reduce_axis((0, ss), "rx")
        o = te.compute(out.shape, lambda a, k, y, x, c: te.sum(
            padded[a, rb, y * st + ry, x * st + rx, rc] * weight[k, rb, ry, rx, rc, c], axis=[rb, ry, rx, rc]),
            name="out")
        args = [data, weight, o]
    else:
        raise SystemExit(f"{wl.label}: only NCHWc convs without epilogue and OI16o denses are written as TE here")
    return te.create_prim_func(args)


def tuner_default(wl) -> tuple:
    """As tuner_run, for the default schedule (as `tuner compile` takes with no record) at checkpoint 0."""
    task = Task(wl, parse_target("cpu", 1))
    return _kernels(task, [(0, 0.0, task.space.steps(task.space.default()))]), 0.0


def tuner_run(wl, trials: int, log: str, as_shipped: bool, marks: list) -> tuple:
    """[(checkpoint, wall seconds, kernel)], the tune's seconds: tuner's best-so-far at each checkpoint."""
    kept, state = [], {"best": None, "n": 0}
    task = Task(wl, parse_target("cpu", 1))
    t0 = time.perf_counter()

    class Checkpoints(MeasureCallback):
        def on_result(self, loop, st, cand, result, record):
            state["n"] += 1
            if result.ok and (state["best"] is None or result.latency < state["best"][0]):
                state["best"] = (result.latency, record.steps)
            if state["n"] in marks and state["best"]:
                kept.append((state["n"], time.perf_counter() - t0, state["best"][1]))

    opts = {} if as_shipped else dict(cost_model_from=["none"], start_from_default=False)
    tune([wl], task.target, log=log, trials=trials, policy="evolutionary", progress=False,
         callbacks=[Checkpoints()], **opts)
    return _kernels(task, kept), time.perf_counter() - t0


def _kernels(task, kept: list) -> list:
    """[(checkpoint, seconds, callable(pointer array))] of kept [(checkpoint, seconds, steps)], built."""
    cands = [task.candidate(steps, func_name=f"ck{n}") for n, _, steps in kept]
    built = build_batch([(c.func_name, c.source) for c in cands], task.target)
    out = []
    for (n, s, _), b in zip(kept, built):
        assert not b.error, b.error
        lib, index = open_library(b.lib), b.index
        out.append((n, s, lambda ptrs, lib=lib, index=index: lib.tuner_run(index, ptrs)))
    return out


def metaschedule_run(wl, trials: int, work_dir: str, marks: list) -> tuple:
    """As tuner_run, for MetaSchedule's tune_tir of the same workload."""
    import tvm
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.measure_callback import MeasureCallback as MSCallback, PyMeasureCallback
    mod = tvm.IRModule({"main": te_workload(wl)})
    target = tvm.target.Target({"kind": "llvm", "mcpu": _llvm_cpu(), "num-cores": 1})
    kept, state = [], {"best": None, "n": 0}
    t0 = time.perf_counter()

    @derived_object
    class Checkpoints(PyMeasureCallback):
        def apply(self, scheduler, task_id, candidates, builds, runs):
            for cand, run in zip(candidates, runs):
                state["n"] += 1
                if run.error_msg is None and run.run_secs:
                    lat = statistics.median(float(s) for s in run.run_secs)
                    if state["best"] is None or lat < state["best"][0]:
                        state["best"] = (lat, cand.sch.mod)
                if state["n"] in marks and state["best"]:
                    kept.append((state["n"], time.perf_counter() - t0, state["best"][1]))

    ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=64,
                measure_callbacks=list(MSCallback.create("default")) + [Checkpoints()])
    seconds = time.perf_counter() - t0
    out = []
    for n, s, best in kept:
        f = tvm.compile(best, target)["main"]
        out.append((n, s, lambda arrays, f=f: f(*arrays)))
    return out, seconds


def _llvm_cpu() -> str:
    import tvm
    return str(tvm.target.codegen.llvm_get_system_cpu())


def run_workload(name: str, trials: int, rounds: int, as_shipped: bool, keep: str) -> dict:
    import tvm
    wl = bench_workload(name, "NCHW16c")
    marks = checkpoints(trials)
    inputs = wl.random_inputs(seed=0)
    ref = wl.reference(inputs)
    runs = {"tuner-default": tuner_default(wl)}
    for tool, shipped in [("tuner", False)] + ([("tuner-as-shipped", True)] if as_shipped else []):
        log = os.path.join(keep, f"{wl.name}.{tool}.jsonl")
        if os.path.exists(log):
            os.remove(log)
        print(f"{wl.name}: {tool}, {trials} trials", flush=True)
        runs[tool] = tuner_run(wl, trials, log, shipped, marks)
    print(f"{wl.name}: metaschedule, {trials} trials", flush=True)
    work_dir = os.path.join(keep, f"{wl.name}.metaschedule")
    shutil.rmtree(work_dir, ignore_errors=True)
    runs["metaschedule"] = metaschedule_run(wl, trials, work_dir, marks)

    # every kept kernel, checked as a tune checks a candidate (its output filled with NaN first), then timed
    # in one harness: warm, each tool's arrays 64-byte aligned as each allocates them
    host = [aligned_copy(np.asarray(a, np.float32)) for a in inputs] + [aligned_empty(ref.shape)]
    ptrs = pointer_array(host)
    tvm_ins = [tvm.runtime.tensor(a) for a in host]
    callers = {}
    for tool, (kept, _) in runs.items():
        for n, _, fn in kept:
            args = tvm_ins if tool == "metaschedule" else ptrs
            host[-1].fill(np.nan)
            tvm_ins[-1] = tvm.runtime.tensor(host[-1])
            assert fn(args) in (None, 0), f"{wl.name}: {tool}'s kernel after {n} trials failed"
            got = tvm_ins[-1].numpy() if tool == "metaschedule" else host[-1].copy()
            problem = check_output(got, ref, RunConfig.rtol, RunConfig.atol)
            if problem:
                raise SystemExit(f"{wl.name}: {tool}'s best after {n} trials is wrong: {problem}")
            callers[(tool, n)] = functools.partial(_call, fn, args)
    times = interleaved({f"{t}@{n}": c for (t, n), c in callers.items()}, None, rounds=rounds, min_seconds=0.1,
                        settle=0.0)
    result = {"workload": wl.name, "label": wl.label, "flops": wl.live_flops, "trials": trials, "tools": {}}
    for tool, (kept, seconds) in runs.items():
        result["tools"][tool] = {"seconds": seconds, "checkpoints": [
            {"trials": n, "seconds": s, "latency_s": statistics.median(times[f"{tool}@{n}"])} for n, s, _ in kept]}
    return result


def _call(fn, args, _inputs):
    return fn(args)


def rows(results: list) -> list:
    """One flat row per workload, tool and checkpoint (what the table and bench.report show)."""
    return [{"workload": r["workload"], "tool": tool, "trials": c["trials"], "wall_s": round(c["seconds"], 1),
             "latency_us": round(c["latency_s"] * 1e6, 1), "gflops": round(r["flops"] / c["latency_s"] / 1e9, 1)}
            for r in results for tool, t in r["tools"].items() for c in t["checkpoints"]]


def table(results: list) -> str:
    lines = ["| workload | tool | trials | wall s | latency us | GFLOPS |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['workload']} | {r['tool']} | {r['trials']} | {r['wall_s']:.0f} | {r['latency_us']:.1f} | "
              f"{r['gflops']:.1f} |" for r in rows(results)]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=SEARCH_WORKLOADS, help="comma-separated (default: issue 3's four)")
    ap.add_argument("--trials", type=int, default=256, help="each tool's budget per workload")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of the final interleaved timing")
    ap.add_argument("--as-shipped", action="store_true", help="also tune as `tuner tune` does by default")
    ap.add_argument("--keep", default=None, help="folder for the tunes' logs (default: a temporary one)")
    ap.add_argument("--tag", default="", help="suffix of the results file")
    args = ap.parse_args(argv)
    keep = args.keep or tempfile.mkdtemp(prefix="vs_ms_")
    os.makedirs(keep, exist_ok=True)
    import tvm
    out = f"bench/results/vs_metaschedule{args.tag}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    results = []
    for name in (n.strip() for n in args.workloads.split(",") if n.strip()):
        results.append(run_workload(name, args.trials, args.rounds, args.as_shipped, keep))
        print(table(results[-1:]), flush=True)
        write_results("vs_metaschedule", out, {"tvm": tvm.__version__, "llvm_cpu": _llvm_cpu(), "threads": 1,
                                               "rows": rows(results), "results": results})   # a crash keeps the rest
    print(table(results))


if __name__ == "__main__":
    main()
