"""How well a shipped pre-trained cost model orders another machine's measurements (no new measurements).

    python -m bench.transfer logs/bench/tune/resnet50.NCHW16c.1000.jsonl [--model cpu-avx512] [--min-records 12]

For every task of the logs with at least --min-records valid records, the pairwise ranking
accuracy of the model's predictions against the logged latencies (features computed for each
record's own target, as a tuning session computes them), beside a random model's. This is the
check behind pretrain.STAND_INS: on this project's AVX2 host the AVX-512 model scored 0.82
(median over ResNet-50's conv tasks) against 0.51 for random.

What a pick would get (search.predict): `pick` is the task's best logged latency over that of the
record the model ranks first (1.0: it ranked the fastest first), `default` the same for the
task's default schedule where the log holds it. Their geometric means over the tasks holding a
default say whether the model's first choice beats the default, offline, with no new timing; so
for a first choice taken only where the model expects it to beat the default by a margin.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from bench.common import write_results
from tuner.cost_model.dataset import FeatureCache, from_records
from tuner.cost_model.metrics import pairwise_accuracy
from tuner.cost_model.model import XGBModel, normalised_throughput
from tuner.cost_model.pretrain import PRETRAINED_DIR
from tuner.database import records


MARGINS = (1.1, 1.25, 1.5, 2.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--model", default="cpu-avx512", help="a shipped model's name or a model file")
    ap.add_argument("--min-records", type=int, default=12)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    path = args.model if args.model.endswith(".ubj") else str(PRETRAINED_DIR / f"{args.model}.ubj")
    recs = [r for p in args.logs for r in records.load(p, warn=False).records if r.ok]
    cache, default_steps = FeatureCache(), {}
    feats, lats, groups, defaults = [], [], [], []
    for r in recs:                   # from_records, one record at a time, to know which ran the default
        f, lat, g = from_records([r], cache)
        if f:
            feats += f
            lats += lat
            groups += g
            if r.task_key not in default_steps:
                space = cache.task_for(r).space
                default_steps[r.task_key] = space.steps(space.default())
            defaults.append(r.steps == default_steps[r.task_key])
    pred = np.asarray(XGBModel.pretrained_from(path).predict(feats))
    rng = np.random.default_rng(0)
    rows = []
    by: dict = {}
    for i, g in enumerate(groups):
        by.setdefault(g, []).append(i)
    for g, idx in by.items():
        if len(idx) < args.min_records:
            continue
        y = normalised_throughput([lats[i] for i in idx], [g] * len(idx))
        best = min(lats[i] for i in idx)
        first = max(idx, key=lambda i: pred[i])
        dflt = min((i for i in idx if defaults[i]), key=lambda i: lats[i], default=None)
        rows.append({"task": g, "records": len(idx), "model": pairwise_accuracy(pred[idx], y),
                     "random": pairwise_accuracy(rng.random(len(idx)), y), "pick": best / lats[first],
                     "default": best / lats[dflt] if dflt is not None else None,
                     "expected_gain": float(np.exp(pred[first] - pred[dflt])) if dflt is not None else None})
    if not rows:
        print(f"no task has {args.min_records} valid records in {', '.join(args.logs)}")
        return 1
    for r in rows:
        d = f"{r['default']:.3f}" if r["default"] is not None else "  -  "
        print(f"{r['records']:>5} records  model {r['model']:.3f}  random {r['random']:.3f}  "
              f"pick {r['pick']:.3f}  default {d}  {r['task']}")
    med = {k: statistics.median(r[k] for r in rows) for k in ("model", "random")}
    print(f"{len(rows)} tasks: median pairwise accuracy {med['model']:.3f} ({path}), random {med['random']:.3f}")
    both = [r for r in rows if r["default"] is not None]
    if both:
        med["pick_geomean"] = float(np.exp(np.mean([np.log(r["pick"]) for r in both])))
        med["default_geomean"] = float(np.exp(np.mean([np.log(r["default"]) for r in both])))
        med["pick_beats_default"] = sum(r["pick"] > r["default"] for r in both)
        print(f"{len(both)} tasks with a logged default: of their best, the model's first choice reaches "
              f"{med['pick_geomean']:.3f} (geomean), the default {med['default_geomean']:.3f}; "
              f"the first choice is faster in {med['pick_beats_default']}")
        for m in MARGINS:      # the first choice only where the model expects it to gain m over the default
            got = [r["pick"] if r["expected_gain"] > m else r["default"] for r in both]
            med[f"margin_{m}"] = float(np.exp(np.mean(np.log(got))))
            print(f"  first choice only where it is expected {m}x faster than the default: "
                  f"{med[f'margin_{m}']:.3f} ({sum(r['expected_gain'] > m for r in both)} tasks)")
    write_results("transfer", args.out, {"model": path, "logs": args.logs, "rows": rows, "median": med})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
