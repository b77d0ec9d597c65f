"""The cost model's pick: a schedule chosen by the pre-trained cost model, with no measurement.

Between a tuning record and the default schedule: a compile whose task no record covers takes
the candidate the shipped model of the target's ISA ranks first (where that model learnt from the
target's thread count and from enough workloads of the task's operator) among the task's default, the
step lists logged for the same workload on other targets (another ISA or thread count) and what
a search's first round would look at (a sample of the space, mutated), so an untuned model runs
what a tune would measure first rather than one fixed rule. Deterministic for a task, a model and
this version: the sample's seed is the workload's key. Tasks are ranked in worker processes, one
per core (lowering and featurising the candidates is pure Python).
"""
from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from ..cost_model.model import XGBModel
from ..cost_model.pretrain import shipped_model
from ..database.records import code_target
from ..errors import UserError
from ..ops import resolve
from ..schedule.schedule import ScheduleError
from ..target import host_cores, parse_target
from ..task import Task
from .evolutionary import EvolutionarySearch, SharedModel

POOL = 128          # sampled points the model ranks (then mutated twice, as a search's first round)
_MODELS: dict = {}  # model path -> XGBModel, per process


def pick(task, model, seeds: list = (), pool: int = POOL) -> list:
    """The step list `model` ranks first among the task's default, `seeds` and a search's first
    round (see the module)."""
    search = EvolutionarySearch(task, seed=int(task.workload.key[:8], 16), shared=SharedModel(model), first_pool=pool)
    default = task.space.steps(task.space.default())
    cands = {json.dumps(default): default}
    for s in seeds:
        cands.setdefault(json.dumps(s), s)
    for dec, _ in search.ranked():
        try:
            s = task.space.steps(dec)
        except ScheduleError:
            continue
        cands.setdefault(json.dumps(s), s)
    steps = list(cands.values())
    feats = search.shared.cache.of_many(task, steps)      # None where a seed does not lower here
    ok = [k for k, f in enumerate(feats) if f is not None]
    return steps[ok[int(np.argmax(model.predict([feats[k] for k in ok])))]]


def _model(path: str) -> XGBModel:
    if path not in _MODELS:
        _MODELS[path] = XGBModel.pretrained_from(path)
    return _MODELS[path]


def _pick_in_worker(workload, target: str, seeds: list, path: str, pool: int) -> list:
    return pick(Task(workload, parse_target(target, check_host=False)), _model(path), seeds, pool)


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
    AVX2 model, trained at 1 thread, against 1.64x with its defaults."""
    targets = _meta(path).get("targets")
    want = code_target(str(target))
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
        self.target = target
        self.pool = pool
        path = shipped_model(target)
        self.path = str(path) if path is not None and trained_for(path, target) else None
        self.ops = operators_seen(self.path) if self.path is not None else set()
        self._futures: dict = {}
        self._executor = None

    def prefetch(self, jobs: list) -> None:
        """Start ranking [(workload, seeds)] in worker processes; steps() then waits for them."""
        todo = [(w, s) for w, s in jobs if w.op in self.ops and w.key not in self._futures]
        if len(todo) < 2:
            return
        self._executor = ProcessPoolExecutor(min(host_cores(), len(todo)),
                                             mp_context=multiprocessing.get_context("spawn"))
        for w, seeds in todo:
            self._futures[w.key] = self._executor.submit(_pick_in_worker, w, str(self.target), list(seeds),
                                                         self.path, self.pool)

    def steps(self, task, seeds: list = ()) -> list | None:
        """The cost model's pick for `task` (prefetched or ranked here), or None where no model
        learnt the task's operator."""
        if task.workload.op not in self.ops:
            return None
        fut = self._futures.get(task.workload.key)
        if fut is not None:
            try:
                return fut.result()
            except (BrokenProcessPool, OSError):     # a worker killed or unable to start: rank it here
                pass
        return pick(task, _model(self.path), seeds, self.pool)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
            self._executor = None
