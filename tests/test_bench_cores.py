"""bench.cores: the hop of a cache line between the two cores a 2-thread benchmark runs on, and
paired ratios told apart by it."""
import os

import pytest

from bench.cores import FAR, Placements, core_to_core_ns, placed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to bounce a line between")
def test_a_line_bounced_between_two_cpus_takes_nanoseconds_and_leaves_the_callers_affinity_alone():
    before = os.sched_getaffinity(0)
    ns = core_to_core_ns(hops=20_000)
    assert ns is not None and 1 < ns < 100_000
    assert os.sched_getaffinity(0) == before


def test_with_one_cpu_there_is_no_hop(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert core_to_core_ns() is None


def test_ratios_are_told_apart_only_where_a_run_met_both_placements():
    place = Placements()
    said = []
    step = place.after(said.append)
    for ns in (30.0, 32.0, 170.0, 31.0, 175.0):
        place.samples.append(ns)
    by = place.split([0.9, 0.92, 1.1, 0.91, 1.2])
    assert by == {"near": 0.91, "far": 1.15, "far_rounds": 2}
    assert placed(by) == "; cores near 0.910x, far 1.150x (2 rounds)" and placed({}) == ""
    place.samples = [70.0, 80.0, 70.0 * FAR * 0.99]
    assert place.split([1.0, 1.0, 1.0]) == {}
    place.samples = [None, None]
    assert place.split([1.0, 1.0]) == {}
    place.samples = []
    step("round 1/1: a 1.00 ms")
    assert len(place.samples) == 1 and said and said[0].startswith("round 1/1: a 1.00 ms [cores")
