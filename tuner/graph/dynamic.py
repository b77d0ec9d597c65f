"""A model compiled once for inputs whose dimensions vary within ranges (issue 37).

`--dynamic "input_ids=1x[1..512]"` names a range for a dimension. A dimension the ONNX file calls
by name (a dim_param) is one symbol wherever that name appears, so inputs that share a sequence
length share its symbol; any other range is a symbol of its own. The model is imported and
optimised at a few values of the symbols (te.dynamic.sample_points), the bound first, and the
compiler fits every dimension that changes with them (te.dynamic), so shape computations the
importer folds, and every pass, run as they do for a static model. A folded constant read by a
kernel must be the start of its value at the bounds (a causal mask, position ids from 0); one
that is not (a decoder's position row wpe[P] at the past length P) is computed at run time
instead, from the integers in steps it was folded from (load_range: an iota node whose start
te.dynamic fits as an expression of the symbols).
"""
from __future__ import annotations

import itertools

import re
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from ..te.dynamic import DynamicError, Symbol, described, sample_points, symbol_var
from .ir import GraphError

_RANGE = re.compile(r"^(?:([A-Za-z_][A-Za-z0-9_.]*))?\[(\d+)\.\.(\d+)(?::(\d+))?\]$")   # [224..640:32]: in steps
_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_TERM = re.compile(rf"([+-]?)\s*({_NAME}|\d+)")      # [past+seq+1]: a dim that follows symbols, a sum of them plus c
_DIM = re.compile(rf"[1-9]\d*|(?:{_NAME})?\[\d+\.\.\d+(?::[1-9]\d*)?\]|\[{_NAME}(?:\s*[+-]\s*(?:{_NAME}|\d+))*\]")


@dataclass
class DynamicInputs:
    """The symbols, and each input's dims: an int, ("sym", k) for symbols[k], ("sym", k, c) for
    symbols[k] + c (a dim that follows another: a mask over the past keys and the new one), or
    ("sum", (k, ...), c) for a sum of symbols plus c (a mask over the past and the new tokens)."""
    symbols: tuple
    dims: dict

    def shapes(self, values: dict, fixed: dict | None = None) -> dict:
        """{input: shape} at `values` ({symbol var name: value}), beside the `fixed` inputs' shapes."""
        return {**(fixed or {}), **{name: [dim_value(d, values, self.symbols) for d in dims]
                                    for name, dims in self.dims.items()}}

    @property
    def points(self) -> list:
        return sample_points(self.symbols)

    def at(self, k: int, value: int) -> dict:
        """{symbol var name: value} with symbol k at `value` and the others at their bounds."""
        return {symbol_var(j).name: (value if j == k else s.hi) for j, s in enumerate(self.symbols)}

    def buckets(self, values: list | None) -> tuple:
        """(the index of the one varying symbol, its bucket values below its bound, ascending):
        `values`, or default_buckets. A UserError where more than one symbol varies, or a value is
        outside the range."""
        moving = [k for k, s in enumerate(self.symbols) if s.lo < s.hi]
        if len(moving) != 1:
            raise UserError(f"buckets are values of one varying dimension; this model has {len(moving)} "
                            f"({', '.join(s.name for s in self.symbols)}): fix the others with --input-shape")
        k = moving[0]
        sym = self.symbols[k]
        if values is not None and sym.step > 1:
            raise UserError(f"{sym.name} varies in steps of {sym.step}: buckets of it are not supported yet; "
                            "leave them to the tune (no --buckets)")
        values = default_buckets(sym) if values is None else sorted(set(values))
        if bad := [v for v in values if not sym.lo <= v <= sym.hi]:
            raise UserError(f"bucket {bad[0]} is outside {sym.name}'s range [{sym.lo}..{sym.hi}]")
        return k, [v for v in values if v != sym.hi]

    def spec(self) -> dict:
        """The ranges as parse_dynamic reads them back: {input: [int, [symbol, lo, hi] or "symbol+c"]}."""
        def one(d):
            if not isinstance(d, tuple):
                return d
            if len(d) == 2:
                s = self.symbols[d[1]]
                return [s.name, s.lo * s.step, s.hi * s.step] + ([s.step] if s.step > 1 else [])
            return "+".join(self.symbols[k].name for k in _terms(d)) + (f"{d[2]:+d}" if d[2] else "")
        return {name: [one(d) for d in dims] for name, dims in self.dims.items()}


def _terms(d: tuple) -> tuple:
    """The symbols a dynamic dim sums (one, or several: ("sum", (k, ...), c))."""
    return d[1] if d[0] == "sum" else (d[1],)


def dim_value(d, values: dict, symbols: tuple) -> int:
    """A dim of DynamicInputs.dims at `values` ({symbol var name: value}) of `symbols`."""
    if not isinstance(d, tuple):
        return d
    return sum(values[symbol_var(k).name] * symbols[k].step for k in _terms(d)) + (d[2] if len(d) == 3 else 0)


def load_at(model: str, shapes: dict, run_time: frozenset = frozenset(), folded: dict | None = None,
            shared: dict | None = None):
    """The model imported at `shapes` for a range of them: meta "dynamic" tells the passes that
    decide by a dimension's value (PadMatmulColumns) to leave the graph as it is, so that the
    graph at every value has the same kernels (a compile for the range, and the tunes of its
    buckets). run_time, folded, shared: onnx_frontend.from_onnx's (load_range's run_time)."""
    from . import load
    g = load(model, shapes, run_time=run_time, folded=folded, shared=shared)
    g.meta["dynamic"] = True
    if run_time:
        g.meta["run_time"] = sorted(run_time)
    return g


RUN_TIME_ROUNDS = 4      # imports of the range, each computing at run time what the one before found varying


def is_start(bound: np.ndarray, here: np.ndarray) -> bool:
    """Whether a constant's value `here` is the start of its value at the bounds in every dimension:
    what a kernel laid out at the bounds reads of it."""
    if here.ndim != bound.ndim or any(x > y for x, y in zip(here.shape, bound.shape)):
        return False
    return np.array_equal(bound[tuple(slice(0, n) for n in here.shape)], here, equal_nan=here.dtype.kind == "f")


def load_range(model: str, dyn: DynamicInputs, input_shapes: dict | None = None) -> tuple:
    """(the model imported at each of dyn.points, run_time: the pairs (ONNX value, node reading it)
    computed at run time). A folded constant that a graph node reads and that is not the start of
    its value at the bounds (a decoder's position row wpe[P], RoPE's angles at the past length) is
    traced back through what folded it to the nearest values that are integers in steps at every
    point (the position ids [P]); those become iota nodes where the path reads them, whose start
    te.dynamic fits as an expression of the symbols, and what follows is computed at run time.
    Imported again until no such constant is left or none can be traced (the compile then names it)."""
    run_time: frozenset = frozenset()
    graphs, kept = [], run_time
    nodes = None
    shared: dict = {}          # the file parsed once, its weights read and transposed once, for every point
    for _ in range(RUN_TIME_ROUNDS):
        try:
            here, folded = [], []
            for p in dyn.points:
                folded.append({})
                here.append(load_at(model, dyn.shapes(p, input_shapes), run_time, folded[-1], shared))
                if len(here) > 1:
                    _share_constants(here[-1], folded[-1], here[0], folded[0])
        except (ValueError, UserError) as e:     # the model has no meaning at that shape
            if graphs:                           # what this round traced does not import: the last round stands
                return graphs, kept
            raise DynamicError(f"{model} does not import at {described(p, dyn.symbols)}: "
                               f"{str(e).splitlines()[0][:200]}; narrow the range to the shapes the model "
                               "runs at") from None
        graphs, kept = here, run_time
        onnx_name = {v.name: name for name, v in folded[0].items()}
        read = {v.name: v for n in graphs[0].nodes for v in n.inputs if v.is_const}
        varying = [onnx_name[v.name] for v in read.values() if v.name in onnx_name and not _starts(onnx_name[v.name], folded)]
        if not varying:
            break
        if nodes is None:
            nodes = _onnx_nodes(shared.get("model") or model)
        more = {edge for x in varying for edge in _roots(x, folded, *nodes)} - run_time
        if not more:
            break
        run_time |= more
    return graphs, kept


def _share_constants(g, folded: dict, first, first_folded: dict) -> None:
    """Each constant of `g` (and of its folded values) equal to the one of that name at the first
    point takes that one's array: the points' weights are held once, not once per point (GPT-Neo's
    step, 0.84 GB of weights over 6 points, held 12 GiB)."""
    base = {v.name: v.data for v in first_folded.values()}
    base.update((v.name, v.data) for n in first.nodes for v in n.inputs if v.is_const)
    for v in itertools.chain(folded.values(), (v for n in g.nodes for v in n.inputs if v.is_const)):
        b = base.get(v.name)
        if b is not None and b is not v.data and b.dtype == v.data.dtype and b.shape == v.data.shape \
                and np.array_equal(b, v.data, equal_nan=b.dtype.kind == "f"):
            v.data = b


def _starts(name: str, folded: list) -> bool:
    """Whether folded value `name` is at every point the start of its value at the bounds."""
    return all(name in f and is_start(folded[0][name].data, f[name].data) for f in folded[1:])


def _onnx_nodes(model) -> tuple:
    """({value: the node computing it}, {value: the nodes reading it}) of an ONNX file's graph (or
    of its ModelProto, parsed)."""
    import onnx
    g = (model if hasattr(model, "graph") else onnx.load(str(model), load_external_data=False)).graph
    producer, readers = {}, {}
    for n in g.node:
        for o in n.output:
            producer[o] = n
        for i in n.input:
            readers.setdefault(i, []).append(n)
    return producer, readers


def _roots(x: str, folded: list, producer: dict, readers: dict) -> set:
    """Pairs (value, node reading it) where the values folded into `x` first become integers in
    steps at every point that are not the start of their value at the bounds, each with the node
    on the way to x that reads it (every node reading x that imports as a graph node, where x is one);
    or a fixed constant and the Slice that takes a window of it that moves with the symbols."""
    from ..ops.shape import affine_steps
    out, todo, seen = set(), [(x, None)], set()
    while todo:
        y, reader = todo.pop()
        key = (y, id(reader))
        if key in seen or any(y not in f for f in folded) or _starts(y, folded):
            continue
        seen.add(key)
        if all(f[y].data.ndim and affine_steps(np.asarray(f[y].data)) is not None for f in folded):
            path = [reader] if reader is not None else [n for n in readers.get(y, []) if n.output and n.output[0] not in folded[0]]
            out |= {(y, n.output[0]) for n in path if n.output}
            continue
        if y in producer:
            node = producer[y]
            if node.op_type in _WINDOWS and node.input[0] and (node.input[0] not in folded[0] or _starts(node.input[0], folded)):
                out.add((node.input[0], y))     # a fixed table's window that moves with the symbols: sliced at run time
                continue
            skip = _SHAPING.get(node.op_type, ())
            todo.extend((i, node) for k, i in enumerate(node.input) if i and k not in skip)
    return out


# ONNX ops whose output is a window of their first input (GPT-Neo's causal mask, rows P..P+S of a
# fixed triangle): of a fixed constant, the window's start is an integer of the formula (te.dynamic)
_WINDOWS = ("Slice",)
# ONNX op -> its inputs that only shape its output (a target shape, slice bounds, axes, repeats): a
# value that varies through them varies by its shape, which each point's import folds; the trace
# follows the data inputs only (computing an Expand's shape at run time would leave it unimportable)
_SHAPING = {"Expand": (1,), "Reshape": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Squeeze": (1,),
            "Unsqueeze": (1,), "ConstantOfShape": (0,), "Resize": (1, 2, 3), "Split": (1,), "TopK": (1,),
            "CumSum": (1,), "OneHot": (1,), **{f"Reduce{r}": (1,) for r in ("Sum", "Mean", "Max", "Min", "Prod", "L2")}}


def default_buckets(s: Symbol) -> list:
    """Values of a symbol at which its tasks are tuned, below its bound (which is tuned as well):
    an eighth, a quarter and a half of it, where they lie in its range."""
    return sorted({v for v in (s.hi // 8, s.hi // 4, s.hi // 2) if s.lo <= v < s.hi and v > 1})


MAX_HISTOGRAM_LINES = 1_000_000


def read_histogram(path: str, sym: Symbol) -> dict:
    """{value: count} of `sym` from a file of lines `VALUE [COUNT]` (the lengths a deployment sees;
    '#' starts a comment). A UserError naming the line that is not that, or a value off the range."""
    from pathlib import Path
    try:
        text = Path(path).read_text(errors="replace").splitlines()[:MAX_HISTOGRAM_LINES + 1]
    except OSError as e:
        raise UserError(f"cannot read --shape-histogram {path}: {e.strerror}") from None
    if len(text) > MAX_HISTOGRAM_LINES:
        raise UserError(f"--shape-histogram {path} has more than {MAX_HISTOGRAM_LINES} lines; give each value once "
                        "with its count")
    hist: dict = {}
    for n, line in enumerate(text, 1):
        words = line.split("#")[0].replace(",", " ").split()
        if not words:
            continue
        if len(words) > 2 or not all(w.isascii() and w.isdigit() and len(w) <= 12 for w in words):
            raise UserError(f"--shape-histogram {path}, line {n}: {line.strip()[:60]!r} is not `VALUE [COUNT]`")
        value, count = int(words[0]), int(words[1]) if len(words) == 2 else 1
        if not sym.lo <= value <= sym.hi:
            raise UserError(f"--shape-histogram {path}, line {n}: {value} is outside {sym.name}'s range "
                            f"[{sym.lo}..{sym.hi}]; widen --dynamic or drop the line")
        hist[value] = hist.get(value, 0) + count
    if not sum(hist.values()):
        raise UserError(f"--shape-histogram {path} holds no value with a count above 0; write one `VALUE [COUNT]` "
                        "per line")
    return hist


def histogram_buckets(hist: dict, sym: Symbol, n: int = 3) -> list:
    """Up to `n` bucket values below the bound that cut the histogram's time (count x value: a run
    costs about its length) into equal shares, each the largest value of its share: every value
    seen runs a version tuned at or just above it."""
    total, acc, passed, out = sum(c * v for v, c in hist.items()), 0, 0, []
    for v in sorted(hist):
        acc += hist[v] * v
        if acc * n // total > passed:           # the value at which a share ends (a heavy one ends several)
            passed = acc * n // total
            out.append(v)
    return [v for v in out if 1 < v < sym.hi]      # as default_buckets: no bucket at 1


def shares(values: list, sym: Symbol, hist: dict | None = None) -> list:
    """Each of the ascending `values`' (buckets, then the bound) share of the time of the runs: of
    the histogram's values, else of one run at each value of the range, those above the bucket
    below it, each weighted by its value."""
    bounds = list(zip([sym.lo - 1] + values[:-1], values))
    w = ([sum(c * v for v, c in hist.items() if lo < v <= hi) for lo, hi in bounds] if hist else
         [(lo + 1 + hi) * (hi - lo) / 2 for lo, hi in bounds])
    return [x / sum(w) for x in w]


def parse_dynamic(spec, declared: dict) -> DynamicInputs:
    """`spec`: "NAME=1x[1..512]" (several joined by ';' or given as a list), or {name: [1, (1, 512)]}
    (a range may be (symbol name, lo, hi)). `declared`: {input: its dims in the model, an int,
    a dim_param name or None}. Raises GraphError naming what cannot be read or does not fit."""
    items = _items(spec)
    symbols: list = []
    index: dict = {}                    # symbol name -> its position

    def symbol(name: str, lo: int, hi: int, step: int, where: str):
        if name in index:
            s = symbols[index[name]]
            if (s.lo * s.step, s.hi * s.step, s.step) != (lo, hi, step):
                raise GraphError(f"--dynamic gives {name} the range {_written(s.lo * s.step, s.hi * s.step, s.step)} "
                                 f"and {_written(lo, hi, step)} ({where}); give one range")
            return ("sym", index[name])
        if step < 1:
            raise GraphError(f"--dynamic {where}: a range's step is 1 or more, not {step}")
        if step > 1 and lo < step <= hi:
            raise GraphError(f"--dynamic {where}: {_written(lo, hi, step)} must start at one step or more, e.g. "
                             f"{_written(step, hi // step * step, step)}")
        if step > 1 and (lo % step or hi % step):
            up, down = -(-lo // step) * step, hi // step * step
            raise GraphError(f"--dynamic {where}: {_written(lo, hi, step)} must start and end at multiples of its step"
                             + (f", e.g. {_written(up, down, step)}" if 1 <= up <= down else ""))
        try:
            symbols.append(Symbol(name, lo // step, hi // step, step))
        except DynamicError as e:
            raise GraphError(f"--dynamic {where}: {e}") from None
        index[name] = len(symbols) - 1
        return ("sym", index[name])

    dims: dict = {}
    follow: dict = {}                   # a dim_param written as symbols + c -> ("sym", k, c) or ("sum", ks, c)
    for name, given in sorted(items.items(), key=lambda kv: any(isinstance(g, str) for g in kv[1])):
        if name not in declared:
            raise GraphError(f"--dynamic names {name}, which the model has no input called; its inputs are "
                             f"{', '.join(declared) or 'none'}")
        model = declared[name]
        if len(given) != len(model):
            raise GraphError(f"--dynamic {name} gives {len(given)} dims; the model's input has {len(model)}")
        out = []
        for axis, (g, m) in enumerate(zip(given, model)):
            if isinstance(g, int):
                if isinstance(m, int) and m != g:
                    raise GraphError(f"--dynamic {name}: dim {axis} is {m} in the model, not {g}")
                out.append(g)
                continue
            if isinstance(g, str):                     # follows a symbol: its range is given elsewhere
                if isinstance(m, int):
                    raise GraphError(f"--dynamic {name}: dim {axis} is fixed at {m} in the model; export it with a "
                                     "dynamic axis to vary it")
                d = _following(g, index, symbols, name)
                if isinstance(m, str) and m not in index:
                    follow[m] = d
                out.append(d)
                continue
            sym_name, lo, hi, step = g
            if isinstance(m, int):
                raise GraphError(f"--dynamic {name}: dim {axis} is fixed at {m} in the model; export it with a "
                                 "dynamic axis to vary it")
            out.append(symbol(sym_name or (m if isinstance(m, str) else f"{name}.{axis}"), lo, hi, step, name))
        dims[name] = out
    for name, model in declared.items():         # other inputs that name a symbol's dim_param share it
        if name in dims:
            continue
        if any(isinstance(m, str) and (m in index or m in follow) for m in model):
            dims[name] = [follow.get(m) or ("sym", index[m]) if isinstance(m, str) and (m in index or m in follow)
                          else m for m in model]
            if any(d is None or isinstance(d, str) for d in dims[name]):
                raise GraphError(f"input {name} has dims {model}; give all of its dynamic ones with --dynamic")
    if not symbols:
        raise GraphError("--dynamic gives no range; write a varying dimension as [lo..hi], e.g. input_ids=1x[1..512]")
    alone = {d[1] for ds in dims.values() for d in ds if isinstance(d, tuple) and len(d) == 2}
    if lost := [s.name for k, s in enumerate(symbols) if k not in alone]:       # a run reads each value off an input
        raise GraphError(f"--dynamic: no input has {lost[0]} itself as a dim, only dims that follow it; give one its range")
    return DynamicInputs(tuple(symbols), dims)


def _following(text: str, index: dict, symbols: list, where: str) -> tuple:
    """("sym", k, c) of a dim written "[name+c]" (or "name-c", "name"): symbol k plus c; ("sum", (k,
    ...), c) of "[past+seq]" or "[past+seq-1]": a sum of distinct symbols plus c."""
    body = text.strip()[1:-1] if text.strip().startswith("[") else text.strip()
    terms, i = [], 0
    while i < len(body) and (m := _TERM.match(body, i)) and (m.group(1) or not terms):
        terms.append((m.group(1) or "+", m.group(2)))
        i = m.end()
        while i < len(body) and body[i] == " ":
            i += 1
    names = [t for sign, t in terms if not t.isdigit()]
    if i != len(body) or not terms or terms[0][1].isdigit() or terms[0][0] == "-" or \
            any(sign == "-" for sign, t in terms if not t.isdigit()) or any(t not in index for t in names) or \
            len(set(names)) != len(names):
        known = ", ".join(index) or "none yet"
        raise GraphError(f"--dynamic {where}: {text!r} is not a sum of symbols plus or minus a number, e.g. [past+1] or "
                         f"[past+seq], of distinct symbols given a range (symbols: {known})")
    ks = tuple(index[t] for t in names)
    c = sum(int(t) * (-1 if sign == "-" else 1) for sign, t in terms if t.isdigit())
    low = sum(symbols[k].lo * symbols[k].step for k in ks) + c
    if low < 1:
        raise GraphError(f"--dynamic {where}: {text} is {low} at "
                         + ", ".join(f"{symbols[k].name}={symbols[k].lo * symbols[k].step}" for k in ks)
                         + "; a dim is 1 or more")
    if len(ks) > 1:
        return ("sum", ks, c)
    return ("sym", ks[0], c) if c else ("sym", ks[0])


def _items(spec) -> dict:
    if isinstance(spec, dict):
        return {name: [d if isinstance(d, int) else _range_tuple(name, d) for d in dims] for name, dims in spec.items()}
    parts = [p for item in ([spec] if isinstance(spec, str) else spec) for p in item.split(";") if p.strip()]
    out = {}
    for part in parts:
        name, eq, text = part.strip().partition("=")
        if not eq or not name:
            raise GraphError(f"cannot read --dynamic {part!r}: expected NAME=1x[1..512]")
        tokens = _tokens(text.strip())
        if tokens is None:
            raise GraphError(f"cannot read --dynamic {part!r}: each dim is a number, a range [lo..hi] or symbols "
                             "plus or minus a number ([past+1], [past+seq]), joined by x")
        dims = []
        for d in tokens:
            m = _RANGE.match(d)
            dims.append((m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4) or 1)) if m
                        else d if d.startswith("[") else int(d))
        out[name.strip()] = dims
    return out


def _tokens(text: str) -> list | None:
    """'1x[1..512]' -> ['1', '[1..512]']: dims read left to right, each followed by x or the end."""
    out, i = [], 0
    while True:
        m = _DIM.match(text, i)
        if not m:
            return None
        out.append(m.group(0))
        i = m.end()
        if i == len(text):
            return out
        if text[i] != "x":
            return None
        i += 1


def _range_tuple(name: str, d):
    """(symbol name or None, lo, hi, step) of a range given in Python: (lo, hi), (lo, hi, step),
    (symbol, lo, hi) or (symbol, lo, hi, step); a str as it is (symbols plus c)."""
    if isinstance(d, str):
        return d
    if isinstance(d, (tuple, list)):
        named = len(d) > 0 and isinstance(d[0], str)
        nums = d[1:] if named else d
        if len(nums) in (2, 3) and all(isinstance(x, int) and not isinstance(x, bool) for x in nums):
            return (d[0] if named else None, nums[0], nums[1], nums[2] if len(nums) == 3 else 1)
    raise GraphError(f"dynamic={{{name!r}: ...}}: each dim is an int, (lo, hi), (lo, hi, step), (symbol, lo, hi), "
                     f"(symbol, lo, hi, step) or \"symbol+c\", got {d!r}")


def _written(lo: int, hi: int, step: int) -> str:
    return f"[{lo}..{hi}" + (f":{step}]" if step > 1 else "]")
