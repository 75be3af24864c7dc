"""The chaos benchmark, small: workers SIGKILLed mid-run, or cut off from Postgres, neither
duplicate, lose nor strand a run; piped, it tells its progress in lines as it goes.

The benchmark is a script (`python -m benchmarks.chaos`); this runs it the way CI does, as a
separate process on a fresh Postgres database, and reads the figures it prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.runtime_fixtures import DURATION, PATIENCE_S, REPO

# 20 runs, 10 kills of working workers, and now and then a worker's Postgres connections
# terminated under it. The schedule is completed whatever the timing (every kill, a connection
# drop at least: on idle workers once the runs are done if need be), so the figures asserted
# below never depend on chance; nor on the machine's load: a run is given up on as stalled only
# after minutes without a change, and the benchmark's time limit is the test's patience (only a
# hang reaches either; a loaded machine makes a worker's start alone take many seconds).
SMALL = (
    *("--runs", "20", "--kills", "10", "--kill-every-ms", "300"),
    *("--drop-every-ms", "800", "--stall-s", "180", "--complete-schedule"),
)
BENCHMARK = (sys.executable, "-m", "benchmarks.chaos", *SMALL, "--timeout-s", f"{PATIENCE_S:.0f}")


def figure(output: str, name: str) -> int:
    """The number on the benchmark's `name` line, e.g. `kills   10  (mid-run 9, ...)`."""
    match = re.search(rf"^{name}\s+(\d+)", output, re.MULTILINE)
    assert match, f"no {name!r} line in:\n{output}"
    return int(match.group(1))


@pytest.mark.slow
@pytest.mark.postgres
def test_runs_survive_workers_killed_at_random(postgres_url: str) -> None:
    result = subprocess.run(
        [*BENCHMARK, "--db", postgres_url],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=PATIENCE_S + 60,  # the benchmark's own limit, then its report
    )
    output = result.stdout + result.stderr
    assert figure(output, "runs") == 20, output
    assert figure(output, "kills") == 10, output
    assert figure(output, "connection drops") >= 1, output
    assert re.search(r"\(reconnects [1-9]", output), output
    for name in ("duplicates", "lost", "stuck"):
        assert figure(output, name) == 0, output
    assert figure(output, "completed") == 20, output
    assert re.search(r"one per [\d,]+ ms on average, asked one per 300 ms", output), output
    assert result.returncode == 0, output
    # Piped (as here), the progress is whole lines on stderr, each saying how many runs finished
    # and the kills so far; how often they come is the helper's (tests/test_progress.py).
    assert "\r" not in result.stderr and "\x1b" not in result.stderr, result.stderr
    lines = [
        line for line in result.stderr.splitlines() if re.match(r"(finished|judged) runs ", line)
    ]
    assert re.fullmatch(rf"finished runs 0/20 \(0%\), {DURATION} elapsed", lines[0]), lines
    # The last word on the chaos (kills may go on once the runs are done: --complete-schedule).
    done = [line for line in lines if line.startswith("finished runs ")][-1]
    assert re.fullmatch(
        rf"finished runs 20/20 \(100%\), {DURATION} elapsed, kills 10 \(mid-run \d+\).*", done
    ), done
    assert lines[-1].startswith("judged runs 20/20 (100%), "), result.stderr
