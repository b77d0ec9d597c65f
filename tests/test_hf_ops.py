"""What Hugging Face exports write beyond BERT, ViT and GPT-2, compiled against ONNX Runtime: LLaMA's
RMSNorm (Reciprocal), RoBERTa's position ids (CumSum of the ids, GatherElements), the attention mask
as transformers index it (GatherND of the mask, And with a constant causal mask), wav2vec 2.0's
GroupNorm (InstanceNormalization), Whisper's and wav2vec 2.0's Conv1d, ids reshaped before their lookup."""
import numpy as np
import onnx
import pytest
from conftest import agree_with_onnxruntime
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.compiler import compile_model
from tuner.errors import UserError

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def _save(path, nodes, inputs: dict, out, inits: dict, opset: int = 18):
    """inputs: name -> (ONNX element type, shape)."""
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_rms_norm_as_llama_exports_it_computes_what_onnx_runtime_computes(tmp_path):
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "last"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["xn"]),
             helper.make_node("Mul", ["weight", "xn"], ["y"])]
    inits = {"two": np.array(2.0, np.float32), "last": np.array([-1], np.int64), "eps": np.array(1e-6, np.float32),
             "weight": _f32(24)}
    path = _save(tmp_path / "rms.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 5, 24])}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(1, 5, 24)})


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(exclusive=st.integers(0, 1), reverse=st.integers(0, 1), axis=st.sampled_from([1, -1, 0]))
def test_a_running_sum_of_integer_ids_computes_what_onnx_runtime_computes(tmp_path, exclusive, reverse, axis):
    """RoBERTa's position ids: cumsum of (ids != pad), times the mask, plus pad, looked up in a table."""
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["keep"]),
             helper.make_node("Cast", ["keep"], ["keep_i"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["keep_i", "axis"], ["run"], exclusive=exclusive, reverse=reverse),
             helper.make_node("Mul", ["run", "keep_i"], ["masked"]),
             helper.make_node("Add", ["masked", "pad"], ["pos"]),
             helper.make_node("Gather", ["table", "pos"], ["y"])]
    inits = {"pad": np.array(1, np.int64), "axis": np.array(axis, np.int64), "table": _f32(12, 3)}
    path = _save(tmp_path / "pos.onnx", nodes, {"ids": (TensorProto.INT64, [2, 9])}, "y", inits)
    ids = RNG.integers(0, 4, (2, 9)).astype(np.int64)
    agree_with_onnxruntime(path, {"ids": ids})


@pytest.mark.parametrize("const_data", [True, False])
def test_gather_elements_at_run_time_indices_computes_what_onnx_runtime_computes(tmp_path, const_data):
    # RoBERTa's token types: a constant row gathered at position ids; and an activation gathered
    nodes = [helper.make_node("GatherElements", ["data", "idx"], ["g"], axis=1),
             helper.make_node("Add", ["g", "zero"], ["y"])]
    data = _f32(3, 6)
    inputs = {"idx": (TensorProto.INT64, [2, 4])} | ({} if const_data else {"data": (TensorProto.FLOAT, [3, 6])})
    inits = {"zero": np.zeros(1, np.float32)} | ({"data": data} if const_data else {})
    path = _save(tmp_path / "ge.onnx", nodes, inputs, "y", inits)
    feeds = {"idx": np.array([[0, 5, -1, 2], [3, 3, -6, 1]], np.int64)} | ({} if const_data else {"data": data})
    agree_with_onnxruntime(path, feeds)


def test_an_attention_mask_indexed_as_transformers_do_computes_what_onnx_runtime_computes(tmp_path):
    """mask[batch, kv] as GatherND at constant indices, And with a constant causal mask (a bool
    constant in a kernel), Where to -inf-like, added to scores, softmax."""
    seq = 6
    rows = np.stack(np.meshgrid(np.zeros(1, np.int64), np.arange(seq), indexing="ij"), -1).reshape(1, 1, 1, seq, 2)
    causal = np.tril(np.ones((seq, seq), bool))[None, None]
    nodes = [helper.make_node("Cast", ["mask"], ["mb"], to=TensorProto.BOOL),
             helper.make_node("GatherND", ["mb", "rows"], ["kv"]),
             helper.make_node("And", ["causal", "kv"], ["allowed"]),
             helper.make_node("Where", ["allowed", "zero", "neg"], ["bias"]),
             helper.make_node("Add", ["scores", "bias"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    inits = {"rows": rows, "causal": causal, "zero": np.zeros(1, np.float32), "neg": np.array([-1e9], np.float32)}
    path = _save(tmp_path / "mask.onnx", nodes, {"mask": (TensorProto.INT64, [1, seq]),
                                                 "scores": (TensorProto.FLOAT, [1, 2, seq, seq])}, "y", inits)
    mask = np.array([[1, 1, 1, 1, 0, 0]], np.int64)
    agree_with_onnxruntime(path, {"mask": mask, "scores": _f32(1, 2, seq, seq)})
    m = compile_model(str(path), threads=1)
    out = m.run(mask=mask, scores=_f32(1, 2, seq, seq))[0]
    assert np.all(out[..., 4:] < 1e-6) and np.allclose(out.sum(-1), 1, atol=1e-5)   # padded keys get nothing


def test_instance_normalization_as_torch_writes_group_norm_computes_what_onnx_runtime_computes(tmp_path):
    nodes = [helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-5)]
    inits = {"scale": _f32(8), "bias": _f32(8)}
    path = _save(tmp_path / "in.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 8, 50])}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(1, 8, 50) * 3 + 1})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(1, 5), stride=st.integers(1, 3), dil=st.integers(1, 2), pads=st.tuples(st.integers(0, 3),
       st.integers(0, 3)), groups=st.sampled_from([1, 2, 8]), bias=st.booleans(), length=st.integers(9, 30))
def test_a_1d_convolution_computes_what_onnx_runtime_computes(tmp_path, k, stride, dil, pads, groups, bias, length):
    c, out = 8, 16
    attrs = dict(kernel_shape=[k], strides=[stride], dilations=[dil], pads=list(pads), group=groups)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], **attrs),
             helper.make_node("Relu", ["c"], ["y"])]
    inits = {"w": _f32(out, c // groups, k)} | ({"b": _f32(out)} if bias else {})
    path = _save(tmp_path / "c1.onnx", nodes, {"x": (TensorProto.FLOAT, [1, c, length])}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(1, c, length)})


def test_ids_reshaped_before_their_lookup_are_checked_against_the_table(tmp_path):
    # GPT-2 views its ids as (-1, seq) before the embedding
    nodes = [helper.make_node("Reshape", ["ids", "shape"], ["ids2"]),
             helper.make_node("Gather", ["table", "ids2"], ["y"])]
    path = _save(tmp_path / "ids.onnx", nodes, {"ids": (TensorProto.INT64, [1, 5])}, "y",
                 {"shape": np.array([-1, 5], np.int64), "table": _f32(7, 4)})
    m = compile_model(str(path), threads=1)
    assert m.inputs[0]["range"] == [-7, 7]
    ids = m.random_inputs(seed=3)[0]
    assert ids.min() >= -7 and ids.max() < 7
    agree_with_onnxruntime(path, {"ids": ids})
    with pytest.raises(UserError, match=r"input ids holds 7, outside \[-7, 7\)"):
        m.run(ids=np.full((1, 5), 7, np.int64))


COORDS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "half_pixel_symmetric"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), mode=st.sampled_from(["nearest", "linear", "cubic"]), coords=st.sampled_from(COORDS),
       nearest=st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]), by_size=st.booleans())
def test_a_resize_between_convs_computes_what_onnx_runtime_computes(tmp_path, data, mode, coords, nearest, by_size):
    """Segmentation heads, FPNs and MobileViT: Resize of a conv's output (blocked layout) by scales or
    to sizes, up or down, in every mode and coordinate rule."""
    exclude = data.draw(st.integers(0, 1)) if mode == "cubic" else 0
    h, w = data.draw(st.integers(2, 9)), data.draw(st.integers(2, 9))
    if by_size:
        out = [1, 16, data.draw(st.integers(1, 20)), data.draw(st.integers(1, 20))]
        extra, inits = ["", "", "sizes"], {"sizes": np.array(out, np.int64)}
    else:
        sc = [1.0, 1.0] + [data.draw(st.sampled_from([0.5, 0.75, 1.0, 1.5, 2.0, 3.0])) for _ in range(2)]
        extra, inits = ["", "scales"], {"scales": np.array(sc, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c1", *extra], ["r"], mode=mode, coordinate_transformation_mode=coords,
                              nearest_mode=nearest, exclude_outside=exclude),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    inits |= {"w1": _f32(16, 3, 3, 3), "w2": _f32(4, 16, 1, 1)}
    path = _save(tmp_path / "rs.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 3, h, w])}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(1, 3, h, w)})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_a_resize_reads_through_its_tables_in_a_scalar_loop_not_in_vectors_built_lane_by_lane(tmp_path, mode):
    """A resize's addresses come from its index tables: its vector loop runs scalar under omp simd
    (1.4-1.9x faster than one load per lane into a vector) and computes what ONNX Runtime does."""
    import re
    from tuner.codegen.c import PRELUDE
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode)]
    path = _save(tmp_path / "up.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 16, 14, 14])}, "y",
                 {"scales": np.array([1, 1, 2, 2], np.float32)})
    agree_with_onnxruntime(path, {"x": _f32(1, 16, 14, 14)})
    compile_model(str(path), threads=1).save(str(tmp_path / "built"))
    body = (tmp_path / "built" / "model.c").read_text().replace(PRELUDE, "")
    assert "#pragma omp simd" in body
    assert not re.search(r"\(\(f32x\d+\)\{\w+\[", body), "a vector built from one load per lane"


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_a_segmentation_heads_upsample_runs_in_the_convs_padded_blocks_and_is_transformed_to_nchw_after(tmp_path, mode):
    """A conv of 21 classes (padded to whole blocks) upsampled to the output: the resize keeps the
    padded channels and the blocked layout, in a step of its own, and the transform to NCHW and the
    slice back to 21 channels follow it, not feed it."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Resize", ["c", "", "scales"], ["y"], mode=mode)]
    path = _save(tmp_path / "head.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 16, 7, 7])}, "y",
                 {"w": _f32(21, 16, 1, 1), "scales": np.array([1, 1, 8, 8], np.float32)})
    agree_with_onnxruntime(path, {"x": _f32(1, 16, 7, 7)})
    steps = [s.summary for s in compile_model(str(path), threads=1).steps]
    assert steps[-2:] == ["resize", "layout_transform + slice"], steps


@pytest.mark.parametrize("nearest", ["floor", "ceil", "round_prefer_floor"])
def test_a_half_pixel_symmetric_resize_picks_the_pixel_onnx_runtime_picks_where_the_coordinate_is_whole(
        tmp_path, nearest):
    """3 columns to 1: the coordinate is 1 exactly, and ONNX Runtime computes it just below 1 (its
    offset in float32, the rest in double), so floor takes column 0; so does tuner."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c1", "", "", "sizes"], ["r"], mode="nearest",
                              coordinate_transformation_mode="half_pixel_symmetric", nearest_mode=nearest),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    inits = {"sizes": np.array([1, 16, 1, 1], np.int64), "w1": _f32(16, 3, 3, 3), "w2": _f32(4, 16, 1, 1)}
    path = _save(tmp_path / "rs.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 3, 2, 3])}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(1, 3, 2, 3)})


# (coordinate rule, nearest rule, input H x W, "sizes" or "scales", the last two of them): nearest resizes
# where tuner once picked another pixel than ONNX Runtime. Most put a coordinate on a half that float32
# misses by an ulp or two, which ONNX Runtime ties all the same; 40 to 202 and 176 to 208 also put one
# 1.9e-6 off a half, which it does not tie. The 1.25 scales keep a short axis's length: no length
# changing, the input comes back as it is, but an axis keeping its length beside one that changes is
# resized (unless its scale is 1).
NEAREST_TIES = [
    ("half_pixel", "round_prefer_ceil", (1, 20), "sizes", (1, 6)),            # 14.499999 is 14.5: 15
    ("half_pixel", "round_prefer_floor", (1, 14), "sizes", (1, 19)),          # 6.5000005 is 6.5: 6
    ("half_pixel", "round_prefer_floor", (1, 18), "sizes", (1, 21)),
    ("pytorch_half_pixel", "round_prefer_ceil", (1, 17), "scales", (1.0, 0.3)),
    ("asymmetric", "round_prefer_ceil", (1, 7), "sizes", (1, 8)),             # 3.4999998 is 3.5: 4
    ("asymmetric", "round_prefer_ceil", (1, 13), "sizes", (1, 14)),
    ("half_pixel_symmetric", "round_prefer_floor", (1, 7), "scales", (1.0, 0.6)),
    ("half_pixel_symmetric", "round_prefer_ceil", (1, 18), "scales", (1.0, 0.75)),
    ("half_pixel_symmetric", "round_prefer_floor", (1, 14), "sizes", (1, 19)),
    ("tf_half_pixel_for_nn", "round_prefer_floor", (1, 7), "sizes", (1, 19)),
    ("tf_half_pixel_for_nn", "round_prefer_ceil", (1, 13), "sizes", (1, 1)),
    ("tf_half_pixel_for_nn", "round_prefer_ceil", (1, 9), "scales", (1.0, 0.6)),
    ("half_pixel", "round_prefer_ceil", (1, 40), "sizes", (1, 202)),          # 29.499998: 29, no tie
    ("tf_half_pixel_for_nn", "round_prefer_floor", (1, 176), "sizes", (1, 208)),
    ("half_pixel", "floor", (3, 3), "scales", (1.25, 1.25)),                  # no length changes: a copy
    ("tf_half_pixel_for_nn", "ceil", (2, 3), "scales", (1.25, 1.25)),
    ("asymmetric", "floor", (3, 3), "scales", (1.25, 2.0)),                   # H keeps 3 yet is resized
    ("tf_half_pixel_for_nn", "ceil", (3, 5), "sizes", (7, 5)),
]


@pytest.mark.parametrize("coords, nearest, hw, given, value", NEAREST_TIES,
                         ids=[f"{c}-{r}-{h}x{w}-{g}-{'x'.join(map(str, v))}" for c, r, (h, w), g, v in NEAREST_TIES])
def test_a_nearest_resize_picks_the_pixel_onnx_runtime_picks_where_the_coordinate_is_a_half_in_float32_or_nearly(
        coords, nearest, hw, given, value):
    """Each output holds its source's position in the input, so the pixels picked must be ONNX Runtime's
    exactly; the importer's tables are read by the interpreter (no build)."""
    import onnxruntime as ort

    from tuner.graph import interp
    from tuner.graph.onnx_frontend import from_onnx
    arg = np.array([1, 1, *value], np.int64 if given == "sizes" else np.float32)
    node = helper.make_node("Resize", ["x", "", *([""] if given == "sizes" else []), given], ["y"], mode="nearest",
                            coordinate_transformation_mode=coords, nearest_mode=nearest)
    g = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, *hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(arg, given)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    x = np.arange(hw[0] * hw[1], dtype=np.float32).reshape(1, 1, *hw)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = interp.run(from_onnx(model), x)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_resize_mode_beyond_nearest_linear_and_cubic_is_a_one_line_error_naming_the_node(tmp_path):
    from tuner.graph.onnx_frontend import OnnxImportError, load_onnx
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], "up", mode="quadratic")]
    path = _save(tmp_path / "c.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 2, 4, 4])}, "y",
                 {"scales": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(OnnxImportError, match=r"node 'up' \(Resize\): mode 'quadratic' is not supported") as e:
        load_onnx(path)
    assert "\n" not in str(e.value)


def _small(tf, name: str):
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    if name == "llama":           # RMSNorm, rotary embeddings, grouped KV heads, SiLU gate
        return tf.LlamaModel(tf.LlamaConfig(vocab_size=100, max_position_embeddings=32, num_key_value_heads=2, **small))
    if name == "roberta":         # position ids from a CumSum of the ids
        return tf.RobertaModel(tf.RobertaConfig(vocab_size=100, max_position_embeddings=40, **small),
                               add_pooling_layer=False)
    return tf.T5EncoderModel(tf.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "roberta", "t5"])
def test_hugging_face_models_exported_with_their_attention_mask_compute_what_onnx_runtime_computes(tmp_path, name):
    tf = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    net = _small(tf, name).eval()
    net.config.use_cache = False
    with torch.no_grad():
        for p in net.parameters():           # norms' ones and zero biases random too
            p.uniform_(-0.3, 0.3)

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, ids, mask):
            return self.net(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.randint(2, 100, (1, 9))
    mask = torch.tensor([[1] * 6 + [0] * 3])
    import warnings
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden().eval(), (ids, mask), str(tmp_path / "m.onnx"), input_names=["ids", "mask"],
                          output_names=["out"], opset_version=18, dynamo=True)
    agree_with_onnxruntime(tmp_path / "m.onnx", {"ids": ids.numpy(), "mask": mask.numpy()})


@pytest.mark.parametrize("axis", [0, 2, -1, -2])
def test_flatten_at_every_axis_up_to_the_rank_computes_what_onnx_runtime_computes(tmp_path, axis):
    # the TorchScript exporter writes a 2-D mask's flatten(start_dim=2) as Flatten(axis=2)
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=axis),
             helper.make_node("Relu", ["f"], ["y"])]
    path = _save(tmp_path / "f.onnx", nodes, {"x": (TensorProto.FLOAT, [3, 5])}, "y", {})
    agree_with_onnxruntime(path, {"x": _f32(3, 5)})


def test_a_tile_of_an_activation_computes_what_onnx_runtime_computes(tmp_path):
    # BLOOM's TorchScript export tiles its ALiBi slopes over the batch and heads
    nodes = [helper.make_node("Tile", ["x", "reps"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    path = _save(tmp_path / "t.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 1, 3])}, "y",
                 {"reps": np.array([3, 4, 2], np.int64)})
    agree_with_onnxruntime(path, {"x": _f32(2, 1, 3)})


def test_a_resize_to_a_hostile_size_is_refused_before_anything_is_built(tmp_path):
    from tuner.graph.onnx_frontend import OnnxImportError, load_onnx
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], "up", mode="linear")]
    path = _save(tmp_path / "h.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 2, 4, 4])}, "y",
                 {"sizes": np.array([1, 2, 4, 1 << 40], np.int64)})
    with pytest.raises(OnnxImportError, match=r"node 'up' \(Resize\): axis 3 of length 4 would become 1099511627776"):
        load_onnx(path)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["MaxPool", "AveragePool"]), k=st.integers(1, 4), stride=st.integers(1, 3),
       pads=st.tuples(st.integers(0, 1), st.integers(0, 1)), length=st.integers(8, 30), count_pad=st.integers(0, 1))
def test_a_1d_pooling_computes_what_onnx_runtime_computes(tmp_path, op, k, stride, pads, length, count_pad):
    """SEW pools its sequence with AvgPool1d; CANINE max-pools its characters."""
    attrs = dict(kernel_shape=[k], strides=[stride], pads=[min(v, k - 1) for v in pads]) | (
        {"count_include_pad": count_pad} if op == "AveragePool" else {})
    nodes = [helper.make_node(op, ["x"], ["p"], **attrs), helper.make_node("Relu", ["p"], ["y"])]
    path = _save(tmp_path / "p1.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 6, length])}, "y", {})
    agree_with_onnxruntime(path, {"x": _f32(1, 6, length)})


@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", dict(kernel_shape=[2, 1], strides=[2, 1])),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[1, 3], pads=[0, 1, 1, 1])),
    ("Conv", dict(kernel_shape=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1])),
    ("Conv", dict(kernel_shape=[3, 1], strides=[1, 2], dilations=[2, 1]))],
    ids=["max 2x1 stride 2x1", "average stride 1x3", "conv stride 2x1", "conv dilation 2x1"])
def test_a_window_with_a_stride_or_dilation_per_axis_computes_what_onnx_runtime_computes(tmp_path, op, attrs):
    """Funnel pools its sequence with a (2, 1) window and stride; such nodes are compiled as generic
    kernels (no task)."""
    ins, inits = ["x"], {}
    if op == "Conv":
        ins, inits = ["x", "w"], {"w": _f32(5, 4, *attrs["kernel_shape"])}
    nodes = [helper.make_node(op, ins, ["p"], **attrs), helper.make_node("Relu", ["p"], ["y"])]
    path = _save(tmp_path / "w.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 4, 11, 12])}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(1, 4, 11, 12)})


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["ReduceMax", "ReduceMin"]), axes=st.lists(st.integers(-3, 2), min_size=0, max_size=3,
                                                                       unique=True),
       keep=st.integers(0, 1), opset=st.sampled_from([13, 18]))
def test_reduce_max_and_min_over_any_axes_compute_what_onnx_runtime_computes(tmp_path, op, axes, keep, opset):
    """torch.max(x, dim) and amax (Hiera's unroll) write ReduceMax; no axes: over every axis."""
    if len({a % 3 for a in axes}) != len(axes):
        axes = sorted({a % 3 for a in axes})
    by_input = opset >= 18 and axes
    nodes = [helper.make_node(op, ["x"] + (["axes"] if by_input else []), ["r"], keepdims=keep,
                              **({"axes": axes} if axes and not by_input else {})),
             helper.make_node("Add", ["r", "one"], ["y"])]
    inits = {"one": np.array(1.0, np.float32)} | ({"axes": np.array(axes, np.int64)} if by_input else {})
    path = _save(tmp_path / "r.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 5, 7])}, "y", inits, opset=opset)
    if len(axes) in (0, 3) and not keep:
        with pytest.raises(UserError, match="a reduction to a 0-d value .* export it with keepdim=True"):
            compile_model(str(path))
        return
    agree_with_onnxruntime(path, {"x": _f32(2, 5, 7)})


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_of_integer_ids_computes_what_onnx_runtime_computes(tmp_path, fmod):
    """CANINE hashes its character ids: ((id + 1) * prime) % buckets, looked up in a table; with
    negative operands the sign follows the divisor (fmod=0) or the dividend (fmod=1)."""
    nodes = [helper.make_node("Add", ["ids", "one"], ["p1"]), helper.make_node("Mul", ["p1", "prime"], ["h"]),
             helper.make_node("Mod", ["h", "buckets"], ["b"], fmod=fmod),
             helper.make_node("Mod", ["ids", "signed"], ["s"], fmod=fmod),
             helper.make_node("Add", ["b", "s"], ["bs"]), helper.make_node("Add", ["bs", "shift"], ["at"]),
             helper.make_node("Gather", ["table", "at"], ["y"])]
    inits = {"one": np.array(1, np.int64), "prime": np.array(31, np.int64), "buckets": np.array(16, np.int64),
             "signed": np.array([5, -5, 7, -3], np.int64), "shift": np.array(8, np.int64), "table": _f32(32, 3)}
    path = _save(tmp_path / "mod.onnx", nodes, {"ids": (TensorProto.INT64, [3, 4])}, "y", inits)
    agree_with_onnxruntime(path, {"ids": RNG.integers(-9, 9, (3, 4)).astype(np.int64)})


def test_float_mod_computes_what_onnx_runtime_computes_and_fmod_0_on_floats_is_a_one_line_error(tmp_path):
    nodes = [helper.make_node("Mod", ["x", "d"], ["y"], fmod=1)]
    path = _save(tmp_path / "fmod.onnx", nodes, {"x": (TensorProto.FLOAT, [4, 6])}, "y", {"d": _f32(6) + 2})
    agree_with_onnxruntime(path, {"x": _f32(4, 6) * 5})
    bad = _save(tmp_path / "bad.onnx", [helper.make_node("Mod", ["x", "d"], ["y"], fmod=0)],
                {"x": (TensorProto.FLOAT, [4, 6])}, "y", {"d": _f32(6) + 2})
    with pytest.raises(UserError, match="fmod=0 on float32 operands"):
        compile_model(str(bad))


@pytest.mark.parametrize("data_const", [False, True])
@pytest.mark.parametrize("idx", [[[1], [3]], [[0, 2], [3, 1], [0, 2]]], ids=["rows", "cells, one twice"])
def test_a_scatter_nd_into_or_of_an_activation_computes_what_onnx_runtime_computes(tmp_path, data_const, idx):
    """Funnel writes its pooled sequence into place with ScatterND at constant indices."""
    idx = np.array(idx, np.int64)
    upd_shape = list(idx.shape[:-1]) + [5, 6][idx.shape[-1] - 1:]
    nodes = [helper.make_node("Relu", ["u"], ["ur"]),
             helper.make_node("ScatterND", ["data", "idx", "ur"], ["s"]),
             helper.make_node("Mul", ["s", "two"], ["y"])]
    ins = {"u": (TensorProto.FLOAT, upd_shape)} | ({} if data_const else {"data": (TensorProto.FLOAT, [4, 5, 6])})
    inits = {"idx": idx, "two": np.array(2.0, np.float32)} | ({"data": _f32(4, 5, 6)} if data_const else {})
    if len(idx) == 3:      # a cell written twice: ONNX leaves it undefined, so both updates agree there
        nodes[0] = helper.make_node("Relu", ["u0"], ["ur"])
        nodes.insert(0, helper.make_node("Concat", ["u", "u_first"], ["u0"], axis=0))
        ins["u"] = (TensorProto.FLOAT, [2, 6])
        nodes.insert(0, helper.make_node("Slice", ["u", "z", "o", "z"], ["u_first"]))
        inits |= {"z": np.array([0], np.int64), "o": np.array([1], np.int64)}
    path = _save(tmp_path / "sc.onnx", nodes, ins, "y", inits)
    feeds = {"u": _f32(*ins["u"][1])} | ({} if data_const else {"data": _f32(4, 5, 6)})
    agree_with_onnxruntime(path, feeds)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(axis=st.integers(-3, 2), data=st.data())
def test_a_scatter_elements_into_an_activation_at_constant_indices_computes_what_onnx_runtime_computes(
        tmp_path, axis, data):
    """BART shifts its ids right and writes the start token at column 0 with ScatterElements: the
    updates' shape at most the data's, indices along one axis (negative ones count from its end),
    each written once as ONNX requires."""
    shape = [3, 4, 5]
    ax = axis % 3
    upd_shape = [data.draw(st.integers(1, n)) for n in shape]
    upd_shape[ax] = data.draw(st.integers(1, shape[ax]))
    # distinct targets along the axis for each line of the others: a permutation's first entries
    perm = np.stack([RNG.permutation(shape[ax])[:upd_shape[ax]] for _ in range(int(np.prod(upd_shape)) // upd_shape[ax])])
    idx = np.moveaxis(perm.reshape([n for k, n in enumerate(upd_shape) if k != ax] + [upd_shape[ax]]), -1, ax)
    idx = np.where(RNG.random(idx.shape) < 0.3, idx - shape[ax], idx).astype(np.int64)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ScatterElements", ["r", "idx", "u"], ["y"], axis=axis)]
    path = _save(tmp_path / "se.onnx", nodes, {"x": (TensorProto.FLOAT, shape), "u": (TensorProto.FLOAT, upd_shape)},
                 "y", {"idx": idx})
    agree_with_onnxruntime(path, {"x": _f32(*shape), "u": _f32(*upd_shape)})


def test_a_gather_of_many_scattered_indices_of_an_activation_computes_what_onnx_runtime_computes(tmp_path):
    """ConvBERT's unfold gathers a thousand constant, scattered positions of its activation."""
    at = RNG.integers(-40, 40, (9, 20)).astype(np.int64)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gather", ["r", "at"], ["y"], axis=1)]
    path = _save(tmp_path / "g.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 40, 3])}, "y", {"at": at})
    agree_with_onnxruntime(path, {"x": _f32(2, 40, 3)})


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.lists(st.integers(-7, 6), min_size=1, max_size=12), axis=st.integers(0, 2))
def test_a_gather_at_constant_indices_reads_runs_as_slices_and_scattered_ones_as_one_gather(tmp_path, at, axis):
    """A slice per run of consecutive indices, concatenated, for up to three runs; past that one
    gather at a constant index, never a concat of many one-wide slices (GCC takes seconds on those)."""
    from tuner.graph import load
    from tuner.ops.shape import _runs
    shape = [7, 7, 7]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gather", ["r", "at"], ["y"], axis=axis)]
    path = _save(tmp_path / "g.onnx", nodes, {"x": (TensorProto.FLOAT, shape)}, "y", {"at": np.array(at, np.int64)})
    ops = [n.op for n in load(str(path)).nodes]
    flat = [i % 7 for i in at]
    steps = {b - a for a, b in zip(flat, flat[1:])}
    one_slice = not steps or (len(steps) == 1 and 0 not in steps)
    assert ("gather" in ops) == (not one_slice and len(_runs(flat)) > 3), ops
    assert ops.count("slice") <= 3
    agree_with_onnxruntime(path, {"x": _f32(*shape)})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=3), data=st.data(), axis=st.integers(0, 2))
def test_a_gather_of_each_position_once_in_a_reshaped_order_is_a_reshape_and_transpose(tmp_path, sizes, data, axis):
    """torch's unfold into patches gathers rows at [[0, 2, 4, ...], [1, 3, 5, ...]]: the axis split by
    a reshape and transposed; any order of the split dims imports so, with no gather at a table."""
    from tuner.graph import load
    d = int(np.prod(sizes))
    perm = data.draw(st.permutations(range(len(sizes))))
    at = np.arange(d).reshape(sizes).transpose(perm)
    shape = [5, 3, 4]
    shape[axis] = d
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gather", ["r", "at"], ["y"], axis=axis)]
    path = _save(tmp_path / "g.onnx", nodes, {"x": (TensorProto.FLOAT, shape)}, "y", {"at": at.astype(np.int64)})
    ops = [n.op for n in load(str(path)).nodes]
    assert "gather" not in ops, ops
    agree_with_onnxruntime(path, {"x": _f32(*shape)})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block=st.tuples(st.integers(1, 3), st.integers(1, 3)), strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dil=st.tuples(st.integers(1, 2), st.integers(1, 2)), pads=st.tuples(*[st.integers(0, 1)] * 4),
       hw=st.tuples(st.integers(5, 9), st.integers(5, 9)))
def test_col2im_folds_overlapping_and_disjoint_blocks_as_onnx_runtime_does(tmp_path, block, strides, dil, pads, hw):
    """torch's nn.Fold (MobileViT V2 folds its patches back) as Col2Im: each pixel sums what lands on it."""
    rows = [(s + pads[k] + pads[k + 2] - d * (b - 1) - 1) // st_ + 1
            for k, (s, b, st_, d) in enumerate(zip(hw, block, strides, dil))]
    assume(min(rows) >= 1)
    c = 3
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Col2Im", ["r", "hw", "block"], ["y"], strides=list(strides), dilations=list(dil),
                              pads=list(pads))]
    inits = {"hw": np.array(hw, np.int64), "block": np.array(block, np.int64)}
    shape = [2, c * block[0] * block[1], rows[0] * rows[1]]
    path = _save(tmp_path / "fold.onnx", nodes, {"x": (TensorProto.FLOAT, shape)}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(*shape)})


@pytest.mark.parametrize("block, hw", [((2, 2), (8, 6)), ((1, 3), (5, 9)), ((3, 1), (6, 4)), ((2, 2), (2, 2))])
def test_col2im_whose_blocks_tile_the_image_is_a_reshape_and_transpose(tmp_path, block, hw):
    """Blocks as large as their strides that cover the image (MobileViT V2's 2x2 patches) place each
    column entry on one pixel: a depth-to-space, with no gather at an index table."""
    from tuner.graph import load
    rows = [hw[0] // block[0], hw[1] // block[1]]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Col2Im", ["r", "hw", "block"], ["y"], strides=list(block))]
    inits = {"hw": np.array(hw, np.int64), "block": np.array(block, np.int64)}
    shape = [2, 3 * block[0] * block[1], rows[0] * rows[1]]
    path = _save(tmp_path / "fold.onnx", nodes, {"x": (TensorProto.FLOAT, shape)}, "y", inits)
    ops = [n.op for n in load(str(path)).nodes]
    assert "transpose" in ops and "gather" not in ops, ops
    agree_with_onnxruntime(path, {"x": _f32(*shape)})


def test_a_col2im_to_a_hostile_image_size_is_a_one_line_error_before_any_table_is_built(tmp_path):
    nodes = [helper.make_node("Col2Im", ["x", "hw", "block"], ["y"], strides=[100000, 100000])]
    inits = {"hw": np.array([100000, 100000], np.int64), "block": np.array([1, 1], np.int64)}
    path = _save(tmp_path / "big.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 4, 1])}, "y", inits)
    with pytest.raises(UserError, match="past the .* elements its index tables may hold"):
        compile_model(str(path))


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), one_d=st.booleans(), groups=st.sampled_from([1, 2]), bias=st.booleans(),
       how=st.sampled_from(["pads", "output_shape", "SAME_UPPER", "SAME_LOWER"]))
def test_a_transposed_convolution_computes_what_onnx_runtime_computes(tmp_path, data, one_d, groups, bias, how):
    """ConvTranspose as U-Net and DPT decoders upsample: windows placed whole (kernel = stride) or
    overlapping, cut by pads, grouped, 1-D and 2-D, its size given by pads, output_shape or auto_pad."""
    dims = 1 if one_d else 2
    ints = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=dims, max_size=dims)  # noqa: E731
    k, s, d = data.draw(ints(1, 4)), data.draw(ints(1, 3)), data.draw(ints(1, 2))
    size = data.draw(ints(2, 7))
    op = [data.draw(st.integers(0, v - 1)) for v in s] if how in ("pads", "output_shape") else [0] * dims
    span = [st_ * (i - 1) + o + (kk - 1) * dd + 1 for st_, i, o, kk, dd in zip(s, size, op, k, d)]
    attrs = dict(strides=s, dilations=d, group=groups)
    if how == "pads":
        pads = data.draw(st.lists(st.integers(0, 2), min_size=2 * dims, max_size=2 * dims))
        assume(all(sp - pads[i] - pads[i + dims] >= 1 for i, sp in enumerate(span)))
        attrs |= dict(pads=pads, output_padding=op)
    elif how == "output_shape":
        attrs |= dict(output_shape=[data.draw(st.integers(max(1, sp - 2), sp)) for sp in span], output_padding=op)
    else:
        attrs |= dict(auto_pad=how)
        assume(all(sp >= i * st_ for sp, i, st_ in zip(span, size, s)))
    c, kg = 4, 3
    inits = {"w": _f32(c, kg, *k)} | ({"b": _f32(kg * groups)} if bias else {})
    nodes = [helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["t"], **attrs),
             helper.make_node("Relu", ["t"], ["y"])]
    path = _save(tmp_path / "ct.onnx", nodes, {"x": (TensorProto.FLOAT, [1, c, *size])}, "y", inits)
    agree_with_onnxruntime(path, {"x": _f32(1, c, *size)})


def test_a_transposed_convolution_whose_columns_all_fall_between_strides_computes_its_bias(tmp_path):
    """Stride 2, a 1x1 kernel and an output_shape that keeps only the column between the two that
    land: the image is zeros plus the bias, even where the input holds a NaN (hypothesis found it)."""
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[1, 2], output_shape=[1, 1]),
             helper.make_node("Relu", ["t"], ["y"])]
    path = _save(tmp_path / "hole.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 4, 2, 2])}, "y",
                 {"w": _f32(4, 3, 1, 1), "b": np.abs(_f32(3)) + 0.5})
    x = _f32(1, 4, 2, 2)
    x[0, 1, 0, 1] = np.nan
    agree_with_onnxruntime(path, {"x": x})


def test_a_transposed_convolution_the_tool_cannot_run_is_a_one_line_error_naming_the_node(tmp_path):
    inits = {"w": _f32(4, 2, 3, 3)}
    cases = [(dict(strides=[2, 2], output_padding=[2, 0]), "output_padding must be two integers each below"),
             (dict(output_shape=[40, 40]), "output_shape .* is past what the input"),
             (dict(pads=[3, 3, 3, 3]), r"pads \[3, 3, 3, 3\] leave no output")]
    for attrs, msg in cases:
        nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", **attrs)]
        path = _save(tmp_path / "bad.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 4, 2, 2])}, "y", inits)
        with pytest.raises(UserError, match=f"node 'up' \\(ConvTranspose\\): {msg}"):
            compile_model(str(path))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(["reflect", "edge", "wrap"]), shape=st.sampled_from([[1, 3, 5, 6], [2, 7], [1, 4, 9]]),
       data=st.data())
def test_a_reflect_edge_or_wrap_pad_computes_what_onnx_runtime_computes(tmp_path, mode, shape, data):
    """ReflectionPad2d and ReplicationPad (super-resolution and GAN models) as ONNX Pad's other modes."""
    most = [n - 1 if mode == "reflect" else n + 2 for n in shape]
    lo = [data.draw(st.integers(0, m)) for m in most]
    hi = [data.draw(st.integers(0, m)) for m in most]
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode=mode), helper.make_node("Relu", ["p"], ["y"])]
    path = _save(tmp_path / "pad.onnx", nodes, {"x": (TensorProto.FLOAT, shape)}, "y",
                 {"pads": np.array(lo + hi, np.int64)}, opset=19)
    agree_with_onnxruntime(path, {"x": _f32(*shape)})


def test_a_reflect_pad_wider_than_its_axis_is_a_one_line_error_naming_the_node(tmp_path):
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect", name="rp")]
    path = _save(tmp_path / "pad.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 3])}, "y",
                 {"pads": np.array([0, 3, 0, 0], np.int64)})
    with pytest.raises(UserError, match=r"node 'rp' \(Pad\): pads 3 and 0 of axis 1 \(size 3\) are past what mode=reflect"):
        compile_model(str(path))


@pytest.mark.parametrize("alpha", [None, 0.1, 1.5])
def test_a_leaky_relu_alone_and_after_a_conv_computes_what_onnx_runtime_computes(tmp_path, alpha):
    """YOLO's conv + LeakyRelu (its epilogue) and a LeakyRelu of its own, with ONNX's default alpha or a given one."""
    kw = {} if alpha is None else {"alpha": alpha}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c"], ["l"], **kw),
             helper.make_node("LeakyRelu", ["x"], ["lx"], **kw),
             helper.make_node("ReduceMean", ["lx"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Add", ["l", "m"], ["y"])]
    path = _save(tmp_path / "leaky.onnx", nodes, {"x": (TensorProto.FLOAT, [1, 8, 6, 7])}, "y",
                 {"w": _f32(16, 8, 3, 3), "b": _f32(16)}, opset=17)
    agree_with_onnxruntime(path, {"x": _f32(1, 8, 6, 7)})
    if alpha is None:
        tasks = compile_model(str(path), threads=1).steps
        assert any("act=leaky_relu" in s.workload for s in tasks), [s.workload for s in tasks]


@pytest.mark.parametrize("op,mode,block", [("DepthToSpace", "DCR", 2), ("DepthToSpace", "CRD", 3),
                                           ("SpaceToDepth", None, 2)])
def test_depth_to_space_and_back_compute_what_onnx_runtime_computes(tmp_path, op, mode, block):
    """Pixel shuffle (a super-resolution model's upsampler, CRD) and its DCR and SpaceToDepth kin."""
    shape = [1, 36, 4, 5] if op == "DepthToSpace" else [1, 3, 6, 8]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(op, ["r"], ["y"], blocksize=block, **({"mode": mode} if mode else {}))]
    path = _save(tmp_path / "d2s.onnx", nodes, {"x": (TensorProto.FLOAT, shape)}, "y", {})
    agree_with_onnxruntime(path, {"x": _f32(*shape)})
