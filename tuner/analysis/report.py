"""What a tuning log says: per-task tables and best-so-far curves."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..database import records
from ..errors import UserError
from ..ops import parse_spec


@dataclass
class TaskReport:
    name: str
    spec: str
    layout: str
    target: str
    flops: float
    trials: int = 0
    valid: int = 0
    errors: dict = field(default_factory=dict)        # kind -> count
    first_message: dict = field(default_factory=dict)  # kind -> first message
    best_latency: float = float("inf")
    best_trial: int = 0
    curve: list = field(default_factory=list)          # best-so-far GFLOPS per trial

    @property
    def best_gflops(self) -> float:
        return self.flops / self.best_latency / 1e9 if math.isfinite(self.best_latency) else 0.0


@dataclass
class Report:
    path: str
    tasks: list
    skipped: int
    keys: list = field(default_factory=list)   # (workload key, target) of each task
    skipped_why: str = ""

    def table(self) -> str:
        head = ["workload", "layout", "target", "trials", "valid", "errors", "best ms", "GFLOPS", "best at"]
        rows = []
        for t in self.tasks:
            errs = ", ".join(f"{k} {v}" for k, v in sorted(t.errors.items())) or "-"
            found = math.isfinite(t.best_latency)
            rows.append([t.name, t.layout, t.target, str(t.trials), str(t.valid), errs,
                         f"{t.best_latency * 1e3:.4f}" if found else "-",
                         f"{t.best_gflops:.1f}" if found else "-", str(t.best_trial) if found else "-"])
        widths = [max(len(r[k]) for r in [head] + rows) for k in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head] + rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        for t in self.tasks:
            for kind, msg in t.first_message.items():
                first = msg.strip().splitlines()[0] if msg.strip() else ""
                lines.append(f"{t.name}: first {kind}: {first[:160]}")
        if self.skipped:
            lines.append(self.skipped_why)
        return "\n".join(lines)

    def plot(self, out: str) -> str:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = max(1, len(self.tasks))
        cols = min(3, n)
        rows = -(-n // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
        for ax, t in zip(axes.flat, self.tasks):
            ax.plot(range(1, len(t.curve) + 1), t.curve, drawstyle="steps-post")
            ax.set_title(f"{t.name} [{t.layout}]", fontsize=9)
            ax.set_xlabel("trial")
            ax.set_ylabel("best GFLOPS so far")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(self.tasks):]:
            ax.axis("off")
        fig.suptitle(Path(self.path).name, fontsize=10)
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return out


def _flops(w) -> float:
    try:
        return parse_spec(w.spec, w.layout).live_flops      # a conv's padding-only products, skipped, not counted
    except UserError:            # a logged spec or layout this version cannot read (WorkloadError, LayoutError)
        return float("nan")


def analyze(path: str, contents: records.LogContents | None = None) -> Report:
    """Per task: trials, errors, the best-so-far curve and the best record that still replays (a
    record whose steps do not give its logged code is passed over, however fast it claims to be).
    contents: the log already read (records.load), so that it is not read twice."""
    contents = contents or records.load(path, warn=False)
    by_task: dict = {}
    for rec in contents.records:
        by_task.setdefault(rec.task_key, []).append(rec)
    tasks = []
    for recs in by_task.values():
        w = recs[0].workload
        t = TaskReport(w.title, w.spec, w.layout, recs[0].target, _flops(w))
        best = records.best_of(recs)
        best_so_far = float("inf")
        for rec in recs:
            if not rec.trial:
                continue
            t.trials += 1
            if rec.ok:
                t.valid += 1
                # the best's kernel (its code and steps) counts as its slower timing from the trial
                # that found it
                lat = (records.latency(best) if best is not None and rec.code_hash == best.code_hash
                       and rec.steps == best.steps else rec.latency)
                if rec.cold == (best is not None and best.cold) and best_so_far > lat >= records.latency(best):
                    best_so_far = lat
                    t.best_latency, t.best_trial = best_so_far, t.trials
            else:
                t.errors[rec.error] = t.errors.get(rec.error, 0) + 1
                t.first_message.setdefault(rec.error, rec.message)
            t.curve.append(t.flops / best_so_far / 1e9 if math.isfinite(best_so_far) else 0.0)
        tasks.append(t)
    return Report(path, tasks, contents.skipped, list(by_task), contents.skipped_summary())


def task_report(path: str, key: str, target: str):
    """The report of one workload on one target in a log, or None."""
    rep = analyze(path)
    return next((t for t, k in zip(rep.tasks, rep.keys) if k == (key, target)), None)


__all__ = ["analyze", "task_report", "Report", "TaskReport"]
