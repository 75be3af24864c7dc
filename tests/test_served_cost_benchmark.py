"""`benchmarks.served_cost` runs and prints its figures (the figures themselves are the
benchmark's): the same runs on a worker and on an Aegra instance, one refund per order, and
Aegra's own floor (a one-node graph on a plain instance)."""

from __future__ import annotations

import re

import pytest

from benchmarks import served_cost
from tests.test_aegra_scaleout import pytestmark as aegra_marks

pytestmark = [pytest.mark.slow, *aegra_marks]


def test_the_served_cost_benchmark_prints_both_sides(
    postgres_server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    served_cost.main(["--runs", "3", "--db", postgres_server_url])
    out = capsys.readouterr().out
    assert re.search(r"loopwright worker\s+CPU\s+[\d.]+ ms per run", out), out
    assert re.search(r"Aegra instance\s+CPU\s+[\d.]+ ms per run\s+\([\d.]+x the worker's", out)
    assert re.search(r"its event loop\s+CPU\s+[\d.]+ ms per run", out), out
    assert re.search(r"Aegra's own floor\s+CPU\s+[\d.]+ ms per run\s+\(a one-node graph", out)
    assert re.search(r"3 runs created through the API: [\d.]+ s of client time", out), out
