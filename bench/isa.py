"""Benchmarks as on an AVX2 host, on an AVX-512 one: `TUNER_BENCH_ISA=avx2 python -m bench.NAME ...`.

The peers (ONNX Runtime's MLAS, PyTorch's oneDNN) pick their kernels by CPUID. With TUNER_BENCH_ISA
set, `bench` (its package import, before any peer loads) makes CPUID fault in the process and
answers it with AVX-512's and AMX's feature bits cleared (bench/cpuid_mask.c), so the peers run
their AVX2 kernels; tuner in the process takes the host for an AVX2 one too (its target `cpu` is
`cpu -isa=avx2`, and an AVX-512 artifact is refused); results record it (`facts()`). Both sides
then run AVX2 code on the same core. That is not an AVX2 host: its caches, clocks and FMA units
are this core's, so a figure holds for this host run so, not for a Zen 3 or a Haswell. Processes
started later (compilers, workers, a `--fresh` turn) see the real CPU unless they import `bench`
with the variable set, as a fresh turn does. Needs Linux on a CPU that can fault CPUID
(`cpuid_fault` in /proc/cpuinfo: Intel since Ivy Bridge, and KVM guests).
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

ENV = "TUNER_BENCH_ISA"
ISAS = ("avx2",)               # what CPUID can be made to hide down to
_lib = None
_real = None                   # the host's own ISA, once tuner is told another


def emulate(isa: str) -> None:
    """Hide AVX-512 from this process's CPUID (module doc); SystemExit with the reason where it cannot."""
    global _lib, _real
    if isa not in ISAS:
        raise SystemExit(f"{ENV}={isa!r}: the peers can be shown only {', '.join(ISAS)}; unset it for the host's own ISA")
    if _lib is not None:
        return
    loaded = sorted(m for m in ("onnxruntime", "torch") if m in sys.modules)
    if loaded:
        raise SystemExit(f"{ENV}: {', '.join(loaded)} already loaded, and has read the real CPU: set it before "
                         "python starts (TUNER_BENCH_ISA=avx2 python -m bench.NAME ...)")
    from bench.common import c_library
    src = Path(__file__).with_name("cpuid_mask.c")
    lib, err = c_library(src, ["-O2"])
    if lib is None:
        raise SystemExit(f"{ENV}: building {src} failed: {err}")
    lib.leaf7_ebx.restype = ctypes.c_uint
    lib.masked_calls.restype = ctypes.c_long
    if lib.mask_avx512() != 0:
        raise SystemExit(f"{ENV}: this host cannot make CPUID fault (no cpuid_fault in /proc/cpuinfo), so its "
                         "peers cannot be shown another ISA: run on an AVX2 host instead")
    if lib.leaf7_ebx() & (1 << 16):
        raise SystemExit(f"{ENV}: CPUID still reports AVX-512F after masking; not benchmarking on a wrong premise")
    _lib = lib
    os.environ[ENV] = isa        # processes this one starts that import bench mask too
    import tuner.target          # and tuner here takes the host for one of that ISA: target "cpu" is it
    _real = tuner.target.host_isa()
    tuner.target.host_isa = lambda: isa


def emulated() -> str | None:
    """The ISA the peers are shown, or None for the host's own."""
    return os.environ.get(ENV) if _lib is not None else None


def facts() -> dict:
    """What a result records of it: {} on the host's own ISA."""
    if _lib is None:
        return {}
    return {"peers_isa": emulated(), "host_isa_emulated_on": _real,
            "peers_cpuid_calls_masked": int(_lib.masked_calls())}
