"""How repeatable measurements are: the ceiling for any cost model's ranking accuracy.

Re-measures a random sample of schedules from existing logs (same checks, same timing) and
reports how often the old and the new measurement order a pair the same way, and the median
relative change. A model cannot be expected to order pairs more consistently than two
measurements of the same code do.

    python -m bench.noise --logs 'logs/bench/search/*.random.*.jsonl' --per-workload 60
"""
from __future__ import annotations

import argparse
import glob
import random

import numpy as np

from bench.common import SEARCH_WORKLOADS, write_results
from tuner.cost_model.dataset import FeatureCache
from tuner.cost_model.metrics import pairwise_accuracy
from tuner.database import records
from tuner.measure.runner import CpuRunner


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", action="append", required=True, help="log paths or globs (repeatable)")
    ap.add_argument("--workloads", default=SEARCH_WORKLOADS)
    ap.add_argument("--per-workload", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    paths = sorted({p for pat in args.logs for p in glob.glob(pat)})
    recs = [r for p in paths for r in records.load(p, warn=False).records if r.ok]
    cache, rng, rows = FeatureCache(), random.Random(args.seed), []
    for name in args.workloads.split(","):
        mine = [r for r in recs if r.workload.name == name]
        by_target: dict = {}
        for r in mine:
            by_target.setdefault(r.target, []).append(r)
        for target, group in sorted(by_target.items()):
            sample = rng.sample(group, min(args.per_workload, len(group)))
            task = cache.task_for(sample[0])
            batch = [task.candidate(r.steps) for r in sample]
            with CpuRunner(task.target) as runner:
                new = np.asarray([res.latency for _, res in runner.measure(task, batch)])
            old = np.asarray([r.latency for r in sample])
            ok = np.isfinite(new)
            row = {"workload": name, "target": target, "schedules": int(ok.sum()),
                   "pairwise_agreement": pairwise_accuracy(-new[ok], -old[ok]),
                   "median_abs_change": float(np.median(np.abs(new[ok] / old[ok] - 1.0)))}
            rows.append(row)
            print(f"{name:<18} {target:<38} {row['schedules']:>4} schedules: pairs ordered alike "
                  f"{row['pairwise_agreement']:.3f}, median change {100 * row['median_abs_change']:.1f}%", flush=True)
    write_results("noise", args.out, {"args": vars(args), "logs": paths, "rows": rows})


if __name__ == "__main__":
    main()
