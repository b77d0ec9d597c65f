"""What a tuning log says: per-task tables and best-so-far curves."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import records
from ..measure.result import OK
from ..te.workloads import WorkloadError, parse_spec


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
        return self.flops / self.best_latency / 1e9 if self.valid else 0.0


@dataclass
class Report:
    path: str
    tasks: list
    skipped: int
    keys: list = field(default_factory=list)   # (workload key, target) of each task

    def table(self) -> str:
        head = ["workload", "layout", "target", "trials", "valid", "errors", "best ms", "GFLOPS", "best at"]
        rows = []
        for t in self.tasks:
            errs = ", ".join(f"{k} {v}" for k, v in sorted(t.errors.items())) or "-"
            rows.append([t.name, t.layout, t.target, str(t.trials), str(t.valid), errs,
                         f"{t.best_latency * 1e3:.4f}" if t.valid else "-",
                         f"{t.best_gflops:.1f}" if t.valid else "-", str(t.best_trial) if t.valid else "-"])
        widths = [max(len(r[k]) for r in [head] + rows) for k in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head] + rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        for t in self.tasks:
            for kind, msg in t.first_message.items():
                first = msg.strip().splitlines()[0] if msg.strip() else ""
                lines.append(f"{t.name}: first {kind}: {first[:160]}")
        if self.skipped:
            lines.append(f"skipped {self.skipped} malformed line(s) in {self.path}")
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


def _flops(wl_json: dict) -> float:
    try:
        return parse_spec(wl_json["spec"], wl_json["layout"]).flops
    except (WorkloadError, KeyError, ValueError):
        return float("nan")


def analyze(path: str) -> Report:
    contents = records.load(path, warn=False)
    tasks: dict = {}
    for rec in contents.records:
        w = rec["workload"]
        key = (w["key"], rec["target"])
        t = tasks.get(key)
        if t is None:
            t = tasks[key] = TaskReport(w.get("name") or w.get("spec", w["key"]), w.get("spec", ""),
                                        w.get("layout", ""), rec["target"], _flops(w))
        t.trials += 1
        if rec["error"] == OK:
            t.valid += 1
            lat = records.latency(rec)
            if lat < t.best_latency:
                t.best_latency, t.best_trial = lat, t.trials
        else:
            t.errors[rec["error"]] = t.errors.get(rec["error"], 0) + 1
            t.first_message.setdefault(rec["error"], rec.get("message", ""))
        t.curve.append(t.flops / t.best_latency / 1e9 if t.valid else 0.0)
    return Report(path, list(tasks.values()), contents.skipped, list(tasks))


def task_report(path: str, key: str, target: str):
    """The report of one workload on one target in a log, or None."""
    rep = analyze(path)
    return next((t for t, k in zip(rep.tasks, rep.keys) if k == (key, target)), None)


__all__ = ["analyze", "task_report", "Report", "TaskReport"]
