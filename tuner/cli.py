"""The `tuner` command line: parses arguments, calls the API, prints. Nothing else.

Each command imports what it uses when it runs, so `tuner --help` starts fast
and `tuner run` never loads the compiler (docs/design.md)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from .errors import INTERNAL_ERROR_EXIT, TunerError, UserError, check_bound, check_output_path


def _cmd_workloads(args) -> int:
    from .ops import BUILTIN, builtin
    rows = [("name", "op", "GFLOP", "spec")]
    for name in BUILTIN:
        wl = builtin(name)
        rows.append((name, wl.op, f"{wl.flops / 1e9:.3f}", wl.spec))
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"\n{len(rows) - 1} built-in workloads; --workload also takes a spec such as "
          "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1")
    return 0


def _require_logs(*paths, flag: str = "") -> None:
    """A one-line error (exit 2) for a log path that does not exist or is not a regular file."""
    from .database.records import check_readable
    for path in paths:
        if path is not None:
            check_readable(path, flag)


def split_workloads(text: str) -> list:
    """'a,b,conv2d:C=8,H=4,...,c' -> names and specs (a key=value item continues the spec before it)."""
    out: list = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if out and "=" in tok and ":" not in tok and ":" in out[-1]:
            out[-1] += "," + tok
        else:
            out.append(tok)
    return out


def _cmd_tune(args) -> int:
    from .ops import resolve
    from .tuning import tune
    if args.model:
        return _tune_model(args)
    args.batch_size = 32 if args.batch_size is None else args.batch_size
    names = split_workloads(args.workloads or "")
    if args.workload:
        names.insert(0, args.workload)
    if not names:
        raise UserError("give --workload NAME|SPEC or --workloads A,B,C (see `tuner workloads`)")
    wls = [resolve(n, args.layout) for n in names]
    cfg = _tune_setup(args)
    session = tune(wls, target=args.target, threads=args.threads, trials=args.trials, log=args.log,
                   time_limit=args.time_limit, policy=args.search, seed=args.seed, batch_size=args.batch_size,
                   run_config=cfg, progress=not args.no_progress, replay=args.replay,
                   cost_model_from=args.cost_model_from, scheduler=args.scheduler,
                   early_stopping=args.early_stopping, cluster=_cluster(args))
    for s in session.tasks:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items()) if k != "OK") or "none"
        best = (f"best {s.best_latency * 1e3:.4f} ms = {s.best_gflops:.1f} GFLOPS{' (weights cold)' * s.best.cold}"
                if s.best else "no valid candidate")
        print(f"{s.workload.label} on '{s.target}': {s.trials} trials in the log ({s.new} new); {best}; "
              f"failures: {fails}" + (f"; retired: {s.retired}" if s.retired else ""))
        if s.all_failed:
            kind, msg = next(iter(s.first_error.items()))
            print(f"  every candidate failed; first {kind}: {msg.strip().splitlines()[0][:200] if msg.strip() else ''}")
    rate = 60.0 * session.new / session.seconds if session.seconds else 0.0
    print(f"{session.new} new measurements in {session.seconds:.1f} s ({rate:.0f} candidates/min; "
          f"search overhead {100 * session.search_overhead:.1f}%, C generation {100 * session.codegen_fraction:.1f}%)")
    print(f"log: {session.log}")
    return _session_end(session)


def _tune_model(args) -> int:
    from .graph import parse_input_shapes
    from .model_tuning import tune_model
    if args.workload or args.workloads or args.layout:
        raise UserError("give a MODEL or --workload/--workloads (with --layout), not both")
    args.batch_size = 16 if args.batch_size is None else args.batch_size
    cfg = _tune_setup(args)
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if args.dynamic:
        return _tune_dynamic(args, cfg, layouts)
    if args.buckets or args.shape_histogram:
        raise UserError(f"{'--buckets' if args.buckets else '--shape-histogram'} describes a --dynamic range: give "
                        "--dynamic too")
    res = tune_model(args.model, trials=args.trials, log=args.log, target=args.target, threads=args.threads,
                     layouts=layouts, input_shapes=parse_input_shapes(args.input_shape),
                     batch_size=args.batch_size, policy=args.search, time_limit=args.time_limit, seed=args.seed,
                     run_config=cfg, progress=not args.no_progress, replay=args.replay,
                     cost_model_from=args.cost_model_from, early_stopping=args.early_stopping, cluster=_cluster(args),
                     **({"weights": args.weights} if args.weights else {}))
    session = res.session
    print(res.table())
    rate = 60.0 * session.new / session.seconds if session.seconds else 0.0
    print(f"{len(session.tasks)} tasks, {session.trials} trials in the log ({session.new} new) in "
          f"{session.seconds:.1f} s ({rate:.0f} candidates/min)")
    print(f"log: {session.log}" + (" (layout plan appended; `tuner compile` applies it)" if res.appended else
                                    " (its layout plan is already the newest there)" if res.record else ""))
    return _session_end(session)


def _tune_dynamic(args, cfg, layouts) -> int:
    """tune MODEL --dynamic: a model tune at each bucket of the range, into one log."""
    from .graph import parse_input_shapes
    from .model_tuning import tune_dynamic
    if not args.log:
        raise UserError("tune --dynamic needs --log: the one log its buckets are tuned into and compile reads")
    results = tune_dynamic(args.model, args.dynamic, args.trials, _buckets(args.buckets),
                           parse_input_shapes(args.input_shape), args.time_limit, args.shape_histogram,
                           log=args.log, target=args.target,
                           threads=args.threads, layouts=layouts, batch_size=args.batch_size, policy=args.search,
                           seed=args.seed, run_config=cfg, progress=not args.no_progress, replay=args.replay,
                           cost_model_from=args.cost_model_from, early_stopping=args.early_stopping,
                           cluster=_cluster(args), **({"weights": args.weights} if args.weights else {}))
    for value, res in results:
        print(f"at {value}:")
        print(res.table())
    print(f"log: {args.log} (tuner compile {args.model} --dynamic ... --log {args.log} takes each bucket's records)")
    return max(_session_end(res.session) for _, res in results)


def _tune_setup(args):
    """Refuse missing logs and out-of-range options before any work; the RunConfig of the options."""
    from .measure.runner import RunConfig
    _require_logs(*(p for p in args.cost_model_from or () if p.lower() != "none"), flag="--cost-model-from")
    _require_logs(args.replay, flag="--replay")
    _check_tune_options(args)
    return RunConfig(timeout=args.timeout, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                     cold_weights=args.weights == "cold")


def _session_end(session) -> int:
    """The exit code of a tune: 0, or 130/143 after Ctrl-C/SIGTERM with a line on how to resume."""
    if session.interrupted:
        how = "terminated (SIGTERM)" if session.stopped_by == "SIGTERM" else "interrupted"
        print(f"{how}: every finished measurement is in the log; run the same command again to resume")
        return 143 if session.stopped_by == "SIGTERM" else 130
    return 0


# (flag, attribute, the least value it may take, whether that value itself is allowed); the
# measurement options are checked by RunConfig itself
TUNE_LIMITS = [("--trials", "trials", 0, True), ("--batch-size", "batch_size", 1, True),
               ("--time-limit", "time_limit", 0, False), ("--early-stopping", "early_stopping", 1, True)]


def _check_tune_options(args) -> None:
    """Options that would spend the budget on results that mean nothing are refused up front."""
    for flag, attr, least, inclusive in TUNE_LIMITS:
        check_bound(flag, getattr(args, attr), least, inclusive)


def _cmd_analyze(args) -> int:
    from .analysis.model_report import analyze_model
    from .analysis.report import analyze
    from .database import records
    from .graph import parse_input_shapes
    _require_logs(args.log)
    for path, flag in ((args.plot, "--plot"), (args.html, "--html")):
        if path:
            check_output_path(path, flag)
    contents = records.load(args.log, warn=False)        # read once for either view
    models = analyze_model(args.log, args.model, parse_input_shapes(args.input_shape), args.compiled,
                           contents=contents)
    if models:
        return _model_view(args, models)
    if args.model or args.compiled:
        raise UserError(f"{args.log} holds no layout plan (`tuner tune MODEL` writes one); --model and --compiled "
                        "apply to a model tune's log")
    if args.html:
        raise UserError("--html is the report of a model tune's log; this log holds no layout plan")
    rep = analyze(args.log, contents)
    if not rep.tasks:
        print(f"{args.log}: no records" + (f" ({rep.skipped} malformed lines skipped)" if rep.skipped else ""))
        return 0
    print(rep.table())
    if not args.no_plot:
        out = args.plot or str(Path(args.log).with_suffix(".png"))
        check_output_path(out, "--plot")
        print(f"plot: {rep.plot(out)}")
    return 0


def _model_view(args, models: list) -> int:
    """Print each model report; write its plot (and --html); then, for a model tuned at several
    shapes of a range, the estimate across it."""
    from .analysis.model_report import range_curves, range_plot, range_table
    def numbered(path: str, k: int) -> str:          # several models in one log: one file each
        return path if len(models) == 1 else f"{Path(path).with_suffix('')}.{k + 1}{Path(path).suffix}"
    plot = Path(args.plot or str(Path(args.log).with_suffix(".png")))
    for k, rep in enumerate(models):
        print(rep.table())
        png = None
        if not args.no_plot:
            png = rep.plot(numbered(str(plot), k))
            print(f"\nplot: {png}")
        if args.html:
            print(f"report: {rep.html(numbered(args.html, k), png)}")
    for k, (model, target, points) in enumerate(range_curves(models)):
        print("\n" + range_table(model, target, points))
        if not args.no_plot:
            out = str(plot.with_suffix(f".range{k + 1}{plot.suffix}"))
            check_output_path(out, "--plot")
            print(f"\nplot: {range_plot(model, target, points, out)}")
    return 0


def _cmd_show(args) -> int:
    from .database import records
    from .database.union import Database
    from .ops import resolve
    from .target import parse_target
    from .task import Task
    wl = resolve(args.workload, args.layout)
    tgt = parse_target(args.target, args.threads)
    _require_logs(args.log)
    db = Database.open(args.log, tgt, use_shipped=False)
    rec, _ = db.best(wl, tgt)
    if rec is None:
        targets = sorted({r.target for r in records.load(args.log, warn=False).records if r.workload.key == wl.key})
        hint = f" (it has records for targets: {'; '.join(targets)})" if targets else ""
        print(f"{args.log} has no valid record for {wl.label} on '{tgt}'{hint}")
        return 1
    lat = rec.latency
    print(f"{wl.label} on '{tgt}': {lat * 1e3:.4f} ms, {wl.live_flops / lat / 1e9:.1f} GFLOPS "
          f"(policy {rec.policy}, {rec.timestamp})")
    if db.is_stale(rec):
        print("this version generates other code from these steps than was timed; tune again to time it")
    print("steps:")
    for step in rec.steps:
        print("  " + json.dumps(step))
    if args.code:
        cand = Task(wl, tgt).candidate(rec.steps, func_name="kernel")
        same = "matches" if cand.code_hash == rec.code_hash else "DIFFERS from"
        lang = "CUDA C" if tgt.kind == "cuda" else "C"
        print(f"\n{lang} source (regenerated; {same} the logged code hash):\n")
        print(cand.source)
    return 0


def _cluster(args):
    """The tune's --cluster with its TLS options (measure.cluster.Cluster), or None; checked now."""
    tls = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if not args.cluster:
        if any(tls) or args.insecure:
            raise UserError("--tls-ca-file, --tls-cert, --tls-key and --insecure go with --cluster ADDRESS")
        return None
    from .measure.cluster import LOCAL, Cluster, security
    spec = Cluster(args.cluster, *tls, insecure=args.insecure)
    if not args.cluster.startswith(LOCAL):
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise UserError("--cluster needs Dask's distributed, which is not installed: pip install -e "
                            "'.[cluster]'") from None
        security(args.cluster, "client", *tls, insecure=args.insecure, flag="--cluster ")
    return spec


def _cmd_worker(args) -> int:
    from .measure.cluster import run_worker
    from .target import parse_target
    if args.measure == args.build:
        raise UserError("say what this worker does: --measure (time candidates on this machine) or --build "
                        "(compile them); for both, start two workers")
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: give at least 1 compiler call at once")
    net = dict(listen=args.listen_address, tls=(args.tls_ca_file, args.tls_cert, args.tls_key),
               insecure=args.insecure)
    if args.build:
        if args.threads is not None or args.target != "cpu":
            raise UserError("--target and --threads say what a measuring worker measures for; a build worker "
                            "(--build) compiles for whichever target a job names: leave them out")
        return run_worker(args.scheduler, None, args.name, args.jobs, **net)
    if args.jobs is not None:
        raise UserError("--jobs sets a build worker's compiler calls; a measuring worker builds with one per core")
    return run_worker(args.scheduler, parse_target(args.target, args.threads), args.name, **net)


def _cmd_distill(args) -> int:
    from .analysis.distill import distill
    from .database import records
    _require_logs(*args.logs)
    check_output_path(args.output, "-o")
    if args.remeasure < 0 or args.rounds < 1:
        raise UserError("--remeasure must be 0 or more and --rounds at least 1")
    n = distill(args.logs, args.output, args.remeasure, args.rounds,
                progress=print if args.remeasure > 0 or args.retime_stale or args.check_plans else None,
                retime_stale=args.retime_stale, check_plans=args.check_plans, only_given=args.only_given,
                lower_isa=args.lower_isa)
    plans = len(records.load(args.output, warn=False).plans)
    print(f"{args.output}: best records of {n} workload/target pair(s)" + (f", {plans} layout plan(s)" if plans else ""))
    return 0


def _cmd_models(args) -> int:
    from .graph.models import ABOUT
    print(f"{'model':<14} {'input':<34} what it is")
    for name, (inp, what) in ABOUT.items():
        print(f"{name:<14} {inp:<34} {what}")
    print("(`tuner inspect NAME` shows a model's operators and tasks)")
    return 0


def _cmd_inspect(args) -> int:
    from .graph import load, parse_input_shapes
    from .graph.passes import DEFAULT_PIPELINE, PassTiming, PrintIR, optimize
    from .graph.passes.convert_layout import data_path_transforms
    from .graph.passes.extract_tasks import group_summary
    from .target import parse_target
    graph = load(args.model, parse_input_shapes(args.input_shape))
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else list(DEFAULT_PIPELINE)
    if "ExtractTasks" not in passes:
        passes.append("ExtractTasks")
    instruments = [PrintIR()] if args.print_ir else []
    timing = PassTiming() if args.timing else None
    if timing:
        instruments.append(timing)
    disabled = {p.strip() for p in (args.disable or "").split(",") if p.strip()}
    out = optimize(graph, layout=args.layout, passes=passes, disabled=disabled, opt_level=args.opt_level,
                   instruments=instruments, lanes=parse_target(args.target, check_host=False).lanes)
    groups = out.meta.get("fused_groups", [])
    print(f"{graph.name}: {len(graph.nodes)} nodes in, {len(out.nodes)} after passes; "
          f"{len(groups)} fused groups; layout {args.layout or 'NCHW'}")
    print("\nfused groups:")
    for g in groups:
        anchor = out.nodes[g.anchor if g.anchor is not None else g.nodes[-1]]
        last = out.nodes[g.nodes[-1]].output
        print(f"  {group_summary(out, g.nodes):<42} {last.type_str():<28} %{anchor.output.name}")
    print(f"\nlayout transforms on the data path: {data_path_transforms(out)}")
    tasks = out.meta.get("tasks", [])
    tunable = [t for t in tasks if t.tunable]
    print(f"\ntasks: {len(tunable)} unique tunable workloads (sorted by total FLOPs)")
    print(f"  {'weight':>6} {'GFLOP each':>10} {'GFLOP total':>11}  workload")
    for t in tunable:
        print(f"  {t.weight:>6} {t.flops / 1e9:>10.4f} {t.flops * t.weight / 1e9:>11.4f}  {t.workload.label}")
    rest = [t for t in tasks if not t.tunable]
    if rest:
        print("  not tunable yet:")
        for t in rest:
            print(f"  {t.weight:>6}  {t.summary}: {t.reason}")
    if timing:
        print("\npass timing:\n" + timing.report())
    return 0


def _cmd_compile(args) -> int:
    from .compiler import compile_model
    from .graph import parse_input_shapes
    from .runtime.model import check_artifact_dir
    check_artifact_dir(Path(args.output))
    logs = list(args.log or [])
    _require_logs(*logs[args.quick is not None:], flag="--log")    # --quick may start its log
    if args.quick is not None and args.dynamic:
        raise UserError("--quick measures one shape; with --dynamic, tune at a shape in the range (tuner tune "
                        "--input-shape) and compile with its --log")
    if args.quick is not None:
        logs[:1] = [_quick(args, logs[0] if logs else str(Path(args.output)) + ".jsonl", logs[1:])]
    elif args.time_limit is not None:
        raise UserError("--time-limit limits the measuring of --quick N: give --quick too")
    say = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None
    m = compile_model(args.model, log=logs, target=args.target, threads=args.threads, layout=args.layout,
                      input_shapes=parse_input_shapes(args.input_shape), use_shipped=not args.no_shipped,
                      strict=args.strict, progress=say, predict=not args.no_predict,
                      fuse_attention=args.fuse_attention, merge_dense=args.merge_dense,
                      dynamic=args.dynamic, buckets=_buckets(args.buckets))
    m.save(args.output)
    print(m.report())
    print(f"wrote {args.output} (run it: tuner run {args.output} --random)")
    return 0


def _buckets(text: str | None) -> list | None:
    """--buckets 64,128,256 -> [64, 128, 256]; None when not given."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UserError(f"cannot read --buckets {text!r}: expected values of the varying dimension, e.g. 64,128,256")
    return values


def _quick(args, log: str, others: list) -> str:
    """compile --quick N: measure N candidates of each task of the plan the compile will apply (from
    `others`, `log` or the shipped database) into `log` (model_tuning.quick_tune)."""
    from .graph import parse_input_shapes
    from .model_tuning import quick_tune
    if not 1 <= args.quick <= 1000:
        raise UserError(f"--quick {args.quick}: give a number of candidates per task from 1 to 1000 (8 is typical)")
    if args.time_limit is not None and not args.time_limit > 0:
        raise UserError(f"--time-limit {args.time_limit}: give a positive number of seconds")
    res = quick_tune(args.model, args.quick, log, args.layout, parse_input_shapes(args.input_shape),
                     others, not args.no_shipped, target=args.target, threads=args.threads, time_limit=args.time_limit)
    s = res.session
    print(f"--quick {args.quick}: {len(s.tasks)} tasks, {s.new} candidates measured in {s.seconds:.1f} s; log: {log}")
    return log


def _cmd_run(args) -> int:
    import numpy as np

    from .runtime import load as load_model
    m = load_model(args.model)
    if args.random and args.input:
        raise UserError("give either --input NAME=FILE.npy or --random, not both")
    if args.random:
        outs = m.run(*m.random_inputs(args.seed))
    elif not args.input:
        raise UserError("give --input NAME=FILE.npy for each input, or --random")
    else:
        named = {}
        for item in args.input:
            name, eq, path = item.partition("=")
            if not eq or not name or not path:
                raise UserError(f"cannot read --input {item!r}: expected NAME=FILE.npy")
            if name in named:
                raise UserError(f"--input {name} is given twice")
            try:      # mapped, not read: a header may promise more than the file holds
                named[name] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError, MemoryError, EOFError) as e:
                raise UserError(f"--input {path} is not a readable NumPy .npy file ({str(e)[:120]})") from None
            if not isinstance(named[name], np.ndarray):
                raise UserError(f"--input {path} holds several arrays (.npz); give one .npy file per input")
        outs = m.run(**named)
    for spec, y in zip(m.outputs, outs):
        print(f"{spec['name']}: {'x'.join(map(str, y.shape))} {y.dtype}, min {y.min():.4g} max {y.max():.4g} "
              f"mean {y.mean():.4g}" + (f", argmax {int(y.reshape(len(y), -1)[0].argmax())}"
                                        if y.ndim == 2 and y.size else ""))
    if args.output:
        one = len(outs) == 1 and not args.output.endswith(".npz")
        out = args.output if args.output.endswith(".npy" if one else ".npz") else args.output + (".npy" if one else ".npz")
        check_output_path(out, "-o")
        _write_arrays(out, None if one else [s["name"] for s in m.outputs], outs)
        print(f"wrote {out}")
    return 0


def _write_arrays(path: str, names, arrays: list) -> None:
    """One array as .npy (names None), or several as .npz keyed by the model's output names (any
    string, even one of np.savez's own parameters); written beside `path`, then renamed onto it."""
    import tempfile
    import zipfile

    import numpy as np
    fd, tmp = tempfile.mkstemp(prefix=".tuner-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            if names is None:
                np.save(f, arrays[0])
            else:
                with zipfile.ZipFile(f, "w") as z:
                    for name, y in zip(names, arrays, strict=True):
                        with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                            np.lib.format.write_array(member, y)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write -o {path} ({e.strerror or e}); choose another -o") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cmd_bench(args) -> int:
    from .compare.bench import bench_model
    try:
        threads = [int(t) for t in args.thread_counts.split(",")] if args.thread_counts else None
    except ValueError:
        raise UserError(f"--threads must be numbers separated by commas, e.g. 1,2; got {args.thread_counts!r}") from None
    if threads is not None and min(threads) < 1:
        raise UserError(f"--threads must be at least 1, got {args.thread_counts}")
    peers = [p.strip() for p in (args.compare or "").split(",") if p.strip()]
    from .compare.bench import parse_shapes
    bench_model(args.model, threads=threads, peers=peers, rounds=args.rounds, logs=args.log or [],
                json_out=args.json, shapes=parse_shapes(args.shapes))
    return 0


def _cmd_export_onnx(args) -> int:
    import onnx

    from .graph.models import load_model
    from .graph.onnx_frontend import to_onnx
    model = to_onnx(load_model(args.model), opset=args.opset)
    check_output_path(args.output, "-o")
    onnx.save(model, args.output)
    print(f"wrote {args.output} ({Path(args.output).stat().st_size / 1e6:.1f} MB, opset {args.opset})")
    return 0


def _cmd_pretrain(args) -> int:
    import time

    from .cost_model.pretrain import pretrain
    _require_logs(*args.logs)
    check_output_path(args.output, "-o")
    exclude = set(split_workloads(args.exclude or ""))
    t0 = time.perf_counter()
    model, summary = pretrain(args.logs, exclude, args.objective, progress=not args.no_progress)
    model.save(args.output, about=summary)
    print(f"trained on {summary['records']} records of {len(summary['workloads'])} workloads "
          f"({summary['groups']} workload/target groups) in {time.perf_counter() - t0:.1f} s"
          + (f"; left out: {', '.join(summary['excluded'])}" if summary["excluded"] else ""))
    print(f"model: {args.output} (+ .meta.json); use it with `tuner tune ... --cost-model-from {args.output}`")
    return 0


def _cmd_passes(args) -> int:
    from .graph.passes import DEFAULT_PIPELINE, REGISTRY
    print(f"{'pass':<24} {'opt level':>9}  what it does")
    for name, p in sorted(REGISTRY.items(), key=lambda kv: (kv[1].opt_level, kv[0])):
        req = f" (requires {', '.join(p.required)})" if p.required else ""
        print(f"{name:<24} {p.opt_level:>9}  {p.doc}{req}")
    print(f"\ndefault pipeline: {', '.join(DEFAULT_PIPELINE)}")
    return 0


def _cmd_cache(args) -> int:
    from .toolchain import cc
    limit = cc.cache_limit()
    if args.clear or args.prune:
        removed, freed = cc.prune_cache(0 if args.clear else limit, keep_s=0 if args.clear else cc.IN_USE_S)
        print(f"removed {removed} file(s), {freed / 2**20:.1f} MiB")
    files = cc.built_files()
    print(f"kernel cache {cc.cache_root()}: {len(files)} built file(s), {sum(f[1] for f in files) / 2**20:.1f} MiB "
          f"of a {limit / 2**30:.2f} GiB limit (TUNER_CACHE_SIZE; the least recently used go first)")
    return 0


def _tls_options(p, whose: str) -> None:
    """The cluster's TLS options (Dask's distributed.Security underneath) and --insecure."""
    p.add_argument("--tls-ca-file", metavar="PEM", help="with a tls:// scheduler: the cluster's CA certificate")
    p.add_argument("--tls-cert", metavar="PEM",
                   help=f"with a tls:// scheduler: {whose} certificate, signed by that CA")
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert (default: in that file)")
    p.add_argument("--insecure", action="store_true", help="join a scheduler on another machine without TLS: anyone "
                   "who reaches the cluster then runs code as its users")


def build_parser() -> argparse.ArgumentParser:
    from .database.result import WEIGHTS
    from .te.layouts import DEFAULT_CHOICES
    p = argparse.ArgumentParser(prog="tuner", description="Autotuning scheduler for deep-learning operators.")
    from . import __version__
    p.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("workloads", help="list the built-in workloads with their FLOPs").set_defaults(fn=_cmd_workloads)

    t = sub.add_parser("tune", help="search schedules for a model or workloads and log every measurement")
    t.add_argument("model", nargs="?", help="a built-in model (resnet50, mobilenet_v2, ...) or an .onnx file: "
                   "every task in every candidate layout under one --trials budget, then a layout plan")
    t.add_argument("--layouts", default=",".join(DEFAULT_CHOICES),
                   help="with MODEL: the conv layouts to choose from (comma-separated: NCHW, NHWC, NCHW8c, "
                        "NCHW16c; winograd2 and winograd4 are Winograd F(2x2,3x3) and F(4x4,3x3) for 3x3 "
                        "stride-1 convs, in NHWC, or with @NCHW8c / @NCHW16c in that blocked layout; "
                        "NCHW16c>NCHW8c reads NCHW16c and writes NCHW8c, the transform fused into the conv's "
                        "loads); default %(default)s")
    t.add_argument("--weights", choices=WEIGHTS,
                   help="how a kernel with weights is timed: with them evicted before every call, as a compiled "
                        "model meets them (cold; the default for a MODEL), or kept in cache call after call "
                        "(warm; the default for --workload; a MODEL's plan estimate is then also given cold)")
    t.add_argument("--input-shape", action="append", metavar="NAME=1x3x224x224",
                   help="with an .onnx MODEL: fix an input's shape")
    t.add_argument("--dynamic", action="append", metavar="NAME=1x[1..512]",
                   help="with an .onnx MODEL: tune it for a range of one dimension, at buckets of the range and "
                        "its bound, --trials shared by each bucket's share of the time (docs/dynamic-shapes.md)")
    t.add_argument("--buckets", metavar="V1,V2,...", help="with --dynamic: the values tuned below the bound "
                   "(default: cut from --shape-histogram, else an eighth, a quarter and half of it)")
    t.add_argument("--shape-histogram", metavar="FILE",
                   help="with --dynamic: the values of the varying dimension a deployment sees, one `VALUE [COUNT]` "
                        "per line: the buckets cut its time into equal shares, and --trials follow it")
    t.add_argument("--workload", help="built-in name (see `tuner workloads`) or a spec")
    t.add_argument("--workloads", help="comma-separated workloads tuned together under one --trials budget")
    t.add_argument("--layout", help="NCHW, NHWC, NCHW8c, NCHW16c for conv (default NCHW16c); OI or OI16o for dense")
    t.add_argument("--target", default="cpu", help="'cpu' (this host) or e.g. 'cpu -isa=avx2 -threads=1'; 'cuda' "
                   "(this host's GPU, through pycuda) or e.g. 'cuda -arch=sm_90' (operators only)")
    t.add_argument("--threads", type=int, help="kernel threads (default: all cores); part of the target")
    t.add_argument("--trials", type=int, default=64, help="total measurements (of all the workloads) in the log")
    t.add_argument("--time-limit", type=float, help="stop after this many seconds")
    t.add_argument("--cluster", help="measure on a Dask cluster: the scheduler's address (tls://host:8786 with the "
                   "--tls-* options; tcp:// on this machine or with --insecure; workers started with `tuner worker "
                   "ADDRESS --measure` or --build), or local:M (M measuring workers here) or local:M+B (and B build "
                   "workers)")
    _tls_options(t, "the tuner's")
    t.add_argument("--log", help="JSONL log to append to and resume from (default logs/<workload>.<layout>.jsonl)")
    t.add_argument("--search", default="evolutionary",
                   help="evolutionary (cost-model guided), random, optuna:tpe, optuna:cmaes or optuna:random")
    t.add_argument("--cost-model-from", action="append", metavar="LOG|MODEL|none",
                   help="transfer: a log (*.jsonl) to train on with this session's records (repeatable), or a "
                        "model saved by `tuner pretrain` to fine-tune; default: the shipped pre-trained model "
                        "of the target's ISA; 'none': start from scratch")
    t.add_argument("--replay", metavar="LOG", help="no hardware: take costs from this log (search experiments)")
    t.add_argument("--scheduler", default="gradient", choices=["gradient", "round-robin"],
                   help="how rounds are shared between workloads")
    t.add_argument("--early-stopping", type=int, help="retire a workload after this many rounds without improvement")
    t.add_argument("--seed", type=_seed, default=0)
    t.add_argument("--batch-size", type=int, help="candidates built per round (default 32; 16 for a model)")
    t.add_argument("--timeout", type=float, default=10.0, help="seconds a candidate may run before it is killed")
    t.add_argument("--repeat", type=int, default=3, help="timed repeats per candidate")
    t.add_argument("--min-repeat-ms", type=float, default=10.0, help="minimum duration of one timed repeat")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(fn=_cmd_tune)

    a = sub.add_parser("analyze", help="summarise a tuning log: tables and plots (a model tune's log: the model view)")
    a.add_argument("log")
    a.add_argument("--plot", help="PNG path (default: the log's path with .png)")
    a.add_argument("--no-plot", action="store_true", help="draw no plot: no PNG, and none in the --html report")
    a.add_argument("--html", help="a model log: also write one self-contained HTML report here")
    a.add_argument("--model", help="a model log: the model (built-in name or .onnx) when the name in its plan "
                   "does not load here")
    a.add_argument("--input-shape", action="append", metavar="NAME=1x3x224x224",
                   help="with an .onnx --model: fix an input's shape, as for the tune")
    a.add_argument("--compiled", metavar="DIR", help="a model log: time this compiled model (`tuner compile -o "
                   "DIR`) and report its gap to the estimate")
    a.set_defaults(fn=_cmd_analyze)

    s = sub.add_parser("show", help="the best schedule of a workload in a log, with its C code")
    s.add_argument("--log", required=True)
    s.add_argument("--workload", required=True)
    s.add_argument("--layout")
    s.add_argument("--target", default="cpu")
    s.add_argument("--threads", type=int)
    s.add_argument("--code", action="store_true", help="print the generated C (or CUDA C) source")
    s.set_defaults(fn=_cmd_show)

    d = sub.add_parser("distill", help="keep the best record per workload and target (e.g. for tuner/schedules/)")
    d.add_argument("logs", nargs="+")
    d.add_argument("-o", "--output", required=True, help="database to write (merged with what it holds)")
    d.add_argument("--remeasure", type=int, default=0, metavar="K",
                   help="time the K fastest schedules of each task and this version's default again on this host, "
                        "interleaved, as they were timed (weights cold or warm), and keep the one with the lowest "
                        "median (the fastest logged record is often a lucky measurement, and one tuned against an "
                        "older version's defaults can lose to this one's)")
    d.add_argument("--rounds", type=int, default=5, help="rounds of --remeasure and --retime-stale (default 5)")
    d.add_argument("--retime-stale", action="store_true",
                   help="a task none of whose records this version's code replays: time its fastest schedule "
                        "again as this version's code where this host can run it (else it is kept as logged)")
    d.add_argument("--only-given", action="store_true",
                   help="--remeasure, --retime-stale and --check-plans time only the tasks and plans the given logs "
                        "hold; the others of the output database keep theirs (refreshing some tasks of a shipped file)")
    d.add_argument("--check-plans", action="store_true",
                   help="time each model's layout plan whole against the plan an untuned compile applies (both with "
                        "the records kept), where this host can run it, and keep the faster: a plan tuned against an "
                        "older version's defaults can lose to this one's (built-in models, and ONNX files at their path)")
    d.add_argument("--lower-isa", action="store_true",
                   help="time the records and plans of an ISA below this host's too (AVX2 code on an AVX-512 host, "
                        "a stand-in for that ISA's own hosts); each record it times names this host")
    d.set_defaults(fn=_cmd_distill)

    pt = sub.add_parser("pretrain", help="train a cost model on logs, to start searches from (transfer)")
    pt.add_argument("logs", nargs="+")
    pt.add_argument("-o", "--output", required=True, help="model file to write (plus OUTPUT.meta.json)")
    pt.add_argument("--exclude", help="comma-separated workload names or keys to leave out (to evaluate on them)")
    pt.add_argument("--objective", default="pack-sum", choices=["pack-sum", "rank"])
    pt.add_argument("--no-progress", action="store_true")
    pt.set_defaults(fn=_cmd_pretrain)

    sub.add_parser("models", help="list the built-in models").set_defaults(fn=_cmd_models)

    i = sub.add_parser("inspect", help="a model after graph passes: fused groups, transforms, tasks")
    i.add_argument("model", help="built-in model name (see `tuner models`) or an .onnx file")
    i.add_argument("--layout", help="run convolutions in NHWC, NCHW8c or NCHW16c (ConvertLayout)")
    i.add_argument("--target", default="cpu",
                   help="whose vector width PadChannels counts: 'cpu' (this host) or e.g. 'cpu -isa=avx2'")
    i.add_argument("--passes", help="comma-separated passes to run instead of the default pipeline")
    i.add_argument("--disable", help="comma-separated passes to skip")
    i.add_argument("--opt-level", type=int, default=3)
    i.add_argument("--print-ir", action="store_true", help="print the IR after each pass")
    i.add_argument("--timing", action="store_true", help="time each pass")
    i.add_argument("--input-shape", action="append", help="NAME=1x3x224x224 for inputs with dynamic dims")
    i.set_defaults(fn=_cmd_inspect)

    c = sub.add_parser("compile", help="compile a model with its best schedules into one library (+ weights)")
    c.add_argument("model", help="built-in model name (see `tuner models`) or an .onnx file")
    c.add_argument("-o", "--output", required=True, help="directory to write the compiled model to")
    c.add_argument("--log", action="append", help="tuning log to take schedules from (repeatable; first wins)")
    c.add_argument("--target", default="cpu", help="'cpu' (this host) or e.g. 'cpu -isa=avx2 -threads=1'")
    c.add_argument("--threads", type=int, help="kernel threads (default: all cores); compiled in")
    c.add_argument("--layout", help="activation layout of convolutions: NCHW, NHWC, NCHW8c, NCHW16c (default; "
                   "with no layout plan, the 3x3 convs of 14 pixels a side or more as Winograd); "
                   "a layout given runs every conv not in a plan in it")
    c.add_argument("--input-shape", action="append", help="NAME=1x3x224x224 for inputs with dynamic dims")
    c.add_argument("--dynamic", action="append", metavar="NAME=1x[1..512]",
                   help="dims that vary from run to run, each a range [lo..hi], one in steps [224..640:32] (an "
                        "image size that strided convs divide) or others' symbols plus a number, [seq+1] or "
                        "[past+seq] (repeatable): one compiled model runs every shape in them (an ONNX file with "
                        "dynamic axes; docs/dynamic-shapes.md)")
    c.add_argument("--buckets", metavar="V1,V2,...",
                   help="with --dynamic: values of the varying dimension whose records in --log each task runs "
                        "for the values up to it (default with a log: those its `tune --dynamic` tuned at)")
    c.add_argument("--strict", action="store_true", help="fail when any task has no tuning record")
    c.add_argument("--no-shipped", action="store_true", help="do not fall back on the shipped tuner/schedules/")
    c.add_argument("--no-predict", action="store_true",
                   help="a task with no record runs its record for another thread count (parallelised for this "
                        "one) or its default schedule, not the shipped cost model's pick")
    c.add_argument("--fuse-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="each attention (Q.K^T, scale and mask, softmax, P.V) as one kernel computed row by row, "
                        "or not (its batch_matmul tasks and a softmax); default: as the model tune in --log timed "
                        "both ways, else not (docs/graph-compiler.md)")
    c.add_argument("--merge-dense", action=argparse.BooleanOptionalAction, default=None,
                   help="dense layers reading one activation (Q, K and V projections) as one GEMM, or not; "
                        "default: as the model tune in --log timed both ways, else not")
    c.add_argument("--quick", type=int, metavar="N",
                   help="first measure N candidates of each task (its default and the cost model's top picks; "
                        "2 of a task under 1%% of the model): a short tune appended to the first --log, else to "
                        "OUTPUT.jsonl beside the compiled model")
    c.add_argument("--time-limit", type=float, help="with --quick: stop measuring after this many seconds")
    c.add_argument("-v", "--verbose", action="store_true", help="say what each step does")
    c.set_defaults(fn=_cmd_compile)

    r = sub.add_parser("run", help="run a compiled model on inputs from .npy files (or random ones)")
    r.add_argument("model", help="directory written by `tuner compile -o`")
    r.add_argument("--input", action="append", help="NAME=FILE.npy, one per model input")
    r.add_argument("--random", action="store_true", help="feed random inputs in [-1, 1)")
    r.add_argument("--seed", type=_seed, default=0)
    r.add_argument("-o", "--output", help="write the output to FILE.npy (several outputs: FILE.npz)")
    r.set_defaults(fn=_cmd_run)

    bn = sub.add_parser("bench", help="latency of a compiled model against ONNX Runtime / PyTorch, interleaved")
    bn.add_argument("model", help="a compiled model directory, a built-in model name or an .onnx file")
    bn.add_argument("--compare", default="onnxruntime", help="peers: onnxruntime, torch (comma-separated, or '')")
    bn.add_argument("--threads", dest="thread_counts", help="thread counts, e.g. 1,2 (default: the compiled model's)")
    bn.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    bn.add_argument("--log", action="append", help="tuning logs, when the model is compiled here")
    bn.add_argument("--json", help="also write the results to this JSON file")
    bn.add_argument("--shapes", metavar="NAME=1x16,1x77",
                    help="a model compiled with --dynamic: time it at each of these shapes beside ONNX Runtime "
                         "(several inputs joined by ';', each giving as many shapes)")
    bn.set_defaults(fn=_cmd_bench)

    e = sub.add_parser("export-onnx", help="write a built-in model as an ONNX file")
    e.add_argument("model")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--opset", type=int, default=18)
    e.set_defaults(fn=_cmd_export_onnx)

    sub.add_parser("passes", help="list the graph passes and their opt levels").set_defaults(fn=_cmd_passes)
    ca = sub.add_parser("cache", help="the kernel cache's size and limit; prune or clear it")
    what = ca.add_mutually_exclusive_group()
    what.add_argument("--prune", action="store_true", help="remove the least recently used files down to the limit "
                      "(none used in the last hour), as builds do on their own")
    what.add_argument("--clear", action="store_true", help="remove every built file (compiled models keep their own "
                      "copy; a tune running now may have to build its kernels again)")
    ca.set_defaults(fn=_cmd_cache)
    wk = sub.add_parser("worker", help="join a Dask cluster as a worker that measures candidates on this machine "
                        "or builds them")
    wk.add_argument("scheduler", help="the Dask scheduler's address, e.g. tcp://sched:8786 (`dask scheduler`)")
    wk.add_argument("--measure", action="store_true", help="measure candidates for this machine's target")
    wk.add_argument("--build", action="store_true", help="compile candidates for any target (a build-only worker)")
    wk.add_argument("--jobs", type=int, help="with --build: compiler calls at once (default: one per core)")
    wk.add_argument("--target", default="cpu", help="what this worker measures for: 'cpu' (this host) or 'cuda'")
    wk.add_argument("--threads", type=int, help="kernel threads, as `tuner tune --threads` (part of the target)")
    wk.add_argument("--name", help="the worker's name on the cluster (default: host and process id)")
    wk.add_argument("--listen-address", metavar="HOST[:PORT]", help="the interface this worker listens on for the "
                    "scheduler, the tuner and other workers (default: the one that reaches the scheduler; loopback "
                    "for a loopback scheduler; 0.0.0.0: every interface)")
    _tls_options(wk, "this worker's")
    wk.set_defaults(fn=_cmd_worker)
    return p


def _seed(text: str) -> int:
    """A random seed: a non-negative integer (NumPy's generators take no other)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    warnings.simplefilter("always")
    warnings.formatwarning = lambda msg, *a, **k: f"warning: {msg}\n"
    if getattr(args, "threads", None) is not None and args.threads < 1:
        print("error: --threads must be at least 1", file=sys.stderr)
        return 2
    try:
        rc = args.fn(args)
        if rc in (130, 143):
            _exit_interrupted(rc)
        return rc
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        _exit_interrupted(130)
    except BrokenPipeError as e:   # stdout piped to a reader that stopped (`| head`): as other Unix tools, quietly
        if not _stdout_closed():
            return _internal_error(argv, e)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # a bug in tuner, not the user's input: say so, keep the traceback
        return _internal_error(argv, e)


def _internal_error(argv, e: BaseException) -> int:
    report = _crash_report(argv, e)
    print(f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
          f"  this is a bug in tuner, not a problem with your input; the traceback is in {report}\n"
          "  please report it with that file", file=sys.stderr)
    return INTERNAL_ERROR_EXIT


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _crash_report(argv, exc) -> str:
    """Write the traceback, the command and the versions to a file; return its path."""
    import datetime
    import platform
    import tempfile
    import traceback

    from . import __version__
    text = (f"tuner {__version__}, Python {platform.python_version()}, {platform.platform()}\n"
            f"command: tuner {' '.join(sys.argv[1:] if argv is None else argv)}\n"
            f"time: {datetime.datetime.now().isoformat(timespec='seconds')}\n\n"
            + "".join(traceback.format_exception(exc)))
    fd, path = tempfile.mkstemp(prefix="tuner-crash-", suffix=".txt")
    with open(fd, "w") as f:
        f.write(text)
    return path


def _exit_interrupted(code: int = 130):
    """Exit 130 (Ctrl-C) or 143 (SIGTERM) now that everything is flushed and closed.

    Skips interpreter finalisation: a SIGINT that landed in xgboost's native training threads can
    otherwise still kill the process there (exit -2) after the tuner has handled it.
    """
    import os
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
