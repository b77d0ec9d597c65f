"""The cost model's pick: a schedule chosen by the pre-trained cost model, with no measurement.

Between a tuning record and the default schedule: a compile whose task no record covers takes
the candidate the shipped model of the target's ISA ranks first (where that model learnt from the
target's thread count and from enough workloads of the task's operator) among the task's default, the
step lists logged for the same workload on other targets (another ISA or thread count) and what
a search's first round would look at (a sample of the space, mutated), where it expects MARGIN
over the default, so an untuned model runs what a tune would measure first rather than one fixed
rule. Deterministic for a task, a model and
this version: the sample's seed is the workload's key. The candidates are lowered and featurised
(pure Python, most of the time) by the feature workers a tune uses (cost_model.parallel: fresh
interpreters, so a user's script is never imported again by a worker, as multiprocessing's spawn
would), one per core beside the compiling process.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..cost_model.model import XGBModel
from ..cost_model.parallel import FeaturePool
from ..cost_model.pretrain import shipped_model
from ..database.records import code_target
from ..errors import UserError
from ..ops import resolve
from ..space.sketch import SPACE_VERSION
from .evolutionary import EvolutionarySearch, SharedModel

POOL = 128          # sampled points the model ranks (then mutated twice, as a search's first round)
# A pick replaces the default only where the model expects it this much faster (its scores are log
# throughputs): a model's first choice, taken everywhere, ran slower than the default in most tasks
# of a network it never learnt from; the larger the margin, the less it lost (docs/search.md).
MARGIN = 2.0


def pick(task, model, seeds: list = (), pool: int = POOL, features=None, margin: float = MARGIN) -> list:
    """The step list `model` ranks first among the task's default, `seeds` and a search's first
    round (see the module) where it scores it `margin` times the default's throughput or more,
    else the default; of equal scores the first. features: a FeaturePool that holds `task`."""
    shared = SharedModel(model)
    shared.pool = features
    search = EvolutionarySearch(task, seed=int(task.workload.key[:8], 16), shared=shared, first_pool=pool)
    given = [task.space.steps(task.space.default()), *seeds]
    feats = shared.cache.of_many(task, given, features)       # None where a seed does not lower here
    scores = iter(model.predict([f for f in feats if f is not None]))
    scored = [(s, next(scores)) for s, f in zip(given, feats) if f is not None]
    scored += [(task.space.steps(d), p) for d, p in search.ranked() if np.isfinite(p)]   # scored as they evolved
    best = max(scored, key=lambda sp: sp[1])
    if feats[0] is not None and best[1] < scored[0][1] + np.log(margin):
        return given[0]
    return best[0]


MIN_SEEN = 8        # workloads of an operator a model must have learnt from to pick its schedules


def _meta(path) -> dict:
    try:
        meta = json.loads(Path(str(path) + ".meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def trained_for(path, target) -> bool:
    """Whether the model at `path` learnt from records of the target's backend, ISA and thread count
    (its .meta.json's targets). A model that never saw a thread count does not know what a parallel
    loop is worth there: ResNet-50 at 2 threads ran 2.25x ONNX Runtime's time with the picks of the
    AVX2 model, trained at 1 thread, against 1.64x with its defaults. Nor one trained on another
    version of the CPU space (SPACE_VERSION): the AVX-512 model, trained before pads had an
    interior version, picked ResNet-50 into 1.26x the time of the defaults that have one."""
    meta = _meta(path)
    targets = meta.get("targets")
    want = code_target(str(target))
    if target.kind == "cpu" and meta.get("space", 1) != SPACE_VERSION:
        return False
    return isinstance(targets, list) and any(code_target(t) == want for t in targets if isinstance(t, str))


def operators_seen(path) -> set:
    """The operators of which the model at `path` learnt from MIN_SEEN workloads or more. A model
    ranks the schedules of operators it never learnt from at random or worse: the AVX2 model, trained
    on CNN tunes (two dense layers of one row), picked BERT-base's GEMMs into 2.17x ONNX Runtime's
    time, where the defaults ran 0.89x."""
    names = _meta(path).get("workloads")
    seen: dict = {}
    for name in names if isinstance(names, list) else []:
        try:
            op = resolve(str(name)).op
        except (UserError, ValueError, KeyError):
            continue
        seen[op] = seen.get(op, 0) + 1
    return {op for op, n in seen.items() if n >= MIN_SEEN}


class Predictor:
    """The picks of one compile, with the target's shipped model where it was trained for the
    target's ISA and thread count (else no pick: the default)."""

    def __init__(self, target, pool: int = POOL):
        self.pool = pool
        path = shipped_model(target)
        self.path = str(path) if path is not None and trained_for(path, target) else None
        self.ops = operators_seen(self.path) if self.path is not None else set()
        self._model = None
        self._tasks: dict = {}           # workload key -> the Task the feature workers know
        self._features = None

    def start(self, tasks: list) -> None:
        """Start the feature workers for `tasks` (those the compile will ask steps() about)."""
        self._tasks = {t.workload.key: t for t in tasks}
        if len(self._tasks) > 1:
            self._features = FeaturePool(tasks)

    def steps(self, task, seeds: list = ()) -> list:
        """The cost model's pick for `task`, of an operator in self.ops."""
        if self._model is None:
            self._model = XGBModel.pretrained_from(self.path)
        mine = self._tasks.get(task.workload.key, task)
        return pick(mine, self._model, seeds, self.pool, self._features if mine is not task else None)

    def close(self) -> None:
        if self._features is not None:
            self._features.close()
            self._features = None
