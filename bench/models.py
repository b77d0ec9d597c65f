"""Whole models: tuner's compiled ResNet-18, ResNet-50 and MobileNetV2 against ONNX Runtime and PyTorch.

    python -m bench.models [--models resnet50,resnet18,mobilenet_v2] [--threads 1,2] [--rounds 7]

Each model (batch 1, 224x224) is compiled with the shipped schedules (tuner/schedules/, plus --log),
then timed in one run, interleaved round by round, at each thread count: the compiled model
(`CompiledModel.run`), ONNX Runtime (default CPU provider, all graph optimisations, the same
thread count) and PyTorch eager (best of NCHW and channels_last). Prints latency medians,
ratios (of medians, and the median of each round's paired ratio), GFLOPS and fraction of this
machine's FP32 peak, executor overhead (the model timed in C
minus its steps each timed alone) and the part of it spent outside any step (the model minus its
steps timed in context: dispatch), arena bytes, compile time, and the steps that take the time
(alone and in context); writes JSON under bench/results/.

With --tune N[,M...] it measures whole-model tuning instead (issue 13's figures): each model is
tuned from an empty log with `tune_model` at 1 thread (--threads T: at T, its logs *.tT.N.jsonl, every
peer at T too), N trials, once over its default conv
choices (the joint layout plan: NCHW8c, NCHW16c, winograd2, winograd4; --joint names others) and
once per --single layout (NCHW16c; a list, e.g. NCHW8c,NCHW16c) alone under the same budget; --joint
given twice or more tunes each of its sets (joint1, joint2, ... in the table), so that choice sets
are compared in one timed run. --weights cold,warm tunes each set both ways (weights evicted
before every timed call, the default, or kept warm; "... warm" in the table, logs *.warm.N.jsonl);
a warm tune whose cold prices (model_tuning.cold_prices) give another plan has that plan compiled
and timed too ("... warm cold-priced"). Each result is compiled from its own log only
(no shipped schedules), and all of them are timed in one
interleaved run beside ONNX Runtime and PyTorch. Prints per model and budget: wall-clock tuning
time, the estimate, the measured latency, the gap between them, the ratio to ONNX Runtime (paired
per round, and of medians) and to PyTorch, the joint plan against the fastest single layout
(paired, against the single layout with the lowest median), and the layout solver's run time.
Logs go to logs/bench/tune/ (--resume keeps them; the tuning time of a log resumed with nothing
left to tune is its records' own, from their timestamps). --untuned times the compile with no log
(default schedules) in the same run; a tune whose last check kept the untuned compile
(model_tuning.untuned_check) is compiled without its log, "untuned_kept" in the JSON. Every variant also
gets GFLOPS, its fraction of the FP32 peak
(the FMA microbenchmark timed in each round beside the models, paired round by round) and its
time split by kernel kind (GEMMs, attention, LayerNorm/softmax, the rest; each step timed
in context). Transformers (issue 35's figures):

    python -m bench.models --tune 3000 --models bert_base,vit_b16,gpt2 --single "" --untuned

PyTorch there runs the same graph op by op in eager mode.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import write_results
from tuner.analysis.model_report import tuning_seconds
from tuner.compare.bench import bench_model
from tuner.compare.peers import interleaved, onnxruntime_runner, paired_ratios, torch_runner
from tuner.compiler import compile_model
from tuner.database import records
from tuner.database.result import WEIGHTS
from tuner.graph import load as load_graph
from tuner.measure.peak import fraction_of_peak, peak_gflops, peak_runner
from tuner.model_tuning import tune_model
from tuner.target import parse_target
from tuner.te.layouts import CONV_LAYOUTS, DEFAULT_CHOICES


PEAK = "FP32 peak"      # the FMA microbenchmark's runner among the models'

KINDS = (("GEMMs", ("dense", "conv2d")), ("attention", ("batch_matmul",)),
         ("LayerNorm/softmax", ("layer_norm", "softmax")))     # first match of a step's ops; else "the rest"


def kind_split(m, runs: int = 5) -> dict:
    """Seconds of a run by kernel kind (KINDS), each step timed in context (CompiledModel.profile)."""
    per_step, _ = m.profile(runs=runs)
    split = dict.fromkeys([k for k, _ in KINDS] + ["the rest"], 0.0)
    for st, sec in zip(m.steps, np.median(per_step, axis=0)):
        ops = [st.workload.split(":")[0]] if st.workload and ":" in st.workload else st.summary.split(" + ")
        split[next((k for k, names in KINDS if any(o in names for o in ops)), "the rest")] += sec
    return split


def tune_figures(args) -> int:
    """Tune each model from empty logs (joint plan and --single layout), then time every result in one run,
    all at one thread count: --threads when it names one, else 1 (logs of another count are kept apart)."""
    missing = [m for m in ("onnxruntime", "torch") if importlib.util.find_spec(m) is None]
    if missing:                 # before minutes of tuning, not after
        raise SystemExit(f"the peers need {' and '.join(missing)}: pip install {' '.join(missing)} (or the [bench] extra)")
    counts = [int(n) for n in args.tune.split(",")]
    tt = int(args.threads) if args.threads.strip().isdigit() else 1
    at = "" if tt == 1 else f".t{tt}"
    singles = [s.strip() for s in args.single.split(",") if s.strip()]
    joint_sets = [tuple(x.strip() for x in j.split(",") if x.strip()) for j in args.joint or [",".join(DEFAULT_CHOICES)]]
    joints = {("joint" if len(joint_sets) == 1 else f"joint{i + 1}"): lays for i, lays in enumerate(joint_sets)}
    log_name = lambda lays: "joint" if lays == tuple(CONV_LAYOUTS) else "joint-" + ",".join(lays)  # noqa: E731
    modes = [w.strip() for w in args.weights.split(",") if w.strip()]
    if not modes or any(w not in WEIGHTS for w in modes):
        raise SystemExit(f"--weights {args.weights!r}: give {' or '.join(WEIGHTS)}, or both comma-separated")
    out = {"threads": tt, "single": singles, "joint": joints, "weights": modes, "models": {}}
    for kind, lays in joints.items():
        print(f"{kind}: {','.join(lays)}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        graph = load_graph(name)
        variants, runners = [], {}
        for n, weights, (kind, layouts) in ((n, w, k) for n in counts for w in modes
                                            for k in list(joints.items()) + [(s, (s,)) for s in singles]):
            how = "" if weights == WEIGHTS[0] else f".{weights}"
            log = Path(f"logs/bench/tune/{name}.{log_name(layouts) if kind in joints else kind}{how}{at}.{n}.jsonl")
            tag = kind if len(modes) == 1 else f"{kind} {weights}"
            if not args.resume:
                log.unlink(missing_ok=True)
            print(f"\n== {name}: {kind} ({', '.join(layouts)}), {n} trials -> {log}", flush=True)
            t0 = time.perf_counter()
            res = tune_model(name, trials=n, log=str(log), threads=tt, layouts=layouts, progress=not args.quiet,
                             weights=weights)
            wall = time.perf_counter() - t0
            if args.resume and not res.session.new:   # nothing left: the log's own tuning time
                wall = (tuning_seconds(records.load(str(log)).records) or [wall])[-1]
            if res.session.interrupted:      # Ctrl-C / SIGTERM ends the bench, not only this tune
                print(f"{res.session.stopped_by}: stopped; the log keeps what was measured (--resume goes on)")
                return 143 if res.session.stopped_by == "SIGTERM" else 130
            print(res.table(), flush=True)
            m = compile_model(name, log=str(log), threads=tt, use_shipped=False)
            label = f"tuner {tag} {n}"
            runners[label] = lambda ins, m=m: m.run(*ins)
            if res.other_plan is not None and res.plan is not None and res.other_plan.layouts != res.plan.layouts:
                other = " cold-priced"      # a warm tune's plan under its cold prices: model_tuning
                wm = compile_model(name, log=str(log), threads=tt, use_shipped=False,
                                   layout_plan=res.other_plan.layouts)
                runners[label + other] = lambda ins, m=wm: m.run(*ins)
                variants.append({"label": label + other, "kind": tag + other, "layouts": layouts, "weights": weights,
                                 "trials": n, "log": str(log), "tuning_s": wall, "session_s": res.session.seconds,
                                 "estimate_s": res.other_estimate_s, "tasks": len(res.session.tasks),
                                 "solver_s": None, "solver_exact": res.other_plan.exact,
                                 "plan": dict(res.other_plan.layouts), "model": wm})
            variants.append({"label": label, "kind": tag, "set": kind, "weights": weights, "layouts": layouts,
                             "trials": n, "log": str(log),
                             "tuning_s": wall,
                             "session_s": res.session.seconds, "estimate_s": res.estimate_s,
                             "tasks": len(res.session.tasks), "solver_s": res.plan.seconds if res.plan else None,
                             "solver_exact": res.plan.exact if res.plan else None,
                             "plan": dict(res.plan.layouts) if res.plan else None, "model": m,
                             "untuned_kept": bool(res.record is not None and res.record.untuned)})
        if args.untuned:            # the default schedules, what a user gets before tuning
            um = compile_model(name, threads=tt, use_shipped=False)
            runners["tuner untuned"] = lambda ins, m=um: m.run(*ins)
            variants.append({"label": "tuner untuned", "kind": "untuned", "weights": None, "layouts": (), "trials": 0,
                             "log": None, "tuning_s": 0.0, "session_s": 0.0, "estimate_s": None,
                             "tasks": 0, "solver_s": None, "solver_exact": None, "plan": None, "model": um})
        runners["onnxruntime"] = onnxruntime_runner(graph, tt)
        runners["torch NCHW"] = torch_runner(graph, tt, channels_last=False)
        if any(len(v.shape) == 4 for v in graph.inputs):
            runners["torch channels_last"] = torch_runner(graph, tt, channels_last=True)
        # the FMA peak timed in each round too: on a shared host it moves with the model's speed,
        # and each round's GFLOPS over that round's peak is the fraction of what the core gave then
        runners[PEAK], peak_flop = peak_runner(parse_target("cpu", tt), tt)
        inputs = variants[0]["model"].random_inputs(seed=1)
        times = interleaved(runners, inputs, args.rounds, progress=lambda s: print(f"  {s}", flush=True))
        med = {k: statistics.median(v) for k, v in times.items()}
        torch_key = min((k for k in runners if k.startswith("torch")), key=lambda k: med[k])
        peak = peak_flop / 1e9 / med[PEAK]
        gflop = sum(st.flops for st in variants[0]["model"].steps) / 1e9
        for v in variants:
            t = times[v["label"]]
            v["measured_s"] = med[v["label"]]
            v["gflops"] = gflop / v["measured_s"]
            v["fraction_of_peak"] = fraction_of_peak(gflop, t, [peak_flop / 1e9 / p for p in times[PEAK]])
            v["split_s"] = kind_split(v["model"])
            v["vs_onnxruntime_paired"] = statistics.median(paired_ratios(t, times["onnxruntime"]))
            v["vs_onnxruntime"] = med[v["label"]] / med["onnxruntime"]
            v["vs_torch"] = med[v["label"]] / med[torch_key]
            v["estimate_gap"] = med[v["label"]] / v["estimate_s"] - 1 if v["estimate_s"] else None
            del v["model"]
        for n, weights in ((n, w) for n in counts for w in modes):
            mine = [v for v in variants if v["trials"] == n and v["weights"] == weights]
            single = min((v for v in mine if v.get("set") in singles), key=lambda v: v["measured_s"], default=None)
            for joint in (v for v in mine if v.get("set") in joints and single):
                joint["vs_single"] = single["kind"]
                joint["vs_single_paired"] = statistics.median(paired_ratios(times[joint["label"]],
                                                                            times[single["label"]]))
        out["models"][name] = {"variants": variants, "rounds_s": times, "median_s": med, "torch": torch_key,
                               "peak_gflops": peak}
        print(f"\n{name}, {tt} thread(s): ONNX Runtime {med['onnxruntime'] * 1e3:.2f} ms, PyTorch ({torch_key}) "
              f"{med[torch_key] * 1e3:.2f} ms")
        print(f"{'variant':<26} {'tasks':>5} {'tune min':>8} {'estimate':>9} {'measured':>9} {'gap':>6} "
              f"{'vs ORT':>7} {'paired':>7} {'vs torch':>8} {'vs best single':>17} {'solver ms':>9}")
        for v in variants:
            vs = f"{v['vs_single_paired']:.3f}x {v['vs_single']}" if "vs_single_paired" in v else ""
            solver = f"{v['solver_s'] * 1e3:.1f}" if v["solver_s"] is not None else "-"
            est = f"{v['estimate_s'] * 1e3:>8.2f} " if v["estimate_s"] else f"{'-':>8} "
            gap = f"{100 * v['estimate_gap']:>5.1f}%" if v["estimate_gap"] is not None else f"{'-':>6}"
            print(f"{v['label']:<26} {v['tasks']:>5} {v['tuning_s'] / 60:>8.1f} {est}"
                  f"{v['measured_s'] * 1e3:>8.2f} {gap} {v['vs_onnxruntime']:>6.3f}x "
                  f"{v['vs_onnxruntime_paired']:>6.3f}x {v['vs_torch']:>7.3f}x {vs:>17} {solver:>9}")
        print(f"\n{'variant':<26} {'GFLOPS':>7} {'of peak':>7}  share of the time by kernel kind (a profile run after the rounds)")
        for v in variants:
            total = sum(v["split_s"].values()) or 1.0
            split = "  ".join(f"{k} {100 * sec / total:.1f}%" for k, sec in v["split_s"].items())
            print(f"{v['label']:<26} {v['gflops']:>7.1f} {v['fraction_of_peak']:>7.2f}  {split}")
        args.out = str(write_results("models-tune", args.out, out))     # after each model: a cut run keeps it
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,resnet18,mobilenet_v2")
    ap.add_argument("--threads", default="1,2", help="thread counts; with --tune one count (default 1)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--log", action="append", help="tuning logs besides the shipped schedules")
    ap.add_argument("--peers", default="onnxruntime,torch")
    ap.add_argument("--tune", metavar="N[,M]", help="tune each model from an empty log with N (and M) trials first")
    ap.add_argument("--single", default="NCHW16c",
                    help="with --tune: the single layout(s) the joint plan is compared to (comma-separated; "
                         "the fastest of them measured is the reference)")
    ap.add_argument("--joint", action="append",
                    help="with --tune: the layouts of the joint plan (default "
                         f"{','.join(DEFAULT_CHOICES)}; NCHW and NHWC may be added); repeat to compare sets")
    ap.add_argument("--resume", action="store_true", help="with --tune: keep and resume the logs of an earlier run")
    ap.add_argument("--quiet", action="store_true", help="with --tune: no progress bars")
    ap.add_argument("--untuned", action="store_true", help="with --tune: time the untuned compile (default "
                                                           "schedules) beside the tuned ones")
    ap.add_argument("--weights", default=WEIGHTS[0],
                    help=f"with --tune: how weights are timed, {' or '.join(WEIGHTS)}; a list tunes each set both "
                         "ways (default %(default)s)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.tune:
        return tune_figures(args)
    threads = [int(t) for t in args.threads.split(",")]
    peaks = {t: peak_gflops(parse_target("cpu", t), t) for t in threads}
    print("FP32 peak: " + ", ".join(f"{t} thread(s) {p:.0f} GFLOPS" for t, p in peaks.items()))
    out = {"peak_gflops": peaks, "models": {}}
    summary = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        print(f"\n== {name}")
        res = bench_model(name, threads=threads, peers=[p for p in args.peers.split(",") if p], rounds=args.rounds,
                          logs=args.log or [])
        for row in res["rows"]:
            t = row["threads"]
            row["fraction_of_peak"] = row["gflops"] / peaks[t]
            summary.append((name, row))
            print(f"  {t} thread(s), slowest steps:")
            for s in row["slowest_steps"][:5]:
                print(f"    {s['share'] * 100:5.1f}%  {s['seconds'] * 1e3:7.3f} ms (in context "
                      f"{s['in_context_s'] * 1e3:7.3f})  {s['gflops']:6.1f} GFLOPS "
                      f"({s['gflops'] / peaks[t]:.2f} of peak)  {s['source']:<8} {s['workload']}")
        out["models"][name] = res
    print(f"\n{'model':<13} {'thr':>3} {'tuner ms':>9} {'ORT ms':>8} {'torch ms':>9} {'vs ORT':>7} {'paired':>7} "
          f"{'vs torch':>8} {'GFLOPS':>7} {'peak':>5} {'exec ovh':>8} {'dispatch':>8} {'arena MiB':>9} {'compile s':>9}")
    for name, row in summary:
        med = row["median_s"]
        ours, ort, pt = med["tuner"], med.get("onnxruntime"), med.get("torch")
        paired = (row.get("vs_onnxruntime_paired") or {}).get("median")
        print(f"{name:<13} {row['threads']:>3} {ours * 1e3:>9.2f} {(ort or 0) * 1e3:>8.2f} {(pt or 0) * 1e3:>9.2f} "
              f"{(ours / ort if ort else 0):>6.2f}x {(paired or 0):>6.3f}x {(ours / pt if pt else 0):>7.2f}x "
              f"{row['gflops']:>7.1f} {row['fraction_of_peak']:>5.2f} {100 * row['executor_overhead']:>7.2f}% "
              f"{100 * row['dispatch_overhead']:>7.2f}% {row['arena_bytes'] / 2**20:>9.1f} {row['compile_s']:>9.1f}")
    write_results("models", args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
