"""torchvision's CNNs compiled once for a range of image sizes, checked and timed at several sizes.

    pip install torchvision            # the build matching the installed torch; not a dependency of tuner
    python -m bench.dynamic_images [--models resnet50,mobilenet_v2,...] [--range 224..512:32]
                                   [--sizes 224x224,320x480,512x512] [--threads 1] [--rounds 5]

Each model (random weights and BatchNorm statistics) is exported by torch.onnx.export with dynamic
batch, height and width axes, compiled once with no log for `--dynamic "input=1x3x[RANGE]x[RANGE]"`
(an image size in steps of the model's total stride), run at each size against ONNX Runtime on the
same file (max error over the output's range), and timed interleaved with it at the same thread
count. A model that does not export, compile or match is a row with its error, not the end of the
sweep. Prints a table, writes JSON under bench/results/ with the host.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import write_results
from bench.dynamic_shapes import export_cnn
from bench.torchvision_sweep import _errors, failed, timed

DEFAULT = "resnet50,mobilenet_v2,googlenet,efficientnet_b0,regnet_y_800mf,densenet121,convnext_tiny,squeezenet1_1"


def check(name: str, workdir: Path, spec: str, sizes: list, threads: int, rounds: int) -> list:
    """Rows of one model, one per size (or one row with the error that stopped it)."""
    from tuner.compare.peers import onnxruntime_runner
    from tuner.graph import load as load_graph
    compile_model = importlib.import_module("tuner.compiler.compile_model").compile_model
    stage = "export"
    try:
        path = export_cnn(name, workdir / f"{name}.onnx")
        stage = "compile"
        t = time.perf_counter()
        m = compile_model(str(path), threads=threads, dynamic=spec)
        compile_s = time.perf_counter() - t
    except Exception as e:                      # noqa: BLE001 - a row per model, whatever stops it
        return [{"model": name, "threads": threads, **failed(stage, e)}]
    rows = []
    for h, w in sizes:
        row = {"model": name, "threads": threads, "size": [h, w], "compile_s": compile_s,
               "winograd_convs": len(m.meta.get("layout_plan", {}))}
        stage = "run"
        try:
            x = [np.random.default_rng(h * 1000 + w).standard_normal((1, 3, h, w)).astype(np.float32)]
            ort = onnxruntime_runner(load_graph(str(path), {"input": [1, 3, h, w]}), threads, str(path))
            wants, gots = ort(x), m.run(*x)
            row.update(_errors(wants, gots))
            row["ok"] = bool(row["max_err_over_range"] <= 1e-4 or row["max_err_ulps"] <= 4)
            if rounds:
                stage = "time"
                row.update(timed(m, ort, x, rounds))
        except Exception as e:                  # noqa: BLE001
            row.update(failed(stage, e))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--range", default="224..512:32", help="the image sizes compiled for, LO..HI:STEP")
    ap.add_argument("--sizes", default="224x224,320x480,512x512", help="the sizes checked and timed, HxW,...")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds against ONNX Runtime (0: check only)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    spec = f"input=1x3x[{args.range}]x[{args.range}]"
    sizes = [tuple(int(d) for d in s.split("x")) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            mine = check(name, Path(tmp), spec, sizes, args.threads, args.rounds)
            rows += mine
            for r in mine:
                if "error" in r:
                    print(f"{name:<20} {'x'.join(map(str, r.get('size', []))):>8} FAILED at {r['stage']}: {r['error']}",
                          flush=True)
                    continue
                timing = (f"{r['median_ms']:9.2f} ms  ORT {r['onnxruntime_ms']:9.2f} ms  {r['vs_onnxruntime_paired']:.3f}x"
                          if "median_ms" in r else "")
                print(f"{name:<20} {r['size'][0]:>4}x{r['size'][1]:<4} {'ok ' if r['ok'] else 'BAD'} err "
                      f"{r['max_err_over_range']:.1e}  compile {r['compile_s']:5.1f} s  {timing}", flush=True)
    models = {r["model"] for r in rows}
    good = {n for n in models if all(r.get("ok") for r in rows if r["model"] == n)}
    print(f"\n{len(good)} of {len(models)} models compile once for {spec} and match ONNX Runtime at every size "
          "checked (to 1e-4 of the output's range or 4 float32 ulps of its magnitude)")
    ratios = [r["vs_onnxruntime_paired"] for r in rows if "vs_onnxruntime_paired" in r]
    if ratios:
        print(f"tuner / ONNX Runtime at {args.threads} thread(s): median {statistics.median(ratios):.3f}x, "
              f"{min(ratios):.3f}-{max(ratios):.3f}x")
    write_results("dynamic_images", args.out, {"dynamic": spec, "sizes": sizes, "threads": args.threads,
                                                "rounds": args.rounds, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
