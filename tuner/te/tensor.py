"""Tensors, placeholders and `compute`: the dataflow that schedules are applied to."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .expr import Const, Expr, Load, Reduce, Var, as_expr, walk


@dataclass(frozen=True)
class IterVar:
    name: str
    extent: int
    reduce: bool = False

    @property
    def var(self) -> Var:
        return Var(self.name)


@dataclass(eq=False)
class Tensor:
    name: str
    shape: tuple
    op: "Operation"
    dtype: str = "float32"

    def __getitem__(self, idx) -> Load:
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) != len(self.shape):
            raise IndexError(f"{self.name} has {len(self.shape)} dims, indexed with {len(idx)}")
        return Load(self.name, tuple(as_expr(i) for i in idx))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"Tensor({self.name}, {list(self.shape)})"


@dataclass(eq=False)
class Operation:
    name: str


@dataclass(eq=False)
class PlaceholderOp(Operation):
    pass


@dataclass(eq=False)
class ComputeOp(Operation):
    axes: tuple                      # spatial IterVars, one per output dim
    body: Expr                       # element value; a Reduce for reductions
    inputs: tuple = field(default=())  # tensors read by body
    tag: str = "injective"           # elemwise | broadcast | injective | reduction | pad
    table: dict = field(default_factory=dict)   # axes that index a small constant matrix -> period (space.sketch)

    @property
    def reduce_axes(self) -> tuple:
        return self.body.axes if isinstance(self.body, Reduce) else ()

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.body, Reduce)


def placeholder(shape: Sequence[int], name: str, dtype: str = "float32") -> Tensor:
    shape = tuple(int(s) for s in shape)
    return Tensor(name, shape, PlaceholderOp(name), dtype)


def reduce_axis(extent: int, name: str) -> IterVar:
    return IterVar(name, int(extent), reduce=True)


def sum_reduce(source: Expr, axes: Sequence[IterVar]) -> Reduce:
    return Reduce("sum", as_expr(source), tuple(axes), Const(0.0))


def max_reduce(source: Expr, axes: Sequence[IterVar]) -> Reduce:
    return Reduce("max", as_expr(source), tuple(axes), Const(float("-inf")))


def compute(shape: Sequence[int], fcompute: Callable, name: str, tag: str = "injective",
            inputs: Sequence[Tensor] = (), axis_names: Sequence[str] | None = None,
            table: dict | None = None) -> Tensor:
    """Define a tensor by an element formula over named spatial axes.

    `table` names the spatial axes whose index selects entries of a small constant matrix (the
    Winograd transforms), each with its period: 0 when the axis runs over the matrix's rows, m
    when the row is the index modulo m. The table sketch unrolls them so that the entries fold."""
    shape = tuple(int(s) for s in shape)
    names = list(axis_names) if axis_names else [f"i{k}" for k in range(len(shape))]
    axes = tuple(IterVar(n, e) for n, e in zip(names, shape))
    body = as_expr(fcompute(*[a.var for a in axes]))
    read = {n.buffer for n in walk(body) if isinstance(n, Load)}
    missing = read - {t.name for t in inputs}
    if missing:
        raise ValueError(f"compute {name!r} reads {sorted(missing)} that are not in its inputs")
    op = ComputeOp(name, axes, body, tuple(t for t in inputs if t.name in read), tag, dict(table or {}))
    if isinstance(body, Reduce):
        op.tag = tag if tag != "injective" else "reduction"
        for r in body.axes:
            if not r.reduce:
                raise ValueError(f"compute {name!r}: reduce axis {r.name} was not made by reduce_axis")
    return Tensor(name, shape, op)


def topo_order(output: Tensor) -> list:
    """All tensors feeding `output`, producers first, in a deterministic order."""
    order, seen = [], set()

    def visit(t: Tensor):
        if t.name in seen:
            return
        seen.add(t.name)
        if isinstance(t.op, ComputeOp):
            for i in t.op.inputs:
                visit(i)
        order.append(t)

    visit(output)
    return order
