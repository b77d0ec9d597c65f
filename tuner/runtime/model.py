"""A compiled model: its library, weights and memory plan, callable from NumPy.

An artifact directory holds `model-<content hash>.so` (every kernel and the executor), `model.c`
(its source, for reading), `weights.bin` (every constant in its kernel's layout, 64-byte aligned)
and `model.json` (target, tool version, model hash, inputs and outputs, arena size, and per step:
the kernel, the workload, where its schedule came from and the latency its record promised).
"""
from __future__ import annotations

import json
import mmap
import os
import shutil
from functools import lru_cache
from pathlib import Path

import numpy as np
from cffi import FFI

from .. import __version__
from ..errors import UserError, check_output_path
from ..measure.library import aligned_empty, content_hash, open_library, pointer_array
from ..target import ISAS, host_isa, parse_target
from .compiler import DEFAULT, GENERIC, SHIPPED, Step, plan_summary

META = "model.json"
WEIGHTS = "weights.bin"

CDEF = """
int tuner_model_steps(void);
int tuner_model_run(float** inputs, float** outputs, char* arena, char* weights);
int tuner_model_time(int step, float** inputs, float** outputs, char* arena, char* weights, int repeat,
                     double min_repeat_ms, double* costs);
int tuner_model_profile(float** inputs, float** outputs, char* arena, char* weights, int runs, double* per_step);
"""


class ArtifactError(UserError):
    pass


@lru_cache(maxsize=1)
def _ffi() -> FFI:
    f = FFI()
    f.cdef(CDEF)
    return f


HUGE_PAGE = 2 << 20


def _aligned_bytes(nbytes: int) -> tuple:
    """(float32 storage of at least `nbytes`, 64-byte aligned; whether it asked for huge pages),
    for the weights and the arena.

    Where Linux offers transparent huge pages on request (THP "madvise" or "always"), a buffer
    of 2 MiB or more starts on a 2 MiB boundary and is advised MADV_HUGEPAGE, so that a kernel
    walking a layer's weights (several MiB in ResNet-50's late layers) is not also walking the
    page table: with 4 KiB pages every inference meets each layer's weights with a cold TLB,
    which the tuner's timing of one kernel at a time does not see. ResNet-50 on the AVX-512 host,
    against 4 KiB pages: 0.974x-1.000x depending on the kernels (bench/huge_pages.py). The OS may
    still give 4 KiB pages (no free huge page, THP "never"); that costs only speed."""
    n = (max(nbytes, 4) + 3) // 4
    if 4 * n >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m = mmap.mmap(-1, 4 * n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            m.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, ValueError):
            pass
        else:
            raw = np.frombuffer(m, np.uint8)          # keeps the mapping alive as its base
            start = -raw.ctypes.data % HUGE_PAGE
            return raw[start:start + 4 * n].view(np.float32), True
    return aligned_empty(n), False


class CompiledModel:
    """Runs the whole graph in C, one call per inference. Not re-entrant: one arena per object."""

    def __init__(self, meta: dict, lib_path: str, source: str, weights: bytes):
        self.meta = meta
        self.source = source
        self._lib_path = lib_path
        self._lib = open_library(lib_path, _ffi())
        self._weights, huge_w = _aligned_bytes(len(weights))
        self._weights.view(np.uint8)[:len(weights)] = np.frombuffer(weights, np.uint8)
        self._arena, huge_a = _aligned_bytes(meta["arena_bytes"])
        # which were asked for 2 MiB pages (the report says so)
        self.huge_pages = tuple(name for name, asked in (("weights", huge_w), ("arena", huge_a)) if asked)
        self.steps = [Step.from_json(s) for s in meta["steps"]]

    # ------------------------------------------------------------ facts
    @property
    def inputs(self) -> list:
        return self.meta["inputs"]

    @property
    def outputs(self) -> list:
        return self.meta["outputs"]

    @property
    def target(self) -> str:
        return self.meta["target"]

    @property
    def threads(self) -> int:
        return parse_target(self.target, check_host=False).threads

    @property
    def arena_bytes(self) -> int:
        return self.meta["arena_bytes"]

    # ------------------------------------------------------------ running
    def _inputs(self, args, kwargs) -> list:
        spec = self.inputs
        names = [s["name"] for s in spec]
        if args and kwargs:
            raise UserError("give the inputs either by position or by name, not both")
        if kwargs:
            unknown = sorted(set(kwargs) - set(names))
            missing = [n for n in names if n not in kwargs]
            if unknown or missing:
                raise UserError(f"the model's inputs are {', '.join(names)}"
                                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                                + (f"; missing: {', '.join(missing)}" if missing else ""))
            args = [kwargs[n] for n in names]
        if len(args) != len(spec):
            raise UserError(f"the model takes {len(spec)} input(s) ({', '.join(names)}), got {len(args)}")
        out = []
        for a, s in zip(args, spec):
            a = np.asarray(a)
            if a.dtype != np.dtype(s["dtype"]):
                raise UserError(f"input {s['name']} must be {s['dtype']}, got {a.dtype} "
                                f"(convert it with .astype(np.{s['dtype']}))")
            if list(a.shape) != s["shape"]:
                raise UserError(f"input {s['name']} must have shape {'x'.join(map(str, s['shape']))}, "
                                f"got {'x'.join(map(str, a.shape)) or 'a scalar'}")
            out.append(np.ascontiguousarray(a))
        return out

    def _call_args(self, inputs: list) -> tuple:
        """(fresh output arrays, the executor's first four arguments for checked `inputs` and them);
        the arrays must stay referenced while the call runs."""
        f = _ffi()
        outputs = [np.empty(s["shape"], np.dtype(s["dtype"])) for s in self.outputs]
        return outputs, (pointer_array(inputs, f), pointer_array(outputs, f),
                         f.cast("char*", f.from_buffer(self._arena)), f.cast("char*", f.from_buffer(self._weights)))

    def run(self, *args, **kwargs) -> list:
        """The graph's outputs (a list of NumPy arrays) for its inputs, by position or by name."""
        outputs, call = self._call_args(self._inputs(args, kwargs))
        rc = self._lib.tuner_model_run(*call)
        if rc:
            step = self.steps[rc - 1000] if 1000 <= rc < 1000 + len(self.steps) else None
            raise RuntimeError(f"step {step.index} ({step.summary}) failed (out of memory for a temporary?)"
                               if step else f"the model failed with code {rc}")
        return outputs

    def random_inputs(self, seed: int = 0) -> list:
        rng = np.random.default_rng(seed)
        return [rng.uniform(-1, 1, s["shape"]).astype(s["dtype"]) for s in self.inputs]

    def time(self, inputs: list | None = None, step: int = -1, repeat: int = 5, min_repeat_ms: float = 100.0) -> list:
        """Seconds per call, `repeat` times, timed in C: of the whole model (step=-1) or of one step."""
        outputs, call = self._call_args(self._inputs(inputs or self.random_inputs(), {}))
        costs = _ffi().new("double[]", repeat)
        rc = self._lib.tuner_model_time(step, *call, repeat, min_repeat_ms, costs)
        if rc:
            raise RuntimeError(f"timing failed with code {rc}")
        return list(costs)

    def profile(self, inputs: list | None = None, runs: int = 20) -> tuple:
        """(seconds of every step in context, shape (runs, steps); seconds of each whole run, shape
        (runs,)): the model run whole `runs` times, each step timed where it runs, so caches hold
        what its producers left (unlike `time(step=i)`, which repeats one step on warm data). A
        run's time minus its steps' is the dispatch between them, measured in the same run."""
        outputs, call = self._call_args(self._inputs(inputs or self.random_inputs(), {}))
        n = len(self.steps)
        per_step = _ffi().new("double[]", runs * (n + 1))
        rc = self._lib.tuner_model_profile(*call, runs, per_step)
        if rc:
            raise RuntimeError(f"profiling failed with code {rc}")
        table = np.frombuffer(_ffi().buffer(per_step), dtype=np.float64).reshape(runs, n + 1).copy()
        return table[:, :n], table[:, n]

    # ------------------------------------------------------------ saving and loading
    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact directory (created; files in it are replaced)."""
        d = Path(path)
        if d.exists() and not d.is_dir():
            raise UserError(f"-o {d} is a file; give a directory for the compiled model")
        check_output_path(d / META, "-o")
        lib_name = f"model-{content_hash(Path(self._lib_path).read_bytes())}.so"
        for old in d.glob("model-*.so"):
            if old.name != lib_name:
                old.unlink()
        shutil.copyfile(self._lib_path, d / lib_name)
        (d / "model.c").write_text(self.source)
        (d / WEIGHTS).write_bytes(self._weights.view(np.uint8)[:self.meta["weights_bytes"]].tobytes())
        meta = dict(self.meta, library=lib_name)
        tmp = d / (META + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, d / META)            # last: a half-written artifact has no model.json
        return d

    # ------------------------------------------------------------ report
    def report(self) -> str:
        """Per step: the group, its workload, where its schedule came from, the latency the record
        promises and its share of the model's FLOPs; then arena and untuned summary."""
        total = sum(s.flops for s in self.steps) or 1.0
        rows = [f"{'#':>3} {'group':<34} {'schedule':<22} {'record':>10} {'FLOPs':>6}  workload"]
        for s in self.steps:
            src = s.source if s.source in (SHIPPED, DEFAULT, GENERIC) else f"log {Path(s.source).name}"
            rec = f"{s.expected_s * 1e3:.3f} ms" if s.expected_s else "-"
            rows.append(f"{s.index:>3} {s.summary[:34]:<34} {src[:22]:<22} {rec:>10} {100 * s.flops / total:5.1f}%  "
                        f"{s.workload}")
        m = self.meta
        promised = [s.expected_s for s in self.steps if s.expected_s]
        rows.append("")
        rows.append(f"{m['model']} for {m['target']} (layout {m['layout']}): {len(self.steps)} steps, "
                    f"{m['kernels']} distinct kernels, compiled in {m['compile_s']:.1f} s")
        huge = f"; {' and '.join(self.huge_pages)} in 2 MiB pages where the OS grants them" if self.huge_pages else ""
        rows.append(f"arena {m['arena_bytes'] / 2**20:.2f} MiB for {m['intermediate_bytes'] / 2**20:.2f} MiB of "
                    f"intermediates (largest live set {m['peak_live_bytes'] / 2**20:.2f} MiB); "
                    f"weights {m['weights_bytes'] / 2**20:.1f} MiB{huge}")
        if m.get("layout_plan"):
            rows.append(f"layout plan ({m.get('layout_plan_from') or 'given'}): {plan_summary(m['layout_plan'])}; "
                        f"the other convs run in {m['layout']}")
        if promised:
            rows.append(f"records promise {sum(promised) * 1e3:.2f} ms for the {len(promised)} tuned steps")
        warning = untuned_warning(self.steps)
        if warning:
            rows.append(warning)
        return "\n".join(rows)


def untuned_warning(steps: list) -> str:
    """One line naming the tasks left on the default schedule and their share of the FLOPs."""
    untuned = [s for s in steps if s.anchor and s.source == DEFAULT]
    if not untuned:
        return ""
    total = sum(s.flops for s in steps) or 1.0
    share = sum(s.flops for s in untuned) / total
    names = sorted({s.workload for s in untuned})
    shown = "; ".join(names[:4]) + (f"; and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"warning: {len(names)} task(s) ({len(untuned)} steps, {100 * share:.1f}% of the model's FLOPs) have no "
            f"tuning record and run the default schedule: {shown}")


def load(path: str | os.PathLike) -> CompiledModel:
    """Load an artifact directory written by CompiledModel.save / `tuner compile -o`."""
    d = Path(path)
    meta_path = d / META
    if not meta_path.is_file():
        raise ArtifactError(f"{d} is not a compiled model (no {META}); make one with `tuner compile ... -o {d}`")
    try:
        meta = json.loads(meta_path.read_text())
        lib = d / meta["library"]
        isa = parse_target(meta["target"], check_host=False).isa
    except (ValueError, KeyError, TypeError, UserError) as e:
        raise ArtifactError(f"{meta_path} is damaged ({e}); compile the model again") from None
    if ISAS[isa][0] > ISAS[host_isa()][0]:
        raise ArtifactError(f"{d} was compiled for {isa} and this host supports {host_isa()}: its kernels cannot "
                            f"run here; compile the model on this host (tuner compile {meta.get('model', 'MODEL')})")
    if meta.get("format") != 1:
        raise ArtifactError(f"{d} has artifact format {meta.get('format')}; this tuner ({__version__}) reads format 1")
    if not lib.is_file():
        raise ArtifactError(f"{lib} is missing; compile the model again")
    weights = (d / WEIGHTS).read_bytes() if (d / WEIGHTS).is_file() else None
    if weights is None or len(weights) != meta["weights_bytes"]:
        raise ArtifactError(f"{d / WEIGHTS} is missing or has the wrong size; compile the model again")
    source = (d / "model.c").read_text() if (d / "model.c").is_file() else ""
    return CompiledModel(meta, str(lib), source, weights)
