"""bench/build_cpu.py replays the throughput workload through the real extender core: pods are
filtered and bound (not refused wholesale), so the CPU it reports is the work of placing them."""

from __future__ import annotations

from bench.build_cpu import replay


def test_the_replay_binds_the_workloads_pods_and_times_each_phase() -> None:
    got = replay(40, 60, "t")
    # The workload's pods fit on 40 nodes of 8 GPUs (bench/scheduler_throughput.py's mix), except
    # those the extender's policy refuses: most are bound.
    assert got["bound"] >= 40, got
    assert got["filter_ms"] > 0 and got["bind_ms"] > 0 and got["watch_ms"] > 0
    assert abs(got["total_ms"] - (got["filter_ms"] + got["bind_ms"] + got["watch_ms"])) < 1e-9
