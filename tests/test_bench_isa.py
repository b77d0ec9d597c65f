"""bench/isa.py: a benchmark's peers shown an AVX2 CPU on an AVX-512 host (CPUID faulting)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLAGS = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), []) \
    if os.path.exists("/proc/cpuinfo") else []
MASKABLE = pytest.mark.skipif("avx512f" not in FLAGS or "cpuid_fault" not in FLAGS,
                              reason="needs an AVX-512 host whose CPUID can fault (cpuid_fault in /proc/cpuinfo)")


def _python(code: str, isa: str | None = "avx2") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TUNER_BENCH_ISA"}
    if isa is not None:
        env["TUNER_BENCH_ISA"] = isa
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


@MASKABLE
def test_with_the_variable_set_onnx_runtime_reads_a_cpu_without_avx512_and_still_computes_right():
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the [test] extra)")
    p = _python("""
import bench, bench.isa as isa
assert not isa._lib.leaf7_ebx() & (1 << 16), "AVX-512F still shown"
before = isa.facts()["peers_cpuid_calls_masked"]
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
w = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 48])], [numpy_helper.from_array(w, "w")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
f = isa.facts()
assert f["peers_isa"] == "avx2" and f["peers_cpuid_calls_masked"] > before, (before, f)
from tuner.target import parse_target
print(parse_target("cpu", 2), f["host_isa_emulated_on"])
""")
    assert p.returncode == 0, p.stderr
    out = p.stdout.split()        # tuner's target "cpu" is AVX2's here too; the real ISA is recorded
    assert out[1] == "-isa=avx2" and out[-1] == "avx512", p.stdout


@MASKABLE
def test_a_real_segfault_under_the_mask_still_kills_the_process_rather_than_looping():
    p = _python("import bench, ctypes; ctypes.string_at(0)")
    assert p.returncode == -11, (p.returncode, p.stderr[-500:])


def test_an_isa_the_mask_cannot_show_is_refused_naming_the_variable():
    p = _python("import bench", isa="sse")
    assert p.returncode != 0 and "TUNER_BENCH_ISA='sse'" in p.stderr and "Traceback" not in p.stderr


@MASKABLE
def test_masking_after_a_peer_has_read_the_cpu_is_refused():
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the [test] extra)")
    p = _python("import onnxruntime\nfrom bench.isa import emulate\nemulate('avx2')", isa=None)
    assert p.returncode != 0 and "onnxruntime already loaded" in p.stderr
