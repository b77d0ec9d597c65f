"""Two artifacts of one plan, every step timed where it runs, interleaved: what a change did to its steps.

    python -m bench.steps_ab old=build/old new=build/new [--rounds 7] [--runs 10]

Both artifacts must hold the same steps (one model, one layout plan; `tuner compile` by two versions
of tuner, or from two logs). Each round profiles each artifact's whole runs in turn
(`CompiledModel.profile`: every step timed in the model, its caches as its producers left them).
Steps whose code differs (their schedules, or the C a version generates from them), or that write
over an input in one only, are the changed ones: their
summed time is paired round by round, and so is the unchanged steps', which is the host's drift
between the two for the same code. Prints the changed steps one by one, both sums and the whole
runs; writes JSON under bench/results/.
"""
from __future__ import annotations

import argparse

import numpy as np

from bench.common import write_results
from tuner.measure.interleave import interleaved_profiles
from tuner.runtime import load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs=2, metavar="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=10, help="whole runs of each artifact per round")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    (na, da), (nb, db) = (a.split("=", 1) if "=" in a else (a, a) for a in args.artifacts)
    a, b = load(da), load(db)
    if [s.summary for s in a.steps] != [s.summary for s in b.steps] or a.meta["model_hash"] != b.meta["model_hash"]:
        raise SystemExit(f"{da} and {db} are not one model's plan: compare them whole with bench.artifacts")
    steps, whole = interleaved_profiles({na: a, nb: b}, a.random_inputs(seed=1), args.rounds, args.runs,
                                        progress=lambda msg: print(f"  {msg}", flush=True))
    ta, tb = steps[na], steps[nb]
    changed = [i for i, (x, y) in enumerate(zip(a.steps, b.steps))
               if (x.steps, x.inplace, x.code_hash) != (y.steps, y.inplace, y.code_hash)]
    same = [i for i in range(len(a.steps)) if i not in changed]
    if not changed:
        raise SystemExit(f"{da} and {db} run the same code, in place in the same steps")
    med = lambda v: float(np.median(v))        # noqa: E731
    ratio = lambda idx: med(tb[:, idx].sum(1) / ta[:, idx].sum(1)) if idx else float("nan")   # noqa: E731
    rows = []
    print(f"\n{'step':>4} {'':60} {na + ' ms':>10} {nb + ' ms':>10} {nb + '/' + na:>9}")
    for i in changed:
        rows.append({"step": i, "workload": str(a.steps[i].workload), "a_ms": med(ta[:, i]) * 1e3,
                     "b_ms": med(tb[:, i]) * 1e3, "paired": med(tb[:, i] / ta[:, i])})
        print(f"{i:4d} {str(a.steps[i].workload)[:60]:60} {rows[-1]['a_ms']:10.3f} {rows[-1]['b_ms']:10.3f} "
              f"{rows[-1]['paired']:8.3f}x")
    summary = {"changed_steps": len(changed), "changed_a_ms": med(ta[:, changed].sum(1)) * 1e3,
               "changed_b_ms": med(tb[:, changed].sum(1)) * 1e3, "changed_paired": ratio(changed),
               "unchanged_steps": len(same), "unchanged_paired": ratio(same),
               "whole_a_ms": med(whole[na]) * 1e3, "whole_b_ms": med(whole[nb]) * 1e3,
               "whole_paired": med(np.array(whole[nb]) / np.array(whole[na]))}
    print(f"\nchanged steps ({len(changed)}): {summary['changed_a_ms']:.2f} -> {summary['changed_b_ms']:.2f} ms, "
          f"{nb}/{na} {summary['changed_paired']:.3f}x paired")
    print(f"unchanged steps ({len(same)}): {nb}/{na} {summary['unchanged_paired']:.3f}x paired (the host's drift)")
    print(f"whole runs: {summary['whole_a_ms']:.2f} -> {summary['whole_b_ms']:.2f} ms, "
          f"{nb}/{na} {summary['whole_paired']:.3f}x paired")
    write_results("steps_ab", args.out, {"artifacts": {na: da, nb: db}, "model": a.meta["model"],
                                         "target": a.meta["target"], "rounds": args.rounds, "runs": args.runs,
                                         "rows": rows, **summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
