"""Tuned operators against PyTorch (oneDNN) and the machine's peak, in one run.

For each workload and thread count: tune with N trials (resuming from the bench log), build
the best kernel, then time it and PyTorch's kernel for the same workload, interleaved round by
round, with the same thread count. PyTorch runs in its faster memory format (contiguous or
channels_last, picked per workload). Prints a table; writes JSON under bench/results/.

    python -m bench.ops                                  # every ResNet-50 conv + both dense, 256 trials
    python -m bench.ops --workloads r50.s1.conv3x3 --trials 64 --threads 1
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # both OpenMP runtimes in this process spin briefly

import numpy as np  # noqa: E402

from bench.common import bench_workload, write_results  # noqa: E402
from tuner.analysis.report import task_report  # noqa: E402
from tuner.build import build_op  # noqa: E402
from tuner.measure.peak import peak_gflops  # noqa: E402
from tuner.ops import BUILTIN  # noqa: E402
from tuner.target import parse_target  # noqa: E402
from tuner.te.layouts import act_to_nchw, conv_weight_to_oihw, dense_weight_to_oi  # noqa: E402
from tuner.tuning import tune_op  # noqa: E402

DEFAULT_WORKLOADS = [n for n in BUILTIN if n.startswith("r50.")] + ["dense.512x1000", "dense.2048x1000"]


def torch_callables(wl, arrays, device: str = "cpu") -> dict:
    """PyTorch's op for `wl` on the same data, on `device`, per memory format it can run in:
    {format: fn}."""
    import torch
    import torch.nn.functional as F
    p = wl.p

    def t(a):
        return torch.from_numpy(a).to(device)
    if wl.op == "dense":
        x = t(arrays[0])
        w = t(dense_weight_to_oi(arrays[1], wl.blocks[1]))
        b = t(arrays[2]) if p["bias"] else None
        return {"dense": lambda: F.linear(x, w, b)}
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


def bench_one(name, layout, threads, trials, log, rounds, progress, policy="random"):
    import torch
    torch.set_num_threads(threads)
    wl = bench_workload(name, layout)
    s = tune_op(wl, threads=threads, trials=trials, log=log, progress=progress, policy=policy)
    kernel = build_op(wl, threads=threads, log=log, use_shipped=False, quiet=True)
    arrays = wl.random_inputs(seed=1)
    np.testing.assert_allclose(kernel(*arrays), wl.reference(arrays), rtol=2e-3, atol=2e-3)
    tfns = torch_callables(wl, arrays)
    ours, theirs = [], {f: [] for f in tfns}
    for _ in range(rounds):  # interleaved, every PyTorch format each round: a busy neighbour slows all alike
        ours.append(statistics.median(kernel.time(*arrays, repeat=3, min_repeat_ms=30)))
        for f, fn in tfns.items():
            theirs[f].append(time_python(fn, repeat=3, min_ms=30))
    tfmt = min(theirs, key=lambda f: statistics.median(theirs[f]))   # PyTorch in its faster format
    t_ours, t_torch = statistics.median(ours), statistics.median(theirs[tfmt])
    first_best = task_report(log, wl.key, str(s.target)).best_trial
    return {
        "workload": name, "spec": wl.spec, "layout": wl.layout, "threads": threads, "trials": s.trials,
        "gflop": wl.flops / 1e9, "tuner_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3, "torch_format": tfmt,
        "tuner_gflops": wl.flops / t_ours / 1e9, "torch_gflops": wl.flops / t_torch / 1e9,
        "ratio_vs_torch": t_torch / t_ours, "best_at_trial": first_best,
        "tune_seconds_this_run": s.seconds, "candidates_per_minute": s.candidates_per_minute if s.new else None,
        "new_trials": s.new, "rounds": rounds, "target": str(s.target),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--layout", default="NCHW16c", help="conv layout (dense uses OI16o)")
    ap.add_argument("--trials", type=int, default=256)
    ap.add_argument("--threads", default="1,2", help="thread counts; the first is the headline")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--search", default="random", help="search policy for the tuning (the issue's figure: random)")
    ap.add_argument("--log-dir", default="logs/bench")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    thread_counts = [int(t) for t in args.threads.split(",")]
    target = parse_target("cpu")
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    rows, peaks = [], {}
    for t in thread_counts:
        peaks[t] = peak_gflops(target, t)
        log = str(Path(args.log_dir) / f"ops.{args.layout}.t{t}.jsonl")
        for name in names:
            row = bench_one(name, args.layout, t, args.trials, log, args.rounds, not args.no_progress, args.search)
            row["fraction_of_peak"] = row["tuner_gflops"] / peaks[t]
            rows.append(row)
            print(_fmt_row(row), flush=True)
    summary = {}
    for t in thread_counts:
        sel = [r for r in rows if r["threads"] == t]
        convs = [r for r in sel if r["workload"].startswith("r50.")]
        summary[t] = {
            "peak_gflops": peaks[t],
            "geomean_ratio_vs_torch_r50_convs": _geomean([r["ratio_vs_torch"] for r in convs]) if convs else None,
            "geomean_ratio_vs_torch_all": _geomean([r["ratio_vs_torch"] for r in sel]),
        }
    print()
    print(_table(rows))
    for t, s in summary.items():
        g = s["geomean_ratio_vs_torch_r50_convs"]
        print(f"{t} thread(s): peak {s['peak_gflops']:.1f} GFLOPS; geomean tuner/PyTorch speed "
              f"over ResNet-50 convs {g:.3f}x" if g else f"{t} thread(s): peak {s['peak_gflops']:.1f} GFLOPS")
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
            "best@", "cand/min"]
    body = [[r["workload"], str(r["threads"]), str(r["trials"]), f"{r['tuner_ms']:.3f}", f"{r['tuner_gflops']:.1f}",
             f"{r['torch_ms']:.3f}", f"{r['torch_gflops']:.1f}", f"{r['ratio_vs_torch']:.2f}",
             f"{r['fraction_of_peak']:.2f}", str(r["best_at_trial"]),
             f"{r['candidates_per_minute']:.0f}" if r["candidates_per_minute"] else "-"] for r in rows]
    widths = [max(len(x[k]) for x in [head] + body) for k in range(len(head))]
    lines = ["  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(x, widths)))
             for x in [head] + body]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
