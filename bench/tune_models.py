"""Tune every task of the built-in models, for the shipped schedule database (tuner/schedules/).

    python -m bench.tune_models --models resnet50,mobilenet_v2,resnet18 --threads 1 \
        --trials-per-task 48 --log logs/models-t1.jsonl
    tuner distill logs/models-t1.jsonl -o tuner/schedules/cpu.jsonl --remeasure 6   # re-time each task's 6
                                                   # fastest, keep the best now, merge into the shipped file

Tasks are extracted as `tuner compile` sees them (default layout NCHW16c, fused bias / residual /
ReLU / ReLU6 epilogues); a task shared by several models is tuned once, weighted by how often it
occurs. Resumable: the same command continues from its log.
"""
from __future__ import annotations

import argparse

from tuner.compiler import DEFAULT_LAYOUT
from tuner.graph import load
from tuner.graph.passes import optimize
from tuner.search.scheduler import SCHEDULERS
from tuner.target import parse_target
from tuner.tuning import tune


def model_tasks(models: list, layout: str = DEFAULT_LAYOUT) -> list:
    """[(Workload, occurrences)] over `models` as a compile for this host pads them, shared tasks merged."""
    found: dict = {}
    lanes = parse_target("cpu").lanes
    for name in models:
        for t in optimize(load(name), layout=layout, lanes=lanes).meta["tasks"]:
            if t.tunable:
                wl, n = found.get(t.workload.key, (t.workload, 0))
                found[t.workload.key] = (wl, n + t.weight)
    return list(found.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2,resnet18")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trials-per-task", type=int, default=48)
    ap.add_argument("--log", required=True)
    ap.add_argument("--search", default="evolutionary")
    ap.add_argument("--time-limit", type=float)
    ap.add_argument("--batch-size", type=int, default=32, help="candidates per round of a task")
    ap.add_argument("--scheduler", default="round-robin", choices=sorted(SCHEDULERS),
                    help="round-robin: every task alike; gradient: where the weighted model latency falls fastest")
    args = ap.parse_args(argv)
    tasks = model_tasks([m.strip() for m in args.models.split(",") if m.strip()])
    print(f"{len(tasks)} tasks, {args.trials_per_task * len(tasks)} trials, {args.threads} thread(s)")
    session = tune(tasks, threads=args.threads, trials=args.trials_per_task * len(tasks), log=args.log,
                   policy=args.search, time_limit=args.time_limit, scheduler=args.scheduler, progress=False,
                   batch_size=args.batch_size)
    for s in session.tasks:
        print(f"{s.workload.label}: {s.trials} trials, best {s.best_latency * 1e3:.4f} ms" if s.best
              else f"{s.workload.label}: no valid candidate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
