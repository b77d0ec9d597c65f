"""Task scheduler: which task gets the next round of measurements.

Gradient scheduling as in Ansor: the objective is the weighted sum of the tasks' best latencies
(weight = how often the workload occurs). For each task the expected change of its best latency
per round mixes the recent improvement (backward gradient over the last rounds) with an
optimistic forward estimate: it could drop by best/rounds, or to what similar tasks (same op and
layout) reach in FLOP rate. The task with the most negative weighted gradient goes next. Every
task first gets one warm-up round; a task with no improvement in `early_stopping` rounds, or
with only failures after its warm-up, is retired.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TaskProgress:
    name: str
    weight: float
    flops: float
    tag: str                           # tasks with the same tag are "similar" (family())
    history: list = field(default_factory=list)   # best latency after each round (inf before any valid)
    rounds: int = 0
    retired: str = ""                  # why it gets no more rounds

    @property
    def best(self) -> float:
        return self.history[-1] if self.history else math.inf


class GradientScheduler:
    name = "gradient"

    def __init__(self, tasks: list, alpha: float = 0.2, beta: float = 2.0, backward_window: int = 3,
                 early_stopping: int | None = None):
        self.tasks = tasks
        self.alpha, self.beta, self.window = alpha, beta, backward_window
        self.early_stopping = early_stopping

    def record_round(self, k: int, best_latency: float, failures_only: bool) -> None:
        t = self.tasks[k]
        t.history.append(best_latency)
        t.rounds += 1
        if failures_only and not math.isfinite(best_latency) and t.rounds >= 2:
            t.retired = "every candidate failed"
        if self.early_stopping and len(t.history) > self.early_stopping \
                and t.history[-1] >= t.history[-1 - self.early_stopping]:
            t.retired = f"no improvement in {self.early_stopping} rounds"

    def next(self, busy=()) -> tuple:
        """(task index, reason) or (None, reason) when every task is retired. `busy`: tasks with a
        round still being measured (a tune that proposes ahead), passed over while another is live."""
        live = _live(self.tasks, busy)
        if not live:
            return None, "every task is retired"
        for k in live:
            if self.tasks[k].rounds == 0:
                return k, "warm-up round"
        grads = {k: self._gradient(k) for k in live}
        k = min(live, key=lambda j: (grads[j][0], j))
        g, back, fwd = grads[k]
        return k, f"gradient {g * 1e3:+.3g} ms/round (recent {back * 1e3:+.3g}, optimistic {fwd * 1e3:+.3g})"

    def _gradient(self, k: int) -> tuple:
        t = self.tasks[k]
        if not math.isfinite(t.best):
            return -math.inf, 0.0, -math.inf        # no valid schedule yet: most urgent
        h = t.history
        back = (h[-1] - h[-1 - self.window]) / self.window if len(h) > self.window else 0.0
        if not math.isfinite(back):
            back = 0.0
        g1 = t.best - t.best / max(t.rounds, 1)
        rates = [s.flops / s.best for s in self.tasks if s.tag == t.tag and math.isfinite(s.best) and s.best > 0]
        g2 = self.beta * t.flops / max(rates) if rates else math.inf
        # the similar tasks' rate is a promise; a task whose best has not moved in the last window
        # of rounds has shown it cannot keep it, and keeps only its own fading 1/rounds estimate
        stalled = len(h) > self.window and h[-1] >= h[-1 - self.window]
        fwd = (g1 if stalled else min(g1, g2)) - t.best
        grad = t.weight * (self.alpha * back + (1 - self.alpha) * fwd)
        return grad, back, fwd


class RoundRobinScheduler(GradientScheduler):
    name = "round-robin"

    def next(self, busy=()) -> tuple:
        live = _live(self.tasks, busy)
        if not live:
            return None, "every task is retired"
        k = min(live, key=lambda j: (self.tasks[j].rounds, j))
        return k, "round-robin"


def family(wl) -> str:
    """The tag of a workload's similar tasks: those whose FLOP rates compare, because one compute
    bounds them alike (Ansor's tasks of the same compute DAG). The op and layout, and for a conv
    how its channels are grouped: a depthwise conv reads each input once per output channel and
    is memory-bound far below a dense conv's rate, so holding it to that rate would promise it
    headroom it never has. (MobileNetV2 at 1 thread spent 2400 of 3000 trials on its largest
    depthwise conv that way.)"""
    p = wl.p
    kind = ""
    if wl.op == "conv2d":
        g = p.get("groups", 1)
        kind = "/dense" if g == 1 else "/depthwise" if g == p.get("C") else "/grouped"
    return f"{wl.op}/{wl.layout}{kind}"


def _live(tasks: list, busy) -> list:
    """The tasks not retired, those not `busy` if there are any."""
    live = [k for k, t in enumerate(tasks) if not t.retired]
    return [k for k in live if k not in busy] or live


SCHEDULERS = {"gradient": GradientScheduler, "round-robin": RoundRobinScheduler}
