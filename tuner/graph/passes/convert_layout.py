"""ConvertLayout: run anchor operators in a desired layout with as few transforms as possible.

Every activation value carries the layout its data is in. Walking the graph in order:
  * conv2d takes its layout from the plan (option `layout_plan`: {conv node name: layout},
    what the graph-level solver chose, see graph.layout_plan) or else the desired layout (NCHW,
    NHWC, NCHW8c, NCHW16c); its input is transformed if needed and its constant weight is
    re-laid out now, at compile time (no transform left on weights); a plan's `winograd<m>`
    turns a 3x3 stride-1 conv into the three Winograd nodes (ops.winograd) on NHWC activations,
    `winograd<m>@NCHW<x>c` on blocked ones, the weight transformed now;
  * layout-agnostic ops carry their input's layout through: elementwise ops, broadcast ops (whose
    constant operands are re-laid to match), pooling, batch_norm; a binary op takes the layout of
    its operand that a convolution's epilogue computes (`followed_operand`: so a residual add stays
    in that convolution's kernel, as the layout solver priced it), else of its first full-shape
    operand, and transforms the other to it; a channel concat takes its first input's layout;
  * a concat of inputs held in a smaller block than their layout's (120 channels in blocks of 8
    under NCHW16c) keeps that block, which only a conv of groups 1 reads as it is (ib=); a pooling
    runs in the layout that names it, and what reads its layout's own block (a grouped conv, a
    Winograd input, an elementwise op's other operands) gets the data re-laid to one block; a
    pooling of a 4-D value no layout names (a reshape's) runs in the desired blocked layout where
    its channels fill the blocks;
  * every other op (flatten, reshape, transpose, pad, softmax, mean, dense) and the graph outputs
    get NCHW back.
A transform of a value that is itself a transform back from the wanted layout is cancelled (the
inverse pair disappears), and transforming the same value twice reuses the first transform.
"""
from __future__ import annotations

from ...ops import BINARY, UNARY, kernel_layout, nchw_dims
from ...ops import winograd as WG
from ...te import layouts as L
from ..builder import GraphBuilder
from ..ir import Graph
from .base import register

AGNOSTIC_POOLS = ("max_pool2d", "avg_pool2d", "global_avg_pool2d", "batch_norm")


class _Converter:
    def __init__(self, b: GraphBuilder, desired: str):
        self.b = b
        self.desired = desired
        self.memo: dict = {}

    def to(self, x, dst: str, exact: bool = False):
        """`x` in layout `dst` (x must be a 4-D activation or constant); a 4-D activation without a
        layout (a reshape's or a transpose's output: channel shuffles, ConvNeXt's permutes) is NCHW.
        A blocked value held in a smaller block than its layout's (a concat's) is left so (a conv of
        groups 1 reads any block), unless `exact`: then it is re-laid to dst's own block."""
        lay = x.layout or ("NCHW" if len(x.shape) == 4 and not x.is_const else "")
        if exact and x.layout:
            lay = _data_layout(x)
        if not lay or lay == dst:
            return x
        if len(x.shape) == 5 and L.in_blocks_of(x.shape[4], dst, x.shape[1] * x.shape[4]):
            return x    # its data (in the block it has: a concat's may be smaller) is dst's: a copy would move nothing
        key = (id(x), dst)
        if key in self.memo:
            return self.memo[key]
        p = x.producer
        if p is not None and p.op == "layout_transform" and p.attrs["src"] == dst:
            out = p.inputs[0]                                   # inverse pair: cancel
        else:
            src = p.inputs[0] if p is not None and p.op == "layout_transform" else x   # A->B->C is A->C
            src_layout = _data_layout(src) if src.layout else lay     # the block its data is held in
            out = self.b.add("layout_transform", [src], {"src": src_layout, "dst": dst}, f"{x.name}_{dst}") \
                if src_layout != dst else src
        self.memo[key] = out
        return out

    def const_like(self, c, act):
        """Constant operand `c` of a broadcast against activation `act` (now in act.layout)."""
        lay = act.layout
        if not lay or lay == "NCHW" or len(act.shape) < 4:
            return c
        data = c.data
        if data.ndim > 4:
            return c
        full = data.reshape((1,) * (4 - data.ndim) + data.shape)
        ch = full.shape[1]
        blk = act.shape[4] if lay != "NHWC" else 0
        if blk and ch != 1 and ch % blk:
            return None                     # cannot follow the activation's channel blocks
        return self.b.const(L.act_from_nchw(full, lay, 1 if ch == 1 else blk or None), f"{c.name}_{lay}")


def _data_layout(x) -> str:
    """The layout x's data is in: its own, or for a blocked one held in a smaller block than its layout
    fits to its channels (a concat of inputs in smaller blocks: MixNet's 240 channels as 2 x 120, in
    blocks of 8 under NCHW16c), the layout of that block."""
    blk = len(x.shape) == 5 and x.shape[4]
    if blk and L.block_of(x.layout) and not L.in_blocks_of(blk, x.layout, x.shape[1] * blk):
        return f"NCHW{blk}c"
    return x.layout


def _held(x) -> str | None:
    """The layout that names how x's data is held (_data_layout), None where none fits x's channels
    to x's block (360 channels in blocks of 15: NCHW15c fits them to blocks of 8)."""
    lay = _data_layout(x)
    named = len(x.shape) != 5 or not L.block_of(lay) or L.in_blocks_of(x.shape[4], lay, x.shape[1] * x.shape[4])
    return lay if named else None


def uses(graph: Graph) -> dict:
    """id(value) -> how many nodes and graph outputs read it."""
    out: dict = {}
    for v in [v for n in graph.nodes for v in n.inputs] + list(graph.outputs):
        out[id(v)] = out.get(id(v), 0) + 1
    return out


def _fusable_epilogue(v, uses: dict) -> bool:
    """Whether `v` is a convolution's output, or the running result of an epilogue on one (through
    elementwise ops whose other operands are constants: bias adds, activations), read only along
    that chain, so that the op consuming `v` can join the convolution's fused group."""
    while uses.get(id(v), 0) == 1 and v.producer is not None:
        p = v.producer
        if p.op == "conv2d":
            return True
        running = [x for x in p.inputs if not x.is_const]
        if not (p.op in UNARY or p.op in BINARY) or len(running) != 1:
            return False
        v = running[0]
    return False


def followed_operand(node, uses: dict) -> int:
    """The input of a binary node (of an NCHW graph) whose layout the op runs in: an activation of
    the output's shape that a convolution's epilogue computes and nothing else reads (the op then
    fuses into that convolution's kernel under any plan, the other operand transformed to it), else
    the first activation of the output's shape, else the first activation. One rule for
    ConvertLayout and for the layout solver's pricing (layout_plan.model_layouts), so that a plan
    compiles to the tasks it was priced with: MobileNetV2 adds the skip first."""
    acts = [i for i, v in enumerate(node.inputs) if not v.is_const and len(v.shape) == 4] or \
        [i for i, v in enumerate(node.inputs) if not v.is_const]
    full = [i for i in acts if tuple(node.inputs[i].shape) == tuple(node.output.shape)] or acts[:1]
    return next((i for i in full if _fusable_epilogue(node.inputs[i], uses)), full[0])


def _conv_weight(b, w, lay: str, groups: int, in_block: int):
    """Constant OIHW weight `w` re-laid for a conv in `lay` whose blocked input arrives in blocks of
    `in_block` (ignored unblocked)."""
    if lay == "NCHW":
        return w
    data = w.data
    if lay == "NHWC":
        return b.const(L.conv_weight_from_oihw(data, lay), f"{w.name}_HWIO")
    k = data.shape[0]
    blk = L.block_of(lay)
    ob = L.fit_block(k, blk)
    ib = in_block if groups == 1 else min(ob, data.shape[1])   # grouped: its block or its group's width; depthwise: 1
    return b.const(L.conv_weight_from_oihw(data, lay, ib, ob), f"{w.name}_OIHW{ib}i{ob}o")


def fused_read(choice: str) -> tuple | None:
    """(input layout, output layout) of a plan value such as `NCHW16c>NCHW8c`: a direct conv (groups
    1) that reads its input in the first blocked layout and writes the second, the layout transform
    between them fused into its loads (its task: the conv in the second layout with ib=, the input's
    block); None for any other value."""
    src, sep, dst = choice.partition(">")
    if not sep:
        return None
    if not (L.block_of(src) and L.block_of(dst)) or src == dst:
        raise L.LayoutError(f"layout choice {choice!r}: a conv reading one layout and writing another takes two "
                            "different blocked layouts, input first (NCHW16c>NCHW8c)")
    return src, dst


def io_layouts(choice: str) -> tuple:
    """(the layout a conv running as `choice` reads its input in, the layout it writes)."""
    return fused_read(choice) or (WG.activation_layout(choice),) * 2


def check_choice(choice: str) -> None:
    """A layout plan's value: a conv's activation layout, a Winograd choice (ops.winograd.parse_choice)
    or a blocked layout read as another (fused_read), or a dense weight packing (OI, OI[x]o)."""
    if WG.parse_choice(choice) or fused_read(choice):
        return
    if L.is_dense_packing(choice):
        L.dense_block(choice)
        return
    try:
        L.check_activation_layout(choice)
    except L.LayoutError as e:
        raise L.LayoutError(f"{e} (a conv can also run as {' or '.join(WG.CHOICES)}, optionally @NCHW8c or "
                            "@NCHW16c: Winograd, 3x3 stride-1 only; or read one blocked layout and write another, "
                            "NCHW16c>NCHW8c; a dense takes a packing, OI or OI16o)") from None


def _plan_choice(n, plan: dict, desired: str) -> str:
    """Node n's value in the plan, refused (naming both) when it is not a kind of value n's operator takes."""
    choice = plan.get(n.name)
    if choice is None:
        if n.op == "conv2d" and L.block_of(desired) and not _blockable(n, desired):
            # a grouped conv whose group widths the block does not divide: the largest smaller block
            # that does (RegNet's group width 8 in NCHW8c), before NCHW
            b = L.block_of(desired) // 2
            while b >= 4 and not _blockable(n, f"NCHW{b}c"):
                b //= 2
            return f"NCHW{b}c" if b >= 4 else desired
        return desired
    if L.is_dense_packing(choice) != (n.op == "dense"):
        takes = "a weight packing (OI, OI16o)" if n.op == "dense" else "an activation layout or a Winograd choice"
        raise L.LayoutError(f"layout plan: {n.op} {n.name!r} cannot run as {choice}: it takes {takes}")
    return choice


def winograd_applies(n) -> bool:
    """Whether conv node `n` (OIHW weight) can run as a Winograd choice (ops.winograd.applies)."""
    a = n.attrs
    return WG.applies(n.inputs[1].shape[2:], a["strides"], a["dilations"], a.get("groups", 1), a["pads"])


def winograd_conv(node) -> str | None:
    """The conv a winograd_input or winograd_gemm node was made from (its name is the conv's plus
    the op), else None; winograd_output keeps the conv's own name."""
    return node.name.removesuffix(f"_{node.op}") if node.op in ("winograd_input", "winograd_gemm") else None


def _winograd(b, n, x, w, choice: str):
    """The three Winograd nodes of conv node `n` on input `x` (in the choice's activation layout)
    with constant OIHW weight `w`;
    the last one keeps the conv's name (the plan and the fused group are named after it)."""
    a = n.attrs
    if not winograd_applies(n):
        raise L.LayoutError(f"layout plan: conv {n.name!r} cannot run as {choice} (Winograd needs a 3x3 window, "
                            "stride 1, no dilation or groups, equal padding of at most 2)")
    m, lay = WG.parse_choice(choice)
    _, _, h, wd = nchw_dims(x.shape, x.layout)
    attrs = {"pad": a["pads"][0], "m": m, "H": h, "W": wd, "layout": lay}
    u = b.const(WG.weight_transform(w.data.transpose(2, 3, 1, 0), m).astype(w.data.dtype), f"{w.name}_{choice}")
    v = b.add("winograd_input", [x], dict(attrs), f"{n.name}_winograd_input")
    mm = b.add("winograd_gemm", [v, u], dict(attrs), f"{n.name}_winograd_gemm")
    return b.add("winograd_output", [mm], dict(attrs), n.name)


def convert(graph: Graph, desired: str, plan: dict | None = None) -> Graph:
    L.check_activation_layout(desired)
    plan = plan or {}
    for lay in set(plan.values()):
        check_choice(lay)
    b = GraphBuilder(graph.name)
    cv = _Converter(b, desired)
    used = uses(graph)
    mapping: dict = {}
    for v in graph.inputs:
        mapping[id(v)] = b.input(v.name, v.shape, v.dtype, v.layout or ("NCHW" if len(v.shape) == 4 else ""))
    for n in graph.nodes:
        ins = [mapping.get(id(v), v) for v in n.inputs]
        attrs = dict(n.attrs)
        acts = [v for v in ins if not v.is_const and v.layout]
        conv_lay = _plan_choice(n, plan, desired)
        if n.op == "conv2d" and ins[1].is_const and len(ins) == 2 and WG.parse_choice(conv_lay):
            out = _winograd(b, n, cv.to(ins[0], WG.activation_layout(conv_lay), exact=True), ins[1], conv_lay)
        elif n.op == "conv2d" and ins[1].is_const and len(ins) == 2 and \
                (fused_read(conv_lay) or (conv_lay != "NCHW" and _blockable(n, conv_lay))):
            src, lay = io_layouts(conv_lay)
            if src != lay and attrs["groups"] != 1:
                raise L.LayoutError(f"layout plan: conv {n.name!r} cannot run as {conv_lay}: only a conv with "
                                    "groups=1 reads its input in another block than it writes")
            # a blocked weight takes the input block the data arrives in: another layout's (fused_read)
            # or a concat's smaller one; a grouped conv's task reads its layout's own
            x = cv.to(ins[0], src, exact=attrs["groups"] != 1)
            w = _conv_weight(b, ins[1], lay, attrs["groups"], x.shape[4] if len(x.shape) == 5 else 0)
            attrs.update(layout=lay, kernel_layout=kernel_layout(lay))
            out = b.add("conv2d", [x, w], attrs, n.name)
        elif n.op in UNARY:
            out = b.add(n.op, ins, attrs, n.name)
        elif n.op in BINARY and acts and len(n.output.shape) == 4:
            ref = ins[followed_operand(n, used)]      # constants are re-laid to match it
            ref = ref if ref.layout else acts[0]
            # every operand in ref's block, else (no layout names it) in the block ref's layout fits
            new_ins = [v if v.is_const else cv.to(v, _held(ref) or ref.layout, exact=True) for v in ins]
            ref = next(v for v in new_ins if not v.is_const and v.layout)
            new_ins = [cv.const_like(v, ref) if v.is_const else v for v in new_ins]
            if any(v is None for v in new_ins):   # a constant that cannot follow: compute in NCHW
                new_ins = [v if v.is_const else cv.to(v, "NCHW") for v in ins]
            out = b.add(n.op, new_ins, attrs, n.name)
        elif n.op in AGNOSTIC_POOLS and (acts or _blocks_fill(n, ins[0], desired)):
            # its task reads its layout's block: the one its input is held in where a layout names it
            x, held = ins[0], _held(ins[0]) if ins[0].layout else ""
            if held is None:
                x, held = cv.to(x, x.layout, exact=True), x.layout
            elif not ins[0].layout and _blocks_fill(n, x, desired):
                x, held = cv.to(x, desired), desired    # a reshape's images (a clip's frames): pooled in blocks
            attrs["layout"] = held
            out = b.add(n.op, [x] + ins[1:], attrs, n.name)
        elif n.op == "resize" and acts and not ins[0].is_const and set(attrs["axes"]) <= {2, 3} and \
                ins[0].layout != "NHWC":         # H and W are axes 2 and 3 of NCHW and of NCHW[x]c alike
            out = b.add(n.op, ins, attrs, n.name)
        elif n.op == "concat" and acts and len(acts) == len(ins) and attrs["axis"] == 1 and _joinable(acts):
            lay = acts[0].layout
            vals = [cv.to(v, lay) for v in ins]
            attrs["axis"] = 3 if lay == "NHWC" else 1
            out = b.add("concat", vals, attrs, n.name)
        else:
            # layout-sensitive or unknown: give it NCHW, as the original graph had
            vals = [cv.to(v, "NCHW") for v in ins]
            if n.op in ("conv2d",) + AGNOSTIC_POOLS:
                attrs["layout"] = "NCHW"
            if n.op == "dense" and n.name in plan:
                attrs["packing"] = conv_lay
            out = b.add(n.op, vals, attrs, n.name)
        mapping[id(n.output)] = out
    outputs = [cv.to(mapping.get(id(v), v), "NCHW") for v in graph.outputs]
    return b.finish(outputs, graph.meta)


def _blockable(n, desired: str) -> bool:
    """Blocked layouts support groups == 1, depthwise convs, and groups whose widths the block
    divides; others stay in NCHW."""
    if not L.block_of(desired) or n.attrs["groups"] == 1:
        return True
    x = n.inputs[0]
    c = nchw_dims(x.shape, x.layout or "NCHW")[1]
    k = n.inputs[1].shape[0]          # weights are OIHW before conversion
    g = n.attrs["groups"]
    return g == c == k or bool(L.grouped_block(c, k, g, L.block_of(desired)))


def _blocks_fill(n, x, desired: str) -> bool:
    """Whether a pooling of a 4-D activation no layout names (a reshape's) may run in the desired
    blocked layout: its channels fill whole blocks."""
    block = L.block_of(desired)
    return n.op != "batch_norm" and not x.is_const and not x.layout and len(x.shape) == 4 and block > 0 \
        and x.shape[1] % block == 0


def _joinable(acts) -> bool:
    """Whether a channel concat can run in its first input's layout, the others transformed to it:
    always for NCHW and NHWC; for NCHW[x]c when the first input's block is x itself (not a smaller
    fitted one) and every other input has that layout with the same block or channels that x divides."""
    lay = acts[0].layout
    blk = L.block_of(lay)
    if not blk:
        return True
    if acts[0].shape[4] != blk:
        return all(v.layout == lay and v.shape[4] == acts[0].shape[4] for v in acts)
    return all(v.shape[4] == blk if v.layout == lay else nchw_dims(v.shape, v.layout)[1] % blk == 0 for v in acts)


def data_path_transforms(graph: Graph) -> int:
    """Layout transforms left on activations (transforms of constants are folded away)."""
    return sum(1 for n in graph.nodes if n.op == "layout_transform" and not n.inputs[0].is_const)


@register("ConvertLayout", 3, required=("InferType",))
def convert_layout(graph: Graph, ctx) -> Graph:
    """Run convolutions in the layouts of ctx.options['layout_plan'] (else ctx.options['layout']),
    carry them through agnostic ops, cancel inverse pairs."""
    desired = ctx.options.get("layout") or "NCHW"
    plan = ctx.options.get("layout_plan") or {}
    if desired == "NCHW" and all(v == "NCHW" for v in plan.values()):   # (a dense packing is not NCHW)
        return graph
    return convert(graph, desired, plan)
