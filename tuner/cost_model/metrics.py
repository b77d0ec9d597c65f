"""How good a ranking is: pairwise accuracy, top-k recall and TenSet's top-k score."""
from __future__ import annotations

import numpy as np


def pairwise_accuracy(pred, truth) -> float:
    """Fraction of pairs with different true values that the prediction orders the same way."""
    pred, truth = np.asarray(pred, float), np.asarray(truth, float)
    i, j = np.triu_indices(len(truth), k=1)
    diff = truth[i] != truth[j]
    if not diff.any():
        return 1.0
    agree = np.sign(pred[i] - pred[j]) == np.sign(truth[i] - truth[j])
    return float(agree[diff].mean())


def top_k_recall(pred, truth, k: int = 5) -> float:
    """How many of the truly best k are among the predicted best k."""
    pred, truth = np.asarray(pred, float), np.asarray(truth, float)
    k = min(k, len(truth))
    return len(set(np.argsort(-pred)[:k]) & set(np.argsort(-truth)[:k])) / k


def top_k_score(pred, latencies, k: int = 1) -> float:
    """TenSet's score: best latency overall / best latency among the model's top-k picks."""
    pred, lat = np.asarray(pred, float), np.asarray(latencies, float)
    picks = np.argsort(-pred)[:k]
    best_pick = lat[picks].min()
    return float(lat.min() / best_pick) if np.isfinite(best_pick) else 0.0
