"""Decoding with a KV cache: one step of a Hugging Face decoder, compiled once for every past length.

    pip install transformers        # not a dependency of tuner
    python -m bench.decode [--models gpt2,llama,...] [--past 255] [--check 1,2,17,100,255]
                           [--time 16,128,255] [--threads 1,2] [--rounds 7] [--keep DIR]

Each decoder of bench.hf_sweep (its library's default configuration cut to --layers layers, random
weights, nothing downloaded) is wrapped as one decoding step: the new token's id, the attention
mask over the past and the new token, and each layer's past keys and values in; the last hidden
state and each layer's keys and values with the new token's appended out. It is exported by
`torch.onnx.export` (TorchScript, opset 17) with the past length a dynamic axis, compiled once by
`tuner compile --dynamic "past.0.key=1xHx[1..PAST]xD; attention_mask=1x[past+1]"` with no log,
checked against ONNX Runtime on the same file at each --check length (a quarter of the mask zeros),
and timed interleaved with ONNX Runtime at each --time length and thread count (paired ratios,
medians). A model that does not export, compile or match is a row with its error. Prints a table,
writes JSON under bench/results/ with the host.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench.common import write_results
from bench.hf_sweep import MODELS, network
from bench.torchvision_sweep import _errors, failed

DECODERS = ("gpt2", "opt", "bloom", "llama", "mistral", "qwen2", "phi", "gemma", "falcon", "gpt_neox", "qwen3")


def export_step(name: str, layers: int, path: Path, example_past: int = 7) -> dict:
    """Export one decoding step of `name` to `path`; {"inputs": names, "past": [(heads, dim) per
    cache input], "vocab": the vocabulary's size}."""
    import torch
    import transformers as tf
    torch.manual_seed(0)
    net, config = network(name, layers, cache=True)
    vocab = getattr(config, "vocab_size", 1000)
    with torch.no_grad():
        warm = net(input_ids=torch.randint(0, vocab, (1, example_past)), use_cache=True).past_key_values
    shapes = [(t.shape[1], t.shape[3]) for layer in warm.layers for t in (layer.keys, layer.values)]
    count = len(shapes) // 2

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask, *past):
            cache = tf.DynamicCache()
            for i in range(count):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.net(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            return (out.last_hidden_state, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)))

    names = ["input_ids", "attention_mask"] + [f"past.{i}.{kv}" for i in range(count) for kv in ("key", "value")]
    outs = ["hidden"] + [f"present.{i}.{kv}" for i in range(count) for kv in ("key", "value")]
    ids = torch.randint(0, vocab, (1, 1))
    mask = torch.ones(1, example_past + 1, dtype=torch.int64)
    past = [torch.randn(1, h, example_past, d) for h, d in shapes]
    axes = {"attention_mask": {1: "total"}, **{n: {2: "past"} for n in names[2:]}, **{n: {2: "total"} for n in outs[1:]}}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step().eval(), (ids, mask, *past), str(path), input_names=names, output_names=outs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return {"inputs": names, "past": shapes, "vocab": vocab}


def feeds(info: dict, past_length: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {"input_ids": rng.integers(0, info["vocab"], (1, 1)).astype(np.int64),
           "attention_mask": np.ones((1, past_length + 1), np.int64)}
    out["attention_mask"][0, : past_length // 4] = 0          # a left-padded prompt
    for name, (h, d) in zip(info["inputs"][2:], info["past"]):
        out[name] = rng.standard_normal((1, h, past_length, d)).astype(np.float32)
    return out


def row_for(name: str, args, workdir: Path) -> list:
    """A row per thread count: compiled once for 1..args.past, checked at args.check, timed at args.time."""
    import onnxruntime
    from tuner.compare.peers import interleaved, paired_ratios
    from tuner.compiler import compile_model
    rows, stage = [], "export"
    try:
        path = workdir / f"{name}_step.onnx"
        info = export_step(name, args.layers, path)
        h, d = info["past"][0]
        spec = f"{info['inputs'][2]}=1x{h}x[1..{args.past}]x{d}; attention_mask=1x[past+1]"
        for threads in args.threads:
            row = {"model": name, "threads": threads, "dynamic": spec}
            stage = "compile"
            t0 = time.perf_counter()
            m = compile_model(str(path), threads=threads, dynamic=spec)
            row["compile_s"] = time.perf_counter() - t0
            stage = "run"
            opts = onnxruntime.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
            ort = onnxruntime.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            errs = {}
            for p in args.check:
                f = feeds(info, p, p)
                wants, gots = ort.run(None, f), m.run(**f)
                assert len(wants) == len(gots) > 1 and all(w.shape == g.shape for w, g in zip(wants, gots))
                errs[p] = _errors(wants, gots)["max_err_over_range"]
            row.update(ok=max(errs.values()) <= 1e-4, max_err_over_range=errs, times={})
            stage = "time"
            for p in args.time if args.rounds else ():
                f = feeds(info, p, p)
                ts = interleaved({"tuner": lambda fs: m.run(**fs), "onnxruntime": lambda fs: ort.run(None, fs)}, f,
                                 args.rounds)
                row["times"][p] = {"tuner_ms": statistics.median(ts["tuner"]) * 1e3,
                                   "onnxruntime_ms": statistics.median(ts["onnxruntime"]) * 1e3,
                                   "vs_onnxruntime_paired": statistics.median(paired_ratios(ts["tuner"], ts["onnxruntime"]))}
            rows.append(row)
            print(f"{name:9} {threads}t ok={row['ok']} max err {max(errs.values()):.1e}  compile {row['compile_s']:.1f} s  "
                  + "  ".join(f"P={p}: {t['tuner_ms']:.3f} vs {t['onnxruntime_ms']:.3f} ms "
                              f"({t['vs_onnxruntime_paired']:.3f}x)" for p, t in row["times"].items()), flush=True)
    except Exception as e:                      # noqa: BLE001 - a row per model, whatever stops it
        rows.append({"model": name, **failed(stage, e)})
        print(f"{name:9} FAILED at {stage}: {rows[-1]['error']}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DECODERS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--past", type=int, default=255, help="the longest past compiled for")
    ap.add_argument("--check", default="1,2,17,100,255", help="past lengths checked against ONNX Runtime")
    ap.add_argument("--time", default="16,128,255", help="past lengths timed against ONNX Runtime")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7, help="timing rounds (0: check only)")
    ap.add_argument("--keep", help="keep the exported .onnx files in this directory")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    names = args.models.split(",")
    if unknown := [n for n in names if n not in MODELS or MODELS[n][2] != "text"]:
        ap.error(f"unknown --models {', '.join(unknown)}: choose from {', '.join(DECODERS)}")
    args.check, args.time = ([int(x) for x in v.split(",")] for v in (args.check, args.time))
    args.threads = [int(x) for x in args.threads.split(",")]
    if not all(1 <= p <= args.past for p in args.check + args.time):
        ap.error(f"--check and --time lengths must lie in 1..--past ({args.past})")
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        d = Path(args.keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        rows = [r for n in names for r in row_for(n, args, d)]
    write_results("decode", args.out, {"layers": args.layers, "past": args.past, "check": args.check,
                                       "time": args.time, "rounds": args.rounds, "rows": rows})
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
