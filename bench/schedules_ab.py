"""Two schedule databases on one model, against ONNX Runtime, in one interleaved run.

    git show cf426de:schedules/cpu.jsonl > /tmp/before.jsonl      # e.g. before `distill --remeasure`
    python -m bench.schedules_ab resnet50 /tmp/before.jsonl tuner/schedules/cpu.jsonl --threads 1 --rounds 11

Each database is used alone (no shipped fallback). Every round times the two compiled models and
ONNX Runtime one after the other; prints medians and the median of each round's ratio to ONNX
Runtime (paired, steadier than a ratio of medians on a machine whose speed drifts); writes JSON
under bench/results/.
"""
from __future__ import annotations

import argparse
import statistics

from bench.common import write_results
from tuner.compare.peers import interleaved, onnxruntime_runner
from tuner.compiler import compile_model
from tuner.graph import load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("a", help="schedule database (JSONL) A")
    ap.add_argument("b", help="schedule database (JSONL) B")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    models = {db: compile_model(args.model, log=db, threads=args.threads, use_shipped=False) for db in (args.a, args.b)}
    x = models[args.a].random_inputs(1)
    runners = {db: (lambda ins, m=m: m.run(*ins)) for db, m in models.items()}
    runners["onnxruntime"] = onnxruntime_runner(load(args.model), args.threads, None)
    times = interleaved(runners, x, rounds=args.rounds)
    ort = times["onnxruntime"]
    rows = {}
    for name, v in times.items():
        rows[name] = {"median_s": statistics.median(v), "rounds_s": v,
                      "vs_onnxruntime_paired": statistics.median(p / q for p, q in zip(v, ort))}
        print(f"{name:<40} median {rows[name]['median_s'] * 1e3:8.2f} ms   paired vs ORT "
              f"{rows[name]['vs_onnxruntime_paired']:.3f}x")
    write_results("schedules_ab", args.out, {"model": args.model, "threads": args.threads, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
