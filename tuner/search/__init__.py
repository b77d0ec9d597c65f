"""Search policies: they propose schedules to measure and learn from what was measured."""
from ..errors import UserError
from .random_search import RandomSearch

POLICY_NAMES = ("random", "evolutionary", "optuna:tpe", "optuna:cmaes", "optuna:random")


def make_policy(name: str, task, seed: int, shared_model=None):
    if name == "random":
        return RandomSearch(task, seed)
    if name == "evolutionary":
        from .evolutionary import EvolutionarySearch
        return EvolutionarySearch(task, seed, shared=shared_model)
    if name.startswith("optuna"):
        from .optuna_search import OptunaSearch
        _, _, sampler = name.partition(":")
        return OptunaSearch(task, seed, sampler or "tpe")
    raise UserError(f"unknown search policy {name!r}: choose one of {', '.join(POLICY_NAMES)}")
