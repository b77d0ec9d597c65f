"""What the tuning loop measures with: the Runner protocol, and the runner a tune gets."""
from __future__ import annotations

from typing import Iterator, Protocol

from .cluster import ClusterRunner
from .local import local_runner
from .runner import RunConfig


class Runner(Protocol):
    """What the tuning loop measures with."""
    ahead: int   # batches the loop may propose before this one's results are in (0: nothing runs meanwhile)

    def measure(self, task, batch: list) -> Iterator[tuple]:
        """(candidate, MeasureResult) for every candidate of `batch`, in any order."""

    def status(self) -> str:
        """A few words for the progress line ('' for none)."""

    def close(self) -> None:
        """Stop what it started (worker processes, cluster clients)."""


def make_runner(target, config: RunConfig, replay: str | None = None, cluster: str | None = None) -> Runner:
    """The runner a tune measures with: on a cluster (the replay looked up by its workers), the
    costs of a replayed log, or this host's measurement process for the target's kind."""
    if cluster:
        return ClusterRunner(cluster, target, config, replay=replay)
    return local_runner(target, config, replay)
