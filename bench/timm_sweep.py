"""CNNs from timm (PyTorch Image Models) that torchvision does not have, as a user brings them: exported,
compiled untuned, checked against ONNX Runtime, timed. The same rows as `bench.torchvision_sweep`.

    pip install timm            # not a dependency of tuner; the build matching the installed torch
    python -m bench.timm_sweep [--models ghostnet_100,mixnet_s,...] [--threads 1] [--rounds 5]
                               [--target "cpu -isa=avx2"] [--size 224]

Each model is built with random weights and BatchNorm statistics and exported by `torch.onnx.export`
(opset 17, batch 1) at its own input size (timm's pretrained config) unless --size is given.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import write_results
from bench.torchvision_sweep import _torchvision, export_net, sweep

# architectures by what they bring that torchvision's do not: ghost modules, mixed kernel sizes in one
# depthwise conv, odd channel counts with SE, aggregation by concat trees, multi-resolution branches,
# Mish and leaky ReLU, re-parameterisable branch sums, split attention, selective kernels, ECA's 1-D conv
# over channels, dual paths, separable convs, hard-swish, partial convs, star products, linear attention
DEFAULT = ("ghostnet_100,mixnet_s,rexnet_100,dla34,hrnet_w18_small,cspresnet50,cspdarknet53,repvgg_a0,"
           "mobileone_s0,res2net50_26w_4s,resnest14d,selecsls42b,dpn68,xception41,lcnet_100,hardcorenas_a,"
           "fbnetc_100,tinynet_a,ese_vovnet19b_dw,gernet_s,resnet50d,seresnext26d_32x4d,skresnet18,"
           "ecaresnet26t,gcresnet33ts,hgnetv2_b0,repghostnet_050,starnet_s1,fasternet_t0,efficientvit_b0,"
           "repvit_m0_9,edgenext_xx_small,fastvit_t8,darknet53,inception_v4,regnetz_b16")


def exporter(size: int | None):
    def export(name: str, path: Path, seed: int = 0, dynamo: bool = False) -> Path:
        torch, _ = _torchvision()
        import timm
        torch.manual_seed(seed)
        net = timm.create_model(name, pretrained=False)
        shape = (1, 3, size, size) if size else (1, *net.pretrained_cfg["input_size"])
        return export_net(torch, net, shape, path, dynamo)
    return export


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds against ONNX Runtime (0: check only)")
    ap.add_argument("--size", type=int, help="the image's side (default: each model's own)")
    ap.add_argument("--target", default="cpu", help='the compile target, e.g. "cpu -isa=avx2" (default: the host)')
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-timm-") as d:
        rows = sweep(args.models.split(","), Path(d), args.threads, args.rounds, export=exporter(args.size),
                     target=args.target)
    ok = sum(r.get("ok", False) for r in rows)
    write_results("timm_sweep", args.out, {"threads": args.threads, "rounds": args.rounds, "target": args.target,
                                           "size": args.size, "rows": rows})
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
