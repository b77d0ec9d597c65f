"""One runner alone in its process, back to back: tuner's default compile or ONNX Runtime, so that
neither's threads spin or sleep while the other runs (the interleaved benches run both in one
process, where each runtime's spinning threads slow the other's next turn on a small machine).

    python -m bench.alone tuner|onnxruntime MODEL THREADS [--runs N]   # the median of N runs
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

from tuner.compare.peers import onnxruntime_runner
from tuner.compiler import compile_model
from tuner.graph import load as load_graph


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runner", choices=["tuner", "onnxruntime"])
    ap.add_argument("model")
    ap.add_argument("threads", type=int)
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    ins = compile_model(args.model, threads=1, use_shipped=False, predict=False).random_inputs(seed=1)
    if args.runner == "tuner":
        m = compile_model(args.model, threads=args.threads)
        def fn():
            return m.run(*ins)
    else:
        r = onnxruntime_runner(load_graph(args.model), args.threads)
        def fn():
            return r(ins)
    for _ in range(20):
        fn()
    ts = []
    for _ in range(args.runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    print(f"{args.runner} {args.model} {args.threads} thread(s): median {statistics.median(ts) * 1e3:.3f} ms "
          f"over {args.runs} runs")


if __name__ == "__main__":
    main()
