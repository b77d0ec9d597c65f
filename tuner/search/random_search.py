"""Random search: uniform samples of the sketch's decisions, never proposing known code twice."""
from __future__ import annotations

import json
import random

from ..schedule.schedule import ScheduleError
from ..space.sketch import FOREIGN
from .policy import Policy


class RandomSearch(Policy):
    name = "random"

    def __init__(self, task, seed: int = 0):
        self.task = task
        self.seed = seed
        self.rng = random.Random(seed)
        self._codes: dict = {}      # decisions sampled -> their code hash (None: they do not lower)

    def default_if_new(self, seen: set, n: int) -> list:
        """[the default schedule, then the task's seeds (decisions measured for another thread
        count: Task.seeds)], the first `n` of those whose code was not measured already: a first
        look is no longer than asked, or a tune's budget runs out before its last tasks' first look."""
        out = [self.task.default_candidate()]
        for dec in self.task.seeds:
            try:
                out.append(self.task.from_decisions(dec))
            except FOREIGN:          # not a point of this space
                pass
        new = []
        for cand in out:
            if len(new) < n and cand.code_hash not in seen:
                seen.add(cand.code_hash)
                new.append(cand)
        return new

    def propose(self, n: int, seen: set, first: bool = False) -> list:
        """Up to `n` new candidates whose code hash is not in `seen` (which it extends).

        On the first round the default schedule goes first, so every tune has a baseline.
        """
        out = self.default_if_new(seen, n) if first else []
        attempts = 0
        while len(out) < n and attempts < 50 * n + 200:
            attempts += 1
            dec = self.task.space.sample(self.rng)
            key = json.dumps(dec, sort_keys=True)
            if key in self._codes and (self._codes[key] is None or self._codes[key] in seen):
                continue         # a point drawn before is not lowered again (a small space's draws repeat)
            try:
                cand = self.task.from_decisions(dec)
            except ScheduleError:
                self._codes[key] = None
                continue
            self._codes[key] = cand.code_hash
            if cand.code_hash in seen:
                continue
            seen.add(cand.code_hash)
            out.append(cand)
        return out
