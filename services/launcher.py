"""Start the reference services in a child process and know where they listen.

A child process (not threads in the caller) keeps the services' event loop, signals and
SQLite handles apart from the runtime under test, and lets a test kill and restart them on the
same data directory the way a real deployment would restart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from services.endpoints import ServiceEndpoints

READY_FILE = "endpoints.json"
LOG_FILE = "services.log"
# The child imports `services` from the same checkout as this module, wherever cwd is.
_SOURCE_ROOT = Path(__file__).resolve().parent.parent


class ServicesFailedToStart(RuntimeError):
    pass


class ChildProcess:
    """A child process; a context manager that stops it (`terminate`, after `grace_s`)."""

    grace_s = 5.0

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        """Terminate gracefully; kill if that takes more than `grace_s`. Safe to call twice."""
        terminate(self.process, self.grace_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class RunningServices(ChildProcess):
    """The child process serving the three services."""

    def __init__(self, process: subprocess.Popen[bytes], endpoints: ServiceEndpoints) -> None:
        super().__init__(process)
        self.endpoints = endpoints


def start_services(data_dir: Path, *, timeout: float = 20) -> RunningServices:
    """Spawn ``python -m services`` on `data_dir` and wait until all three services listen.

    Existing data in `data_dir` is kept, so starting again after `stop` resumes where it was.
    The child's stderr is appended to ``services.log`` there and quoted if it fails to start.
    """
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    ready_file = data_dir / READY_FILE
    ready_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "services", "--data-dir", str(data_dir)]
    with (data_dir / LOG_FILE).open("ab") as log:
        log_start = log.tell()
        process = subprocess.Popen(
            [*command, "--ready-file", str(ready_file)],
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    problem = _wait_until_ready(process, ready_file, timeout)
    if problem is None:
        return RunningServices(
            process, ServiceEndpoints.model_validate_json(ready_file.read_text())
        )
    terminate(process)
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


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        path for path in (str(_SOURCE_ROOT), env.get("PYTHONPATH")) if path
    )
    return env


def terminate(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if the child has not exited within `grace_s`. Safe to call twice."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
