"""Worker processes: a plain child process that serves pickled messages over its stdin/stdout.

A worker runs apart from the tuner so that native code that crashes or hangs takes only that
process down. It never outlives the tuner: the kernel delivers SIGKILL when the parent dies
(Linux), and a watchdog thread (which runs while native code spins, since cffi calls release the
GIL) exits as soon as the process has been re-parented.
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
