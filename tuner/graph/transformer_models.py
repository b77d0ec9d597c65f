"""Built-in transformers with deterministic random weights: bert_base, vit_b16, gpt2.

Each is written as the ONNX graph `torch.onnx.export` writes for the Hugging Face model (opset 17:
MatMul by a weight then Add of its bias, Reshape and Transpose into heads, Softmax, LayerNormalization,
GELU as Erf or Tanh pieces, a causal mask as a constant added to the scores) and imported by the
ONNX frontend, so the passes see what they see in an exported file, with no torch installed. The
published configurations are the defaults; smaller ones (layers, hidden, heads, seq) serve tests.
Weights follow the models' initialisation (normal, std 0.02), so activations stay O(1).
"""
from __future__ import annotations

import math

import numpy as np

from .ir import Graph


class _Onnx:
    """An ONNX graph under construction: nodes and initializers with unique names."""

    def __init__(self, name: str, seed: int):
        from onnx import helper
        self.helper, self.name = helper, name
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def _fresh(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def const(self, data, hint: str = "c") -> str:
        from onnx import numpy_helper
        name = self._fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(data), name))
        return name

    def weight(self, *shape, hint: str = "w", std: float = 0.02) -> str:
        return self.const(self.rng.normal(0.0, std, size=shape).astype(np.float32), hint)

    def op(self, kind: str, inputs: list, hint: str = "", **attrs) -> str:
        out = self._fresh(hint or kind.lower())
        self.nodes.append(self.helper.make_node(kind, inputs, [out], name=out, **attrs))
        return out

    def linear(self, x: str, cin: int, cout: int, hint: str) -> str:
        y = self.op("MatMul", [x, self.weight(cin, cout, hint=f"{hint}_w")], hint)
        return self.op("Add", [y, self.const(np.zeros(cout, np.float32), f"{hint}_b")], f"{hint}_bias")

    def layer_norm(self, x: str, d: int, eps: float) -> str:
        return self.op("LayerNormalization", [x, self.const(np.ones(d, np.float32), "ln_g"),
                                              self.const(np.zeros(d, np.float32), "ln_b")],
                       "ln", axis=-1, epsilon=eps)

    def shape(self, dims) -> str:
        return self.const(np.array(dims, np.int64), "shape")

    def attention(self, x: str, seq: int, hidden: int, heads: int, mask: str | None = None) -> str:
        """Multi-head self-attention: Q, K, V projections, heads by Reshape and Transpose, scores
        scaled by 1/sqrt(head size) (plus an additive mask), Softmax, the heads merged back."""
        hd = hidden // heads

        def heads_of(t, perm):
            return self.op("Transpose", [self.op("Reshape", [t, self.shape([1, seq, heads, hd])])], perm=perm)
        q = heads_of(self.linear(x, hidden, hidden, "q"), [0, 2, 1, 3])
        k = heads_of(self.linear(x, hidden, hidden, "k"), [0, 2, 3, 1])
        v = heads_of(self.linear(x, hidden, hidden, "v"), [0, 2, 1, 3])
        s = self.op("Div", [self.op("MatMul", [q, k], "scores"), self.const(np.float32(math.sqrt(hd)), "sqrt_d")])
        if mask is not None:
            s = self.op("Add", [s, mask], "masked")
        ctx = self.op("MatMul", [self.op("Softmax", [s], axis=-1), v], "context")
        ctx = self.op("Reshape", [self.op("Transpose", [ctx], perm=[0, 2, 1, 3]), self.shape([1, seq, hidden])])
        return self.linear(ctx, hidden, hidden, "attn_out")

    def gelu(self, x: str, tanh: bool = False) -> str:
        """GELU as the exporters write it: x * 0.5 * (1 + erf(x / sqrt 2)), or GPT-2's tanh form
        0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))."""
        def c(v):
            return self.const(np.float32(v), "k")
        if not tanh:
            e = self.op("Erf", [self.op("Div", [x, c(math.sqrt(2.0))])])
            return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, c(1.0)])]), c(0.5)], "gelu")
        cube = self.op("Mul", [self.op("Pow", [x, c(3.0)]), c(0.044715)])
        t = self.op("Tanh", [self.op("Mul", [self.op("Add", [x, cube]), c(math.sqrt(2.0 / math.pi))])])
        return self.op("Mul", [self.op("Mul", [x, c(0.5)]), self.op("Add", [t, c(1.0)])], "gelu")

    def mlp(self, x: str, hidden: int, ffn: int, tanh: bool = False) -> str:
        return self.linear(self.gelu(self.linear(x, hidden, ffn, "ffn_in"), tanh), ffn, hidden, "ffn_out")

    def finish(self, inputs: list, output: str, out_shape: list, as_onnx: bool):
        """The imported Graph, or (as_onnx) the ONNX model itself."""
        from onnx import TensorProto

        from .onnx_frontend import from_onnx
        h = self.helper
        g = h.make_graph(self.nodes, self.name, [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                         [h.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)], self.inits)
        model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        return model if as_onnx else from_onnx(model, None, self.name)


def bert(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, seq: int = 128,
         vocab: int = 30522, seed: int = 0, as_onnx: bool = False) -> Graph:
    """A BERT encoder (post-norm), input_ids [1, seq] -> last hidden state [1, seq, hidden]; token
    type 0 and no padding, so no attention mask."""
    from onnx import TensorProto
    m = _Onnx("bert_base", seed)
    x = m.op("Gather", [m.weight(vocab, hidden, hint="word_embeddings"), "input_ids"], axis=0)
    x = m.op("Add", [x, m.weight(1, seq, hidden, hint="position_embeddings")])
    x = m.layer_norm(m.op("Add", [x, m.weight(hidden, hint="token_type_embedding")]), hidden, 1e-12)
    for _ in range(layers):
        x = m.layer_norm(m.op("Add", [m.attention(x, seq, hidden, heads), x], "residual"), hidden, 1e-12)
        x = m.layer_norm(m.op("Add", [m.mlp(x, hidden, ffn), x], "residual"), hidden, 1e-12)
    return m.finish([("input_ids", TensorProto.INT64, [1, seq])], x, [1, seq, hidden], as_onnx)


def vit(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, image: int = 224, patch: int = 16,
        seed: int = 0, as_onnx: bool = False) -> Graph:
    """A ViT encoder (pre-norm): pixel_values [1, 3, image, image] -> [1, 1 + patches, hidden]; the
    patches embedded by a strided Conv, a class token prepended."""
    from onnx import TensorProto
    m = _Onnx("vit_b16", seed)
    n = (image // patch) ** 2
    x = m.op("Conv", ["pixel_values", m.weight(hidden, 3, patch, patch, hint="patch_w"),
                      m.const(np.zeros(hidden, np.float32), "patch_b")], kernel_shape=[patch, patch],
             strides=[patch, patch])
    x = m.op("Transpose", [m.op("Reshape", [x, m.shape([1, hidden, n])])], perm=[0, 2, 1])
    x = m.op("Concat", [m.weight(1, 1, hidden, hint="cls_token"), x], axis=1)
    x = m.op("Add", [x, m.weight(1, n + 1, hidden, hint="position_embeddings")])
    for _ in range(layers):
        x = m.op("Add", [m.attention(m.layer_norm(x, hidden, 1e-12), n + 1, hidden, heads), x], "residual")
        x = m.op("Add", [m.mlp(m.layer_norm(x, hidden, 1e-12), hidden, ffn), x], "residual")
    x = m.layer_norm(x, hidden, 1e-12)
    return m.finish([("pixel_values", TensorProto.FLOAT, [1, 3, image, image])], x, [1, n + 1, hidden], as_onnx)


def gpt2(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, vocab: int = 50257,
         seed: int = 0, as_onnx: bool = False) -> Graph:
    """A GPT-2 decoder over a prompt (pre-norm, causal mask, tanh GELU): input_ids [1, seq] -> last
    hidden state [1, seq, hidden]."""
    from onnx import TensorProto
    m = _Onnx("gpt2", seed)
    causal = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1).reshape(1, 1, seq, seq)
    mask = m.const(causal, "causal_mask")
    x = m.op("Gather", [m.weight(vocab, hidden, hint="wte"), "input_ids"], axis=0)
    x = m.op("Add", [x, m.weight(1, seq, hidden, hint="wpe")])
    for _ in range(layers):
        x = m.op("Add", [m.attention(m.layer_norm(x, hidden, 1e-5), seq, hidden, heads, mask), x], "residual")
        x = m.op("Add", [m.mlp(m.layer_norm(x, hidden, 1e-5), hidden, 4 * hidden, tanh=True), x], "residual")
    x = m.layer_norm(x, hidden, 1e-5)
    return m.finish([("input_ids", TensorProto.INT64, [1, seq])], x, [1, seq, hidden], as_onnx)
