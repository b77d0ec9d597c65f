"""ONNX exports of the transformers `tuner` is measured on: Hugging Face BERT-base, ViT-B/16 and GPT-2
(the published configurations, random weights: nothing is downloaded), by torch.onnx.export.

    python -m bench.transformer_models bert_base --seq 128 -o models/bert_base.onnx [--layers 2]

Then tune, compile and time them beside ONNX Runtime:

    tuner tune models/bert_base.onnx --trials 600 --threads 1 --log logs/bert.jsonl
    tuner compile models/bert_base.onnx --log logs/bert.jsonl --threads 1 -o build/bert
    python -m bench.artifacts --model models/bert_base.onnx tuned=build/bert --threads 1,2

Every layer of one model has the same tasks, so a log tuned on a model cut to --layers 2 serves the
whole one. Needs torch, onnxscript and transformers.
"""
from __future__ import annotations

import argparse
import warnings

MODELS = ("bert_base", "vit_b16", "gpt2")


def build(name: str, layers: int | None, seq: int):
    """(module returning the last hidden state, example input, input name)."""
    import torch
    import transformers as tf
    over = {} if layers is None else ({"n_layer": layers} if name == "gpt2" else {"num_hidden_layers": layers})
    if name == "bert_base":
        m, kw, x = tf.BertModel(tf.BertConfig(**over), add_pooling_layer=False), "input_ids", torch.randint(0, 30522, (1, seq))
    elif name == "vit_b16":
        m, kw, x = tf.ViTModel(tf.ViTConfig(**over), add_pooling_layer=False), "pixel_values", torch.randn(1, 3, 224, 224)
    elif name == "gpt2":
        m, kw, x = tf.GPT2Model(tf.GPT2Config(**over)), "input_ids", torch.randint(0, 50257, (1, seq))
    else:
        raise SystemExit(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    m.config.use_cache = False

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(**{kw: x}).last_hidden_state

    return Hidden().eval(), x, kw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--seq", type=int, default=128, help="sequence length (BERT, GPT-2)")
    ap.add_argument("--layers", type=int, help="keep this many layers (default: the published count)")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    import torch
    torch.manual_seed(0)
    module, x, kw = build(args.model, args.layers, args.seq)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), args.out, input_names=[kw], output_names=["last_hidden_state"],
                          opset_version=args.opset, dynamo=True)
    print(f"wrote {args.out}: {args.model}, input {kw} {list(x.shape)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
