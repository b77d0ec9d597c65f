"""Accumulators that a built kernel carries through the stack: read from what objdump prints of its object.

GCC's register allocator sometimes keeps one accumulator of a register tile in a stack slot: each
trip of the reduction loop loads it, adds one product and stores it back, so that one chain waits on
a store and a load every trip (the loop ran 1.5x slower: docs/history.md). It happens where the tile
takes every vector register (16 in AVX2) and depends on the loop nest around the tile, not only on
the tile, so it is read from the code GCC made. A stack slot that an innermost loop with FMAs both
loads into a vector register and stores from one, with at most SPILLED_FMAS of the loop's FMAs
adding into the register it was loaded into, is a spilled accumulator; a local tile kept in memory
on purpose takes many products per load and store.
"""
from __future__ import annotations

import re
import shutil
import subprocess

SPILLED_FMAS = 2      # products a trip adds into a stack slot's register, at most, for it to be a spill
MIN_FMAS = 4          # an innermost loop with fewer FMAs is not a register tile's reduction

_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
_JUMP = re.compile(r"^j\w+$")
_SLOT = r"(-?0x[0-9a-f]+|-?\d+)?\(%r[sb]p\)"
_LOAD = re.compile(rf"^({_SLOT}),%([xyz]mm\d+)$")
_STORE = re.compile(rf"^%([xyz]mm\d+),({_SLOT})$")


def _listing(text: str) -> list:
    """[(address, mnemonic, operands)] of objdump -d's instructions, in order."""
    out = []
    for line in text.splitlines():
        m = _INSN.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3).split("#")[0].strip()))
    return out


def _inner_loops(insns: list) -> list:
    """The bodies of innermost loops: from a backward jump's target to the jump, holding no other
    backward jump."""
    where = {a: k for k, (a, _, _) in enumerate(insns)}
    loops = []
    for k, (a, op, args) in enumerate(insns):
        if not _JUMP.match(op) or not (m := re.match(r"^([0-9a-f]+)\b", args)):
            continue
        start = where.get(int(m.group(1), 16))
        if start is None or start > k:
            continue
        body = insns[start:k + 1]
        if not any(_JUMP.match(o) and (t := re.match(r"^([0-9a-f]+)\b", x)) and int(t.group(1), 16) < b
                   for b, o, x in body[:-1]):
            loops.append(body)
    return loops


def _fma_dest(op: str, args: str) -> str | None:
    return args.rsplit(",", 1)[-1].lstrip("%") if op.startswith(("vfmadd", "vfnmadd", "vfmsub", "vfnmsub")) else None


def spilled_in(text: str) -> int:
    """Spilled accumulators (see the module's doc) in objdump -d's `text` of an object."""
    count = 0
    for body in _inner_loops(_listing(text)):
        if sum(_fma_dest(op, args) is not None for _, op, args in body) < MIN_FMAS:
            continue
        loads = {}                          # slot -> the registers loaded from it
        stores = set()
        for _, op, args in body:
            if op.startswith("vmov"):
                if m := _LOAD.match(args):
                    loads.setdefault(m.group(1), set()).add(m.group(3))
                elif m := _STORE.match(args):
                    stores.add(m.group(2))
        for slot in loads.keys() & stores:
            # products the trip adds into the register the slot was loaded into (both orders: the
            # load may sit below the store, at the loop's top, reached from the jump)
            regs = loads[slot]
            adds = sum(_fma_dest(op, args) in regs for _, op, args in body)
            if adds <= SPILLED_FMAS:
                count += 1
    return count


def spilled_accumulators(obj: str) -> int | None:
    """Spilled accumulators in the object file `obj`, or None where objdump cannot read it (no
    binutils on the host: nothing is known)."""
    tool = shutil.which("objdump")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "-d", "--no-show-raw-insn", obj], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return spilled_in(done.stdout) if done.returncode == 0 else None
