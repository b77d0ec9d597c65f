"""How well a shipped pre-trained cost model orders another machine's measurements (no new measurements).

    python -m bench.transfer logs/bench/tune/resnet50.NCHW16c.1000.jsonl [--model cpu-avx512] [--min-records 12]

For every task of the logs with at least --min-records valid records, the pairwise ranking
accuracy of the model's predictions against the logged latencies (features computed for each
record's own target, as a tuning session computes them), beside a random model's. This is the
check behind pretrain.STAND_INS: on this project's AVX2 host the AVX-512 model scored 0.82
(median over ResNet-50's conv tasks) against 0.51 for random.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--model", default="cpu-avx512", help="a shipped model's name or a model file")
    ap.add_argument("--min-records", type=int, default=12)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    path = args.model if args.model.endswith(".ubj") else str(PRETRAINED_DIR / f"{args.model}.ubj")
    recs = [r for p in args.logs for r in records.load(p, warn=False).records if r.ok]
    feats, lats, groups = from_records(recs, FeatureCache())
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
        rows.append({"task": g, "records": len(idx), "model": pairwise_accuracy(pred[idx], y),
                     "random": pairwise_accuracy(rng.random(len(idx)), y)})
    if not rows:
        print(f"no task has {args.min_records} valid records in {', '.join(args.logs)}")
        return 1
    for r in rows:
        print(f"{r['records']:>5} records  model {r['model']:.3f}  random {r['random']:.3f}  {r['task']}")
    med = {k: statistics.median(r[k] for r in rows) for k in ("model", "random")}
    print(f"{len(rows)} tasks: median pairwise accuracy {med['model']:.3f} ({path}), random {med['random']:.3f}")
    write_results("transfer", args.out, {"model": path, "logs": args.logs, "rows": rows, "median": med})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
