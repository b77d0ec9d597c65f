"""Whole models: tuner's compiled ResNet-18, ResNet-50 and MobileNetV2 against ONNX Runtime and PyTorch.

    python -m bench.models [--models resnet50,resnet18,mobilenet_v2] [--threads 1,2] [--rounds 7]

Each model (batch 1, 224x224) is compiled with the shipped schedules (schedules/, plus --log),
then timed in one run, interleaved round by round, at each thread count: the compiled model
(`CompiledModel.run`), ONNX Runtime (default CPU provider, all graph optimisations, the same
thread count) and PyTorch eager (best of NCHW and channels_last). Prints latency medians,
ratios (of medians, and the median of each round's paired ratio), GFLOPS and fraction of this
machine's FP32 peak, executor overhead (the model timed in C
minus its steps each timed alone) and the part of it spent outside any step (the model minus its
steps timed in context: dispatch), arena bytes, compile time, and the steps that take the time
(alone and in context); writes JSON under bench/results/.
"""
from __future__ import annotations

import argparse

from bench.common import write_results
from bench.peak import peak_gflops
from tuner.runtime.bench import bench_model
from tuner.target import parse_target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,resnet18,mobilenet_v2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--log", action="append", help="tuning logs besides the shipped schedules")
    ap.add_argument("--peers", default="onnxruntime,torch")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    peaks = {t: peak_gflops(parse_target("cpu", t), t) for t in threads}
    print("FP32 peak: " + ", ".join(f"{t} thread(s) {p:.0f} GFLOPS" for t, p in peaks.items()))
    out = {"peak_gflops": peaks, "models": {}}
    summary = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        print(f"\n== {name}")
        res = bench_model(name, threads=threads, peers=[p for p in args.peers.split(",") if p], rounds=args.rounds,
                          logs=args.log or [])
        for row in res["rows"]:
            t = row["threads"]
            row["fraction_of_peak"] = row["gflops"] / peaks[t]
            summary.append((name, row))
            print(f"  {t} thread(s), slowest steps:")
            for s in row["slowest_steps"][:5]:
                print(f"    {s['share'] * 100:5.1f}%  {s['seconds'] * 1e3:7.3f} ms (in context "
                      f"{s['in_context_s'] * 1e3:7.3f})  {s['gflops']:6.1f} GFLOPS "
                      f"({s['gflops'] / peaks[t]:.2f} of peak)  {s['source']:<8} {s['workload']}")
        out["models"][name] = res
    print(f"\n{'model':<13} {'thr':>3} {'tuner ms':>9} {'ORT ms':>8} {'torch ms':>9} {'vs ORT':>7} {'paired':>7} "
          f"{'vs torch':>8} {'GFLOPS':>7} {'peak':>5} {'exec ovh':>8} {'dispatch':>8} {'arena MiB':>9} {'compile s':>9}")
    for name, row in summary:
        med = row["median_s"]
        ours, ort, pt = med["tuner"], med.get("onnxruntime"), med.get("torch")
        paired = (row.get("vs_onnxruntime_paired") or {}).get("median")
        print(f"{name:<13} {row['threads']:>3} {ours * 1e3:>9.2f} {(ort or 0) * 1e3:>8.2f} {(pt or 0) * 1e3:>9.2f} "
              f"{(ours / ort if ort else 0):>6.2f}x {(paired or 0):>6.3f}x {(ours / pt if pt else 0):>7.2f}x "
              f"{row['gflops']:>7.1f} {row['fraction_of_peak']:>5.2f} {100 * row['executor_overhead']:>7.2f}% "
              f"{100 * row['dispatch_overhead']:>7.2f}% {row['arena_bytes'] / 2**20:>9.1f} {row['compile_s']:>9.1f}")
    write_results("models", args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
