"""Warm against cold weights: each weighted task's best kernel in a log, timed as the search times it
(the same inputs call after call, so the weights stay in cache) and with its weights and bias
evicted before every call (RunConfig.cold_weights, what model_tuning.cold_prices does for a plan).

    python -m bench.cold LOG [--ops conv2d,winograd_gemm,dense] [--rounds 5]

The two are interleaved round by round on the same core; prints per task the medians and their
ratio with the weight bytes, largest ratio first, and writes JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

from bench.common import write_results
from tuner.database import records
from tuner.measure.runner import CpuRunner, RunConfig
from tuner.ops import parse_spec
from tuner.target import parse_target
from tuner.task import Task


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--ops", default="conv2d,winograd_gemm,dense")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    c = records.load(args.log)
    ops = set(args.ops.split(","))
    tasks: dict = {}
    for r in c.records:
        if r.ok and r.workload.spec.partition(":")[0] in ops:
            tasks.setdefault((r.workload.key, r.target), r.workload)
    rows = []
    warm_cfg = RunConfig(repeat=3)
    cold_cfg = dataclasses.replace(warm_cfg, cold_weights=True)
    for (key, target), ref in tasks.items():
        rec = records.best_of(c.applicable(key, target))
        if rec is None:
            continue
        wl = parse_spec(ref.spec, ref.layout)
        task = Task(wl, parse_target(target))
        cand = task.candidate(rec.steps)
        times: dict = {"warm": [], "cold": []}
        with CpuRunner(task.target, warm_cfg) as warm, CpuRunner(task.target, cold_cfg) as cold:
            for _ in range(args.rounds):
                for kind, runner in (("warm", warm), ("cold", cold)):
                    for _, res in runner.measure(task, [cand]):
                        if res.ok:
                            times[kind].append(res.latency)
        if not times["warm"] or not times["cold"]:
            continue
        w, k = statistics.median(times["warm"]), statistics.median(times["cold"])
        weight = sum(a.nbytes for i, a in enumerate(task.data[0]) if i in wl.constant_inputs)
        rows.append({"spec": ref.spec, "layout": ref.layout, "warm_s": w, "cold_s": k, "ratio": k / w,
                     "weight_bytes": weight, "logged_s": rec.latency})
        print(f"{k / w:5.2f}x  warm {w * 1e3:7.3f} ms  cold {k * 1e3:7.3f} ms  weights {weight / 2**20:6.2f} MiB  "
              f"{ref.layout:8} {ref.spec}", flush=True)
    if not rows:
        print(f"no task of {args.log} with ops {args.ops} has a best record that replays")
        return 1
    print(f"\n{'cold/warm':>9} {'warm ms':>8} {'cold ms':>8} {'MiB':>6}  task")
    for r in sorted(rows, key=lambda r: -r["ratio"]):
        print(f"{r['ratio']:>8.2f}x {r['warm_s'] * 1e3:>8.3f} {r['cold_s'] * 1e3:>8.3f} "
              f"{r['weight_bytes'] / 2**20:>6.2f}  {r['spec']} [{r['layout']}]")
    write_results("cold", args.out, {"log": args.log, "rounds": args.rounds, "tasks": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
