"""One runner alone in its process, back to back: tuner's default compile or ONNX Runtime, so that
neither's threads spin or sleep while the other runs (the interleaved benches run both in one
process, where each runtime's spinning threads slow the other's next turn on a small machine).

    python -m bench.alone tuner|onnxruntime MODEL THREADS [--runs N]   # the median of N runs
"""
from __future__ import annotations

import argparse
import math
import warnings

from tuner.compare.peers import onnxruntime_runner, time_call
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
    m = compile_model(args.model, threads=args.threads)       # ONNX Runtime's runs take its inputs too
    ins = m.random_inputs(seed=1)
    fn = (lambda xs: m.run(*xs)) if args.runner == "tuner" else onnxruntime_runner(load_graph(args.model), args.threads)
    for _ in range(19):                 # warm-up: the 20th is time_call's own
        fn(ins)
    ms = 1e3 * time_call(fn, ins, min_seconds=math.inf, max_calls=args.runs)
    print(f"{args.runner} {args.model} {args.threads} thread(s): median {ms:.3f} ms over {args.runs} runs")


if __name__ == "__main__":
    main()
