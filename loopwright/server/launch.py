"""Start `langgraph dev` for an agent, offline, as a child process.

Used by `loopwright serve` and by the tests. Offline means: no browser is opened, the CLI's
analytics and the server's version check are off, and LangSmith tracing is off unless the
environment configures it. The in-memory runtime keeps its thread registry in `.langgraph_api/`
under its working directory, so the server runs in a directory of its own (under
LOOPWRIGHT_HOME, or a test's temp dir), with a langgraph.json written there (`SERVER_CONFIG`:
every piece named by module, so it works the same from a checkout and from an installed
wheel). The agent it hosts is `LOOPWRIGHT_AGENT` in its environment; checkpoints, journal and
leases are in Postgres (`DATABASE_URL`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import httpx

from loopwright.processes import ChildProcess

# The graph's id on the server: what clients and the inbox name as the assistant.
GRAPH_ID = "loopwright"
SERVER_CONFIG: dict[str, Any] = {
    "$schema": "https://langgra.ph/schema.json",
    "python_version": "3.12",
    "dependencies": ["."],
    "graphs": {GRAPH_ID: "loopwright.server.graph:graph"},
    # The checkpointer's module path is dotted to the attribute (langgraph-api's spelling).
    "checkpointer": {"path": "loopwright.server.checkpointer.checkpointer"},
    "auth": {"path": "loopwright.server.auth:auth", "disable_studio_auth": True},
    "http": {"app": "loopwright.server.app:app"},
}
DEV_TOKENS = Path(__file__).with_name("dev-tokens.json")
LOG_FILE = "server.log"
OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
}
TRACING_VARS = ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING_V2")


class ServerFailedToStart(RuntimeError):
    pass


def file_config() -> dict[str, Any]:
    """`SERVER_CONFIG` naming files instead of modules, for servers that load only files
    (Aegra): the installed loopwright's own files."""
    here = Path(__file__).parent
    return {
        **SERVER_CONFIG,
        "graphs": {GRAPH_ID: f"{here / 'graph.py'}:graph"},
        "auth": {**SERVER_CONFIG["auth"], "path": f"{here / 'auth.py'}:auth"},
        "http": {"app": f"{here / 'app.py'}:app"},
    }


def served_config(workdir: Path) -> Path:
    """`SERVER_CONFIG` as langgraph.json in `workdir` (the server's cwd)."""
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "langgraph.json"
    target.write_text(json.dumps(SERVER_CONFIG, indent=2))
    return target


def server_env(base: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: `base` plus `extra`, offline, this checkout importable."""
    env = {**base, **(extra or {}), **OFFLINE_ENV}
    if not any(env.get(name) for name in TRACING_VARS):
        env["LANGSMITH_TRACING"] = "false"
    return env


def dev_command(config: Path, *, host: str, port: int) -> list[str]:
    return [
        *(sys.executable, "-m", "langgraph_cli", "dev"),
        *("--no-browser", "--no-reload"),
        *("--host", host, "--port", str(port), "--config", str(config)),
    ]


class RunningServer(ChildProcess):
    """A `langgraph dev` child process."""

    grace_s = 10.0

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        super().__init__(process)
        self.url = url
        self.log = log


def start_server(
    workdir: Path,
    env: Mapping[str, str],
    *,
    host: str = "127.0.0.1",
    port: int = 2024,
    timeout: float = 60,
    stdout: IO[bytes] | None = None,
) -> RunningServer:
    """Start the server in `workdir` and wait until it answers; its output goes to server.log."""
    config = served_config(workdir)
    log_path = workdir / LOG_FILE
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            dev_command(config, host=host, port=port),
            cwd=workdir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout or log,
            stderr=subprocess.STDOUT,
        )
    server = RunningServer(process, f"http://{host}:{port}", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailedToStart(
                f"langgraph dev exited with {process.returncode}; see {log_path}:\n"
                + log_path.read_text(errors="replace")[-4000:]
            )
        try:
            if httpx.get(f"{server.url}/ok", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise ServerFailedToStart(f"langgraph dev did not answer within {timeout} s; see {log_path}")
