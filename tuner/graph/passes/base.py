"""Pass infrastructure: passes are pure Graph -> Graph functions run under a PassContext."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..ir import Graph


@dataclass
class PassContext:
    """opt_level: passes above it are skipped; disabled: passes skipped by name; instruments:
    objects with run_before_pass / run_after_pass hooks (IR printing, timing)."""
    opt_level: int = 3
    disabled: set = field(default_factory=set)
    instruments: list = field(default_factory=list)
    options: dict = field(default_factory=dict)   # pass options, e.g. {"layout": "NCHW16c"}

    _stack = []

    def __enter__(self):
        PassContext._stack.append(self)
        return self

    def __exit__(self, *exc):
        PassContext._stack.pop()

    @staticmethod
    def current() -> "PassContext":
        return PassContext._stack[-1] if PassContext._stack else PassContext()

    def enabled(self, p: "Pass") -> bool:
        return p.opt_level <= self.opt_level and p.name not in self.disabled


@dataclass
class Pass:
    name: str
    opt_level: int
    fn: Callable
    required: tuple = ()
    doc: str = ""

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> Graph:
        ctx = ctx or PassContext.current()
        for inst in ctx.instruments:
            inst.run_before_pass(graph, self)
        out = self.fn(graph, ctx)
        for inst in ctx.instruments:
            inst.run_after_pass(out, self)
        return out


class Sequential:
    """Runs passes in order; a pass whose required passes have not run yet gets them first."""

    def __init__(self, passes: list, name: str = "sequential"):
        self.passes = list(passes)
        self.name = name

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> Graph:
        ctx = ctx or PassContext.current()
        done: set = set()
        for p in self.passes:
            if not ctx.enabled(p):
                continue
            for req in p.required:
                if req not in done:
                    graph = REGISTRY[req](graph, ctx)
                    done.add(req)
            graph = p(graph, ctx)
            done.add(p.name)
        return graph


REGISTRY: dict = {}


def register(name: str, opt_level: int, required: tuple = ()):
    def wrap(fn):
        REGISTRY[name] = Pass(name, opt_level, fn, required, (fn.__doc__ or "").strip().splitlines()[0])
        return fn
    return wrap


# ---------------------------------------------------------------- instruments

class PrintIR:
    """Prints the graph after every pass."""

    def __init__(self, out=print):
        self.out = out

    def run_before_pass(self, graph, p):
        pass

    def run_after_pass(self, graph, p):
        self.out(f"// after {p.name}\n{graph}")


class PassTiming:
    """Collects wall time per pass."""

    def __init__(self):
        self.times: list = []
        self._start = 0.0

    def run_before_pass(self, graph, p):
        self._start = time.perf_counter()

    def run_after_pass(self, graph, p):
        self.times.append((p.name, time.perf_counter() - self._start))

    def report(self) -> str:
        total = sum(t for _, t in self.times) or 1e-9
        lines = [f"{name:<26} {t * 1e3:9.2f} ms {100 * t / total:5.1f}%" for name, t in self.times]
        lines.append(f"{'total':<26} {total * 1e3:9.2f} ms")
        return "\n".join(lines)
