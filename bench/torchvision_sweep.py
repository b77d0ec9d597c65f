"""Every architecture torchvision has, as a user brings it: exported, compiled untuned, checked, timed.

    pip install torchvision            # the build matching the installed torch; not a dependency of tuner
    python -m bench.torchvision_sweep [--models squeezenet1_1,densenet121,...] [--threads 1] [--rounds 5] [--dynamo]
                                      [--target "cpu -isa=avx2"]   # another ISA's code where the host runs it

Each model is built with random weights (and random BatchNorm statistics, so that folding them
means something), exported by `torch.onnx.export` (opset 17, batch 1; `--dynamo`: torch's dynamo exporter, opset 18), imported and compiled with
no log of the user's (`tuner compile model.onnx`: shipped records where any apply, else defaults),
run on one random input against ONNX Runtime on the same file (max error over the output's
range; where that is over 1e-4, also ONNX Runtime's own error with its graph optimisations off, which
tells a model whose random weights make its output depend on rounding order from a wrong kernel), and
timed interleaved with ONNX Runtime at the same thread count. A model that does not
import, compile or match is a row with its error, not the end of the sweep. Prints a table,
writes JSON under bench/results/ with the host.
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from bench.common import write_results

# torchvision's size per model where it is not 224 (its weights' transforms); a video model takes 16 frames
SIZES = {"inception_v3": 299, "r3d_18": 112, "mc3_18": 112, "r2plus1d_18": 112}
DEFAULT = ("squeezenet1_1,shufflenet_v2_x1_0,mnasnet1_0,mobilenet_v3_large,efficientnet_b0,efficientnet_v2_s,"
           "densenet121,inception_v3,resnext50_32x4d,wide_resnet50_2,regnet_x_400mf,regnet_y_800mf,convnext_tiny,"
           "alexnet,vgg11_bn,swin_t,vit_b_16,maxvit_t")


def _torchvision():
    # a torchvision wheel built for another torch variant (CUDA against a CPU torch) fails to register
    # its detection ops' fake kernels at import; the classification models need none of them
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torch
    import torchvision.models
    return torch, torchvision.models


def export(name: str, path: Path, seed: int = 0, dynamo: bool = False) -> Path:
    torch, models = _torchvision()
    torch.manual_seed(seed)
    builder = models.get_model_builder(name)      # segmentation heads sit on a backbone: no weights for it either
    extra = {"weights_backbone": None} if "weights_backbone" in inspect.signature(builder).parameters else {}
    size = SIZES.get(name, 224)
    clip = (16,) if name in models.list_models(module=models.video) else ()
    return export_net(torch, builder(weights=None, **extra), (1, 3, *clip, size, size), path, dynamo)


def export_net(torch, net, shape: tuple | None, path: Path, dynamo: bool = False, inputs: dict | None = None,
               dynamic_axes: dict | None = None) -> Path:
    """`net` in eval mode with random BatchNorm statistics (so that folding them means something) and no
    constant parameter (a zero head, a norm's ones would hide errors), exported at batch 1 of `shape`
    (one random input), or on `inputs` (name -> tensor, in forward's order); `dynamic_axes` as
    torch.onnx.export takes them (the TorchScript exporter's)."""
    net = net.eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        for p in net.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(torch.empty_like(p).normal_(0, 0.1 if bool(p.flatten()[0]) else 0.02))
    inputs = inputs or {"input": torch.randn(*shape)}
    torch.onnx.export(net, tuple(inputs.values()), str(path), input_names=list(inputs),
                      opset_version=18 if dynamo else 17, dynamo=dynamo, **({"dynamic_axes": dynamic_axes} if dynamic_axes else {}))
    return path


def check(name: str, workdir: Path, threads: int, rounds: int, dynamo: bool = False, export=export,
          feeds=None, target: str = "cpu") -> dict:
    """One row: export (by `export(name, path, dynamo=)`), import, compile, run against ONNX Runtime, time;
    on `feeds(name)` (the inputs in order) where given, else on random inputs."""
    from tuner.compare.peers import onnxruntime_runner
    from tuner.compiler import compile_model
    from tuner.graph import load as load_graph
    row = {"model": name, "threads": threads, "exporter": "dynamo" if dynamo else "torchscript"}
    stage = "export"
    try:
        path = export(name, workdir / f"{name}.onnx", dynamo=dynamo)
        stage = "import"
        graph = load_graph(str(path))
        stage = "compile"
        t = time.perf_counter()
        m = compile_model(str(path), target=target, threads=threads)
        row["compile_s"] = time.perf_counter() - t
        stage = "run"
        inputs = feeds(name) if feeds else m.random_inputs(seed=1)
        ort = onnxruntime_runner(graph, threads, str(path))
        wants, gots = ort(inputs), m.run(*inputs)
        assert len(wants) == len(gots) > 0, (len(wants), len(gots))
        row.update(_errors(wants, gots))
        row["ok"] = bool(row["max_err_over_range"] <= 1e-4 or row["max_err_ulps"] <= 4) \
            and all(float(w.max() - w.min()) > 0 for w in wants)
        if not row["ok"]:       # does ONNX Runtime agree with itself without its fusions (rounding in another order)?
            plain = onnxruntime_runner(graph, threads, str(path), optimize=False)(inputs)
            row["onnxruntime_unfused_err_over_range"] = _errors(wants, plain)["max_err_over_range"]
        if rounds:
            stage = "time"
            row.update(timed(m, ort, inputs, rounds))
    except Exception as e:                      # noqa: BLE001 - a row per model, whatever stops it
        row.update(failed(stage, e))
    return row


def timed(m, ort, inputs: list, rounds: int) -> dict:
    """A row's timing fields: the compiled model `m` and ONNX Runtime's runner interleaved, `rounds` rounds."""
    from tuner.compare.peers import interleaved, paired_ratios
    ts = interleaved({"tuner": lambda ins: m.run(*ins), "onnxruntime": ort}, inputs, rounds)
    return dict(median_ms=statistics.median(ts["tuner"]) * 1e3, onnxruntime_ms=statistics.median(ts["onnxruntime"]) * 1e3,
                vs_onnxruntime_paired=statistics.median(paired_ratios(ts["tuner"], ts["onnxruntime"])))


def failed(stage: str, e: Exception) -> dict:
    """A row's fields where `stage` raised `e`: its type and first line."""
    return {"ok": False, "stage": stage, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}


def _errors(wants: list, gots: list) -> dict:
    errs = [(float(np.abs(np.float64(g) - w).max()), w) for w, g in zip(wants, gots)]
    # also in float32 ulps of the output's largest magnitude: an output of small range far from 0 (a
    # sigmoid head near 0.5) differs from ONNX Runtime's by rounding alone at more than 1e-4 of its range
    return {"max_err_over_range": max(e / (float(w.max() - w.min()) or 1.0) for e, w in errs),
            "max_err_ulps": max(e / float(np.spacing(np.float32(np.abs(w).max()))) for e, w in errs)}


def sweep(names: list, workdir: Path, threads: int, rounds: int, **how) -> list:
    """A row per model (`check(..., **how)`), each printed as it comes, then the count that match."""
    rows, width = [], max(map(len, names)) + 2
    for name in names:
        row = check(name, workdir, threads, rounds, **how)
        rows.append(row)
        if "error" in row:
            print(f"{name:<{width}} FAILED at {row['stage']}: {row['error']}", flush=True)
        else:
            timing = (f"{row['median_ms']:9.2f} ms  ORT {row['onnxruntime_ms']:9.2f} ms  "
                      f"{row['vs_onnxruntime_paired']:.3f}x" if "median_ms" in row else "")
            spread = row.get("onnxruntime_unfused_err_over_range")
            why = f"  (ONNX Runtime unfused differs from itself by {spread:.1e}: ill-conditioned with these " \
                  "weights)" if spread is not None and spread > 1e-4 else ""
            print(f"{name:<{width}} {'ok ' if row['ok'] else 'BAD'} err {row['max_err_over_range']:.1e}  "
                  f"compile {row['compile_s']:5.1f} s  {timing}{why}", flush=True)
    ok = sum(r.get("ok", False) for r in rows)
    print(f"\n{ok} of {len(rows)} models import, compile and match ONNX Runtime (to 1e-4 of the output's range "
          "or 4 float32 ulps of its magnitude)")
    return rows


def sweep_cli(kind: str, doc: str, default: str, argv, add_args, how) -> int:
    """A sweep's command line: --models (default `default`), --threads, --rounds, --target, --out and
    add_args(parser)'s own; how(args) -> (sweep's keywords, options the results record)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", default=default)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds against ONNX Runtime (0: check only)")
    ap.add_argument("--target", default="cpu", help='the compile target, e.g. "cpu -isa=avx2" (default: the host)')
    ap.add_argument("--out")
    add_args(ap)
    args = ap.parse_args(argv)
    kw, options = how(args)
    with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as d:
        rows = sweep(args.models.split(","), Path(d), args.threads, args.rounds, target=args.target, **kw)
    ok = sum(r.get("ok", False) for r in rows)
    write_results(f"{kind}_sweep", args.out, {"threads": args.threads, "rounds": args.rounds, "target": args.target,
                                              **options, "rows": rows})
    return 0 if ok == len(rows) else 1


def main(argv=None) -> int:
    return sweep_cli("torchvision", __doc__, DEFAULT, argv,
                     lambda ap: ap.add_argument("--dynamo", action="store_true",
                                                help="export with torch's dynamo exporter (opset 18)"),
                     lambda args: ({"dynamo": args.dynamo}, {"dynamo": args.dynamo}))


if __name__ == "__main__":
    raise SystemExit(main())
