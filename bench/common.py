"""What the benchmark scripts share: the workloads the learned search is judged on, and where results go."""
from __future__ import annotations

import ctypes
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

# issue 3's four: ResNet-50's 3x3 convs at 56x56 and 7x7, a 1x1 conv and the 2048->1000 dense layer
SEARCH_WORKLOADS = "r50.s1.conv3x3,r50.s1.conv1x1c,r50.s4.conv3x3,dense.2048x1000"


def c_library(source: Path, flags: list) -> tuple:
    """(ctypes.CDLL of bench's C helper `source`, None), built through the kernel cache (once per
    source), or (None, the compiler's message)."""
    from tuner.toolchain.cc import compile_library
    out, err = compile_library(source.read_text(), flags)
    return (ctypes.CDLL(out), None) if out else (None, err)


def bench_workload(name: str, conv_layout: str):
    """A workload by name or spec; convolutions in `conv_layout`, other operators in their own."""
    from tuner.ops import resolve
    return resolve(name, conv_layout if resolve(name).op == "conv2d" else None)


def host_facts() -> dict:
    """The machine a result was measured on: CPU model, its kind (vendor-family-model) and core design,
    ISA tuner targets on it, cores it may use."""
    from tuner.target import core_design, host_cores, host_isa, host_kind
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    from bench.isa import facts
    return {"cpu": model or platform.processor() or platform.machine(), "kind": host_kind(),
            "design": core_design(host_kind()), "isa": host_isa(), "cores": host_cores(), **facts()}


def checkouts(specs: list) -> dict:
    """{name: source tree}: this checkout as "this", and each NAME=DIR of `specs` (--tree: another
    checkout's code, e.g. a `git worktree` of an older commit, run with PYTHONPATH=DIR)."""
    return {"this": str(Path(__file__).resolve().parent.parent), **dict(t.split("=", 1) for t in specs)}


def commits(trees: dict) -> dict:
    """{name: the short commit each tree has checked out}."""
    return {name: subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() for name, tree in trees.items()}


def command_line() -> str:
    """The command that is running, as `python -m bench.NAME ARGS` when it is a bench script."""
    script = Path(sys.argv[0])
    head = f"python -m bench.{script.stem}" if script.parent.name == "bench" else shlex.quote(sys.argv[0])
    return " ".join([head, *map(shlex.quote, sys.argv[1:])])


def write_results(kind: str, out: str | None, payload: dict) -> Path:
    """Write `payload` to `out`, or to bench/results/<kind>-<time>.json; say where. The payload gets the
    command, the host (host_facts) and the date unless it has them; `python -m bench.report` renders it."""
    path = Path(out or f"bench/results/{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    payload = {"command": command_line(), "host": host_facts(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               **payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return path
