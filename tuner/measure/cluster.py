"""Measuring on a Dask cluster (`tuner tune ... --cluster ADDRESS`, or `--cluster local:M[+B]`).

Dask's `distributed` scheduler does the farming out; the tuner only submits jobs and reads their
results. The roles:
  * a measuring worker (`tuner worker ADDRESS --measure`) resolves its own target when it
    starts and declares one unit of the resource `measure_resource(target)` (e.g.
    `tuner-cpu-avx2-t1`); a measuring job asks for one unit, so a worker measures one job at a
    time, and only workers whose target matches the task's get its jobs. A job is built and
    timed in the worker's own measurement process (runner.CpuRunner, held per worker process), so
    a crash or hang there is handled as on one machine;
  * a build worker (`tuner worker ADDRESS --build`) declares one unit of BUILD and compiles
    jobs' candidates with `--jobs` compiler calls at once; the libraries travel to the measuring
    worker with the job (their file names carry a hash of their bytes, checked on arrival), into
    a directory of that job's, deleted after it: never into the kernel cache, since the source
    digest in their names is the sender's word. Without build workers, each measuring job builds
    its own candidates first;
  * the driver (`tuner tune`) proposes, splits each batch into jobs (one per measuring worker;
    two per measuring worker with build workers, so the second half is built while the first is
    timed), collects the results in batch order and appends them to its log itself (the log
    never leaves the tuner's machine); each record names the host that measured it. It sends
    the next batch before reading this one's results (`ahead`), so workers do not wait while
    it proposes.
Faults: a job whose worker dies is re-sent once (the scheduler's `allowed-failures`, set to 1
for a local cluster; a scheduler of your own decides for itself), then recorded as a
RUNTIME_ERROR; a tuner stopped midway (Ctrl-C, its time limit) cancels the jobs not yet
finished. No worker for the task's target is a one-line error, not a silent wait.
Trust: whoever reaches the scheduler or a worker runs code as the workers' user, and a worker's
results are unpickled in the tuner. A worker listens on the interface that reaches its scheduler
(loopback for a loopback one); a scheduler on another machine is joined only over TLS (Dask's
Security, from --tls-ca-file/--tls-cert/--tls-key) or with --insecure. Timings that come back
are bounded by the target's ceiling (plausible.check).
"""
from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..database.result import ERROR_KINDS, RUNTIME_ERROR, MeasureResult
from ..errors import SetupError, UserError
from ..ops import parse_spec
from ..target import host_cores, parse_target
from ..task import Task
from ..toolchain.cc import cache_dir
from ..toolchain.library import LIBRARY_NAME, verified
from . import plausible
from .builder import BuildResult
from .local import local_runner
from .runner import RunConfig, build

LOCAL = "local:"
BUILD = "tuner-build"          # the resource a build worker declares
JOBS_ENV = "TUNER_BUILD_JOBS"  # on a build worker: compiler calls at once (default: its cores)
_RUNNERS: dict = {}          # on a worker: (target, config, replay) -> its CpuRunner, kept between jobs
_TASKS = collections.OrderedDict()   # on a worker: (spec, layout, target) -> Task, for the last
TASKS_KEPT = 8                       # few tasks (a model tune has hundreds)
POLL_S = 2.0                 # how often a tuner waiting for a job checks that the workers it needs are there
CONNECT_S = 5.0              # how long a tuner tries to reach its scheduler
LOCAL_START_S = 120.0        # how long a tuner waits for a local cluster's workers to join its scheduler
JOBS_DIR = "jobs"            # under the cache root: one directory per job's shipped libraries, deleted after it


@dataclass(frozen=True)
class Cluster:
    """A Dask scheduler to measure on (`tuner tune --cluster`): its address, and the TLS files
    (None: from Dask's config, distributed.comm.tls.*); `insecure` joins a scheduler on another
    machine without TLS."""
    address: str
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False


def _host_port(address: str) -> tuple:
    from distributed.comm import parse_address, parse_host_port
    try:
        return parse_host_port(parse_address(address)[1], 8786)
    except ValueError as e:
        raise UserError(f"scheduler address {address!r}: {e}; give e.g. tls://sched:8786") from None


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is this machine's loopback."""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def security(address: str, role: str, ca: str | None = None, cert: str | None = None, key: str | None = None,
             insecure: bool = False, flag: str = ""):
    """The distributed.Security to reach `address` as `role` ('client' or 'worker'): TLS for a
    tls:// address (these files, else Dask's config), None for a plain one, which must be on
    this machine unless `insecure`. Bad or missing files are a one-line UserError."""
    from distributed import Security
    proto = address.split("://")[0] if "://" in address else "tcp"
    given = {k: v for k, v in (("tls_ca_file", ca), (f"tls_{role}_cert", cert), (f"tls_{role}_key", key)) if v}
    if proto != "tls":
        if given:
            raise UserError(f"{flag}{address}: --tls-ca-file, --tls-cert and --tls-key need a tls:// address "
                            "(tls://HOST:PORT of a scheduler started with TLS)")
        if not insecure and not is_loopback(_host_port(address)[0]):
            raise UserError(f"{flag}{address}: a scheduler on another machine is joined only over TLS (anyone who "
                            "reaches a cluster runs code as its users): give tls://HOST:PORT with --tls-ca-file, "
                            "--tls-cert and --tls-key (docs/cluster.md: Security), or --insecure on a network you trust")
        return None
    for opt, path in (("--tls-ca-file", ca), ("--tls-cert", cert), ("--tls-key", key)):
        if path and not os.path.isfile(path):
            raise UserError(f"{opt} {path}: no such file")
    sec = Security(require_encryption=True, **given)
    tls = sec.get_tls_config_for_role(role)
    if not tls["ca_file"] or not tls["cert"]:
        raise UserError(f"{flag}{address}: TLS needs the cluster's CA (--tls-ca-file) and a certificate it signed "
                        "(--tls-cert, with --tls-key unless the key is in that file)")
    try:
        sec.get_connection_args(role)
    except (OSError, ValueError) as e:       # ssl.SSLError is an OSError
        raise UserError(f"--tls-ca-file {tls['ca_file']}, --tls-cert {tls['cert']}, --tls-key {tls['key']}: "
                        f"cannot load them: {e}") from None
    return sec


def listen_host(address: str) -> str:
    """This machine's address on the interface that reaches the scheduler at `address`."""
    from distributed.utils import get_ip
    host, port = _host_port(address)
    try:
        ip = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        raise SetupError(f"cannot reach the Dask scheduler at {address}: {e}; check the address") from None
    return get_ip(ip, port)


def parse_listen(text: str) -> tuple:
    """`--listen-address HOST[:PORT]`: (host, port; 0 for any)."""
    from distributed.comm import parse_host_port
    try:
        host, port = parse_host_port(text, 0)
    except ValueError:
        host = None
    if not host or "://" in text:
        raise UserError(f"--listen-address {text!r}: give this machine's HOST or HOST:PORT, e.g. 10.0.0.7 or "
                        "10.0.0.7:9000 (0.0.0.0: every interface)")
    try:                                      # bound once here, so that a wrong address is one line
        family, kind, _, _, where = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as s:
            s.bind(where)
    except OSError as e:
        raise UserError(f"--listen-address {text}: cannot listen there ({e.strerror or e}); give an address of "
                        "this machine's, and a free port") from None
    return host, int(port)


def measure_resource(target) -> str:
    """The resource a measuring worker for `target` declares (what its measurements depend on)."""
    return f"tuner-{target.kind}-{target.isa}-t{target.threads}"


def _build_on_worker(target_text: str, cands: list) -> tuple:
    """Runs on a build worker: compile a chunk of candidates for the measuring target. Returns
    ({library file name: its bytes}, [(library name or None, index, error, seconds)] per
    candidate, the seconds the worker spent)."""
    start = time.perf_counter()
    jobs = int(os.environ.get(JOBS_ENV) or 0) or None
    libs, out = {}, []
    for b in build(cands, parse_target(target_text, check_host=False), jobs):
        name = os.path.basename(b.lib) if b.lib else None
        if name is not None and name not in libs:
            libs[name] = Path(b.lib).read_bytes()
        out.append((name, b.index, b.error, b.seconds))
    return libs, out, time.perf_counter() - start


def job_dir() -> Path:
    """A private directory for one job's shipped libraries (the caller deletes it); those of this
    host's jobs whose worker died are deleted first."""
    d = cache_dir(JOBS_DIR)
    me = socket.gethostname()
    for old in d.glob(f"{me}-*-*"):
        pid = old.name[len(me) + 1:].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{me}-{os.getpid()}-", dir=d))


def _unpack(built: tuple, into: Path) -> list:
    """On a measuring worker: a build worker's libraries written into `into`, this job's own
    directory (each under its own name, which holds a hash of its bytes: anything else is
    refused), and one builder.BuildResult per candidate."""
    libs, out, _ = built
    paths = {}
    for name, data in libs.items():
        if not isinstance(name, str) or LIBRARY_NAME.fullmatch(name) is None or not isinstance(data, bytes):
            raise RuntimeError(f"a build worker sent a library named {name!r}, not a name the builder gives")
        path = into / name
        path.write_bytes(data)
        if not verified(path):
            raise RuntimeError(f"library {name} from a build worker does not hold the bytes its name promises")
        paths[name] = str(path)
    return [BuildResult(paths[name] if name else None, index, error, seconds) for name, index, error, seconds in out]


def _measure_on_worker(spec: str, layout: str, target_text: str, cands: list, config, replay: str | None,
                       built: tuple | None = None):
    """Runs on a measuring worker: measure a chunk of candidates (their code as the tuner
    generated it) in this worker's runner, from a build worker's libraries (`built`) or built
    here first (one compiler call per core), or look them up in `replay`, a log (for tests and
    replayed tunes). Returns the results, the seconds this worker spent and those the build
    worker spent."""
    start = time.perf_counter()
    target = parse_target(target_text, check_host=False)
    key = (target_text, repr(config), replay)
    runner = _RUNNERS.get(key)
    if runner is None:
        runner = _RUNNERS[key] = local_runner(target, config, replay)
    tkey = (spec, layout, target_text)
    task = _TASKS.get(tkey)
    if task is None:                    # its inputs and reference are made once per worker and task
        task = _TASKS[tkey] = Task(parse_spec(spec, layout), target)
        while len(_TASKS) > TASKS_KEPT:
            _TASKS.popitem(last=False)
    _TASKS.move_to_end(tkey)
    host = socket.gethostname()
    job = job_dir() if built is not None else None
    try:
        results = []
        for _, res in (runner.measure(task, cands) if job is None else
                       runner.measure_built(task, cands, _unpack(built, job))):
            res.host = host
            results.append(res)
    finally:
        if job is not None:
            shutil.rmtree(job, ignore_errors=True)
    return results, time.perf_counter() - start, built[2] if built is not None else 0.0


def run_worker(address: str, target=None, name: str | None = None, jobs: int | None = None,
               listen: str | None = None, tls: tuple = (None, None, None), insecure: bool = False) -> int:
    """`tuner worker ADDRESS --measure` (a `target`) or `--build` (no target; `jobs` compiler
    calls at once): a Dask worker with one slot, until the scheduler goes away or the process is
    stopped. It listens on `listen` (HOST[:PORT]; default: the interface that reaches the
    scheduler), over TLS with `tls` (CA, certificate, key) for a tls:// address."""
    try:
        from distributed import Worker
    except ImportError:
        raise UserError("`tuner worker` needs Dask's distributed, which is not installed: pip install -e "
                        "'.[cluster]'") from None
    sec = security(address, "worker", *tls, insecure=insecure)
    host, port = parse_listen(listen) if listen else (listen_host(address), 0)
    resource = measure_resource(target) if target is not None else BUILD
    if target is None and jobs:
        os.environ[JOBS_ENV] = str(jobs)
    role = f"measures for '{target}'" if target is not None else \
        f"builds, {jobs or 'one per core'} compiler call{'s' * (jobs != 1)} at once"
    name = name or f"{socket.gethostname()}-{os.getpid()}"
    logging.getLogger("distributed").setLevel(logging.WARNING)      # its INFO lines drown ours

    async def serve():
        async with Worker(address, nthreads=1, resources={resource: 1}, name=name, death_timeout=15, host=host,
                          port=port, security=sec) as w:
            print(f"worker {name}: {role} (resource {resource}); scheduler {address}; listening on {w.address}",
                  flush=True)
            await w.finished()

    try:
        asyncio.run(serve())
    except (OSError, TimeoutError, RuntimeError) as e:
        raise SetupError(f"cannot reach the Dask scheduler at {address}: {e}; start it with `dask scheduler` "
                         "and check the address") from None
    except KeyboardInterrupt:
        pass
    return 0


def local_cluster(n: int, resources: dict, env: dict | None = None, build: int = 0, build_jobs: int = 1):
    """A Dask cluster on this machine: `n` worker processes with `resources` (measuring workers)
    and `build` build workers of `build_jobs` compiler calls each, one thread per worker; a job
    whose worker dies is re-sent once (allowed-failures 1), then fails."""
    import dask
    from distributed import Nanny, Scheduler, SpecCluster

    def worker(res: dict, extra: dict) -> dict:
        return {"cls": Nanny, "options": {"nthreads": 1, "host": "127.0.0.1", "resources": res,
                                          "env": {**(env or {}), **extra}, "silence_logs": logging.WARNING}}
    workers = {f"measure-{k}": worker(resources, {}) for k in range(n)}
    workers.update({f"build-{k}": worker({BUILD: 1}, {JOBS_ENV: str(build_jobs)}) for k in range(build)})
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        return SpecCluster(workers=workers, silence_logs=logging.WARNING, scheduler={
            "cls": Scheduler, "options": {"host": "127.0.0.1", "port": 0, "dashboard": False,
                                          "dashboard_address": None}})


def start_local(address: str, target, env: dict | None = None):
    """The local cluster `local:M[+B]` names for `target`'s measurements: its build workers share
    the cores the measuring workers leave."""
    n, builders = parse_local(address)
    return local_cluster(n, {measure_resource(target): 1}, env, build=builders,
                         build_jobs=max(1, (host_cores() - n) // max(builders, 1)))


def idle_share(busy_s: float, workers: int, wall_s: float) -> float:
    """The share of `workers`' time over `wall_s` they were not on a job (busy_s in all)."""
    return max(0.0, 1.0 - busy_s / (workers * wall_s)) if workers and wall_s > 0 else 0.0


def parse_local(address: str) -> tuple:
    """`local:M` or `local:M+B`: (M measuring workers, B build workers)."""
    m = re.fullmatch(r"local:(\d+)(?:\+(\d+))?", address)
    if m is None or int(m.group(1)) < 1:
        raise UserError(f"--cluster {address!r}: give local:M with M >= 1 measuring workers, or local:M+B with B "
                        "build workers too, e.g. local:2 or local:1+1")
    return int(m.group(1)), int(m.group(2) or 0)


def _done(fut, timeout: float) -> bool:
    """Whether `fut` finished (or failed) within `timeout` seconds. Polled: a result(timeout) that
    times out leaves Dask's frames, holding the job, to the cyclic garbage collector, so a tuner
    stopped midway would keep the job's result on its worker."""
    deadline = time.monotonic() + timeout
    while not fut.done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _job_result(out) -> tuple:
    """(results, measuring seconds, building seconds) of a measuring job, as _measure_on_worker
    returns them; (None, 0, 0) for anything else."""
    if isinstance(out, tuple) and len(out) == 3 and _number(out[1]) and _number(out[2]):
        return out
    return None, 0.0, 0.0


def _sane(r) -> bool:
    return (isinstance(r, MeasureResult) and r.error in ERROR_KINDS and isinstance(r.message, str)
            and isinstance(r.host, str) and _number(r.build_s) and _number(r.run_s))


class ClusterRunner:
    """The tuning loop's runner (`measure(task, batch)`, `status()`, `close()`, `ahead`) on a Dask cluster."""

    def __init__(self, cluster: str | Cluster, target, config=None, progress=print, replay: str | None = None,
                 ahead: int | None = None):
        """cluster: the scheduler's address, local:M[+B], or a Cluster (with TLS files). ahead:
        batches sent beyond the one whose results the tuner reads; None: enough to give every
        measuring worker a job (at least 1; see `ahead`)."""
        try:
            from distributed import Client
        except ImportError:
            raise UserError("--cluster needs Dask's distributed, which is not installed: pip install -e "
                            "'.[cluster]'") from None
        spec = cluster if isinstance(cluster, Cluster) else Cluster(cluster)
        address, tls = spec.address, (spec.tls_ca_file, spec.tls_cert, spec.tls_key)
        local = 0               # the local cluster's workers, all of which the first batch waits for
        if address.startswith(LOCAL):
            local = sum(parse_local(address))
            if any(tls):
                raise UserError(f"--cluster {address}: a local cluster runs on this machine's loopback; the --tls-* "
                                "options are for a tls:// scheduler address")
            sec = None
        else:
            sec = security(address, "client", *tls, insecure=spec.insecure, flag="--cluster ")
        self.target = target
        self.config = config or RunConfig()
        self.resource = measure_resource(target)
        self.replay = replay
        self._ahead = ahead
        self._last_batch = 0       # candidates in the last batch sent
        self._cluster = None
        self.say = progress
        if address.startswith(LOCAL):
            self._cluster = start_local(address, target)
            address = self._cluster.scheduler_address
        try:
            self.client = Client(address, timeout=f"{CONNECT_S}s", security=sec)
        except (OSError, TimeoutError) as e:
            if self._cluster is not None:
                self._cluster.close()
            raise SetupError(f"cannot reach the Dask scheduler at {address}: {e}; start it with "
                             "`dask scheduler` and check the address") from None
        if local:
            # its worker processes join the scheduler some time after it starts (seconds on a loaded
            # machine): a first batch sent before would find no worker that measures
            try:
                self.client.wait_for_workers(local, timeout=LOCAL_START_S)
            except TimeoutError:
                self.close()
                raise SetupError(f"--cluster {spec.address}: its workers did not start within {LOCAL_START_S:.0f} s; "
                                 "is this machine out of memory or processes?") from None
        self.workers_seen: set = set()
        self.builders_seen: set = set()
        self.busy_s = 0.0          # seconds the measuring workers spent on this runner's jobs
        self.build_busy_s = 0.0    # and the build workers
        self._first = None         # when the first batch was sent

    @property
    def ahead(self) -> int:
        """Batches the tuner may send beyond the one it reads: as given, or enough that every
        measuring worker has a job (a batch gives at most one job per candidate), at least 1 so
        that workers do not wait while the tuner proposes."""
        if self._ahead is not None:
            return self._ahead
        return max(1, -(-len(self.workers_seen) // max(self._last_batch, 1)))

    def workers(self) -> tuple:
        """(measuring workers, build workers) now: one question to the scheduler."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        return tuple([w for w, d in info.items() if d.get("resources", {}).get(r)] for r in (self.resource, BUILD))

    def measuring_workers(self) -> list:
        return self.workers()[0]

    def build_workers(self) -> list:
        return self.workers()[1]

    def _census(self) -> tuple:
        """The measuring and build workers now, with a line when some joined or left."""
        workers, builders = self.workers()
        if not workers and self.workers_seen:       # mid-tune: wait for one, as the docs say
            self.say("cluster: no measuring worker is left; waiting for one")
            while not workers:
                time.sleep(POLL_S)
                workers, builders = self.workers()
        builders = [] if self.replay else builders
        if not workers:
            raise SetupError(f"no worker of the cluster measures for {self.target} (resource {self.resource}): "
                             f"start one on a matching machine with `tuner worker {self.client.scheduler.address} "
                             "--measure`")
        for kind, now, seen in (("measuring", workers, self.workers_seen), ("build", builders, self.builders_seen)):
            new, lost = set(now) - seen, seen - set(now)
            if seen and new:
                self.say(f"cluster: {len(new)} {kind} worker(s) joined; {len(now)} now")
            if lost:
                self.say(f"cluster: {len(lost)} {kind} worker(s) left; going on with {len(now)}")
        self.workers_seen, self.builders_seen = set(workers), set(builders)
        return workers, builders

    def measure(self, task, batch: list):
        """Submit the batch's jobs now, and return a generator of (candidate, result) in batch
        order; closing it before the end cancels the jobs not yet read."""
        workers, builders = self._census()
        w, target = task.workload, str(task.target)
        self._last_batch = len(batch)
        if self._first is None:
            self._first = time.perf_counter()
        # a job per measuring worker, or two with build workers (the second built while the first is timed)
        parts = len(workers) * (2 if builders else 1)
        size = -(-len(batch) // parts)
        chunks = [batch[k:k + size] for k in range(0, len(batch), size)]
        tag = f"{chunks[0][0].code_hash}-{time.monotonic_ns()}"

        def submit(k: int, chunk: list, build: bool) -> list:
            """[its build job or None, its measuring job]"""
            built = None
            if build:
                built = self.client.submit(_build_on_worker, target, chunk, resources={BUILD: 1}, pure=False,
                                           key=f"build-{tag}-{k}")
            return [built, self.client.submit(
                _measure_on_worker, w.spec, w.layout, target, chunk, self.config, self.replay, built,
                resources={self.resource: 1}, pure=False, key=f"measure-{tag}-{k}{'-here' * (not build)}")]
        jobs = [submit(k, chunk, bool(builders)) for k, chunk in enumerate(chunks)]
        return self._results(w, chunks, jobs, submit)

    def _checked(self, workload, results, n: int) -> list:
        """A worker's results as the tuner logs them: n MeasureResults of known kinds, each timing
        within the target's ceiling (plausible.check), whatever the worker sent."""
        if not isinstance(results, list) or len(results) != n or not all(map(_sane, results)):
            return [MeasureResult(RUNTIME_ERROR, "a worker returned something other than its results")
                    for _ in range(n)]
        return [plausible.check(workload, self.target, r) for r in results]

    def _results(self, workload, chunks: list, jobs: list, submit):
        from distributed.scheduler import KilledWorker
        done = 0
        try:       # all run at once; results are read in batch order, so a log does not depend on timing
            for k, chunk in enumerate(chunks):
                try:
                    results, busy, build_busy = _job_result(self._wait(k, chunk, jobs, submit))
                    self.busy_s += busy
                    self.build_busy_s += build_busy
                except KilledWorker:
                    results = [MeasureResult(RUNTIME_ERROR, "the workers measuring or building it died, twice "
                                             "(each on another worker)") for _ in chunk]
                except Exception as e:  # noqa: BLE001 - a worker's word: what it raised is recorded, not raised here
                    why = f"{type(e).__name__}: {str(e)[:200]}".replace("\n", " ")
                    results = [MeasureResult(RUNTIME_ERROR, f"the job failed on its worker ({why})") for _ in chunk]
                done += 1
                yield from zip(chunk, self._checked(workload, results, len(chunk)))
        finally:
            if done < len(jobs):              # stopped midway: nothing left running for us
                self.client.cancel([f for pair in jobs[done:] for f in pair if f is not None])

    def _wait(self, k: int, chunk: list, jobs: list, submit):
        """Job k's result. Every POLL_S while it is out: a job whose build is not done and has no
        build worker left to run on is sent again, to be built by its measuring worker; a
        cluster with no measuring worker left for the target says so (once; a worker that joins
        gets the job)."""
        said = False
        while True:
            built, fut = jobs[k]
            if _done(fut, POLL_S):
                return fut.result()
            workers, builders = self.workers()
            if built is not None and built.status != "finished" and not builders:
                self.say("cluster: no build worker left; the measuring workers build their own jobs")
                self.client.cancel([built, fut])
                jobs[k] = submit(k, chunk, False)
            if not said and not workers:
                self.say(f"cluster: no worker measuring for {self.target} is left; waiting for one to join "
                         f"(`tuner worker {self.client.scheduler.address} --measure`)")
                said = True

    def status(self) -> str:
        """The workers and the share of their time they waited for jobs (the tuner proposing,
        builds elsewhere, or no work for them)."""
        n, b = len(self.workers_seen), len(self.builders_seen)
        if not n or self._first is None:
            return ""
        wall = time.perf_counter() - self._first
        line = f" | {n} measuring, idle {idle_share(self.busy_s, n, wall):.0%}"
        return line + (f"; {b} building, idle {idle_share(self.build_busy_s, b, wall):.0%}" if b else "")

    def close(self):
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
