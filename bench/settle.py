"""What the idle pause between interleaved turns changes: a compiled model and ONNX Runtime timed
in turn in one process, each turn started right after the other's or after SETTLE_S idle seconds.

    python -m bench.settle --models mobilenet_v2,resnet50,x.onnx [--threads 2] [--rounds 9]

Each model is compiled as `tuner compile` does (shipped records where they apply). Every round
times, in turn, ONNX Runtime then tuner with no pause, and ONNX Runtime then tuner with the pause
(measure.interleave.SETTLE_S) before each turn. Prints each way's medians and tuner / ONNX Runtime
paired per round; writes JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import statistics
import warnings

from bench.common import write_results
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios
from tuner.compiler import compile_model
from tuner.graph import load as load_graph
from tuner.measure.interleave import SETTLE_S

WAYS = {"no pause": 0.0, "settled": SETTLE_S}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet_v2,resnet50")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    result = {"threads": args.threads, "rounds": args.rounds, "settle_s": SETTLE_S, "rows": []}
    print(f"{'model':<24} {'way':<9} {'tuner ms':>9} {'ORT ms':>8} {'tuner/ORT':>10}")
    for name in args.models.split(","):
        m = compile_model(name, threads=args.threads)
        ort = onnxruntime_runner(load_graph(name), args.threads, name if name.endswith(".onnx") else None)
        ins = m.random_inputs(seed=1)
        runners = {"onnxruntime": ort, "tuner": lambda xs: m.run(*xs)}
        t = {(way, r): [] for way in WAYS for r in runners}
        for _ in range(args.rounds):
            for way, pause in WAYS.items():
                for r, (s,) in interleaved(runners, ins, rounds=1, settle=pause).items():
                    t[way, r].append(s)
        for way in WAYS:
            tu, o = t[way, "tuner"], t[way, "onnxruntime"]
            ratio = statistics.median(paired_ratios(tu, o))
            result["rows"].append({"model": name, "way": way, "tuner_ms": statistics.median(tu) * 1e3,
                                   "onnxruntime_ms": statistics.median(o) * 1e3, "tuner_vs_onnxruntime": ratio,
                                   "tuner_rounds_s": tu, "onnxruntime_rounds_s": o})
            print(f"{name:<24} {way:<9} {statistics.median(tu) * 1e3:9.2f} {statistics.median(o) * 1e3:8.2f} "
                  f"{ratio:9.3f}x", flush=True)
    write_results("settle", args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
