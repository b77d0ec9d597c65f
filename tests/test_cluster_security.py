"""Who may join a tuner's Dask cluster, and what a rogue member cannot do: TLS with a throw-away
CA, the address a worker listens on, planted libraries and forged timings."""
from __future__ import annotations

import contextlib
import logging
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="Dask's distributed is not installed (pip install -e '.[cluster]')")

from conftest import REPLAY_WORKLOADS, TARGET1  # noqa: E402

from tuner.database import records  # noqa: E402
from tuner.database.result import RUNTIME_ERROR  # noqa: E402
from tuner.errors import SetupError, UserError  # noqa: E402
from tuner.measure.cluster import Cluster, ClusterRunner, local_cluster, measure_resource, security  # noqa: E402
from tuner.task import Task  # noqa: E402
from tuner.tuning import tune  # noqa: E402

pytestmark = pytest.mark.cluster

SMALL = REPLAY_WORKLOADS[0][0]
TUNE = ["tune", "--workload", SMALL.spec, "--layout", SMALL.layout, "--threads", "1", "--trials", "4",
        "--batch-size", "4", "--search", "random", "--no-progress"]


def _throwaway_ca(d: Path, name: str = "tuner-test") -> tuple:
    """(CA certificate, a certificate it signed, that certificate's key) as PEM files in d (and the
    CA's key, ca.key): made with the `cryptography` package where installed, else openssl."""
    d.mkdir(parents=True, exist_ok=True)
    ca, cert, key = d / "ca.pem", d / "node.pem", d / "node.key"
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if not shutil.which("openssl"):
            pytest.skip("neither the cryptography package nor openssl is installed: no CA to test TLS with")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for cmd in (["req", "-x509", *ec, "-days", "1", "-subj", f"/CN={name} CA", "-keyout", d / "ca.key", "-out", ca],
                    ["req", *ec, "-subj", f"/CN={name}", "-keyout", key, "-out", d / "node.csr"],
                    ["x509", "-req", "-in", d / "node.csr", "-CA", ca, "-CAkey", d / "ca.key", "-CAcreateserial",
                     "-days", "1", "-out", cert]):
            subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True)
        return str(ca), str(cert), str(key)
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec as curves
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)

    def signed(subject: str, public, issuer: str, issuer_key, is_ca: bool):
        def dn(cn):
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        return (x509.CertificateBuilder().subject_name(dn(subject)).issuer_name(dn(issuer)).public_key(public)
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
                .sign(issuer_key, hashes.SHA256()))
    ca_key, node_key = curves.generate_private_key(curves.SECP256R1()), curves.generate_private_key(curves.SECP256R1())
    ca.write_bytes(signed(f"{name} CA", ca_key.public_key(), f"{name} CA", ca_key, True).public_bytes(
        serialization.Encoding.PEM))
    cert.write_bytes(signed(name, node_key.public_key(), f"{name} CA", ca_key, False).public_bytes(
        serialization.Encoding.PEM))
    for path, k in ((key, node_key), (d / "ca.key", ca_key)):
        path.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    return str(ca), str(cert), str(key)


def _tls(ca: str, cert: str, key: str) -> list:
    return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


@contextlib.contextmanager
def _tls_scheduler(ca: str, cert: str, key: str):
    """A Dask scheduler on tls://127.0.0.1 that admits holders of a certificate `ca` signed."""
    from distributed import Scheduler, Security, SpecCluster
    sec = Security(require_encryption=True, tls_ca_file=ca, **{f"tls_{role}_{part}": path for role in (
        "client", "scheduler", "worker") for part, path in (("cert", cert), ("key", key))})
    with SpecCluster(workers={}, security=sec, silence_logs=logging.WARNING, scheduler={
            "cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "protocol": "tls", "security": sec,
                                          "dashboard": False, "dashboard_address": None}}) as cluster:
        yield cluster.scheduler_address, sec


def _tuner_worker(*argv: str):
    start = "import sys; from tuner.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", start, "worker", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _listening(pid: int) -> set:
    import psutil
    return {c.laddr.ip for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN}


@pytest.mark.slow
def test_a_tls_cluster_measures_a_tune_and_keeps_out_a_certificate_of_another_ca(tmp_path, tmp_cache, monkeypatch):
    """The README's recipe with a throw-away CA: `tuner worker tls://... --tls-*` and `tuner tune
    --cluster tls://... --tls-*`; the worker listens on loopback only (its scheduler's interface);
    a tuner whose certificate another CA signed is not let in."""
    from distributed import Client

    import tuner.measure.cluster as C
    from tuner.cli import main
    tls = _throwaway_ca(tmp_path / "ca")
    with _tls_scheduler(*tls) as (address, sec):
        assert address.startswith("tls://127.0.0.1:")
        proc = _tuner_worker(address, "--measure", "--threads", "1", *_tls(*tls))
        try:
            with Client(address, security=sec) as client:
                client.wait_for_workers(1, timeout=60)
                (worker,) = client.scheduler_info()["workers"]
            assert worker.startswith("tls://127.0.0.1:")
            assert _listening(proc.pid) == {"127.0.0.1"}               # its comm and HTTP ports alike
            log = tmp_path / "tls.jsonl"
            assert main([*TUNE, "--log", str(log), "--cluster", address, *_tls(*tls)]) == 0
            recs = records.load(str(log), warn=False).records
            assert len(recs) == 4 and all(r.ok and r.host for r in recs), [r.message for r in recs]
            monkeypatch.setattr(C, "CONNECT_S", 1.0)
            with pytest.raises(SetupError, match="cannot reach the Dask scheduler"):
                ClusterRunner(Cluster(address, *_throwaway_ca(tmp_path / "other", "stranger")), TARGET1)
        finally:
            proc.terminate()
            proc.communicate(timeout=30)


@pytest.mark.parametrize("argv", [["worker", "tcp://192.0.2.1:8786", "--measure"],
                                  ["worker", "192.0.2.1:8786", "--build"],
                                  [*TUNE, "--cluster", "tcp://192.0.2.1:8786"]])
def test_a_worker_or_tuner_without_tls_is_refused_by_a_non_loopback_scheduler(argv, capsys):
    from tuner.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "joined only over TLS" in err and "--insecure" in err and err.count("\n") == 1


def test_insecure_joins_a_non_loopback_scheduler_without_tls_and_loopback_needs_no_flag():
    assert security("tcp://192.0.2.1:8786", "worker", insecure=True) is None
    assert security("tcp://127.0.0.1:8786", "client") is None
    assert security("tcp://localhost:8786", "worker") is None
    with pytest.raises(UserError, match="joined only over TLS"):
        security("tcp://no-such-host.invalid:8786", "client")


def test_a_tls_tune_without_a_client_certificate_is_one_line(capsys, tmp_path):
    from tuner.cli import main
    assert main([*TUNE, "--log", str(tmp_path / "x.jsonl"), "--cluster", "tls://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "--cluster tls://127.0.0.1:9: TLS needs the cluster's CA (--tls-ca-file)" in err and err.count("\n") == 1


@pytest.mark.parametrize("which, says", [("key", "cannot load them"), ("missing", "no such file"),
                                         ("tcp", "need a tls:// address")])
def test_tls_files_that_do_not_fit_are_one_line(which, says, tmp_path, capsys):
    from tuner.cli import main
    ca, cert, key = _throwaway_ca(tmp_path / "ca")
    address = "tcp://127.0.0.1:9" if which == "tcp" else "tls://127.0.0.1:9"
    files = {"key": (ca, cert, str(tmp_path / "ca" / "ca.key")), "missing": (ca, cert, str(tmp_path / "nope.key")),
             "tcp": (ca, cert, key)}[which]
    assert main(["worker", address, "--build", *_tls(*files)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_listen_address_not_of_this_machine_is_one_line(capsys):
    from tuner.cli import main
    assert main(["worker", "tcp://127.0.0.1:9", "--build", "--listen-address", "192.0.2.77"]) == 2
    err = capsys.readouterr().err
    assert "--listen-address 192.0.2.77: cannot listen there" in err and err.count("\n") == 1


PLANT = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE* f = fopen("%s", "w"); if (f) fclose(f); }
"""


@pytest.mark.slow
def test_a_library_planted_through_the_cluster_never_enters_the_kernel_cache(tmp_path, tmp_cache):
    """A job whose library is named for a real kernel's source but holds other code: measured from
    a directory of its own, which is gone after it; the cache never holds it, and a later build of
    that source gives (and loads) the real library."""
    from distributed import Client

    from tuner.measure import builder
    from tuner.measure.cluster import _measure_on_worker
    from tuner.measure.runner import RunConfig
    from tuner.toolchain.library import content_hash, open_library
    task = Task(SMALL, TARGET1)
    cand = task.from_decisions(task.space.sample(random.Random(0)))
    (real,) = builder.build_batch([(cand.func_name, cand.source)], TARGET1, openmp=cand.openmp)
    digest = Path(real.lib).name.split("-")[0]         # what the real library is built from
    shutil.rmtree(tmp_cache)
    builder._LINKED.clear()
    mark = tmp_path / "planted-ran"
    (tmp_path / "p.c").write_text(PLANT % mark)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "p.so"), str(tmp_path / "p.c")], check=True)
    data = (tmp_path / "p.so").read_bytes()
    name = f"{digest}-{content_hash(data)}.so"
    resource = measure_resource(TARGET1)
    with local_cluster(1, {resource: 1}, env={"TUNER_CACHE_DIR": str(tmp_cache)}) as cluster, Client(cluster) as client:
        job = client.submit(_measure_on_worker, SMALL.spec, SMALL.layout, str(TARGET1), [cand], RunConfig(), None,
                            ({name: data}, [(name, 0, None, 0.1)], 0.1), resources={resource: 1}, pure=False)
        (res,), _, _ = job.result(timeout=120)
    assert not res.ok and mark.exists()            # measured (so loaded) in that job, as build workers are trusted
    assert not list(tmp_cache.rglob(name))         # neither in the cache nor left in a job directory
    mark.unlink()
    (built,) = builder.build_batch([(cand.func_name, cand.source)], TARGET1, openmp=cand.openmp)
    assert Path(built.lib).name.startswith(digest) and Path(built.lib).name != name
    open_library(built.lib)
    assert not mark.exists()


def _tuned_on_a_patched_worker(log, patch) -> list:
    """The records of a 4-trial tune on a local cluster whose worker first ran `patch`."""
    with ClusterRunner("local:1", TARGET1) as runner:
        assert all(runner.client.run(patch).values())
        tune([SMALL], target=TARGET1, trials=4, log=str(log), policy="random", progress=False, batch_size=4,
             runner=runner)
    return records.load(str(log), warn=False).records


@pytest.mark.slow
def test_a_rogue_workers_forged_timings_are_logged_as_errors(tmp_path, tmp_cache):
    """A worker that times its job, then reports 1e-12 s per call and another host's name."""
    def go_rogue():
        import tuner.measure.cluster as C
        real = C._measure_on_worker

        def forged(*args, **kwargs):
            results, busy, build_busy = real(*args, **kwargs)
            for r in results:
                if r.ok:
                    r.costs, r.host = [1e-12] * len(r.costs), "trusted-host"
            return results, busy, build_busy
        C._measure_on_worker = forged
        return True

    recs = _tuned_on_a_patched_worker(tmp_path / "rogue.jsonl", go_rogue)
    assert len(recs) == 4 and not any(r.ok for r in recs)
    assert all(r.error == RUNTIME_ERROR and r.message.startswith("timing refused (from trusted-host): 1e-12 s")
               for r in recs), [r.message for r in recs]


@pytest.mark.slow
def test_a_job_that_raises_on_its_worker_is_logged_as_errors_and_the_tune_goes_on(tmp_path, tmp_cache):
    def go_broken():
        import tuner.measure.cluster as C

        def broken(*args, **kwargs):
            raise ValueError("library abc-123.so does not match its name\nsecond line")
        C._measure_on_worker = broken
        return True

    recs = _tuned_on_a_patched_worker(tmp_path / "broken.jsonl", go_broken)
    assert len(recs) == 4 and all(r.error == RUNTIME_ERROR and "ValueError: library abc-123.so does not match"
                                  in r.message and "\n" not in r.message for r in recs), [r.message for r in recs]
