"""Evolutionary search guided by a cost model (Ansor's policy, scaled for a Python tuner).

Each round: a population of the best measured points plus fresh samples is mutated for a few
generations; the cost model scores every new point and the best survive. The batch measured is
the top predicted points not measured before (by code hash), with a fraction eps picked at random
so that the model also sees what it does not yet believe in. The model is retrained on every
measurement of the session (and on the log it resumed from).
"""
from __future__ import annotations

import json
import random

import numpy as np

from ..cost_model.dataset import FeatureCache, from_records, group_of
from ..cost_model.model import XGBModel, normalised_throughput
from ..cost_model.pretrain import shipped_model
from ..database import records
from ..errors import UserError
from ..schedule.schedule import ScheduleError
from ..space.mutation import mutate
from ..space.sketch import FOREIGN
from .policy import Policy
from .random_search import RandomSearch


def _key(dec: dict) -> str:
    return json.dumps(dec, sort_keys=True)


def _structure(dec: dict) -> str:
    """The decisions that change the loop nest's structure rather than its numbers."""
    return json.dumps([dec.get("pad", {}), dec.get("epilogue", "fused"), dec.get("order", "axes")], sort_keys=True)


def _by_structure(decs) -> dict:
    """Decisions grouped by structure, each group in the order given."""
    groups: dict = {}
    for dec in decs:
        groups.setdefault(_structure(dec), []).append(dec)
    return groups


class EvolutionarySearch(Policy):
    name = "evolutionary"

    def __init__(self, task, seed: int = 0, model=None, population: int = 32, generations: int = 2,
                 eps: float = 0.1, warmup: int | None = None, shared=None, first_pool: int = 256,
                 first_batches: int = 8):
        self.task = task
        self.seed = seed
        self.rng = random.Random(seed)
        self.random = RandomSearch(task, seed)     # the default first, the warm-up and the eps share
        self.shared = shared or SharedModel(model or XGBModel("pack-sum", seed))
        self.population = population
        self.generations = generations
        self.eps = eps
        self.warmup = warmup
        self.first_pool = first_pool          # points a pre-trained model ranks before anything is measured
        self.first_batches = first_batches    # early batches this small, so fine-tuning starts sooner
        self.measured: list = []            # (decisions, code_hash, latency)
        self.proposed = 0

    # ------------------------------------------------------------ learning
    def observe(self, recs: list) -> None:
        """Take what a log already holds for this task (resume)."""
        self.shared.add_records(recs)
        for r in recs:
            if r.decisions is not None and self._gives(r.decisions, r.steps):
                self.measured.append((r.decisions, r.code_hash, r.latency))

    def _gives(self, decisions: dict, steps: list) -> bool:
        """Whether logged decisions are a point of this space that gives the logged steps (a parent
        to mutate), rather than a hand-edited or foreign dict."""
        try:
            return self.task.space.steps(decisions) == steps
        except FOREIGN:
            return False

    def update(self, cand, result) -> None:
        if result.error == "NOT_IN_LOG":
            return
        self.shared.add(self.task, cand, result.latency)
        if cand.decisions is not None:
            self.measured.append((cand.decisions, cand.code_hash, result.latency))

    # ------------------------------------------------------------ proposing
    def propose(self, n: int, seen: set, first: bool = False) -> list:
        # a pre-trained model ranks from the start; a fresh one first sees a random batch. With a
        # pre-trained model the first batches are small (8, 8, 16, then n): each is followed by
        # fine-tuning and by mutating what it found, which is what finds the last few percent
        pretrained = self.shared.model.pretrained
        warm = self.warmup if self.warmup is not None else 0 if pretrained else n
        if pretrained and self.first_batches:
            n = min(n, max(self.first_batches, len(self.measured), self.proposed))
        out = self.random.default_if_new(seen, n) if first else []
        if len(out) >= n:        # a first look of the default alone: nothing to rank
            pass
        elif len(self.measured) < warm or not self.shared.ready:
            out += self.random.propose(n - len(out), seen)
        else:
            self.shared.train_if_stale()
            scored = self.ranked()
            n_random = int(round(self.eps * (n - len(out))))
            take = n - n_random - len(out)
            # every structure (pad placement: a different loop nest, like Ansor's sketches) gets at
            # least half an equal share of the batch, and one candidate where that rounds to none,
            # so a basin the model ranks second is still refined; without it a search could spend
            # hundreds of trials in the wrong one
            groups = _by_structure(d for d, _ in scored)
            share = max(1, take // (2 * len(groups))) if 1 < len(groups) <= take else 0
            order = [d for g in groups.values() for d in g[:share]] + [d for d, _ in scored]
            for dec in order:
                if len(out) >= n - n_random:
                    break
                cand = self._candidate(dec)
                if cand is not None and cand.code_hash not in seen:
                    seen.add(cand.code_hash)
                    out.append(cand)
            out += self.random.propose(n - len(out), seen)
        self.proposed += len(out)
        return out

    def _candidate(self, dec):
        try:
            return self.task.from_decisions(dec)
        except ScheduleError:
            return None

    def ranked(self) -> list:
        """[(decisions, predicted score)] best first, from mutating the best measured points
        (nothing measured: a sample of first_pool points with a pre-trained model)."""
        space = self.task.space
        best = sorted((m for m in self.measured if np.isfinite(m[2])), key=lambda m: m[2])
        # parents: the best measured points of every structure, then the best overall
        by_structure = _by_structure(m[0] for m in best)
        each = self.population // (4 * len(by_structure)) if len(by_structure) > 1 else 0
        pop = [d for g in by_structure.values() for d in g[:each]]
        pop += [m[0] for m in best if m[0] not in pop][: max(0, self.population // 2 - len(pop))]
        fresh = self.population if best or not self.shared.model.pretrained else max(self.population, self.first_pool)
        while len(pop) < fresh:
            pop.append(space.sample(self.rng))
        scores: dict = {}
        measured_keys = {_key(m[0]) for m in self.measured}

        def score(decs: list):
            new = [d for d in decs if _key(d) not in scores]
            if new:
                preds = self.shared.predict(self.task, new)
                for d, p in zip(new, preds):
                    scores[_key(d)] = (d, float(p))

        score(pop)
        pop = [d for d, _ in sorted(scores.values(), key=lambda dp: -dp[1])[: self.population]] \
            if len(pop) > self.population else pop
        for _ in range(self.generations):
            children = []
            for parent in pop:
                child = mutate(space, parent, self.rng)
                if child is not None:
                    children.append(child)
            score(children)
            ranked = sorted(scores.values(), key=lambda dp: -dp[1])
            pop = [d for d, _ in ranked[: self.population]]
        return [(d, s) for d, s in sorted(scores.values(), key=lambda dp: -dp[1]) if _key(d) not in measured_keys]


class SharedModel:
    """One cost model shared by the tasks of a tuning session, retrained when data arrives."""

    def __init__(self, model, min_records: int = 8):
        self.model = model
        self.cache = FeatureCache()
        self.feats: list = []
        self.lats: list = []
        self.groups: list = []
        self.min_records = min_records
        self._trained_at = -1
        self.transfer_logs: list = []      # other tasks' logs trained on with the session's records
        self.transfer_records = 0
        self.pool = None                   # a FeaturePool the tuning loop lends for the session
        self.stand_in = ""                 # "the cpu-avx512 model stands in for avx2" (pretrain.STAND_INS)

    @property
    def ready(self) -> bool:
        return self.model.pretrained or len(self.feats) >= self.min_records or self._trained_at > 0

    def describe(self) -> str:
        m = self.model
        if m.pretrained:
            info = m.base_info
            what = f"pre-trained on {info.get('records', '?')} records of {len(info.get('workloads', [])) or '?'} " \
                   f"workloads ({info['path']}{'; ' + self.stand_in if self.stand_in else ''}), fine-tuned on " \
                   "this session's measurements"
        else:
            what = f"{m.name} trained on this session's measurements"
        if self.transfer_logs:
            what += f" and {self.transfer_records} records of {len(self.transfer_logs)} earlier log(s)"
        return what

    def add(self, task, cand, latency: float):
        self.feats.append(self.cache.of(task, cand.steps))     # usually cached when it was scored
        self.lats.append(latency)
        self.groups.append(group_of(task.workload.key, str(task.target)))

    def add_records(self, recs: list):
        """Logged records: those this task resumes from, or other tasks' (transfer)."""
        feats, lats, groups = from_records(recs, self.cache)
        self.feats += feats
        self.lats += lats
        self.groups += groups

    def train_if_stale(self):
        if len(self.feats) == self._trained_at:
            return
        self.model.fit(self.feats, normalised_throughput(self.lats, self.groups), self.groups)
        self._trained_at = len(self.feats)

    def predict(self, task, decisions: list) -> np.ndarray:
        steps = []
        for d in decisions:
            try:
                steps.append(task.space.steps(d))
            except ScheduleError:
                steps.append(None)
        feats = self.cache.of_many(task, steps, self.pool)
        ok = [f for f in feats if f is not None]
        preds = iter(self.model.predict(ok)) if ok else iter(())
        return np.asarray([next(preds) if f is not None else -np.inf for f in feats])


def shared_model(tgt, seed: int, cost_model_from: list | None) -> "SharedModel":
    """The session's cost model. cost_model_from: None for the shipped pre-trained model of the
    target's ISA (if any), ["none"] for none, else logs (*.jsonl, trained on together with the
    session's records) and at most one saved model (fine-tuned)."""
    sources = list(cost_model_from) if cost_model_from is not None else None
    stand_in = ""
    if sources is None:
        shipped = shipped_model(tgt)
        sources = [str(shipped)] if shipped else []
        if shipped and shipped.stem != f"{tgt.kind}-{tgt.isa}":
            stand_in = f"no model is shipped for {tgt.isa}: the {shipped.stem} model stands in"
    sources = [p for p in sources if str(p).lower() != "none"]
    logs = [p for p in sources if str(p).endswith(".jsonl")]
    models = [p for p in sources if not str(p).endswith(".jsonl")]
    if len(models) > 1:
        raise UserError(f"--cost-model-from names {len(models)} saved models ({', '.join(models)}); "
                         "fine-tuning starts from one")
    shared = SharedModel(XGBModel.pretrained_from(models[0]) if models else XGBModel("pack-sum", seed))
    for other in logs:
        shared.add_records(records.load(other, warn=False).records)
    shared.transfer_logs, shared.transfer_records, shared.stand_in = logs, len(shared.feats), stand_in
    return shared
