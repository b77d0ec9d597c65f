"""Measuring on a Dask cluster: local clusters of worker processes, a few seconds each."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytest.importorskip("distributed", reason="Dask's distributed is not installed (pip install -e '.[cluster]')")

from tuner import records  # noqa: E402
from tuner.errors import SetupError  # noqa: E402
from tuner.measure.cluster import ClusterRunner, local_cluster, measure_resource  # noqa: E402
from tuner.target import TargetError, parse_target  # noqa: E402
from tuner.task import Task  # noqa: E402
from tuner.tuning import tune  # noqa: E402

from conftest import REPLAY_LOG, REPLAY_TARGET, REPLAY_WORKLOADS, TARGET1  # noqa: E402

SMALL = REPLAY_WORKLOADS[0][0]


def _lines(path) -> list:
    return [(r.code_hash, r.costs, r.error) for r in records.load(str(path), warn=False).records]


@pytest.mark.parametrize("policy", ["random", "evolutionary"])
def test_a_tune_through_the_cluster_logs_what_a_local_tune_logs(policy, tmp_path):
    try:
        parse_target(REPLAY_TARGET)
    except TargetError:
        pytest.skip(f"the replay log is for {REPLAY_TARGET}, which this host cannot read back")
    kw = dict(target=REPLAY_TARGET, trials=24, policy=policy, replay=str(REPLAY_LOG), progress=False, batch_size=8,
              cost_model_from=["none"])
    tune([SMALL], log=str(tmp_path / "here.jsonl"), **kw)
    session = tune([SMALL], log=str(tmp_path / "there.jsonl"), cluster="local:2", **kw)
    here, there = _lines(tmp_path / "here.jsonl"), _lines(tmp_path / "there.jsonl")
    assert len(here) == 24 and session.new == 24
    assert there == here


def test_records_name_the_host_that_measured_them(tmp_path, tmp_cache):
    log = tmp_path / "x.jsonl"
    tune([SMALL], target=TARGET1, trials=4, log=str(log), cluster="local:1", progress=False, batch_size=4)
    recs = records.load(str(log), warn=False).records
    assert len(recs) == 4 and all(r.ok and r.host for r in recs)


def test_a_task_no_worker_can_measure_is_reported(tmp_path):
    cuda = parse_target("cuda -arch=sm_90")
    with local_cluster(1, {measure_resource(cuda): 1}) as cluster:
        with pytest.raises(SetupError, match=r"no worker of the cluster measures for cpu .*tuner worker"):
            tune([SMALL], target=TARGET1, trials=4, log=str(tmp_path / "x.jsonl"), cluster=cluster.scheduler_address,
                 progress=False)


def test_an_unreachable_scheduler_is_one_line():
    with pytest.raises(SetupError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9") as e:
        ClusterRunner("tcp://127.0.0.1:9", TARGET1)
    assert "\n" not in str(e.value)


def test_a_killed_worker_loses_no_record_and_duplicates_none(tmp_path, tmp_cache):
    from distributed import Client
    log = tmp_path / "k.jsonl"
    with local_cluster(2, {measure_resource(TARGET1): 1}) as cluster, Client(cluster) as client:
        pids = client.run(os.getpid)
        errors = []

        def run():
            try:
                tune([SMALL], target=TARGET1, trials=24, log=str(log), cluster=cluster.scheduler_address,
                     progress=False, batch_size=8)
            except BaseException as e:      # noqa: BLE001  (reported below)
                errors.append(e)

        th = threading.Thread(target=run)
        th.start()
        deadline = time.time() + 60
        while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 4):
            time.sleep(0.05)
        assert th.is_alive()                            # killed mid-tune
        os.kill(next(iter(pids.values())), signal.SIGKILL)
        th.join(120)
    assert not errors and not th.is_alive()
    recs = records.load(str(log), warn=False).records
    assert len(recs) == 24 and len({r.code_hash for r in recs}) == 24
    assert all(r.ok for r in recs), [r.message for r in recs if not r.ok]


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
