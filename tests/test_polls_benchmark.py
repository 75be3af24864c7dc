"""`benchmarks.polls` runs and prints its figures (the figures themselves are the benchmark's)."""

from __future__ import annotations

import re

import pytest

from benchmarks import polls


def test_the_polls_benchmark_prints_each_read_with_and_without_the_index(
    postgres_server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    polls.main(["--runs", "300", "--db", postgres_server_url])
    lines = capsys.readouterr().out.splitlines()
    shape = re.compile(
        r"^(postgres|sqlite), 300 ended runs: (due|unended) [\d.]+ ms with the index, "
        r"[\d.]+ ms without: [\d.]+x$"
    )
    assert len(lines) == 4 and all(shape.match(line) for line in lines), lines
