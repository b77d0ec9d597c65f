"""The static memory plan: every intermediate tensor gets an offset in one arena.

A tensor lives from the step that writes it to the last step that reads it (both included, so a
kernel's output shares no memory with its own inputs), except where a step writes its output over
an input that dies with it (`over`: a softmax or LayerNorm that schedule.inplace found safe): the
two are then one tensor. Tensors whose lifetimes overlap get disjoint byte ranges; the others may
share. Placement is greedy by size, largest first, each at the lowest aligned offset that clashes
with no placed tensor alive at the same time (the "greedy by size" planner of TFLite and TVM's
storage rewrite); it is not optimal, but on convolutional networks it comes within a few percent
of the largest live set.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


@dataclass(frozen=True)
class Lifetime:
    name: str
    nbytes: int
    first: int          # step that writes it
    last: int           # last step that reads it


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def merge(tensors: list, over: dict | None = None) -> tuple:
    """(Lifetimes with each in-place chain as one, {name: the name of its chain's Lifetime});
    over: {output: the input whose memory it takes}."""
    over = over or {}
    root = {}
    for t in tensors:
        r = t.name
        while r in over:
            r = over[r]
        root[t.name] = r
    merged: dict = {}
    for t in tensors:
        m = merged.get(root[t.name])
        merged[root[t.name]] = t if m is None else Lifetime(m.name, max(m.nbytes, t.nbytes), min(m.first, t.first),
                                                           max(m.last, t.last))
    return list(merged.values()), {t.name: merged[root[t.name]].name for t in tensors}


def plan(tensors: list, over: dict | None = None) -> tuple:
    """({name: byte offset}, arena bytes) for a list of Lifetimes; over: as merge's."""
    merged, holder = merge(tensors, over)
    placed: list = []                       # (offset, end, Lifetime)
    at: dict = {}
    for t in sorted(merged, key=lambda t: (-t.nbytes, t.first, t.name)):
        size = align(max(t.nbytes, 1))
        clashes = sorted((o, e) for o, e, u in placed if u.first <= t.last and t.first <= u.last)
        offset = 0
        for o, e in clashes:
            if offset + size <= o:
                break
            offset = max(offset, e)
        placed.append((offset, offset + size, t))
        at[t.name] = offset
    return {name: at[h] for name, h in holder.items()}, max((e for _, e, _ in placed), default=0)


def peak_live_bytes(tensors: list, over: dict | None = None) -> int:
    """The most bytes alive at one step: no plan can use less."""
    tensors = merge(tensors, over)[0]
    steps = {s for t in tensors for s in (t.first, t.last)}
    return max((sum(align(t.nbytes) for t in tensors if t.first <= s <= t.last) for s in steps), default=0)
