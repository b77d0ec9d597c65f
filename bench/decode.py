"""Decoding with a KV cache: one step of a Hugging Face decoder, compiled once for every past length.

    pip install transformers        # not a dependency of tuner
    python -m bench.decode [--models gpt2,llama,t5,...] [--past 255] [--check 1,2,17,100,255]
                           [--time 16,128,255] [--threads 1,2] [--rounds 7] [--batch 1] [--tokens 1]
                           [--encoder 64] [--keep DIR]

Each decoder of bench.hf_sweep (its library's default configuration cut to --layers layers, random
weights, nothing downloaded) is wrapped as one decoding step: the new token's id, the attention
mask over the past and the new token, and each layer's past keys and values in; the last hidden
state and each layer's keys and values with the new token's appended out. An encoder-decoder's
decoder (SEQ2SEQ: T5, BART, Whisper, ...) is wrapped as Hugging Face Optimum exports it: the new
token's id, each layer's past self-attention keys and values and its cross-attention keys and
values over the encoder's output (computed once per sequence; --encoder long at most, a dynamic axis
too) in, no mask. It is exported by `torch.onnx.export` (TorchScript, opset 17) with the past length
a dynamic axis (and the batch, where --batch is over 1; the new tokens, where --tokens is over 1:
the mask is then [past+seq]), compiled once by `tuner compile --dynamic
"past.0.key=[1..B]xHx[1..PAST]xD; attention_mask=[batch]x[past+1]"` (or `past.0.cross_key=...x[1..ENC]x...`)
with no log, checked against ONNX Runtime on the same file at each --check length (a quarter of the
mask zeros; the batch and the encoder's length cycling through their bound, 1 and a value between),
and timed interleaved with ONNX Runtime at each --time length and thread count, at the batch's and
the encoder's bounds (paired ratios, medians). A model that does not export, compile or match is a
row with its error. Prints a table, writes JSON under bench/results/ with the host.
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
# encoder-decoder -> (model class, configuration class, configuration overrides)
SEQ2SEQ = {"t5": ("T5Model", "T5Config", {}), "bart": ("BartModel", "BartConfig", {}),
           "whisper": ("WhisperModel", "WhisperConfig", {}), "marian": ("MarianModel", "MarianConfig", {}),
           "pegasus": ("PegasusModel", "PegasusConfig", {}), "mbart": ("MBartModel", "MBartConfig", {})}


def _export(step, args: tuple, path: Path, names: list, outs: list, batch: bool, past_dims: dict, tokens: bool) -> None:
    """torch.onnx.export of `step` with the past (and cross) lengths as dynamic axes past_dims
    ({input name: dim_param}), the batch where `batch`, the new tokens where `tokens`."""
    import torch
    first = {0: "batch"} if batch else {}
    seq = {1: "seq"} if tokens else {}
    axes = {n: {**first, **({2: past_dims[n]} if n in past_dims else {})} for n in names}
    axes.update({n: {**first, 2: "total"} for n in outs[1:]}, **{outs[0]: {**first, **seq}, "input_ids": {**first, **seq}})
    if "attention_mask" in names:
        axes["attention_mask"] = {**first, 1: "total"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(step.eval(), args, str(path), input_names=names, output_names=outs,
                          dynamic_axes={n: a for n, a in axes.items() if a}, opset_version=17, dynamo=False)


def export_step(name: str, layers: int, path: Path, batch: int = 1, tokens: int = 1, example_past: int = 7) -> dict:
    """Export one decoding step of `name` to `path`; {"inputs": names, "past": [(heads, dim) per
    cache input], "cross": whether the inputs hold cross-attention keys and values, "vocab": the
    vocabulary's size}."""
    import torch
    import transformers as tf
    torch.manual_seed(0)
    b = 2 if batch > 1 else 1
    if name in SEQ2SEQ:
        model_cls, config_cls, over = SEQ2SEQ[name]
        config = getattr(tf, config_cls)(**over)
        for k in ("num_layers", "encoder_layers"):           # the encoder is not run: one layer of it built
            if hasattr(config, k):
                setattr(config, k, 1)
        for k in ("num_decoder_layers", "decoder_layers"):
            if hasattr(config, k):
                setattr(config, k, layers)
        config._attn_implementation = "eager"
        net = getattr(tf, model_cls)(config).eval().get_decoder()
        with torch.no_grad():
            warm = net(input_ids=torch.randint(0, config.vocab_size, (b, example_past)), use_cache=True,
                       encoder_hidden_states=torch.randn(b, 9, config.d_model)).past_key_values.self_attention_cache
    else:
        net, config = network(name, layers, cache=True)
        with torch.no_grad():
            warm = net(input_ids=torch.randint(0, getattr(config, "vocab_size", 1000), (b, example_past)),
                       use_cache=True).past_key_values
    vocab = getattr(config, "vocab_size", 1000)
    shapes = [(t.shape[1], t.shape[3]) for layer in warm.layers for t in (layer.keys, layer.values)]
    count = len(shapes) // 2
    cross = name in SEQ2SEQ
    per = 4 if cross else 2

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, *rest):
            mask, past = (None, rest) if cross else (rest[0], rest[1:])
            cache = tf.DynamicCache()
            for i in range(count):
                cache.update(past[per * i], past[per * i + 1], i)
            if cross:                   # the cross-attention cache filled: the encoder's output is not read
                crossed = tf.DynamicCache()
                for i in range(count):
                    crossed.update(past[per * i + 2], past[per * i + 3], i)
                cache = tf.EncoderDecoderCache(cache, crossed)
                enc = past[2].transpose(1, 2).flatten(2)        # only its shape is read (the encoder's length)
                out = self.net(input_ids=input_ids, encoder_hidden_states=enc, past_key_values=cache, use_cache=True)
                cache = out.past_key_values.self_attention_cache
            else:
                out = self.net(input_ids=input_ids, attention_mask=mask, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
            return (out.last_hidden_state, *(t for layer in cache.layers for t in (layer.keys, layer.values)))

    kinds = ("key", "value", "cross_key", "cross_value") if cross else ("key", "value")
    names = ["input_ids"] + ([] if cross else ["attention_mask"]) + [f"past.{i}.{kv}" for i in range(count) for kv in kinds]
    outs = ["hidden"] + [f"present.{i}.{kv}" for i in range(count) for kv in ("key", "value")]
    ids = torch.randint(0, vocab, (b, 2 if tokens > 1 else 1))
    past = [torch.randn(b, shapes[2 * i + (k % 2)][0], 9 if k >= 2 else example_past, shapes[2 * i + (k % 2)][1])
            for i in range(count) for k in range(per)]
    mask = [] if cross else [torch.ones(b, example_past + ids.shape[1], dtype=torch.int64)]
    past_dims = {n: "enc" if "cross" in n else "past" for n in names if n.startswith("past.")}
    _export(Step(), (ids, *mask, *past), path, names, outs, batch > 1, past_dims, tokens > 1)
    return {"inputs": names, "past": [shapes[2 * i + (k % 2)] for i in range(count) for k in range(per)],
            "cross": cross, "vocab": vocab}


def spec_of(info: dict, past: int, batch: int, encoder: int, tokens: int = 1) -> str:
    """--dynamic of a step: the past (and the encoder's output) lengths, the batch and the new
    tokens where over 1."""
    b, follow = (f"[1..{batch}]", "[batch]") if batch > 1 else ("1", "1")
    first = next(n for n in info["inputs"] if n.startswith("past."))
    h, d = info["past"][0]
    spec = f"{first}={b}x{h}x[1..{past}]x{d}" + (f"; input_ids={follow}x[1..{tokens}]" if tokens > 1 else "")
    if info["cross"]:
        h, d = info["past"][2]
        spec += f"; past.0.cross_key={follow}x{h}x[1..{encoder}]x{d}"
    else:
        spec += f"; attention_mask={follow}x[past+{'seq' if tokens > 1 else 1}]"
    return spec


def feeds(info: dict, past_length: int, seed: int, batch: int = 1, encoder: int = 0, tokens: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    out = {"input_ids": rng.integers(0, info["vocab"], (batch, tokens)).astype(np.int64)}
    if not info["cross"]:
        out["attention_mask"] = np.ones((batch, past_length + tokens), np.int64)
        out["attention_mask"][0, : past_length // 4] = 0          # a left-padded prompt
    for name, (h, d) in zip([n for n in info["inputs"] if n.startswith("past.")], info["past"]):
        out[name] = rng.standard_normal((batch, h, encoder if "cross" in name else past_length, d)).astype(np.float32)
    return out


def row_for(name: str, args, workdir: Path) -> list:
    """A row per thread count: compiled once for 1..args.past, checked at args.check, timed at args.time."""
    import onnxruntime
    from tuner.compare.peers import interleaved, paired_ratios
    from tuner.compiler import compile_model
    rows, stage = [], "export"
    try:
        path = workdir / f"{name}_step.onnx"
        info = export_step(name, args.layers, path, args.batch, args.tokens)
        spec = spec_of(info, args.past, args.batch, args.encoder, args.tokens)
        cycle = [(args.batch, args.encoder, args.tokens), (1, 1, 1),
                 (max(1, args.batch // 2), args.encoder // 3 + 1, args.tokens // 2 + 1)]
        checks = [(p, *cycle[k % len(cycle)]) for k, p in enumerate(args.check)]
        for threads in args.threads:
            row = {"model": name, "threads": threads, "dynamic": spec, "batch": args.batch, "tokens": args.tokens,
                   **({"encoder": args.encoder} if info["cross"] else {})}
            stage = "compile"
            t0 = time.perf_counter()
            m = compile_model(str(path), threads=threads, dynamic=spec)
            row["compile_s"] = time.perf_counter() - t0
            stage = "run"
            opts = onnxruntime.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
            ort = onnxruntime.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            errs = {}
            for p, b, e, n in checks:
                f = feeds(info, p, p, b, e, n)
                wants, gots = ort.run(None, f), m.run(**f)
                assert len(wants) == len(gots) > 1 and all(w.shape == g.shape for w, g in zip(wants, gots))
                at = f"{p}" + (f" b{b}" if args.batch > 1 else "") + (f" e{e}" if info["cross"] else "") + \
                    (f" s{n}" if args.tokens > 1 else "")
                errs[at] = _errors(wants, gots)["max_err_over_range"]
            row.update(ok=max(errs.values()) <= 1e-4, max_err_over_range=errs, times={})
            stage = "time"
            for p in args.time if args.rounds else ():
                f = feeds(info, p, p, args.batch, args.encoder, args.tokens)
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
    ap.add_argument("--batch", type=int, default=1, help="compile for batches 1..BATCH (timed at BATCH)")
    ap.add_argument("--encoder", type=int, default=64, help="an encoder-decoder's longest encoder output (timed at it)")
    ap.add_argument("--tokens", type=int, default=1, help="compile for steps of 1..TOKENS new tokens (timed at TOKENS)")
    ap.add_argument("--keep", help="keep the exported .onnx files in this directory")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    names = args.models.split(",")
    if unknown := [n for n in names if n not in SEQ2SEQ and (n not in MODELS or MODELS[n][2] != "text")]:
        ap.error(f"unknown --models {', '.join(unknown)}: choose from {', '.join(DECODERS + tuple(SEQ2SEQ))}")
    if min(args.batch, args.encoder, args.tokens) < 1:
        ap.error("--batch, --encoder and --tokens must be 1 or more")
    args.check, args.time = ([int(x) for x in v.split(",")] for v in (args.check, args.time))
    args.threads = [int(x) for x in args.threads.split(",")]
    if not all(1 <= p <= args.past for p in args.check + args.time):
        ap.error(f"--check and --time lengths must lie in 1..--past ({args.past})")
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        d = Path(args.keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        rows = [r for n in names for r in row_for(n, args, d)]
    write_results("decode", args.out, {"layers": args.layers, "past": args.past, "batch": args.batch, "tokens": args.tokens,
                                       "encoder": args.encoder, "check": args.check,
                                       "time": args.time, "rounds": args.rounds, "rows": rows})
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
