"""A task's default schedule against the same default with decisions replaced, each kernel alone.

    python -m bench.decision_ab --target "cpu -isa=avx2" --threads 1 \\
        --variant root='{"pad": "root"}' --variant tile='{"pad": "tile"}' \\
        "conv2d:N=1,C=32,H=112,W=112,K=64,R=3,S=3,stride=2,pad=1,bias=1,relu=1 [NCHW16c]" ...

A variant replaces top-level decisions of the default (`SearchSpace.default()`); a string given for
`pad` places every pad so, a list given for `tileN` replaces the tile of output axis N. With
`--baseline DIR` (a checkout, e.g. `git worktree add /tmp/old HEAD~1`) the variant `baseline` is
the default that checkout's rules give the same workload and target, so a change to the default
rules is timed against the rules before it (the first variant after `default`). Every round
times all variants of a workload in one runner (CpuRunner: the reference checked first), in turn,
the order reversed each round; prints each variant's median and the median of its per-round ratio
to the first variant's, with the accumulators its code keeps in the stack (toolchain.spills).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys

from bench.common import write_results
from tuner.compiler.executor import kernel_part
from tuner.measure.runner import CpuRunner, RunConfig
from tuner.ops.workload import parse_spec
from tuner.target import parse_target
from tuner.task import Task
from tuner.toolchain.cc import compile_object
from tuner.toolchain.spills import spilled_accumulators


def patched(default: dict, patch: dict, pads: list) -> dict:
    dec = copy.deepcopy(default)
    for key, value in patch.items():
        if key == "pad" and isinstance(value, str):
            dec["pad"] = {p: value for p in pads}
        elif key.startswith("tile") and key[4:].isdigit():
            dec["tile"][int(key[4:])] = value
        else:
            dec[key] = value
    return dec


def baseline_defaults(tree: str, workloads: list, target: str, threads: int) -> list:
    """The default decisions the checkout at `tree` gives each workload, computed in a process
    that imports that checkout."""
    code = ("import json, sys\nfrom tuner.ops.workload import parse_spec\nfrom tuner.space.sketch import SearchSpace\n"
            "from tuner.target import parse_target\nt = parse_target(sys.argv[1], int(sys.argv[2]))\n"
            "print(json.dumps([SearchSpace(parse_spec(w.partition(' [')[0], w.partition(' [')[2].rstrip(']') or "
            "'NCHW16c'), t).default() for w in sys.argv[3:]]))")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    done = subprocess.run([sys.executable, "-c", code, target, str(threads), *workloads], env=env, cwd=os.path.abspath(tree),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def spills(cand, target) -> int | None:
    """Spilled accumulators of the candidate's kernel, built as a model's library builds it."""
    source, flags = kernel_part(cand.source, cand.openmp)
    obj, err = compile_object(source, list(target.cflags) + flags)
    return None if err else spilled_accumulators(obj)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="+", help='"SPEC [LAYOUT]", e.g. "conv2d:C=64,H=56,W=56,K=64,R=3,S=3 [NCHW16c]"')
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON: decisions replaced in the default")
    ap.add_argument("--baseline", help="a checkout whose default rules give the variant `baseline`")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    variants = {"default": {}}
    for v in args.variant:
        name, _, patch = v.partition("=")
        variants[name] = json.loads(patch)
    target = parse_target(args.target, args.threads)
    before = baseline_defaults(args.baseline, args.workloads, args.target, args.threads) if args.baseline else None
    rows = []
    with CpuRunner(target, RunConfig()) as runner:
        for i, text in enumerate(args.workloads):
            spec, _, layout = text.partition(" [")
            task = Task(parse_spec(spec, layout.rstrip("]") or "NCHW16c"), target)
            space = task.space
            base = space.default()
            decs = {n: patched(base, p, space.pads) for n, p in variants.items()}
            if before is not None:
                decs = {"default": base, "baseline": before[i], **{n: d for n, d in decs.items() if n != "default"}}
            cands = {n: task.applied(space.steps(d)) for n, d in decs.items()}
            names = list(cands)
            times: dict = {n: [] for n in names}
            for r in range(args.rounds):
                order = names if r % 2 == 0 else names[::-1]
                for n, (_, res) in zip(order, runner.measure(task, [cands[n] for n in order])):
                    times[n].append(min(res.costs) if res.ok else float("nan"))
            first = names[1] if len(names) > 1 else names[0]
            for n in names:
                ratio = statistics.median(a / b for a, b in zip(times[n], times[first]))
                rows.append({"workload": text, "variant": n, "median_ms": 1e3 * statistics.median(times[n]),
                             f"vs_{first}_paired": ratio, "spilled": spills(cands[n], target),
                             "decision": {k: decs[n][k] for k in ("pad", "tile", "reduce", "order") if k in decs[n]}})
                print(f"{spec[:72]:72s} {n:10s} {rows[-1]['median_ms']:8.3f} ms  {ratio:.3f}x {first}  "
                      f"spilled {rows[-1]['spilled']}", flush=True)
    write_results("decision_ab", args.out, {"target": str(target), "threads": args.threads, "rounds": args.rounds,
                                            "variants": variants, "baseline": args.baseline, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
