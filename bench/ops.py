"""Tuned operators against PyTorch (oneDNN) and the machine's peak, in one run.

For each workload and thread count: tune with N trials (resuming from the bench log), build
the best kernel, then time it, its default schedule (--untuned), PyTorch's kernel for the same
workload and the FP32 FMA microbenchmark, interleaved round by round, with the same thread count;
each round's GFLOPS over that round's peak is the fraction of peak (a shared host's peak moves).
PyTorch runs in its faster memory format (contiguous or channels_last, picked per workload); for a
dense or batch_matmul it runs the same GEMM with its epilogue, on operands in plain layout (the
heads' reshapes tuner's kernels absorb are not charged to it). Prints a table; writes JSON under
bench/results/.

    python -m bench.ops                                  # every ResNet-50 conv + both dense, 256 trials
    python -m bench.ops --workloads r50.s1.conv3x3 --trials 64 --threads 1
    python -m bench.ops --from-log logs/bert.jsonl --trials 0 --untuned --threads 1   # a model tune's GEMMs
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # both OpenMP runtimes in this process spin briefly

import numpy as np  # noqa: E402

from bench.common import bench_workload, write_results  # noqa: E402
from tuner.analysis.report import task_report  # noqa: E402
from tuner.build import build_op  # noqa: E402
from tuner.database import records  # noqa: E402
from tuner.measure.peak import fraction_of_peak, peak_runner  # noqa: E402
from tuner.ops import BUILTIN, resolve  # noqa: E402
from tuner.target import parse_target  # noqa: E402
from tuner.te.layouts import act_to_nchw, conv_weight_to_oihw, dense_weight_to_oi  # noqa: E402
from tuner.tuning import tune_op  # noqa: E402

DEFAULT_WORKLOADS = [n for n in BUILTIN if n.startswith("r50.")] + ["dense.512x1000", "dense.2048x1000"]
GEMMS = ("dense", "batch_matmul")
TORCH_ACTS = {"relu": ("relu", {}), "gelu": ("gelu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"}),
              "tanh": ("tanh", {}), "sigmoid": ("sigmoid", {}), "silu": ("silu", {})}   # tuner's act: F's


def log_workloads(path: str, threads: int) -> list:
    """The GEMM-shaped workloads (dense, batch_matmul) that `path` holds records of at `threads`,
    as logged (WorkloadRef), in the log's order."""
    seen = {}
    for r in records.load(path).records:
        if r.workload.spec.split(":")[0] in GEMMS and (ct := records.code_target(r.target)) and ct[2] == threads:
            seen.setdefault(r.workload.key, r.workload)
    return list(seen.values())


def torch_callables(wl, arrays, device: str = "cpu") -> dict:
    """PyTorch's op for `wl` on the same data, on `device`, per memory format it can run in:
    {format: fn}."""
    import torch
    import torch.nn.functional as F
    p = wl.p

    def t(a):
        return torch.from_numpy(a).to(device)
    if wl.op in GEMMS:
        act = p.get("act") or ("relu" if p.get("relu") else None)
        if act and act not in TORCH_ACTS:
            raise ValueError(f"{wl.label}: no PyTorch peer for act={act}")
        fn = partial(getattr(F, TORCH_ACTS[act][0]), **TORCH_ACTS[act][1]) if act else (lambda y: y)
        g = torch.Generator().manual_seed(0)
        if wl.op == "batch_matmul":
            a = torch.randn(p["B"], p["M"], p["K"], generator=g)
            b = torch.randn(p["B"], *((p["N"], p["K"]) if wl.layout == "NT" else (p["K"], p["N"])), generator=g)
            return {"matmul": lambda: torch.matmul(a, b.transpose(1, 2) if wl.layout == "NT" else b)}
        x = torch.randn(p["N"], p["C"], generator=g) if p.get("in_heads") else t(arrays[0])
        w = t(dense_weight_to_oi(arrays[1], wl.blocks[1]))
        b = t(arrays[2]) if p["bias"] else None
        r = t(arrays[-1]) if p.get("residual") else None
        def dense():
            return fn(F.linear(x, w, b))
        return {"dense": (lambda: dense() + r) if r is not None else dense}
    x = t(act_to_nchw(arrays[0], wl.layout))
    w = t(conv_weight_to_oihw(arrays[1], wl.layout))
    if not isinstance(p["pad"], int):
        raise ValueError("asymmetric pads have no direct PyTorch conv2d")
    fns = {}
    for name, fmt in (("NCHW", torch.contiguous_format), ("NHWC", torch.channels_last)):
        xf, wf = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        fns[name] = (lambda xf=xf, wf=wf: F.conv2d(xf, wf, None, p["stride"], p["pad"], p["dilation"], p["groups"]))
    return fns


def time_python(fn, repeat: int = 5, min_ms: float = 50.0) -> float:
    """Median seconds per call; each repeat loops long enough that Python overhead is noise."""
    import torch
    with torch.inference_mode():
        fn()
        t0 = time.perf_counter()
        fn()
        once = max(time.perf_counter() - t0, 1e-7)
        number = max(1, int(min_ms / 1e3 / once))
        costs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            costs.append((time.perf_counter() - t0) / number)
    return statistics.median(costs)


def bench_one(wl, threads, trials, log, rounds, progress, policy="random", untuned=False, name=None):
    import torch
    torch.set_num_threads(threads)
    tgt = parse_target("cpu", threads)
    s = tune_op(wl, threads=threads, trials=trials, log=log, progress=progress, policy=policy) if trials else None
    kernels = {"tuner": build_op(wl, threads=threads, log=log, use_shipped=False, quiet=True)}
    if untuned:
        kernels["default"] = build_op(wl, threads=threads, use_shipped=False, quiet=True)
    arrays = wl.random_inputs(seed=1)
    for k in kernels.values():
        np.testing.assert_allclose(k(*arrays), wl.reference(arrays), rtol=2e-3, atol=2e-3)
    tfns = torch_callables(wl, arrays)
    run_peak, _ = peak_runner(tgt, threads)
    ours, theirs, peaks = {k: [] for k in kernels}, {f: [] for f in tfns}, []
    for _ in range(rounds):  # interleaved, every PyTorch format each round: a busy neighbour slows all alike
        for k, kernel in kernels.items():
            ours[k].append(statistics.median(kernel.time(*arrays, repeat=3, min_repeat_ms=30)))
        for f, fn in tfns.items():
            theirs[f].append(time_python(fn, repeat=3, min_ms=30))
        peaks.append(run_peak(None))          # the GFLOPS it measures
    tfmt = min(theirs, key=lambda f: statistics.median(theirs[f]))   # PyTorch in its faster format
    t_ours, t_torch = statistics.median(ours["tuner"]), statistics.median(theirs[tfmt])

    def of_peak(ts):
        return fraction_of_peak(wl.flops / 1e9, ts, peaks)
    rep = task_report(log, wl.key, str(tgt)) if Path(log).exists() else None
    row = {
        "workload": name or wl.label, "spec": wl.spec, "layout": wl.layout, "threads": threads,
        "trials": rep.trials if rep else 0, "tuned": kernels["tuner"].tuned,
        "gflop": wl.flops / 1e9, "tuner_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3, "torch_format": tfmt,
        "tuner_gflops": wl.flops / t_ours / 1e9, "torch_gflops": wl.flops / t_torch / 1e9,
        "ratio_vs_torch": t_torch / t_ours, "best_at_trial": rep.best_trial if rep else None,
        "peak_gflops": statistics.median(peaks), "fraction_of_peak": of_peak(ours["tuner"]),
        "torch_fraction_of_peak": of_peak(theirs[tfmt]),
        "tune_seconds_this_run": s.seconds if s else 0.0,
        "candidates_per_minute": s.candidates_per_minute if s and s.new else None,
        "new_trials": s.new if s else 0, "rounds": rounds, "target": str(tgt),
    }
    if untuned:
        row.update(default_ms=statistics.median(ours["default"]) * 1e3, default_fraction_of_peak=of_peak(ours["default"]),
                   tuned_vs_default=statistics.median(d / o for d, o in zip(ours["default"], ours["tuner"])))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=None, help=f"names or specs (default: {','.join(DEFAULT_WORKLOADS)}, "
                    "or none with --from-log)")
    ap.add_argument("--from-log", action="append", default=[], metavar="LOG",
                    help="also every dense and batch_matmul that LOG has records of at the thread count, its best "
                         "schedule from LOG (tuned further with --trials); repeatable")
    ap.add_argument("--layout", default="NCHW16c", help="conv layout (dense uses OI16o)")
    ap.add_argument("--trials", type=int, default=256, help="trials per workload (0: no tuning)")
    ap.add_argument("--untuned", action="store_true", help="time each workload's default schedule too")
    ap.add_argument("--threads", default="1,2", help="thread counts; the first is the headline")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--search", default="random", help="search policy for the tuning (the issue's figure: random)")
    ap.add_argument("--log-dir", default="logs/bench")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    for path in args.from_log:
        if not Path(path).is_file():
            raise SystemExit(f"bench.ops: --from-log {path}: no such file (give a tune log)")
    names = [w.strip() for w in (args.workloads or ("" if args.from_log else ",".join(DEFAULT_WORKLOADS))).split(",")
             if w.strip()]
    thread_counts = [int(t) for t in args.threads.split(",")]
    target = parse_target("cpu")
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for t in thread_counts:
        log = str(Path(args.log_dir) / f"ops.{args.layout}.t{t}.jsonl")
        jobs = [(bench_workload(n, args.layout), log, n) for n in names]
        jobs += [(resolve(w.spec, w.layout), path, None) for path in args.from_log for w in log_workloads(path, t)]
        if not jobs:
            print(f"{t} thread(s): no workload (the logs hold no dense or batch_matmul at {t} thread(s))")
        for wl, wlog, name in jobs:
            row = bench_one(wl, t, args.trials, wlog, args.rounds, not args.no_progress, args.search, args.untuned, name)
            rows.append(row)
            print(_fmt_row(row), flush=True)
    summary = {}
    for t in thread_counts:
        sel = [r for r in rows if r["threads"] == t]
        if not sel:
            continue
        convs = [r for r in sel if r["workload"].startswith("r50.")]
        flops = sum(r["gflop"] for r in sel)
        summary[t] = {
            "peak_gflops": statistics.median(r["peak_gflops"] for r in sel),
            "geomean_ratio_vs_torch_r50_convs": _geomean([r["ratio_vs_torch"] for r in convs]) if convs else None,
            "geomean_ratio_vs_torch_all": _geomean([r["ratio_vs_torch"] for r in sel]),
            # each workload counted once: FLOPs over the time of one call of each, both over the peak
            "fraction_of_peak_all": sum(r["gflop"] * r["fraction_of_peak"] for r in sel) / flops,
            "torch_fraction_of_peak_all": sum(r["gflop"] * r["torch_fraction_of_peak"] for r in sel) / flops,
        }
    print()
    print(_table(rows))
    for t, s in summary.items():
        g = s["geomean_ratio_vs_torch_r50_convs"]
        print(f"{t} thread(s): peak {s['peak_gflops']:.1f} GFLOPS (median of the rounds); FLOP-weighted fraction of "
              f"peak tuner {s['fraction_of_peak_all']:.2f}, PyTorch {s['torch_fraction_of_peak_all']:.2f}"
              + (f"; geomean tuner/PyTorch speed over ResNet-50 convs {g:.3f}x" if g else ""))
    write_results("ops", args.out, {
        "machine": {"cpu": platform.processor() or platform.machine(), "target": str(target),
                    "cores": target.cores},
        "args": vars(args), "summary": summary, "rows": rows})


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _fmt_row(r):
    return (f"{r['workload']:<18} t={r['threads']} tuner {r['tuner_gflops']:7.1f} GFLOPS  torch[{r['torch_format']}] "
            f"{r['torch_gflops']:7.1f}  ratio {r['ratio_vs_torch']:.2f}  peak {r['fraction_of_peak']:.2f}")


def _table(rows):
    head = ["workload", "thr", "trials", "tuner ms", "GFLOPS", "torch ms", "torch GFLOPS", "vs torch", "of peak",
            "default", "torch", "best@", "cand/min"]
    body = [[r["workload"], str(r["threads"]), str(r["trials"]), f"{r['tuner_ms']:.3f}", f"{r['tuner_gflops']:.1f}",
             f"{r['torch_ms']:.3f}", f"{r['torch_gflops']:.1f}", f"{r['ratio_vs_torch']:.2f}",
             f"{r['fraction_of_peak']:.2f}",
             f"{r['default_fraction_of_peak']:.2f}" if "default_fraction_of_peak" in r else "-",
             f"{r['torch_fraction_of_peak']:.2f}", str(r["best_at_trial"]),
             f"{r['candidates_per_minute']:.0f}" if r["candidates_per_minute"] else "-"] for r in rows]
    widths = [max(len(x[k]) for x in [head] + body) for k in range(len(head))]
    lines = ["  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(x, widths)))
             for x in [head] + body]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
