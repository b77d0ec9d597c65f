"""Tuned CUDA operators against PyTorch (cuDNN / cuBLAS, TF32 off) on this host's GPU, in one run.

For each workload: tune with N trials on the GPU (resuming from the bench log), build the best
kernel, check it against NumPy, then time it and PyTorch's kernel for the same data, both with
CUDA events, interleaved round by round. PyTorch runs in its faster memory format (contiguous or
channels_last). Prints GFLOPS, the ratio to PyTorch, the fraction of the FP32 peak and the
measured candidates per minute; writes JSON under bench/results/.

    python -m bench.gpu                                   # ResNet-50 convs at batch 1 and 16, depthwise, dense
    python -m bench.gpu --workloads "dense:N=1024,C=1024,K=1024;r50.s1.conv3x3@16" --trials 64

Needs pycuda (pip install -e ".[cuda]") and torch with CUDA. Issue 14's targets: geomean >= 0.8x
PyTorch over the ResNet-50 convs at batch 16, >= 0.7x on dense 4096^3, >= 100 candidates/minute.
"""
from __future__ import annotations

import argparse
import statistics
import traceback
from pathlib import Path

import numpy as np

from bench.common import bench_workload, write_results
from bench.ops import _geomean, _table, torch_callables
from tuner.analysis.report import task_report
from tuner.build import build_op
from tuner.measure.cuda_worker import time_launches
from tuner.ops import BUILTIN, make
from tuner.target import parse_target
from tuner.tuning import tune_op

R50 = [n for n in BUILTIN if n.startswith("r50.")]
DEFAULT = ([f"{n}@1" for n in R50] + [f"{n}@16" for n in R50]
           + ["conv2d:N=1,C=144,H=56,W=56,K=144,R=3,S=3,stride=1,pad=1,groups=144",
              "dense:N=1024,C=1024,K=1024", "dense:N=4096,C=4096,K=4096"])
FP32_LANES_PER_SM = {"sm_70": 64, "sm_75": 64, "sm_80": 64, "sm_86": 128, "sm_89": 128, "sm_90": 128}


def workload(item: str, layout: str):
    """A workload by name or spec, '@B' setting its batch."""
    name, _, batch = item.partition("@")
    wl = bench_workload(name, layout)
    return make(wl.op, {**wl.p, "N": int(batch)}, wl.layout) if batch else wl


def gpu_name() -> str:
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv
    return drv.Context.get_device().name()


def peak_gflops() -> float:
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv
    dev = drv.Context.get_device()
    a = drv.device_attribute
    major, minor = dev.compute_capability()
    lanes = FP32_LANES_PER_SM.get(f"sm_{major}{minor}", 128)
    return 2 * lanes * dev.get_attribute(a.MULTIPROCESSOR_COUNT) * dev.get_attribute(a.CLOCK_RATE) * 1e3 / 1e9


class _TorchEvents:
    """torch.cuda events in the shape of pycuda's (Event(), record, synchronize, time_since), so
    PyTorch is timed by the same rule as tuner's kernels (measure.cuda_worker.time_launches)."""

    class Event:
        def __init__(self):
            import torch
            self.e = torch.cuda.Event(enable_timing=True)

        def record(self):
            self.e.record()

        def synchronize(self):
            self.e.synchronize()

        def time_since(self, begin) -> float:
            return begin.e.elapsed_time(self.e)


def time_torch(fn, repeat: int = 3, min_ms: float = 30.0) -> float:
    import torch
    with torch.inference_mode():
        fn()
        return statistics.median(time_launches(_TorchEvents, fn, repeat, min_ms))


def bench_one(item, layout, target, trials, log, rounds, progress, policy, time_limit=None):
    wl = workload(item, layout)
    s = tune_op(wl, target=target, trials=trials, log=log, progress=progress, policy=policy, time_limit=time_limit)
    kernel = build_op(wl, target=target, log=log, use_shipped=False, quiet=True)
    arrays = wl.random_inputs(seed=1)
    np.testing.assert_allclose(kernel(*arrays), wl.reference(arrays), rtol=2e-3, atol=2e-3)
    tfns = torch_callables(wl, arrays, device="cuda")
    ours, theirs = [], {f: [] for f in tfns}
    for _ in range(rounds):
        ours.append(statistics.median(kernel.time(*arrays, repeat=3, min_repeat_ms=30)))
        for f, fn in tfns.items():
            theirs[f].append(time_torch(fn))
    tfmt = min(theirs, key=lambda f: statistics.median(theirs[f]))
    t_ours, t_torch = statistics.median(ours), statistics.median(theirs[tfmt])
    return {
        "workload": item, "spec": wl.spec, "layout": wl.layout, "threads": 1, "trials": s.trials,
        "gflop": wl.flops / 1e9, "tuner_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3, "torch_format": tfmt,
        "tuner_gflops": wl.flops / t_ours / 1e9, "torch_gflops": wl.flops / t_torch / 1e9,
        "ratio_vs_torch": t_torch / t_ours, "best_at_trial": task_report(log, wl.key, str(s.target)).best_trial,
        "tune_seconds_this_run": s.seconds, "candidates_per_minute": s.candidates_per_minute if s.new else None,
        "new_trials": s.new, "rounds": rounds, "target": str(s.target),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=";".join(DEFAULT),
                    help="names or specs separated by ';' (specs hold commas), '@B' for batch B")
    ap.add_argument("--layout", default="NHWC", help="conv layout")
    ap.add_argument("--trials", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds of tuning per workload at most")
    ap.add_argument("--search", default="evolutionary")
    ap.add_argument("--log-dir", default="logs/bench")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    import torch
    torch.backends.cudnn.allow_tf32 = False          # FP32 against FP32
    torch.backends.cuda.matmul.allow_tf32 = False
    target = parse_target("cuda")
    peak = peak_gflops()
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    log = str(Path(args.log_dir) / f"gpu.{target.arch}.{args.layout}.jsonl")
    rows, items = [], [w.strip() for w in args.workloads.split(";") if w.strip()]
    try:
        for item in items:
            try:
                row = bench_one(item, args.layout, target, args.trials, log, args.rounds, not args.no_progress,
                                args.search, args.time_limit)
            except Exception:           # one workload's failure is a finding; the others still run
                traceback.print_exc()
                print(f"{item}: FAILED (above)", flush=True)
                continue
            row["fraction_of_peak"] = row["tuner_gflops"] / peak
            row["torch_fraction_of_peak"] = row["torch_gflops"] / peak
            rows.append(row)
            print(f"{item:<24} tuner {row['tuner_gflops']:8.0f} GFLOPS  torch {row['torch_gflops']:8.0f}  "
                  f"ratio {row['ratio_vs_torch']:.2f}  peak {row['fraction_of_peak']:.2f}", flush=True)
            _write(args, target, peak, rows, items)        # each row as it comes: a lease can end mid-run
    except KeyboardInterrupt:
        print(f"interrupted after {len(rows)} of {len(items)} workloads", flush=True)
    print()
    print(_table(rows))
    print(_write(args, target, peak, rows, items)["summary"])


def _write(args, target, peak, rows, items) -> dict:
    b16 = [r for r in rows if r["workload"].endswith("@16")]
    rates = [r["candidates_per_minute"] for r in rows if r["candidates_per_minute"]]
    summary = {"peak_gflops": peak, "workloads_done": f"{len(rows)}/{len(items)}",
               "geomean_ratio_vs_torch_r50_b16": _geomean([r["ratio_vs_torch"] for r in b16]) if b16 else None,
               "median_candidates_per_minute": statistics.median(rates) if rates else None}
    payload = {"machine": {"target": str(target), "gpu": gpu_name()}, "args": vars(args), "summary": summary, "rows": rows}
    write_results("gpu", args.out, payload)
    return payload


if __name__ == "__main__":
    main()
