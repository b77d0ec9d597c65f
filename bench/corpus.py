"""Random-search logs of many workloads: the training corpus of a pre-trained cost model.

Transfer is only as good as the tasks a model has seen: a model trained on few shapes orders a new
shape's schedules worse (bench/cost_model.py, "transfer"). Random search gives an unbiased sample of
each space (a search policy's log would over-represent its favourite schedules). Single thread, no
default schedule seeded in, one log per workload under --log-dir; an interrupted run resumes.

    python -m bench.corpus --workload r50.s2.conv1x1a --workload 'conv2d:N=1,C=32,H=28,W=28,K=192,R=1,S=1'
    python -m bench.corpus --resnet50        # every ResNet-50 layer but issue 3's four benchmark workloads
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.common import SEARCH_WORKLOADS, bench_workload
from tuner.ops import BUILTIN, resolve
from tuner.tuning import tune

# MobileNetV2's pointwise (1x1) convolutions whose channels fit the 16-lane layouts: another
# network's shapes, so a model does not only know ResNet's
MOBILENET_V2_POINTWISE = [f"conv2d:N=1,C={c},H={h},W={h},K={k},R=1,S=1,stride=1,pad=0" for c, h, k in [
    (32, 112, 16), (16, 112, 96), (32, 28, 192), (192, 28, 32), (64, 14, 384), (384, 14, 96), (576, 7, 160),
    (160, 7, 960), (320, 7, 1280)]]


def resnet50_others() -> list:
    """ResNet-50's layers except the benchmark workloads and any layer of the same shape as one."""
    bench = {resolve(n).spec for n in SEARCH_WORKLOADS.split(",")}
    return [n for n in BUILTIN if (n.startswith("r50.") or n.startswith("dense.")) and resolve(n).spec not in bench]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", default=[], help="a built-in name or a spec (repeatable)")
    ap.add_argument("--resnet50", action="store_true", help="add ResNet-50's other layers")
    ap.add_argument("--mobilenet-pointwise", action="store_true", help="add MobileNetV2's 1x1 convolutions")
    ap.add_argument("--trials", type=int, default=512)
    ap.add_argument("--layout", default="NCHW16c")
    ap.add_argument("--log-dir", default="logs/bench/corpus")
    args = ap.parse_args(argv)
    names = args.workload + (resnet50_others() if args.resnet50 else []) + \
        (MOBILENET_V2_POINTWISE if args.mobilenet_pointwise else [])
    if not names:
        ap.error("no workloads: give --workload, --resnet50 or --mobilenet-pointwise")
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    for name in names:
        wl = bench_workload(name, args.layout)
        label = wl.name or f"{wl.op}.{wl.key}"
        log = str(Path(args.log_dir) / f"{label}.random.s0.jsonl")
        t0 = time.perf_counter()
        s = tune([wl], threads=1, trials=args.trials, log=log, policy="random", seed=0, progress=False,
                 start_from_default=False).tasks[0]
        print(f"{label:<28} {s.trials:4d} records, best {s.best_gflops:6.1f} GFLOPS "
              f"({time.perf_counter() - t0:.0f} s) -> {log}", flush=True)


if __name__ == "__main__":
    main()
