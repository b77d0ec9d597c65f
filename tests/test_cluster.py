"""Measuring on a Dask cluster: local clusters of worker processes, a few seconds each."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("distributed", reason="Dask's distributed is not installed (pip install -e '.[cluster]')")

from conftest import REPLAY_LOG, REPLAY_TARGET, REPLAY_WORKLOADS, TARGET1  # noqa: E402

from tuner.database import records  # noqa: E402
from tuner.errors import SetupError, UserError  # noqa: E402
from tuner.measure.cluster import ClusterRunner, local_cluster, measure_resource  # noqa: E402
from tuner.measure.replay import ReplayRunner  # noqa: E402
from tuner.target import TargetError, parse_target  # noqa: E402
from tuner.task import Task  # noqa: E402
from tuner.tuning import tune  # noqa: E402

pytestmark = pytest.mark.cluster

SMALL = REPLAY_WORKLOADS[0][0]


def _lines(path) -> list:
    return [(r.code_hash, r.costs, r.error) for r in records.load(str(path), warn=False).records]


def _replay_target():
    try:
        return parse_target(REPLAY_TARGET)
    except TargetError:
        pytest.skip(f"the replay log is for {REPLAY_TARGET}, which this host cannot read back")


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["random", "evolutionary"])
@pytest.mark.parametrize("ahead", [0, 1])
def test_a_tune_through_the_cluster_logs_what_a_local_tune_logs(policy, ahead, tmp_path):
    """Proposing `ahead` changes what an evolutionary search proposes (without the last batch's
    results), so each is compared with a local replayed tune that proposes as far ahead."""
    target = _replay_target()
    kw = dict(target=target, trials=24, policy=policy, progress=False, batch_size=8, cost_model_from=["none"])
    tune([SMALL], log=str(tmp_path / "here.jsonl"), runner=ReplayRunner(str(REPLAY_LOG), ahead=ahead), **kw)
    with ClusterRunner("local:2", target, replay=str(REPLAY_LOG), ahead=ahead) as runner:
        assert len(runner.measuring_workers()) == 2           # joined before the first batch is sent
        session = tune([SMALL], log=str(tmp_path / "there.jsonl"), runner=runner, **kw)
    here, there = _lines(tmp_path / "here.jsonl"), _lines(tmp_path / "there.jsonl")
    assert len(here) == 24 and session.new == 24
    assert there == here


def test_a_tune_sends_the_next_batch_before_reading_this_ones_results(tmp_path):
    """ahead=1: batch k+1 is proposed and sent while batch k is measured, never more than one
    beyond; ahead=0 (one machine): each batch after the previous one's results are in; both stop at
    the budget exactly, the budget counting the batches in flight."""
    events = []

    class Tracing(ReplayRunner):
        def measure(self, task, batch):
            n = len([e for e in events if e[0] == "send"])
            events.append(("send", n))

            def results():
                for k, item in enumerate(ReplayRunner.measure(self, task, batch)):
                    if k == 0:
                        events.append(("read", n))
                    yield item
            return results()

    target = _replay_target()
    for ahead, expected in ((0, ["send", 0, "read", 0, "send", 1, "read", 1, "send", 2, "read", 2]),
                            (1, ["send", 0, "send", 1, "read", 0, "send", 2, "read", 1, "read", 2])):
        events.clear()
        log = tmp_path / f"a{ahead}.jsonl"
        s = tune([SMALL], target=target, trials=24, log=str(log), policy="random", progress=False, batch_size=8,
                 runner=Tracing(str(REPLAY_LOG), ahead=ahead))
        assert [x for e in events for x in e] == expected
        assert s.new == 24 and len(records.load(str(log), warn=False).records) == 24


@pytest.mark.slow
def test_build_workers_build_and_measuring_workers_time(tmp_path, tmp_cache):
    """local:1+1: every candidate compiled by the build worker, its library shipped to the measuring
    worker, checked against the reference there and timed."""
    log = tmp_path / "b.jsonl"
    with ClusterRunner("local:1+1", TARGET1) as runner:
        assert len(runner.build_workers()) == 1 and len(runner.measuring_workers()) == 1
        s = tune([SMALL], target=TARGET1, trials=8, log=str(log), progress=False, batch_size=4, runner=runner)
        assert runner.build_busy_s > 0 and runner.busy_s > 0
        assert "1 measuring" in runner.status() and "1 building" in runner.status()
    recs = records.load(str(log), warn=False).records
    assert s.new == 8 and len(recs) == 8 and len({r.code_hash for r in recs}) == 8
    assert all(r.ok and r.host for r in recs), [r.message for r in recs if not r.ok]


def test_a_shipped_library_is_refused_unless_its_bytes_match_its_name(tmp_cache):
    from tuner.measure.cluster import _unpack, job_dir
    from tuner.toolchain.library import content_hash
    good = b"\x7fELF not really"
    name = f"{'a' * 24}-{content_hash(good)}.so"
    job = job_dir()
    (b,) = _unpack(({name: good}, [(name, 3, None, 0.5)], 1.0), job)
    assert b.lib == str(job / name) and b.index == 3 and open(b.lib, "rb").read() == good
    assert not (tmp_cache / "kernels" / name).exists()             # the job's own directory, not the cache
    with pytest.raises(RuntimeError, match="does not hold the bytes"):
        _unpack(({f"{'b' * 24}-{content_hash(good)}.so": good + b"!"}, [], 1.0), job)
    with pytest.raises(RuntimeError, match="not a name the builder gives"):
        _unpack(({"../../evil.so": good}, [], 1.0), job)
    (failed,) = _unpack(({}, [(None, 0, "error: x", 0.1)], 1.0), job)
    assert failed.lib is None and failed.error == "error: x"


@pytest.mark.parametrize("address", ["local:0", "local:x", "local:1+", "local:-1", "local:1+1+1"])
def test_a_bad_local_cluster_is_one_line(address):
    with pytest.raises(UserError, match=f"--cluster '{re.escape(address)}': give local:M"):
        ClusterRunner(address, TARGET1)


@pytest.mark.slow
def test_records_name_the_host_that_measured_them(tmp_path, tmp_cache):
    log = tmp_path / "x.jsonl"
    tune([SMALL], target=TARGET1, trials=4, log=str(log), cluster="local:1", progress=False, batch_size=4)
    recs = records.load(str(log), warn=False).records
    assert len(recs) == 4 and all(r.ok and r.host for r in recs)


@pytest.mark.slow
def test_a_task_no_worker_can_measure_is_reported(tmp_path):
    cuda = parse_target("cuda -arch=sm_90")
    with local_cluster(1, {measure_resource(cuda): 1}) as cluster:
        with pytest.raises(SetupError, match=r"no worker of the cluster measures for cpu .*tuner worker"):
            tune([SMALL], target=TARGET1, trials=4, log=str(tmp_path / "x.jsonl"), cluster=cluster.scheduler_address,
                 progress=False)


@pytest.mark.slow
def test_an_unreachable_scheduler_is_one_line():
    with pytest.raises(SetupError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9") as e:
        ClusterRunner("tcp://127.0.0.1:9", TARGET1)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_killed_worker_loses_no_record_and_duplicates_none(tmp_path, tmp_cache):
    from distributed import Client
    log = tmp_path / "k.jsonl"
    with local_cluster(2, {measure_resource(TARGET1): 1}) as cluster, Client(cluster) as client:
        pids = client.run(os.getpid)
        th, errors = _tune_until(log, 4, cluster=cluster.scheduler_address, batch_size=8)
        os.kill(next(iter(pids.values())), signal.SIGKILL)
        th.join(120)
    _all_24_once(log, th, errors)


def _tune_until(log, n: int, **kw) -> tuple:
    """A 24-trial tune of SMALL started in a thread, returned once `log` holds n records (still
    running); (the thread, the errors it met)."""
    errors = []

    def run():
        try:
            tune([SMALL], target=TARGET1, trials=24, log=str(log), progress=False, **kw)
        except BaseException as e:      # noqa: BLE001  (reported by _all_24_once)
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    deadline = time.time() + 60
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < n):
        time.sleep(0.02)
    assert th.is_alive()                            # the fault comes mid-tune
    return th, errors


def _all_24_once(log, th, errors):
    assert not errors and not th.is_alive()
    recs = records.load(str(log), warn=False).records
    assert len(recs) == 24 and len({r.code_hash for r in recs}) == 24
    assert all(r.ok for r in recs), [r.message for r in recs if not r.ok]


@pytest.mark.slow
def test_stopping_midway_cancels_what_is_left(tmp_cache):
    task = Task(SMALL, TARGET1)
    batch = [task.from_decisions(task.space.sample(__import__("random").Random(k))) for k in range(6)]
    with ClusterRunner("local:1", TARGET1) as runner:
        gen = runner.measure(task, batch)
        cand, res = next(gen)
        assert cand is batch[0] and res.ok
        gen.close()                                     # what a Ctrl-C or a time limit does
        left = None
        for _ in range(100):
            left = runner.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
            if left == 0:
                break
            time.sleep(0.05)
        assert left == 0


@pytest.mark.slow
def test_a_model_tune_through_the_cluster_logs_and_plans_what_a_local_one_does(tmp_path):
    """Every task of a small model (convs, pools and layout transforms) goes through the workers;
    the records and the plan are those of a local replayed tune proposing as far ahead."""
    from conftest import MODEL_REPLAY, MODEL_REPLAY_LOG

    from tuner.model_tuning import tune_model
    target = _replay_target()
    kw = dict(target=REPLAY_TARGET, policy="random", progress=False, **MODEL_REPLAY)
    here = tune_model(log=str(tmp_path / "here.jsonl"), runner=ReplayRunner(str(MODEL_REPLAY_LOG), ahead=1), **kw)
    with ClusterRunner("local:2", target, replay=str(MODEL_REPLAY_LOG)) as runner:
        there = tune_model(log=str(tmp_path / "there.jsonl"), runner=runner, **kw)
    a, b = _lines(tmp_path / "here.jsonl"), _lines(tmp_path / "there.jsonl")
    assert len(a) == MODEL_REPLAY["trials"] and b == a
    ops = {r.workload.spec.split(":")[0] for r in records.load(str(tmp_path / "there.jsonl"), warn=False).records}
    assert {"conv2d", "max_pool2d", "layout_transform"} <= ops
    assert there.plan.layouts == here.plan.layouts


@pytest.mark.parametrize("argv, says", [
    (["--measure", "--build"], "say what this worker does: --measure"),
    ([], "say what this worker does: --measure"),
    (["--build", "--jobs", "0"], "--jobs 0: give at least 1"),
    (["--build", "--threads", "2"], "a build worker (--build) compiles for whichever target"),
    (["--measure", "--jobs", "2"], "--jobs sets a build worker's compiler calls"),
])
def test_a_worker_without_one_role_is_one_line(argv, says, capsys):
    from tuner.cli import main
    assert main(["worker", "tcp://127.0.0.1:9", *argv]) != 0
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_tune_on_a_bad_local_cluster_is_one_line(capsys):
    from tuner.cli import main
    assert main(["tune", "--workload", "r50.s1.conv1x1a", "--layout", "NCHW8c", "--cluster", "local:two",
                 "--trials", "4", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "--cluster 'local:two': give local:M" in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_cluster_sends_enough_batches_ahead_to_give_every_worker_a_job(tmp_path):
    """Batches of one candidate on two measuring workers: two batches beyond the one being read."""
    target = _replay_target()
    task = Task(SMALL, target)
    cand = task.from_decisions(task.space.sample(__import__("random").Random(0)))
    with ClusterRunner("local:2", target, replay=str(REPLAY_LOG)) as runner:
        assert runner.ahead == 1                        # nothing sent yet
        assert len(list(runner.measure(task, [cand]))) == 1
        assert runner.ahead == 2
        s = tune([SMALL], target=target, trials=6, log=str(tmp_path / "one.jsonl"), policy="random", progress=False,
                 batch_size=1, runner=runner)
        assert s.new == 6


@pytest.mark.slow
def test_a_tune_whose_only_build_worker_leaves_builds_on_its_measuring_workers(tmp_path, tmp_cache, monkeypatch):
    """The build worker leaves mid-tune (retired, so its nanny does not bring it back): the jobs
    waiting for a build are sent again to be built where they are measured, and nothing is lost."""
    import tuner.measure.cluster as C
    monkeypatch.setattr(C, "POLL_S", 0.2)
    log, said = tmp_path / "b.jsonl", []
    with ClusterRunner("local:1+1", TARGET1, progress=said.append) as runner:
        (builder,) = runner.build_workers()
        th, errors = _tune_until(log, 2, batch_size=4, runner=runner)
        runner.client.retire_workers([builder], close_workers=True)
        th.join(120)
        assert not runner.build_workers()
    _all_24_once(log, th, errors)
    assert any("the measuring workers build their own jobs" in m for m in said), said


def _tuner_worker(address: str, *role: str):
    """`tuner worker ADDRESS ROLE...` as a process of its own."""
    import subprocess
    import sys
    start = "import sys; from tuner.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", start, "worker", address, *role], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_measuring_worker_that_joins_mid_tune_gets_work(tmp_path, tmp_cache):
    from distributed import Client
    log, said = tmp_path / "j.jsonl", []
    with local_cluster(0, {}) as cluster:
        address = cluster.scheduler_address
        procs = [_tuner_worker(address, "--measure", "--threads", "1")]
        try:
            with Client(address) as client:
                client.wait_for_workers(1, timeout=60)
                with ClusterRunner(address, TARGET1, progress=said.append) as runner:
                    th, errors = _tune_until(log, 2, batch_size=2, runner=runner)
                    procs.append(_tuner_worker(address, "--measure", "--threads", "1"))
                    th.join(120)
                    _all_24_once(log, th, errors)
                measured = client.run(lambda: len(__import__("tuner.measure.cluster").measure.cluster._RUNNERS))
        finally:
            for p in procs:
                p.terminate()
                p.communicate(timeout=30)
    assert any("1 measuring worker(s) joined; 2 now" in m for m in said), said
    assert len(measured) == 2 and all(measured.values()), measured       # both measured something


@pytest.mark.slow
def test_tuner_worker_processes_measure_and_build_for_a_tune(tmp_path, tmp_cache):
    """The README's commands: a scheduler, `tuner worker ADDRESS --measure` and `tuner worker
    ADDRESS --build` as processes of their own, and a tune with --cluster ADDRESS."""
    from distributed import Client
    with local_cluster(0, {}) as cluster:
        address = cluster.scheduler_address
        procs = [_tuner_worker(address, *role)
                 for role in (["--measure", "--threads", "1"], ["--build", "--jobs", "1"])]
        try:
            with Client(address) as client:
                client.wait_for_workers(2, timeout=60)
            log = tmp_path / "w.jsonl"
            with ClusterRunner(address, TARGET1) as runner:
                assert len(runner.measuring_workers()) == 1 and len(runner.build_workers()) == 1
                s = tune([SMALL], target=TARGET1, trials=8, log=str(log), progress=False, batch_size=4, runner=runner)
                assert runner.build_busy_s > 0
        finally:
            for p in procs:
                p.terminate()
            said = [p.communicate(timeout=30)[0] for p in procs]
    recs = records.load(str(log), warn=False).records
    assert s.new == 8 and len(recs) == 8 and all(r.ok and r.host for r in recs)
    assert "measures for 'cpu" in said[0] and "builds, 1 compiler call at once" in said[1], said


def test_a_tune_whose_measuring_workers_all_left_waits_for_one_and_says_so(monkeypatch):
    """Mid-tune, a census with no measuring worker waits for one (as docs/cluster.md says), where
    before any was seen it is an error; a worker restarting under load failed the whole tune."""
    import tuner.measure.cluster as cl
    runner = object.__new__(ClusterRunner)
    said, answers = [], iter([([], []), ([], []), (["w2"], [])])
    runner.say, runner.replay, runner.workers = said.append, False, lambda: next(answers)
    runner.workers_seen, runner.builders_seen = {"w1"}, set()
    runner.target, runner.resource = TARGET1, measure_resource(TARGET1)
    runner.client = SimpleNamespace(scheduler=SimpleNamespace(address="tcp://127.0.0.1:8786"))
    monkeypatch.setattr(cl, "POLL_S", 0.0)
    assert runner._census() == (["w2"], [])
    assert said[0] == "cluster: no measuring worker is left; waiting for one" and runner.workers_seen == {"w2"}
    runner.workers_seen, runner.workers = set(), lambda: ([], [])
    with pytest.raises(SetupError, match="no worker of the cluster measures"):
        runner._census()
