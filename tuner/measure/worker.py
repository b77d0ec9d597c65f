"""The measurement process: loads built libraries, checks each kernel, then times it in C.

It runs apart from the tuner so that a kernel that crashes or hangs takes only this process
down; the parent records the error and starts a new one. It never outlives the tuner: the kernel
delivers SIGKILL when the parent dies (Linux), and a watchdog thread (which runs while a kernel
spins, since cffi calls release the GIL) exits as soon as the process has been re-parented.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

import numpy as np


def check_output(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float):
    """None when `out` matches `ref`, else a message saying where and by how much it differs."""
    tol = atol * max(1.0, float(np.abs(ref).max(initial=0.0))) + rtol * np.abs(ref)
    bad = ~np.isfinite(out) | (np.abs(out - ref) > tol)
    if not bad.any():
        return None
    flat = int(np.flatnonzero(bad)[0])
    idx = np.unravel_index(flat, out.shape)
    return (f"{int(bad.sum())} of {out.size} outputs differ from the reference; first at "
            f"{list(map(int, idx))}: expected {ref[idx]:.6g}, got {out[idx]:.6g}")


class Channel:
    """Pickled messages received on one pipe and sent on another: both ends of the worker's
    stdin/stdout (the file descriptors are duplicated, so the originals can be closed)."""

    def __init__(self, rx_fd: int, tx_fd: int):
        self._rx = Connection(os.dup(rx_fd), writable=False)
        self._tx = Connection(os.dup(tx_fd), readable=False)

    def send(self, obj):
        self._tx.send(obj)

    def recv(self):
        return self._rx.recv()

    def poll(self, timeout):
        return self._rx.poll(timeout)

    def close(self):
        self._tx.close()
        self._rx.close()


def die_with_parent(parent: int) -> None:
    """Exit when `parent` is gone, even while a kernel hangs in C."""
    try:
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass                          # not Linux: the watchdog below does it alone

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(0)
    if os.getppid() != parent:        # the parent died before we got here
        os._exit(0)
    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def messages(conn):
    """The messages a worker process is sent, until the tuner says stop or goes away."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        yield msg


def main(conn) -> None:
    from .library import LibraryError, aligned_copy, aligned_empty, ffi as get_ffi, open_library, pointer_array

    ffi = get_ffi()
    libs: dict = {}
    arrays: list = []
    ref = out = args = None
    for msg in messages(conn):
        kind = msg[0]
        if kind == "setup":
            arrays = [aligned_copy(np.asarray(a, dtype=np.float32)) for a in msg[1]]
            ref = msg[2]
            out = aligned_empty(ref.shape)
            args = pointer_array(arrays + [out])
            conn.send(("ready",))
        elif kind == "release":
            for path in list(libs):
                ffi.dlclose(libs.pop(path))
            conn.send(("ready",))
        elif kind == "measure":
            _, path, index, number, repeat, min_ms, flush, rtol, atol, cold = msg
            start = time.perf_counter()
            lib = libs.get(path)
            if lib is None:
                try:
                    lib = libs[path] = open_library(path)
                except LibraryError as e:
                    conn.send(("SETUP", str(e), [], 0.0))
                    continue
            out.fill(np.nan)
            rc = lib.tuner_run(index, args)
            if rc:
                conn.send(("RUNTIME_ERROR", f"kernel returned error code {rc}", [], time.perf_counter() - start))
                continue
            problem = check_output(out, ref, rtol, atol)
            if problem:
                conn.send(("WRONG_ANSWER", problem, [], time.perf_counter() - start))
                continue
            costs = ffi.new("double[]", repeat)
            if any(cold):
                rc = lib.tuner_time_cold(index, args, len(cold), ffi.new("long long[]", cold), number, repeat,
                                         min_ms, costs)
            else:
                rc = lib.tuner_time(index, args, number, repeat, min_ms, int(flush), costs)
            if rc:
                conn.send(("RUNTIME_ERROR", f"kernel returned error code {rc} while timed", [],
                           time.perf_counter() - start))
                continue
            conn.send(("OK", "", [float(c) for c in costs], time.perf_counter() - start))


def spawn(module: str, env: dict):
    """(process, Channel): `python -m module` as a plain child process (not multiprocessing, so
    the caller's script is never re-imported), in its own session (a Ctrl-C meant for the tuner
    does not reach it), `env` added to the environment; its side runs `serve`."""
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=dict(os.environ, TUNER_PARENT_PID=str(os.getpid()), **env), start_new_session=True)
    channel = Channel(proc.stdout.fileno(), proc.stdin.fileno())
    proc.stdin.close()
    proc.stdout.close()
    return proc, channel


def serve(main) -> None:
    """The child's side of `spawn`: main(channel) until the tuner stops it or goes away."""
    die_with_parent(int(os.environ.get("TUNER_PARENT_PID", os.getppid())))
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the tuner decides when we stop
    channel = Channel(0, 1)
    os.dup2(2, 1)  # anything printed (a kernel's, a warning) goes to stderr, never into the channel
    try:
        main(channel)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        pass                                         # the tuner went away: nothing to report to


if __name__ == "__main__":
    serve(main)
