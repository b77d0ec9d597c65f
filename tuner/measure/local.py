"""The runners of this host: its measurement process for the target's kind, or a replayed log."""
from __future__ import annotations

from .replay import ReplayRunner
from .runner import RUNNERS, RunConfig


def local_runner(target, config: RunConfig, replay: str | None = None):
    """The costs of `replay` (a log) when given, else this host's measurement process."""
    return ReplayRunner(replay, config) if replay else RUNNERS[target.kind](target, config)
