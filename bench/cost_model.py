"""Cost-model quality from existing logs (no new measurements).

For each workload: train on the first K of its records (K = 64, 128, 256), test on the rest:
pairwise ranking accuracy, top-5 recall and TenSet's top-1 / top-5 scores (best latency over the
latency of the model's best pick among its top k), for both XGBoost objectives and a random model.
Transfer: train only on the other workloads' records and test on all of this one's.

    python -m bench.cost_model --logs 'logs/bench/search/*.random.*.jsonl' --logs logs/bench/ops.NCHW16c.t1.jsonl
"""
from __future__ import annotations

import argparse
import glob
import json
import time
from pathlib import Path


from tuner import records
from tuner.cost_model.dataset import FeatureCache, from_records
from tuner.cost_model.metrics import pairwise_accuracy, top_k_recall, top_k_score
from tuner.cost_model.model import RandomModel, XGBModel, normalised_throughput

TARGETS = "r50.s1.conv3x3,r50.s1.conv1x1c,r50.s4.conv3x3,dense.2048x1000"


def evaluate(model, train, test) -> dict:
    f_tr, l_tr, g_tr = train
    f_te, l_te, g_te = test
    model.fit(f_tr, normalised_throughput(l_tr, g_tr), g_tr)
    pred = model.predict(f_te)
    y = normalised_throughput(l_te, g_te)
    return {"pairwise_accuracy": pairwise_accuracy(pred, y), "top5_recall": top_k_recall(pred, y, 5),
            "top1_score": top_k_score(pred, l_te, 1), "top5_score": top_k_score(pred, l_te, 5)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", action="append", required=True, help="log paths or globs (repeatable)")
    ap.add_argument("--workloads", default=TARGETS)
    ap.add_argument("--sizes", default="64,128,256")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    paths = sorted({p for pat in args.logs for p in glob.glob(pat)})
    recs = [r for p in paths for r in records.load(p, warn=False).records
            if r["error"] != "NOT_IN_LOG" and r.get("policy") == "random"]
    cache = FeatureCache()
    t0 = time.perf_counter()
    feats, lats, groups = from_records(recs, cache)
    names = [r["workload"].get("name") or r["workload"]["spec"] for r in recs]
    print(f"{len(feats)} random-search records from {len(paths)} logs featurised in {time.perf_counter() - t0:.1f} s")
    by_name: dict = {}
    for k, n in enumerate(names):
        by_name.setdefault(n, []).append(k)
    rows = []
    models = {"xgb pack-sum": lambda: XGBModel("pack-sum", 0), "xgb rank": lambda: XGBModel("rank", 0),
              "random": lambda: RandomModel(0)}

    def subset(idx):
        return [feats[i] for i in idx], [lats[i] for i in idx], [groups[i] for i in idx]

    for target in args.workloads.split(","):
        idx = by_name.get(target, [])
        if not idx:
            print(f"{target}: no records in the logs")
            continue
        for k in (int(s) for s in args.sizes.split(",")):
            if len(idx) - k < 32:
                continue
            for mname, make in models.items():
                m = evaluate(make(), subset(idx[:k]), subset(idx[k:]))
                rows.append({"workload": target, "train": f"first {k}", "test": len(idx) - k, "model": mname, **m})
        others = [i for n, ii in by_name.items() if n != target for i in ii]
        if others:
            for mname, make in models.items():
                m = evaluate(make(), subset(others), subset(idx))
                rows.append({"workload": target, "train": f"transfer ({len(others)} others)", "test": len(idx),
                             "model": mname, **m})
    head = f"{'workload':<18} {'train':<22} {'test':>5} {'model':<13} {'pairwise':>8} {'top5rec':>7} {'top1':>6} {'top5':>6}"
    print(head)
    for r in rows:
        print(f"{r['workload']:<18} {r['train']:<22} {r['test']:>5} {r['model']:<13} {r['pairwise_accuracy']:>8.3f} "
              f"{r['top5_recall']:>7.2f} {r['top1_score']:>6.3f} {r['top5_score']:>6.3f}")
    out = Path(args.out or f"bench/results/cost_model-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "logs": paths, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
