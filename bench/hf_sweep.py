"""Hugging Face architectures as a user brings them: exported, compiled untuned, checked, timed.

    pip install transformers onnxscript     # not dependencies of tuner
    python -m bench.hf_sweep [--models bert,llama,...] [--mask] [--layers 2] [--threads 1] [--rounds 5] [--torchscript]
                             [--target "cpu -isa=avx2"]   # another ISA's code where the host runs it

Each model is built from its library's default configuration (cut to --layers layers) with random
weights, nothing downloaded; its parameters that init leaves constant (norms' ones, zero biases) get
noise so that a wrong normalisation or bias shows. It is exported by `torch.onnx.export` (dynamo,
opset 18; `--torchscript`: the TorchScript exporter, opset 17) with batch 1, sequence --seq (224x224
images), `--mask` adding the attention mask as a second input, then imported and compiled with no
log of the user's, run on one random input against ONNX Runtime on the same file (max error over
the output's range), and timed interleaved with ONNX Runtime at the same thread count. A model that
does not export, import, compile or match is a row with its error, not the end of the sweep.
Prints a table, writes JSON under bench/results/ with the host.

`--lengths 1,2,7,77,128` (text models): each is exported instead with its length as a dynamic axis
(TorchScript), compiled once for 1..--seq (`--dynamic input_ids=1x[1..SEQ]`, every input with that
dim following it), and checked against ONNX Runtime at each of those lengths, a quarter of the
mask zeros where --mask; no timing.
"""
from __future__ import annotations

import argparse
import importlib
import tempfile
import warnings
from pathlib import Path

from bench.common import write_results
from bench.torchvision_sweep import _errors, _torchvision, failed, sweep

# a small LLM: a decoder layer of hidden 512 with grouped-query attention
LLM = {"hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8, "num_key_value_heads": 2}
# name: (model class, config class, input kind, config overrides); layers are cut by --layers
MODELS = {
    "bert": ("BertModel", "BertConfig", "text", {}),
    "distilbert": ("DistilBertModel", "DistilBertConfig", "text", {}),
    "roberta": ("RobertaModel", "RobertaConfig", "text", {}),
    "albert": ("AlbertModel", "AlbertConfig", "text", {}),
    "electra": ("ElectraModel", "ElectraConfig", "text", {}),
    "deberta_v2": ("DebertaV2Model", "DebertaV2Config", "text", {}),
    "mpnet": ("MPNetModel", "MPNetConfig", "text", {}),
    "t5_encoder": ("T5EncoderModel", "T5Config", "text", {}),
    "gpt2": ("GPT2Model", "GPT2Config", "text", {}),
    "gpt_neo": ("GPTNeoModel", "GPTNeoConfig", "text", {"attention_types": [[["global", "local"], 1]], "num_layers": 2}),
    "opt": ("OPTModel", "OPTConfig", "text", {}),
    "bloom": ("BloomModel", "BloomConfig", "text", {}),
    "llama": ("LlamaModel", "LlamaConfig", "text", {**LLM, "num_key_value_heads": 4}),
    "mistral": ("MistralModel", "MistralConfig", "text", LLM),
    "qwen2": ("Qwen2Model", "Qwen2Config", "text", LLM),
    "phi": ("PhiModel", "PhiConfig", "text", {"hidden_size": 512, "intermediate_size": 2048,
                                              "num_attention_heads": 8}),
    "gemma": ("GemmaModel", "GemmaConfig", "text", {**LLM, "num_key_value_heads": 1, "head_dim": 64}),
    "vit": ("ViTModel", "ViTConfig", "image", {}),
    "deit": ("DeiTModel", "DeiTConfig", "image", {}),
    "beit": ("BeitModel", "BeitConfig", "image", {}),
    "dinov2": ("Dinov2Model", "Dinov2Config", "image", {"image_size": 224}),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", "image", {}),
    "clip_text": ("CLIPTextModel", "CLIPTextConfig", "text", {}),
    "swin": ("SwinModel", "SwinConfig", "image", {}),
    "convnext": ("ConvNextModel", "ConvNextConfig", "image", {}),
    "mobilevit": ("MobileViTModel", "MobileViTConfig", "image", {"image_size": 224}),
    "segformer": ("SegformerModel", "SegformerConfig", "image", {}),
    "whisper_encoder": ("models.whisper.modeling_whisper.WhisperEncoder", "WhisperConfig", "audio_features", {}),
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", "audio", {}),
    # more of each family: their own norms, position schemes, convs and int arithmetic on ids
    "xlm_roberta": ("XLMRobertaModel", "XLMRobertaConfig", "text", {}),
    "mobilebert": ("MobileBertModel", "MobileBertConfig", "text", {}),
    "squeezebert": ("SqueezeBertModel", "SqueezeBertConfig", "text", {}),
    "funnel": ("FunnelBaseModel", "FunnelConfig", "text", {}),
    "convbert": ("ConvBertModel", "ConvBertConfig", "text", {}),
    "nystromformer": ("NystromformerModel", "NystromformerConfig", "text", {}),
    "ernie": ("ErnieModel", "ErnieConfig", "text", {}),
    "roformer": ("RoFormerModel", "RoFormerConfig", "text", {}),
    "xlnet": ("XLNetModel", "XLNetConfig", "text", {}),
    "canine": ("CanineModel", "CanineConfig", "text", {}),
    "big_bird": ("BigBirdModel", "BigBirdConfig", "text", {"attention_type": "original_full"}),
    "modernbert": ("ModernBertModel", "ModernBertConfig", "text", {}),
    "falcon": ("FalconModel", "FalconConfig", "text", {"hidden_size": 512, "num_attention_heads": 8}),
    "gpt_neox": ("GPTNeoXModel", "GPTNeoXConfig", "text", {"hidden_size": 512, "intermediate_size": 2048,
                                                        "num_attention_heads": 8}),
    "gptj": ("GPTJModel", "GPTJConfig", "text", {"n_embd": 512, "n_head": 8, "rotary_dim": 32}),
    "codegen": ("CodeGenModel", "CodeGenConfig", "text", {"n_embd": 512, "n_head": 8, "rotary_dim": 32}),
    "stablelm": ("StableLmModel", "StableLmConfig", "text", LLM),
    "olmo": ("OlmoModel", "OlmoConfig", "text", LLM),
    "phi3": ("Phi3Model", "Phi3Config", "text", LLM),
    "granite": ("GraniteModel", "GraniteConfig", "text", LLM),
    "qwen3": ("Qwen3Model", "Qwen3Config", "text", {**LLM, "head_dim": 64}),
    "gemma2": ("Gemma2Model", "Gemma2Config", "text", {**LLM, "head_dim": 64}),
    "gemma3": ("Gemma3TextModel", "Gemma3TextConfig", "text", {**LLM, "head_dim": 64}),
    "levit": ("LevitModel", "LevitConfig", "image", {}),
    "poolformer": ("PoolFormerModel", "PoolFormerConfig", "image", {}),
    "regnet": ("RegNetModel", "RegNetConfig", "image", {}),
    "resnet": ("ResNetModel", "ResNetConfig", "image", {}),
    "efficientnet": ("EfficientNetModel", "EfficientNetConfig", "image", {"width_coefficient": 1.0,
                                                                        "depth_coefficient": 1.0, "hidden_dim": 1280}),
    "mobilenet_v1": ("MobileNetV1Model", "MobileNetV1Config", "image", {}),
    "mobilenet_v2": ("MobileNetV2Model", "MobileNetV2Config", "image", {}),
    "bit": ("BitModel", "BitConfig", "image", {}),
    "cvt": ("CvtModel", "CvtConfig", "image", {}),
    "pvt": ("PvtModel", "PvtConfig", "image", {}),
    "pvt_v2": ("PvtV2Model", "PvtV2Config", "image", {}),
    "focalnet": ("FocalNetModel", "FocalNetConfig", "image", {}),
    "data2vec_vision": ("Data2VecVisionModel", "Data2VecVisionConfig", "image", {}),
    "swinv2": ("Swinv2Model", "Swinv2Config", "image", {}),
    "glpn": ("GLPNModel", "GLPNConfig", "image", {}),
    "dpt": ("DPTModel", "DPTConfig", "image", {}),
    "yolos": ("YolosModel", "YolosConfig", "image", {}),
    "convnextv2": ("ConvNextV2Model", "ConvNextV2Config", "image", {}),
    "hiera": ("HieraModel", "HieraConfig", "image", {}),
    "mobilevitv2": ("MobileViTV2Model", "MobileViTV2Config", "image", {"image_size": 224}),
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", "image", {}),
    "dinov2_registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", "image", {"image_size": 224}),
    "hubert": ("HubertModel", "HubertConfig", "audio", {}),
    "wavlm": ("WavLMModel", "WavLMConfig", "audio", {}),
    "data2vec_audio": ("Data2VecAudioModel", "Data2VecAudioConfig", "audio", {}),
    "sew": ("SEWModel", "SEWConfig", "audio", {}),
    "textnet": ("TextNetModel", "TextNetConfig", "image", {}),
    "upernet": ("UperNetForSemanticSegmentation", "UperNetConfig", "image", {}),
    "mobilevit_deeplab": ("MobileViTForSemanticSegmentation", "MobileViTConfig", "image", {"image_size": 224}),
    "depth_anything": ("DepthAnythingForDepthEstimation", "DepthAnythingConfig", "image",
                       {"depth_estimation_type": "metric"}),      # a sigmoid head: a relative one's ReLU gives zeros
    "swin2sr": ("Swin2SRForImageSuperResolution", "Swin2SRConfig", "image", {"depths": [1, 1], "num_heads": [6, 6]}),
    "bart": ("BartModel", "BartConfig", "text", {}),
    "marian": ("MarianModel", "MarianConfig", "seq2seq", {}),
    "pegasus": ("PegasusModel", "PegasusConfig", "seq2seq", {}),
    "deberta": ("DebertaModel", "DebertaConfig", "text", {}),
    "layoutlm": ("LayoutLMModel", "LayoutLMConfig", "text", {}),
    "esm": ("EsmModel", "EsmConfig", "text", {"vocab_size": 33, "pad_token_id": 1}),
    "megatron_bert": ("MegatronBertModel", "MegatronBertConfig", "text", {}),
    "rembert": ("RemBertModel", "RemBertConfig", "text", {}),
    "mamba": ("MambaModel", "MambaConfig", "text", {"hidden_size": 256}),
    "videomae": ("VideoMAEModel", "VideoMAEConfig", "video", {}),
    "vivit": ("VivitModel", "VivitConfig", "video", {"num_frames": 16}),
    "timesformer": ("TimesformerModel", "TimesformerConfig", "video", {}),
}
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers")
ONES = {"depths": [1, 1, 1, 1]}
DEPTHS = {"swin": {"depths": [2, 2, 2, 2]}, "swinv2": {"depths": [2, 2, 2, 2]}, "convnext": ONES, "segformer": ONES,
          "convnextv2": ONES, "focalnet": ONES, "poolformer": ONES, "hiera": ONES, "pvt": ONES, "pvt_v2": ONES,
          "funnel": {"block_sizes": [1, 1, 1]}, "levit": {"depths": [1, 1, 1]}}
SEQ = {"clip_text": 77}           # its position table's length


def network(name: str, layers: int, cache: bool = False):
    """(the library's model of MODELS[name], its configuration): --layers layers, random weights,
    eager attention, the cache on where `cache` (bench.decode)."""
    try:
        _torchvision()          # transformers imports torchvision where installed; a mismatched build breaks it
    except ImportError:
        pass
    import torch
    import transformers as tf
    model_cls, config_cls, kind, over = MODELS[name]
    config = getattr(tf, config_cls)(**over, **DEPTHS.get(name, {}))
    for k in () if name in DEPTHS else LAYER_KEYS:       # stages' depths are cut by DEPTHS
        if isinstance(getattr(config, k, None), int):
            setattr(config, k, layers)
    if hasattr(config, "use_cache"):
        config.use_cache = cache
    config._attn_implementation = "eager"
    module, _, cls = model_cls.rpartition(".")         # a class transformers does not export at its top
    net = getattr(importlib.import_module(f"transformers.{module}") if module else tf, cls)(config).eval()
    with torch.no_grad():
        for p in net.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(torch.empty_like(p).normal_(0, 0.1 if bool(p.flatten()[0]) else 0.02))
    return net, config


def build(name: str, layers: int, seq: int, mask: bool):
    """(module returning the last hidden state, example inputs, input names)."""
    import torch
    net, config = network(name, layers)
    kind = MODELS[name][2]
    vocab, seq = getattr(config, "vocab_size", 1000), min(seq, SEQ.get(name, seq))
    if kind in ("text", "seq2seq"):
        xs = {"input_ids": torch.randint(0, vocab, (1, seq))}
        if kind == "seq2seq":                               # an encoder-decoder that does not shift the ids itself
            xs["decoder_input_ids"] = torch.randint(0, vocab, (1, seq))
        if mask:
            m = torch.ones(1, seq, dtype=torch.int64)
            m[0, seq - seq // 4:] = 0                       # padding at the end, as a tokenizer pads
            xs["attention_mask"] = m
    elif kind == "image":
        xs = {"pixel_values": torch.randn(1, 3, 224, 224)}
    elif kind == "video":                                   # a clip of frames, each 3 x H x W
        xs = {"pixel_values": torch.randn(1, config.num_frames, 3, config.image_size, config.image_size)}
    elif kind == "audio_features":
        xs = {"input_features": torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions)}
    else:
        xs = {"input_values": torch.randn(1, 16000)}
    names = list(xs)

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, *args):
            out = self.net(**dict(zip(names, args)))
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    return Hidden().eval(), tuple(xs.values()), names


def exporter(layers: int, seq: int, mask: bool):
    """(export(name, path), feeds(name)): the example inputs of the export are the ones checked and
    timed (ids in the vocabulary, a mask of ones then padding)."""
    examples = {}

    def export(name: str, path: Path, seed: int = 0, dynamo: bool = False) -> Path:
        import torch
        torch.manual_seed(seed)
        module, xs, names = build(name, layers, seq, mask)
        examples[name] = [x.numpy() for x in xs]
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, xs, str(path), input_names=names, output_names=["hidden"],
                              opset_version=18 if dynamo else 17, dynamo=dynamo)
        return path
    return export, examples.__getitem__


def dynamic_rows(names: list, layers: int, seq: int, lengths: list, mask: bool, threads: int, target: str,
                 workdir: Path) -> list:
    """A row per text model: compiled once for lengths 1..seq, its max error over the output's
    range against ONNX Runtime at each of `lengths`."""
    import numpy as np
    import onnxruntime
    import torch
    from tuner.compiler import compile_model
    rows = []
    for name in names:
        row, stage = {"model": name, "threads": threads}, "export"
        try:
            torch.manual_seed(0)
            module, xs, inputs = build(name, layers, min(seq, 16), mask)
            if MODELS[name][2] != "text":
                raise ValueError("--lengths checks text models only")
            path = workdir / f"{name}_dynamic.onnx"
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(module, xs, str(path), input_names=inputs, output_names=["hidden"], opset_version=17,
                                  dynamo=False, dynamic_axes={n: {1: "seq"} for n in [*inputs, "hidden"]})
            stage = "compile"
            m = compile_model(str(path), target=target, threads=threads, dynamic=f"input_ids=1x[1..{seq}]")
            stage = "run"
            ort = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            errs = {}
            for n in lengths:
                rng = np.random.default_rng(n)
                feeds = {"input_ids": rng.integers(0, 100, (1, n)).astype(np.int64)}
                if "attention_mask" in inputs:
                    feeds["attention_mask"] = np.ones((1, n), np.int64)
                    feeds["attention_mask"][0, n - n // 4:] = 0
                errs[n] = _errors(ort.run(None, feeds), m.run(**feeds))["max_err_over_range"]
            row.update(ok=max(errs.values()) <= 1e-4, max_err_over_range=errs)
        except Exception as e:                  # noqa: BLE001 - a row per model, whatever stops it
            row.update(failed(stage, e))
        print(f"{name:12} {'ok' if row['ok'] else 'FAILED at ' + row['stage'] + ': ' + row['error']}"
              + (f"  max err {max(row['max_err_over_range'].values()):.1e}" if row.get("ok") else ""), flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--mask", action="store_true", help="export the attention mask as an input too")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds against ONNX Runtime (0: check only)")
    ap.add_argument("--torchscript", action="store_true", help="the TorchScript exporter (opset 17)")
    ap.add_argument("--keep", help="keep the exported .onnx files in this directory")
    ap.add_argument("--target", default="cpu", help='the compile target, e.g. "cpu -isa=avx2" (default: the host)')
    ap.add_argument("--lengths", help="e.g. 1,2,7,77,128: compile text models once for lengths 1..--seq and check each")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    unknown = [n for n in args.models.split(",") if n not in MODELS]
    if unknown:
        ap.error(f"unknown --models {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    if args.lengths:
        lengths = [int(x) for x in args.lengths.split(",")]
        if not all(1 <= n <= args.seq for n in lengths):
            ap.error(f"--lengths must lie in 1..--seq ({args.seq})")
        with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp:
            rows = dynamic_rows(args.models.split(","), args.layers, args.seq, lengths, args.mask, args.threads,
                                args.target, Path(args.keep or tmp))
        write_results("hf_sweep", args.out, {"threads": args.threads, "layers": args.layers, "seq": args.seq,
                                             "lengths": lengths, "mask": args.mask, "target": args.target, "rows": rows})
        return 0 if all(r["ok"] for r in rows) else 1
    export, feeds = exporter(args.layers, args.seq, args.mask)
    with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp:
        d = Path(args.keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        rows = sweep(args.models.split(","), d, args.threads, args.rounds, export=export, feeds=feeds,
                     dynamo=not args.torchscript, target=args.target)
    ok = sum(r.get("ok", False) for r in rows)
    write_results("hf_sweep", args.out, {"threads": args.threads, "rounds": args.rounds, "layers": args.layers,
                                         "seq": args.seq, "mask": args.mask, "torchscript": args.torchscript, "target": args.target,
                                         "rows": rows})
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
