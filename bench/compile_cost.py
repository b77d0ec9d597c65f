"""What compiling and loading a model costs: wall seconds and peak memory, each in a fresh process.

    python -m bench.compile_cost model.onnx [--tree old=DIR] [--rounds 2] [--threads 1]

`tuner compile MODEL -o ARTIFACT` and then loading the artifact (`tuner.runtime.load`) run in child
processes, and each one's peak resident memory is read from its own rusage (os.wait4), so a big
model's weights count as many times as the compile holds them. `--tree NAME=DIR` runs the same with
another checkout's code (PYTHONPATH=DIR, e.g. a `git worktree` of an older commit), round by
round, so that both meet the same machine. Prints a table, writes JSON under bench/results/ with
the host.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import checkouts, commits, write_results


def _child(argv: list, tree: str) -> tuple:
    """(wall seconds, peak resident MiB) of one child process, which must succeed."""
    env = dict(os.environ, PYTHONPATH=tree)
    with tempfile.TemporaryFile() as err:         # a file, not a pipe: a child that says much never blocks on it
        t = time.perf_counter()
        p = subprocess.Popen(argv, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        code = os.waitstatus_to_exitcode(status)
        if code:
            err.seek(0)
            last = err.read().decode(errors="replace").strip().splitlines()[-1:]
            raise SystemExit(f"{' '.join(argv[:4])} ... failed (exit {code}): {last}")
    return wall, usage.ru_maxrss / 1024          # ru_maxrss is in KiB on Linux


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a built-in model or an ONNX file")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR: another checkout's code, timed beside this one")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    trees = checkouts(args.tree)
    model = os.path.abspath(args.model) if os.path.exists(args.model) else args.model
    rows = {name: {"compile_s": [], "compile_mib": [], "load_s": [], "load_mib": []} for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench-compile-cost-") as tmp:
        for r in range(args.rounds):
            for name, tree in trees.items():
                art = Path(tmp) / f"{name}-{r}"
                s, mib = _child([sys.executable, "-m", "tuner.cli", "compile", model, "--threads", str(args.threads),
                                 "-o", str(art)], tree)
                ls, lmib = _child([sys.executable, "-c", f"from tuner.runtime import load; load({str(art)!r})"], tree)
                row = rows[name]
                row["compile_s"].append(s)
                row["compile_mib"].append(mib)
                row["load_s"].append(ls)
                row["load_mib"].append(lmib)
                row["weights_mib"] = (art / "weights.bin").stat().st_size / 2**20
                print(f"round {r + 1}/{args.rounds} {name}: compile {s:.1f} s {mib:.0f} MiB, load {ls:.2f} s {lmib:.0f} MiB",
                      flush=True)
    print(f"\n{args.model} at {args.threads} thread(s), {args.rounds} round(s), medians")
    print(f"{'code':12} {'weights MiB':>12} {'compile s':>10} {'peak MiB':>9} {'load s':>7} {'peak MiB':>9}")
    for name, row in rows.items():
        med = {k: statistics.median(v) for k, v in row.items() if isinstance(v, list)}
        row.update({f"{k}_median": v for k, v in med.items()})
        print(f"{name:12} {row['weights_mib']:12.0f} {med['compile_s']:10.1f} {med['compile_mib']:9.0f} "
              f"{med['load_s']:7.2f} {med['load_mib']:9.0f}")
    write_results("compile_cost", args.out, {"model": args.model, "threads": args.threads, "rounds": args.rounds,
                                             "trees": trees, "commits": commits(trees), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
