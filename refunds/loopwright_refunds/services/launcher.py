"""Start the reference services in a child process and know where they listen.

A child process (not threads in the caller) keeps the services' event loop, signals and
SQLite handles apart from the runtime under test, and lets a test kill and restart them on the
same data directory the way a real deployment would restart.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from loopwright.processes import START_TIMEOUT_S, ChildProcess, spawn
from loopwright_refunds.services.endpoints import ServiceEndpoints

READY_FILE = "endpoints.json"
LOG_FILE = "services.log"


class ServicesFailedToStart(RuntimeError):
    pass


class RunningServices(ChildProcess):
    """The child process serving the three services."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        endpoints: ServiceEndpoints,
        lifeline: int | None = None,
    ) -> None:
        super().__init__(process, lifeline)
        self.endpoints = endpoints


def start_services(
    data_dir: Path,
    *,
    timeout: float = START_TIMEOUT_S,
    endpoints: ServiceEndpoints | None = None,
) -> RunningServices:
    """Spawn ``python -m loopwright_refunds.services`` on `data_dir`; wait until all three listen.

    Existing data in `data_dir` is kept, so starting again after `stop` resumes where it was;
    given the `endpoints` they had, on the same ports, where their clients still look.
    The child's stderr is appended to ``services.log`` there and quoted if it fails to start.
    The child stops when this process dies, however it dies (`loopwright.processes.spawn`):
    services left running, adopted by init, would share the data directory with the next ones.
    """
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    ready_file = data_dir / READY_FILE
    ready_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "loopwright_refunds.services", "--data-dir", str(data_dir)]
    if endpoints is not None:
        for service, url in endpoints.model_dump().items():
            command += [f"--{service}-port", url.rpartition(":")[2]]
    with (data_dir / LOG_FILE).open("ab") as log:
        log_start = log.tell()
        process, lifeline = spawn(
            [*command, "--ready-file", str(ready_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    problem = _wait_until_ready(process, ready_file, timeout)
    if problem is None:
        endpoints = ServiceEndpoints.model_validate_json(ready_file.read_text())
        return RunningServices(process, endpoints, lifeline)
    ChildProcess(process, lifeline).stop()
    with (data_dir / LOG_FILE).open("rb") as log:
        log.seek(log_start)
        stderr = log.read().decode(errors="replace")
    raise ServicesFailedToStart(f"the reference services {problem}; stderr:\n{stderr}")


def _wait_until_ready(
    process: subprocess.Popen[bytes], ready_file: Path, timeout: float
) -> str | None:
    """None once the ready file exists, else what went wrong first."""
    deadline = time.monotonic() + timeout
    while not ready_file.exists():
        if process.poll() is not None:
            return f"exited with code {process.returncode}"
        if time.monotonic() > deadline:
            return f"were not ready after {timeout} s"
        time.sleep(0.02)
    return None
