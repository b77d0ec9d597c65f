"""Compiled artifacts of one model, timed in one interleaved run beside ONNX Runtime.

    python -m bench.artifacts --model resnet50 old=build/old new=build/new [--rounds 15] [--threads 1,2]

Each NAME=DIR is an artifact (`tuner compile -o DIR`, by any version of tuner whose artifacts this
one loads); all must be of --model. They are timed round by round in turn with ONNX Runtime at each
thread count, so artifacts built by two versions of the compiler (or from two logs) are compared in
the same minutes. Prints each one's median, its ratio to ONNX Runtime (paired per round) and every
pair's paired ratio, and whether two artifacts hold the same library (the same generated C: the
library's name is a hash of its source); writes JSON under bench/results/.

--fresh: every turn in a process of its own (a new load of the artifact, or a new ONNX Runtime
session), in the same rotated order. On a shared host a process's 2-thread timings can sit 1.2-1.3x
off another's (one artifact: 37-48 ms from process to process): one process per turn makes each
process's state one sample among many, not the run's verdict.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import time

from bench.common import write_results
from bench.cores import Placements, placed
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios, time_call
from tuner.measure.interleave import SETTLE_S
from tuner.graph import load as load_graph
from tuner.graph.ir import graph_digest
from tuner.runtime import load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs="*", metavar="NAME=DIR")
    ap.add_argument("--model", default="resnet50", help="a built-in model or an ONNX file (ONNX Runtime runs the file)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", default="1", help="ONNX Runtime's thread counts, e.g. 1,2 (the artifacts run "
                                                   "with the threads they were compiled for)")
    ap.add_argument("--other-import", action="store_true",
                    help="accept artifacts of another import of --model (a change to the ONNX importer)")
    ap.add_argument("--fresh", action="store_true", help="every turn in a new process (see above)")
    ap.add_argument("--turn", nargs=3, metavar=("WHERE", "THREADS", "INPUTS"), help=argparse.SUPPRESS)   # a --fresh turn
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.turn:
        return _turn(args.model, *args.turn)
    if not args.artifacts:
        ap.error("name at least one artifact: NAME=DIR")
    dirs = dict(a.split("=", 1) if "=" in a else (a, a) for a in args.artifacts)
    graph = load_graph(args.model)
    models = {name: load(d) for name, d in dirs.items()}
    for name, m in models.items():
        if m.meta["model_hash"] != graph_digest(graph) and not args.other_import:
            raise SystemExit(f"{name} ({dirs[name]}) is not an artifact of {args.model} as this version imports it "
                             "(--other-import: compare it anyway)")
    libraries = {name: m.meta["library"] for name, m in models.items()}
    inputs = next(iter(models.values())).random_inputs(seed=1)
    result = {"model": args.model, "rounds": args.rounds, "artifacts": dirs, "libraries": libraries, "rows": [],
              "pairs": [], "rounds_s": {}, "rounds_core_ns": {}}
    for threads in (int(t) for t in args.threads.split(",")):
        runners = {name: (lambda ins, m=m: m.run(*ins)) for name, m in models.items()}
        runners["onnxruntime"] = onnxruntime_runner(graph, threads, args.model if args.model.endswith(".onnx") else None)
        place = Placements()
        progress = place.after(lambda s: print(f"  {s}", flush=True))
        t = (fresh_interleaved({**dirs, "onnxruntime": "onnxruntime"}, args.model, threads, args.rounds, progress) if args.fresh
             else interleaved(runners, inputs, args.rounds, progress=progress))
        med = {k: statistics.median(v) for k, v in t.items()}
        ort = med["onnxruntime"]
        print(f"\n{args.model}, ONNX Runtime at {threads} thread(s), {args.rounds} rounds: {ort * 1e3:.2f} ms")
        for name in models:
            ratios = paired_ratios(t[name], t["onnxruntime"])
            paired, by = statistics.median(ratios), place.split(ratios)
            result["rows"].append({"ort_threads": threads, "artifact": name, "target": models[name].meta["target"],
                                   "median_ms": med[name] * 1e3, "onnxruntime_ms": ort * 1e3,
                                   "vs_onnxruntime_paired": paired, **({"by_placement": by} if by else {})})
            print(f"{name:<12} {med[name] * 1e3:8.2f} ms  vs ONNX Runtime {paired:.3f}x paired  "
                  f"({models[name].meta['target']}){placed(by)}")
        for a, b in itertools.combinations(models, 2):
            ratios = paired_ratios(t[a], t[b])
            v, by, same = statistics.median(ratios), place.split(ratios), libraries[a] == libraries[b]
            print(f"{a + '/' + b:<25} {v:.3f}x paired{' (the same library)' if same else ''}{placed(by)}")
            result["pairs"].append({"ort_threads": threads, "pair": f"{a}/{b}", "paired_ratio": v, "same_library": same,
                                    **({"by_placement": by} if by else {})})
        result["rounds_s"][threads] = t
        result["rounds_core_ns"][threads] = place.samples
    result["fresh"] = args.fresh
    write_results("artifacts", args.out, result)
    return 0


def fresh_interleaved(dirs: dict, model: str, threads: int, rounds: int, progress) -> dict:
    """`interleaved`'s {name: [seconds per round]}, each turn a new process (`_turn`)."""
    out, names = {name: [] for name in dirs}, list(dirs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(SETTLE_S)
            cmd = [sys.executable, "-m", "bench.artifacts", "--model", model, "--turn", dirs[name], str(threads),
                   next(iter(dirs.values()))]
            out[name].append(float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[-1]))
        progress(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {statistics.median(v) * 1e3:.2f} ms" for n, v in out.items()))
    return out


def _turn(model: str, where: str, threads: str, inputs_dir: str) -> int:
    """One --fresh turn: an artifact, or ONNX Runtime at `threads`, loaded, warmed up and timed on
    the inputs that artifact `inputs_dir` draws (as in one process); prints seconds per call."""
    if where == "onnxruntime":
        inputs = load(inputs_dir).random_inputs(seed=1)
        fn = onnxruntime_runner(load_graph(model), int(threads), model if model.endswith(".onnx") else None)
    else:
        m = load(where)
        inputs, fn = m.random_inputs(seed=1), (lambda ins: m.run(*ins))   # the same draw: one model's shapes
    for _ in range(4):
        fn(inputs)
    print(time_call(fn, inputs, min_seconds=0.5))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
