"""ONNX LSTM and GRU (CRNN text recognisers, speech and time-series models) unrolled over their
fixed sequence: the input's projection for every step is one dense over all steps' rows, each step
adds its hidden state's dense and runs the gates as elementwise ops, and the steps' hidden states
are concatenated. Default activations only (sigmoid and tanh), no clip, every sequence full."""
from __future__ import annotations

import numpy as np

from .shape import _slice_nodes

GATES = {"LSTM": 4, "GRU": 3}
MAX_STEPS = 4096     # steps of one node unrolled (about 15 graph nodes each, per direction)


def _checked(cx, ins, a, op: str):
    """(x as [seq, batch, input], W, R, B as float arrays, directions, hidden size), the attributes
    tuner does not compute refused by name."""
    if len(ins) < 3 or ins[1] is None or ins[2] is None:
        raise cx.fail("needs its inputs X, W and R")
    x = ins[0]
    if len(x.shape) != 3:
        raise cx.fail(f"the input must be 3-D (sequence, batch, features), got shape {list(x.shape)}")
    w, r = (np.asarray(cx.const(v, what), np.float32) for v, what in ((ins[1], "W"), (ins[2], "R")))
    dirs = {"forward": 1, "reverse": 1, "bidirectional": 2}.get(a.get("direction", "forward"))
    hidden = a.get("hidden_size", r.shape[-1] if r.ndim == 3 else 0)
    g = GATES[op]
    if dirs is None or w.ndim != 3 or r.ndim != 3 or w.shape[0] != dirs or w.shape[1] != g * hidden or \
            r.shape != (dirs, g * hidden, hidden):
        raise cx.fail(f"W {list(w.shape)} and R {list(r.shape)} do not fit direction={a.get('direction', 'forward')!r} "
                      f"and hidden_size={hidden}")
    acts = [s.lower() for s in a.get("activations", [])]
    want = ["sigmoid", "tanh", "tanh"][:g - 1 if op == "GRU" else 3] * dirs
    if acts and acts != want:
        raise cx.fail(f"activations {a['activations']} are not supported (the defaults, Sigmoid and Tanh, are)")
    if "clip" in a or a.get("input_forget", 0):
        raise cx.fail("clip and input_forget are not supported")
    if len(ins) > 4 and ins[4] is not None:
        lens = np.asarray(cx.const(ins[4], "sequence_lens")).reshape(-1)
        seq = x.shape[1] if a.get("layout", 0) else x.shape[0]
        if not (lens == seq).all():
            raise cx.fail(f"sequence_lens {lens.tolist()} are not all the sequence's {seq}; tuner runs full sequences")
    if a.get("layout", 0):
        x = cx.add("transpose", [x], {"perm": [1, 0, 2]}, "_steps_first")
    if x.shape[0] * dirs > MAX_STEPS:
        raise cx.fail(f"{x.shape[0]} steps in {dirs} direction(s) unroll past the {MAX_STEPS} steps tuner unrolls; "
                      "give a shorter sequence with --input-shape")
    if x.shape[2] != w.shape[2]:
        raise cx.fail(f"W {list(w.shape)} does not fit the input's {x.shape[2]} features")
    b = np.asarray(cx.const(ins[3], "B"), np.float32) if len(ins) > 3 and ins[3] is not None \
        else np.zeros((dirs, 2 * g * hidden), np.float32)
    if b.shape != (dirs, 2 * g * hidden):
        raise cx.fail(f"B {list(b.shape)} does not fit {dirs} direction(s) of {2 * g * hidden}")
    return x, w, r, b, dirs, hidden


def _initial(cx, ins, k: int, d: int, batch: int, hidden: int, what: str, layout: int):
    """The initial hidden (k=5) or cell (k=6) state of direction d; None where absent or zeros."""
    if len(ins) <= k or ins[k] is None or (ins[k].is_const and not np.asarray(ins[k].data).any()):
        return None
    v, dirs = ins[k], ins[1].shape[0]
    want = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    if tuple(v.shape) != want:
        raise cx.fail(f"{what} has shape {list(v.shape)}, not {list(want)}")
    if layout:
        v = cx.add("transpose", [v], {"perm": [1, 0, 2]}, f"_{what}{d}_directions_first")
    s = _slice_nodes(cx, v, 0, [(d, d + 1, 1)], f"_{what}{d}")[0]
    return cx.add("reshape", [s], {"shape": [batch, hidden]}, f"_{what}{d}_2d")


def _cols(cx, v, start: int, n: int, tag: str):
    return _slice_nodes(cx, v, 1, [(start, start + n, 1)], tag)[0]


def _lstm_step(cx, xt, h, c, r_w, hid: int, s: str):
    """One LSTM step: gates i, o, f, c from the input's projection plus the hidden state's."""
    z = cx.add("add", [xt, cx.add("dense", [h, r_w], {}, f"_h_proj{s}")], {}, f"_gates{s}") if h is not None else xt
    i, o, f, cand = _slice_nodes(cx, z, 1, [(k * hid, (k + 1) * hid, 1) for k in range(4)], f"_iofc{s}")
    i, o, f = (cx.add("sigmoid", [v], {}, f"_{n}_act{s}") for v, n in ((i, "i"), (o, "o"), (f, "f")))
    ic = cx.add("mul", [i, cx.add("tanh", [cand], {}, f"_c_act{s}")], {}, f"_ic{s}")
    c = cx.add("add", [cx.add("mul", [f, c], {}, f"_fc{s}"), ic], {}, f"_c{s}") if c is not None else ic
    return cx.add("mul", [o, cx.add("tanh", [c], {}, f"_c_tanh{s}")], {}, f"_h{s}"), c


def _gru_step(cx, xt, h, r_zr, r_n, rbn, hid: int, before_reset: bool, s: str):
    """One GRU step: z and r from the input's projection plus the hidden state's; the candidate n
    reads r * h through R's last third (or, linear_before_reset, r times h's projection); h is
    n + z (h_prev - n)."""
    zr = _cols(cx, xt, 0, 2 * hid, f"_zr_x{s}")
    if h is not None:
        zr = cx.add("add", [zr, cx.add("dense", [h, r_zr], {}, f"_zr_h{s}")], {}, f"_zr{s}")
    zr = cx.add("sigmoid", [zr], {}, f"_zr_act{s}")
    z, r = _slice_nodes(cx, zr, 1, [(0, hid, 1), (hid, 2 * hid, 1)], f"_zr_parts{s}")
    if before_reset:
        hn = rbn if h is None else cx.add("add", [cx.add("dense", [h, r_n], {}, f"_n_h{s}"), rbn], {}, f"_n_hb{s}")
        reset = cx.add("mul", [r, hn], {}, f"_rn{s}")
    else:
        reset = rbn if h is None else cx.add("add", [cx.add("dense", [cx.add("mul", [r, h], {}, f"_rh{s}"), r_n], {},
                                                            f"_rh_proj{s}"), rbn], {}, f"_rh_b{s}")
    n = cx.add("tanh", [cx.add("add", [_cols(cx, xt, 2 * hid, hid, f"_n_x{s}"), reset], {}, f"_n{s}")], {}, f"_n_act{s}")
    if h is None:
        return cx.add("sub", [n, cx.add("mul", [z, n], {}, f"_zn{s}")], {}, f"_h{s}")
    return cx.add("add", [n, cx.add("mul", [z, cx.add("sub", [h, n], {}, f"_hn{s}")], {}, f"_zhn{s}")], {}, f"_h{s}")


def _unrolled(cx, ins, a, op: str) -> list:
    x, w, r, b, dirs, hid = _checked(cx, ins, a, op)
    seq, batch, feat = x.shape
    g = GATES[op]
    before_reset = bool(a.get("linear_before_reset", 0))
    rows = cx.add("reshape", [x], {"shape": [seq * batch, feat]}, "_rows")
    reverse = a.get("direction", "forward") == "reverse"
    ys, hs, cs = [], [], []
    for d in range(dirs):
        tag = f"_d{d}"
        wb, rb = b[d, :g * hid], b[d, g * hid:]
        # every step's input projection at once, with the biases that add to it (not GRU's candidate's R bias)
        in_bias = wb + rb if op == "LSTM" else np.concatenate([wb[:2 * hid] + rb[:2 * hid], wb[2 * hid:]])
        xw = cx.add("add", [cx.add("dense", [rows, cx.constant(w[d], f"_W{tag}")], {}, f"_x_proj{tag}"),
                            cx.constant(in_bias, f"_xb{tag}")], {}, f"_x_proj_b{tag}")
        if op == "LSTM":
            r_w = cx.constant(r[d], f"_R{tag}")
        else:
            r_zr = cx.constant(r[d, :2 * hid], f"_R{tag}")
            r_n = cx.constant(r[d, 2 * hid:], f"_Rn{tag}")
            rbn = cx.constant(rb[2 * hid:], f"_Rbn{tag}")
        h = _initial(cx, ins, 5, d, batch, hid, "initial_h", a.get("layout", 0))
        c = _initial(cx, ins, 6, d, batch, hid, "initial_c", a.get("layout", 0)) if op == "LSTM" else None
        out = [None] * seq
        for t in (range(seq - 1, -1, -1) if (d == 1 or reverse) else range(seq)):
            s = f"{tag}_t{t}"
            xt = _slice_nodes(cx, xw, 0, [(t * batch, (t + 1) * batch, 1)], f"_x{s}")[0]
            if op == "LSTM":
                h, c = _lstm_step(cx, xt, h, c, r_w, hid, s)
            else:
                h = _gru_step(cx, xt, h, r_zr, r_n, rbn, hid, before_reset, s)
            out[t] = h
        ys.append([cx.add("reshape", [v], {"shape": [1, 1, batch, hid]}, f"_y{tag}_t{t}") for t, v in enumerate(out)])
        hs.append(cx.add("reshape", [h], {"shape": [1, batch, hid]}, f"_h_last{tag}"))
        if c is not None:
            cs.append(cx.add("reshape", [c], {"shape": [1, batch, hid]}, f"_c_last{tag}"))
    steps_y = [cx.add("concat", [ys[d][t] for d in range(dirs)], {"axis": 1}, f"_y_t{t}") if dirs > 1 else ys[0][t]
               for t in range(seq)]
    y = cx.add("concat", steps_y, {"axis": 0}, "_Y") if seq > 1 else steps_y[0]
    outs = [y, cx.add("concat", hs, {"axis": 0}, "_Y_h") if dirs > 1 else hs[0]]
    if op == "LSTM":
        outs.append(cx.add("concat", cs, {"axis": 0}, "_Y_c") if dirs > 1 else cs[0])
    if a.get("layout", 0):
        outs = [cx.add("transpose", [outs[0]], {"perm": [2, 0, 1, 3]}, "_Y_batch_first")] + \
            [cx.add("transpose", [v], {"perm": [1, 0, 2]}, f"_out{k}_batch_first") for k, v in enumerate(outs[1:])]
    return outs


def onnx_lstm(cx, ins, a):
    if len(ins) > 7 and ins[7] is not None:
        raise cx.fail("peepholes (P) are not supported")
    return _unrolled(cx, ins, a, "LSTM")


def onnx_gru(cx, ins, a):
    return _unrolled(cx, ins, a, "GRU")
