"""Transformers end to end: exports by torch.onnx.export of real architectures (torch's own
TransformerEncoder; Hugging Face BERT, ViT and GPT-2 built from small configs with random weights)
import, compile and compute what ONNX Runtime computes; an integer input is checked against the
embedding table it indexes; slices of activations as ONNX writes them."""
import warnings

import numpy as np
import onnx
import pytest
from conftest import agree_with_onnxruntime as _agree
from conftest import ort_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.compiler import compile_model
from tuner.errors import UserError

pytest.importorskip("onnxruntime")


def _export(torch, module, args, path, opset: int, dynamo: bool, names: list) -> None:
    module.eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():       # every weight random, LayerNorm's scale and shift too
            p.uniform_(-0.3, 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=names, output_names=["out"], opset_version=opset,
                          dynamo=dynamo)


@pytest.mark.parametrize("dynamo,opset,norm_first", [(False, 14, False), (False, 17, True), (True, 17, False),
                                                     (True, 18, True)])
def test_a_torch_transformer_encoder_compiles_to_what_onnx_runtime_computes(tmp_path, dynamo, opset, norm_first):
    """opset 14 writes LayerNorm decomposed (ReduceMean, Sub, Pow, Sqrt, Div), 17 as LayerNormalization;
    the legacy exporter computes shapes in the graph (Shape, Gather, Slice, Concat), dynamo does not."""
    torch = pytest.importorskip("torch")
    if dynamo:
        pytest.importorskip("onnxscript")
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             activation="gelu")
    enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    x = torch.randn(2, 5, 16)
    _export(torch, enc, (x,), tmp_path / "enc.onnx", opset, dynamo, ["x"])
    _agree(tmp_path / "enc.onnx", {"x": x.numpy()})


def _hf_model(name: str):
    tf = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    if name == "bert":
        m, kw = tf.BertModel(tf.BertConfig(vocab_size=100, max_position_embeddings=32, **small)), "input_ids"
    elif name == "vit":
        m, kw = tf.ViTModel(tf.ViTConfig(image_size=16, patch_size=8, **small), add_pooling_layer=False), "pixel_values"
    else:
        m, kw = tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=1, n_head=4)), "input_ids"
    if kw == "input_ids":
        m.config.use_cache = False

    class Hidden(torch.nn.Module):           # the last hidden state, from one keyword input
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(**{kw: x}).last_hidden_state

    x = torch.randn(1, 3, 16, 16) if name == "vit" else torch.randint(0, 100, (1, 7))
    return torch, Hidden(), x, kw


@pytest.mark.slow
@pytest.mark.parametrize("name,dynamo,opset", [("bert", False, 14), ("bert", True, 17), ("vit", False, 17),
                                               ("vit", True, 18), ("gpt2", True, 18)])
def test_hugging_face_models_with_random_weights_compile_to_what_onnx_runtime_computes(tmp_path, name, dynamo, opset):
    torch, module, x, kw = _hf_model(name)
    pytest.importorskip("onnxscript")
    _export(torch, module, (x,), tmp_path / f"{name}.onnx", opset, dynamo, [kw])
    _agree(tmp_path / f"{name}.onnx", {kw: x.numpy()})


def _embedding_model(path, vocab: int = 10) -> np.ndarray:
    table = np.random.default_rng(0).standard_normal((vocab, 4)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["emb"], "lookup"),
                           helper.make_node("Relu", ["emb"], ["out"], "relu")], "emb",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 5, 4])],
                          [numpy_helper.from_array(table, "table")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return table


def test_token_ids_index_the_embedding_table_as_onnx_runtime_does_and_one_past_it_is_refused(tmp_path):
    path = tmp_path / "emb.onnx"
    table = _embedding_model(path)
    ids = np.array([[0, 9, 3, -1, -10], [5, 5, 2, 7, 1]], dtype=np.int64)      # negative ids count from the end
    _agree(path, {"ids": ids})
    m = compile_model(str(path), threads=1)
    np.testing.assert_array_equal(m.run(ids=ids)[0], np.maximum(table[ids], 0))
    for bad in (10, -11, 1 << 40):
        with pytest.raises(UserError, match=f"input ids holds {bad}, outside \\[-10, 10\\)"):
            m.run(ids=np.full((2, 5), bad, dtype=np.int64))
    with pytest.raises(UserError, match="input ids must be int64, got float32"):
        m.run(ids=ids.astype(np.float32))


def test_a_slice_that_takes_nothing_is_left_out_of_its_concat_and_refused_anywhere_else(tmp_path):
    """torch.roll by 0 (Swin3D's shift along a window-wide depth) exports as x[:, 4:] and x[:, :4] of
    x[:, 4:] concatenated, the first empty."""
    def model(tail: str):
        inits = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
                 (([4], "four"), ([0], "zero"), ([1], "one"), ([99], "end"))]
        nodes = [helper.make_node("Slice", ["x", "four", "end", "one"], ["none"], "none"),
                 helper.make_node("Slice", ["x", "zero", "four", "one"], ["all"], "all"),
                 helper.make_node("Concat", ["none", "all", "none"], ["cat"], "cat", axis=1),
                 helper.make_node(tail, ["cat" if tail == "Relu" else "none"], ["out"], "tail")]
        g = helper.make_graph(nodes, "roll0", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
        path = tmp_path / f"{tail}.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path
    _agree(model("Relu"), {"x": np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)})
    with pytest.raises(UserError, match="node 'tail' \\(Sigmoid\\) reads 'none', a tensor with no element "
                                        "\\(shape \\[2, 0, 3\\]\\)"):
        compile_model(str(model("Sigmoid")))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_slices_of_an_activation_compute_what_onnx_runtime_computes(tmp_path, data):
    """ONNX Slice (any axes, negative and out-of-range starts and ends, negative steps) and Split."""
    shape = data.draw(st.lists(st.integers(1, 6), min_size=2, max_size=4))
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    starts, ends, steps = [], [], []
    for ax in axes:
        d = shape[ax]
        step = data.draw(st.sampled_from([1, 2, -1, -2]))
        starts.append(data.draw(st.integers(-d - 2, d + 2)))
        ends.append(data.draw(st.integers(-d - 2, d + 2)))
        steps.append(step)
    index = [slice(None)] * len(shape)
    for ax, start, end, step in zip(axes, starts, ends, steps):
        index[ax % len(shape)] = slice(start, end, step)
    expect = np.zeros(shape, np.float32)[tuple(index)].shape
    if 0 in expect:
        return                                                    # an empty result: nothing to compute
    split_axis = data.draw(st.integers(0, len(shape) - 1))
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in ((starts, "starts"), (ends, "ends"), (axes, "axes"), (steps, "steps"))]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"], "slice"),
             helper.make_node("Relu", ["s"], ["out"], "relu")]
    outs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, list(expect))]
    if shape[split_axis] % 2 == 0:                 # opset 13 splits evenly when no sizes are given
        nodes.append(helper.make_node("Split", ["x"], ["a", "b"], "split", axis=split_axis))
        outs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")]
    g = helper.make_graph(nodes, "slices", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], outs, inits)
    path = tmp_path / "slice.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    _agree(path, {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)})


def _gelu_graph(form: str, tanh: bool = False):
    from tuner.graph.builder import GraphBuilder
    b = GraphBuilder(form)
    x = b.input("x", (2, 8))
    c = lambda v: b.const(np.float32(v))  # noqa: E731
    if tanh:        # 1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)), x^3 as Pow imports it, as HF's GPT-2 writes it
        cube = b.add("mul", [b.add("mul", [x, x]), x])
        inner = b.add("add", [x, b.add("mul", [cube, c(0.044715)]) if form != "mul" else
                              b.add("mul", [c(0.044715), cube])])
        one_plus = b.add("add", [c(1.0), b.add("tanh", [b.add("mul", [inner, c((2 / np.pi) ** 0.5)])])])
    else:
        one_plus = b.add("add", [b.add("erf", [b.add("div", [x, c(2 ** 0.5)]) if form != "mul" else
                                              b.add("mul", [x, c(2 ** -0.5)])]), c(1.0)])
    if form == "half_first":       # (x * 0.5) * (1 + erf(x / sqrt 2)): torch's dynamo export
        y = b.add("mul", [b.add("mul", [x, c(0.5)]), one_plus])
    elif form == "half_last":      # (x * (1 + erf)) * 0.5: torch's legacy export
        y = b.add("mul", [b.add("mul", [x, one_plus]), c(0.5)])
    else:                          # x * ((1 + erf(x * 1/sqrt 2)) * 0.5)
        y = b.add("mul", [x, b.add("mul", [one_plus, c(0.5)])])
    return b.finish([y])


@pytest.mark.parametrize("tanh", [False, True], ids=["erf", "tanh"])
@pytest.mark.parametrize("form", ["half_first", "half_last", "mul"])
def test_gelu_written_in_any_association_becomes_one_gelu_that_computes_the_same(form, tanh):
    from tuner.graph import interp
    from tuner.graph.passes import optimize
    g = _gelu_graph(form, tanh)
    fused = optimize(g, passes=["FuseTransformerOps"])
    assert [n.op for n in fused.nodes] == ["gelu_tanh" if tanh else "gelu"]
    x = np.linspace(-4, 4, 16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_allclose(interp.run(fused, x)[0], interp.run(g, x)[0], rtol=1e-6, atol=1e-7)


def test_a_decomposed_layer_norm_and_gelu_become_one_kernel_each_and_their_dense_a_task(tmp_path):
    """torch's legacy export at opset 14 writes LayerNorm as ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add."""
    torch = pytest.importorskip("torch")
    from tuner.graph import load
    from tuner.graph.passes import optimize
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
    x = torch.randn(1, 5, 16)
    _export(torch, torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False), (x,), tmp_path / "layer.onnx",
            14, False, ["x"])
    g = optimize(load(str(tmp_path / "layer.onnx")))
    ops = [n.op for n in g.nodes]
    assert ops.count("layer_norm") == 2 and ops.count("gelu") == 1
    assert not {"mean", "sqrt", "erf"} & set(ops)
    specs = [t.workload.spec for t in g.meta["tasks"] if t.tunable]
    assert any(s.startswith("dense:") and "act=gelu" in s for s in specs), specs


SMALL = {"bert": (dict(layers=2, hidden=32, heads=4, ffn=64, seq=8, vocab=50), "input_ids"),
         "vit": (dict(layers=1, hidden=32, heads=4, ffn=64, image=32, patch=8), "pixel_values"),
         "gpt2": (dict(layers=2, hidden=32, heads=4, seq=8, vocab=50), "input_ids")}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_built_in_transformers_compute_what_onnx_runtime_computes_on_their_onnx_and_on_the_export(
        tmp_path, tmp_cache, name):
    """Written as the exporters write them and imported, with no torch: compiled, they agree with
    ONNX Runtime on the ONNX they were built from and on `to_onnx` of the imported graph (integer
    inputs keep their type there)."""
    from tuner.graph import transformer_models
    from tuner.graph.onnx_frontend import to_onnx
    kw, inp = SMALL[name]
    build = getattr(transformer_models, name)
    onnx.save(build(**kw, as_onnx=True), str(tmp_path / "m.onnx"))
    graph = build(**kw)
    rng = np.random.default_rng(1)
    shape = list(graph.inputs[0].shape)
    x = (rng.integers(0, kw["vocab"], shape) if "vocab" in kw else rng.standard_normal(shape)).astype(
        np.int64 if "vocab" in kw else np.float32)
    onnx.save(to_onnx(graph, opset=17), str(tmp_path / "export.onnx"))
    m = compile_model(graph, target="cpu -threads=1", use_shipped=False)
    out = m.run(**{inp: x})[0]
    for path in ("m.onnx", "export.onnx"):
        ref = ort_run(tmp_path / path, {inp: x})[0]
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_the_built_in_transformers_are_models_the_cli_knows(capsys):
    from tuner.cli import main
    assert main(["models"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("bert_base", "vit_b16", "gpt2"))


def test_a_tunable_operator_with_an_epilogue_its_workload_lacks_stays_a_task_and_the_rest_joins_the_softmax(tmp_cache):
    """ViT scales Q.K^T by a Div after the batch_matmul, which batch_matmul's workload does not take:
    the batch_matmul is a task, never one generic kernel with the scale, and the scale (a product
    with the constant's reciprocal by then) joins the softmax that reads it (one row-by-row kernel)."""
    from tuner.graph import transformer_models
    from tuner.graph.passes import optimize
    from tuner.graph.passes.extract_tasks import group_summary
    g = optimize(transformer_models.vit(**dict(SMALL["vit"][0], patch=16)))     # 5 tokens: no padded columns
    summaries = [group_summary(g, grp.nodes) for grp in g.meta["fused_groups"]]
    assert "batch_matmul" in summaries and "mul + softmax" in summaries and "batch_matmul + mul" not in summaries
    assert {t.workload.op for t in g.meta["tasks"] if t.tunable} >= {"batch_matmul", "dense"}


def test_a_batch_matmul_whose_columns_no_vector_divides_keeps_them_unless_padmatmulcolumns_is_asked_for():
    """ViT-small's 17 tokens: by default Q.K^T runs on its 17 columns (a guarded last tile); with
    PadMatmulColumns in the pipeline it runs on 24 zero-padded columns and the slice keeps 17 (the
    built-in test above checks the default's numbers against ONNX Runtime)."""
    from tuner.graph import transformer_models
    from tuner.graph.passes import DEFAULT_PIPELINE, optimize

    def bmm_columns(g):
        return {t.workload.p["N"] for t in g.meta["tasks"] if t.tunable and t.workload.op == "batch_matmul"}
    g = optimize(transformer_models.vit(**SMALL["vit"][0]))
    assert 17 in bmm_columns(g) and 24 not in bmm_columns(g) and not any(n.op == "pad" for n in g.nodes)
    passes = list(DEFAULT_PIPELINE)
    passes.insert(passes.index("FuseTransformerOps") + 1, "PadMatmulColumns")
    g = optimize(transformer_models.vit(**SMALL["vit"][0]), passes=passes)
    assert 24 in bmm_columns(g) and 17 not in bmm_columns(g)
    assert any(n.op == "slice" and n.output.shape[-1] == 17 for n in g.nodes)
    assert any(n.op == "pad" for n in g.nodes)


def test_a_group_whose_output_is_a_pad_gets_its_vectorised_default_schedule():
    """The padded K^T of ViT's Q.K^T (reshape + transpose + pad): the pad is the group's output,
    computed, not inlined; the group runs its sketch's default point, not the unscheduled fallback."""
    import numpy as np

    from tuner.compiler.compile_model import _generic_kernel
    from tuner.ops.common import pad_spatial
    from tuner.target import parse_target
    from tuner.te.tensor import compute, placeholder
    x = placeholder((2, 17, 16), "x")
    t = compute((2, 16, 17), lambda b, i, j: x[b, j, i], "transpose", inputs=[x])
    out = pad_spatial(t, (1, 2), (0, 0, 0, 7), name="pad")
    from tuner.measure.builder import build_batch
    from tuner.toolchain.library import open_library, pointer_array
    target = parse_target("cpu -threads=1")
    steps, src, _, _ = _generic_kernel(([x], out), target, "f")
    assert steps and ["compute_inline", "pad"] not in steps and ["compute_inline", "transpose"] in steps
    assert any(s[0] == "annotate" and s[-1] == "vectorize" for s in steps)
    built = build_batch([("f", src)], target, jobs=1)[0]
    xs = np.random.default_rng(0).standard_normal((2, 17, 16)).astype(np.float32)
    got = np.full((2, 16, 24), np.nan, np.float32)
    assert open_library(built.lib).tuner_run(built.index, pointer_array([xs, got])) == 0
    np.testing.assert_array_equal(got, np.pad(xs.transpose(0, 2, 1), ((0, 0), (0, 0), (0, 7))))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_pytorch_peer_runs_the_built_in_transformers_and_computes_what_the_interpreter_computes(name):
    """bench's PyTorch eager peer runs a transformer graph op by op (embedding gather, batch_matmul,
    layer_norm, erf or tanh), so the figures can time it beside ONNX Runtime."""
    pytest.importorskip("torch")
    from tuner.compare.peers import torch_runner
    from tuner.graph import interp, transformer_models
    kw, _ = SMALL[name]
    graph = getattr(transformer_models, name)(**kw)
    shape = list(graph.inputs[0].shape)
    rng = np.random.default_rng(2)
    x = (rng.integers(-kw["vocab"], kw["vocab"], shape).astype(np.int64) if "vocab" in kw     # -1: the last row
         else rng.standard_normal(shape).astype(np.float32))
    out = torch_runner(graph, 1)([x])[0]
    ref = interp.run(graph, x)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@settings(max_examples=25, deadline=None)
@given(ks=st.lists(st.integers(1, 20), min_size=1, max_size=4), biased=st.lists(st.booleans(), min_size=4, max_size=4),
       exposed=st.integers(-1, 3), seed=st.integers(0, 100))
def test_dense_layers_reading_one_activation_merge_into_one_that_computes_the_same(ks, biased, exposed, seed):
    """Q, K and V projections (any number of dense layers reading one activation, any widths, some
    with a bias, one whose product is also a model output) become one dense whose outputs are
    sliced back, with one bias add when every layer had one; a lone dense is left alone."""
    from tuner.graph import interp
    from tuner.graph.builder import GraphBuilder
    from tuner.graph.passes import optimize
    rng = np.random.default_rng(seed)
    b = GraphBuilder("parallel")
    x = b.input("x", (1, 3, 6))
    outs = []
    for k, width in enumerate(ks):
        y = b.add("dense", [x, b.const(rng.standard_normal((width, 6)).astype(np.float32))])
        if k == exposed:
            outs.append(y)
        if biased[k]:
            y = b.add("add", [y, b.const(rng.standard_normal(width).astype(np.float32))])
        outs.append(b.add("relu", [y]))
    g = b.finish(outs)
    merged = optimize(g, passes=["InferType", "MergeParallelDense"])
    dense = [n for n in merged.nodes if n.op == "dense"]
    assert len(dense) == 1 and dense[0].output.shape[-1] == sum(ks)
    with_bias = len(ks) > 1 and all(biased[:len(ks)]) and not 0 <= exposed < len(ks)
    assert sum(n.op == "add" for n in merged.nodes) == (1 if with_bias else sum(biased[:len(ks)]))
    assert (len(ks) > 1) == any(n.op == "slice" for n in merged.nodes)
    xs = rng.standard_normal((1, 3, 6)).astype(np.float32)
    for got, want in zip(interp.run(merged, xs), interp.run(g, xs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bert_with_parallel_dense_merged_runs_its_q_k_and_v_projections_as_one_gemm_task():
    from tuner.graph import transformer_models
    from tuner.graph.passes import DEFAULT_PIPELINE, optimize
    passes = list(DEFAULT_PIPELINE)
    passes.insert(passes.index("FuseTransformerOps") + 1, "MergeParallelDense")
    g = optimize(transformer_models.bert(**SMALL["bert"][0]), passes=passes)
    dense = [t.workload.p for t in g.meta["tasks"] if t.tunable and t.workload.op == "dense"]
    hidden = SMALL["bert"][0]["hidden"]
    assert {p["K"] for p in dense} >= {3 * hidden} and not any(p["K"] == hidden and p["bias"] and not p.get("residual")
                                                               for p in dense)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_attention_fused_into_one_row_by_row_kernel_computes_what_onnx_runtime_computes(tmp_path, tmp_cache, name):
    """fuse_attention: Q.K^T, its scale, mask or slice, the softmax and P.V are one generic group per
    layer, computed row by row (P.V accumulating in the row's buffer); without it nothing changes."""
    from tuner.graph import transformer_models
    from tuner.graph.passes import optimize
    from tuner.graph.passes.extract_tasks import group_summary
    kw, inp = SMALL[name]
    build = getattr(transformer_models, name)
    onnx.save(build(**kw, as_onnx=True), str(tmp_path / "m.onnx"))
    fused = optimize(build(**kw), fuse_attention=True)
    attention = [s for s in (group_summary(fused, grp.nodes) for grp in fused.meta["fused_groups"])
                 if s.startswith("batch_matmul") and s.endswith("softmax + batch_matmul")]
    assert len(attention) == kw["layers"]
    assert not any(t.workload is not None and t.workload.op == "batch_matmul" for t in fused.meta["tasks"])
    plain = optimize(build(**kw))
    assert not any("softmax + batch_matmul" in group_summary(plain, grp.nodes) for grp in plain.meta["fused_groups"])
    rng = np.random.default_rng(2)
    shape = list(fused.inputs[0].shape)
    x = (rng.integers(0, kw["vocab"], shape) if "vocab" in kw else rng.standard_normal(shape)).astype(
        np.int64 if "vocab" in kw else np.float32)
    m = compile_model(build(**kw), target="cpu -threads=2", use_shipped=False, fuse_attention=True)
    steps = [s for s in m.steps if s.summary.endswith("softmax + batch_matmul")]
    assert len(steps) == kw["layers"] and all(["cache_write", s.steps[-1][1]] in s.steps for s in steps)
    ref = ort_run(tmp_path / "m.onnx", {inp: x})[0]
    np.testing.assert_allclose(m.run(**{inp: x})[0], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_a_reduction_is_vectorised_along_the_axis_its_reads_run_on():
    """Q.K^T with K^T given (K x N): its reads stride along the reduction and run along N, so the
    reduction loop goes outside and N is the vector; given K transposed (N x K) they run along the
    reduction, which stays the vector of partial sums."""
    import importlib

    from tuner.ops.dense import batch_matmul
    from tuner.schedule.schedule import Schedule
    from tuner.target import parse_target
    from tuner.te.tensor import placeholder
    cm = importlib.import_module("tuner.compiler.compile_model")
    tgt = parse_target("cpu -threads=1")
    q = placeholder((2, 8, 16), "q")
    for trans_b, vector in ((False, "n"), (True, "s_r")):
        k = placeholder((2, 32, 16) if trans_b else (2, 16, 32), "k")
        (st,) = [s for s in Schedule([q, k], batch_matmul(q, k, trans_b, "s")).stages if s.name == "s"]
        steps = cm._stage_steps(st, tgt)
        assert ["annotate", "s", vector, "vectorize"] in steps
        assert any(s[0] == "reorder" for s in steps) == (not trans_b)


def _attention_graph(lead: int, rows: int, heads: int, d: int, spelling: str, seed: int):
    """x [lead, rows, heads * d] -> Q, K, V projections -> heads (Reshape then Transpose, or a
    Transpose of a 5-D Reshape's axes, as `spelling` says) -> Q.K^T -> P.V -> heads merged -> a
    projection: attention as exporters write it, without the softmax."""
    from tuner.graph.builder import GraphBuilder
    rng = np.random.default_rng(seed)
    b = GraphBuilder("heads")
    x = b.input("x", (lead, rows, heads * d))

    def proj(v, k):
        return b.add("dense", [v, b.const(rng.standard_normal((k, v.shape[-1])).astype(np.float32))])

    def split(v, perm):
        if spelling == "unsqueezed":     # [lead, 1, rows, heads, d], the 1 dropped after the transpose
            t = b.add("transpose", [b.add("reshape", [v], {"shape": [lead, 1, rows, heads, d]})],
                      {"perm": [0, 1] + [p + 1 for p in perm[1:]]})
            return b.add("reshape", [t], {"shape": [lead] + list(t.shape[2:])})
        return b.add("transpose", [b.add("reshape", [v], {"shape": [lead, rows, heads, d]})], {"perm": perm})
    q, k, v = (proj(x, heads * d) for _ in range(3))
    s = b.add("batch_matmul", [split(q, [0, 2, 1, 3]), split(k, [0, 2, 3, 1])], {"trans_b": 0})
    ctx = b.add("batch_matmul", [s, split(v, [0, 2, 1, 3])], {"trans_b": 0})
    merged = b.add("reshape", [b.add("transpose", [ctx], {"perm": [0, 2, 1, 3]})], {"shape": [lead, rows, heads * d]})
    return b.finish([proj(merged, 8)])


@settings(max_examples=25, deadline=None)
@given(lead=st.integers(1, 2), rows=st.integers(1, 6), heads=st.integers(1, 4), d=st.integers(1, 5),
       spelling=st.sampled_from(["reshaped", "unsqueezed"]), seed=st.integers(0, 100))
def test_heads_split_and_merged_by_reshape_and_transpose_are_read_in_place_and_compute_the_same(
        lead, rows, heads, d, spelling, seed):
    """Q's and V's split into heads become the batch_matmuls' a_heads / b_heads and the context's
    merge the output projection's in_heads, however the exporter spells them; K's transpose into
    K^T is no such view and stays a copy."""
    from tuner.graph import interp
    from tuner.graph.passes import optimize
    g = _attention_graph(lead, rows, heads, d, spelling, seed)
    views = optimize(g, passes=["InferType", "AbsorbHeadViews"])
    qk, pv = [n for n in views.nodes if n.op == "batch_matmul"]
    h = heads if heads > 1 and rows > 1 else None       # one head, or one row, is no split: left alone
    assert (qk.attrs.get("a_heads"), qk.attrs.get("b_heads"), pv.attrs.get("a_heads"), pv.attrs.get("b_heads")) \
        == (h, None, None, h)
    assert [n.attrs.get("in_heads") for n in views.nodes if n.op == "dense"] == [None, None, None, h]
    assert sum(n.op == "transpose" for n in views.nodes) == (1 if h else 4)
    xs = np.random.default_rng(seed).standard_normal((lead, rows, heads * d)).astype(np.float32)
    (got,), (want,) = interp.run(views, xs), interp.run(g, xs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 12), keys=st.integers(1, 9), heads=st.integers(1, 3), seed=st.integers(0, 100))
def test_a_few_query_rows_read_the_keys_in_place_of_their_transposed_copy(rows, keys, heads, seed):
    """A decoding step's scores, a few query rows (new tokens) times K^T: the batch_matmul reads K
    itself (trans_b) and the transpose, a pass over the whole cache, is gone; more rows keep the
    copy, which gives their GEMM contiguous columns."""
    from tuner.ops.dense import KEYS_IN_PLACE_ROWS
    from tuner.graph import interp
    from tuner.graph.builder import GraphBuilder
    from tuner.graph.passes import optimize
    b = GraphBuilder("scores")
    q, k = b.input("q", [1, heads, rows, 8]), b.input("k", [1, heads, keys, 8])
    s = b.add("batch_matmul", [q, b.add("transpose", [k], {"perm": [0, 1, 3, 2]})], {"trans_b": 0})
    g = b.finish([b.add("softmax", [s], {"axis": -1})])
    views = optimize(g, passes=["InferType", "AbsorbHeadViews"])
    [mm] = [n for n in views.nodes if n.op == "batch_matmul"]
    assert (mm.attrs["trans_b"], any(n.op == "transpose" for n in views.nodes)) == \
        ((1, False) if rows <= KEYS_IN_PLACE_ROWS else (0, True))
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    (got,), (want,) = interp.run(views, *xs), interp.run(g, *xs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lead,threads", [(1, 1), (2, 2)])
def test_attention_with_heads_read_in_place_compiles_to_what_the_interpreter_computes(tmp_cache, lead, threads):
    """The heads' views become task workloads (a_heads, b_heads, in_heads and, over a batch,
    in_rows) whose kernels read the projections and the context where they lie."""
    from tuner.graph import interp
    g = _attention_graph(lead, 12, 4, 8, "reshaped", 0)
    m = compile_model(g, threads=threads)
    specs = {s.workload for s in m.steps if s.anchor}
    assert any("a_heads=4" in s for s in specs) and any("b_heads=4" in s for s in specs)
    assert any("in_heads=4" in s and ("in_rows=12" in s) == (lead > 1) for s in specs)
    xs = np.random.default_rng(1).standard_normal((lead, 12, 32)).astype(np.float32)
    np.testing.assert_allclose(m.run(xs)[0], interp.run(g, xs)[0], rtol=1e-4, atol=1e-4)


def _dense_over(rows: int, cols: int, k: int, seed: int, consumers: int = 1, lead: int = 1):
    """x [lead, rows, cols] -> `consumers` dense layers of k outputs, summed."""
    from tuner.graph.builder import GraphBuilder
    rng = np.random.default_rng(seed)
    b = GraphBuilder("wide")
    x = b.input("x", (lead, rows, cols))
    ys = [b.add("dense", [x, b.const(rng.standard_normal((k, cols)).astype(np.float32) / cols ** 0.5)])
          for _ in range(consumers)]
    out = ys[0]
    for y in ys[1:]:
        out = b.add("add", [out, y])
    return b.finish([out])


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), blocks=st.integers(1, 3), extra=st.sampled_from([0, 0, 8]), lead=st.integers(1, 2),
       consumers=st.integers(1, 3), seed=st.integers(0, 100))
def test_a_dense_over_a_wide_activation_of_few_rows_reads_it_packed_in_blocks_of_columns_and_computes_the_same(
        rows, blocks, extra, lead, consumers, seed):
    """PackWideRows: a dense over [1, R, C] with R <= PACK_ROWS, C a multiple of PACK_FLOATS and the
    activation past WIDE_ACTIVATION_BYTES (here lowered to the graph's size) reads it split into
    PACK_FLOATS-column heads (in_heads), one copy for every dense that reads it; a batch, one row or
    a C no block divides is left as it is."""
    from unittest import mock

    from tuner.graph import interp
    from tuner.graph.passes import head_views, optimize
    from tuner.ops.dense import PACK_FLOATS
    cols = blocks * PACK_FLOATS + extra
    g = _dense_over(rows, cols, 8, seed, consumers, lead)
    with mock.patch.object(head_views, "WIDE_ACTIVATION_BYTES", 4 * rows * cols):
        packed = optimize(g, passes=["InferType", "PackWideRows"])
    dense = [n for n in packed.nodes if n.op == "dense"]
    h = cols // PACK_FLOATS if lead == 1 and rows > 1 and not extra else None
    assert len(dense) == consumers and [n.attrs.get("in_heads") for n in dense] == [h] * consumers
    assert sum(n.op == "transpose" for n in packed.nodes) == (1 if h else 0)
    xs = np.random.default_rng(seed).standard_normal((lead, rows, cols)).astype(np.float32)
    (got,), (want,) = interp.run(packed, xs), interp.run(g, xs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_compiled_dense_over_a_2_mib_activation_of_128_rows_reads_a_packed_copy_and_computes_the_reference(tmp_cache):
    """At the real threshold: 128 rows of 4096 floats (2 MiB) are copied once into 64-column blocks
    (a reshape + transpose step), the dense reads them with in_heads=64, blocked by one block per
    chunk (space.sketch), and the model computes what the interpreter does; 64 rows are left as they
    are."""
    from tuner.graph import interp
    for rows, packed in ((128, True), (64, False)):
        g = _dense_over(rows, 4096, 64, 0)
        m = compile_model(g, threads=1, use_shipped=False)
        specs = [s.workload for s in m.steps if s.anchor]
        assert any("in_heads=64" in s for s in specs) == packed and len(specs) == 1
        assert any("transpose" in s.summary for s in m.steps) == packed
        xs = np.random.default_rng(1).standard_normal((1, rows, 4096)).astype(np.float32)
        np.testing.assert_allclose(m.run(xs)[0], interp.run(g, xs)[0], rtol=1e-4, atol=1e-4)


def test_a_record_of_attention_read_through_copies_schedules_the_kernel_that_reads_heads_in_place(tmp_cache, tmp_path):
    """Logs and shipped records tuned before the heads were read in place keep applying: a task
    with view parameters and no record of its own takes its plain workload's record, its
    decisions rendered by the view workload's space, named as such and promising no time (its
    kernel was never measured), and computes the same."""
    import random

    from tuner.database import records
    from tuner.database.result import MeasureResult
    from tuner.graph import interp
    from tuner.target import host_isa, parse_target
    from tuner.task import Task
    target = parse_target(f"cpu -isa={host_isa()} -cores=2 -threads=1")
    g = _attention_graph(1, 12, 4, 8, "reshaped", 0)
    views = [s for s in compile_model(g, target=str(target), use_shipped=False).steps
             if s.anchor and any(f"{k}=4" in s.workload for k in ("a_heads", "b_heads", "in_heads"))]
    assert len(views) == 3
    log, rng, points = tmp_path / "copies.jsonl", random.Random(0), {}
    from tuner.ops.workload import parse_spec
    for s in views:
        spec, layout = s.workload.rsplit(" [", 1)
        plain = parse_spec(spec, layout.rstrip("]")).plain()
        task = Task(plain, target)
        points[s.workload_key] = dec = task.space.sample(rng)
        steps = task.space.steps(dec)
        records.append(log, [records.make_record(plain, str(target), steps, MeasureResult("OK", costs=[1e-5] * 3),
                                                 task.candidate(steps).code_hash, "test", 0, decisions=dec)])
    m = compile_model(g, log=str(log), target=str(target), use_shipped=False)
    taken = {s.workload_key: s for s in m.steps if s.workload_key in points}
    assert len(taken) == 3 and all(s.source == "plain record" and s.expected_s is None for s in taken.values())
    assert "3 run a record of their operands as copies" in m.report()
    for key, s in taken.items():
        spec, layout = s.workload.rsplit(" [", 1)
        assert s.steps == Task(parse_spec(spec, layout.rstrip("]")), target).space.steps(points[key])
    xs = np.random.default_rng(2).standard_normal((1, 12, 32)).astype(np.float32)
    np.testing.assert_allclose(m.run(xs)[0], interp.run(g, xs)[0], rtol=1e-4, atol=1e-4)


def test_a_model_tune_times_attention_fused_and_apart_and_compile_applies_the_faster(tmp_cache, tmp_path):
    """Attention as one kernel or as its batch_matmuls and a softmax (and Q, K and V as one GEMM or
    three) is a choice with a cost either way: after the search the tune times the whole model
    both ways, the plan line keeps both times and the faster, compile applies it (and says so),
    and an explicit choice overrides it."""
    from tuner.database import records
    from tuner.graph import interp, transformer_models
    from tuner.model_tuning import tune_model
    g = transformer_models.bert(**SMALL["bert"][0])
    log = tmp_path / "bert.jsonl"
    res = tune_model(g, trials=12, log=str(log), target="cpu -threads=1", warmup_batch=1, progress=False)
    timed = records.load(log).plans[-1].choices
    assert set(timed) == {"fuse_attention", "merge_dense"}
    assert all(c["on"] == (c["s"][0] < c["s"][1]) and min(c["s"]) > 0 for c in timed.values())
    choice = timed["fuse_attention"]
    assert "fuse_attention: " + ("on" if choice["on"] else "off") in res.table()
    m = compile_model(g, log=str(log), threads=1)
    merged = [s for s in m.steps if s.anchor and f"K={3 * SMALL['bert'][0]['hidden']}," in s.workload]
    assert bool(merged) == timed["merge_dense"]["on"] and m.meta["choices"]["merge_dense"]["from"] == str(log)
    fused = [s for s in m.steps if s.summary.endswith("softmax + batch_matmul")]
    assert bool(fused) == choice["on"] and m.meta["choices"]["fuse_attention"] == {"on": choice["on"], "from": str(log)}
    assert ("attention fused into one kernel" if choice["on"] else "attention as batch_matmuls") in m.report()
    forced = compile_model(g, log=str(log), threads=1, fuse_attention=not choice["on"])
    assert bool([s for s in forced.steps if s.summary.endswith("softmax + batch_matmul")]) != choice["on"]
    ids = np.arange(8, dtype=np.int64).reshape(1, 8) % 50
    for model in (m, forced):
        np.testing.assert_allclose(model.run(ids)[0], interp.run(g, ids)[0], rtol=1e-4, atol=1e-4)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.integers(1, 24), heads=st.sampled_from([1, 2, 4]), d=st.sampled_from([4, 8, 24, 40]),
       threads=st.sampled_from([1, 2]), causal=st.booleans())
def test_fused_attention_over_blocks_of_query_rows_computes_what_the_interpreter_computes(
        tmp_cache, seq, heads, d, threads, causal):
    """The fused attention kernel takes as many query rows at once as divide the rows and keep P.V's
    accumulators in registers (block_rows; one row for a prime length such as ViT's 197), each K
    and V vector it loads feeding every row of the block, Q.K^T over as many columns at a time as
    fit; any length, head size, mask and thread count gives the interpreter's output."""
    import importlib

    from tuner.graph import interp, transformer_models
    from tuner.target import parse_target
    cm = importlib.import_module("tuner.compiler.compile_model")
    build = transformer_models.gpt2 if causal else transformer_models.bert
    g = build(layers=1, hidden=heads * d, heads=heads, seq=seq, vocab=30, **({} if causal else {"ffn": 16}))
    m = compile_model(g, threads=threads, use_shipped=False, fuse_attention=True)
    (step,) = [s for s in m.steps if s.summary.endswith("softmax + batch_matmul")]
    lanes = parse_target(f"cpu -threads={threads}").lanes
    r = max(k for k in range(1, 9) if seq % k == 0 and k * -(-d // lanes) <= cm._accumulators(
        parse_target(f"cpu -threads={threads}")) or k == 1)
    assert (["split", step.steps[-1][1], "m_", [r]] in step.steps) == (r > 1)
    ids = np.random.default_rng(seq).integers(0, 30, (1, seq)).astype(np.int64)
    np.testing.assert_allclose(m.run(ids)[0], interp.run(g, ids)[0], rtol=1e-4, atol=1e-4)
