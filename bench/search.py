"""Trials to quality: search policies compared on real measurements, several seeds each.

For every workload, policy and seed a fresh tune runs (single thread, no default schedule seeded
in, so the policies' own search is compared) and its best-so-far GFLOPS per trial is kept. The
table reports, per workload: the best any run found, the trials each policy needs to reach 90% and
95% of it (median over seeds; a seed that never got there counts as more than the budget), the
ratio evolutionary / random, GFLOPS after 64 and 512 trials,
search overhead (time outside build and run) and candidates per minute. JSON goes to
bench/results/; the per-run logs stay under --log-dir for bench/cost_model.py.

Evolutionary search never sees the shipped pre-trained cost model here (it was trained on these
very workloads). With --pretrain-logs it starts from a model trained on those logs with the
benchmarked workload left out (leave-one-out transfer, logged as `evolutionary-pt`); without, it
starts from scratch.

    python -m bench.search --trials 256 --seeds 3
    python -m bench.search --pretrain-logs 'logs/bench/ops.*.jsonl' --pretrain-logs 'logs/bench/search/*.jsonl'
"""
from __future__ import annotations

import argparse
import glob
import math
import statistics
import time
from pathlib import Path

from bench.common import SEARCH_WORKLOADS, bench_workload, write_results
from tuner.analysis.report import task_report
from tuner.cost_model.dataset import FeatureCache
from tuner.cost_model.pretrain import pretrain
from tuner.target import parse_target
from tuner.tuning import tune


def curve(log: str, wl) -> list:
    """Best-so-far GFLOPS after each trial of `wl` (1 thread) in `log`."""
    rep = task_report(log, wl.key, str(parse_target("cpu", 1)))
    return rep.curve if rep else []


def leave_one_out_model(wl, logs: list, log_dir: str, cache: FeatureCache) -> str:
    """A cost model trained on `logs` without workload `wl` (built once, kept in log_dir). It is left
    out by name and by key: another model's layer of the same shape is the same task."""
    name = wl.name
    path = Path(log_dir) / f"pretrained-minus-{name}.ubj"
    if not path.exists():
        model, summary = pretrain(logs, {name, wl.key}, progress=False, cache=cache)
        model.save(str(path), about=summary)
        print(f"{name}: leave-one-out model from {summary['records']} records of "
              f"{len(summary['workloads'])} other workloads", flush=True)
    return str(path)


def _trials(v, budget: int) -> str:
    return "-" if v is None else f">{budget}" if math.isinf(v) else f"{v:.0f}"


def trials_to(c: list, level: float):
    return next((k + 1 for k, g in enumerate(c) if g >= level), None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=SEARCH_WORKLOADS)
    ap.add_argument("--policies", default="random,evolutionary,optuna:tpe")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--layout", default="NCHW16c")
    ap.add_argument("--log-dir", default="logs/bench/search")
    ap.add_argument("--out", default=None)
    ap.add_argument("--pretrain-logs", action="append", default=[],
                    help="logs (globs) for leave-one-out pre-trained cost models of evolutionary search")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    pretrain_logs = sorted({p for pat in args.pretrain_logs for p in glob.glob(pat)})   # before new logs appear
    cache = FeatureCache()
    runs = []
    for name in args.workloads.split(","):
        wl = bench_workload(name, args.layout)
        # seeds outside, policies inside: the policies compared take turns, so a busy spell of the
        # machine falls on all of them rather than on one policy's block of runs
        for seed, policy in ((sd, pol) for sd in range(args.seeds) for pol in policies):
            label, transfer = policy.replace(":", "-"), None
            if policy == "evolutionary":
                transfer = [leave_one_out_model(wl, pretrain_logs, args.log_dir, cache)] if pretrain_logs \
                    else ["none"]
                label += "-pt" if pretrain_logs else ""
            log = str(Path(args.log_dir) / f"{name}.{label}.s{seed}.jsonl")
            t0 = time.perf_counter()
            s = tune([wl], threads=1, trials=args.trials, log=log, policy=policy, seed=seed,
                     batch_size=args.batch_size, progress=False, start_from_default=False,
                     cost_model_from=transfer)
            c = curve(log, wl)
            runs.append({"workload": name, "policy": policy, "variant": label, "seed": seed, "curve": c, "log": log,
                         "new_trials": s.new, "seconds": time.perf_counter() - t0,
                         "search_overhead": s.search_overhead if s.new else None,
                         "codegen_fraction": s.codegen_fraction if s.new else None,
                         "candidates_per_minute": 60 * s.new / s.seconds if s.new and s.seconds else None})
            print(f"{name:<18} {policy:<13} seed {seed}: best {max(c, default=0):6.1f} GFLOPS "
                  f"after {len(c)} trials" + (f"; overhead {100 * s.search_overhead:.1f}% "
                                              f"(+{100 * s.codegen_fraction:.1f}% C generation)" if s.new else ""),
                  flush=True)
    rows = []
    for name in args.workloads.split(","):
        sel = [r for r in runs if r["workload"] == name]
        best = max(max(r["curve"], default=0) for r in sel)
        for policy in policies:
            pr = [r for r in sel if r["policy"] == policy]
            row = {"workload": name, "policy": policy, "best_overall_gflops": best}
            for frac in (0.9, 0.95):
                hits = [trials_to(r["curve"], frac * best) for r in pr]
                reached = [h for h in hits if h is not None]
                # a seed that never got there took more than its budget: the median still exists
                # while at least half the seeds got there (inf otherwise)
                row[f"trials_to_{int(frac * 100)}"] = statistics.median(
                    [h if h is not None else math.inf for h in hits]) if hits else None
                row[f"reached_{int(frac * 100)}"] = f"{len(reached)}/{len(hits)}"
            for t in (64, 256, 512):
                vals = [r["curve"][t - 1] for r in pr if len(r["curve"]) >= t]
                row[f"gflops_at_{t}"] = statistics.median(vals) if vals else None
            ov = [r["search_overhead"] for r in pr if r["search_overhead"] is not None]
            row["search_overhead"] = statistics.median(ov) if ov else None
            cg = [r["codegen_fraction"] for r in pr if r.get("codegen_fraction") is not None]
            row["codegen_fraction"] = statistics.median(cg) if cg else None
            cpm = [r["candidates_per_minute"] for r in pr if r["candidates_per_minute"]]
            row["candidates_per_minute"] = statistics.median(cpm) if cpm else None
            rows.append(row)
        rnd = next((r for r in rows if r["workload"] == name and r["policy"] == "random"), None)
        evo = next((r for r in rows if r["workload"] == name and r["policy"] == "evolutionary"), None)
        if rnd and evo and rnd["trials_to_95"] and evo["trials_to_95"] is not None:
            evo["ratio_trials_to_95_vs_random"] = evo["trials_to_95"] / rnd["trials_to_95"]   # 0 if random never
    print()
    head = ["workload", "policy", "best", "to90%", "to95%", "@64", "@256", "@512", "overhead", "cand/min"]
    print("  ".join(f"{h:>10}" for h in head))
    for r in rows:
        def f(v, fmt="{:.1f}"):
            return fmt.format(v) if v is not None else "-"
        print("  ".join(f"{x:>10}" for x in [r["workload"][:10], r["policy"][:10], f(r["best_overall_gflops"]),
                                            _trials(r["trials_to_90"], args.trials) + f"({r['reached_90']})",
                                            _trials(r["trials_to_95"], args.trials) + f"({r['reached_95']})",
                                            f(r["gflops_at_64"]), f(r["gflops_at_256"]), f(r["gflops_at_512"]),
                                            f(r["search_overhead"] and 100 * r["search_overhead"], "{:.1f}%"),
                                            f(r["candidates_per_minute"], "{:.0f}")]))
    write_results("search", args.out, {"args": vars(args), "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
