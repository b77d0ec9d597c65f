"""The tuning loop of one operator: propose, build, check, time, record; resumable."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import records
from .measure.builder import build_batch
from .measure.result import COMPILE_ERROR, OK, MeasureResult
from .measure.runner import RunConfig, Runner
from .search import make_policy
from .target import Target, parse_target
from .task import Candidate, Task
from .te.workloads import Workload, resolve


@dataclass
class TuneSummary:
    workload: Workload
    target: Target
    log: str
    trials: int = 0              # records of this task in the log, old and new
    new: int = 0                 # measured in this call
    errors: dict = field(default_factory=dict)
    best: dict | None = None
    seconds: float = 0.0
    interrupted: bool = False
    skipped_lines: int = 0

    @property
    def best_latency(self) -> float:
        return records.latency(self.best) if self.best else float("inf")

    @property
    def best_gflops(self) -> float:
        return self.workload.flops / self.best_latency / 1e9 if self.best else 0.0

    @property
    def candidates_per_minute(self) -> float:
        return 60.0 * self.new / self.seconds if self.seconds else 0.0


def default_log(workload: Workload) -> str:
    return str(Path("logs") / f"{(workload.name or workload.op).replace('/', '_')}.{workload.layout}.jsonl")


def tune_op(workload: str | Workload, layout: str | None = None, target: str | Target = "cpu", trials: int = 64,
            log: str | None = None, time_limit: float | None = None, policy: str = "random", seed: int = 0,
            batch_size: int = 32, threads: int | None = None, run_config: RunConfig | None = None,
            progress: bool = True, runner: Runner | None = None, policy_obj=None) -> TuneSummary:
    """Tune one workload until `trials` records exist for it in `log` (or `time_limit` passes).

    Resumes from the log: what it holds counts against the budget and is never measured again.
    Ctrl-C stops after the current candidate with every finished record already on disk.
    """
    wl = workload if isinstance(workload, Workload) else resolve(workload, layout)
    tgt = parse_target(target, threads)
    log = log or default_log(wl)
    task = Task(wl, tgt)
    contents = records.load(log, warn=False)
    previous = contents.for_task(wl.key, str(tgt))
    seen = {r.get("code_hash") for r in previous}
    summary = TuneSummary(wl, tgt, log, trials=len(previous), skipped_lines=contents.skipped)
    for r in previous:
        summary.errors[r["error"]] = summary.errors.get(r["error"], 0) + 1
    summary.best = records.best(contents, wl.key, str(tgt))
    search = policy_obj or make_policy(policy, task, seed + len(previous))
    own_runner = runner is None
    runner = runner or Runner(tgt, run_config)
    inputs, reference = task.data
    runner.set_data(wl.key, inputs, reference)
    start = time.perf_counter()
    bar = tqdm(total=trials, initial=min(summary.trials, trials), disable=not progress, unit="trial",
               desc=f"{task.name} [{wl.layout}]", dynamic_ncols=True)
    _show(bar, summary, start)
    try:
        while summary.trials < trials:
            if time_limit is not None and time.perf_counter() - start >= time_limit:
                break
            n = min(batch_size, trials - summary.trials)
            batch = search.propose(n, seen, first=not previous and summary.new == 0)
            if not batch:
                bar.write(f"{task.name}: the search space has no unmeasured candidates left")
                break
            for cand, result in _measure(batch, tgt, runner):
                rec = records.make_record(wl, tgt, cand.steps, result, cand.code_hash, search.name, search.seed)
                records.append(log, [rec])
                summary.trials += 1
                summary.new += 1
                summary.errors[result.error] = summary.errors.get(result.error, 0) + 1
                if result.ok and (summary.best is None or result.latency < summary.best_latency):
                    summary.best = rec
                if hasattr(search, "update"):
                    search.update(cand, result)
                bar.update(1)
                _show(bar, summary, start)
            runner.release()
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        summary.seconds = time.perf_counter() - start
        bar.close()
        if own_runner:
            runner.close()
    return summary


def _measure(batch: list, target: Target, runner: Runner):
    """Build the batch (one compiler call per core), then check and time each candidate."""
    built = build_batch([(c.func_name, c.source) for c in batch], target, openmp=any(c.openmp for c in batch))
    for cand, b in zip(batch, built):
        if b.error is not None:
            yield cand, MeasureResult(COMPILE_ERROR, b.error, build_s=b.seconds)
            continue
        result = runner.run(b.lib, b.index)
        result.build_s = b.seconds
        yield cand, result


def measure_candidates(task: Task, batch: list, runner: Runner | None = None) -> list:
    """Measure prepared candidates without a log (used by tests and benchmarks)."""
    own = runner is None
    runner = runner or Runner(task.target)
    try:
        runner.set_data(task.workload.key, *task.data)
        return [r for _, r in _measure(batch, task.target, runner)]
    finally:
        if own:
            runner.close()


def _show(bar, s: TuneSummary, start: float):
    ok = s.errors.get(OK, 0)
    failed = sum(v for k, v in s.errors.items() if k != OK)
    elapsed = time.perf_counter() - start
    rate = 60.0 * s.new / elapsed if elapsed > 0 else 0.0
    best = f"{s.best_latency * 1e3:.3f} ms {s.best_gflops:.1f} GFLOPS" if s.best else "-"
    bar.set_postfix_str(f"valid {ok} failed {failed} best {best} {rate:.0f} cand/min", refresh=False)


__all__ = ["tune_op", "TuneSummary", "measure_candidates", "Candidate", "default_log"]
