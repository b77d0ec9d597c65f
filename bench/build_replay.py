"""A log's candidates built again, batch by batch, with an empty kernel cache: the builder's wall seconds.

    python -m bench.build_replay LOG.jsonl [--tree old=DIR] [--rounds 2] [--batch 8]

Each trial record of LOG (a tune's log, `tuner compile --quick`'s among them) becomes its candidate
again (its task's code for its steps); consecutive records of one task form a batch of at most
--batch, built by `measure.builder.build_batch` (one compiler call per core at a time). Each build
runs in a process of its own with an empty kernel cache, so every version of the builder meets the
same kernels and none finds them built. `--tree NAME=DIR` builds the same with another checkout's
code (PYTHONPATH=DIR, e.g. a `git worktree` of an older commit), round by round in turn. Nothing
else should run meanwhile: these are wall seconds. Prints the medians; writes JSON under
bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench.common import checkouts, commits, write_results

# run in the child with the tree's own code: this file need not exist there
CHILD = r"""
import json, sys, time
from tuner.database import records
from tuner.measure import builder
from tuner.ops import parse_spec
from tuner.target import parse_target
from tuner.task import Task
log, size = sys.argv[1], int(sys.argv[2])
tasks, batches, last = {}, [], None
for r in records.load(log, warn=False).records:
    if not r.trial:
        continue
    key = (r.workload.key, r.target)
    if key not in tasks:
        tasks[key] = Task(parse_spec(r.workload.spec, r.workload.layout), parse_target(r.target, check_host=False))
    if key != last or len(batches[-1]) >= size:
        batches.append([])
    batches[-1].append(tasks[key].candidate(r.steps))
    last = key
target = next(iter(tasks.values())).target
start = time.perf_counter()
failed = sum(b.error is not None for batch in batches for b in builder.build_batch(
    [(c.func_name, c.source) for c in batch], target, openmp=any(c.openmp for c in batch)))
print(json.dumps({"seconds": time.perf_counter() - start, "candidates": sum(map(len, batches)),
                  "batches": len(batches), "failed": failed}))
"""


def _child(log: str, batch: int, tree: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-build-replay-") as cache:
        env = dict(os.environ, PYTHONPATH=tree, TUNER_CACHE_DIR=cache)
        p = subprocess.run([sys.executable, "-c", CHILD, log, str(batch)], env=env, cwd=tree, capture_output=True,
                           text=True)
    if p.returncode:
        raise SystemExit(f"building in {tree} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="a tune's log (JSONL)")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR: another checkout's code, timed beside this one")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="candidates of one task built together, at most")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    trees = checkouts(args.tree)
    log = os.path.abspath(args.log)
    rows = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, tree in trees.items():
            rows[name].append(_child(log, args.batch, tree))
            got = rows[name][-1]
            print(f"round {r + 1}/{args.rounds} {name}: {got['seconds']:.1f} s for {got['candidates']} candidates "
                  f"in {got['batches']} batches ({got['failed']} failed)", flush=True)
    print(f"\n{args.log}: build seconds, median of {args.rounds} round(s)")
    summary = {name: statistics.median(x["seconds"] for x in runs) for name, runs in rows.items()}
    for name, s in summary.items():
        print(f"{name:12} {s:8.1f} s")
    write_results("build_replay", args.out, {"log": args.log, "batch": args.batch, "rounds": args.rounds,
                                             "trees": trees, "commits": commits(trees), "rows": rows,
                                             "median_s": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
