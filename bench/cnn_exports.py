"""CNNs from outside the built-in set, written in PyTorch from their papers and exported by
`torch.onnx.export` with random weights: what a user brings to `tuner compile model.onnx`.

    python -m bench.cnn_exports [--out-dir bench/models] [--size 224]   # writes NAME.onnx for each
    python -m bench.untuned --models bench/models/mobilenet_v3_small.onnx,bench/models/regnet_y_400mf.onnx

- mobilenet_v3_small (Howard et al. 2019, table 2): hard-swish, squeeze-excitation with a hard
  sigmoid, 5x5 depthwise convs, expansions of 72, 88, 240, 576 channels;
- regnet_y_400mf (Radosavovic et al. 2020): grouped 3x3 convs of group width 8, widths 48, 104, 208,
  440 (not multiples of 16), squeeze-excitation, strided 1x1 shortcuts;
- crnn (Shi et al. 2015, reduced): a text-line recogniser, three 3x3 convs over a 32 x 128 grey
  line, a 2-layer bidirectional LSTM of 256 over its 32 columns, 37 classes by LogSoftmax
  (`--size` does not apply).

Needs torch and onnxscript (the [bench] extra).
"""
from __future__ import annotations

import argparse
from pathlib import Path


def _torch():
    import torch
    return torch, torch.nn


def mobilenet_v3_small():
    torch, nn = _torch()

    def divisible(v, d=8):
        return max(d, int(v + d / 2) // d * d)

    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            s = divisible(c // 4)
            self.fc1, self.fc2 = nn.Conv2d(c, s, 1), nn.Conv2d(s, c, 1)

        def forward(self, x):
            s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
            return x * torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))

    def cba(cin, cout, k, stride=1, groups=1, act=None):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, *([act()] if act else []))

    class Block(nn.Module):
        def __init__(self, cin, k, exp, cout, se, hs, stride):
            super().__init__()
            act = nn.Hardswish if hs else nn.ReLU
            layers = [cba(cin, exp, 1, act=act)] if exp != cin else []
            layers += [cba(exp, exp, k, stride, exp, act)] + ([SE(exp)] if se else []) + [cba(exp, cout, 1)]
            self.body, self.res = nn.Sequential(*layers), stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.res else y

    cfg = [(16, 3, 16, 16, 1, 0, 2), (16, 3, 72, 24, 0, 0, 2), (24, 3, 88, 24, 0, 0, 1), (24, 5, 96, 40, 1, 1, 2),
           (40, 5, 240, 40, 1, 1, 1), (40, 5, 240, 40, 1, 1, 1), (40, 5, 120, 48, 1, 1, 1), (48, 5, 144, 48, 1, 1, 1),
           (48, 5, 288, 96, 1, 1, 2), (96, 5, 576, 96, 1, 1, 1), (96, 5, 576, 96, 1, 1, 1)]
    return nn.Sequential(cba(3, 16, 3, 2, act=nn.Hardswish), *[Block(*c) for c in cfg], cba(96, 576, 1, act=nn.Hardswish),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(576, 1024), nn.Hardswish(),
                         nn.Linear(1024, 1000))


def regnet_y_400mf():
    torch, nn = _torch()

    def cba(cin, cout, k, stride=1, groups=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, *([nn.ReLU()] if relu else []))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            s = int(round(0.25 * cin))
            self.a, self.b = cba(cin, cout, 1), cba(cout, cout, 3, stride, cout // 8)
            self.se1, self.se2 = nn.Conv2d(cout, s, 1), nn.Conv2d(s, cout, 1)
            self.c = cba(cout, cout, 1, relu=False)
            self.short = cba(cin, cout, 1, stride, relu=False) if cin != cout or stride != 1 else None

        def forward(self, x):
            y = self.b(self.a(x))
            y = y * torch.sigmoid(self.se2(torch.relu(self.se1(torch.nn.functional.adaptive_avg_pool2d(y, 1)))))
            y = self.c(y)
            return torch.relu((self.short(x) if self.short is not None else x) + y)

    blocks, cin = [], 32
    for width, depth in ((48, 1), (104, 3), (208, 6), (440, 6)):
        for i in range(depth):
            blocks.append(Block(cin, width, 2 if i == 0 else 1))
            cin = width
    return nn.Sequential(cba(3, 32, 3, 2), *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(440, 1000))


def crnn():
    torch, nn = _torch()

    class CRNN(nn.Module):
        def __init__(self):
            super().__init__()
            conv = lambda cin, cout, pool: [nn.Conv2d(cin, cout, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(pool)]  # noqa: E731
            self.cnn = nn.Sequential(*conv(1, 64, 2), *conv(64, 128, 2), *conv(128, 256, (8, 1)))
            self.rnn = nn.LSTM(256, 256, num_layers=2, bidirectional=True)
            self.fc = nn.Linear(512, 37)

        def forward(self, x):
            seq = self.cnn(x).squeeze(2).permute(2, 0, 1)        # [columns, batch, channels]
            return torch.log_softmax(self.fc(self.rnn(seq)[0]), -1)
    return CRNN()


MODELS = {"mobilenet_v3_small": mobilenet_v3_small, "regnet_y_400mf": regnet_y_400mf, "crnn": crnn}
INPUTS = {"crnn": lambda size: (1, 1, 32, 128)}     # else an RGB image of size x size


def export(name: str, path: Path, size: int = 224, seed: int = 0) -> Path:
    torch, _ = _torch()
    torch.manual_seed(seed)
    net = MODELS[name]().eval()
    for m in net.modules():                     # random statistics, so that BatchNorm folds to something
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = INPUTS.get(name, lambda s: (1, 3, s, s))(size)
    torch.onnx.export(net, (torch.randn(*shape),), str(path), input_names=["input"], opset_version=17, dynamo=False)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out-dir", default="bench/models")
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args(argv)
    for name in args.models.split(","):
        print("wrote", export(name, Path(args.out_dir) / f"{name}.onnx", args.size))


if __name__ == "__main__":
    main()
