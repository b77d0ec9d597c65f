"""Sampled CUDA kernels of every operator, their CUDA C run on the CPU thread by thread
(codegen/cuda_emulate.py) in thread order and reversed, against the NumPy reference: how many
are wrong, out of bounds, misaligned or meet different barriers. No GPU needed; not a timing.

    python -m bench.cuda_emulation                    # 25 samples of each of 15 workloads
    python -m bench.cuda_emulation --samples 50 --seed 3
"""
from __future__ import annotations

import argparse
import random
import time

from bench.common import write_results
from tuner.codegen.cuda_emulate import build_emulation, emulate, small_workloads
from tuner.measure.worker import check_output
from tuner.ops import make
from tuner.target import parse_target
from tuner.task import Task

# the tests' small set, then a few larger kernels and a layout transform
WORKLOADS = small_workloads() + [
    make("conv2d", dict(C=32, H=14, W=14, K=32, R=3, S=3, pad=1, bias=1, relu=1), "NCHW"),
    make("conv2d", dict(C=32, H=14, W=14, K=32, R=3, S=3, pad=1), "NHWC"),
    make("conv2d", dict(C=32, H=7, W=7, K=64, R=1, S=1), "NCHW16c"),
    make("dense", dict(N=16, C=64, K=64, bias=1)),
    make("layout_transform", dict(C=16, H=6, W=6, dst="NHWC"), "NCHW"),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    target = parse_target(f"cuda -arch={args.arch}")
    t0, rows, faults = time.perf_counter(), [], []
    print(f"{'workload':<70} {'kernels':>7} {'runs':>5} {'faults':>6}")
    for wl in WORKLOADS:
        task, rng = Task(wl, target), random.Random(args.seed)
        kernels = [task.candidate(task.space.steps(task.space.sample(rng))).launch for _ in range(args.samples)]
        lib = build_emulation(kernels)
        inputs, ref = task.data
        bad = 0
        for i, k in enumerate(kernels):
            for reverse in (False, True):
                out, err = emulate(lib, i, k, inputs, ref.shape, reverse)
                problem = err or check_output(out, ref, 1e-3, 1e-4)
                if problem:
                    bad += 1
                    faults.append({"workload": wl.label, "grid": k.grid, "block": k.block, "reverse": reverse,
                                   "problem": problem, "source": k.source})
        rows.append({"workload": wl.label, "kernels": len(kernels), "runs": 2 * len(kernels), "faults": bad})
        print(f"{wl.label[:70]:<70} {len(kernels):>7} {2 * len(kernels):>5} {bad:>6}", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("kernels", "runs", "faults")}
    seconds = time.perf_counter() - t0
    print(f"{'all':<70} {total['kernels']:>7} {total['runs']:>5} {total['faults']:>6}   ({seconds:.1f} s)")
    write_results("cuda-emulation", args.out, {"args": vars(args), "target": str(target), "rows": rows,
                                               "total": total, "seconds": seconds, "faults": faults})


if __name__ == "__main__":
    main()
