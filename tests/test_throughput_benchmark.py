"""`benchmarks.throughput` names what limits the workers, from what it measured."""

from __future__ import annotations

import sys

import pytest

from benchmarks.perf_setup import bench_environment
from benchmarks.throughput import measure, report


@pytest.mark.skipif(sys.platform != "linux", reason="the workers are sampled through /proc")
def test_a_tiny_throughput_run_accounts_for_the_workers_time(postgres_server_url: str) -> None:
    with bench_environment(postgres_server_url) as bench:
        [found] = measure(bench, runs=12, worker_counts=[1])
    lines = report([found])

    assert found.duplicates == 0 and found.attempts_per_run == 1.0
    assert found.time.samples > 0
    assert abs(sum(found.waits.values()) - 1) < 1e-9
    # One run of a refund waits on Postgres (its node commits) and on the services (its calls).
    assert found.waits["on Postgres"] > 0 and found.waits["on the services"] > 0
    assert lines[-1].startswith("  still growing at 1 worker; there, the workers wait most on: ")
