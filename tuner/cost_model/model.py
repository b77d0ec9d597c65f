"""Cost models that rank unmeasured candidates: XGBoost (two objectives) and a random baseline.

Labels are per-task normalised throughputs: best latency of the task / latency of the candidate
(1 for the best, towards 0 for slow ones, 0 for failures), so tasks of different sizes share one
model. Two objectives:
  * "pack-sum" (Ansor): every store statement of a candidate is a row; the candidate's score is
    the sum of its rows' predictions, fitted by squared error to the log of the label. The log
    makes the model order the slow majority of random schedules too, which raises held-out
    pairwise accuracy over fitting the label itself (bench/cost_model.py);
  * "rank": one row per candidate (its statements' features summed), XGBoost's rank:pairwise with
    one query group per task.

A model can start from a pre-trained one (transfer, as TenSet): `fit` then fits a few shallow
trees to what the pre-trained booster gets wrong on this session's measurements, which is cheap
enough to redo every round and keeps what the other tasks taught. With pack-sum the pre-trained
booster's score of a candidate never changes, so it is computed once per candidate and the
session's trees are a separate small booster added to it (the pre-trained one is large).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from ..errors import UserError
from .features import fingerprint


def _xgboost():
    """xgboost, its OpenMP runtime (a copy of its own) started passive: its threads must not spin
    while a kernel is timed in the other process. The variable is put back at once, so that a
    compiled model's OpenMP runtime, loaded later in this process, spins between steps as it
    should (passive, its threads slept and woke at every step: docs/history.md)."""
    if "xgboost" not in sys.modules:
        unset = "OMP_WAIT_POLICY" not in os.environ
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import xgboost  # noqa: F401  (its library and OpenMP runtime load, and read the variable, here)
        finally:
            if unset:
                del os.environ["OMP_WAIT_POLICY"]
    return sys.modules["xgboost"]


OBJECTIVES = ("pack-sum", "rank")
LABEL_FLOOR = 1e-3      # failures (label 0) are fitted as 1/1000 of the best
FINETUNE_ROUNDS = 10     # trees added to a pre-trained booster per fit (10-30 rank held-out records alike)


class RandomModel:
    """Scores at random: what a learned model must beat."""

    name = "random"
    pretrained = False

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.trained_on = 0

    def fit(self, feats: list, labels, groups) -> None:
        self.trained_on = len(feats)

    def predict(self, feats: list) -> np.ndarray:
        return self.rng.random(len(feats))


class XGBModel:
    name = "xgboost"

    def __init__(self, objective: str = "pack-sum", seed: int = 0, rounds: int = 300, nthread: int | None = None,
                 max_depth: int = 6):
        if objective not in OBJECTIVES:
            raise UserError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
        self.objective = objective
        self.seed = seed
        self.rounds = rounds
        self.nthread = nthread or max(1, os.cpu_count() or 1)
        self.booster = None
        self.base = None               # a pre-trained booster that fit() fine-tunes
        self.residual = None           # pack-sum: the session's trees, added to the base's scores
        self._base_scores: dict = {}   # candidate (hash of its features) -> the base booster's score
        self.base_info: dict = {}
        self.meta: dict = {}
        self.trained_on = 0
        # measured best on held-out ResNet-50 logs (bench/cost_model.py): depth 6 x 300 rounds
        # beat depth 4 x 150 and sub-sampling did not help
        self.params = {"max_depth": max_depth, "eta": 0.1, "min_child_weight": 1, "lambda": 1.0, "nthread": self.nthread,
                       "seed": seed, "verbosity": 0, "tree_method": "hist"}

    @classmethod
    def for_corpus(cls, objective: str = "pack-sum", seed: int = 0) -> "XGBModel":
        """A model to pre-train on many tasks' logs (tens of thousands of records): deeper and longer
        than one session's. Depth 8 x 400 transferred better than 6 x 300 once the corpus held 35
        workloads (held-out pairwise accuracy 0.846 -> 0.854 on a 1x1 conv, 0.857 -> 0.861 on a
        3x3 conv); on a session's hundred records depth 6 stays."""
        return cls(objective, seed, rounds=400, max_depth=8)

    @property
    def pretrained(self) -> bool:
        return self.base is not None

    def as_base(self) -> "XGBModel":
        """A new model that predicts as this one until fit() fine-tunes it (this one stays as it is)."""
        if self.booster is None:
            raise ValueError("a model must be trained before others start from it")
        if self.residual is not None:
            raise ValueError("a fine-tuned model's session trees are not a base; start from its pre-trained model")
        m = XGBModel(self.objective, self.seed, self.rounds, self.nthread)
        m.base = m.booster = self.booster
        m.base_info = dict(self.meta, records=self.meta.get("records", self.trained_on))
        return m

    @classmethod
    def pretrained_from(cls, path: str) -> "XGBModel":
        """A model that starts from the one saved at `path` (by `tuner pretrain`) and fine-tunes it."""
        m = cls.load(path).as_base()
        m.base_info["path"] = str(path)
        return m

    # ------------------------------------------------------------ training
    def fit(self, feats: list, labels, groups) -> None:
        """feats: per-candidate (statements x F) arrays; labels: normalised throughputs; groups: task keys."""
        xgb = _xgboost()
        labels = np.asarray(labels, np.float32)
        if len(feats) < 2:
            if self.base is not None:
                self.booster, self.residual = self.base, None
            return
        # fine-tuning a pre-trained booster: a few shallow trees on top of it
        rounds, params, start = self.rounds, dict(self.params), None
        if self.base is not None:
            rounds, params["max_depth"], start = FINETUNE_ROUNDS, 4, self.base
        if self.objective == "pack-sum":
            rows = np.concatenate(feats)
            owner = np.repeat(np.arange(len(feats)), [len(f) for f in feats])
            dtrain = xgb.DMatrix(rows, label=np.zeros(len(rows), np.float32))
            target = np.log(np.maximum(labels, LABEL_FLOOR))
            # boosting from the base's scores is boosting on top of the base (same trees as
            # continuing its training) without copying the large booster every round
            offset = self._scores_of_base(feats) if start is not None else np.zeros(len(feats))

            def pack_sum_square_error(preds, _):
                sums = offset + np.bincount(owner, weights=preds, minlength=len(feats))
                grad_c = 2.0 * (sums - target)
                return grad_c[owner].astype(np.float32), np.full(len(rows), 2.0, np.float32)

            params.update(base_score=0.0, disable_default_eval_metric=1)
            trained = xgb.train(params, dtrain, rounds, obj=pack_sum_square_error)
            if start is None:
                self.booster = trained
            else:
                self.booster, self.residual = self.base, trained
        else:
            x = np.stack([f.sum(axis=0) for f in feats])
            order = np.argsort(np.asarray([str(g) for g in groups]), kind="stable")
            x, y = x[order], labels[order]
            g_sorted = np.asarray([str(groups[i]) for i in order])
            _, sizes = np.unique(g_sorted, return_counts=True)
            # rank:pairwise wants integer relevance; 1000 levels of normalised throughput
            dtrain = xgb.DMatrix(x, label=np.round(y * 999))
            dtrain.set_group(sizes)
            self.booster = xgb.train(dict(params, objective="rank:pairwise"), dtrain, rounds, xgb_model=start)
        self.trained_on = len(feats)

    # ------------------------------------------------------------ prediction
    def predict(self, feats: list) -> np.ndarray:
        if self.booster is None or not feats:
            return np.zeros(len(feats))
        xgb = _xgboost()
        if self.objective == "pack-sum":
            if self.base is None:
                return _pack_sum(self.booster, feats)
            scores = self._scores_of_base(feats)
            return scores if self.residual is None else scores + _pack_sum(self.residual, feats)
        return self.booster.predict(xgb.DMatrix(np.stack([f.sum(axis=0) for f in feats])))

    BASE_SCORES_KEPT = 200_000     # about 20 MB of dict; a session rarely scores more candidates

    def _scores_of_base(self, feats: list) -> np.ndarray:
        """The pre-trained booster's scores, each candidate's computed once per session."""
        keys = [hash(f.tobytes()) ^ f.shape[0] for f in feats]
        todo = [k for k, key in enumerate(keys) if key not in self._base_scores]
        if todo:
            if len(self._base_scores) + len(todo) > self.BASE_SCORES_KEPT:
                self._base_scores.clear()
            new = _pack_sum(self.base, [feats[k] for k in todo])
            self._base_scores.update((keys[k], v) for k, v in zip(todo, new))
        return np.fromiter((self._base_scores[key] for key in keys), float, len(keys))

    # ------------------------------------------------------------ persistence
    def save(self, path: str, about: dict | None = None) -> None:
        """Write the booster and a .meta.json beside it (`about`: what it was trained on, for people)."""
        if self.booster is None:
            raise ValueError("nothing to save: the model has not been trained")
        if self.residual is not None:
            raise ValueError("a fine-tuned model is session state; save the model it was pre-trained as")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(path))
        meta = {"objective": self.objective, "seed": self.seed, "rounds": self.rounds, "trained_on": self.trained_on,
                "features": fingerprint(), **(about or {})}
        Path(str(path) + ".meta.json").write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, path: str) -> "XGBModel":
        xgb = _xgboost()
        meta_path = Path(str(path) + ".meta.json")
        if not Path(path).exists() or not meta_path.exists():
            raise UserError(f"no cost model at {path} (a saved model is the file and its .meta.json)")
        meta = json.loads(meta_path.read_text())
        if meta.get("features") != fingerprint():
            raise UserError(f"cost model {path} was trained on another feature set than this version of tuner "
                             "extracts; train it again with `tuner pretrain`")
        m = cls(meta["objective"], meta["seed"], meta["rounds"])
        m.booster = xgb.Booster()
        m.booster.load_model(str(path))
        m.booster.set_param({"nthread": m.nthread})
        m.trained_on = meta["trained_on"]
        m.meta = meta
        return m


def _pack_sum(booster, feats: list) -> np.ndarray:
    """A candidate's score: the sum of its statements' predictions."""
    import xgboost as xgb
    rows = np.concatenate(feats)
    owner = np.repeat(np.arange(len(feats)), [len(f) for f in feats])
    return np.bincount(owner, weights=booster.predict(xgb.DMatrix(rows)), minlength=len(feats))


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
    raise UserError(f"unknown cost model {name!r}: use xgb (pack-sum), rank or random")
