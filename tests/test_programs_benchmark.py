"""`benchmarks.programs` runs both ways and prints its figures per refund (the figures
themselves are the benchmark's; only the model steps, which no clock decides, are checked)."""

from __future__ import annotations

import re

import pytest

from benchmarks import programs


def test_the_programs_benchmark_prints_both_ways_per_refund(
    postgres_server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    programs.main(["--sizes", "1", "3", "--repeats", "1", "--db", postgres_server_url])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["per", "refund", "loop", "program", "loop/program"]
    assert [line for line in lines if line.endswith("orders:")] == ["1 orders:", "3 orders:"]
    row = re.compile(r"^  (model steps|wall time \(ms\)|db [a-z ]+?) +[\d.]+ +[\d.]+ +[\d.]+x$")
    rows = [line for line in lines[1:] if not line.endswith("orders:")]
    assert len(rows) == 12 and all(row.match(line) for line in rows), lines
    # One call per model step: 2 per order and the answer; the program: 2 in all.
    steps = [line.split()[2:4] for line in rows if line.startswith("  model steps")]
    assert steps == [["3.0", "2.0"], ["2.3", "0.7"]]
