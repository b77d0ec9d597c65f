"""The protocol between the tuning loop and a search policy (see the package's docstring)."""
from __future__ import annotations

from typing import Protocol


class SearchPolicy(Protocol):
    name: str
    seed: int

    def propose(self, n: int, seen: set, first: bool = False) -> list:
        """Up to `n` candidates whose code hash is not in `seen` (which it extends); `first`: the
        task's first round, when the default schedule goes first."""

    def observe(self, records: list) -> None:
        """The log's records of this task (resuming)."""

    def update(self, cand, result) -> None:
        """One new measurement of a candidate this policy proposed."""


class Policy:
    """Defaults for policies that learn nothing from measurements."""
    name = "custom"
    seed = 0

    def observe(self, records: list) -> None:
        pass

    def update(self, cand, result) -> None:
        pass


class PolicyFactory:
    """Makes one policy per task for a session; shares nothing unless a subclass does."""

    def __init__(self, name: str, make):
        self.name = name
        self._make = make

    def make(self, task, seed: int) -> SearchPolicy:
        return self._make(task, seed)

    def start(self, tasks: list) -> None:
        """The session's tasks are known and measuring begins."""

    def describe(self) -> str:
        """A line for the progress output ('' for nothing to say)."""
        return ""

    def close(self) -> None:
        pass
