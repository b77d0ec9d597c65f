"""The fastest a kernel can run on its target: a timing beyond it is refused, as an error record.

Timed on this host (runner.CpuRunner): PEAK_SLACK times the FP32 FMA peak measured here at the
target's threads (peak.py), measured again before a refusal (a busy host measures it low).
Timed elsewhere (a cluster's workers, whose word is not trusted) or on a GPU: the target's
ceiling, which no machine of its ISA and threads can beat.
"""
from __future__ import annotations

import math
import threading

from ..database.result import RUNTIME_ERROR, MeasureResult
from . import peak

PEAK_SLACK = 2.0        # a faster core than the peak's, a peak measured while the host was busy
MAX_GHZ = 6.5           # above any CPU's boost clock
FLOPS_PER_LANE = 8      # per cycle: four FMA pipes, more than any x86 core has
GPU_MAX_GHZ = 3.0
GPU_FLOPS_PER_SM = 512  # per cycle: twice an SM's 128 FP32 FMA lanes
PEAK_ITERS = 5_000_000
_PEAKS: dict = {}       # str(target) -> the highest peak measured in this process
_LOCK = threading.Lock()


def ceiling_gflops(target) -> float:
    """What no machine of the target's kind, ISA and threads (SMs) reaches."""
    if target.kind == "cuda":
        return target.sms * GPU_FLOPS_PER_SM * GPU_MAX_GHZ
    return target.threads * target.lanes * FLOPS_PER_LANE * MAX_GHZ


def measured_peak(target, again: bool = False) -> float:
    """This host's FP32 FMA peak at the target's threads: the highest of the measurements so far."""
    with _LOCK:
        key = str(target)
        if again or key not in _PEAKS:
            _PEAKS[key] = max(_PEAKS.get(key, 0.0), peak.peak_gflops(target, target.threads, PEAK_ITERS))
        return _PEAKS[key]


def _seconds(c) -> bool:
    return isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0


def check(workload, target, result: MeasureResult, here: bool = False) -> MeasureResult:
    """`result`, or a RUNTIME_ERROR in its place when one of its timings is faster than `target`
    allows (here: timed on this host, bounded by its measured peak; else by the ceiling)."""
    if not result.ok:
        return result

    def refuse(why: str) -> MeasureResult:
        host = f" (from {result.host})" if result.host else ""
        return MeasureResult(RUNTIME_ERROR, f"timing refused{host}: {why}", build_s=result.build_s,
                             run_s=result.run_s, cold=result.cold, host=result.host)
    costs = result.costs if isinstance(result.costs, (list, tuple)) else None
    if not costs or not all(_seconds(c) for c in costs):
        return refuse(f"costs {str(result.costs)[:80]} are not positive finite seconds per call")
    flops = workload.least_flops         # a kernel may skip products of padding, or by +-1
    if not flops:
        return result
    gflops = flops / min(costs) / 1e9
    bound, what = ceiling_gflops(target), "the ceiling of its ISA and threads"
    if here and target.kind == "cpu":
        highest = measured_peak(target)
        if gflops > PEAK_SLACK * highest:
            highest = measured_peak(target, again=True)
        bound, what = min(bound, PEAK_SLACK * highest), f"{PEAK_SLACK:g}x this host's measured peak"
    if gflops <= bound:
        return result
    return refuse(f"{min(costs):.3g} s per call is {gflops:.4g} GFLOPS, beyond what '{target}' can do "
                  f"({bound:.4g} GFLOPS, {what}): a forged timing or a broken timer")
