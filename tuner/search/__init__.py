"""Search policies: they propose schedules to measure."""
from .random_search import RandomSearch

POLICIES = {"random": RandomSearch}


def make_policy(name: str, task, seed: int):
    if name not in POLICIES:
        raise ValueError(f"unknown search policy {name!r}: choose one of {', '.join(POLICIES)}")
    return POLICIES[name](task, seed)
