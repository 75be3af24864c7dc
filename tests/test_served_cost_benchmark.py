"""`benchmarks.served_cost` runs and prints its figures (the figures themselves are the
benchmark's): the same runs on a worker and on an Aegra instance, one refund per order, and
Aegra's own floors (a one-node graph, and a chain of as many supersteps as the worker's runs, on a
plain instance), and loopwright's share: the instance's cost less the second, the median of the
rounds'."""

from __future__ import annotations

import re

import pytest

from benchmarks import served_cost
from tests.test_aegra_scaleout import pytestmark as aegra_marks

pytestmark = [pytest.mark.slow, *aegra_marks]


def test_the_served_cost_benchmark_prints_both_sides(
    postgres_server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    served_cost.main(["--runs", "3", "--rounds", "2", "--db", postgres_server_url])
    out = capsys.readouterr().out
    assert re.search(r"loopwright worker\s+CPU\s+[\d.]+ ms per run", out), out
    assert re.search(r"Aegra instance\s+CPU\s+[\d.]+ ms per run\s+\([\d.]+x the worker's", out)
    assert re.search(r"its event loop\s+CPU\s+[\d.]+ ms per run", out), out
    assert re.search(r"Aegra's own floor\s+CPU\s+[\d.]+ ms per run\s+\(a one-node graph", out)
    worker = re.search(r"loopwright worker\s+CPU\s+[\d.]+ ms per run\s+\((\d+) checkpoints", out)
    assert worker is not None and int(worker[1]) > 5, out  # a refund's supersteps, counted
    chain = re.search(r"Aegra's own floor\s+CPU\s+([\d.]+) ms per run\s+\(a chain of (\d+)", out)
    assert chain is not None and int(chain[2]) == int(worker[1]) - 1, out
    share = re.search(r"loopwright's share\s+CPU\s+(-?[\d.]+) ms per run", out)
    engine = re.search(r"Aegra instance\s+CPU\s+([\d.]+) ms", out)
    assert share is not None and engine is not None, out
    # Of two rounds, each median is their mean: the share's is the engine's less the chain's.
    assert abs(float(share[1]) - (float(engine[1]) - float(chain[1]))) < 0.15, out
    each = re.search(r"each round's (-?[\d.]+)x, (-?[\d.]+)x", out)
    ratio = re.search(r"the instance's less that floor: (-?[\d.]+)x the worker's", out)
    assert each is not None and ratio is not None, out
    assert abs(float(ratio[1]) - (float(each[1]) + float(each[2])) / 2) < 0.011, out
    assert re.search(r"3 runs created through the API: [\d.]+ s of client time", out), out
    # The worker's runs are submitted as `Runner.submit` does, and what that costs is said.
    submitted = re.search(
        r"the worker's runs submitted\s+([\d.]+) ms per run.*share is (-?[\d.]+)x the worker's run"
        r" and its submission together",
        out,
    )
    assert submitted is not None and float(submitted[1]) > 0, out
    # And again with the instance running one run at a time, as the worker does: its share is
    # its own instance's less its own chain's floor.
    serial = re.search(
        r"one run at a time, as the worker runs them .*: instance ([\d.]+) ms per run, the"
        r" chain's floor ([\d.]+) ms; loopwright's share (-?[\d.]+) ms = (-?[\d.]+)x the worker's,"
        r" each round's (-?[\d.]+)x, (-?[\d.]+)x",
        out,
    )
    assert serial is not None, out
    assert abs(float(serial[3]) - (float(serial[1]) - float(serial[2]))) < 0.15, out
    assert abs(float(serial[4]) - (float(serial[5]) + float(serial[6])) / 2) < 0.011, out
