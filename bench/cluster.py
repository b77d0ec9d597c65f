"""Measurements per minute on a local Dask cluster of 1 and 2 measuring workers, and of 1
measuring worker with 1 build worker (local:1+1), against a plain local tune, interleaved round
by round, on one workload.

Each run tunes the workload from an empty log with the same policy and seed, so every variant
measures the same candidates and the best latency after N trials compares how they time them.
Each run builds into a kernel cache of its own (TUNER_CACHE_DIR), so none reuses another's
compiled candidates, and each cluster is started before its timed tune and stopped after it,
so no worker holds a core claim into the next run. For the cluster variants the worker idle
share is 1 - (seconds the workers spent on jobs) / (workers x the tune's wall time), for the
measuring workers and (local:1+1) the build worker. Cluster tunes propose one batch ahead (the
default), so with the evolutionary search they measure other candidates than the local tune.

    python -m bench.cluster                                   # r50.s1.conv1x1a, 64 trials, 3 rounds
    python -m bench.cluster --workload r50.s1.conv3x3 --trials 96 --rounds 2
    python -m bench.cluster --min-repeat-ms 100 --trials 32 --rounds 2   # timing-bound, as with long timings
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import write_results
from tuner.measure.cluster import ClusterRunner, idle_share, start_local
from tuner.measure.runner import RunConfig
from tuner.ops import resolve
from tuner.target import parse_target
from tuner.tuning import tune

VARIANTS = ("local", "local:1", "local:2", "local:1+1")


def one_run(wl, target, variant: str, trials: int, batch: int, policy: str, seed: int, config: RunConfig) -> dict:
    with tempfile.TemporaryDirectory() as d:
        log, cache = str(Path(d) / "run.jsonl"), str(Path(d) / "cache")
        os.environ["TUNER_CACHE_DIR"] = cache
        cluster = runner = None
        if variant != "local":
            cluster = start_local(variant, target, env={"TUNER_CACHE_DIR": cache})
            runner = ClusterRunner(cluster.scheduler_address, target, config, progress=lambda msg: None)
        try:
            t0, cpu0 = time.perf_counter(), time.process_time()
            s = tune([wl], target=target, trials=trials, log=log, policy=policy, seed=seed, batch_size=batch,
                     progress=False, runner=runner, run_config=config)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            row = {"new": s.new, "seconds": wall, "per_minute": 60.0 * s.new / wall,
                   "best_ms": s.tasks[0].best_latency * 1e3 if s.tasks[0].best else None}
            if runner is not None:
                n, b = (len(w) for w in runner.workers())
                row["workers"], row["build_workers"] = n, b
                row["idle_share"] = idle_share(runner.busy_s, n, wall)
                # what one driver could feed: the driver's CPU per candidate (proposing, C generation,
                # logging, the Dask client) against a measuring worker's seconds per candidate
                row["driver_cpu_ms_per_candidate"] = 1e3 * cpu / s.new
                row["worker_ms_per_candidate"] = 1e3 * runner.busy_s / s.new
                row["workers_one_driver_feeds"] = runner.busy_s / cpu
                if b:
                    row["build_idle_share"] = idle_share(runner.build_busy_s, b, wall)
        finally:
            if runner is not None:
                runner.close()
                cluster.close()
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="r50.s1.conv1x1a")
    ap.add_argument("--layout", default="NCHW8c")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--search", default="random")
    ap.add_argument("--min-repeat-ms", type=float, default=RunConfig.min_repeat_ms,
                    help="as tuner tune's: a larger one makes timing, not compiling, the larger part")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    target = parse_target("cpu", threads=1)
    wl = resolve(args.workload, args.layout)
    runs = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS:
            row = one_run(wl, target, v, args.trials, args.batch_size, args.search, r,
                          RunConfig(min_repeat_ms=args.min_repeat_ms))
            runs[v].append(row)
            idle = f", workers idle {row['idle_share']:.0%}" if "idle_share" in row else ""
            idle += f", build worker idle {row['build_idle_share']:.0%}" if "build_idle_share" in row else ""
            print(f"round {r} {v:<8} {row['new']} measured in {row['seconds']:.1f} s = "
                  f"{row['per_minute']:.0f}/min, best {row['best_ms']:.4f} ms{idle}", flush=True)
    base = statistics.median(x["per_minute"] for x in runs["local"])
    summary = {}
    for v, rows in runs.items():
        med = statistics.median(x["per_minute"] for x in rows)
        summary[v] = {"per_minute_median": med, "vs_local": med / base,
                      "best_ms_median": statistics.median(x["best_ms"] for x in rows),
                      "idle_share_median": (statistics.median(x["idle_share"] for x in rows)
                                            if "idle_share" in rows[0] else None),
                      "build_idle_share_median": (statistics.median(x["build_idle_share"] for x in rows)
                                                  if "build_idle_share" in rows[0] else None)}
        if "workers" in rows[0]:
            for k in ("driver_cpu_ms_per_candidate", "worker_ms_per_candidate", "workers_one_driver_feeds"):
                summary[v][k + "_median"] = statistics.median(x[k] for x in rows)
    print()
    print(f"{'variant':<9} {'per min':>8} {'vs local':>9} {'best ms':>9} {'idle':>6} {'build idle':>10}")
    for v, s in summary.items():
        idle, bidle = ((f"{s[k]:.0%}" if s[k] is not None else "-") for k in ("idle_share_median",
                                                                              "build_idle_share_median"))
        print(f"{v:<9} {s['per_minute_median']:8.0f} {s['vs_local']:8.2f}x {s['best_ms_median']:9.4f} {idle:>6} "
              f"{bidle:>10}")
    print()
    print(f"{'variant':<9} {'driver CPU ms/cand':>18} {'worker ms/cand':>15} {'workers one driver feeds':>25}")
    for v, s in summary.items():
        if "workers_one_driver_feeds_median" in s:
            print(f"{v:<9} {s['driver_cpu_ms_per_candidate_median']:18.1f} {s['worker_ms_per_candidate_median']:15.1f} "
                  f"{s['workers_one_driver_feeds_median']:25.1f}")
    write_results("cluster", args.out, {"workload": wl.spec, "layout": wl.layout, "target": str(target),
                                        "args": vars(args), "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
