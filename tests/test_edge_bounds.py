"""The edge is bounded before any work, on both engines: while anonymous clients send 16 MB
bearer tokens and 300 MB bodies, every one of them is refused (431 or 401, or cut off), a
customer's runs and an approver's decisions complete, and the server's memory stays within
`benchmarks.edge_load.MEMORY_BOUND_MB` of what it used without them. (How long each round
takes is the benchmark's to print, with its ratio to idle: `python -m benchmarks.edge_load`.)"""

from __future__ import annotations

import pytest

from benchmarks import edge_load
from benchmarks.perf_setup import bench_environment
from tests.test_aegra_scaleout import AEGRA, REDIS_URL

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.mark.parametrize(
    "engine",
    [
        "langgraph",
        pytest.param("aegra", marks=AEGRA),
    ],
)
def test_a_flood_of_huge_tokens_and_bodies_is_refused_before_any_work(
    engine: str, postgres_server_url: str
) -> None:
    with (
        bench_environment(postgres_server_url) as bench,
        edge_load.served(engine, bench, REDIS_URL) as (url, pid),
    ):
        measured = edge_load.measure(url, pid, bench, rounds=2, attackers=2, engine=engine)
    assert all(r.completed for r in (*measured.idle.rounds, *measured.attacked.rounds))
    answers = {answer.split(" ", 1)[1] for answer in measured.answers}
    assert answers and answers <= {"431", "401", "closed"}, measured.answers
    assert any(a.startswith("huge_token") for a in measured.answers)
    assert any(a.startswith("huge_body") for a in measured.answers)
    grew = measured.attacked.peak_mb - measured.idle.peak_mb
    assert grew < edge_load.MEMORY_BOUND_MB, edge_load.report(measured)
