"""`benchmarks.model_robustness` runs on the runtime's dependencies alone, and its new
behaviours end typed and truthful (the figures themselves are the benchmark's)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import model_robustness
from tests.runtime_fixtures import REPO


def test_the_benchmark_imports_nothing_of_the_dev_extras() -> None:
    """What failed before: its server imported pytest."""
    blocked = "import sys; sys.modules['pytest'] = None; import benchmarks.model_robustness"
    subprocess.run([sys.executable, "-c", blocked], cwd=REPO, check=True)


@pytest.mark.postgres
def test_a_false_claim_and_a_verified_refund_with_a_malformed_answer_end_truthfully(
    postgres_server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("false claim, ineligible order", "refund made, last answer a call"):
        code = model_robustness.main(["--runs", "1", "--db", postgres_server_url, "--only", name])
        [row] = [
            line[32:].split()
            for line in capsys.readouterr().out.splitlines()
            if line.startswith(name) and len(line[32:].split()) == 6
        ]
        assert code == 0
        runs, typed, truthful, broke, hangs, _seconds = row
        assert (runs, typed, truthful, broke, hangs) == ("1", "1", "1", "0", "0"), name
