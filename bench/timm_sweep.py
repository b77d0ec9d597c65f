"""CNNs from timm (PyTorch Image Models) that torchvision does not have, as a user brings them: exported,
compiled untuned, checked against ONNX Runtime, timed. The same rows as `bench.torchvision_sweep`.

    pip install timm            # not a dependency of tuner; the build matching the installed torch
    python -m bench.timm_sweep [--models ghostnet_100,mixnet_s,...] [--threads 1] [--rounds 5]
                               [--target "cpu -isa=avx2"] [--size 224]

Each model is built with random weights and BatchNorm statistics and exported by `torch.onnx.export`
(opset 17, batch 1) at its own input size (timm's pretrained config) unless --size is given.
"""
from __future__ import annotations

from pathlib import Path

from bench.torchvision_sweep import _torchvision, export_net, sweep_cli

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
    return sweep_cli("timm", __doc__, DEFAULT, argv,
                     lambda ap: ap.add_argument("--size", type=int, help="the image's side (default: each model's own)"),
                     lambda args: ({"export": exporter(args.size)}, {"size": args.size}))


if __name__ == "__main__":
    raise SystemExit(main())
