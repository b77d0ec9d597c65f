"""Search policies: they propose schedules to measure and learn from what was measured.

The tuning loop sees two small things, as TVM's meta_schedule separates its search strategy from
the cost model, builder, runner and database:

- a `SearchPolicy` per task: `propose` a batch of unmeasured candidates, `observe` what the log
  already holds (its state on resume: a policy's state is the log, so nothing else is saved),
  `update` with each new measurement; `name` and `seed` go into every record;
- a `PolicyFactory` per session: makes each task's policy and owns what they share (the cost
  model and the worker processes that featurise for it), with `start`, `describe` and `close`.

A new policy is a class with those three methods and a factory entry in POLICIES; the loop does
not change.
"""
from __future__ import annotations

from ..cost_model.parallel import FeaturePool
from ..errors import UserError
from .evolutionary import EvolutionarySearch, shared_model
from .optuna_search import OptunaSearch
from .policy import Policy, PolicyFactory, SearchPolicy
from .random_search import RandomSearch

__all__ = ["POLICIES", "POLICY_NAMES", "Policy", "PolicyFactory", "SearchPolicy", "policy_factory"]


class EvolutionaryFactory(PolicyFactory):
    """Evolutionary search: every task's policy ranks with one cost model, trained on all of the
    session's measurements (and transferred from a pre-trained model or earlier logs); while
    the session runs, a pool of worker processes featurises the candidates a round ranks."""

    def __init__(self, target, seed: int, cost_model_from: list | None):
        self.shared = shared_model(target, seed, cost_model_from)
        super().__init__("evolutionary", lambda task, s: EvolutionarySearch(task, s, shared=self.shared))

    def start(self, tasks: list) -> None:
        if self.shared.pool is None:
            self.shared.pool = FeaturePool(tasks)

    def describe(self) -> str:
        return f"cost model: {self.shared.describe()}"

    def close(self) -> None:
        if self.shared.pool is not None:
            self.shared.pool.close()
            self.shared.pool = None


def _random(target, seed, cost_model_from):
    return PolicyFactory("random", RandomSearch)


def _optuna(sampler: str):
    def factory(target, seed, cost_model_from):
        return PolicyFactory(f"optuna:{sampler}", lambda task, s: OptunaSearch(task, s, sampler))
    return factory


POLICIES = {"random": _random, "evolutionary": EvolutionaryFactory, "optuna:tpe": _optuna("tpe"),
            "optuna:cmaes": _optuna("cmaes"), "optuna:random": _optuna("random")}
POLICY_NAMES = tuple(POLICIES)


def policy_factory(policy, target, seed: int = 0, cost_model_from: list | None = None) -> PolicyFactory:
    """A factory for a policy name (see POLICIES), or the given factory itself."""
    if isinstance(policy, PolicyFactory):
        return policy
    if policy not in POLICIES:
        raise UserError(f"unknown search policy {policy!r}: choose one of {', '.join(POLICY_NAMES)}")
    return POLICIES[policy](target, seed, cost_model_from)
