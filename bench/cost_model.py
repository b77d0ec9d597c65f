"""Cost-model quality from existing logs (no new measurements).

For each workload (1-thread records of random search, so the test set is an unbiased sample):
  * in-task: train on the first K of its records (K = 64, 128, 256), test on the rest;
  * transfer: train only on the other workloads' records, test on all of this one's after the first K;
  * transfer + K: the other workloads' records and this one's first K trained together;
  * pre-trained + fine-tune K: what `tuner tune` does by default: a model trained on the other
    workloads, plus a few trees fitted to this one's first K records.
Metrics: pairwise ranking accuracy, top-5 recall and TenSet's top-1 / top-5 scores (best latency
over the latency of the model's best pick among its top k), for both XGBoost objectives and a
random model. "Other workloads" are every workload in the logs but the one tested.

    python -m bench.cost_model --logs 'logs/bench/search/*.random.*.jsonl' --logs logs/bench/ops.NCHW16c.t1.jsonl
"""
from __future__ import annotations

import argparse
import glob
import time

from bench.common import SEARCH_WORKLOADS, write_results
from tuner.cost_model.dataset import FeatureCache, from_records
from tuner.cost_model.metrics import pairwise_accuracy, top_k_recall, top_k_score
from tuner.cost_model.model import RandomModel, XGBModel, normalised_throughput
from tuner.database import records


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
    ap.add_argument("--workloads", default=SEARCH_WORKLOADS)
    ap.add_argument("--sizes", default="64,128,256")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    paths = sorted({p for pat in args.logs for p in glob.glob(pat)})
    recs = [r for p in paths for r in records.load(p, warn=False).records
            if r.error != "NOT_IN_LOG" and r.policy == "random" and "-threads=1" in r.target]
    cache = FeatureCache()
    t0 = time.perf_counter()
    feats, lats, groups = from_records(recs, cache)
    # from the groups, which line up with the features (records that no longer lower are skipped)
    keys = [g.split("|")[0] for g in groups]
    name_of = {r.workload.key: r.workload.title for r in recs}
    names = [name_of[k] for k in keys]
    print(f"{len(feats)} random-search records from {len(paths)} logs featurised in {time.perf_counter() - t0:.1f} s")
    by_name: dict = {}
    for k, n in enumerate(names):
        by_name.setdefault(n, []).append(k)
    rows = []
    models = {"xgb pack-sum": lambda: XGBModel("pack-sum", 0), "xgb rank": lambda: XGBModel("rank", 0),
              "random": lambda: RandomModel(0)}

    def subset(idx):
        return [feats[i] for i in idx], [lats[i] for i in idx], [groups[i] for i in idx]

    def add(target, train, test, mname, metrics):
        rows.append({"workload": target, "train": train, "test": test, "model": mname, **metrics})

    for target in args.workloads.split(","):
        idx = by_name.get(target, [])
        if not idx:
            print(f"{target}: no records in the logs")
            continue
        # by key: another model's layer of the same shape is the same task, not another one
        same = {keys[i] for i in idx}
        others = [i for i in range(len(feats)) if keys[i] not in same]
        pretrained = {}
        if others:        # one model per objective trained on the other workloads, reused below
            f_o, l_o, g_o = subset(others)
            for obj in ("pack-sum", "rank"):
                pretrained[obj] = XGBModel.for_corpus(obj, 0)     # as `tuner pretrain` trains one
                pretrained[obj].fit(f_o, normalised_throughput(l_o, g_o), g_o)
        for k in (int(s) for s in args.sizes.split(",")):
            if len(idx) - k < 32:
                continue
            test = subset(idx[k:])
            for mname, make in models.items():
                add(target, f"first {k}", len(idx) - k, mname, evaluate(make(), subset(idx[:k]), test))
            for obj, base in pretrained.items():
                mname = f"xgb {obj}"
                add(target, f"transfer ({len(others)} others)", len(idx) - k, mname, evaluate(
                    _Frozen(base), subset(idx[:k]), test))
                add(target, f"others + first {k}", len(idx) - k, mname,
                    evaluate(XGBModel.for_corpus(obj, 0), subset(others + idx[:k]), test))
                add(target, f"pre-trained + fine-tune {k}", len(idx) - k, mname,
                    evaluate(base.as_base(), subset(idx[:k]), test))
    head = f"{'workload':<18} {'train':<28} {'test':>5} {'model':<13} {'pairwise':>8} {'top5rec':>7} {'top1':>6} {'top5':>6}"
    print(head)
    for r in rows:
        print(f"{r['workload']:<18} {r['train']:<28} {r['test']:>5} {r['model']:<13} {r['pairwise_accuracy']:>8.3f} "
              f"{r['top5_recall']:>7.2f} {r['top1_score']:>6.3f} {r['top5_score']:>6.3f}")
    write_results("cost_model", args.out, {"args": vars(args), "logs": paths, "rows": rows})
    return rows


class _Frozen:
    """A trained model that ignores fit(): transfer alone, with nothing of the tested workload."""

    def __init__(self, model):
        self.model = model

    def fit(self, *_):
        pass

    def predict(self, feats):
        return self.model.predict(feats)


if __name__ == "__main__":
    main()
