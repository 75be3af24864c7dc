"""Child processes the runtime starts (a LangGraph server, an agent's business services): one
way to stop them, so that none outlives the command that started it by accident."""

from __future__ import annotations

import subprocess
from types import TracebackType
from typing import Self


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
