"""Targets: which backend and which hardware facts change the generated code.

`cpu` alone means this host: its ISA, core count and thread count are resolved once and the
resulting string (e.g. `cpu -isa=avx512 -cores=2 -threads=1`) goes into every record, because a
1-thread and a 2-thread measurement are different facts.

`cuda` alone means this host's first GPU, resolved through pycuda (compute capability, SM count,
shared memory, registers, threads per block) into e.g. `cuda -arch=sm_90 -sms=132 ...`. A target
that names its arch (`cuda -arch=sm_80`) needs no GPU: code can be generated and compiled with
nvcc for it anywhere; the facts it leaves out are that architecture's (ARCH_FACTS).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from .errors import UserError

ISAS = {"avx512": (16, "x86-64-v4"), "avx2": (8, "x86-64-v3"), "sse": (4, "x86-64-v2")}


class TargetError(UserError):
    pass


@dataclass(frozen=True)
class Target:
    kind: str
    isa: str
    cores: int
    threads: int

    def __str__(self) -> str:
        return f"{self.kind} -isa={self.isa} -cores={self.cores} -threads={self.threads}"

    @property
    def lanes(self) -> int:
        """float32 lanes of the widest vector register."""
        return ISAS[self.isa][0]

    @property
    def cflags(self) -> list:
        # loops start on 64-byte lines: where a GEMM's inner loop lands in the library otherwise
        # moved BERT-base by 3-8% between two builds of the same kernels (docs/history.md)
        flags = ["-O3", f"-march={ISAS[self.isa][1]}", "-fno-math-errno", "-fopenmp-simd", "-falign-loops=64"]
        if self.isa == host_isa():
            flags.append("-mtune=native")
        return flags


@lru_cache(maxsize=1)
def _cpuinfo() -> dict:
    """The first processor's fields in /proc/cpuinfo ({} where there is none)."""
    facts = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                facts.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return facts


@lru_cache(maxsize=1)
def host_isa() -> str:
    flags = _cpuinfo().get("flags", "").split()
    if "avx512f" in flags and "avx512bw" in flags and "avx512vl" in flags and "avx512dq" in flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "sse"


@lru_cache(maxsize=1)
def host_kind() -> str:
    """This CPU's vendor, family and model as /proc/cpuinfo states them ("GenuineIntel-6-207"): the
    kind of core a shipped record was timed on (records.shipped_databases); "" where unknown."""
    parts = [_cpuinfo().get(k, "") for k in ("vendor_id", "cpu family", "model")]
    ok = parts[0].isalnum() and parts[1].isdigit() and parts[2].isdigit()
    return "-".join(parts) if ok else ""


# Core designs of the x86 server parts a cloud host shows, by vendor-family and model of /proc/cpuinfo:
# a shipped file of the same design is nearer than the family's nearest model number (Intel's
# numbers are not ordered by design: Sapphire Rapids is 143, Emerald Rapids 207, Ice Lake 106).
CORE_DESIGNS = {
    "GenuineIntel-6": {85: "skylake-sp", 106: "icelake-sp", 108: "icelake-sp", 143: "sapphirerapids",
                       207: "sapphirerapids", 173: "graniterapids", 174: "graniterapids"},
    "AuthenticAMD-25": {1: "zen3", 8: "zen3", 33: "zen3", 80: "zen3", 17: "zen4", 24: "zen4", 97: "zen4",
                        116: "zen4", 160: "zen4"},
    "AuthenticAMD-26": {2: "zen5", 17: "zen5", 68: "zen5"},
}


def core_design(kind: str) -> str:
    """The core design of a host kind ("GenuineIntel-6-207" -> "sapphirerapids"), "" where unknown."""
    vendor_family, _, model = kind.rpartition("-")
    return CORE_DESIGNS.get(vendor_family, {}).get(int(model), "") if model.isdigit() else ""


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


# What an architecture guarantees, for a target that names its arch without a GPU at hand:
# SMs of its flagship part, static shared memory a block may declare, 32-bit registers per block
# and per thread, threads per block.
ARCH_FACTS = {
    "sm_70": dict(sms=80, smem=49152, regs=65536), "sm_75": dict(sms=40, smem=49152, regs=65536),
    "sm_80": dict(sms=108, smem=49152, regs=65536), "sm_86": dict(sms=84, smem=49152, regs=65536),
    "sm_89": dict(sms=128, smem=49152, regs=65536), "sm_90": dict(sms=132, smem=49152, regs=65536),
}
CUDA_OPTIONS = ("arch", "sms", "smem", "regs", "max_threads")
MAX_REGS_PER_THREAD = 255


@dataclass(frozen=True)
class CudaTarget:
    """One NVIDIA GPU. `isa` is the arch (sm_90) and `threads` 1 (one measurement owns the device),
    so records group by (kind, isa, threads) as CPU ones do."""
    arch: str
    sms: int
    smem: int               # bytes of shared memory one block may declare statically
    regs: int               # 32-bit registers per block
    max_threads: int = 1024
    kind: str = "cuda"

    def __str__(self) -> str:
        return (f"cuda -arch={self.arch} -sms={self.sms} -smem={self.smem} -regs={self.regs} "
                f"-max_threads={self.max_threads}")

    @property
    def isa(self) -> str:
        return self.arch

    @property
    def threads(self) -> int:
        return 1

    @property
    def cores(self) -> int:
        return self.sms

    @property
    def lanes(self) -> int:
        return 1

    @property
    def nvcc_flags(self) -> list:
        return ["-O3", f"-arch={self.arch}", "--use_fast_math", "-std=c++14"]


def _cuda_device_facts() -> dict:
    """The first GPU's facts through pycuda, or a one-line TargetError saying what is missing."""
    try:
        import pycuda.driver as drv
    except ImportError:
        raise TargetError("target 'cuda' needs pycuda to find the GPU, and it is not installed: on a machine "
                          "with an NVIDIA driver run pip install -e '.[cuda]'; or name the architecture, e.g. "
                          "'cuda -arch=sm_90', to generate and compile kernels without running them") from None
    try:
        drv.init()
        dev = drv.Device(0)
        a = drv.device_attribute
        major, minor = dev.compute_capability()
        return dict(arch=f"sm_{major}{minor}", sms=dev.get_attribute(a.MULTIPROCESSOR_COUNT),
                    smem=dev.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK),
                    regs=dev.get_attribute(a.MAX_REGISTERS_PER_BLOCK),
                    max_threads=dev.get_attribute(a.MAX_THREADS_PER_BLOCK))
    except Exception as e:    # pycuda raises its own error classes, and RuntimeError without a driver
        raise TargetError(f"target 'cuda': pycuda found no usable GPU ({type(e).__name__}: {e}); check the NVIDIA "
                          "driver (nvidia-smi), or name the architecture, e.g. 'cuda -arch=sm_90', to compile "
                          "without running") from None


def _options(parts: list, allowed: tuple, what: str) -> dict:
    """The `-key=value` options after a target's kind, each one of `allowed`."""
    opts = {}
    for p in parts[1:]:
        key, eq, val = p.lstrip("-").partition("=")
        if not eq or key not in allowed:
            raise TargetError(f"cannot read target option {p!r}: {what}options are "
                              f"{', '.join('-' + o + '=' for o in allowed)}")
        opts[key] = val
    return opts


def parse_cuda(parts: list, text: str) -> CudaTarget:
    opts = _options(parts, CUDA_OPTIONS, "CUDA ")
    if "arch" in opts:
        arch = opts["arch"]
        if arch not in ARCH_FACTS:
            raise TargetError(f"unknown CUDA arch {arch!r} in {text!r}: use one of {', '.join(ARCH_FACTS)}")
        facts = dict(ARCH_FACTS[arch], arch=arch, max_threads=1024)
    else:
        facts = _cuda_device_facts()
    for key in ("sms", "smem", "regs", "max_threads"):
        if key in opts:
            try:
                facts[key] = int(opts[key])
            except ValueError:
                raise TargetError(f"-{key} must be an integer in {text!r}") from None
            if facts[key] < 1:
                raise TargetError(f"-{key} must be at least 1 in {text!r}")
    return CudaTarget(facts["arch"], facts["sms"], facts["smem"], facts["regs"], facts["max_threads"])


def parse_target(text: "str | Target | CudaTarget" = "cpu", threads: int | None = None,
                 check_host: bool = True) -> "Target | CudaTarget":
    """Parse `cpu [-isa=avx512|avx2|sse] [-cores=N] [-threads=N]`; `threads` overrides. Or
    `cuda [-arch=sm_XY] [-sms=N] [-smem=BYTES] [-regs=N] [-max_threads=N]` (module doc).

    check_host=False reads a logged target of another machine (to re-lower its records, not run them)."""
    if isinstance(text, CudaTarget):
        return text
    if isinstance(text, Target):
        return text if threads is None else Target(text.kind, text.isa, text.cores, threads)
    parts = text.split()
    if not parts:
        raise TargetError("empty target: use 'cpu' (this host) or e.g. 'cpu -isa=avx2 -threads=1'")
    kind = parts[0]
    if kind == "cuda":
        if threads not in (None, 1):
            raise TargetError(f"--threads {threads} is a CPU setting; a CUDA target runs on one GPU")
        return parse_cuda(parts, text)
    if kind != "cpu":
        raise TargetError(f"unknown target {kind!r}: use 'cpu', e.g. 'cpu -threads=1', or 'cuda', "
                          "e.g. 'cuda -arch=sm_90'")
    opts = _options(parts, ("isa", "cores", "threads"), "")
    isa = opts.get("isa", host_isa())
    if isa not in ISAS:
        raise TargetError(f"unknown ISA {isa!r}: use one of {', '.join(ISAS)}")
    if check_host and ISAS[isa][0] > ISAS[host_isa()][0]:
        raise TargetError(f"this host supports {host_isa()}, not {isa}; kernels for it could not run here")
    try:
        cores = int(opts.get("cores", host_cores()))
        nthreads = int(threads if threads is not None else opts.get("threads", cores))
    except ValueError:
        raise TargetError(f"cores and threads must be integers in {text!r}") from None
    if cores < 1 or nthreads < 1:
        raise TargetError("cores and threads must be at least 1")
    return Target("cpu", isa, cores, nthreads)
