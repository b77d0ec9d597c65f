"""Where a compiled model loses to ONNX Runtime: its steps' times beside ONNX Runtime's nodes', per conv.

    python -m bench.node_profile build/r50 [--model resnet50] [--rounds 5] [--runs 10]

The artifact (`tuner compile -o DIR`) runs whole `--runs` times with every step timed where it runs
(CompiledModel.profile), then ONNX Runtime (all graph optimisations, the artifact's thread count,
its profiler on) as many times, round by round. Steps and nodes are matched per convolution by
shape (input channels and size, output channels, kernel, output size): a conv's Winograd
transforms and GEMM count as that conv, ONNX Runtime's fused Conv (with its bias, activation and
sum) as one node. Other steps and nodes are listed by kind. Prints a table, heaviest first, of
both times, their ratio and difference; writes JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import tempfile
import time

import numpy as np

from bench.common import write_results
from tuner.graph import load as load_graph
from tuner.graph.onnx_frontend import to_onnx
from tuner.measure.interleave import SETTLE_S
from tuner.ops.common import conv_out_size, pads4
from tuner.ops.workload import parse_spec
from tuner.runtime import load

WINOGRAD_STEP = re.compile(r"_winograd_(input|gemm)$")


def conv_key(c: int, h: int, w: int, k: int, r: int, s: int, oh: int, ow: int) -> str:
    return f"conv {c}x{h}x{w} -> {k}x{oh}x{ow}, {r}x{s}"


def step_keys(steps) -> list:
    """Each step's row: its conv's shape (Winograd transforms and GEMM by the conv's node name), else its op."""
    convs = {}
    for st in steps:
        op = st.workload.split(" ")[0].partition(":")[0]
        if op in ("conv2d", "winograd_gemm"):
            spec, _, layout = st.workload.partition(" [")
            p = parse_spec(spec, layout.rstrip("]")).p
            r, s, stride, dil = p.get("R", 3), p.get("S", 3), p.get("stride", 1), p.get("dilation", 1)
            top, left, bottom, right = pads4(p["pad"])
            oh = conv_out_size(p["H"], r, stride, top, bottom, dil)
            ow = conv_out_size(p["W"], s, stride, left, right, dil)
            convs[WINOGRAD_STEP.sub("", st.node)] = conv_key(p["C"], p["H"], p["W"], p["K"], r, s, oh, ow)
    return [convs.get(WINOGRAD_STEP.sub("", st.node)) or st.workload.split(" ")[0].partition(":")[0] for st in steps]


def node_key(args: dict) -> str:
    if args["op_name"] == "Conv":
        # a 1-D conv runs as a 2-D one over one row
        x, w, y = (s[:2] + [1] * (4 - len(s)) + s[2:] for s in (args["input_type_shape"][0]["float"],
                                                                args["input_type_shape"][1]["float"],
                                                                args["output_type_shape"][0]["float"]))
        return conv_key(x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3])
    return "onnxruntime " + args["op_name"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("--model", help="the artifact's model: a built-in name or an ONNX file (default: as compiled)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10, help="whole runs of each per round")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import onnxruntime as ort
    art = load(args.artifact)
    model = args.model or art.meta["model"]
    path = model if model.endswith(".onnx") else None
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = art.threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(path or to_onnx(load_graph(model)).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    x = art.random_inputs()
    feed = dict(zip([i.name for i in sess.get_inputs()], x))
    ours, whole, theirs = [], [], []
    for r in range(args.rounds):
        time.sleep(SETTLE_S)
        steps, runs = art.profile(x, runs=args.runs)
        ours.append(steps)
        whole += list(runs)
        time.sleep(SETTLE_S)
        for _ in range(args.runs):
            t = time.perf_counter()
            sess.run(None, feed)
            theirs.append(time.perf_counter() - t)
        print(f"round {r + 1}/{args.rounds}: tuner {np.median(runs) * 1e3:.2f} ms, "
              f"onnxruntime {np.median(theirs[-args.runs:]) * 1e3:.2f} ms", flush=True)
    prof = sess.end_profiling()
    with open(prof) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    os.unlink(prof)
    n_ort = len(theirs)
    rows = collections.defaultdict(lambda: {"tuner_ms": 0.0, "onnxruntime_ms": 0.0, "steps": 0, "nodes": 0})
    for key, t in zip(step_keys(art.steps), np.median(np.concatenate(ours), 0)):
        rows[key]["tuner_ms"] += t * 1e3
        rows[key]["steps"] += 1
    for e in events:
        row = rows[node_key(e["args"])]
        row["onnxruntime_ms"] += e["dur"] * 1e-3 / n_ort
        row["nodes"] += 1
    for row in rows.values():
        row["nodes"] = round(row["nodes"] / n_ort)
    order = sorted(rows, key=lambda k: -max(rows[k]["tuner_ms"], rows[k]["onnxruntime_ms"]))
    print(f"\n{model} at {art.threads} thread(s): tuner {statistics.median(whole) * 1e3:.2f} ms whole, ONNX Runtime "
          f"{statistics.median(theirs) * 1e3:.2f} ms ({args.rounds} rounds of {args.runs} runs each)")
    print(f"{'':46} {'tuner ms':>9} {'ORT ms':>8} {'ratio':>6} {'diff ms':>8}  steps nodes")
    for k in order:
        v = rows[k]
        ratio = v["tuner_ms"] / v["onnxruntime_ms"] if v["onnxruntime_ms"] else float("nan")
        print(f"{k[:46]:46} {v['tuner_ms']:9.3f} {v['onnxruntime_ms']:8.3f} {ratio:6.2f} "
              f"{v['tuner_ms'] - v['onnxruntime_ms']:8.3f}  {v['steps']:5} {v['nodes']:5}")
    write_results("node_profile", args.out, {
        "model": model, "artifact": args.artifact, "threads": art.threads, "rounds": args.rounds, "runs": args.runs,
        "tuner_ms": statistics.median(whole) * 1e3, "onnxruntime_ms": statistics.median(theirs) * 1e3,
        "rows": {k: rows[k] for k in order}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
