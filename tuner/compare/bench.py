"""`tuner bench`: a compiled model against its peers on the same input, interleaved, per thread count.

Reports per thread count: median latency of each runner (tuner through `CompiledModel.run`, so
Python's one call per inference is included, as it is for ONNX Runtime's `run`), the ratio to ONNX
Runtime, the model's GFLOPS, the executor overhead (the whole model timed in C minus the sum of
its steps each timed alone in C), beside the steps timed in context (where they run in the whole
model: what they lose to cold caches) and the dispatch overhead (the share of a run spent outside
its steps, measured in the same runs; the other figures are taken minutes apart, so on a shared
machine they move with its speed), the arena size and compile time, and the
largest error against ONNX Runtime relative to the output's range.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from ..compiler import compile_model
from ..errors import UserError, check_output_path
from ..graph import load as load_graph
from ..graph.dynamic import load_at
from ..graph.ir import graph_digest
from ..runtime.model import META, load
from .peers import interleaved, onnxruntime_runner, paired_ratios, torch_runner

PEERS = ("onnxruntime", "torch")


def _model_for(model: str, threads: int, logs: list):
    """(CompiledModel, graph, ONNX path or None) for `model` (artifact dir, built-in name or .onnx)."""
    d = Path(model)
    if (d / META).is_file():
        m = load(d)
        if m.threads != threads:    # the thread count is compiled in: compile the same model again for this one
            given = m.meta["layout"] if m.meta.get("layout_given", True) else None    # else the default plan again
            m = compile_model(m.meta["model"], log=m.meta["logs"] or logs, threads=threads, layout=given,
                              dynamic=m.meta.get("dynamic"))
        source = m.meta["model"]
    else:
        m = compile_model(model, log=logs, threads=threads)
        source = model
    onnx_path = source if source.endswith(".onnx") else None
    # a dynamic model was compiled from the file imported at its bounds
    run_time = m.meta.get("run_time", [])    # what its compile computed at run time (graph.dynamic.load_range)
    if not (isinstance(run_time, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) for n in p)
                                               for p in run_time)):
        raise UserError(f"{model}: its meta's 'run_time' is not a list of pairs of names; compile the model again")
    graph = load_at(source, {s["name"]: s["shape"] for s in m.inputs}, frozenset(map(tuple, run_time))) \
        if m.symbols else load_graph(source)
    if graph_digest(graph) != m.meta["model_hash"]:
        raise UserError(f"{model} was compiled from another model than {source} now holds (graph "
                        f"{m.meta['model_hash']} against {graph_digest(graph)}): its peers would run another model; "
                        f"compile {source} again")
    return m, graph, onnx_path


def step_times(m, inputs, rounds: int = 5, runs: int = 20) -> tuple:
    """(whole model in C, [each step timed alone in C], [each step timed in context]) in seconds
    (medians), and the dispatch overhead (the share of a run spent outside its steps, measured in
    the same runs as the steps). Alone: one step repeated on warm data. In context: the model run
    whole, each step timed where it runs (CompiledModel.profile). Every round times the whole model,
    then each step alone, then a profile run, so that the three are compared over the same minutes
    of a shared machine whose speed drifts."""
    whole, alone, ctx, totals = [], [[] for _ in m.steps], [], []
    for _ in range(rounds):
        whole.append(m.time(inputs, -1, 1, 100.0)[0])
        for s, a in zip(m.steps, alone):
            a.append(m.time(inputs, s.index, 1, 10.0)[0])
        steps, tot = m.profile(inputs, max(1, runs // rounds))
        ctx.append(steps)
        totals.append(tot)
    steps, tot = np.concatenate(ctx), np.concatenate(totals)
    dispatch = float(np.median((tot - steps.sum(axis=1)) / tot))
    return (statistics.median(whole), [statistics.median(a) for a in alone],
            [float(v) for v in np.median(steps, axis=0)], dispatch)


def parse_shapes(text: str | None) -> list:
    """--shapes "input_ids=1x16,1x77;mask=1x16,1x77" -> [{"input_ids": [1, 16], ...}, ...]: each input's
    shapes in turn, every input giving as many."""
    if not text:
        return []
    per = {}
    for part in (p for p in text.split(";") if p.strip()):
        name, eq, shapes = part.strip().partition("=")
        try:
            per[name] = [[int(d) for d in s.split("x")] for s in shapes.split(",")]
        except ValueError:
            per[name] = None
        if not eq or not name or not per[name] or any(d < 1 for s in per[name] for d in s):
            raise UserError(f"cannot read --shapes {part!r}: expected NAME=1x16,1x77 (inputs joined by ;)")
    counts = {len(v) for v in per.values()}
    if len(counts) != 1:
        raise UserError(f"--shapes gives the inputs different numbers of shapes: {', '.join(per)}")
    return [{name: shapes[k] for name, shapes in per.items()} for k in range(counts.pop())]


def bench_shapes(m, shapes: list, threads: int, onnx_path: str | None, rounds: int, say) -> list:
    """Rows of a dynamic model timed at each of `shapes` beside ONNX Runtime on its dynamic file,
    interleaved: medians, the paired ratio and the largest error against ONNX Runtime."""
    if not m.symbols:
        raise UserError("--shapes times a model compiled for ranges of shapes (tuner compile --dynamic)")
    if onnx_path is None:
        raise UserError("--shapes compares with ONNX Runtime on the model's ONNX file, which this model has none of")
    rows, ort = [], onnxruntime_runner(None, threads, onnx_path)
    for k, shape in enumerate(shapes):
        inputs = m.random_inputs(seed=k, shapes=shape)
        ours, ref = m.run(*inputs), ort(inputs)
        err = max(float(np.abs(a - b).max() / (np.ptp(b) or 1.0)) for a, b in zip(ours, ref))
        times = interleaved({"tuner": lambda ins: m.run(*ins), "onnxruntime": ort}, inputs, rounds)
        med = {name: statistics.median(v) for name, v in times.items()}
        ratio = statistics.median(paired_ratios(times["tuner"], times["onnxruntime"]))
        rows.append({"threads": threads, "shapes": shape, "median_s": med, "vs_onnxruntime_paired": ratio,
                     "max_rel_error_vs_onnxruntime": err})
        label = "; ".join(f"{n}=" + "x".join(map(str, s)) for n, s in shape.items())
        say(f"{threads:>7} {label:<24} {med['tuner'] * 1e3:>10.2f} {med['onnxruntime'] * 1e3:>10.2f} {ratio:>7.3f}x  "
            f"(error {err:.1e})")
    return rows


def bench_model(model: str, threads: list | None = None, peers: list = PEERS, rounds: int = 5, logs: list = (),
                json_out: str | None = None, quiet: bool = False, shapes: list | None = None) -> dict:
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise UserError(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    if json_out:
        check_output_path(json_out, "--json")
    say = (lambda msg: None) if quiet else print
    if threads is None:
        d = Path(model)
        if not (d / META).is_file():
            raise UserError("give --threads (e.g. 1,2) when the model is not a compiled directory")
        threads = [load(d).threads]
    results = {"model": model, "rows": []}
    if shapes:
        say(f"{'threads':>7} {'shapes':<24} {'tuner ms':>10} {'ORT ms':>10} {'vs ORT':>8} (paired, interleaved)")
    for t in threads:
        m, graph, onnx_path = _model_for(model, t, list(logs))
        if shapes:
            results["rows"] += bench_shapes(m, shapes, t, onnx_path, rounds, say)
            continue
        inputs = m.random_inputs(seed=1)
        runners = {"tuner": lambda ins, m=m: m.run(*ins)}
        if "onnxruntime" in peers:
            runners["onnxruntime"] = onnxruntime_runner(graph, t, onnx_path)
        if "torch" in peers:
            runners["torch NCHW"] = torch_runner(graph, t, channels_last=False)
            runners["torch channels_last"] = torch_runner(graph, t, channels_last=True)
        err = None
        if "onnxruntime" in runners:
            ours, ref = m.run(*inputs), runners["onnxruntime"](inputs)
            err = max(float(np.abs(a - b).max() / (np.ptp(b) or 1.0)) for a, b in zip(ours, ref))
        times = interleaved(runners, inputs, rounds, progress=None if quiet else (lambda s: say(f"  {t} thread(s) {s}")))
        med = {k: statistics.median(v) for k, v in times.items()}
        if "torch NCHW" in med:
            best = min(("torch NCHW", "torch channels_last"), key=lambda k: med[k])
            med["torch"] = med[best]
            times["torch"] = times[best]
        whole, each, in_context, dispatch = step_times(m, inputs)
        parts = sum(each)
        slowest = sorted(zip(m.steps, each), key=lambda se: -se[1])[:8]
        gflop = sum(s.flops for s in m.steps) / 1e9
        paired = paired_ratios(times["tuner"], times["onnxruntime"]) if "onnxruntime" in times else []
        row = {"threads": t, "median_s": med, "rounds_s": times, "gflops": gflop / med["tuner"],
               "vs_onnxruntime_paired": {"median": statistics.median(paired), "min": min(paired),
                                         "max": max(paired)} if paired else None,
               "model_gflop": gflop, "c_whole_s": whole, "c_steps_sum_s": parts,
               "executor_overhead": (whole - parts) / whole, "c_steps_in_context_s": sum(in_context),
               "dispatch_overhead": dispatch, "arena_bytes": m.arena_bytes,
               "intermediate_bytes": m.meta["intermediate_bytes"], "compile_s": m.meta["compile_s"],
               "max_rel_error_vs_onnxruntime": err, "target": m.target,
               "slowest_steps": [{"index": st.index, "summary": st.summary, "workload": st.workload,
                                  "source": st.source, "seconds": sec, "in_context_s": in_context[st.index],
                                  "gflops": st.flops / sec / 1e9, "share": sec / parts} for st, sec in slowest]}
        results["rows"].append(row)
    if not shapes:
        say(format_table(results))
    if json_out:
        Path(json_out).write_text(json.dumps(results, indent=1))
        say(f"wrote {json_out}")
    return results


def format_table(results: dict) -> str:
    lines = [f"{'threads':>7} {'runner':<20} {'median ms':>10} {'vs ORT':>7} {'GFLOPS':>7}"]
    for row in results["rows"]:
        ort = row["median_s"].get("onnxruntime")
        for name, s in row["median_s"].items():
            if name in ("torch NCHW", "torch channels_last") and "torch" in row["median_s"]:
                continue
            ratio = f"{s / ort:.2f}x" if ort else "-"
            lines.append(f"{row['threads']:>7} {name:<20} {s * 1e3:>10.2f} {ratio:>7} {row['model_gflop'] / s:>7.1f}")
        err = row["max_rel_error_vs_onnxruntime"]
        pr = row.get("vs_onnxruntime_paired")
        if pr:
            lines.append(f"{'':>7} tuner / ORT round by round: median {pr['median']:.3f}x "
                         f"(rounds {pr['min']:.3f}-{pr['max']:.3f}x)")
        lines.append(f"{'':>7} executor overhead {100 * row['executor_overhead']:.2f}% "
                     f"(model in C {row['c_whole_s'] * 1e3:.2f} ms, steps alone {row['c_steps_sum_s'] * 1e3:.2f} ms, "
                     f"in context {row['c_steps_in_context_s'] * 1e3:.2f} ms; "
                     f"{100 * row['dispatch_overhead']:.2f}% of a run outside its steps); "
                     f"arena {row['arena_bytes'] / 2**20:.1f} MiB of {row['intermediate_bytes'] / 2**20:.1f} MiB; "
                     f"compiled in {row['compile_s']:.1f} s"
                     + (f"; max error vs ORT {err:.1e} of the output range" if err is not None else ""))
    return "\n".join(lines)
