"""Mutations of a point in the search space (its decisions), used by evolutionary search.

Each mutation changes one decision and keeps the point legal: a tile mutation moves a prime
factor of an axis from one tiling level to another (the product stays the axis extent, rounded up
to whole tiles for a guarded one); the
others pick a different reduce split, auto-unroll depth, pad placement (another of three),
epilogue placement, register-tile loop order, the parallel loop's order or a GPU shared tile's
storage order.
A point of a flat sketch (injective, table) gets another option for one of its decisions.
"""
from __future__ import annotations

import copy
import math
import random

from .sketch import UNROLL_CHOICES, SearchSpace, divisors

# how often each kind of mutation is tried: tiling matters most
WEIGHTS = {"tile": 0.6, "reduce": 0.15, "unroll": 0.15, "pad": 0.1, "epilogue": 0.05, "order": 0.1, "major": 0.1,
           "parallel": 0.05, "prefetch": 0.05}


def _prime_factors(n: int) -> list:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def mutate(space: SearchSpace, dec: dict, rng: random.Random, attempts: int = 20):
    """A legal neighbour of `dec`, or None if none was found."""
    if space.kind != "tiled":              # a flat sketch: another option for one decision
        options = {name: [o for o in opts if o != dec.get(name)] for name, opts in space.choices().items()}
        names = [name for name, opts in options.items() if opts]
        if not names:
            return None
        name = rng.choice(names)
        return {**dec, name: rng.choice(options[name])}
    present = {"pad": space.pads, "reduce": space.reduce_axes, "epilogue": space.epilogues, "order": space.orders,
               "major": space.major_options, "parallel": space.parallel_orders,
               "prefetch": space.prefetched}
    kinds = [k for k in WEIGHTS if present.get(k, True)]
    for _ in range(attempts):
        kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        new = copy.deepcopy(dec)
        if kind == "tile":
            d = rng.randrange(len(new["tile"]))
            extent = space.out_shape[d]
            levels = [-(-extent // math.prod(new["tile"][d]))] + list(new["tile"][d])   # a guarded tile: rounded up
            src = rng.choice([k for k in range(4) if levels[k] > 1] or [0])
            if levels[src] == 1:
                continue
            p = rng.choice(_prime_factors(levels[src]))
            dst = rng.choice([k for k in range(4) if k != src])
            levels[src] //= p
            levels[dst] *= p
            new["tile"][d] = levels[1:]
            if new["tile"][d] not in space.tile_options(d):    # a register length, whole tiles
                continue
            if not space.valid_tile(new["tile"]):
                continue
        elif kind == "reduce":
            j = rng.randrange(len(space.reduce_axes))
            options = [x for x in divisors(space.reduce_axes[j][1]) if x != new["reduce"][j]]
            if not options:
                continue
            new["reduce"][j] = rng.choice(options)
        elif kind == "unroll":
            new["unroll"] = rng.choice([u for u in UNROLL_CHOICES if u != new["unroll"]])
        elif kind == "epilogue":
            new["epilogue"] = "apart" if new.get("epilogue", "fused") == "fused" else "fused"
        elif kind == "major":                  # one shared tile: reduction-major or as stored
            k = rng.choice(space.major_options)
            new["major"] = list(new.get("major") or [0] * len(space.reads))
            new["major"][k] ^= 1
        elif kind == "order":
            new["order"] = rng.choice([o for o in space.orders if o != new.get("order", space.orders[0])])
        elif kind == "prefetch":
            new["prefetch"] = rng.choice([v for v in space.prefetch_options if v != new.get("prefetch", 0)])
        elif kind == "parallel":
            opts = space.parallel_orders
            new["parallel"] = rng.choice([o for o in opts if o != new.get("parallel", opts[0])])
        else:
            p = rng.choice(space.pads)
            new["pad"][p] = rng.choice([w for w in space.pad_places if w != new["pad"][p]])
        if new != dec:
            return new
    return None
