"""Several model-tune logs' plans of one model, compiled and timed in one interleaved run beside ONNX Runtime.

    python -m bench.plans --model resnet50 cold=logs/a.jsonl warm=logs/b.jsonl [--rounds 15]

Each NAME=LOG is compiled from that log alone (its newest layout plan and best records, no shipped
schedules) at 1 thread and the models are timed round by round in turn with ONNX Runtime, so that
tunes made at different times (whose own bench runs met different host speeds) are compared in the
same minutes. Prints each model's median, its ratio to ONNX Runtime (paired per round, and of
medians) and every pair's paired ratio; writes JSON under bench/results/. One process compiles
and loads each model once: on this host the same log's model timed 86.6 ms in one such run and
87.0 ms in the next, so a difference under about 2% between runs is noise.
"""
from __future__ import annotations

import argparse
import itertools
import statistics

from bench.common import write_results
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios
from tuner.compiler import compile_model
from tuner.graph import load as load_graph


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", metavar="NAME=LOG")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    logs = dict(a.split("=", 1) if "=" in a else (a, a) for a in args.logs)
    runners = {}
    for name, log in logs.items():
        m = compile_model(args.model, log=log, threads=1, use_shipped=False)
        runners[name] = lambda ins, m=m: m.run(*ins)
    inputs = m.random_inputs(seed=1)
    runners["onnxruntime"] = onnxruntime_runner(load_graph(args.model), 1)
    t = interleaved(runners, inputs, args.rounds, progress=lambda s: print(f"  {s}", flush=True))
    med = {k: statistics.median(v) for k, v in t.items()}
    ort = med["onnxruntime"]
    print(f"\n{args.model}, 1 thread, {args.rounds} rounds: ONNX Runtime {ort * 1e3:.2f} ms")
    rows = {}
    for name in logs:
        paired = statistics.median(paired_ratios(t[name], t["onnxruntime"]))
        rows[name] = {"log": logs[name], "median_s": med[name], "vs_onnxruntime_paired": paired,
                      "vs_onnxruntime": med[name] / ort}
        print(f"{name:<16} {med[name] * 1e3:8.2f} ms  vs ONNX Runtime {paired:.3f}x paired, {med[name] / ort:.3f}x of medians")
    pairs = {f"{a}/{b}": statistics.median(paired_ratios(t[a], t[b])) for a, b in itertools.combinations(logs, 2)}
    for k, v in pairs.items():
        print(f"{k:<33} {v:.3f}x paired")
    write_results("plans", args.out, {"model": args.model, "rounds": args.rounds, "plans": rows, "pairs": pairs,
                                      "rounds_s": t, "onnxruntime_s": ort})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
