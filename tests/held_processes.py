"""A test that holds what a test run starts and waits to be killed; run only by
tests/test_nothing_outlives_a_test_run.py, in a pytest of its own (its name is no test module's:
the suite does not collect it).

It starts the embedded Postgres (DATABASE_URL unset), the reference services (a child with a
lifeline) and a plain child process (none: only the guard stops it), then writes what it holds
to $HELD_REPORT and sleeps until it is killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.conftest import SCRATCH
from tests.process_guard import MARK_ENV

REPORT_ENV = "HELD_REPORT"


def test_holds_processes_until_killed(
    postgres_url: str, services: ServiceEndpoints, request: pytest.FixtureRequest
) -> None:
    scratch = request.config.stash[SCRATCH]
    [postmaster] = scratch.glob("lw-pg-*/data/postmaster.pid")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    # The mark this process was started with (its parent pytest's) and its own.
    started_with = dict(
        v.split(b"=", 1) for v in Path("/proc/self/environ").read_bytes().split(b"\0") if b"=" in v
    )
    held = {
        "worker": os.getpid(),
        "marks": [started_with[MARK_ENV.encode()].decode(), os.environ[MARK_ENV]],
        "pids": [
            os.getpid(),
            sleeper.pid,
            int(postmaster.read_text().splitlines()[0]),
            *(
                int(p)
                for p in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
                .read_text()
                .split()
                if int(p) != sleeper.pid
            ),
        ],
        "scratch": str(scratch),
    }
    report = Path(os.environ[REPORT_ENV])
    report.with_suffix(".tmp").write_text(json.dumps(held))
    report.with_suffix(".tmp").rename(report)
    time.sleep(3600)
