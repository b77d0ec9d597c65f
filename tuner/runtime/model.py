"""A compiled model: its library, weights and memory plan, callable from NumPy.

An artifact directory holds `model-<content hash>.so` (every kernel and the executor), `model.c`
(its source, for reading), `weights.bin` (every constant in its kernel's layout, 64-byte aligned)
and `model.json` (target, tool version, model hash, inputs and outputs, arena size, and per step:
the kernel, the workload, where its schedule came from and the latency its record promised).
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import secrets
import shutil
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
from cffi import FFI

from .. import __version__
from ..errors import TunerError, UserError
from ..target import ISAS, host_isa, parse_target
from ..te.layouts import plan_summary
from ..toolchain.library import aligned_empty, content_hash, open_library, pointer_array
from .artifact import (DECLARED, DEFAULT, FLOAT_EXACT, GENERIC, IN_MODEL, OTHER_THREADS, PLAIN, PREDICTED, SHIPPED, UNTUNED,
                       Step, declaration)

META = "model.json"
WEIGHTS = "weights.bin"

CDEF = """
int tuner_model_steps(void);
const char* tuner_model_declared(void);
int tuner_model_run(float** inputs, float** outputs, char* arena, char* weights);
int tuner_model_prefix(int upto, float** inputs, float** outputs, char* arena, char* weights);
int tuner_model_time(int step, float** inputs, float** outputs, char* arena, char* weights, int repeat,
                     double min_repeat_ms, double* costs);
int tuner_model_profile(float** inputs, float** outputs, char* arena, char* weights, int runs, double* per_step);
"""
FORMAT = 2
LIBRARY_NAME = re.compile(r"model-[0-9a-f]{16}\.so")
ARTIFACT_FILES = re.compile(rf"model\.json|model\.c|weights\.bin|{LIBRARY_NAME.pattern}")
PARTIAL = re.compile(r"\.tuner-[0-9]+-[0-9a-f]{8}\.tmp")     # a save that was stopped (removed by the next)


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
    which the tuner's timing of one kernel at a time does not see (bench/huge_pages.py measures
    the difference; docs/history.md). The OS may
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


def weights_storage(nbytes: int, fill) -> tuple:
    """(storage of `nbytes` of weights, whether it asked for huge pages), written by `fill(view)`
    (the storage as `nbytes` uint8): the weights' one copy in memory, made in place."""
    storage, huge = _aligned_bytes(nbytes)
    fill(storage.view(np.uint8)[:nbytes])
    return storage, huge


class CompiledModel:
    """Runs the whole graph in C, one call per inference.

    Safe to call from any number of threads at once: each call in flight takes an arena of its own
    from a pool (`arena_bytes` each, kept for the next call), and all share the library and the
    weights. Every buffer the C code reads or writes is referenced by the calling frame until the
    call returns (cffi's pointers keep nothing alive)."""

    def __init__(self, meta: dict, lib_path: str, source: str, weights, lib=None):
        """weights: their bytes (copied), or the storage weights_storage made of them (taken)."""
        self.meta = meta
        self.source = source
        self._lib_path = lib_path
        self._lib = lib or open_library(lib_path, _ffi())
        if not isinstance(weights, tuple):
            data = np.frombuffer(weights, np.uint8)
            weights = weights_storage(data.size, lambda view: np.copyto(view, data))
        self._weights, huge_w = weights
        arena, huge_a = _aligned_bytes(meta["arena_bytes"])
        self._arenas = [arena]                   # free arenas; a call takes one, or makes one if none is free
        self._arenas_lock = threading.Lock()
        self._bound_buffers: list = []           # a dynamic model's free sets of bound-shaped inputs and outputs
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
            if a.dtype.newbyteorder("=") != np.dtype(s["dtype"]):
                raise UserError(f"input {s['name']} must be {s['dtype']}, got {a.dtype} "
                                f"(convert it with .astype(np.{s['dtype']}))")
            if list(a.shape) != s["shape"] and "extents" not in s:
                raise UserError(f"input {s['name']} must have shape {'x'.join(map(str, s['shape']))}, "
                                f"got {'x'.join(map(str, a.shape)) or 'a scalar'}")
            if "carried" in s:                   # integers travel as float32, checked against their range
                lo, hi = s["range"]
                if a.size and (a.min() < lo or a.max() >= hi):
                    bad = int(a.min() if a.min() < lo else a.max())
                    raise UserError(f"input {s['name']} holds {bad}, outside [{lo}, {hi}): "
                                    f"{'an index past the table it looks up' if hi < FLOAT_EXACT else 'too large'}")
                out.append(np.ascontiguousarray(a, dtype=s["carried"]))
                continue
            # a copy unless C-ordered and native; a dynamic model's input is copied into its bound's buffer
            out.append(np.asarray(a, dtype=s["dtype"]) if "extents" in s else np.ascontiguousarray(a, dtype=s["dtype"]))
        return out

    @contextmanager
    def _arena(self):
        with self._arenas_lock:
            arena = self._arenas.pop() if self._arenas else None
        if arena is None:
            arena, _ = _aligned_bytes(self.arena_bytes)
        try:
            yield arena
        finally:
            with self._arenas_lock:
                self._arenas.append(arena)

    @contextmanager
    def _bound(self):
        """(inputs, outputs) of a dynamic model's bound shapes, zeros when made, kept for the next call
        like the arena: a run writes its data at the start of each and what lies past it (zeros, or
        an earlier run's data) never enters a result (te.dynamic), so no call clears them again."""
        with self._arenas_lock:
            bufs = self._bound_buffers.pop() if self._bound_buffers else None
        if bufs is None:
            bufs = tuple([np.zeros(s["shape"], np.dtype(s.get("carried", s["dtype"]))) for s in side]
                         for side in (self.inputs, self.outputs))
        try:
            yield bufs
        finally:
            with self._arenas_lock:
                self._bound_buffers.append(bufs)

    def _call(self, fn, inputs: list, *extra) -> list:
        """Fresh output arrays, filled by `fn(inputs, outputs, arena, weights, *extra)` for checked
        `inputs`; inputs, outputs and arena stay referenced here until `fn` returns. A dynamic
        model's inputs are padded to their bound shapes and its outputs cut to this run's."""
        f = _ffi()
        if self.symbols:
            with self._bound() as (padded, outputs):
                inputs, values = self._padded(inputs, padded)
                rc = self._run(fn, f, inputs, outputs, extra)
                outputs = [o[tuple(slice(0, n) for n in _extents(s, values))].copy() for o, s in zip(outputs, self.outputs)]
        else:
            outputs = [np.empty(s["shape"], np.dtype(s.get("carried", s["dtype"]))) for s in self.outputs]
            rc = self._run(fn, f, inputs, outputs, extra)
        if rc:
            step = self.steps[rc - 1000] if 1000 <= rc < 1000 + len(self.steps) else None
            raise RuntimeError(f"step {step.index} ({step.summary}) failed (out of memory for a temporary?)"
                               if step else f"the model failed with code {rc}")
        # an integer output (an argmax map, token ids) travels as float32, exact below 2^24: its own type back
        return [o.astype(s["dtype"]) if "carried" in s else o for o, s in zip(outputs, self.outputs)]

    def _run(self, fn, f, inputs: list, outputs: list, extra: tuple) -> int:
        with self._arena() as arena:
            return fn(pointer_array(inputs, f), pointer_array(outputs, f), f.cast("char*", f.from_buffer(arena)),
                      f.cast("char*", f.from_buffer(self._weights)), *extra)

    def run(self, /, *args, **kwargs) -> list:
        """The graph's outputs (a list of NumPy arrays) for its inputs, by position or by name."""
        inputs = self._inputs(args, kwargs)
        return self._call(self._lib.tuner_model_run, inputs)

    # ------------------------------------------------------------ dynamic dimensions (issue 37)
    @property
    def symbols(self) -> list:
        """[{"name", "lo", "hi"}] of a model compiled for ranges of shapes; [] for one shape."""
        return self.meta.get("symbols", [])

    def _symbol_values(self, arrays: list) -> list:
        """The symbols' values in this run, read off the inputs' shapes (each in its range, the
        same wherever it appears); every other dim must be the model's."""
        values: list = [None] * len(self.symbols)
        for a, s in zip(arrays, self.inputs):
            if a.ndim != len(s["shape"]):
                raise UserError(f"input {s['name']} must have {len(s['shape'])} dims (at most "
                                f"{'x'.join(map(str, s['shape']))}), got {'x'.join(map(str, a.shape)) or 'a scalar'}")
            ext = s["extents"]
            for d, (n, e) in enumerate(zip(a.shape, ext)):
                if (k := _symbol_of(e, self.symbols)) is not None:
                    sym = self.symbols[k]
                    step = sym.get("step", 1)
                    said = f"input {s['name']} has {n} in dim {d} ({sym['name']}); this model runs {_range(sym)}"
                    if n % step:
                        raise UserError(f"{said}: pad or resize the input to a multiple of {step}")
                    if not sym["lo"] * step <= n <= sym["hi"] * step:
                        raise UserError(f"{said}: compile it for a wider range (--dynamic)")
                    if values[k] is not None and values[k] != n // step:
                        raise UserError(f"input {s['name']} has {n} in dim {d} ({sym['name']}), another input "
                                        f"{values[k] * step}: they must agree")
                    values[k] = n // step
        missing = [sym["name"] for v, sym in zip(values, self.symbols) if v is None]
        if missing:
            raise AssertionError(f"no input gives the value of {', '.join(missing)}")
        for a, s in zip(arrays, self.inputs):
            want = _extents(s, values)
            if list(a.shape) != want:
                raise UserError(f"input {s['name']} must have shape {'x'.join(map(str, want))} (as the other "
                                f"dims say), got {'x'.join(map(str, a.shape)) or 'a scalar'}")
        return values

    def _padded(self, arrays: list, padded: list) -> tuple:
        """(inputs at the start of `padded`, buffers of the bound shapes, then the symbols' values as
        int32; the values)."""
        values = self._symbol_values(arrays)
        out = []
        for a, s, buf in zip(arrays, self.inputs, padded):
            if list(a.shape) == s["shape"] and a.flags.c_contiguous:
                out.append(a)
                continue
            buf[tuple(slice(0, n) for n in a.shape)] = a
            out.append(buf)
        return out + [np.array(values, np.int32)], values

    def random_inputs(self, seed: int = 0, shapes: dict | None = None) -> list:
        """Random inputs of the model's shapes (of a dynamic model: its bounds, or `shapes` by name,
        the inputs not named there at the values of the symbols that those give, else the bounds)."""
        rng = np.random.default_rng(seed)
        shapes = dict(shapes or {})
        if self.symbols and shapes:
            values = [sym["hi"] for sym in self.symbols]
            for s in self.inputs:
                for n, e in zip(shapes.get(s["name"], ()), s.get("extents") or ()):
                    if (k := _symbol_of(e, self.symbols)) is not None:
                        values[k] = int(n) // self.symbols[k].get("step", 1)
            shapes = {s["name"]: shapes.get(s["name"]) or _extents(s, values) for s in self.inputs}
        shape = {s["name"]: shapes.get(s["name"], s["shape"]) for s in self.inputs}
        return [rng.integers(*s["range"], size=shape[s["name"]]).astype(s["dtype"]) if "range" in s
                else rng.uniform(-1, 1, shape[s["name"]]).astype(s["dtype"]) for s in self.inputs]

    def time(self, inputs: list | None = None, step: int = -1, repeat: int = 5, min_repeat_ms: float = 100.0) -> list:
        """Seconds per call, `repeat` times, timed in C: of the whole model (step=-1) or of one step."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not -1 <= step < len(self.steps):
            raise UserError(f"step must be -1 (the whole model) or a step index 0..{len(self.steps) - 1}, got {step}")
        if not isinstance(repeat, (int, np.integer)) or repeat < 1:
            raise UserError(f"repeat must be a whole number, at least 1; got {repeat}")
        if not 0 <= min_repeat_ms <= 3_600_000:
            raise UserError(f"min_repeat_ms must be 0 to 3600000 (an hour), got {min_repeat_ms}")
        inputs = self._inputs(self.random_inputs() if inputs is None else inputs, {})
        costs = _ffi().new("double[]", int(repeat))

        prefix = getattr(self._lib, "tuner_model_prefix", None) if step >= 0 else None   # None: built before it

        def timed(*a):      # the steps before it first (else the whole model): the data it would see
            return ((prefix(int(step), *a) if prefix else self._lib.tuner_model_run(*a))
                    or self._lib.tuner_model_time(int(step), *a, int(repeat), float(min_repeat_ms), costs))
        self._call(timed, inputs)
        return list(costs)

    def profile(self, inputs: list | None = None, runs: int = 20) -> tuple:
        """(seconds of every step in context, shape (runs, steps); seconds of each whole run, shape
        (runs,)): the model run whole `runs` times, each step timed where it runs, so caches hold
        what its producers left (unlike `time(step=i)`, which repeats one step on warm data). A
        run's time minus its steps' is the dispatch between them, measured in the same run."""
        if not isinstance(runs, (int, np.integer)) or runs < 1:
            raise UserError(f"runs must be a whole number, at least 1; got {runs}")
        inputs = self._inputs(self.random_inputs() if inputs is None else inputs, {})
        n = len(self.steps)
        per_step = _ffi().new("double[]", runs * (n + 1))
        self._call(self._lib.tuner_model_profile, inputs, runs, per_step)
        table = np.frombuffer(_ffi().buffer(per_step), dtype=np.float64).reshape(runs, n + 1).copy()
        return table[:, :n], table[:, n]

    # ------------------------------------------------------------ saving and loading
    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact directory. New files are written whole into a directory of their own
        first; an artifact already at `path` is then replaced file by file, model.json last, so
        that a save stopped at any point leaves the old artifact, the new one, or one that load
        refuses, never a mix that runs. A directory of anything else is refused."""
        d = Path(os.path.abspath(path))
        check_artifact_dir(d)
        existed = d.exists()
        tmp = (d if existed else d.parent) / f".tuner-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        lib_name = _library_name(self._lib_path)
        try:
            try:
                os.mkdir(tmp)
                shutil.copyfile(self._lib_path, tmp / lib_name)
                (tmp / "model.c").write_text(self.source)
                with open(tmp / WEIGHTS, "wb") as f:
                    f.write(self._weights.view(np.uint8)[:self.meta["weights_bytes"]].data)
                (tmp / META).write_text(json.dumps(dict(self.meta, library=lib_name), indent=1))
                if not existed:
                    os.rename(tmp, d)
                    return d
                old = [e for e in d.iterdir() if LIBRARY_NAME.fullmatch(e.name) and e.name != lib_name]
                for name in (lib_name, "model.c", WEIGHTS, META):
                    os.replace(tmp / name, d / name)
                for e in old:
                    e.unlink()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as e:
            raise UserError(f"cannot write the compiled model to {d} ({e.strerror or e}); choose another -o") from None
        return d

    # ------------------------------------------------------------ report
    def report(self) -> str:
        """Per step: the group, its workload, where its schedule came from, the latency the record
        promises and its share of the model's FLOPs; then arena and untuned summary."""
        total = sum(s.flops for s in self.steps) or 1.0
        rows = [f"{'#':>3} {'group':<34} {'schedule':<22} {'record':>10} {'FLOPs':>6}  workload"]
        for s in self.steps:
            src = s.source if s.source in (SHIPPED, *UNTUNED, GENERIC, IN_MODEL) else f"log {Path(s.source).name}"
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
        if over := [s for s in self.steps if s.inplace is not None]:
            one = len(over) == 1
            rows.append(f"{len(over)} step{'' if one else 's'} write{'s its' if one else ' their'} output over an "
                        f"input read by no later step ({', '.join(sorted({s.summary for s in over}))})")
        if self.symbols:
            dyn = sum(s.dynamic for s in self.steps)
            ranges = ", ".join(_range(y) for y in self.symbols)
            rows.append(f"dynamic: {ranges}; {dyn} of the {len(self.steps)} steps run to each run's extents; "
                        "the arena and the inputs and outputs are laid out for the bounds")
            if versioned := [s for s in self.steps if s.versions]:
                at = sorted({v.get("bucket", v["upto"]) for s in versioned for v in s.versions})
                past = sum(v["upto"] > v.get("bucket", v["upto"]) for s in versioned for v in s.versions)
                rows.append(f"{len(versioned)} steps run records tuned at {', '.join(map(str, at))} (each for the "
                            f"values up to it, {past} measured to serve further up) and their schedule above beyond them")
        if m.get("layout_plan"):
            rows.append(f"layout plan ({m.get('layout_plan_from') or 'given'}): {plan_summary(m['layout_plan'])}; "
                        f"the other convs run in {m['layout']}")
        for c, v in m.get("choices", {}).items():
            if c in CHOICES_SAID and (v["on"] or v["from"] != "default"):
                rows.append(f"{CHOICES_SAID[c][not v['on']]} "
                            f"({'timed by the tune, ' + v['from'] if v['from'] != 'given' else 'given'})")
        if promised:
            rows.append(f"records promise {sum(promised) * 1e3:.2f} ms for the {len(promised)} tuned steps")
        warning = untuned_warning(self.steps)
        if warning:
            rows.append(warning)
        return "\n".join(rows)


def _symbol_of(e, symbols: list) -> int | None:
    """k where a dim's monomials are symbol k times its step (a dim a run reads the value off)."""
    if e is None or len(e) != 1 or len(e[0][1]) != 1:
        return None
    k = e[0][1][0]
    return k if e[0][0] == symbols[k].get("step", 1) else None


def _range(sym: dict) -> str:
    """"seq from 1 to 512", "height from 224 to 640 in steps of 32": a symbol's range as its dims take it."""
    step = sym.get("step", 1)
    return f"{sym['name']} from {sym['lo'] * step} to {sym['hi'] * step}" + (f" in steps of {step}" if step > 1 else "")


def _extents(spec: dict, values: list) -> list:
    """An input's or output's shape in a run of a dynamic model: each dim fixed, or the sum of its
    monomials of the symbols' values."""
    return [n if e is None else sum(c * math.prod(values[k] for k in ks) for c, ks in e)
            for n, e in zip(spec["shape"], spec.get("extents") or [None] * len(spec["shape"]))]


def _library_name(lib_path) -> str:
    return f"model-{content_hash(Path(lib_path).read_bytes())}.so"


def check_artifact_dir(d: Path, flag: str = "-o") -> None:
    """Where a compiled model may be written: a new path, an empty directory, or an artifact to
    replace (a model.json that tuner wrote and only an artifact's plain files); never a file, a
    link or someone's files. Leftovers of a stopped save are removed."""
    try:
        if d.is_symlink():
            raise UserError(f"{flag} {d} is a symbolic link; give a real directory (tuner never writes through links)")
        if d.exists():
            if not d.is_dir():
                raise UserError(f"{flag} {d} is a file; give a directory for the compiled model")
            names = {e.name: e for e in d.iterdir()}
            for n in [n for n, e in names.items() if PARTIAL.fullmatch(n) and e.is_dir() and not e.is_symlink()]:
                shutil.rmtree(names.pop(n), ignore_errors=True)
            foreign = sorted(n for n, e in names.items()
                             if not ARTIFACT_FILES.fullmatch(n) or e.is_symlink() or not e.is_file())
            if names and (foreign or not _written_by_tuner(d / META)):
                shown = ", ".join(foreign[:3] or sorted(names)[:3])
                raise UserError(f"{flag} {d} is a directory that is not a compiled model (it holds {shown}); give a "
                                "new or empty directory")
        parent = d.absolute().parent
        parent.mkdir(parents=True, exist_ok=True)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"cannot write {flag} {d}: {parent} is not writable; choose another {flag}")
    except OSError as e:
        raise UserError(f"cannot use {flag} {d} ({e.strerror or e}); choose another {flag}") from None


def _written_by_tuner(meta_path: Path) -> bool:
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("tool"), str) and meta["tool"].startswith("tuner ") \
        and isinstance(meta.get("format"), int)


# a graph choice (graph.passes.GRAPH_CHOICES) as the report says it: (on, off)
CHOICES_SAID = {"fuse_attention": ("attention fused into one kernel", "attention as batch_matmuls and a softmax"),
                "merge_dense": ("dense layers reading one activation merged into one GEMM",
                                "dense layers reading one activation apart")}


def untuned_warning(steps: list) -> str:
    """One line counting the tasks with no tuning record by where their schedule came from (the
    cost model's pick, the default), naming them, with their share of the FLOPs."""
    untuned = [s for s in steps if s.anchor and s.source in UNTUNED]
    if not untuned:
        return ""
    total = sum(s.flops for s in steps) or 1.0
    share = sum(s.flops for s in untuned) / total
    names = sorted({s.workload for s in untuned})
    by = {src: len({s.workload for s in untuned if s.source == src}) for src in UNTUNED}
    parts = [f"{n} {what}" for n, what in (
        (by[PREDICTED], "run the cost model's pick (predicted, not measured)"),
        (by[OTHER_THREADS], "run a record of another thread count, parallelised for this one"),
        (by[PLAIN], "run a record of their operands as copies, rendered to read them in place"),
        (by[DEFAULT], "run the default schedule")) if n]
    how = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 2 else parts)
    shown = "; ".join(names[:4]) + (f"; and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"warning: {len(names)} task(s) ({len(untuned)} steps, {100 * share:.1f}% of the model's FLOPs) have no "
            f"tuning record: {how} (tune them: tuner tune): {shown}")


def _read_weights(path: Path, nbytes: int) -> tuple:
    """The weights file read straight into weights storage (weights_storage); OSError where it does
    not hold exactly `nbytes`."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != nbytes:            # before any storage is taken
            raise OSError(f"{path} does not hold {nbytes} bytes")

        def read(view):
            if f.readinto(view.data) != nbytes:
                raise OSError(f"{path} ended before {nbytes} bytes")
        return weights_storage(nbytes, read)


def load(path: str | os.PathLike) -> CompiledModel:
    """Load an artifact directory written by CompiledModel.save / `tuner compile -o`.

    An artifact holds native code: load only artifacts from sources you trust (as with any shared
    library, or `torch.load`). What is checked protects against damage and mix-ups, not attackers:
    the library's name is a plain file name whose hash its bytes match, the library declares its
    target, arena, inputs, outputs, weights hash and a hash of every other field of model.json
    (artifact.declaration), and model.json and weights.bin must agree with it."""
    d = Path(path)
    meta_path = d / META
    damaged = f"{meta_path} is damaged"
    try:
        text = meta_path.read_text() if meta_path.is_file() else None
        meta = None if text is None else json.loads(text)
    except (ValueError, UnicodeDecodeError, OSError, RecursionError) as e:
        raise ArtifactError(f"cannot read {meta_path} ({type(e).__name__}); compile the model again") from None
    if text is None:
        raise ArtifactError(f"{d} is not a compiled model (no {META}); make one with `tuner compile ... -o {d}`")
    if not isinstance(meta, dict):
        raise ArtifactError(f"{damaged} (not a JSON object); compile the model again")
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"{d} has artifact format {str(meta.get('format'))[:20]}; this tuner ({__version__}) "
                            f"reads format {FORMAT}: compile the model again")
    library, compile_s = meta.get("library"), meta.get("compile_s")
    if not isinstance(library, str) or not LIBRARY_NAME.fullmatch(library):
        raise ArtifactError(f"{damaged}: library {str(library)[:80]!r} is not the name of a model library in {d} "
                            "(model-<hash>.so); compile the model again")
    if isinstance(compile_s, bool) or not isinstance(compile_s, (int, float)) or not 0 <= compile_s < 1e9:
        raise ArtifactError(f"{damaged}: compile_s is not a number of seconds; compile the model again")
    try:
        isa = parse_target(meta.get("target"), check_host=False).isa
    except (UserError, TypeError, AttributeError):
        raise ArtifactError(f"{damaged}: target {str(meta.get('target'))[:80]!r}; compile the model again") from None
    if ISAS[isa][0] > ISAS[host_isa()][0]:
        raise ArtifactError(f"{d} was compiled for {isa} and this host supports {host_isa()}: its kernels cannot "
                            f"run here; compile the model on this host (tuner compile {str(meta.get('model'))[:200]})")
    lib_path = d / library
    try:
        lib = open_library(str(lib_path), _ffi())
        declared = json.loads(_ffi().string(lib.tuner_model_declared()).decode())
    except (AttributeError, ValueError, OSError, TunerError) as e:
        raise ArtifactError(f"{lib_path} is missing or not a model library this tuner can read ({str(e)[:100]}); "
                            "compile the model again") from None
    for key in DECLARED:
        if meta.get(key) != declared.get(key):
            raise ArtifactError(f"{damaged}: its {key} {str(meta.get(key))[:80]} is not what {library} was compiled "
                                f"for ({str(declared.get(key))[:80]}); compile the model again")
    if declaration(meta)["meta_sha256"] != declared.get("meta_sha256"):
        raise ArtifactError(f"{damaged}: it was changed after {library} was compiled; compile the model again")
    try:
        weights = _read_weights(d / WEIGHTS, declared["weights_bytes"])
    except OSError:
        weights = None
    if weights is None or hashlib.sha256(weights[0].view(np.uint8)[:declared["weights_bytes"]].data).hexdigest() \
            != declared["weights_sha256"]:
        raise ArtifactError(f"{d / WEIGHTS} is missing, or not the weights {library} was compiled with; compile the "
                            "model again")
    try:
        source = (d / "model.c").read_text()
    except (OSError, UnicodeDecodeError):
        source = ""
    return CompiledModel(meta, str(lib_path), source, weights, lib)
