"""Where `tuner compile --quick N` spends its time: wall seconds of each phase, one model at a time.

    python -m bench.quick_phases [--models resnet50,googlenet] [--quick 8] [--threads 1]

Runs `model_tuning.quick_tune` (what `tuner compile --quick N` runs before it compiles) with an
empty kernel cache of its own (a warm cache hides the compiler), its phase functions wrapped:
proposing, building, measuring (the tune's batches), the heat of front-runners
(`confirm_bests`), the whole-model checks. Phases nest: building and measuring are inside the
tune. Prints a table per model and how many candidates each task measured; writes JSON under
bench/results/ with the host. Nothing else should run meanwhile: these are wall times.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import tempfile
import time
from pathlib import Path

from bench.common import write_results

# (module, attribute, label): the phases timed, outermost first
PHASES = [("tuner.model_tuning", "tune", "tune"),
          ("tuner.tuning", "_Loop._propose", "proposing"),
          ("tuner.measure.runner", "build", "building"),
          ("tuner.tuning", "_Loop._drain_oldest", "measuring"),
          ("tuner.model_tuning", "confirm_bests", "heat"),
          ("tuner.model_tuning", "in_model_defaults", "in-model check"),
          ("tuner.model_tuning", "untuned_check", "untuned check"),
          ("tuner.model_tuning", "padded_checks", "padded checks"),
          ("tuner.model_tuning", "time_choices", "choices timed"),
          ("tuner.model_tuning", "check_plan", "plans checked")]


def _wrap(acc: dict) -> None:
    import importlib
    for mod_name, attr, label in PHASES:
        owner = importlib.import_module(mod_name)
        *path, name = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a, _f=f, _label=label, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                acc[_label] += time.perf_counter() - t
        setattr(owner, name, timed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,googlenet")
    ap.add_argument("--quick", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    acc: dict = collections.defaultdict(float)
    _wrap(acc)
    from tuner.database import records
    from tuner.model_tuning import quick_tune
    rows = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="quick-phases-") as tmp:
            os.environ["TUNER_CACHE_DIR"] = str(Path(tmp) / "cache")
            log = str(Path(tmp) / "quick.jsonl")
            acc.clear()
            t0 = time.perf_counter()
            quick_tune(model, args.quick, log, None, threads=args.threads, progress=False)
            total = time.perf_counter() - t0
            looks = collections.Counter(r.workload.key for r in records.load(log).records if r.trial)
        row = {"model": model, "threads": args.threads, "quick": args.quick, "seconds": total,
               "phases": dict(acc), "tasks": len(looks), "measured": sum(looks.values()),
               "looks": {str(n): k for n, k in sorted(collections.Counter(looks.values()).items())}}
        rows.append(row)
        print(f"\n{model}, --quick {args.quick}, {args.threads} thread(s): {total:.1f} s, {row['tasks']} tasks, "
              f"{row['measured']} measured (tasks by candidates measured: {row['looks']})")
        for _, _, label in PHASES:
            if label in acc:
                print(f"  {label:16s} {acc[label]:7.1f} s")
    write_results("quick_phases", args.out, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
