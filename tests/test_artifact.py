"""Compiled models under careless and hostile use: any input memory, many threads, the model's own
names and types, a damaged or swapped artifact, and writing one where files already are."""
from __future__ import annotations

import json
import os
import shutil
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.compiler import compile_model
from tuner.errors import UserError
from tuner.graph.models import mobilenet_v2, tiny
from tuner.runtime import load
from tuner.runtime.model import ArtifactError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _layouts_of(x: np.ndarray) -> dict:
    """The same values as `x` in memory that is not C-contiguous, in each way a user meets."""
    big = np.zeros((x.shape[0], x.shape[1], 2 * x.shape[2], 2 * x.shape[3]), np.float32)
    big[:, :, ::2, ::2] = x
    return {"transposed": np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
            "sliced": big[:, :, ::2, ::2],
            "fortran": np.asfortranarray(x),
            "negative strides": np.ascontiguousarray(x[:, ::-1, ::-1, ::-1])[:, ::-1, ::-1, ::-1],
            "big-endian": x.astype(">f4"),
            "read-only": np.frombuffer(x.tobytes(), np.float32).reshape(x.shape)}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NCHW8c"])
def test_inputs_in_any_memory_layout_give_the_outputs_of_a_contiguous_copy(tmp_cache, layout):
    m = compile_model(tiny(), threads=1, layout=layout, use_shipped=False)
    x = m.random_inputs(3)[0]
    want = m.run(x)[0]
    views = _layouts_of(x)
    assert not any(v.flags.c_contiguous and v.dtype == np.float32 and v.flags.writeable for v in views.values())
    for name, v in views.items():
        np.testing.assert_array_equal(v, x)
        for _ in range(3):                      # a freed copy is soon reused: run again after allocating
            junk = [np.full(x.shape, 1e30, np.float32) for _ in range(4)]
            got = m.run(v)[0]
            np.testing.assert_array_equal(got, want, err_msg=name)
            del junk
        assert m.time([v], repeat=1, min_repeat_ms=0.0)[0] > 0
        assert m.profile([v], runs=1)[0].shape == (1, len(m.steps))


@pytest.mark.slow
def test_many_threads_running_one_model_each_get_their_own_outputs(tmp_cache):
    m = compile_model(mobilenet_v2(image=32), threads=1, use_shipped=False)
    inputs = [m.random_inputs(seed)[0] for seed in range(8)]
    want = [m.run(x)[0] for x in inputs]
    wrong, done = [], []

    def hammer(k):
        for i in range(40):
            j = (k + i) % len(inputs)
            if not np.array_equal(m.run(inputs[j])[0], want[j]):
                wrong.append((k, i))
            done.append(1)
    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 6 * 40 and not wrong, f"{len(wrong)} wrong outputs"
    assert 1 < len(m._arenas) <= 6                 # calls overlapped: an arena per call in flight, kept


def test_a_step_index_past_the_last_is_a_user_error(tmp_cache):
    m = compile_model(tiny(), threads=1, use_shipped=False)
    for step in (len(m.steps), -2, 10**6):
        with pytest.raises(UserError, match="step must be -1"):
            m.time(step=step)


# ---------------------------------------------------------------- the model's own interface

def _onnx_model(path, in_name="image/in", out_name="logits:0", in_type=TensorProto.FLOAT, nodes=None):
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    nodes = nodes or [helper.make_node("Conv", [in_name, "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", ["c"], [out_name], "relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(in_name, in_type, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_a_compiled_model_keeps_the_onnx_names_of_its_inputs_and_outputs(tmp_cache, tmp_path):
    import onnxruntime
    path = _onnx_model(tmp_path / "m.onnx")
    m = compile_model(path, threads=1, use_shipped=False)
    assert [s["name"] for s in m.inputs] == ["image/in"] and [s["name"] for s in m.outputs] == ["logits:0"]
    x = m.random_inputs(0)[0]
    ref = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"image/in": x})[0]
    np.testing.assert_allclose(m.run(**{"image/in": x})[0], ref, rtol=1e-4, atol=1e-4)
    m.save(tmp_path / "art")
    assert [s["name"] for s in load(tmp_path / "art").outputs] == ["logits:0"]


@pytest.mark.parametrize("elem", [TensorProto.BOOL, TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_an_input_that_is_not_float32_or_an_integer_is_refused_with_its_name_and_type(tmp_path, elem):
    path = _onnx_model(tmp_path / "m.onnx", in_type=elem)
    with pytest.raises(UserError, match=f"input 'image/in' is {TensorProto.DataType.Name(elem)}"):
        compile_model(path, threads=1)


def test_an_integer_input_into_an_operator_that_computes_in_float_is_refused_naming_both(tmp_path):
    path = _onnx_model(tmp_path / "m.onnx", in_type=TensorProto.INT64)
    with pytest.raises(UserError, match="conv2d .*input image.in is int64; conv2d takes float32"):
        compile_model(path, threads=1)


@pytest.mark.parametrize("clash", ["two nodes", "an input"])
def test_a_graph_that_defines_a_value_twice_is_refused(tmp_path, clash):
    twice = "c" if clash == "two nodes" else "x"
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], [twice], "again"),
             helper.make_node("Relu", ["c"], ["y"], "relu")]
    path = _onnx_model(tmp_path / "m.onnx", in_name="x", out_name="y", nodes=nodes)
    with pytest.raises(UserError, match=f"node 'again' \\(Relu\\) defines '{twice}', which .* already defines"):
        compile_model(path, threads=1)


# ---------------------------------------------------------------- a damaged or swapped artifact

@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("TUNER_CACHE_DIR")
    os.environ["TUNER_CACHE_DIR"] = str(cache)
    try:
        d = tmp_path_factory.mktemp("art") / "tiny"
        m = compile_model(tiny(), threads=1, use_shipped=False)
        m.save(d)
        other = tmp_path_factory.mktemp("other") / "tiny"
        compile_model(tiny(seed=1), threads=1, use_shipped=False).save(other)
    finally:
        if old is None:
            os.environ.pop("TUNER_CACHE_DIR")
        else:
            os.environ["TUNER_CACHE_DIR"] = old
    x = m.random_inputs(0)
    return d, other, x, m.run(*x)[0]


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.just(10**400) | st.floats()
                    | st.text(max_size=12), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                                                max_size=3),
                    max_leaves=6)


def _damaged(data, v):
    """`v` with one value somewhere inside it replaced, a key added or removed, or a number moved."""
    if isinstance(v, dict) and v and data.draw(st.booleans()):
        k = data.draw(st.sampled_from(sorted(v)))
        how = data.draw(st.sampled_from(["inside", "drop", "add"]))
        if how == "drop":
            return {a: b for a, b in v.items() if a != k}
        if how == "add":
            return {**v, data.draw(st.text(max_size=6)): data.draw(JSON)}
        return {**v, k: _damaged(data, v[k])}
    if isinstance(v, list) and v and data.draw(st.booleans()):
        k = data.draw(st.integers(0, len(v) - 1))
        return v[:k] + [_damaged(data, v[k])] + v[k + 1:]
    if isinstance(v, int) and not isinstance(v, bool) and data.draw(st.booleans()):
        return v + data.draw(st.integers(-5, 5))
    return data.draw(JSON | st.just(v))


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_field_of_model_json_damaged_is_refused_or_harmless(artifact, tmp_path_factory, data):
    d, _, x, want = artifact
    art = _copy(d, tmp_path_factory.mktemp("fuzz") / "a")
    meta = _damaged(data, json.loads((art / "model.json").read_text()))
    (art / "model.json").write_text(json.dumps(meta) if data.draw(st.booleans()) else "[" * 100_000)
    try:
        m = load(art)
    except ArtifactError as e:
        assert "\n" not in str(e) and str(art) in str(e)
        return
    np.testing.assert_array_equal(m.run(*x)[0], want)
    assert m.report()


@pytest.mark.parametrize("edit", ["batch 2", "smaller input", "other dtype", "no inputs", "no outputs",
                                  "smaller output", "arena 4", "arena -100", "library ../", "library absolute",
                                  "model_hash", "format 1", "target", "step args", "extra step key",
                                  "huge bytes", "plan of ints"])
def test_known_damage_to_model_json_is_a_one_line_error(artifact, tmp_path, edit):
    d, *_ = artifact
    art = _copy(d, tmp_path / "a")
    meta = json.loads((art / "model.json").read_text())
    lib = meta["library"]
    change = {"batch 2": lambda: meta["inputs"][0]["shape"].__setitem__(0, 2),
              "smaller input": lambda: meta["inputs"][0]["shape"].__setitem__(2, 8),
              "other dtype": lambda: meta["inputs"][0].__setitem__("dtype", "float64"),
              "no inputs": lambda: meta.__setitem__("inputs", []),
              "no outputs": lambda: meta.__setitem__("outputs", []),
              "smaller output": lambda: meta["outputs"][0]["shape"].__setitem__(1, 5),
              "arena 4": lambda: meta.__setitem__("arena_bytes", 4),
              "arena -100": lambda: meta.__setitem__("arena_bytes", -100),
              "library ../": lambda: meta.__setitem__("library", f"../{art.name}/{lib}"),
              "library absolute": lambda: meta.__setitem__("library", str(art / lib)),
              "model_hash": lambda: meta.__setitem__("model_hash", "0" * 20),
              "format 1": lambda: meta.__setitem__("format", 1),
              "target": lambda: meta.__setitem__("target", meta["target"].replace("-threads=1", "-threads=2")),
              "step args": lambda: meta["steps"][0].__setitem__("args", [["input", 0, 9]]),
              "extra step key": lambda: meta["steps"][0].__setitem__("extra", 1),
              "huge bytes": lambda: meta.__setitem__("intermediate_bytes", 10**400),
              "plan of ints": lambda: meta.__setitem__("layout_plan", {"conv1": 5})}[edit]
    change()
    (art / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError) as e:
        load(art)
    assert "\n" not in str(e.value) and "compile the model again" in str(e.value)


@pytest.mark.parametrize("swap", ["other weights", "truncated weights", "extended weights", "weights a directory",
                                  "no weights", "truncated library",
                                  "other library", "empty model.json"])
def test_a_swapped_or_truncated_file_of_the_artifact_is_refused(artifact, tmp_path, swap):
    d, other, *_ = artifact
    art = _copy(d, tmp_path / "a")
    lib = json.loads((art / "model.json").read_text())["library"]
    other_lib = json.loads((other / "model.json").read_text())["library"]
    if swap == "other weights":
        assert (other / "weights.bin").stat().st_size == (art / "weights.bin").stat().st_size
        shutil.copyfile(other / "weights.bin", art / "weights.bin")
    elif swap == "truncated weights":
        (art / "weights.bin").write_bytes((art / "weights.bin").read_bytes()[:100])
    elif swap == "extended weights":       # the right bytes, then more: read into storage of the declared size
        (art / "weights.bin").write_bytes((art / "weights.bin").read_bytes() + bytes(64))
    elif swap == "weights a directory":
        (art / "weights.bin").unlink()
        (art / "weights.bin").mkdir()
    elif swap == "no weights":
        (art / "weights.bin").unlink()
    elif swap == "truncated library":
        (art / lib).write_bytes((art / lib).read_bytes()[:1000])
    elif swap == "other library":          # another model's library under this one's name
        shutil.copyfile(other / other_lib, art / lib)
    else:
        (art / "model.json").write_text("")
    with pytest.raises(ArtifactError) as e:
        load(art)
    assert "\n" not in str(e.value)


def test_an_artifact_moved_elsewhere_loads_and_runs(artifact, tmp_path):
    d, other, x, want = artifact
    np.testing.assert_array_equal(load(_copy(d, tmp_path / "a")).run(*x)[0], want)


# ---------------------------------------------------------------- writing an artifact

def test_saving_into_a_directory_of_other_files_is_refused_and_touches_nothing(artifact, tmp_path):
    d, *_ = artifact
    m = load(d)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.c").write_text("my own code")
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(UserError, match="is a directory that is not a compiled model"):
        m.save(mine)
    assert (mine / "model.c").read_text() == "my own code" and sorted(p.name for p in mine.iterdir()) == [
        "model.c", "notes.txt"]


def test_saving_never_writes_through_a_symbolic_link(artifact, tmp_path):
    d, *_ = artifact
    m = load(d)
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"keep me")
    art = _copy(d, tmp_path / "a")
    (art / "weights.bin").unlink()
    (art / "weights.bin").symlink_to(precious)
    with pytest.raises(UserError, match="not a compiled model"):
        m.save(art)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UserError, match="symbolic link"):
        m.save(link)
    assert precious.read_bytes() == b"keep me" and not (tmp_path / "elsewhere").exists()


def test_saving_over_an_artifact_replaces_it_whole(artifact, tmp_path, monkeypatch):
    d, other, x, want = artifact
    art = _copy(other, tmp_path / "a")
    art.chmod(0o750)
    load(d).save(art)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"] and len(list(art.iterdir())) == 4   # no temporaries
    np.testing.assert_array_equal(load(art).run(*x)[0], want)
    assert (art.stat().st_mode & 0o777) == 0o750
    monkeypatch.chdir(art)
    load(other).save(".")                                               # -o . works too
    assert not np.array_equal(load(art).run(*x)[0], want) and len(list(art.glob("model-*.so"))) == 1


def test_a_save_that_fails_halfway_leaves_the_old_artifact_or_one_load_refuses(artifact, tmp_path, monkeypatch):
    d, other, x, want = artifact
    art = _copy(d, tmp_path / "a")
    real = os.replace
    for fail_at in range(1, 5):                  # the n-th rename of a new file into place fails
        calls = []

        def flaky(a, b, _n=fail_at):
            calls.append(b)
            if len(calls) == _n:
                raise OSError(28, "No space left on device")
            return real(a, b)
        monkeypatch.setattr(os, "replace", flaky)
        with pytest.raises(UserError, match="No space left"):
            load(other).save(art)
        monkeypatch.setattr(os, "replace", real)
        try:
            np.testing.assert_array_equal(load(art).run(*x)[0], want)
        except ArtifactError:
            pass                                  # a mix is refused; never run
        assert not [p for p in art.iterdir() if p.name.startswith(".tuner-")]
        art = _copy(d, tmp_path / f"a{fail_at}")


def test_a_directory_with_a_model_json_of_its_own_is_not_an_artifact(artifact, tmp_path):
    d, *_ = artifact
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.json").write_text('{"my": "precious config"}')
    (mine / "weights.bin").write_bytes(b"mine")
    with pytest.raises(UserError, match="not a compiled model"):
        load(d).save(mine)
    assert (mine / "model.json").read_text() == '{"my": "precious config"}'


@pytest.mark.slow
def test_names_that_are_python_parameters_work_as_inputs_and_outputs(tmp_cache, tmp_path):
    import subprocess
    import sys
    nodes = [helper.make_node("Conv", ["self", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["file"], "relu"), helper.make_node("Sigmoid", ["c"], ["allow_pickle"])]
    path = _onnx_model(tmp_path / "m.onnx", in_name="self", out_name="file", nodes=nodes)
    m = compile_model(path, threads=1, use_shipped=False)
    x = m.random_inputs(0)[0]
    assert [s["name"] for s in m.outputs] == ["file"]
    np.testing.assert_array_equal(m.run(self=x)[0], m.run(x)[0])
    g = onnx.load(path)
    g.graph.output.append(helper.make_tensor_value_info("allow_pickle", TensorProto.FLOAT, [1, 4, 8, 8]))
    onnx.save(g, str(tmp_path / "two.onnx"))
    art = tmp_path / "art"
    two = compile_model(str(tmp_path / "two.onnx"), threads=1, use_shipped=False)
    two.save(art)
    want = two.run(x)
    np.save(tmp_path / "x.npy", x)
    out = subprocess.run([sys.executable, "-m", "tuner.cli", "run", str(art), "--input", f"self={tmp_path / 'x.npy'}",
                          "-o", str(tmp_path / "y.npz")], capture_output=True, text=True,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    with np.load(tmp_path / "y.npz") as z:
        assert sorted(z.files) == ["allow_pickle", "file"]
        np.testing.assert_array_equal(z["file"], want[0])
        np.testing.assert_array_equal(z["allow_pickle"], want[1])


def test_bench_refuses_an_artifact_whose_model_file_now_holds_another_model(tmp_cache, tmp_path):
    from tuner.compare.bench import _model_for
    from tuner.graph.onnx_frontend import to_onnx
    path = tmp_path / "m.onnx"
    onnx.save(to_onnx(tiny()), str(path))
    compile_model(str(path), threads=1, use_shipped=False).save(tmp_path / "art")
    assert _model_for(str(tmp_path / "art"), 1, [])[0].meta["model_hash"]
    onnx.save(to_onnx(tiny(seed=5)), str(path))
    with pytest.raises(UserError, match="was compiled from another model than"):
        _model_for(str(tmp_path / "art"), 1, [])
