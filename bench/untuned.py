"""Before tuning: what `tuner compile` gives with no log of the user's, against ONNX Runtime.

    python -m bench.untuned [--models resnet50,mobilenet_v2] [--threads 1,2] [--quick 8] [--rounds 9]
    TUNER_BENCH_ISA=avx2 python -m bench.untuned ...     # as on an AVX2 host (bench/isa.py)

Each model (a built-in name or an .onnx file) is compiled at each thread count (a) with its default
schedules (`--no-predict --no-shipped`), (b) with the cost model's picks (`--no-shipped`: nothing
measured), (c) with `--quick N` as `tuner compile --quick N` does it (N candidates of each task of the plan
that compile applies measured first, into a fresh log; shipped plans and records as it finds them) and
(d) with the shipped schedules where any apply to this host (a record of another thread count
of its ISA, parallelised, included); then all are timed in one run,
interleaved round by round with ONNX Runtime (default CPU provider, all graph optimisations, the
same thread count; `--fresh`: each turn in a process of its own, as `bench.artifacts --fresh`).
Prints each variant's compile time (for --quick, with its measuring), median latency and ratio to
ONNX Runtime (the median of each round's paired ratio); writes JSON under bench/results/ with the
host.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.artifacts import fresh_interleaved
from bench.cores import Placements, placed
from bench.common import write_results
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios
from tuner.compiler import compile_model
from tuner.graph import load as load_graph
from tuner.model_tuning import quick_tune
from tuner.runtime.artifact import DEFAULT, OTHER_THREADS, PREDICTED, SHIPPED


def variants(model: str, threads: int, quick: int, workdir: Path, target: str = "cpu") -> dict:
    """{name: (compiled model, compile seconds)} of one model at one thread count."""
    out = {}
    for name, kw in (("default", dict(use_shipped=False, predict=False)), ("predicted", dict(use_shipped=False))):
        t = time.perf_counter()
        out[name] = (compile_model(model, target=target, threads=threads, **kw), time.perf_counter() - t)
    if quick:
        log = workdir / f"{Path(model).stem}.t{threads}.quick{quick}.jsonl"
        t = time.perf_counter()
        quick_tune(model, quick, str(log), None, target=target, threads=threads, progress=False)   # as `compile --quick`
        out[f"quick{quick}"] = (compile_model(model, log=str(log), target=target, threads=threads),
                                time.perf_counter() - t)
    t = time.perf_counter()
    shipped = compile_model(model, target=target, threads=threads, predict=False)
    if any(s.source in (SHIPPED, OTHER_THREADS) for s in shipped.steps):
        out["shipped"] = (shipped, time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--quick", type=int, default=8, help="candidates per task for the --quick variant (0: none)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--fresh", action="store_true", help="each turn in a new process (bench.artifacts --fresh)")
    ap.add_argument("--target", default="cpu", help='tuner\'s target, e.g. "cpu -isa=avx2" (default: the host)')
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    result = {"rounds": args.rounds, "quick": args.quick, "fresh": args.fresh, "target": args.target, "rows": []}
    workdir = Path(tempfile.mkdtemp(prefix="bench-untuned-"))
    try:
        for model in args.models.split(","):
            graph = load_graph(model)
            for threads in (int(t) for t in args.threads.split(",")):
                built = variants(model, threads, args.quick, workdir, args.target)
                inputs = next(iter(built.values()))[0].random_inputs(seed=1)
                runners = {name: (lambda ins, m=m: m.run(*ins)) for name, (m, _) in built.items()}
                runners["onnxruntime"] = onnxruntime_runner(graph, threads, model if model.endswith(".onnx") else None)
                place = Placements()
                progress = place.after(lambda s: print(f"  {s}", flush=True))
                if args.fresh:
                    dirs = {name: str(m.save(workdir / f"{Path(model).stem}.t{threads}.{name}"))
                            for name, (m, _) in built.items()}
                    t = fresh_interleaved({**dirs, "onnxruntime": "onnxruntime"}, model, threads, args.rounds, progress)
                else:
                    t = interleaved(runners, inputs, args.rounds, progress=progress)
                ort = statistics.median(t["onnxruntime"])
                print(f"\n{model}, {threads} thread(s), {args.rounds} rounds; ONNX Runtime {ort * 1e3:.2f} ms")
                for name, (m, secs) in built.items():
                    ratios = paired_ratios(t[name], t["onnxruntime"])
                    med, paired, by = statistics.median(t[name]), statistics.median(ratios), place.split(ratios)
                    sources = sorted({s.source if s.source in (DEFAULT, PREDICTED, SHIPPED, OTHER_THREADS) else "log"
                                      for s in m.steps if s.workload_key})
                    print(f"  {name:<10} compile {secs:6.1f} s  {med * 1e3:8.2f} ms  vs ONNX Runtime {paired:.3f}x "
                          f"paired  (schedules: {', '.join(sources)}){placed(by)}")
                    result["rows"].append({"model": model, "threads": threads, "variant": name, "compile_s": secs,
                                           "median_ms": med * 1e3, "onnxruntime_ms": ort * 1e3,
                                           "vs_onnxruntime_paired": paired, "sources": sources,
                                           "rounds_s": t[name], "onnxruntime_rounds_s": t["onnxruntime"],
                                           "rounds_core_ns": place.samples, **({"by_placement": by} if by else {})})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    write_results("untuned", args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
