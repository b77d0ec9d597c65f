"""The layout solver's run time on the built-in models (synthetic costs; no measurements).

    python -m bench.solver [--models resnet50,mobilenet_v2,googlenet] [--seeds 5]

For each model: the size of its layout problem in the four conv layouts (convolutions, tasks,
edges), the time to build it (graph passes once per layout), and per seed of random kernel and
transform costs the solver's time, the widest frontier table and whether the plan is exact.
A tune re-plans after every round, so this time is paid once a round.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from bench.common import write_results
from tuner.graph import load
from tuner.graph.layout_plan import model_layouts, solve
from tuner.te.layouts import CONV_LAYOUTS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2,googlenet")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':<13} {'convs':>5} {'tasks':>5} {'edges':>5} {'build s':>7} {'solve ms':>8} {'max':>8} "
          f"{'states':>6} {'exact':>5}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        graph = load(name)
        t0 = time.perf_counter()
        space = model_layouts(graph, tuple(CONV_LAYOUTS))
        build = time.perf_counter() - t0
        runs = []
        for seed in range(args.seeds):
            rng = random.Random(seed)
            cost: dict = {}
            plan = solve(space.problem(lambda wl: cost.setdefault(wl.key, rng.uniform(0.1, 2.0) * 1e-3)))
            runs.append(plan)
        secs = [p.seconds for p in runs]
        row = {"model": name, "convs": len(space.domains), "tasks": len(space.workloads()), "edges": len(space.pairs),
               "build_s": build, "solve_s_median": statistics.median(secs), "solve_s_max": max(secs),
               "states": max(p.states for p in runs), "exact": all(p.exact for p in runs)}
        rows.append(row)
        print(f"{name:<13} {row['convs']:>5} {row['tasks']:>5} {row['edges']:>5} {build:>7.2f} "
              f"{1e3 * row['solve_s_median']:>8.1f} {1e3 * row['solve_s_max']:>8.1f} {row['states']:>6} "
              f"{str(row['exact']):>5}")
    write_results("solver", args.out, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
