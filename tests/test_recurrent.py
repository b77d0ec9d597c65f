"""ONNX LSTM and GRU (text recognisers, speech and time-series models, timm's Sequencer) unrolled
over their fixed sequence, against ONNX Runtime: torch's exports compiled, and hand-written nodes
over every direction, layout, reset form and initial state interpreted."""
import numpy as np
import onnx
import pytest
from conftest import ort_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tuner.compiler import compile_model
from tuner.errors import UserError
from tuner.graph import interp
from tuner.graph.onnx_frontend import load_onnx

pytest.importorskip("onnxruntime", reason="onnxruntime is the reference for imported models")
RNG = np.random.default_rng(0)


def _f32(*shape):
    return (RNG.standard_normal(shape) * 0.5).astype(np.float32)


def _rnn_model(path, op, seq, batch, feat, hid, direction="forward", layout=0, bias=True, initial=False,
               before_reset=0, seed=0, **extra):
    """y = Y of one LSTM or GRU node (and Y_h as a second output), its weights random constants
    (the same for the same seed)."""
    rng = np.random.default_rng(seed)
    _f32 = lambda *shape: (rng.standard_normal(shape) * 0.5).astype(np.float32)  # noqa: E731
    g, dirs = {"LSTM": 4, "GRU": 3}[op], 2 if direction == "bidirectional" else 1
    inits = {"W": _f32(dirs, g * hid, feat), "R": _f32(dirs, g * hid, hid)}
    names = ["x", "W", "R", "B" if bias else ""]
    if bias:
        inits["B"] = _f32(dirs, 2 * g * hid)
    if initial:
        names += ["", "h0"] + (["c0"] if op == "LSTM" else [])
        for name in ["h0"] + (["c0"] if op == "LSTM" else []):     # layout 1 holds them batch first
            inits[name] = np.ascontiguousarray(_f32(dirs, batch, hid).transpose((1, 0, 2) if layout else (0, 1, 2)))
    attrs = dict(hidden_size=hid, direction=direction, layout=layout, **extra)
    if op == "GRU":
        attrs["linear_before_reset"] = before_reset
    node = helper.make_node(op, names, ["y", "y_h"], name="rnn", **attrs)
    shape = [batch, seq, feat] if layout else [seq, batch, feat]
    graph = helper.make_graph([node], "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h")],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, shape


def _want(tmp_path, path, form: dict, layout: int, x) -> list:
    """ONNX Runtime's Y and Y_h; for layout 1 (batch first, which it does not run), those of the same
    node in layout 0 on the input transposed, transposed back."""
    if not layout:
        return ort_run(path, x)
    twin, _ = _rnn_model(tmp_path / "twin.onnx", layout=0, **form)
    y, y_h = ort_run(twin, np.ascontiguousarray(x.transpose(1, 0, 2)))
    return [y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["LSTM", "GRU"]), direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
       layout=st.integers(0, 1), bias=st.booleans(), initial=st.booleans(), before_reset=st.integers(0, 1),
       seq=st.integers(1, 4), batch=st.integers(1, 3))
def test_every_lstm_and_gru_form_interprets_as_onnx_runtime_computes_it(tmp_path, op, direction, layout, bias,
                                                                        initial, before_reset, seq, batch):
    form = dict(op=op, seq=seq, batch=batch, feat=5, hid=4, direction=direction, bias=bias, initial=initial,
                before_reset=before_reset)
    path, shape = _rnn_model(tmp_path / "r.onnx", layout=layout, **form)
    x = _f32(*shape)
    got, want = interp.run(load_onnx(path), x), _want(tmp_path, path, form, layout, x)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, before_reset", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
def test_a_bidirectional_batch_first_rnn_with_initial_states_compiles_to_what_onnx_runtime_computes(
        tmp_path, tmp_cache, op, before_reset):
    form = dict(op=op, seq=6, batch=2, feat=8, hid=16, direction="bidirectional", bias=True, initial=True,
                before_reset=before_reset)
    path, shape = _rnn_model(tmp_path / "r.onnx", layout=1, **form)
    x = _f32(*shape)
    got = compile_model(str(path), target="cpu -threads=1", use_shipped=False).run(x)
    want = _want(tmp_path, path, form, 1, x)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_unrolled_rnn_stores_its_recurrent_weights_once_not_once_per_step(tmp_path, tmp_cache):
    form = dict(op="LSTM", seq=24, batch=1, feat=8, hid=32, direction="bidirectional", bias=True)
    path, shape = _rnn_model(tmp_path / "r.onnx", **form)
    x = _f32(*shape)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-5)
    given = sum(numpy_helper.to_array(t).nbytes for t in onnx.load(str(path)).graph.initializer)
    r_bytes = 2 * 4 * 32 * 32 * 4       # R of both directions: 24 steps' copies would be 24x this
    assert given > r_bytes and m.meta["weights_bytes"] < given + r_bytes


def test_an_unrolled_rnns_steps_share_kernels_each_lowered_once(tmp_path, tmp_cache, monkeypatch):
    import sys

    from tuner.task import Task
    cm = sys.modules["tuner.compiler.compile_model"]      # the package exports a function of that name
    calls = {"generic": 0, "task": 0}

    def counted(kind, fn):
        def wrapped(*a, **k):
            calls[kind] += 1
            return fn(*a, **k)
        return wrapped
    monkeypatch.setattr(cm, "_generic_kernel", counted("generic", cm._generic_kernel))
    monkeypatch.setattr(Task, "candidate", counted("task", Task.candidate))
    form = dict(op="LSTM", seq=24, batch=1, feat=8, hid=32, direction="forward", bias=True)
    path, shape = _rnn_model(tmp_path / "r.onnx", **form)
    x = _f32(*shape)
    m = compile_model(str(path), target="cpu -threads=1", use_shipped=False)
    np.testing.assert_allclose(m.run(x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-5)
    generic = [s for s in m.steps if s.workload_key is None]
    tasks = [s for s in m.steps if s.workload_key is not None]
    assert len(generic) >= 24 and len(tasks) >= 24
    # a lowering per structure (the first and last steps differ), not one per step
    assert len({s.func for s in generic}) <= calls["generic"] < len(generic) // 2
    assert calls["task"] == len({s.workload_key for s in tasks}) < len(tasks) // 4


def test_dataflows_differing_in_a_constant_they_compute_with_key_apart_and_renamed_ones_alike():
    from tuner.compiler.compile_model import _dag_key
    from tuner.te.expr import Const
    from tuner.te.tensor import compute, placeholder

    def dag(c, name="y", n=8):
        x = placeholder((n,), "in0")
        return [x], compute((n,), lambda i: x[i] * Const(c), name, inputs=[x])
    assert _dag_key(dag(0.5)) == _dag_key(dag(0.5)) != _dag_key(dag(0.25))
    assert _dag_key(dag(0.0)) != _dag_key(dag(-0.0))
    assert _dag_key(dag(2.0)) != _dag_key(dag(2))
    assert _dag_key(dag(0.5)) != _dag_key(dag(0.5, n=9)) != _dag_key(dag(0.5, name="z"))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torchs_two_layer_bidirectional_rnn_exported_by_torch_compiles_to_what_onnx_runtime_computes(
        tmp_path, tmp_cache, kind):
    torch = pytest.importorskip("torch", reason="torch is not installed (the [bench] extra)")
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(12, 16, num_layers=2, bidirectional=True, batch_first=True)
            self.fc = torch.nn.Linear(32, 5)

        def forward(self, x):
            return self.fc(self.rnn(x)[0])

    x = torch.randn(2, 7, 12)
    path = str(tmp_path / "rnn.onnx")
    torch.onnx.export(Net().eval(), (x,), path, input_names=["x"], opset_version=17, dynamo=False)
    got = compile_model(path, target="cpu -threads=1", use_shipped=False).run(x.numpy())[0]
    np.testing.assert_allclose(got, ort_run(path, x.numpy())[0], rtol=1e-5, atol=1e-5)


def test_an_rnn_the_tool_cannot_run_is_a_one_line_error_naming_the_node(tmp_path):
    cases = [(dict(activations=["Relu", "Tanh", "Tanh"]), "activations .* are not supported"),
             (dict(clip=3.0), "clip and input_forget are not supported")]
    for extra, msg in cases:
        path, _ = _rnn_model(tmp_path / "bad.onnx", "LSTM", 3, 1, 5, 4, **extra)
        with pytest.raises(UserError, match=f"node 'rnn' \\(LSTM\\): {msg}"):
            load_onnx(path)
    path, _ = _rnn_model(tmp_path / "long.onnx", "GRU", 3000, 1, 5, 4, "bidirectional")
    with pytest.raises(UserError, match=r"node 'rnn' \(GRU\): 3000 steps in 2 direction\(s\) unroll past the 4096"):
        load_onnx(path)
    g = helper.make_graph([helper.make_node("GRU", ["x"], ["y"], "bare")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "bare.onnx")
    with pytest.raises(UserError, match=r"node 'bare' \(GRU\): needs its inputs X, W and R"):
        load_onnx(tmp_path / "bare.onnx")
