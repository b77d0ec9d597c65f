"""Winograd against direct convolution on ResNet-50's 3x3 stride-1 convs, on this host.

    python -m bench.winograd [--trials 96] [--direct-log logs/bench/tune/resnet50.joint.3000.jsonl]
                             [--shapes 64x56,128x28,256x14,512x7] [--rounds 7]

For each shape (C = K channels at H = W, bias and ReLU as in ResNet-50) the three Winograd
kernels (ops.winograd: input transform, batched GEMM, output transform) are tuned from an empty
log, --trials each, for F(2x2,3x3) and F(4x4,3x3) (logs under logs/bench/winograd/, --resume keeps
them). The direct convolution is the best record of --direct-log in any layout (what a model tune
found for it). Every kernel's best schedule is then timed again in one run, interleaved round by
round (1 thread, warm, each kernel alone), and the table gives per shape: direct, each Winograd
variant as the sum of its three kernels (and the GEMM alone), and the ratio to direct; and the
whole-model effect: ResNet-50 runs these convs 3, 3, 5 and 2 times (the first block of
stages 2-4 strides), so the time a Winograd choice
would save per inference. Writes JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.common import write_results
from tuner.build import Kernel
from tuner.database import records
from tuner.ops import make, parse_spec
from tuner.target import parse_target
from tuner.task import Task
from tuner.tuning import tune

OCCURS = {(64, 56): 3, (128, 28): 3, (256, 14): 5, (512, 7): 2}     # 3x3 stride-1 convs of ResNet-50's stages
STAGES = ("winograd_input", "winograd_gemm", "winograd_output")


def stage_workloads(c: int, hw: int, m: int) -> list:
    base = dict(H=hw, W=hw, pad=1, m=m)
    return [make("winograd_input", dict(base, C=c)), make("winograd_gemm", dict(base, C=c, K=c)),
            make("winograd_output", dict(base, K=c, bias=1, relu=1))]


def direct_record(log: str, c: int, hw: int, target: str):
    """The fastest logged direct conv of this shape on `target`, in any layout, that replays."""
    want = make("conv2d", dict(C=c, H=hw, W=hw, K=c, R=3, S=3, pad=1, bias=1, relu=1), "NCHW")
    contents = records.load(log, warn=False)
    recs = [r for r in contents.records if r.ok and r.workload.spec == want.spec and r.target == target]
    by_layout: dict = {}
    for r in recs:
        by_layout.setdefault(r.workload.layout, []).append(r)
    best = [records.first_that_replays(sorted(rs, key=lambda r: r.latency)) for rs in by_layout.values()]
    best = [b for b in best if b is not None]
    return (min(best, key=lambda r: r.latency), len(recs)) if best else (None, 0)


def kernel_of(rec, tgt) -> tuple:
    task = Task(parse_spec(rec.workload.spec, rec.workload.layout), tgt)
    k = Kernel(task, rec.steps, rec, None)
    return k, task.workload.random_inputs(seed=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=96, help="trials per Winograd kernel")
    ap.add_argument("--direct-log", default="logs/bench/tune/resnet50.joint.3000.jsonl")
    ap.add_argument("--shapes", default="64x56,128x28,256x14,512x7", help="CxHW list")
    ap.add_argument("--tiles", default="2,4", help="Winograd output tile sizes m")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    tgt = parse_target("cpu", 1)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    tiles = [int(m) for m in args.tiles.split(",") if m]
    logdir = Path("logs/bench/winograd")
    logdir.mkdir(parents=True, exist_ok=True)
    kernels: dict = {}           # label -> (Kernel, inputs)
    rows = []
    for c, hw in shapes:
        rec, n = direct_record(args.direct_log, c, hw, str(tgt))
        if rec is None:
            print(f"{c}x{hw}: no direct record in {args.direct_log} for {tgt}; skipped")
            continue
        row = {"C": c, "HW": hw, "direct_layout": rec.workload.layout, "direct_trials": n, "variants": {}}
        kernels[f"{c}x{hw} direct"] = kernel_of(rec, tgt)
        for m in tiles:
            stage_s = []
            for wl in stage_workloads(c, hw, m):
                log = logdir / f"{wl.op}.C{c}.HW{hw}.m{m}.jsonl"
                if not args.resume:
                    log.unlink(missing_ok=True)
                t0 = time.perf_counter()
                s = tune([wl], target=tgt, trials=args.trials, log=str(log), policy="evolutionary",
                         progress=not args.quiet)
                best = s.tasks[0].best
                if best is None:
                    raise SystemExit(f"{wl.label}: no valid candidate in {args.trials} trials")
                stage_s.append(time.perf_counter() - t0)
                kernels[f"{c}x{hw} m{m} {wl.op}"] = kernel_of(best, tgt)
            row["variants"][m] = {"tuning_s": sum(stage_s)}
        rows.append(row)
    times = {label: [] for label in kernels}
    for r in range(args.rounds):             # interleaved: a slow spell of the machine hits every kernel
        for label, (k, x) in kernels.items():
            times[label].append(statistics.median(k.time(*x, repeat=3, min_repeat_ms=20.0)))
        if not args.quiet:
            print(f"  round {r + 1}/{args.rounds}")
    med = {label: statistics.median(v) for label, v in times.items()}
    print(f"\n{'shape':<9} {'x':>2} {'direct ms':>10} {'layout':>8} " +
          " ".join(f"{f'F({m},3) ms':>11} {'gemm':>7} {'ratio':>6}" for m in tiles) + f" {'saved ms':>9}")
    saved_total = 0.0
    for row in rows:
        c, hw = row["C"], row["HW"]
        d = med[f"{c}x{hw} direct"]
        row["direct_s"] = d
        cells, best = [], d
        for m in tiles:
            parts = {op: med[f"{c}x{hw} m{m} {op}"] for op in STAGES}
            total = sum(parts.values())
            row["variants"][m].update(stages_s=parts, total_s=total, vs_direct=total / d)
            cells.append(f"{total * 1e3:>11.3f} {parts['winograd_gemm'] * 1e3:>7.3f} {total / d:>5.2f}x")
            best = min(best, total)
        occ = OCCURS.get((c, hw), 1)
        row["occurrences"], row["saved_s"] = occ, occ * (d - best)
        saved_total += row["saved_s"]
        print(f"{c}x{hw:<5} {occ:>2} {d * 1e3:>10.3f} {row['direct_layout']:>8} " + " ".join(cells) +
              f" {row['saved_s'] * 1e3:>9.2f}")
    print(f"ResNet-50 per inference: {saved_total * 1e3:.2f} ms less with the faster of direct and Winograd per shape "
          f"(1 thread, kernels timed alone)")
    write_results("winograd", args.out, {"target": str(tgt), "trials_per_kernel": args.trials,
                                         "direct_log": args.direct_log, "rounds_s": times, "rows": rows,
                                         "resnet50_saved_s": saved_total})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
