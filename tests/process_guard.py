"""Nothing a test run starts outlives it, however the run ends: finished, failed, Ctrl-C of
`make test`, CI's time limit, SIGKILL of pytest or of one of its xdist workers.

Each pytest process (the controller and every worker) starts a guard (`start`): a small process
of its own session (a Ctrl-C at the terminal does not reach it), holding the read end of a
lifeline (`loopwright.processes.spawn`) and a mark, a value of `MARK_ENV` that every process the
pytest process starts from then on inherits: servers, workers, the reference services, the
embedded Postgres and its backends, and their own children. Once the pytest process is gone,
however it went, the lifeline reaches end of file and the guard stops every process that carries
its mark (SIGTERM, then SIGKILL after `GRACE_S`) and removes the scratch directory it was given,
where the embedded Postgres keeps its data. A worker's guard is started without the marks of
the processes above it, so that it outlives them to do its own sweep.

Processes are told by their environment as the kernel keeps it (/proc/PID/environ): where there
is no /proc, there is no guard. A process started with an environment of its own making (not
inheriting os.environ) carries no mark and is not stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from loopwright.processes import LIFELINE_ENV, spawn

MARK_ENV = "LOOPWRIGHT_TEST_RUN"
PROC = Path("/proc")
# How long the marked processes get to stop on SIGTERM (a server's graceful stop is 10 s).
GRACE_S = 15.0
# A marked process that survives SIGKILL this long (stuck in the kernel) is left.
GIVE_UP_S = 60.0
REPO = Path(__file__).resolve().parent.parent

_guards: list[subprocess.Popen[bytes]] = []  # referenced for as long as this process lives


def start(scratch: Path) -> str | None:
    """Guard the processes this process starts from now on, and `scratch`; the mark they carry
    (None where processes cannot be told by their environment)."""
    if not PROC.is_dir():
        return None
    token = uuid.uuid4().hex
    clean = {k: v for k, v in os.environ.items() if k != MARK_ENV}
    process, _lifeline = spawn(  # the lifeline's write end stays open until this process ends
        [sys.executable, "-m", "tests.process_guard", token, str(scratch)],
        env=clean,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    _guards.append(process)
    os.environ[MARK_ENV] = token
    return token


def marked(token: str) -> set[int]:
    """The live processes carrying `token` (an exited one's environment reads empty)."""
    mark = f"{MARK_ENV}={token}".encode()
    found = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            variables = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if mark in variables:
            found.add(int(entry.name))
    return found


def stop_marked(token: str, grace_s: float = GRACE_S) -> None:
    """SIGTERM every process carrying `token` (and any that appears meanwhile), SIGKILL what is
    left after `grace_s`."""
    signalled: set[int] = set()
    started = time.monotonic()
    while (left := marked(token)) and time.monotonic() - started < grace_s + GIVE_UP_S:
        late = time.monotonic() - started > grace_s
        for pid in left if late else left - signalled:
            _signal(pid, signal.SIGKILL if late else signal.SIGTERM)
        signalled |= left
        time.sleep(0.1)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or not ours
        os.kill(pid, sig)


def main(token: str, scratch: str) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it ends once its work is done, not before
    with open(int(os.environ.pop(LIFELINE_ENV)), "rb", buffering=0) as lifeline:
        lifeline.read()  # nothing is ever written: this returns once the pytest process is gone
    stop_marked(token)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
