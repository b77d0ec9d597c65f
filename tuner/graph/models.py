"""Built-in models with deterministic random weights: resnet18, resnet50, mobilenet_v2, googlenet, tiny,
and the transformers bert_base, vit_b16 and gpt2 (graph.transformer_models).

They are built the way PyTorch's exporter writes them (conv without bias, BatchNormalization,
ReLU/Clip, residual Add, global pooling, Flatten, Gemm), so the same passes see the same shapes
of graph as an imported file. Weights are scaled so activations stay O(1) through the network.
"""
from __future__ import annotations

import numpy as np

from ..errors import UserError
from .builder import GraphBuilder
from .ir import Graph


class _Net:
    def __init__(self, name: str, seed: int):
        self.b = GraphBuilder(name)
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def _name(self, kind):
        self.n += 1
        return f"{kind}{self.n}"

    def conv(self, x, cin, cout, k, stride=1, groups=1):
        pad = (k - 1) // 2
        fan_in = cin // groups * k * k
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), size=(cout, cin // groups, k, k)).astype(np.float32)
        return self.b.add("conv2d", [x, self.b.const(w, "w")],
                          {"strides": [stride, stride], "pads": [pad, pad, pad, pad], "dilations": [1, 1],
                           "groups": groups, "layout": "NCHW", "kernel_layout": "OIHW"}, self._name("conv"))

    def bn(self, x, c, gamma=1.0):
        r = self.rng
        params = [r.uniform(0.5, 1.0, c) * gamma, r.uniform(-0.1, 0.1, c), r.uniform(-0.1, 0.1, c),
                  r.uniform(0.5, 1.5, c)]
        ins = [x] + [self.b.const(p.astype(np.float32), nm) for p, nm in zip(params, ("gamma", "beta", "mean", "var"))]
        return self.b.add("batch_norm", ins, {"epsilon": 1e-5, "layout": "NCHW"}, self._name("bn"))

    def relu(self, x):
        return self.b.add("relu", [x], {}, self._name("relu"))

    def relu6(self, x):
        return self.b.add("clip", [x], {"min": 0.0, "max": 6.0}, self._name("relu6"))

    def add(self, x, y):
        return self.b.add("add", [x, y], {}, self._name("add"))

    def head(self, x, c, classes):
        x = self.b.add("global_avg_pool2d", [x], {"layout": "NCHW"}, "gap")
        x = self.b.add("flatten", [x], {"axis": 1}, "flatten")
        w = self.rng.normal(0, np.sqrt(1.0 / c), size=(classes, c)).astype(np.float32)
        y = self.b.add("dense", [x, self.b.const(w, "fc_w")], {}, "fc")
        return self.b.add("add", [y, self.b.const(self.rng.uniform(-0.1, 0.1, classes).astype(np.float32), "fc_b")],
                          {}, "fc_bias")


def resnet(depth: int, seed: int = 0, image: int = 224) -> Graph:
    bottleneck = depth >= 50
    blocks = {18: [2, 2, 2, 2], 50: [3, 4, 6, 3]}[depth]
    net = _Net(f"resnet{depth}", seed)
    x = net.b.input("input", (1, 3, image, image), layout="NCHW")
    x = net.relu(net.bn(net.conv(x, 3, 64, 7, 2), 64))
    x = net.b.add("max_pool2d", [x], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "layout": "NCHW"},
                  "maxpool")
    cin = 64
    for stage, n in enumerate(blocks):
        width = 64 * 2 ** stage
        cout = width * 4 if bottleneck else width
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            if bottleneck:
                y = net.relu(net.bn(net.conv(x, cin, width, 1), width))
                y = net.relu(net.bn(net.conv(y, width, width, 3, stride), width))
                y = net.bn(net.conv(y, width, cout, 1), cout, gamma=0.2)
            else:
                y = net.relu(net.bn(net.conv(x, cin, width, 3, stride), width))
                y = net.bn(net.conv(y, width, cout, 3), cout, gamma=0.2)
            short = net.bn(net.conv(x, cin, cout, 1, stride), cout) if (stride != 1 or cin != cout) else x
            x = net.relu(net.add(y, short))
            cin = cout
    return net.b.finish([net.head(x, cin, 1000)])


def mobilenet_v2(seed: int = 0, image: int = 224) -> Graph:
    net = _Net("mobilenet_v2", seed)
    x = net.b.input("input", (1, 3, image, image), layout="NCHW")
    x = net.relu6(net.bn(net.conv(x, 3, 32, 3, 2), 32))
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = net.relu6(net.bn(net.conv(y, cin, hidden, 1), hidden))
            y = net.relu6(net.bn(net.conv(y, hidden, hidden, 3, stride, groups=hidden), hidden))
            y = net.bn(net.conv(y, hidden, c, 1), c, gamma=0.3)
            x = net.add(x, y) if (stride == 1 and cin == c) else y
            cin = c
    x = net.relu6(net.bn(net.conv(x, cin, 1280, 1), 1280))
    return net.b.finish([net.head(x, 1280, 1000)])


# GoogLeNet's inception blocks: 1x1; 1x1 -> 3x3; 1x1 -> 3x3 (torchvision's 5x5 branch); pool -> 1x1
INCEPTION_V1 = {"3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
                "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64), "4c": (128, 128, 256, 24, 64, 64),
                "4d": (112, 144, 288, 32, 64, 64), "4e": (256, 160, 320, 32, 128, 128),
                "5a": (256, 160, 320, 32, 128, 128), "5b": (384, 192, 384, 48, 128, 128)}


def googlenet(seed: int = 0, image: int = 224) -> Graph:
    """GoogLeNet (Inception v1) as torchvision builds it, without the auxiliary heads: an
    inception-style graph of four-branch blocks joined by channel concats, for the layout solver."""
    net = _Net("googlenet", seed)

    def cbr(x, cin, cout, k, stride=1):
        return net.relu(net.bn(net.conv(x, cin, cout, k, stride), cout))

    def pool(x, stride):
        return net.b.add("max_pool2d", [x], {"kernel": [3, 3], "strides": [stride, stride], "pads": [1, 1, 1, 1],
                                             "layout": "NCHW"}, net._name("pool"))

    x = net.b.input("input", (1, 3, image, image), layout="NCHW")
    x = pool(cbr(x, 3, 64, 7, 2), 2)
    x = pool(cbr(cbr(x, 64, 64, 1), 64, 192, 3), 2)
    cin = 192
    for name, (c1, r3, c3, r5, c5, cp) in INCEPTION_V1.items():
        branches = [cbr(x, cin, c1, 1), cbr(cbr(x, cin, r3, 1), r3, c3, 3), cbr(cbr(x, cin, r5, 1), r5, c5, 3),
                    cbr(pool(x, 1), cin, cp, 1)]
        x = net.b.add("concat", branches, {"axis": 1}, f"inception{name}")
        cin = c1 + c3 + c5 + cp
        if name in ("3b", "4e"):
            x = pool(x, 2)
    return net.b.finish([net.head(x, cin, 1000)])


def tiny(seed: int = 0) -> Graph:
    """A small CNN for tests: conv-bn-relu, maxpool, a residual block, global pooling, dense."""
    net = _Net("tiny", seed)
    x = net.b.input("input", (1, 3, 16, 16), layout="NCHW")
    x = net.relu(net.bn(net.conv(x, 3, 16, 3), 16))
    x = net.b.add("max_pool2d", [x], {"kernel": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0], "layout": "NCHW"},
                  "maxpool")
    y = net.relu(net.bn(net.conv(x, 16, 16, 3), 16))
    y = net.bn(net.conv(y, 16, 16, 3), 16, gamma=0.5)
    x = net.relu(net.add(y, x))
    x = net.relu(net.bn(net.conv(x, 16, 32, 1, 2), 32))
    return net.b.finish([net.head(x, 32, 10)])


MODELS = {
    "resnet18": lambda: resnet(18),
    "resnet50": lambda: resnet(50),
    "mobilenet_v2": mobilenet_v2,
    "googlenet": googlenet,
    "tiny": tiny,
    "bert_base": lambda: _transformer("bert"),
    "vit_b16": lambda: _transformer("vit"),
    "gpt2": lambda: _transformer("gpt2"),
}

# what `tuner models` lists without building a model: its input and what it is
ABOUT = {
    "resnet18": ("input 1x3x224x224 float32", "ResNet-18, ImageNet classifier"),
    "resnet50": ("input 1x3x224x224 float32", "ResNet-50 v1.5, ImageNet classifier"),
    "mobilenet_v2": ("input 1x3x224x224 float32", "MobileNetV2, ImageNet classifier (depthwise convs)"),
    "googlenet": ("input 1x3x224x224 float32", "GoogLeNet (Inception v1), ImageNet classifier"),
    "tiny": ("input 1x3x16x16 float32", "four convs: a small model for trying the tools"),
    "bert_base": ("input_ids 1x128 int64", "BERT-base encoder, 12 layers, hidden 768"),
    "vit_b16": ("pixel_values 1x3x224x224 float32", "ViT-B/16 encoder, 12 layers, hidden 768"),
    "gpt2": ("input_ids 1x128 int64", "GPT-2 (124M) decoder prefill, causal mask"),
}


def _transformer(name: str) -> Graph:
    from . import transformer_models
    return getattr(transformer_models, name)()


def load_model(name: str) -> Graph:
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; built-in models are {', '.join(MODELS)}")
    return MODELS[name]()
