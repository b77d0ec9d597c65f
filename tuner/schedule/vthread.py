"""Virtual threads: a loop bound to "vthread" becomes V interleaved copies of one thread's work.

Ansor's GPU sketch gives each thread V tiles of the output that lie T threads apart (so that
neighbouring threads write neighbouring elements) while they share the block's shared-memory
tiles. Lowering leaves a vthread loop around the code of one tile: the accumulator is allocated
inside it and the shared tiles are filled inside it too (their regions relaxed over the vthread,
as over threadIdx, so the fill does not depend on it). This pass pushes the loop down to the
statements that depend on it, as TVM's InjectVirtualThread does:
  * a local buffer allocated inside it gets a leading dimension V, indexed by the vthread;
  * a statement that does not depend on it (a shared fill, a barrier) runs once;
  * a loop is kept around its body, which is pushed further (the V copies are independent, so
    the interchange is legal), so the copies end innermost, next to each other;
  * what is left, a statement that depends on it, sits in an unrolled loop of its own.
The result is a loop nest without vthread loops, run as it is by the C and CUDA generators.
"""
from __future__ import annotations

import dataclasses

from ..te.expr import Load, Var, free_vars, transform, walk
from . import ir
from .schedule import ScheduleError


def inject_virtual_threads(func: ir.Func) -> ir.Func:
    if not any(isinstance(s, ir.For) and s.kind == "vthread" for s in ir.stmts(func.body)):
        return func
    buffers = dict(func.buffers)

    def inject(loop):
        return _Push(loop.var, loop.extent, buffers).push(loop.body) if loop.kind == "vthread" else loop

    return dataclasses.replace(func, body=ir.map_loops(func.body, inject), buffers=buffers)


class _Push:
    def __init__(self, var: str, extent: int, buffers: dict):
        self.var, self.extent, self.buffers = var, extent, buffers
        self.expanded: set = set()

    def push(self, s):
        if not self._uses(s):
            return s                                        # the same for every virtual thread: once
        if isinstance(s, ir.Seq):
            return ir.seq([self.push(x) for x in s.stmts])
        if isinstance(s, ir.Allocate):
            if s.scope == "local":                          # one copy per virtual thread
                self.expanded.add(s.buffer)
                buf = self.buffers[s.buffer]
                order = (0,) + tuple(d + 1 for d in buf.order) if buf.order else ()
                self.buffers[s.buffer] = dataclasses.replace(buf, shape=(self.extent,) + tuple(buf.shape), order=order)
                body = _index_by(s.body, s.buffer, Var(self.var))
                return dataclasses.replace(s, shape=(self.extent,) + tuple(s.shape), body=self.push(body))
            return dataclasses.replace(s, body=self.push(s.body))
        if isinstance(s, ir.For):
            return dataclasses.replace(s, body=self.push(s.body))
        if isinstance(s, ir.IfThen) and self.var not in free_vars(s.cond):
            return dataclasses.replace(s, body=self.push(s.body))
        if _has_sync(s):
            raise ScheduleError(f"a barrier depends on virtual thread {self.var} ({type(s).__name__}); bind that "
                                "loop to threadIdx or leave it serial")
        return ir.For(self.var, self.extent, s, "unroll")

    def _uses(self, s) -> bool:
        for st in ir.stmts(s):
            exprs = []
            if isinstance(st, ir.Store):
                if st.buffer in self.expanded:
                    return True
                exprs = [st.value, *st.indices]
            elif isinstance(st, ir.IfThen):
                exprs = [st.cond]
            elif isinstance(st, ir.For) and st.var == self.var:
                return True
            for e in exprs:
                if self.var in free_vars(e):
                    return True
                if any(isinstance(n, Load) and n.buffer in self.expanded for n in walk(e)):
                    return True
        return False


def _index_by(s, buffer: str, v: Var):
    """`s` with every access to `buffer` given `v` as a new first index."""
    def fn(n):
        if isinstance(n, Load) and n.buffer == buffer:
            return Load(buffer, (v,) + tuple(n.indices))
        return None

    def visit(x):
        if isinstance(x, ir.Store):
            idx = tuple(transform(i, fn) for i in x.indices)
            if x.buffer == buffer:
                idx = (v,) + idx
            return ir.Store(x.buffer, idx, transform(x.value, fn))
        if isinstance(x, ir.Seq):
            return ir.Seq([visit(y) for y in x.stmts])
        if isinstance(x, ir.IfThen):
            return ir.IfThen(transform(x.cond, fn), visit(x.body))
        if isinstance(x, (ir.For, ir.Allocate)):
            return dataclasses.replace(x, body=visit(x.body))
        return x

    return visit(s)


def _has_sync(s) -> bool:
    return any(isinstance(x, ir.Sync) for x in ir.stmts(s))
