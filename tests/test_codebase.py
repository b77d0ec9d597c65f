"""The codebase's own rules: layered packages without import cycles (pyproject's import-linter
contracts), a clean ruff check, a runtime that never loads the compiler, a public API with real
signatures, and a wheel that carries the shipped schedules."""
import inspect
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import tuner

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} is not installed: pip install -e '.[test]'"
    return path


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts of `root`/pyproject.toml over the `tuner` package under `root`."""
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


CYCLES = """
import sys, grimp
graph = grimp.build_graph("tuner", cache_dir=None)
assert graph.modules, "no modules found"
edges = 0
for a in sorted(graph.modules):
    for b in sorted(graph.find_modules_directly_imported_by(a)):
        edges += 1
        chain = graph.find_shortest_chain(importer=b, imported=a)
        if chain:
            print("cycle:", " -> ".join((a, *chain)))
print("edges", edges)
"""


def _cycles(root: Path) -> tuple:
    """(the cycles printed, how many import edges were checked) of the `tuner` package under root."""
    out = subprocess.run([sys.executable, "-c", CYCLES], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    return [ln for ln in lines if ln.startswith("cycle:")], int(lines[-1].split()[1])


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "tuner", tmp_path / "tuner", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_every_package_imports_only_the_layers_below_it():
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 kept, 0 broken" in out.stdout


def test_the_layer_check_fails_on_a_planted_upward_import(tmp_path):
    root = _copy(tmp_path)
    lib = root / "tuner" / "toolchain" / "library.py"
    lib.write_text(lib.read_text() + "\n\ndef _planted():\n    from ..cli import main\n    return main\n")
    out = _lint_imports(root)
    assert out.returncode != 0
    assert "tuner.toolchain.library -> tuner.cli" in out.stdout, out.stdout[-3000:]


def test_no_module_is_part_of_an_import_cycle():
    cycles, edges = _cycles(ROOT)
    assert edges > 200            # the graph really was read
    assert cycles == []


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    root = _copy(tmp_path)
    expr = root / "tuner" / "te" / "expr.py"          # te.tensor imports te.expr
    expr.write_text(expr.read_text() + "\n\ndef _planted():\n    from .tensor import compute\n    return compute\n")
    cycles, _ = _cycles(root)
    assert any("tuner.te.expr" in c and "tuner.te.tensor" in c for c in cycles), cycles


def test_ruff_finds_nothing_to_fix():
    out = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]


RUNTIME_ONLY = {"tuner", "tuner.errors", "tuner.target", "tuner.te", "tuner.te.layouts"}


def test_loading_a_compiled_model_loads_no_part_of_the_compiler():
    code = ("import sys, tuner; tuner.load; "
            "print('\\n'.join(sorted(m for m in sys.modules if m == 'tuner' or m.startswith('tuner.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(out.stdout.split())
    assert "tuner.runtime.model" in loaded
    extra = {m for m in loaded - RUNTIME_ONLY if not m.startswith(("tuner.runtime", "tuner.toolchain"))}
    assert extra == set()


MEASURING_ONLY = {"tuner", "tuner.errors", "tuner.measure"}


@pytest.mark.parametrize("module", ["tuner.measure.worker", "tuner.measure.cuda_worker", "tuner.cost_model.feature_worker"])
def test_a_worker_process_starts_without_warnings_and_ends_with_its_input(module):
    """Started as the tuner starts it (python -m), with its input closed at once."""
    out = subprocess.run([sys.executable, "-W", "error", "-X", "importtime", "-m", module], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = {ln.split("|")[-1].strip() for ln in out.stderr.splitlines() if ln.startswith("import time:")}
    assert "tuner.toolchain.process" in loaded
    if module == "tuner.measure.worker":       # the process restarted after every crash loads little
        ours = {m for m in loaded if m == "tuner" or m.startswith("tuner.")}
        assert {m for m in ours - MEASURING_ONLY if not m.startswith("tuner.toolchain")} == set()


@pytest.mark.parametrize("name, params", [
    ("compile", {"model", "log", "target", "threads", "layout", "input_shapes", "strict", "predict"}),
    ("tune", {"model", "trials", "log"}),
    ("load", {"path"}),
    ("tune_op", {"workload", "trials", "log"}),
    ("build_op", {"workload", "log"}),
    ("analyze", {"path"}),
])
def test_the_public_api_shows_its_parameters(name, params):
    fn = getattr(tuner, name)
    assert params <= set(inspect.signature(fn).parameters), inspect.signature(fn)
    assert fn.__doc__ and len(fn.__doc__) > 40


def test_an_unknown_api_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'compiel'"):
        tuner.compiel


@pytest.mark.slow
@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_environment_finds_the_shipped_schedules(tmp_path):
    """A regular (not editable) install: the wheel carries tuner/schedules/ and the compiler finds
    it through the package; with a host that matches a shipped target, steps take its records."""
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)]
    try:
        import setuptools  # noqa: F401
        build.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("tuner-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    # the dependencies come from this environment's site-packages (a plain path: its .pth files,
    # this checkout's editable install among them, are not read); tuner from the wheel alone
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    check = ("import json, sys, tuner\n"
             "from tuner.database import records\n"
             "from tuner.target import parse_target\n"
             "p = records.shipped_database(parse_target('cpu', 1))\n"
             "from tuner.cost_model.pretrain import shipped_model\n"
             "print(json.dumps({'tuner': tuner.__file__, 'db': str(p), 'records': len(records.load(p).records),\n"
             "                  'model': str(shipped_model(parse_target('cpu', 1))),\n"
             "                  'targets': sorted({r.target for r in records.load(p).records}),\n"
             "                  'host': str(parse_target('cpu', 1))}))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([py, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    assert facts["tuner"].startswith(site) and facts["db"].startswith(site) and facts["model"].startswith(site), facts
    assert facts["records"] > 100
    art = tmp_path / "r50"       # (every shipped ISA has a 1-thread ResNet-50 plan; its records apply under it)
    out = subprocess.run([venv / "bin" / "tuner", "compile", "resnet50", "--threads", "1", "--no-predict", "-o", str(art)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    sources = [s["source"] for s in json.loads((art / "model.json").read_text())["steps"]]
    assert len(sources) > 10
    if facts["host"] in facts["targets"]:
        assert sources.count("shipped") > 0, sources


def test_the_kernel_prelude_includes_only_the_c_library_headers():
    """Every candidate's C file starts with the prelude: <immintrin.h> alone added half a second to
    each compile (a third of the test suite's time, and every tune's builds); intrinsics go
    through the compiler's builtins instead."""
    import re

    from tuner.codegen.c import PRELUDE
    headers = re.findall(r"#include\s*<([^>]+)>", PRELUDE)
    assert headers and set(headers) <= {"math.h", "stdlib.h", "string.h"}
