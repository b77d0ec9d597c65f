"""A compiled model with its weights and arena in 2 MiB pages (as tuner compiles it where Linux
grants them) against the same model in 4 KiB pages, with ONNX Runtime timed in the same rounds.

    python -m bench.huge_pages [--models resnet50] [--log LOG ...] [--threads 1,2] [--rounds 9]

Both variants are the same library and weights (the 4 KiB one gets plain 64-byte aligned copies of
the weights and a fresh arena); the three run interleaved round by round. Prints per model and
thread count the medians and the paired ratios to ONNX Runtime, and writes JSON under
bench/results/.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from bench.common import write_results
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios
from tuner.compiler import compile_model
from tuner.graph import load
from tuner.toolchain.library import aligned_empty


def small_pages(m):
    """`m` with its weights and arena moved to ordinary (4 KiB-page) 64-byte aligned storage."""
    weights = aligned_empty(m._weights.shape)
    weights[...] = m._weights
    m._weights, m._arena, m.huge_pages = weights, aligned_empty(m._arena.shape), ()
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--log", action="append", help="tuning logs (default: the shipped schedules)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    out = {"rounds": args.rounds, "logs": args.log or [], "models": {}}
    print(f"{'model':<14} {'threads':>7} {'2 MiB pages':>12} {'4 KiB pages':>12} {'ORT':>9} "
          f"{'2M vs ORT':>10} {'4K vs ORT':>10} {'2M vs 4K':>9}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        graph = load(name)
        for threads in [int(t) for t in args.threads.split(",")]:
            huge = compile_model(name, log=args.log or [], threads=threads, use_shipped=not args.log)
            if not huge.huge_pages:
                raise SystemExit(f"{name}: this host gave no 2 MiB pages to ask for (THP off?): nothing to compare")
            small = small_pages(compile_model(name, log=args.log or [], threads=threads, use_shipped=not args.log))
            x = huge.random_inputs(seed=1)
            assert all(np.array_equal(a, b) for a, b in zip(huge.run(*x), small.run(*x)))
            t = interleaved({"huge": lambda ins: huge.run(*ins), "small": lambda ins: small.run(*ins),
                             "ort": onnxruntime_runner(graph, threads)}, x, rounds=args.rounds)
            med = {k: statistics.median(v) for k, v in t.items()}
            row = {"ms": {k: v * 1e3 for k, v in med.items()},
                   "huge_vs_ort": statistics.median(paired_ratios(t["huge"], t["ort"])),
                   "small_vs_ort": statistics.median(paired_ratios(t["small"], t["ort"])),
                   "huge_vs_small": statistics.median(paired_ratios(t["huge"], t["small"])),
                   "huge_pages": list(huge.huge_pages)}
            out["models"].setdefault(name, {})[threads] = row
            print(f"{name:<14} {threads:>7} {med['huge'] * 1e3:9.2f} ms {med['small'] * 1e3:9.2f} ms "
                  f"{med['ort'] * 1e3:6.2f} ms {row['huge_vs_ort']:9.3f}x {row['small_vs_ort']:9.3f}x "
                  f"{row['huge_vs_small']:8.3f}x", flush=True)
    write_results("huge-pages", args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
