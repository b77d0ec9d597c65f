"""Convs whose output channels the layout's block does not divide (a super-resolution model's 3, a
segmentation head's 150 classes, a squeeze-excitation's 12), compiled untuned as PadChannels pads
them and unpadded (each in the block fit_block gives it), timed interleaved with ONNX Runtime.

    python -m bench.pad_channels [--convs 64:3:3x3:112,64:150:1x1:56] [--threads 1,2] [--rounds 7]

Each conv is IN:K:RxS:SIZE (stride 1, same padding, a bias). Prints each one's medians, the
padded/unpadded paired ratio and each against ONNX Runtime; writes JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

import numpy as np

from bench.common import write_results
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios
from tuner.compiler.compile_model import compile_model
from tuner.graph import layout_plan
from tuner.graph.builder import GraphBuilder
from tuner.graph.passes import pad_channels
from tuner.te.layouts import block_of

CONVS = ("64:1:3x3:112,64:2:3x3:112,64:3:3x3:112,64:4:3x3:112,64:6:3x3:112,64:8:3x3:112,64:12:3x3:112,"
         "64:14:3x3:112,64:18:1x1:56,64:26:1x1:56,64:30:1x1:56,64:150:1x1:56")


@contextlib.contextmanager
def unpadded():
    """PadChannels leaves every conv its own channel count while this is open."""
    keep = pad_channels.padded_count
    pad_channels.padded_count = layout_plan.padded_count = lambda k, block: k
    try:
        yield
    finally:
        pad_channels.padded_count = layout_plan.padded_count = keep


def conv_graph(spec: str):
    c, k, rs, size = spec.split(":")
    c, k, r, size = int(c), int(k), int(rs.split("x")[0]), int(size)
    rng = np.random.default_rng(0)
    b = GraphBuilder(f"conv{c}_{k}_{rs}_{size}")
    x = b.input("x", (1, c, size, size), layout="NCHW")
    w = b.const((rng.standard_normal((k, c, r, r)) / np.sqrt(c * r * r)).astype(np.float32), "w")
    y = b.add("conv2d", [x, w], {"strides": [1, 1], "dilations": [1, 1], "groups": 1, "pads": [r // 2] * 4})
    y = b.add("add", [y, b.const(rng.standard_normal((1, k, 1, 1)).astype(np.float32), "bias")])
    return b.finish([y], {}), rng.standard_normal((1, c, size, size)).astype(np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convs", default=CONVS, help="IN:K:RxS:SIZE, comma-separated")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'conv':<18} {'thr':>3} {'K run':>6} {'padded ms':>10} {'unpadded':>9} {'ORT ms':>8} "
          f"{'pad/unpad':>9} {'pad/ORT':>8} {'unpad/ORT':>9}")
    for spec in args.convs.split(","):
        graph, x = conv_graph(spec)
        k = graph.nodes[0].inputs[1].shape[0]
        for threads in (int(t) for t in args.threads.split(",")):
            padded = compile_model(graph, threads=threads)
            with unpadded():
                plain = compile_model(graph, threads=threads)
            ort = onnxruntime_runner(graph, threads)
            want = ort([x])[0]
            for name, m in (("padded", padded), ("unpadded", plain)):
                err = float(np.abs(m.run(x)[0] - want).max())
                if err > 1e-4 * max(1.0, float(np.abs(want).max())):
                    raise SystemExit(f"{spec}: the {name} compile is off by {err:.2e} from ONNX Runtime")
            t = interleaved({"padded": lambda i: padded.run(*i), "unpadded": lambda i: plain.run(*i), "onnxruntime": ort},
                            [x], args.rounds)
            med = {n: statistics.median(v) * 1e3 for n, v in t.items()}
            ratio = {f"{a}/{b}": statistics.median(paired_ratios(t[a], t[b]))
                     for a, b in (("padded", "unpadded"), ("padded", "onnxruntime"), ("unpadded", "onnxruntime"))}
            k_run = pad_channels.padded_count(k, block_of(padded.meta["layout"]))
            rows.append({"conv": spec, "threads": threads, "k": k, "k_run": k_run, "target": padded.meta["target"],
                         "median_ms": med, "paired": ratio, "rounds_s": t})
            print(f"{spec:<18} {threads:>3} {k_run:>6} {med['padded']:>10.3f} {med['unpadded']:>9.3f} "
                  f"{med['onnxruntime']:>8.3f} {ratio['padded/unpadded']:>8.3f}x {ratio['padded/onnxruntime']:>7.3f}x "
                  f"{ratio['unpadded/onnxruntime']:>8.3f}x", flush=True)
    write_results("pad_channels", args.out, {"rounds": args.rounds, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
