"""The command line: the verbs a user types, and one-line errors (exit 2) for bad input."""
import subprocess
import sys

import pytest

SMALL = "conv2d:N=1,C=8,H=6,W=6,K=8,R=3,S=3,stride=1,pad=1"


def tuner(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_workloads_lists_the_builtin_set():
    out = tuner("workloads")
    assert out.returncode == 0
    assert "r50.s1.conv3x3" in out.stdout and "mbv2.dw32.112s1" in out.stdout and "dense.2048x1000" in out.stdout


@pytest.mark.slow
def test_tune_analyze_show(tmp_path):
    log = tmp_path / "conv.jsonl"
    out = tuner("tune", "--workload", SMALL, "--layout", "NHWC", "--threads", "1", "--trials", "4",
                "--log", str(log), "--no-progress", "--repeat", "1", "--min-repeat-ms", "0.5")
    assert out.returncode == 0, out.stderr
    assert "4 trials in the log" in out.stdout and "GFLOPS" in out.stdout and str(log) in out.stdout

    rep = tuner("analyze", str(log))
    assert rep.returncode == 0, rep.stderr
    assert "conv2d:N=1,C=8" in rep.stdout and "NHWC" in rep.stdout
    assert (tmp_path / "conv.png").stat().st_size > 1000

    show = tuner("show", "--log", str(log), "--workload", SMALL, "--layout", "NHWC", "--threads", "1", "--code")
    assert show.returncode == 0, show.stderr
    assert '["cache_write", "conv"]' in show.stdout
    assert "matches the logged code hash" in show.stdout and "int kernel(float** restrict args)" in show.stdout


@pytest.mark.slow
def test_an_operator_tune_can_time_its_weights_cold(tmp_path):
    """--weights cold on an operator tune evicts the weights before every timed call, as a model tune
    does by default; its records and its summary line say so."""
    import json
    log = tmp_path / "cold.jsonl"
    out = tuner("tune", "--workload", SMALL, "--layout", "NHWC", "--threads", "1", "--trials", "3", "--weights",
                "cold", "--log", str(log), "--no-progress", "--repeat", "1", "--min-repeat-ms", "0.5")
    assert out.returncode == 0, out.stderr
    assert "(weights cold)" in out.stdout
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert len(lines) == 3 and all(ln["weights"] == "cold" for ln in lines)


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["tune", "--workload", "r50.nope"], "unknown workload"),
    (["tune", "--workload", SMALL, "--layout", "NCWH"], "unknown layout"),
    (["tune", "--workload", SMALL, "--target", "tpu"], "unknown target 'tpu'"),
    (["tune", "--workload", "conv2d:C=3"], "needs H, W, K, R, S"),
    (["analyze", "/nonexistent/log.jsonl"], "no log at"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, message):
    out = tuner(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_ctrl_c_keeps_the_log_intact_and_the_same_command_resumes(tmp_path):
    import json
    import signal

    from conftest import start_tune
    log = tmp_path / "int.jsonl"
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--workload", SMALL, "--layout", "NCHW8c", "--threads", "1",
           "--trials", "400", "--batch-size", "4", "--log", str(log), "--no-progress", "--repeat", "1",
           "--min-repeat-ms", "0.5"]
    proc = start_tune(cmd, log, 6)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "run the same command again to resume" in out
    lines = log.read_text().splitlines()
    recs = [json.loads(line) for line in lines]          # every line is a whole record
    assert len(recs) >= 6 and all(r["error"] == "OK" for r in recs), [r["message"] for r in recs]
    resumed = tuner(*cmd[3:cmd.index("--trials")], "--trials", str(len(recs) + 2), *cmd[cmd.index("--trials") + 2:])
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(recs) + 2} trials in the log (2 new" in resumed.stdout
