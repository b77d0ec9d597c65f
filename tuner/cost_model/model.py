"""Cost models that rank unmeasured candidates: XGBoost (two objectives) and a random baseline.

Labels are per-task normalised throughputs: best latency of the task / latency of the candidate
(1 for the best, towards 0 for slow ones, 0 for failures), so tasks of different sizes share one
model. Two objectives:
  * "pack-sum" (Ansor): every store statement of a candidate is a row; the candidate's score is
    the sum of its rows' predictions, fitted to the label by squared error;
  * "rank": one row per candidate (its statements' features summed), XGBoost's rank:pairwise with
    one query group per task.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

# xgboost's OpenMP threads must not spin while a kernel is being timed in the other process
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

OBJECTIVES = ("pack-sum", "rank")


class RandomModel:
    """Scores at random: what a learned model must beat."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.trained_on = 0

    def fit(self, feats: list, labels, groups) -> None:
        self.trained_on = len(feats)

    def predict(self, feats: list) -> np.ndarray:
        return self.rng.random(len(feats))


class XGBModel:
    name = "xgboost"

    def __init__(self, objective: str = "pack-sum", seed: int = 0, rounds: int = 150, nthread: int | None = None):
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
        self.objective = objective
        self.seed = seed
        self.rounds = rounds
        self.nthread = nthread or max(1, os.cpu_count() or 1)
        self.booster = None
        self.trained_on = 0
        # shallow trees, small steps: measured best on held-out ResNet-50 logs (bench/cost_model.py)
        self.params = {"max_depth": 4, "eta": 0.1, "gamma": 0.003, "min_child_weight": 2, "subsample": 1.0,
                       "lambda": 1.0, "alpha": 0.0, "nthread": self.nthread, "seed": seed, "verbosity": 0,
                       "tree_method": "hist"}

    # ------------------------------------------------------------ training
    def fit(self, feats: list, labels, groups) -> None:
        """feats: per-candidate (statements x F) arrays; labels: normalised throughputs; groups: task keys."""
        import xgboost as xgb
        labels = np.asarray(labels, np.float32)
        if len(feats) < 2:
            return
        if self.objective == "pack-sum":
            rows = np.concatenate(feats)
            owner = np.repeat(np.arange(len(feats)), [len(f) for f in feats])
            dtrain = xgb.DMatrix(rows, label=np.zeros(len(rows), np.float32))

            def pack_sum_square_error(preds, _):
                sums = np.bincount(owner, weights=preds, minlength=len(feats))
                grad_c = 2.0 * (sums - labels) * np.maximum(labels, 0.1)   # weight good candidates more
                return grad_c[owner].astype(np.float32), np.full(len(rows), 2.0, np.float32)

            params = dict(self.params, base_score=0.0, disable_default_eval_metric=1)
            self.booster = xgb.train(params, dtrain, self.rounds, obj=pack_sum_square_error)
        else:
            x = np.stack([f.sum(axis=0) for f in feats])
            order = np.argsort(np.asarray([str(g) for g in groups]), kind="stable")
            x, y = x[order], labels[order]
            g_sorted = np.asarray([str(groups[i]) for i in order])
            _, sizes = np.unique(g_sorted, return_counts=True)
            # rank:pairwise wants integer relevance; 1000 levels of normalised throughput
            dtrain = xgb.DMatrix(x, label=np.round(y * 999))
            dtrain.set_group(sizes)
            self.booster = xgb.train(dict(self.params, objective="rank:pairwise"), dtrain, self.rounds)
        self.trained_on = len(feats)

    # ------------------------------------------------------------ prediction
    def predict(self, feats: list) -> np.ndarray:
        if self.booster is None or not feats:
            return np.zeros(len(feats))
        import xgboost as xgb
        if self.objective == "pack-sum":
            rows = np.concatenate(feats)
            owner = np.repeat(np.arange(len(feats)), [len(f) for f in feats])
            preds = self.booster.predict(xgb.DMatrix(rows))
            return np.bincount(owner, weights=preds, minlength=len(feats))
        return self.booster.predict(xgb.DMatrix(np.stack([f.sum(axis=0) for f in feats])))

    # ------------------------------------------------------------ persistence
    def save(self, path: str) -> None:
        if self.booster is None:
            raise ValueError("nothing to save: the model has not been trained")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(path))
        meta = {"objective": self.objective, "seed": self.seed, "rounds": self.rounds, "trained_on": self.trained_on}
        Path(str(path) + ".meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, path: str) -> "XGBModel":
        import xgboost as xgb
        meta = json.loads(Path(str(path) + ".meta.json").read_text())
        m = cls(meta["objective"], meta["seed"], meta["rounds"])
        m.booster = xgb.Booster()
        m.booster.load_model(str(path))
        m.booster.set_param({"nthread": m.nthread})
        m.trained_on = meta["trained_on"]
        return m


def normalised_throughput(latencies: list, groups: list) -> np.ndarray:
    """best latency of the candidate's task / its latency (0 for failures)."""
    best: dict = {}
    for lat, g in zip(latencies, groups):
        if np.isfinite(lat):
            best[g] = min(best.get(g, np.inf), lat)
    return np.asarray([best[g] / lat if np.isfinite(lat) and g in best else 0.0 for lat, g in zip(latencies, groups)],
                      np.float32)


def make_model(name: str, seed: int = 0):
    if name in ("xgb", "xgboost", "pack-sum"):
        return XGBModel("pack-sum", seed)
    if name == "rank":
        return XGBModel("rank", seed)
    if name == "random":
        return RandomModel(seed)
    raise ValueError(f"unknown cost model {name!r}: use xgb (pack-sum), rank or random")
