"""Fault injection: kill, stop, crowd, starve and feed garbage to `tuner`, many times, and count what broke.

    python -m bench.faults                 # every case (about 6 minutes on 2 cores)
    python -m bench.faults --kills 50 --cases sigkill,disk-full

Each case runs real `tuner` processes on a small convolution. Columns:

- runs: how many times the fault was injected;
- lost: complete records in the log before a run that are gone after it;
- duplicated: a workload's code measured twice in one log;
- torn: lines of the log that are not a whole record (a line cut by a write that died);
- overrun: records beyond the trial budget after the tune is resumed to its end;
- orphans: measurement processes still alive 2 s after their tuner died;
- tracebacks: runs whose stderr holds a Python traceback or an internal-error report;
- bad records: records that blame a candidate for the fault (a RUNTIME_ERROR for a worker killed
  from outside, a COMPILE_ERROR for a full disk);
- wrong outputs: runs that returned (or printed) outputs that differ from the reference, or code
  an attacker planted running;
- signals: runs that ended by a signal the tuner did not send itself (SIGSEGV, SIGABRT, ...);
- exit codes: how the runs ended (0 done, 2 bad input, 3 environment, 130/143 interrupted, -9 killed).

Target: 0 in every column but runs and exit codes, and every bad input a one-line error.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import write_results

SPEC = "conv2d:N=1,C=8,H=6,W=6,K=8,R=3,S=3,stride=1,pad=1"
OTHER = "conv2d:N=1,C=8,H=4,W=4,K=16,R=1,S=1,stride=1,pad=0"
TUNE = ["--threads", "1", "--batch-size", "4", "--no-progress", "--repeat", "1", "--min-repeat-ms", "0.5",
        "--search", "random"]


@dataclass
class Row:
    case: str
    runs: int = 0
    lost: int = 0
    duplicated: int = 0
    torn: int = 0
    overrun: int = 0
    orphans: int = 0
    tracebacks: int = 0
    bad_records: int = 0
    wrong_outputs: int = 0
    signals: int = 0
    exit_codes: Counter = field(default_factory=Counter)
    notes: list = field(default_factory=list)


# ---------------------------------------------------------------- helpers

def tuner_cmd(*args) -> list:
    return [sys.executable, "-m", "tuner.cli", *args]


def tune_cmd(log, trials, spec=SPEC) -> list:
    return tuner_cmd("tune", "--workload", spec, "--layout", "NCHW8c", "--trials", str(trials), "--log", str(log), *TUNE)


def run(cmd, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def lines_of(log: Path) -> list:
    return log.read_text(errors="replace").splitlines() if log.exists() else []


def whole(line: str) -> bool:
    """A line that is one whole record (judged here, not by the tuner under test)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    return (isinstance(rec, dict) and isinstance(rec.get("workload"), dict) and isinstance(rec.get("costs"), list)
            and isinstance(rec.get("steps"), list) and isinstance(rec.get("error"), str))


def _torn(lines: list) -> int:
    return sum(1 for line in lines if line.strip() and not whole(line))


def _dups(lines: list) -> int:
    seen = Counter(json.dumps([json.loads(line)["workload"].get("key"), json.loads(line).get("code_hash")])
                   for line in lines if whole(line))
    return sum(n - 1 for n in seen.values() if n > 1)


def audit(row: Row, log: Path, before: list) -> list:
    """Count the records of `log` lost since it held the lines `before`, and the torn lines and
    duplicated measurements added since."""
    after = lines_of(log)
    now = set(after)
    row.lost += sum(1 for line in before if whole(line) and line not in now)
    row.torn += max(0, _torn(after) - _torn(before))
    row.duplicated += max(0, _dups(after) - _dups(before))
    return after


def worker_pids(parent: int) -> list:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            env = Path(f"/proc/{d}/environ").read_bytes()
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"tuner.measure.worker" in cmd and (ppid == parent or f"TUNER_PARENT_PID={parent}\0".encode() in env):
            out.append(int(d))
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def count_orphans(row: Row, pids: list) -> None:
    deadline = time.time() + 2.0
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    stray = [p for p in pids if alive(p)]
    row.orphans += len(stray)
    for p in stray:
        os.kill(p, signal.SIGKILL)


def traceback_in(text: str) -> bool:
    return "Traceback" in text or "internal error" in text


def finish(row: Row, log: Path, trials: int, env) -> None:
    """Resume the tune to its budget; count records beyond it."""
    done = run(tune_cmd(log, trials), env)
    row.tracebacks += traceback_in(done.stderr)
    row.exit_codes[f"resume {done.returncode}"] += 1
    n = sum(1 for line in lines_of(log) if whole(line))
    row.overrun += max(0, n - trials)
    if n < trials:
        row.notes.append(f"resume stopped at {n} of {trials}: {done.stderr.strip()[-200:]}")


def wait_for(proc, row: Row, failure: str) -> str:
    """A signalled process's stderr; killed (and the failure noted) if it is still running after 60 s."""
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        row.notes.append(failure)
        return proc.communicate()[1]


def interrupt(row: Row, log: Path, env, sig, delay: float, trials: int = 100_000) -> None:
    """Start a tune, send `sig` after `delay` seconds (while it builds, measures or appends)."""
    before = lines_of(log)
    proc = subprocess.Popen(tune_cmd(log, trials), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    time.sleep(delay)
    pids = worker_pids(proc.pid)
    proc.send_signal(sig)
    err = wait_for(proc, row, f"{signal.Signals(sig).name} did not stop the tune within 60 s")
    pids += worker_pids(proc.pid)
    row.runs += 1
    row.exit_codes[str(proc.returncode)] += 1
    row.tracebacks += traceback_in(err)
    count_orphans(row, pids)
    audit(row, log, before)


# ---------------------------------------------------------------- cases

def case_sigkill(work: Path, env, args) -> Row:
    """SIGKILL at random moments: while building, measuring or appending."""
    row, log, rng = Row("SIGKILL at random moments"), work / "kill.jsonl", random.Random(args.seed)
    for _ in range(args.kills):
        interrupt(row, log, env, signal.SIGKILL, rng.uniform(0.8, 3.5))
    finish(row, log, len([x for x in lines_of(log) if whole(x)]) + 8, env)
    return row


def case_signal(sig):
    def case(work: Path, env, args) -> Row:
        row, log, rng = Row(f"{sig.name}, then resume"), work / f"{sig.name}.jsonl", random.Random(args.seed)
        for _ in range(args.stops):
            interrupt(row, log, env, sig, rng.uniform(1.0, 3.5))
        finish(row, log, len([x for x in lines_of(log) if whole(x)]) + 8, env)
        return row
    return case


def case_concurrent(n: int):
    def case(work: Path, env, args) -> Row:
        row = Row(f"{n} tuners, one workload, one log")
        for k in range(args.stops // 2 or 1):
            log = work / f"conc{n}-{k}.jsonl"
            procs = [subprocess.Popen(tune_cmd(log, 24), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env) for _ in range(n)]
            for p in procs:
                _, err = p.communicate(timeout=300)
                row.runs += 1
                row.exit_codes[str(p.returncode)] += 1
                row.tracebacks += traceback_in(err)
                if p.returncode == 2 and "another tuner is already tuning" not in err:
                    row.notes.append(f"unexpected refusal: {err.strip()[:160]}")
            audit(row, log, [])
            n_recs = sum(1 for line in lines_of(log) if whole(line))
            row.overrun += max(0, n_recs - 24)
        return row
    return case


def case_two_workloads(work: Path, env, args) -> Row:
    row, log = Row("2 tuners, two workloads, one log"), work / "two.jsonl"
    for _ in range(args.stops // 2 or 1):
        procs = [subprocess.Popen(tune_cmd(log, 16 + row.runs * 8, spec), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for spec in (SPEC, OTHER)]
        for p in procs:
            _, err = p.communicate(timeout=300)
            row.runs += 1
            row.exit_codes[str(p.returncode)] += 1
            row.tracebacks += traceback_in(err)
        audit(row, log, [])
    return row


def _small_fs(work: Path, size_kb: int):
    """A size-limited file system: a tmpfs where we may mount one, else None."""
    mnt = Path(tempfile.mkdtemp(prefix=f"fs{size_kb}k-", dir=work))
    ok = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mnt)],
                                              capture_output=True).returncode == 0
    return mnt if ok else None


def _fill(mnt: Path, leave: int) -> None:
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(mnt / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def case_disk_full(work: Path, env, args) -> Row:
    """The log's disk fills up while the tuner appends (a tmpfs of 256 KiB, nearly full)."""
    row = Row("disk full during append")
    for k in range(args.stops // 2 or 1):
        mnt = _small_fs(work, 256)
        if mnt is None:
            row.notes.append("cannot mount a tmpfs here (needs root): case skipped")
            return row
        try:
            log = mnt / "log.jsonl"
            shutil.copy(work / "seed.jsonl", log)
            _fill(mnt, 4096 * (k + 2))
            before = lines_of(log)
            out = run(tune_cmd(log, 500), env)
            row.runs += 1
            row.exit_codes[str(out.returncode)] += 1
            row.tracebacks += traceback_in(out.stderr)
            if out.returncode != 3 or "No space left" not in out.stderr:
                row.notes.append(f"exit {out.returncode}: {out.stderr.strip()[-200:]}")
            audit(row, log, before)
        finally:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    return row


def case_cache_full(work: Path, env, args) -> Row:
    """The kernel cache's disk is full: stop (exit 3), record nothing against candidates."""
    row = Row("kernel cache disk full")
    mnt = _small_fs(work, 128)
    if mnt is None:
        row.notes.append("cannot mount a tmpfs here (needs root): case skipped")
        return row
    try:
        _fill(mnt, 0)
        log = work / "cachefull.jsonl"
        for _ in range(args.stops // 2 or 1):
            out = run(tune_cmd(log, 8), dict(env, TUNER_CACHE_DIR=str(mnt / "cache")))
            row.runs += 1
            row.exit_codes[str(out.returncode)] += 1
            row.tracebacks += traceback_in(out.stderr)
            row.bad_records += sum(1 for line in lines_of(log) if whole(line))
            if out.returncode != 3:
                row.notes.append(f"exit {out.returncode}: {out.stderr.strip()[-200:]}")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    return row


def case_worker_killed(work: Path, env, args) -> Row:
    """The measurement process is killed from outside, again and again, while the tune runs."""
    row, log, rng = Row("measurement process killed"), work / "wkill.jsonl", random.Random(args.seed)
    for _ in range(max(1, args.stops // 2)):
        before = lines_of(log)
        trials = len([x for x in before if whole(x)]) + 64
        proc = subprocess.Popen(tune_cmd(log, trials), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        while proc.poll() is None:
            time.sleep(rng.uniform(0.2, 1.0))
            for w in worker_pids(proc.pid):
                try:
                    os.kill(w, signal.SIGKILL)
                    row.runs += 1
                except ProcessLookupError:
                    pass
        _, err = proc.communicate()
        row.exit_codes[str(proc.returncode)] += 1
        row.tracebacks += traceback_in(err)
        if proc.returncode:
            row.notes.append(f"exit {proc.returncode}: {err.strip()[-300:]}")
        after = audit(row, log, before)
        row.bad_records += sum(1 for line in after[len(before):] if whole(line) and
                               json.loads(line)["error"] == "RUNTIME_ERROR")
    return row


HANG = r"""
import sys
from tuner.measure.runner import RunConfig
from tuner.search import PolicyFactory
from tuner.search.random_search import RandomSearch
from tuner.task import Candidate, code_hash
from tuner.ops import resolve
from tuner.tuning import tune

class Hang(RandomSearch):
    name = "hang"
    def propose(self, n, seen, first=False):
        good = super().propose(n - 1, seen, first)
        src = "int hang%d(float** restrict a) { volatile int s = 1; while (s) {} return 0; }\n" % len(seen)
        return good[:1] + [Candidate([["hang", len(seen)]], src, "hang%d" % len(seen), False,
                                     code_hash(src, "x%d" % len(seen)))] + good[1:]

wl = resolve(sys.argv[2], "NCHW8c")
tune([wl], target="cpu", threads=1, trials=int(sys.argv[3]), log=sys.argv[1],
     run_config=RunConfig(timeout=float(sys.argv[4]), repeat=1, min_repeat_ms=0.5), progress=False, batch_size=4,
     policy=PolicyFactory("hang", Hang))
"""


def case_hung(work: Path, env, args) -> Row:
    """A kernel hangs: it becomes a TIMEOUT record and the tune goes on; killing the tuner while one
    hangs leaves no process behind."""
    row = Row("hung kernel (timeout; tuner killed)")
    log = work / "hang.jsonl"
    out = run([sys.executable, "-c", HANG, str(log), SPEC, "8", "1.0"], env)
    row.runs += 1
    row.exit_codes[str(out.returncode)] += 1
    row.tracebacks += traceback_in(out.stderr)
    kinds = Counter(json.loads(line)["error"] for line in lines_of(log) if whole(line))
    if kinds.get("TIMEOUT", 0) < 1 or kinds.get("OK", 0) < 1:
        row.notes.append(f"expected TIMEOUT and OK records, got {dict(kinds)}")
    for sig in [signal.SIGKILL, signal.SIGTERM] * max(1, args.stops // 4):
        proc = subprocess.Popen([sys.executable, "-c", HANG, str(work / "hang2.jsonl"), SPEC, "100", "600"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline, pids = time.time() + 60, []
        while time.time() < deadline and not pids:
            time.sleep(0.1)
            pids = worker_pids(proc.pid)
        time.sleep(1.0)
        proc.send_signal(sig)
        if sig == signal.SIGTERM:
            time.sleep(0.5)
            proc.send_signal(sig)
        err = wait_for(proc, row, f"{sig.name} twice did not stop the tuner within 60 s")
        row.runs += 1
        row.exit_codes[str(proc.returncode)] += 1
        row.tracebacks += "BrokenPipe" in err or (sig == signal.SIGKILL and traceback_in(err))
        count_orphans(row, pids)
    return row


# ---------------------------------------------------------------- hostile input

def hostile_record(rng: random.Random, valid: dict) -> dict:
    rec = json.loads(json.dumps(valid))
    junk = [None, True, -1, 0, 0.0, -0.0, 1e-12, 1e308, float("inf"), float("nan"), "", "1e-12", "OK", [], {},
            [None], ["1e-12"], [0.0], [-1.0], [1e-12], {"key": 3}, [[1]], [["split"]], "x" * 50, 2 ** 70]
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(["workload", "target", "steps", "costs", "error", "code_hash", "message", "build_s",
                            "seed", "decisions", "workload.key", "workload.spec", "workload.layout", "costs.0",
                            "steps.0", "steps.junk"])
        value = rng.choice(junk)
        if where == "steps.junk":                     # valid JSON steps that do not replay, with a tiny cost
            rec["steps"], rec["costs"] = [["split", "nope", "x", [1]]], [1e-12]
        elif where.startswith("workload.") and isinstance(rec.get("workload"), dict):
            rec["workload"][where.split(".")[1]] = value
        elif where == "costs.0":
            rec["costs"] = [value]
        elif where == "steps.0" and isinstance(rec.get("steps"), list) and rec["steps"]:
            rec["steps"][0] = value
        else:
            rec[where] = value
    return rec


def case_hostile_records(work: Path, env, args) -> Row:
    """A log with hostile records (wrong types, NaN, zero or string costs, junk steps with tiny costs)
    through every command that reads a log."""
    row, rng = Row("hostile log records"), random.Random(args.seed)
    seed_lines = lines_of(work / "seed.jsonl")
    valid = json.loads(seed_lines[0])
    from tuner.ops import resolve
    best_gflops = resolve(SPEC, "NCHW8c").flops / min(sorted(json.loads(line)["costs"])[0] for line in seed_lines) / 1e9
    for k in range(args.hostile_logs):
        log = work / f"hostile{k}.jsonl"
        bad = [json.dumps(hostile_record(rng, valid)) for _ in range(20)]
        log.write_text("\n".join(seed_lines + bad) + "\n")
        before = lines_of(log)
        cmds = [tuner_cmd("analyze", str(log), "--no-plot"),
                tuner_cmd("show", "--log", str(log), "--workload", SPEC, "--layout", "NCHW8c", "--threads", "1"),
                tuner_cmd("distill", str(log), "-o", str(work / f"db{k}.jsonl")),
                [sys.executable, "-c", "import sys, tuner; tuner.build_op(sys.argv[1], layout='NCHW8c', threads=1, "
                 "log=sys.argv[2], use_shipped=False)", SPEC, str(log)],
                tune_cmd(log, len(seed_lines) + 4)]
        for cmd in cmds:
            out = run(cmd, env)
            row.runs += 1
            row.exit_codes[str(out.returncode)] += 1
            row.tracebacks += traceback_in(out.stderr)
            if cmd[3:4] == ["show"] and out.returncode == 0:
                shown = float(out.stdout.split(" GFLOPS")[0].rsplit(" ", 1)[1])
                if shown > best_gflops * 1.01:                  # a junk record taken as the best
                    row.bad_records += 1
                    row.notes.append(f"show: {shown} GFLOPS, the best valid record has {best_gflops:.1f}")
        audit(row, log, before)
        db = work / f"db{k}.jsonl"
        junk = [line for line in lines_of(db) if whole(line) and json.loads(line)["steps"] == [["split", "nope", "x", [1]]]]
        row.bad_records += len(junk)
        row.notes += [f"distill kept a junk record: {line[:200]}" for line in junk]
    return row


def case_hostile_specs(work: Path, env, args) -> Row:
    """Random workload specs and layouts: a workload or a one-line UserError, never a hang."""
    from tuner.errors import UserError
    from tuner.ops import resolve
    row, rng = Row("hostile specs"), random.Random(args.seed)
    keys = ["N", "C", "H", "W", "K", "R", "S", "stride", "pad", "dilation", "groups", "bias", "relu", "zz"]
    vals = ["-1", "0", "1", "3", "8", "1.2", "1.1.1", "-1.0", "x", "", "99999999999999999999", "100000", "1e3"]
    valid = {"conv2d": dict(C=8, H=8, W=8, K=8, R=3, S=3), "dense": dict(C=16, K=16), "max_pool2d": dict(
        C=8, H=8, W=8, R=2, S=2), "avg_pool2d": dict(C=8, H=8, W=8, R=2, S=2), "global_avg_pool2d": dict(C=8, H=4, W=4)}
    for _ in range(args.hostile_specs):
        op = rng.choice(["conv2d", "dense", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "nope", ""])
        params = {k: str(v) for k, v in valid.get(op, {}).items()} if rng.random() < 0.6 else {}
        for _ in range(rng.randint(0, 3 if params else 9)):     # a valid spec with a few values changed
            params[rng.choice(keys)] = rng.choice(vals)
        spec = f"{op}:" + ",".join(f"{k}={v}" for k, v in params.items())
        layout = rng.choice([None, "NCHW", "NHWC", "NCHW8c", "NCHW0c", "NCHW999c", "OI", "OI16o", "OI0o", "bad"])
        row.runs += 1
        signal.alarm(10)
        try:
            resolve(spec, layout)
            row.exit_codes["ok"] += 1
        except UserError as e:
            row.exit_codes["UserError"] += 1
            if "\n" in str(e) or not str(e):
                row.notes.append(f"not one line: {spec} {layout}: {e!r}")
        except Exception as e:  # noqa: BLE001 - what the suite counts
            row.tracebacks += 1
            row.notes.append(f"{spec} {layout}: {type(e).__name__}: {e}")
        finally:
            signal.alarm(0)
    for spec in ["conv2d:N=100000,C=100000,H=8,W=8,K=100000,R=3,S=3", "dense:N=1,C=8,K=99999999999999999999",
                 "conv2d:C=8,H=8,W=8,K=8,R=3,S=3,pad=-1", "dense:N=40000,C=40000,K=40000"]:
        out = run(tuner_cmd("tune", "--workload", spec, "--trials", "1", "--log", str(work / "spec.jsonl"),
                            "--no-progress"), env, timeout=60)
        row.runs += 1
        row.exit_codes[str(out.returncode)] += 1
        row.tracebacks += traceback_in(out.stderr)
        if out.returncode != 2 or len(out.stderr.strip().splitlines()) != 1:
            row.notes.append(f"{spec}: exit {out.returncode}: {out.stderr.strip()[-200:]}")
    return row


def case_hostile_onnx(work: Path, env, args) -> Row:
    """ONNX files with random Conv/MaxPool attributes: imported, or a one-line UserError."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tuner.errors import UserError
    from tuner.graph import load
    from tuner.graph.passes import optimize
    row, rng = Row("hostile ONNX attributes"), random.Random(args.seed)

    def ints():
        if rng.random() < 0.6:                                   # mostly sensible, sometimes not
            return [rng.choice([1, 2]) for _ in range(2)]
        return [rng.choice([-1, 0, 1, 2, 3, 7]) for _ in range(rng.choice([1, 2, 2, 2, 4, 5]))]
    for k in range(args.hostile_onnx):
        conv = {a: ints() for a in ("strides", "dilations", "kernel_shape") if rng.random() < 0.4}
        if rng.random() < 0.4:
            conv["pads"] = ints() * 2 if rng.random() < 0.7 else ints()
        if rng.random() < 0.3:
            conv["group"] = rng.choice([-1, 0, 1, 2, 3])
        pool = {"kernel_shape": ints(), **{a: ints() for a in ("strides", "pads") if rng.random() < 0.4}}
        w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", **conv),
                 helper.make_node("Relu", ["c"], ["r"], "relu"),
                 helper.make_node("MaxPool", ["r"], ["y"], "pool", **pool)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
        path = work / f"m{k}.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        row.runs += 1
        try:
            optimize(load(str(path)), layout="NCHW8c")
            row.exit_codes["ok"] += 1
        except UserError as e:
            row.exit_codes["UserError"] += 1
            if "\n" in str(e):
                row.notes.append(f"not one line: {e!r}")
        except Exception as e:  # noqa: BLE001 - what the suite counts
            row.tracebacks += 1
            row.notes.append(f"{conv} {pool}: {type(e).__name__}: {e}")
    return row


# ---------------------------------------------------------------- compiled models

def _ended(row: Row, out: subprocess.CompletedProcess, ok=(0, 2)) -> None:
    """Count how a `tuner` run over an artifact ended: signals, tracebacks, messages over one line."""
    row.runs += 1
    row.exit_codes[str(out.returncode)] += 1
    row.signals += out.returncode < 0
    row.tracebacks += traceback_in(out.stderr)
    if out.returncode == 2 and len(out.stderr.strip().splitlines()) != 1:
        row.notes.append(f"not one line: {out.stderr.strip()[:200]}")
    if out.returncode not in ok and out.returncode >= 0:
        row.notes.append(f"exit {out.returncode}: {out.stderr.strip()[-200:]}")


def _artifact(work: Path, env) -> tuple:
    """(a compiled tiny, its output for `tuner run --random`) made once per fault run."""
    art = work / "art"
    if not (art / "model.json").exists():
        subprocess.run(tuner_cmd("compile", "tiny", "--threads", "1", "-o", str(art)), env=env, check=True,
                       capture_output=True)
        subprocess.run(tuner_cmd("run", str(art), "--random", "-o", str(work / "want.npy")), env=env, check=True,
                       capture_output=True)
    import numpy as np
    return art, np.load(work / "want.npy")


INPUTS = r"""
import sys, threading, numpy as np, tuner
from tuner.graph.models import tiny
layout, threads = sys.argv[1], int(sys.argv[2])
m = tuner.compile(tiny(), threads=1, layout=layout, use_shipped=False)
x = m.random_inputs(3)[0]
want = m.run(x)[0]
big = np.zeros((1, 3, 32, 32), np.float32); big[:, :, ::2, ::2] = x
kinds = {"transposed": np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2), "sliced": big[:, :, ::2, ::2],
         "fortran": np.asfortranarray(x), "negative": np.ascontiguousarray(x[..., ::-1])[..., ::-1],
         "big-endian": x.astype(">f4")}
bad = [k for k, v in kinds.items() for _ in range(3) if not np.array_equal(m.run(v)[0], want)]
xs = [m.random_inputs(s)[0] for s in range(threads)]
ys = [m.run(v)[0] for v in xs]
def hammer(k):
    for i in range(100):
        j = (k + i) % threads
        if not np.array_equal(m.run(xs[j])[0], ys[j]):
            bad.append(f"thread {k}")
ts = [threading.Thread(target=hammer, args=(k,)) for k in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print(len(bad), len(kinds) * 3 + 100 * threads, " ".join(sorted(set(bad))))
"""


def case_model_inputs(work: Path, env, args) -> Row:
    """Non-contiguous inputs of each kind in each layout, and 2-8 threads running one model at once."""
    row = Row("odd input memory, 2-8 threads per model")
    for layout, threads in (("NCHW", 2), ("NHWC", 4), ("NCHW8c", 8)):
        out = run([sys.executable, "-c", INPUTS, layout, str(threads)], env)
        _ended(row, out, ok=(0,))
        if out.returncode == 0:
            wrong, total, which = (out.stdout.split(maxsplit=2) + [""])[:3]
            row.wrong_outputs += int(wrong)
            if int(wrong):
                row.notes.append(f"{layout}: {wrong} of {total} runs wrong ({which.strip()})")
    return row


def _fuzz_value(rng: random.Random, v):
    choices = [None, True, -1, 0, 4, -100, 2**40, 1e300, "", "../x.so", "/etc/passwd", [], {}, [1], {"name": 1}]
    if isinstance(v, int) and not isinstance(v, bool):
        choices += [v + rng.choice([-64, -1, 1, 64]), v * 2, v // 2]
    if isinstance(v, list) and v:
        return [_fuzz_value(rng, v[0])] + v[1:] if rng.random() < 0.5 else v[:-1]
    if isinstance(v, dict) and v:
        k = rng.choice(sorted(v))
        return {**v, k: _fuzz_value(rng, v[k])}
    return rng.choice(choices)


def case_model_json(work: Path, env, args) -> Row:
    """Every field of model.json damaged at random, and every file of the artifact swapped or cut:
    `tuner run` prints the right output or says in one line that the artifact is damaged."""
    import numpy as np
    row, rng = Row("damaged model.json / artifact files"), random.Random(args.seed)
    art, want = _artifact(work, env)
    other = work / "other"
    if not other.exists():
        shutil.copytree(art, other)
        meta = json.loads((other / "model.json").read_text())
        w = np.fromfile(other / "weights.bin", np.uint8)
        (other / "weights.bin").write_bytes((w[::-1]).tobytes())     # another model's weights of the same size
    files = sorted(p.name for p in art.iterdir())
    for k in range(args.hostile_artifacts):
        bad = work / f"bad{k}"
        shutil.copytree(art, bad)
        meta = json.loads((bad / "model.json").read_text())
        if k % 3:
            key = rng.choice(sorted(meta))
            meta[key] = _fuzz_value(rng, meta[key])
            (bad / "model.json").write_text(json.dumps(meta))
        else:
            name = rng.choice(files)
            data = (bad / name).read_bytes()
            how = rng.choice(["truncate", "empty", "swap", "remove"])
            if how == "remove":
                (bad / name).unlink()
            else:
                (bad / name).write_bytes({"truncate": data[:len(data) // 2], "empty": b"",
                                          "swap": (other / name).read_bytes() if (other / name).exists() else b"x"}[how])
        out = run(tuner_cmd("run", str(bad), "--random", "-o", str(bad / "y.npy")), env, timeout=120)
        _ended(row, out)
        if out.returncode == 0 and not np.array_equal(np.load(bad / "y.npy"), want):
            row.wrong_outputs += 1
            row.notes.append(f"damage {k} gave another output: {(bad / 'model.json').read_text()[:160]}")
        shutil.rmtree(bad, ignore_errors=True)
    return row


def case_compile_into(work: Path, env, args) -> Row:
    """`tuner compile -o` into a directory of someone's files, one holding a link, a link itself and an
    artifact: the first three refused with nothing touched, the last replaced whole."""
    row = Row("compile into existing / linked dirs")
    precious = work / "precious.txt"
    for k in range(max(1, args.stops // 5)):
        precious.write_text("keep me")
        mine, linked, link, again = (work / f"{n}{k}" for n in ("mine", "linked", "link", "again"))
        mine.mkdir()
        (mine / "model.c").write_text("my code")
        shutil.copytree(_artifact(work, env)[0], linked)
        (linked / "weights.bin").unlink()
        (linked / "weights.bin").symlink_to(precious)
        link.symlink_to(work / f"elsewhere{k}", target_is_directory=True)
        shutil.copytree(_artifact(work, env)[0], again)
        for d, code in ((mine, 2), (linked, 2), (link, 2), (again, 0)):
            out = run(tuner_cmd("compile", "tiny", "--threads", "1", "-o", str(d)), env)
            _ended(row, out)
            if out.returncode != code:
                row.notes.append(f"-o {d.name}: exit {out.returncode}, expected {code}")
        touched = [precious.read_text() != "keep me", (mine / "model.c").read_text() != "my code",
                   (work / f"elsewhere{k}").exists(), not (again / "model.json").exists()]
        row.wrong_outputs += sum(touched)
    return row


PLANT = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) { FILE* f = fopen(getenv("PLANT_MARK"), "w"); if (f) fclose(f); }
"""

BUILD = ("import sys, numpy as np, tuner\nfrom tuner.ops import resolve\n"
         "wl = resolve(sys.argv[1], 'NCHW8c')\nk = tuner.build_op(wl, threads=1, use_shipped=False, quiet=True)\n"
         "x = wl.random_inputs(seed=1)\nassert np.allclose(k(*x), wl.reference(x), rtol=1e-3, atol=1e-3)\n")


def case_cache(work: Path, env, args) -> Row:
    """A planted library under a cached name, a truncated one and an empty one: never loaded, rebuilt."""
    row = Row("planted / truncated / empty cache library")
    cache = work / "plantcache"
    env = dict(env, TUNER_CACHE_DIR=str(cache), PLANT_MARK=str(work / "planted-ran"))
    (work / "plant.c").write_text(PLANT)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(work / "plant.so"), str(work / "plant.c")], check=True)
    for k in range(max(1, args.stops // 2)):
        for how in ("planted", "truncated", "empty"):
            first = run([sys.executable, "-c", BUILD, SPEC], env)
            libs = sorted((cache / "kernels").glob("*.so"))
            if first.returncode or not libs:
                row.notes.append(f"first build failed: {first.stderr[-200:]}")
                continue
            lib = libs[0]
            data = {"planted": (work / "plant.so").read_bytes(), "truncated": lib.read_bytes()[:2000],
                    "empty": b""}[how]
            lib.unlink()
            lib.write_bytes(data)
            out = run([sys.executable, "-c", BUILD, SPEC], env)
            row.runs += 1
            row.exit_codes[str(out.returncode)] += 1
            row.tracebacks += traceback_in(out.stderr)
            row.bad_records += (work / "planted-ran").exists()
    return row


# ---------------------------------------------------------------- a hostile cluster

ROGUE = r"""
import sys
import tuner.measure.cluster as C
real = C._measure_on_worker

def forged(*args, **kwargs):
    results, busy, build_busy = real(*args, **kwargs)
    for r in results:
        if r.ok:
            r.costs, r.host = [1e-12] * len(r.costs), "trusted-host"
    return results, busy, build_busy
C._measure_on_worker = forged
from tuner.cli import main
sys.exit(main(["worker", sys.argv[1], "--measure", "--threads", "1"]))
"""

PLANT_MARKED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
  const char* p = getenv("PLANT_MARK"); FILE* f = p ? fopen(p, "w") : 0; if (f) fclose(f);
}
"""


def _worker_on_a_scheduler(row: Row, argv: list, env):
    """(a loopback Dask scheduler with a worker started as `argv` + its address, the worker process),
    or None (noted) without Dask's distributed or when the worker does not join."""
    try:
        from distributed import Client

        from tuner.measure.cluster import local_cluster
    except ImportError:
        row.notes.append("Dask's distributed is not installed: case skipped")
        return None
    cluster = local_cluster(0, {})
    proc = subprocess.Popen(argv + [cluster.scheduler_address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    try:
        with Client(cluster.scheduler_address) as client:
            client.wait_for_workers(1, timeout=60)
    except (OSError, TimeoutError) as e:
        proc.kill()
        cluster.close()
        row.notes.append(f"the worker did not join: {e}: {proc.communicate()[0][-200:]}")
        return None
    return cluster, proc


def _stop(cluster, proc) -> None:
    proc.terminate()
    proc.communicate(timeout=30)
    cluster.close()


def case_rogue_worker(work: Path, env, args) -> Row:
    """A measuring worker that times its jobs, then reports 1e-12 s per call from a forged host:
    every such record logged as valid is a wrong output."""
    row = Row("rogue worker (forged timings)")
    started = _worker_on_a_scheduler(row, [sys.executable, "-c", ROGUE], env)
    if started is None:
        return row
    try:
        for k in range(max(1, args.stops // 5)):
            log = work / f"rogue{k}.jsonl"
            out = run(tune_cmd(log, 4) + ["--cluster", started[0].scheduler_address], env, timeout=120)
            row.runs += 1
            row.exit_codes[str(out.returncode)] += 1
            row.tracebacks += traceback_in(out.stderr)
            recs = [json.loads(line) for line in lines_of(log) if whole(line)]
            row.wrong_outputs += sum(1 for r in recs if r["error"] == "OK")
            if len(recs) != 4:
                row.notes.append(f"{len(recs)} records of 4: {out.stderr.strip()[-200:]}")
    finally:
        _stop(*started)
    return row


def case_planted_through_cluster(work: Path, env, args) -> Row:
    """A client of the cluster sends a measuring job whose library is named for the kernel a later
    build on the worker's host compiles, but holds a constructor of its own: a wrong output if it
    is left in that host's kernel cache, or if the later build loads it."""
    from tuner.measure.cluster import _measure_on_worker, measure_resource
    from tuner.measure.runner import RunConfig
    from tuner.ops import resolve
    from tuner.target import parse_target
    from tuner.task import Task
    from tuner.toolchain.library import content_hash
    row, cache, mark = Row("library planted through the cluster"), work / "plantcluster", work / "plant-cluster-ran"
    env = dict(env, TUNER_CACHE_DIR=str(cache))
    first = run([sys.executable, "-c", BUILD, SPEC], env)
    libs = sorted((cache / "kernels").glob("*.so"))
    if first.returncode or len(libs) != 1:
        row.notes.append(f"first build failed: {first.stderr[-200:]}")
        return row
    digest = libs[0].name.split("-")[0]                  # what the later build looks up
    (work / "plantm.c").write_text(PLANT_MARKED)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(work / "plantm.so"), str(work / "plantm.c")], check=True)
    data = (work / "plantm.so").read_bytes()
    name = f"{digest}-{content_hash(data)}.so"
    started = _worker_on_a_scheduler(row, tuner_cmd("worker", "--measure", "--threads", "1"), env)
    if started is None:
        return row
    target = parse_target("cpu", 1)
    task = Task(resolve(SPEC, "NCHW8c"), target)
    cand = task.candidate(task.space.steps(task.space.default()))
    try:
        from distributed import Client
        with Client(started[0].scheduler_address) as client:
            for _ in range(max(1, args.stops // 5)):
                for lib in (cache / "kernels").glob("*.so"):
                    lib.unlink()                         # the planted name would be the only one
                job = client.submit(_measure_on_worker, SPEC, "NCHW8c", str(target), [cand], RunConfig(), None,
                                    ({name: data}, [(name, 0, None, 0.1)], 0.1),
                                    resources={measure_resource(target): 1}, pure=False)
                try:
                    job.result(timeout=120)
                except Exception as e:  # noqa: BLE001 - a refusal is fine; what is left behind is counted
                    row.notes.append(f"job: {type(e).__name__}: {str(e)[:120]}")
                row.runs += 1
                row.wrong_outputs += bool(list(cache.rglob(name)))
                later = run([sys.executable, "-c", BUILD, SPEC], dict(env, PLANT_MARK=str(mark)))
                row.exit_codes[str(later.returncode)] += 1
                row.tracebacks += traceback_in(later.stderr)
                row.wrong_outputs += mark.exists()
                mark.unlink(missing_ok=True)
    finally:
        _stop(*started)
    return row


def case_no_tls(work: Path, env, args) -> Row:
    """A scheduler on another machine named without TLS or --insecure: refused before any
    connection, exit 2 with one line; a run that is not counts as a wrong output (the door open)."""
    row = Row("worker reached without TLS")
    for cmd in (tuner_cmd("worker", "tcp://192.0.2.1:8786", "--measure", "--threads", "1"),
                tuner_cmd("worker", "192.0.2.1:8786", "--build"),
                tune_cmd(work / "notls.jsonl", 4) + ["--cluster", "tcp://192.0.2.1:8786"]):
        out = run(cmd, env, timeout=60)
        row.runs += 1
        row.exit_codes[str(out.returncode)] += 1
        row.tracebacks += traceback_in(out.stderr)
        lines = out.stderr.strip().splitlines()
        if out.returncode != 2 or len(lines) != 1 or "TLS" not in out.stderr:
            row.wrong_outputs += 1
            row.notes.append(f"{' '.join(cmd[3:5])}: exit {out.returncode}: {out.stderr.strip()[-200:]}")
    return row


def case_nan_inf(work: Path, env, args) -> Row:
    """NaN/Inf inputs against ONNX Runtime: a model of every operator that can meet a NaN (Conv+Relu,
    Conv+Clip, MaxPool, AveragePool, Add+HardSwish, Sigmoid, GlobalAveragePool+Gemm+Softmax, and a
    Conv and a Gemm whose weights hold a NaN and an Inf), compiled in three layouts, on inputs with
    NaN, +Inf and -Inf at random places (some all NaN, some all infinite). A run is a wrong output
    when a NaN mask differs from ONNX Runtime's or a finite value is not close. MaxPool is held to
    NumPy (NaN wherever its window holds one): ONNX Runtime's keeps a NaN only when it is the last
    of its window, so only its NaNs must be among ours."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from tuner.graph import load
    from tuner.graph.interp import run as interpret
    row, rng = Row("NaN/Inf inputs against ONNX Runtime"), np.random.default_rng(args.seed)
    script = ("import sys, numpy as np, tuner\n"
              "m = tuner.compile(sys.argv[1], use_shipped=False, threads=1, layout=sys.argv[2])\n"
              "xs = np.load(sys.argv[3])\n"
              "np.savez(sys.argv[4], **{f'{k}__{j}': y for k in xs.files for j, y in enumerate(m.run(xs[k]))})\n")
    c, h = 8, 6

    def u(*shape):
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)
    w3, g2 = u(c, c, 3, 3), u(4, c)
    w3[2, 3, 1, 1], w3[5, 1, 1, 1], g2[1, 3] = np.nan, np.inf, np.nan     # centre taps: see tests/test_nan.py
    consts = {"w1": u(c, c, 3, 3), "b1": u(c), "w2": u(c, c, 1, 1), "g": u(4, c), "gb": u(4), "w3": w3, "g2": g2,
              "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["relu"]),
             n("Conv", ["x", "w2"], ["c2"]), n("Clip", ["c2", "lo", "hi"], ["clip"]),
             n("MaxPool", ["x"], ["maxpool"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             n("AveragePool", ["x"], ["avgpool"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Add", ["x", "relu"], ["add"]), n("HardSwish", ["add"], ["hswish"]), n("Sigmoid", ["x"], ["sig"]),
             n("GlobalAveragePool", ["x"], ["gap"]), n("Flatten", ["gap"], ["flat"]),
             n("Gemm", ["flat", "g", "gb"], ["gemm"], transB=1), n("Softmax", ["gemm"], ["softmax"], axis=1),
             n("Conv", ["x", "w3"], ["c3"], pads=[1, 1, 1, 1]), n("Relu", ["c3"], ["nan_weights"]),
             n("Gemm", ["flat", "g2"], ["gemm_nan_weights"], transB=1)]
    outs = ["relu", "clip", "maxpool", "avgpool", "hswish", "sig", "softmax", "nan_weights", "gemm_nan_weights"]
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    path = work / "nan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    g = load(str(path))

    def inputs() -> dict:
        xs = {}
        for k in range(max(4, 2 * args.stops)):
            x = rng.uniform(-1, 1, (1, c, h, h)).astype(np.float32)
            if k % 8 == 0:
                x[:] = np.nan
            elif k % 8 == 1:
                x[:] = rng.choice([np.inf, -np.inf])
            else:
                for v in (np.nan, np.inf, -np.inf):
                    x.reshape(-1)[rng.choice(x.size, int(rng.integers(0, 4)), replace=False)] = v
            xs[f"x{k}"] = x
        return xs

    def differs(ours, ref) -> bool:
        keep = ~np.isnan(ref)
        return (ours.shape != ref.shape or not np.array_equal(np.isnan(ours), np.isnan(ref))
                or not np.allclose(ours[keep], ref[keep], rtol=1e-4, atol=1e-5))

    for layout in ("NCHW", "NHWC", "NCHW8c"):
        xs = inputs()
        np.savez(work / "nan_in.npz", **xs)
        out = run([sys.executable, "-c", script, str(path), layout, str(work / "nan_in.npz"),
                   str(work / "nan_out.npz")], env)
        row.exit_codes[str(out.returncode)] += 1
        row.tracebacks += traceback_in(out.stderr)
        row.signals += out.returncode < 0
        got = np.load(work / "nan_out.npz") if out.returncode == 0 else None
        for k, x in xs.items():
            row.runs += 1
            if got is None:
                row.wrong_outputs += 1
                continue
            ref = dict(zip(outs, sess.run(outs, {"x": x})))
            with np.errstate(invalid="ignore", over="ignore"):
                numpy_ref = dict(zip(outs, interpret(g, x)))
            wrong = []
            for j, o in enumerate(outs):
                ours = got[f"{k}__{j}"]
                if o == "maxpool":
                    if differs(ours, numpy_ref[o]) or (np.isnan(ref[o]) & ~np.isnan(ours)).any():
                        wrong.append(o)
                elif differs(ours, ref[o]):
                    wrong.append(o)
            if wrong:
                row.wrong_outputs += 1
                row.notes.append(f"{layout} {k} (NaN {int(np.isnan(x).sum())}, Inf {int(np.isinf(x).sum())}): "
                                 f"{', '.join(wrong)} differ")
    return row


CASES = {"sigkill": case_sigkill, "sigterm": case_signal(signal.SIGTERM), "sigint": case_signal(signal.SIGINT),
         "concurrent-2": case_concurrent(2), "concurrent-3": case_concurrent(3), "two-workloads": case_two_workloads,
         "disk-full": case_disk_full, "cache-full": case_cache_full, "worker-killed": case_worker_killed,
         "hung": case_hung, "hostile-records": case_hostile_records, "hostile-specs": case_hostile_specs,
         "hostile-onnx": case_hostile_onnx, "cache": case_cache, "model-inputs": case_model_inputs,
         "model-json": case_model_json, "compile-into": case_compile_into, "rogue-worker": case_rogue_worker,
         "planted-cluster": case_planted_through_cluster, "no-tls": case_no_tls, "nan-inf": case_nan_inf}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--kills", type=int, default=50, help="SIGKILLs at random moments")
    ap.add_argument("--stops", type=int, default=10, help="runs of the other process faults")
    ap.add_argument("--hostile-logs", type=int, default=5)
    ap.add_argument("--hostile-specs", type=int, default=500)
    ap.add_argument("--hostile-onnx", type=int, default=200)
    ap.add_argument("--hostile-artifacts", type=int, default=60, help="damaged artifacts run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tuner-faults-"))
    env = dict(os.environ, TUNER_CACHE_DIR=str(work / "cache"))
    seed = run(tune_cmd(work / "seed.jsonl", 8), env)        # a few real records to start logs from
    if seed.returncode:
        print(seed.stderr)
        return 1
    rows = []
    head = ["case", "runs", "lost", "dup", "torn", "overrun", "orphans", "tracebacks", "bad recs", "wrong out",
            "signals", "exit codes"]
    print("  ".join(f"{h:>10}" if k else f"{h:<40}" for k, h in enumerate(head)))
    for name in args.cases.split(","):
        t0 = time.perf_counter()
        row = CASES[name](work, env, args)
        rows.append(row)
        codes = " ".join(f"{k}:{v}" for k, v in sorted(row.exit_codes.items()))
        print(f"{row.case:<40}" + "".join(f"  {v:>10}" for v in (row.runs, row.lost, row.duplicated, row.torn,
                                                                 row.overrun, row.orphans, row.tracebacks,
                                                                 row.bad_records, row.wrong_outputs,
                                                                 row.signals)) + f"  {codes}"
              + f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
        for note in row.notes[:5]:
            print(f"    note: {note}")
    losses = sum(r.lost + r.duplicated + r.torn + r.overrun + r.orphans + r.tracebacks + r.bad_records
                 + r.wrong_outputs + r.signals for r in rows)
    print(f"\n{'every loss column is 0' if not losses else f'{losses} failures in the loss columns'}")
    write_results("faults", args.out, {"args": vars(args), "rows": [
        {**asdict(r), "exit_codes": dict(r.exit_codes)} for r in rows]})
    shutil.rmtree(work, ignore_errors=True)
    return 0 if not losses else 1


if __name__ == "__main__":
    sys.exit(main())
