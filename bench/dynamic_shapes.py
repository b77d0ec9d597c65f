"""One model compiled for a range of lengths, timed at several lengths beside ONNX Runtime and
beside tuner's own static compile of each length (issue 37).

    python -m bench.dynamic_shapes --export bert_base --range 1..512 --lengths 16,32,64,77,128,200,256,384,512
    python -m bench.dynamic_shapes --export bert_base --batch-axis --dynamic "input_ids=[1..8]x128" \
        --shapes 1x128,2x128,3x128,4x128,8x128
    python -m bench.dynamic_shapes --model M.onnx --log DYNAMIC_TUNE.jsonl --tune-static 1000 --static-log S.jsonl
    python -m bench.dynamic_shapes --torchvision resnet50 --dynamic "input=1x3x[224..512:32]x[224..512:32]" \
        --shapes 1x3x224x224,1x3x320x480,1x3x512x512

--export writes a Hugging Face BertModel (its published configuration, random weights) exported by
torch.onnx.export with a dynamic sequence axis (--batch-axis: and a dynamic batch axis); or give
--model FILE.onnx and --input NAME; --torchvision NAME exports that torchvision CNN (random weights)
with dynamic batch, height and width axes on its input `input`. At each length (or --shapes) the dynamic artifact (compiled for
--range, or for the ranges of --dynamic), the static compile of that shape (--no-static: none) and
ONNX Runtime (all graph optimisations, the dynamic ONNX file) run interleaved, round by round;
prints medians, paired ratios, their geomean over the shapes, compile times and the arena; writes
JSON under bench/results/. --tune-static first tunes the model at each shape on its own, timed, so
that the static compiles are tuned ones and the tuning time a dynamic tune replaces is measured.
"""
from __future__ import annotations

import argparse
import importlib
import math
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import write_results
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios
from tuner.graph import load as load_graph
from tuner.model_tuning import tune_model

EXPORTS = {"bert_base": lambda tf: tf.BertModel(tf.BertConfig()), "gpt2": lambda tf: tf.GPT2Model(tf.GPT2Config())}


def export(name: str, path: Path, batch_axis: bool = False) -> Path:
    """The Hugging Face model `name` with random weights, exported with a dynamic sequence axis (and
    a dynamic batch axis)."""
    if path.exists():
        return path
    import torch
    import transformers as tf
    torch.manual_seed(0)
    m = EXPORTS[name](tf)
    m.eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(input_ids=x).last_hidden_state

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(Hidden(), (torch.randint(0, 100, (1, 128)),), str(path), input_names=["input_ids"],
                      output_names=["out"], opset_version=14,
                      dynamic_axes={k: {**({0: "batch"} if batch_axis else {}), 1: "seq"} for k in ("input_ids", "out")},
                      dynamo=False)
    return path


def export_cnn(name: str, path: Path) -> Path:
    """torchvision's `name` (random weights and BatchNorm statistics) exported with dynamic batch,
    height and width axes on its input."""
    if path.exists():
        return path
    from bench.torchvision_sweep import _torchvision, export_net
    torch, models = _torchvision()
    torch.manual_seed(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    return export_net(torch, models.get_model(name, weights=None), (1, 3, 224, 224), path,
                      dynamic_axes={"input": {0: "batch", 2: "height", 3: "width"}})


def _feeds(path: Path, name: str, shape: list) -> list:
    """A random input of `shape` for the model's input `name`: token ids where it takes integers."""
    import onnx
    from onnx import TensorProto
    [inp] = [i for i in onnx.load(str(path), load_external_data=False).graph.input if i.name == name]
    rng = np.random.default_rng(math.prod(shape))
    if inp.type.tensor_type.elem_type == TensorProto.FLOAT:
        return [rng.standard_normal(shape).astype(np.float32)]
    return [rng.integers(0, 100, shape).astype(np.int64)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", choices=sorted(EXPORTS), help="export this Hugging Face model (random weights)")
    ap.add_argument("--torchvision", metavar="NAME", help="export this torchvision CNN with dynamic image axes")
    ap.add_argument("--model", help="an ONNX file with a dynamic axis (default with --export: under ~/.cache/tuner)")
    ap.add_argument("--input", default="input_ids", help="the input whose last dim varies")
    ap.add_argument("--range", default="1..512", help="the range of lengths compiled for, LO..HI")
    ap.add_argument("--lengths", default="16,32,64,77,128,200,256,384,512")
    ap.add_argument("--batch-axis", action="store_true", help="with --export: a dynamic batch axis too")
    ap.add_argument("--dynamic", help="the ranges compiled for, as tuner compile --dynamic takes them "
                                      "(default: INPUT=1x[RANGE])")
    ap.add_argument("--shapes", help="the input shapes timed, e.g. 1x128,4x128 (default: 1xLENGTH for each length)")
    ap.add_argument("--threads", default="1", help="thread counts, e.g. 1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--log", action="append", help="tuning logs both compiles take records from")
    ap.add_argument("--no-static", action="store_true", help="do not compile and time each length statically")
    ap.add_argument("--static-log", help="the log the static compiles take records from (default: --log)")
    ap.add_argument("--tune-static", type=int, metavar="TRIALS",
                    help="first tune the model at each shape on its own (tuner tune --input-shape, TRIALS each) "
                         "into --static-log, timed: the per-shape tunes a dynamic tune replaces")
    ap.add_argument("--untuned", action="store_true", help="with --log: also time the dynamic compile without it")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=LOG",
                    help="also time the dynamic compile from LOG (another tune of the range), reported as NAME")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    cache = Path.home() / ".cache" / "tuner" / "bench"
    path = Path(args.model) if args.model else cache / f"{args.torchvision}_dynamic_image.onnx" if args.torchvision \
        else cache / f"{args.export}_dynamic{'_batch' * args.batch_axis}.onnx"
    if args.torchvision:
        args.input = "input"
        export_cnn(args.torchvision, path)
    elif args.export:
        export(args.export, path, args.batch_axis)
    lo, hi = (int(x) for x in args.range.split(".."))
    spec = args.dynamic or f"{args.input}=1x[{lo}..{hi}]"
    shapes = [[int(d) for d in x.split("x")] for x in args.shapes.split(",")] if args.shapes else \
        [[1, int(n)] for n in args.lengths.split(",")]
    compile_model = importlib.import_module("tuner.compiler.compile_model").compile_model
    result = {"model": str(path), "dynamic": spec, "shapes": shapes, "rounds": args.rounds, "rows": [],
              "summary": [], "compile": [], "static_tunes": []}
    static_log = args.static_log or args.log
    if args.tune_static and not args.static_log:
        ap.error("--tune-static needs --static-log, the log the per-shape tunes write")
    for threads in (int(t) for t in args.threads.split(",")):
        for shape in shapes if args.tune_static else []:
            t0 = time.perf_counter()
            tune_model(str(path), args.tune_static, log=static_log, threads=threads,
                       input_shapes={args.input: shape}, progress=False)
            result["static_tunes"].append({"threads": threads, "shape": shape, "trials": args.tune_static,
                                           "tune_s": time.perf_counter() - t0})
            print(f"static tune {'x'.join(map(str, shape))}, {threads} thread(s): "
                  f"{result['static_tunes'][-1]['tune_s'] / 60:.1f} min", flush=True)
        if args.tune_static:
            mine = [t["tune_s"] for t in result["static_tunes"] if t["threads"] == threads]
            print(f"static tunes together, {threads} thread(s): {sum(mine) / 60:.1f} min", flush=True)
        t0 = time.perf_counter()
        dyn = compile_model(str(path), log=args.log, threads=threads, dynamic=spec)
        dyn_s = time.perf_counter() - t0
        versions = [v["upto"] for st in dyn.steps for v in st.versions]
        tuned_at = [v["bucket"] for st in dyn.steps for v in st.versions]
        result["compile"].append({"threads": threads, "artifact": "dynamic", "compile_s": dyn_s,
                                  "arena_mib": dyn.arena_bytes / 2**20, "bucket_versions": len(versions),
                                  "steps_with_versions": sum(bool(st.versions) for st in dyn.steps),
                                  "versions_per_bucket": {str(b): tuned_at.count(b) for b in sorted(set(tuned_at))},
                                  "versions_by_end": {str(b): versions.count(b) for b in sorted(set(versions))}})
        print(f"dynamic compile, {threads} thread(s): {dyn_s:.1f} s, arena {dyn.arena_bytes / 2**20:.1f} MiB at the "
              f"bound; bucket versions by the largest value each serves {result['compile'][-1]['versions_by_end'] or 'none'}")
        untuned = compile_model(str(path), threads=threads, dynamic=spec) if args.untuned and args.log else None
        others = {name: compile_model(str(path), log=[log], threads=threads, dynamic=spec)
                  for name, log in (a.split("=", 1) for a in args.also)}
        ort = None
        for shape in shapes:
            n = "x".join(map(str, shape))
            ids = _feeds(path, args.input, shape)
            if ort is None:
                ort = onnxruntime_runner(load_graph(str(path), {args.input: shape}), threads, str(path))
            runners = {"dynamic": lambda ins: dyn.run(*ins)}
            if untuned is not None:
                runners["dynamic_untuned"] = lambda ins: untuned.run(*ins)
            for name, other in others.items():
                runners[name] = lambda ins, m=other: m.run(*ins)
            if not args.no_static:
                t0 = time.perf_counter()
                static = compile_model(str(path), log=static_log, threads=threads, input_shapes={args.input: shape})
                result["compile"].append({"threads": threads, "artifact": f"static {n}",
                                          "compile_s": time.perf_counter() - t0, "arena_mib": static.arena_bytes / 2**20})
                runners["static"] = lambda ins, m=static: m.run(*ins)
            runners["onnxruntime"] = ort
            want = ort(ids)[0]
            got = dyn.run(*ids)[0]
            err = float(np.abs(got - want).max())
            t = interleaved(runners, ids, args.rounds)
            med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
            row = {"threads": threads, "shape": shape, **{f"{k}_ms": v for k, v in med.items()},
                   "dynamic_vs_onnxruntime": statistics.median(paired_ratios(t["dynamic"], t["onnxruntime"])),
                   "max_abs_diff": err}
            if "dynamic_untuned" in t:
                row["dynamic_vs_untuned"] = statistics.median(paired_ratios(t["dynamic"], t["dynamic_untuned"]))
            for name in others:
                row[f"dynamic_vs_{name}"] = statistics.median(paired_ratios(t["dynamic"], t[name]))
            if "static" in t:
                row["static_vs_onnxruntime"] = statistics.median(paired_ratios(t["static"], t["onnxruntime"]))
                row["dynamic_vs_static"] = statistics.median(paired_ratios(t["dynamic"], t["static"]))
            result["rows"].append(row)
            print(f"  {threads}t {n:>7}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items())
                  + f"; dynamic/ORT {row['dynamic_vs_onnxruntime']:.3f}x"
                  + (f", static/ORT {row['static_vs_onnxruntime']:.3f}x, dynamic/static {row['dynamic_vs_static']:.3f}x"
                     if "static" in t else "")
                  + (f", dynamic/untuned {row['dynamic_vs_untuned']:.3f}x" if "dynamic_untuned" in t else "")
                  + "".join(f", dynamic/{name} {row[f'dynamic_vs_{name}']:.3f}x" for name in others)
                  + f" (max |diff| {err:.1e})", flush=True)
        mine = [r for r in result["rows"] if r["threads"] == threads]
        summary = {"threads": threads, "geomean_dynamic_vs_onnxruntime": _geomean(r["dynamic_vs_onnxruntime"] for r in mine),
                   "worst_dynamic_vs_onnxruntime": max(r["dynamic_vs_onnxruntime"] for r in mine)}
        if any("dynamic_vs_untuned" in r for r in mine):
            summary["geomean_dynamic_vs_untuned"] = _geomean(r["dynamic_vs_untuned"] for r in mine)
        for name in others:
            summary[f"geomean_dynamic_vs_{name}"] = _geomean(r[f"dynamic_vs_{name}"] for r in mine)
        if not args.no_static:
            summary["geomean_dynamic_vs_static"] = _geomean(r["dynamic_vs_static"] for r in mine)
            summary["geomean_static_vs_onnxruntime"] = _geomean(r["static_vs_onnxruntime"] for r in mine)
        result["summary"].append(summary)
        print(f"{threads} thread(s): " + ", ".join(f"{k} {v:.3f}" for k, v in summary.items() if k != "threads"))
    write_results("dynamic_shapes", args.out, result)
    return 0


def _geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


if __name__ == "__main__":
    raise SystemExit(main())
