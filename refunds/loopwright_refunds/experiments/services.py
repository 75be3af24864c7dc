"""The reference services, started with TCP_NODELAY on their listening sockets.

`services/serve.py` binds its sockets without TCP_NODELAY and hands them to uvicorn, which then
does not set it either; every response is held by Nagle's algorithm until the client's delayed
ACK, about 40 ms, while the service itself answers in under a millisecond. That would add 40 ms
to every tool call of every system (more to the system that makes more calls) and drown what the
experiment and the benchmarks measure. The experiment starts the same services, from the same
code, with the socket option set: `python -m experiments.services` patches `_bind` and runs
`services.serve.main`.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from loopwright.processes import ChildProcess, spawn
from loopwright_refunds.services import serve
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import READY_FILE, RunningServices, ServicesFailedToStart

START_TIMEOUT_S = 20.0
_bind = serve._bind


def _bind_nodelay(host: str, port: int) -> socket.socket:
    sock = _bind(host, port)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
    return sock


def start_services(data_dir: Path) -> RunningServices:
    """Like `services.launcher.start_services`, with TCP_NODELAY."""
    data_dir.mkdir(parents=True, exist_ok=True)
    ready = data_dir / READY_FILE
    command = [
        sys.executable,
        "-m",
        "loopwright_refunds.experiments.services",
        "--data-dir",
        str(data_dir),
    ]
    with (data_dir / "services.log").open("ab") as log:
        # A lifeline, as the launcher's: a killed experiment takes its services with it.
        process, lifeline = spawn(
            [*command, "--ready-file", str(ready)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            ChildProcess(process, lifeline).stop()
            raise ServicesFailedToStart(f"the reference services did not start; see {data_dir}")
        time.sleep(0.02)
    endpoints = ServiceEndpoints.model_validate_json(ready.read_text())
    return RunningServices(process, endpoints, lifeline)


if __name__ == "__main__":
    serve._bind = _bind_nodelay
    serve.main()
