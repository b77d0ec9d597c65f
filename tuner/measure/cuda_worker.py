"""The GPU measurement process: owns the CUDA context, checks each kernel, times it with events.

Spawned and served like the CPU worker (toolchain.process: spawn / serve), so the runner's crash,
hang and restart handling is the same. A launch that fails (an illegal address, too many
resources) leaves a CUDA context that cannot be trusted: the error is reported, then this
process exits and the runner starts a fresh one for the next candidate.

Timing: one checked launch, then `repeat` repeats of `number` launches between two CUDA events
(number chosen so that a repeat lasts min_repeat_ms when 0); with flush, a buffer the size of
the L2 cache is overwritten before each repeat and each repeat is a single launch.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..toolchain.process import messages, serve
from .worker import check_output


def time_launches(drv, launch, repeat: int, min_ms: float, number: int = 0, before_repeat=None) -> list:
    """Seconds per launch over `repeat` repeats of `number` launches between two CUDA events;
    number 0 picks it from one timed launch so that a repeat lasts `min_ms`. `before_repeat`
    runs outside the events before each repeat (an L2 flush; then give number=1)."""
    begin, end = drv.Event(), drv.Event()
    begin.record()
    launch()
    end.record()
    end.synchronize()
    once = end.time_since(begin) * 1e-3
    n = number or max(1, int(min_ms * 1e-3 / max(once, 1e-7)) + 1)
    costs = []
    for _ in range(repeat):
        if before_repeat is not None:
            before_repeat()
        begin.record()
        for _ in range(n):
            launch()
        end.record()
        end.synchronize()
        costs.append(end.time_since(begin) * 1e-3 / n)
    return costs


def main(conn) -> None:
    try:
        import pycuda.driver as drv
        drv.init()
        ctx = drv.Device(0).make_context()
    except Exception as e:      # no pycuda, no driver, no device: said once, at setup
        for _ in messages(conn):
            conn.send(("SETUP", f"the GPU measurement process cannot start CUDA ({type(e).__name__}: {e}); "
                                "check pycuda (pip install -e '.[cuda]') and the driver (nvidia-smi)", [], 0.0))
        return
    try:
        _serve(conn, drv, ctx)
    finally:
        ctx.pop()


def _serve(conn, drv, ctx) -> None:
    modules: dict = {}
    d_in, ref, d_out, flush_buf = [], None, None, None
    l2 = max(4, drv.Device(0).get_attribute(drv.device_attribute.L2_CACHE_SIZE))
    for msg in messages(conn):
        kind = msg[0]
        if kind == "setup":
            d_in = [drv.to_device(np.ascontiguousarray(a, dtype=np.float32)) for a in msg[1]]
            ref = msg[2]
            d_out = drv.mem_alloc(max(4, ref.nbytes))
            conn.send(("ready",))
        elif kind == "release":
            modules.clear()
            conn.send(("ready",))
        elif kind == "measure":
            _, path, name, grid, block, number, repeat, min_ms, flush, rtol, atol = msg
            start = time.perf_counter()
            try:
                mod = modules.get(path)
                if mod is None:
                    mod = modules[path] = drv.module_from_file(path)
                fn = mod.get_function(name)
                args = [*d_in, d_out]

                def launch():
                    fn(*args, block=(block, 1, 1), grid=(grid, 1, 1))

                drv.memset_d32(d_out, 0x7FC00000, ref.size)        # NaN: a kernel that skips an output fails
                launch()
                ctx.synchronize()
                out = np.empty(ref.shape, np.float32)
                drv.memcpy_dtoh(out, d_out)
            except drv.Error as e:
                conn.send(("RUNTIME_ERROR", f"launch failed: {e}", [], time.perf_counter() - start))
                os._exit(3)             # the context may be broken: the runner starts a fresh process
            problem = check_output(out, ref, rtol, atol)
            if problem:
                conn.send(("WRONG_ANSWER", problem, [], time.perf_counter() - start))
                continue
            if flush and flush_buf is None:
                flush_buf = drv.mem_alloc(2 * l2)
            try:
                costs = time_launches(drv, launch, repeat, min_ms, 1 if flush else number,
                                      (lambda: drv.memset_d32(flush_buf, 0, l2 // 2)) if flush else None)
            except drv.Error as e:
                conn.send(("RUNTIME_ERROR", f"failed while timed: {e}", [], time.perf_counter() - start))
                os._exit(3)
            conn.send(("OK", "", costs, time.perf_counter() - start))


if __name__ == "__main__":
    serve(main)
