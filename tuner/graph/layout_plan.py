"""Graph-level layout selection: one layout per convolution, minimising kernel plus transform time.

Each convolution of a model is a variable whose values are the layouts it can run in (NCHW, NHWC,
NCHW[x]c for the blocks that divide its output channels). Its unary cost is the latency of its
fused group's task in that layout, plus the tasks that inherit its layout (a pooling after it)
and the transform back to NCHW where its output meets a layout-sensitive op or a graph output.
A pairwise cost sits on every edge along which one convolution's layout meets another's: the
data edge to the next convolution (through ReLUs, pools and the like) and the second operand of
a residual add or concat, which ConvertLayout transforms to the layout of the operand it follows
(passes.convert_layout.followed_operand: the one a convolution's epilogue computes). The cost
of a plan is the sum of both; this is the model of TVM's graph tuner. It counts a value
transformed for two consumers twice where ConvertLayout shares one transform, and leaves out the
groups whose cost does not depend on a layout choice (they are the same under every plan).

`solve` is exact by dynamic programming over a frontier: the variables are taken in graph order,
a state is the layouts of the variables that still have an edge to a later one, and each state
keeps its cheapest history. On a chain the frontier is one variable; on ResNet-style residual
graphs two or three (the block input, the branch); on inception-style blocks one per open branch.
When a frontier's table would exceed `max_states` rows, only the `max_states` cheapest are kept
(a beam search) and the plan says it is not exact.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

from ..errors import UserError
from ..ops import BINARY, UNARY
from ..ops import winograd as WG
from ..te import layouts as L
from .ir import graph_anonymous
from .passes import optimize
from .passes.convert_layout import (AGNOSTIC_POOLS, followed_operand, fused_read, io_layouts, uses, winograd_applies,
                                    winograd_conv)
from .passes.extract_tasks import transform_task, workload_of
from .passes.pad_channels import padded_count


class NoPlan(UserError):
    """No assignment has a finite cost: some choice still lacks a measured kernel or transform."""


@dataclass
class LayoutProblem:
    """domains: variable -> candidate layouts, in graph order (dict order); unary: variable ->
    {layout: seconds} (a layout without a cost cannot be chosen); pairs: (u, v) -> {(layout of u,
    layout of v): seconds}, missing pairs cost nothing."""
    domains: dict
    unary: dict
    pairs: dict = field(default_factory=dict)

    def cost(self, layouts: dict) -> float:
        """The cost of a full assignment."""
        total = sum(self.unary[v].get(lay, math.inf) for v, lay in layouts.items())
        return total + sum(t.get((layouts[u], layouts[v]), 0.0) for (u, v), t in self.pairs.items())


@dataclass
class Plan:
    layouts: dict            # variable -> layout
    cost: float              # seconds, by the problem's costs
    exact: bool              # False when the beam dropped states
    states: int              # the largest frontier table
    seconds: float           # solver run time


def solve(problem: LayoutProblem, max_states: int = 4096) -> Plan:
    """The cheapest assignment (exact unless a frontier outgrew max_states, see the module doc)."""
    t0 = time.perf_counter()
    order = list(problem.domains)
    pos = {v: i for i, v in enumerate(order)}
    earlier: dict = {v: [] for v in order}      # v -> [(u, {(lay u, lay v): s})] with u before v
    last = dict(pos)                            # the position of a variable's last neighbour
    for (u, v), table in problem.pairs.items():
        if u not in pos or v not in pos:
            raise ValueError(f"pair ({u}, {v}) names a variable without a domain")
        if pos[u] > pos[v]:
            u, v, table = v, u, {(b, a): c for (a, b), c in table.items()}
        earlier[v].append((u, table))
        last[u] = max(last[u], pos[v])
    frontier: list = []
    states: dict = {(): (0.0, None)}            # frontier layouts -> (cost, (variable, layout, parent))
    exact, widest = True, 1
    for i, v in enumerate(order):
        unary = problem.unary.get(v, {})
        links = [(frontier.index(u), table) for u, table in earlier[v]]
        grown = frontier + [v]
        keep = [k for k, u in enumerate(grown) if last[u] > i]
        nxt: dict = {}
        for key, (cost, hist) in states.items():
            for lay in problem.domains[v]:
                c = cost + unary.get(lay, math.inf) + sum(t.get((key[k], lay), 0.0) for k, t in links)
                if c == math.inf:
                    continue
                full = key + (lay,)
                nk = tuple(full[k] for k in keep)
                if nk not in nxt or c < nxt[nk][0]:
                    nxt[nk] = (c, (v, lay, hist))
        if not nxt:
            raise NoPlan(f"no layout of {v} has a finite cost with its neighbours' (a kernel or a transform is "
                         "not measured yet); tune its tasks first")
        if len(nxt) > max_states:
            exact = False
            nxt = dict(sorted(nxt.items(), key=lambda kv: kv[1][0])[:max_states])
        widest = max(widest, len(nxt))
        frontier = [grown[k] for k in keep]
        states = nxt
    cost, hist = min(states.values(), key=lambda s: s[0])
    layouts: dict = {}
    while hist is not None:
        v, lay, hist = hist
        layouts[v] = lay
    return Plan({v: layouts[v] for v in order}, cost, exact, widest, time.perf_counter() - t0)


def brute_force(problem: LayoutProblem) -> Plan:
    """Every assignment tried (for tests and tiny problems)."""
    t0 = time.perf_counter()
    order = list(problem.domains)
    best, best_cost, n = None, math.inf, 0
    for combo in itertools.product(*(problem.domains[v] for v in order)):
        n += 1
        layouts = dict(zip(order, combo))
        c = problem.cost(layouts)
        if c < best_cost:
            best, best_cost = layouts, c
    if best is None:
        raise NoPlan("no assignment has a finite cost")
    return Plan(best, best_cost, True, n, time.perf_counter() - t0)


# ---------------------------------------------------------------- a model's layout problem

PRE_LAYOUT = ("InferType", "SimplifyInference", "MergeConvBranches", "FoldConstant", "EliminateCommonSubexpr", "DeadCodeElimination")


def anonymous_structure(graph) -> tuple:
    """(a hash of the graph after the passes before layouts, without node names or weights; the
    names of its conv and dense nodes in order): the same architecture exported by another tool
    (torchvision's ResNet-50 and the built-in one) has the same hash, and a layout plan of one
    applies to the other conv by conv, in that order."""
    pre = optimize(graph, passes=PRE_LAYOUT)
    return graph_anonymous(pre), [n.name for n in pre.nodes if n.op in ("conv2d", "dense")]


# The plan of a compile with none measured: a 3x3 stride-1 conv runs as Winograd F(m x m) from
# `least` output pixels a side (the first that fits), else directly: what the tuned plans of
# ResNet-50, ResNet-18 and GoogLeNet chose on three hosts (docs/history.md).
WINOGRAD_DEFAULT = ((28, 4), (14, 2))
WINOGRAD_MIN_CHANNELS = 16


def default_plan(graph, layout: str, lanes: int) -> dict:
    """{conv name: Winograd choice} by WINOGRAD_DEFAULT, in the block of `layout` (a blocked one),
    for the convs of 16 input channels or more whose output channels take whole blocks, with 8
    lanes (AVX2) as with 16 (docs/history.md); empty with fewer (SSE) or an unblocked layout."""
    if lanes < 8 or not L.block_of(layout):
        return {}
    pre = optimize(graph, passes=PRE_LAYOUT)
    choices = {m: f"winograd{m}@{layout}" for _, m in WINOGRAD_DEFAULT}
    nodes = {n.name: n for n in pre.nodes}
    plan = {}
    for name, domain in _domains(pre, tuple(choices.values()), ()).items():
        n = nodes[name]
        side = min(n.output.shape[2:])
        m = next((m for least, m in WINOGRAD_DEFAULT if side >= least), None)
        if m is not None and choices[m] in domain and n.inputs[0].shape[1] >= WINOGRAD_MIN_CHANNELS:
            plan[name] = choices[m]
    return plan


def whole_tiles(plan: dict, graphs: list, symbols: tuple = ()) -> dict:
    """`plan` with each Winograd conv in the largest tile, at most its own, whose multiples its
    output is at every value of the `symbols` (`graphs`: the model at their sample points, which
    fit each side), or without it where there is none: a size padded up to whole tiles is no
    multilinear function of the symbols (an image in steps of 32 is 2n at 1/16 of its size: tiles
    of 2, not 4; in steps of 8 with n from 4 to 16, 2n is whole 4s at every sample point, all even,
    and not at 5)."""
    if not plan or not graphs:
        return plan
    table = [{} for _ in graphs]
    for row, g in zip(table, graphs):
        for n in optimize(g, passes=PRE_LAYOUT).nodes:
            if n.name in plan:
                row.update({(n.name, d): side for d, side in enumerate(n.output.shape[2:])})
    values = _side_values(table, symbols)
    kept = {}
    for name, choice in plan.items():
        wino = WG.parse_choice(choice)
        if wino is None:
            kept[name] = choice
            continue
        sides = [v for (n, _), vs in values.items() if n == name for v in vs]
        m = max((t for t in WG.TILES if t <= wino[0] and sides and all(d % t == 0 for d in sides)), default=None)
        if m is not None:
            kept[name] = f"winograd{m}" + (f"@{wino[1]}" if "@" in choice else "")
    return kept


def _side_values(table: list, symbols: tuple) -> dict:
    """{(conv, dim): the values the side takes}: at every value of the symbols where it fits as a
    multilinear function of them (te.dynamic.every_value), else at the sample points (a side that
    is then not whole tiles at some other value is refused by the kernel's fit, which names it)."""
    from ..te.dynamic import DynamicError, evaluate, every_value, fit_table
    out = {k: [row[k] for row in table if k in row] for k in table[0]}
    if (points := every_value(symbols)) is None:
        return out
    try:
        fitted = fit_table(table, symbols)
    except DynamicError:
        return out
    out.update({k: [evaluate(e, at) for at in points] for k, e in fitted.items()})
    return out


def winograd_convs(layouts: dict) -> dict:
    """The Winograd entries of a plan: all a plan marked padded applies (records.PlanRecord)."""
    return {k: v for k, v in layouts.items() if WG.parse_choice(v) is not None}


def padded_graph(graph, layout: str, plan: dict, lanes: int | None = None):
    """The graph with its conv channels padded to whole blocks of `layout` (PadChannels), as a
    compile for vectors of `lanes` with no plan of the model's pads them under `plan` (the default
    plan, or {} where a layout is chosen), before the passes that choose layouts; None where nothing
    is padded. A plan solved on the unpadded graph compiles unpadded, so a tune of such a model
    measures this graph's tasks to serve that compile (model_tuning.quick_tune)."""
    pre = optimize(graph, passes=PRE_LAYOUT)
    out = optimize(pre, passes=("InferType", "PadChannels"), layout=layout, layout_plan=plan, lanes=lanes)
    convs = lambda g: [n.inputs[1].shape for n in g.nodes if n.op == "conv2d"]  # noqa: E731
    return out if convs(out) != convs(pre) else None


@dataclass
class ModelLayouts:
    """The layout choices of one model and the tasks whose latencies price them.

    domains: conv node name -> candidate layouts (graph order); unary: name -> {layout: [Workload]}
    (its fused group's task, the pooling tasks that inherit its layout, its transforms from and to
    fixed NCHW boundaries); pairs: (u, v) -> {(layout u, layout v): [Workload]} (layout transforms)."""
    graph_name: str
    domains: dict
    unary: dict
    pairs: dict
    fixed: list = field(default_factory=list)   # [Workload] of the groups no layout choice moves (one per group)

    def workloads(self) -> list:
        """[(Workload, occurrences over all candidate layouts)], each workload once."""
        found: dict = {}
        every = [wl for t in list(self.unary.values()) + list(self.pairs.values()) for wls in t.values()
                 for wl in wls] + list(self.fixed)
        for wl in every:
            w, n = found.get(wl.key, (wl, 0))
            found[wl.key] = (w, n + 1)
        return list(found.values())

    def restricted(self, layouts: dict) -> "ModelLayouts":
        """The same problem with each variable that `layouts` names, where its domain holds that
        layout, fixed to it (compile --quick measures the tasks of the plan the compile applies)."""
        pick = {v: (layouts[v],) if layouts.get(v) in d else d for v, d in self.domains.items()}
        unary = {v: {lay: wls for lay, wls in t.items() if lay in pick.get(v, (lay,))} for v, t in self.unary.items()}
        pairs = {(u, v): {k: wls for k, wls in t.items() if k[0] in pick.get(u, k[:1]) and k[1] in pick.get(v, k[1:])}
                 for (u, v), t in self.pairs.items()}
        return ModelLayouts(self.graph_name, pick, unary, pairs, list(self.fixed))

    def fixed_cost(self, latency) -> float:
        return sum(latency(wl) for wl in self.fixed)

    def plan(self, best: dict) -> tuple:
        """(Plan or None, estimated model seconds: the plan's cost plus the fixed groups) from
        {workload key: best latency}; (None, inf) while no assignment has a finite cost (a
        convolution with no measured layout, or no measured transform to any layout of a neighbour)."""
        lat = lambda wl: best.get(wl.key, math.inf)  # noqa: E731
        try:
            plan = solve(self.problem(lat))
        except NoPlan:
            return None, math.inf
        return plan, plan.cost + self.fixed_cost(lat)

    def estimate(self, layouts: dict, best: dict) -> float:
        """The estimated model seconds of a given assignment (a logged plan) under `best`."""
        lat = lambda wl: best.get(wl.key, math.inf)  # noqa: E731
        return self.problem(lat).cost(layouts) + self.fixed_cost(lat)

    def used(self, layouts: dict) -> dict:
        """{workload key: how often an assignment runs it} (as the solver counts: see the module doc)."""
        out: dict = {}
        chosen = [self.unary[v][lay] for v, lay in layouts.items()]
        chosen += [t.get((layouts[u], layouts[v]), []) for (u, v), t in self.pairs.items()]
        for wl in (wl for wls in chosen + [self.fixed] for wl in wls):
            out[wl.key] = out.get(wl.key, 0) + 1
        return out

    def problem(self, latency) -> LayoutProblem:
        """The LayoutProblem with latency(Workload) -> seconds (inf when unmeasured: that layout is out)."""
        price = lambda wls: sum(latency(wl) for wl in wls)  # noqa: E731
        return LayoutProblem(dict(self.domains),
                             {v: {lay: price(w) for lay, w in t.items()} for v, t in self.unary.items()},
                             {e: {k: price(w) for k, w in t.items()} for e, t in self.pairs.items()})


def _conv_layouts(n, layouts, lanes: int | None = None) -> tuple:
    """The candidate layouts of a conv node (in NCHW), NCHW first: of `layouts`, NCHW; NHWC and
    NCHW[x]c where x divides the output channels for ordinary convs; NCHW[x]c for depthwise ones,
    and for grouped ones whose group widths x divides (te.layouts.grouped_block);
    a Winograd choice (ops.winograd.parse_choice) where it applies (3x3, stride 1; a blocked one
    where its block divides the output channels); reading one blocked layout and writing another
    (convert_layout.fused_read) for ordinary convs whose output channels the second's block
    divides; NCHW alone when none of these fits. An ordinary conv also gets a blocked layout whose
    block its output channels do not take, in the block fitted to them (te.layouts.fit_block), where
    the compile in that layout for vectors of `lanes` does not pad them (PadChannels) and no
    candidate holds those bytes already: that compile runs it so (a squeeze-excitation conv writing
    4 channels runs in NCHW16c as blocks of 4), and a plan should price what it runs.

    An ordinary conv whose output channels a blocked layout of `layouts` does not take (24 in
    NCHW16c) also gets that layout as a read (NCHW16c>NCHW8c, writing the largest block of
    `layouts` that does take them), when that reads its input in a different block than the
    write layout alone would: its neighbours can then stay in NCHW16c with no transform kernel
    between them and it. On MobileNetV2 the two convs writing 24 channels had only NCHW8c, so
    their 56x56 stage ran in NCHW8c behind a 16c->8c transform."""
    k = n.inputs[1].shape[0]
    c = n.inputs[0].shape[1]
    groups = n.attrs.get("groups", 1)
    out = []
    for lay in layouts:
        if L.is_dense_packing(lay):
            continue
        if io := fused_read(lay):
            if groups == 1 and k % L.block_of(io[1]) == 0:
                out.append(lay)
            continue
        if wino := WG.parse_choice(lay):
            b = L.block_of(wino[1])
            if winograd_applies(n) and (not b or k % b == 0):
                out.append(lay)
            continue
        b = L.block_of(lay)
        if lay == "NCHW" or (groups == 1 and (not b or k % b == 0)) or (groups == c == k and b and k % b == 0) \
                or (b and L.grouped_block(c, k, groups, b) == b):
            out.append(lay)
    if groups == 1:                    # a block the output channels do not take is still read (the note above)
        blocked = [lay for lay in layouts if L.block_of(lay)]      # plain NCHW[x]c only
        untaken = [lay for lay in blocked if k % L.block_of(lay)]
        for lay in untaken:
            fits = [w for w in blocked if k % L.block_of(w) == 0 and not L.same_data(w, lay, c)]
            if fits and (read := f"{lay}>{max(fits, key=L.block_of)}") not in out:
                out.append(read)
        # ... and run in the block fitted to them, as a compile in that layout runs them where it does
        # not pad them (4 channels in NCHW16c: blocks of 4; PadChannels), where no candidate holds
        # that data yet (24 in NCHW16c are NCHW8c's)
        for lay in sorted(untaken, key=L.block_of, reverse=True):
            if padded_count(k, L.block_of(lay), lanes) == k and not any(o in blocked and L.same_data(lay, o, k) for o in out):
                out.append(lay)
    return tuple(sorted(out, key=lambda lay: lay != "NCHW")) or ("NCHW",)


def model_layouts(graph, layouts=("NCHW", "NHWC", "NCHW8c", "NCHW16c"), lanes: int | None = None) -> ModelLayouts:
    """The layout problem of `graph` compiled for vectors of `lanes` (None: each block's own): every
    conv with constant weights and a unique node name is a variable over `layouts` (filtered per
    conv by _conv_layouts); so is every such dense over the
    weight packings among `layouts` (OI, OI16o, ...), when there are any (else it runs in
    te.layouts.DENSE_PACKING, a fixed group). A dense's packing moves no activation, so its
    variable has no edges: the solver picks its fastest packing. The tasks come from compiling the
    graph's passes once per choice, so they are the tasks `tuner compile` meets under any plan."""
    pre = optimize(graph, passes=PRE_LAYOUT)
    packings = tuple(lay for lay in layouts if L.is_dense_packing(lay))
    domains = _domains(pre, layouts, packings, lanes)
    base = "NCHW16c" if "NCHW16c" in layouts else \
        next((lay for lay in layouts if not (WG.parse_choice(lay) or fused_read(lay) or L.is_dense_packing(lay))),
             "NCHW")
    tasks = _GroupTasks(graph, domains, packings, base)
    domains = tasks.runnable(domains, packings)
    edges = _Edges(domains, {v: {lay: tasks.of(v, lay) for lay in d} for v, d in domains.items()})
    carried = _follow_activations(pre, domains, tasks, edges)
    fixed = [tasks.group[(a, base)] for a in tasks.base_groups if a not in domains and a not in carried]
    return ModelLayouts(graph.name, domains, edges.unary, edges.pairs, fixed)


def _domains(pre, layouts, packings, lanes: int | None = None) -> dict:
    """conv or dense node name -> its candidate layouts, for nodes with constant weights and a
    unique name that have any."""
    names = [n.name for n in pre.nodes]
    candidates = {"conv2d": lambda n: _conv_layouts(n, layouts, lanes), "dense": lambda n: packings}
    domains = {n.name: candidates[n.op](n) for n in pre.nodes
               if n.op in candidates and n.inputs[1].is_const and len(n.inputs) == 2 and names.count(n.name) == 1}
    return {v: d for v, d in domains.items() if d}


class _GroupTasks:
    """The tasks of each variable's fused group (and of the pools that carry its layout), per
    layout: the graph compiled once per candidate layout."""

    def __init__(self, graph, domains: dict, packings: tuple, base: str):
        self.group: dict = {}            # (node name, layout) -> Workload
        self.base_groups: list = []      # anchor names of the task groups under the base layout
        self.winograd: dict = {}         # (conv name, Winograd choice) -> [its input and GEMM tasks]
        for lay in dict.fromkeys([base] + [lay for d in domains.values() for lay in d]):
            plan = {v: lay for v, d in domains.items() if lay in d}
            if WG.parse_choice(lay):     # every conv that can runs as `lay`, the others in its activation layout
                g = optimize(graph, layout=WG.activation_layout(lay), layout_plan=plan, pad_channels=False)
            elif io := fused_read(lay):  # every conv that can reads io[0] and writes io[1], the others in io[1]
                g = optimize(graph, layout=io[1], layout_plan=plan, pad_channels=False)
            elif lay in packings:        # every dense in packing `lay`, the convs in the base layout
                g = optimize(graph, layout=base, layout_plan=plan, pad_channels=False)
            else:
                g = optimize(graph, layout=lay, pad_channels=False)
            self._collect(g, lay, base)

    def _collect(self, g, lay: str, base: str) -> None:
        for grp in g.meta["fused_groups"]:
            if grp.anchor is None:
                continue
            node = g.nodes[grp.anchor]
            wl, _ = workload_of(g, grp)
            if wl is None:
                continue
            if conv := winograd_conv(node):
                self.winograd.setdefault((conv, lay), []).append(wl)
                continue
            self.group[(node.name, lay)] = wl
            if lay == base:
                self.base_groups.append(node.name)

    def runnable(self, domains: dict, packings: tuple) -> dict:
        """The domains without layouts whose group is no task (an epilogue the library lacks); a
        dense no packing can run is a fixed group."""
        out = {}
        for v, d in domains.items():
            ok = tuple(lay for lay in d if (v, lay) in self.group)
            if ok or d != packings:
                out[v] = ok or ("NCHW",)
        return out

    def of(self, v: str, lay: str) -> list:
        """The tasks a variable's layout costs on its own: its Winograd kernels and its group."""
        return self.winograd.get((v, lay), []) + [self.group[(v, lay)]] if (v, lay) in self.group else []


def _out_of(lay: str) -> str:
    return io_layouts(lay)[1]


def _in_of(lay: str) -> str:
    return io_layouts(lay)[0]


class _Edges:
    """The layout transforms a plan can need: on a variable's own cost (to and from the fixed NCHW
    boundaries) or on a pair of variables."""

    def __init__(self, domains: dict, unary: dict):
        self.domains, self.unary = domains, unary
        self.pairs: dict = {}            # (u, v) -> {(layout u, layout v): [Workload]}

    def add(self, u, v, shape, read=_out_of) -> None:
        """The value of `shape` leaves u's layout (the one it writes) for v's: the one v's conv reads
        (read=_in_of, its data input) or writes (a residual operand following it). None: fixed NCHW."""
        if u == v or (u is None and v is None):
            return
        if u is None:
            for lay in self.domains[v]:
                if read(lay) != "NCHW":
                    self.unary[v][lay].append(transform_task(shape, "NCHW", read(lay)))
            return
        if v is None:
            for lay in self.domains[u]:
                if _out_of(lay) != "NCHW":
                    self.unary[u][lay].append(transform_task(shape, _out_of(lay), "NCHW"))
            return
        t = self.pairs.setdefault((u, v), {})
        for a in self.domains[u]:
            for b in self.domains[v]:
                if not L.same_data(_out_of(a), read(b), shape[1]):
                    t.setdefault((a, b), []).append(transform_task(shape, _out_of(a), read(b)))


def _follow_activations(pre, domains: dict, tasks: _GroupTasks, edges: _Edges) -> set:
    """Walk the graph once, tracking which variable's layout each 4-D activation carries, and add
    the transforms where it meets another layout; returns the pools that carry a variable's layout
    (their tasks are priced with it)."""
    used = uses(pre)
    carried: set = set()
    src: dict = {id(v): None for v in pre.inputs}         # value -> the variable whose layout it carries

    def acts(n):
        return [x for x in n.inputs if not x.is_const and len(x.shape) == 4]

    for n in pre.nodes:
        ins = acts(n)
        if n.name in domains and n.op == "conv2d":
            edges.add(src.get(id(n.inputs[0])), n.name, n.inputs[0].shape, read=_in_of)
            src[id(n.output)] = n.name
        elif ins and (n.op in UNARY or n.op in AGNOSTIC_POOLS):
            s = src.get(id(ins[0]))
            src[id(n.output)] = s
            if n.op in AGNOSTIC_POOLS and s is not None:
                carried.add(n.name)
                for lay in domains[s]:
                    wl = tasks.group.get((n.name, lay))
                    if wl is not None:
                        edges.unary[s][lay].append(wl)
        elif ins and ((n.op in BINARY and len(n.output.shape) == 4) or (n.op == "concat" and n.attrs["axis"] == 1)):
            ref = n.inputs[followed_operand(n, used)] if n.op in BINARY else ins[0]
            for x in ins:
                if x is not ref:
                    edges.add(src.get(id(x)), src.get(id(ref)), x.shape)
            src[id(n.output)] = src.get(id(ref))
        else:
            for x in ins:
                edges.add(src.get(id(x)), None, x.shape)
            src[id(n.output)] = None
    for x in pre.outputs:
        if len(x.shape) == 4:
            edges.add(src.get(id(x)), None, x.shape)
    return carried
