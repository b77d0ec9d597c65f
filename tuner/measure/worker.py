"""The measurement process: loads built libraries, checks each kernel, then times it in C.

It is a worker process (toolchain.process): a kernel that crashes or hangs takes only this
process down; the parent records the error and starts a new one.
"""
from __future__ import annotations

import time

import numpy as np

from ..toolchain.library import LibraryError, aligned_copy, aligned_empty, open_library, pointer_array
from ..toolchain.library import ffi as get_ffi
from ..toolchain.process import messages, serve


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


def main(conn) -> None:
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


if __name__ == "__main__":
    serve(main)
