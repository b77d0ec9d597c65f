"""Measuring on a Dask cluster (`tuner tune ... --cluster ADDRESS` or `--cluster local:N`).

Dask's `distributed` scheduler does the farming out: the tuner submits one job per measuring
worker and batch, and a worker that dies mid-job has it re-sent by the scheduler to another. The roles:
  * a measuring worker (`tuner worker ADDRESS --measure`) resolves its own target when it
    starts and declares one unit of the resource `measure_resource(target)` (e.g.
    `tuner-cpu-avx2-t1`); a job asks for one unit, so a worker measures one candidate at a time,
    and only workers whose target matches the task's get its jobs. A job carries the candidate's
    code as the tuner generated it; it is built and timed in the worker's own measurement process
    (runner.Runner, held per worker process), so a crash or hang there is handled as on one
    machine;
  * the driver (`tuner tune`) proposes, sends each measuring worker its share of the batch (one
    job, built with one compiler call), collects the results and appends them to its log itself (the log never leaves the tuner's machine); each record names the host
    that measured it.
Faults: a job whose worker dies is re-sent once (the scheduler's `allowed-failures`, set to 1
for a local cluster; a scheduler of your own decides for itself), then recorded as a
RUNTIME_ERROR; a tuner stopped midway (Ctrl-C, its time limit) cancels the jobs not yet
finished. No worker for the task's target is a one-line error, not a silent wait.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from ..errors import SetupError, UserError
from .result import RUNTIME_ERROR, MeasureResult

LOCAL = "local:"
_RUNNERS: dict = {}          # on a worker: (target, config, replay) -> its Runner, kept between jobs
_TASKS: dict = {}            # on a worker: (spec, layout, target) -> Task


def measure_resource(target) -> str:
    """The resource a measuring worker for `target` declares (what its measurements depend on)."""
    return f"tuner-{target.kind}-{target.isa}-t{target.threads}"


def _measure_on_worker(spec: str, layout: str, target_text: str, cands: list, config, replay: str | None):
    """Runs on a measuring worker: build and measure a chunk of candidates (their code as the
    tuner generated it; one compiler call for the chunk) in this worker's runner, or look them
    up in `replay`, a log (for tests and replayed tunes). Returns the results and the seconds
    the worker spent."""
    from ..target import parse_target
    from ..task import Task
    from ..te.workloads import parse_spec
    from ..tuning import make_runner
    start = time.perf_counter()
    target = parse_target(target_text, check_host=False)
    key = (target_text, repr(config), replay)
    runner = _RUNNERS.get(key)
    if runner is None:
        runner = _RUNNERS[key] = make_runner(target, config, replay)
    tkey = (spec, layout, target_text)
    task = _TASKS.get(tkey)
    if task is None:                    # its inputs and reference are made once per worker
        task = _TASKS[tkey] = Task(parse_spec(spec, layout), target)
    host = socket.gethostname()
    results = []
    for _, res in runner.measure(task, cands):
        res.host = host
        results.append(res)
    return results, time.perf_counter() - start


def run_worker(address: str, target, name: str | None = None) -> int:
    """`tuner worker ADDRESS --measure`: a Dask worker with one slot that measures for `target`,
    until the scheduler goes away or the process is stopped."""
    try:
        from distributed import Worker
    except ImportError:
        raise UserError("`tuner worker` needs Dask's distributed, which is not installed: pip install -e "
                        "'.[cluster]'") from None
    resource = measure_resource(target)
    name = name or f"{socket.gethostname()}-{os.getpid()}"
    logging.getLogger("distributed").setLevel(logging.WARNING)      # its INFO lines drown ours

    async def serve():
        async with Worker(address, nthreads=1, resources={resource: 1}, name=name, death_timeout=15) as w:
            print(f"worker {name}: measures for '{target}' (resource {resource}); scheduler {address}", flush=True)
            await w.finished()

    try:
        asyncio.run(serve())
    except (OSError, TimeoutError) as e:
        raise SetupError(f"cannot reach the Dask scheduler at {address}: {e}; start it with `dask scheduler` "
                         "and check the address") from None
    except KeyboardInterrupt:
        pass
    return 0


def local_cluster(n: int, resources: dict, env: dict | None = None):
    """A Dask cluster of `n` worker processes on this machine, one thread each, with `resources`;
    a job whose worker dies is re-sent once (allowed-failures 1), then fails."""
    import dask
    from distributed import LocalCluster
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                            resources=resources, **({"env": env} if env else {}))


class ClusterRunner:
    """The tuning loop's runner (`measure(task, batch)`, `close()`) on a Dask cluster."""

    def __init__(self, address: str, target, config=None, progress=print, replay: str | None = None):
        try:
            from distributed import Client
        except ImportError:
            raise UserError("--cluster needs Dask's distributed, which is not installed: pip install -e "
                            "'.[cluster]'") from None
        from .runner import RunConfig
        self.target = target
        self.config = config or RunConfig()
        self.resource = measure_resource(target)
        self.replay = replay
        self._cluster = None
        self.say = progress
        if address.startswith(LOCAL):
            try:
                n = int(address[len(LOCAL):])
            except ValueError:
                n = 0
            if n < 1:
                raise UserError(f"--cluster {address!r}: give local:N with N measuring workers, e.g. local:2")
            self._cluster = local_cluster(n, {self.resource: 1})
            address = self._cluster.scheduler_address
        try:
            self.client = Client(address, timeout="5s")
        except (OSError, TimeoutError) as e:
            if self._cluster is not None:
                self._cluster.close()
            raise SetupError(f"cannot reach the Dask scheduler at {address}: {e}; start it with "
                             "`dask scheduler` and check the address") from None
        self.workers_seen: set = set()
        self.busy_s = 0.0          # seconds the workers spent measuring for this runner
        self._first = None         # when the first batch was sent

    def measuring_workers(self) -> list:
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        return [w for w, d in info.items() if d.get("resources", {}).get(self.resource)]

    def measure(self, task, batch: list):
        """Submit the batch (a job per measuring worker), then yield (candidate, result) in batch order."""
        from distributed.scheduler import KilledWorker
        workers = self.measuring_workers()
        if not workers:
            raise SetupError(f"no worker of the cluster measures for {self.target} (resource {self.resource}): "
                             f"start one on a matching machine with `tuner worker {self.client.scheduler.address} "
                             "--measure`")
        new = set(workers) - self.workers_seen
        if self.workers_seen and new:
            self.say(f"cluster: {len(new)} measuring worker(s) joined; {len(workers)} now")
        lost = self.workers_seen - set(workers)
        if lost:
            self.say(f"cluster: {len(lost)} measuring worker(s) left; going on with {len(workers)}")
        self.workers_seen = set(workers)
        w = task.workload
        if self._first is None:
            self._first = time.perf_counter()
        # one job per worker's share of the batch: each share is built with one compiler call
        size = -(-len(batch) // len(workers))
        chunks = [batch[k:k + size] for k in range(0, len(batch), size)]
        futures = [self.client.submit(_measure_on_worker, w.spec, w.layout, str(task.target), chunk, self.config,
                                      self.replay, resources={self.resource: 1}, pure=False,
                                      key=f"measure-{chunk[0].code_hash}-{time.monotonic_ns()}-{k}")
                   for k, chunk in enumerate(chunks)]
        done = 0
        try:       # all run at once; results are logged in batch order, so a log does not depend on timing
            for chunk, fut in zip(chunks, futures):
                try:
                    results, busy = fut.result()
                    self.busy_s += busy
                except KilledWorker:
                    results = [MeasureResult(RUNTIME_ERROR, "the workers measuring it died, twice (each on "
                                             "another worker)") for _ in chunk]
                done += 1
                yield from zip(chunk, results)
        finally:
            if done < len(futures):              # stopped midway: nothing left running for us
                self.client.cancel(futures[done:])

    def status(self) -> str:
        """The measuring workers and the share of their time they waited for jobs (the tuner
        proposing, building being done elsewhere, or no work for them)."""
        n = len(self.workers_seen)
        if not n or self._first is None:
            return ""
        wall = time.perf_counter() - self._first
        idle = max(0.0, 1.0 - self.busy_s / (n * wall)) if wall > 0 else 0.0
        return f" | {n} worker{'s' * (n > 1)}, idle {idle:.0%}"

    def close(self):
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
