"""No child process outlives the command that started it, however that command ends.

The reference services and the LangGraph server are children of a CLI command; a command that
crashes (a crash point's `os._exit`) or is SIGKILLed cannot stop them itself. Left running,
adopted by init, they would keep the services' data directory and the server's port. Each case
runs the command in a new process, ends it without cleanup, and waits until no process is left
that names or holds the command's directories. And `serve` on a port a server already holds is
refused before anything starts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loopwright.core import tls
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.core.crashpoints import EXIT_CODE as CRASH_EXIT
from loopwright.processes import ChildProcess
from loopwright.server.bearer_tokens import DEV_TOKENS
from loopwright.server.launch import LOG_FILE, cannot_listen, server_env, start_server
from loopwright_refunds.services.endpoints import ENV_VAR as SERVICES_ENV
from loopwright_refunds.services.launcher import READY_FILE
from tests.ports import reserved_port
from tests.runtime_fixtures import DEMO_TASK, REPO, cli, sdk_client, wait_for


def alive(pid: int) -> bool:
    """Whether `pid` runs: an exited process that its new parent (init) has not reaped yet is
    a zombie, holding nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def processes_using(directory: Path) -> list[int]:
    """Running processes, other than this one, that name `directory` on their command line or
    hold a file open in it."""
    prefix = str(directory)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            named = prefix.encode() in (entry / "cmdline").read_bytes()
            held = any(os.readlink(fd).startswith(prefix) for fd in (entry / "fd").iterdir())
        except OSError:  # gone meanwhile, or not ours to look into
            continue
        if (named or held) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def dev_server(pid: int) -> int:
    """The LangGraph server `loopwright serve` (process `pid`) runs."""
    [server] = [
        child
        for child in children(pid)
        if b"loopwright.server.dev" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]
    return server


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without services, tokens or a database of its own: the command under
    test starts the services itself, on its LOOPWRIGHT_HOME."""
    dropped = (SERVICES_ENV, "DATABASE_URL", "LOOPWRIGHT_TOKENS", "LOOPWRIGHT_TOKENS_FILE")
    return {k: v for k, v in os.environ.items() if k not in dropped} | extra


def test_no_service_outlives_a_command_that_crashes(sqlite_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    crashed = cli(
        *("run", DEMO_TASK, "--user", "u-1", "--db", sqlite_url),
        env={"LOOPWRIGHT_HOME": str(home), CRASH_ENV: "node:model_step:start"},
    )
    assert crashed.returncode == CRASH_EXIT, crashed.stderr
    data = home / "services"
    assert (data / "orders.sqlite3").exists()  # the command did start them before it crashed
    wait_for(lambda: not processes_using(data))
    assert not (data / READY_FILE).exists()  # they shut down (and said so), not just vanished


PARENT = """
import sys
from pathlib import Path
from loopwright_refunds.services.launcher import start_services
services = start_services(Path(sys.argv[1]))
print(services.pid, flush=True)
sys.stdin.read()  # until killed
"""


def test_no_service_outlives_a_parent_killed_while_they_run(tmp_path: Path) -> None:
    data = tmp_path / "services"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**clean_env(), "PYTHONPATH": str(REPO)},
    )
    with parent:
        assert parent.stdout is not None
        services = int(parent.stdout.readline())
        assert alive(services) and services in children(parent.pid)
        parent.kill()
        parent.wait()
    wait_for(lambda: not alive(services))
    assert processes_using(data) == []


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port a server listens on."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def test_serve_refuses_a_busy_port_before_starting_anything(busy_port: int, tmp_path: Path) -> None:
    home = tmp_path / "home"
    refused = cli(
        "serve",
        *("--port", str(busy_port)),
        env=clean_env(
            LOOPWRIGHT_HOME=str(home), DATABASE_URL="postgresql://postgres@127.0.0.1:1/none"
        ),
    )
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert f"port {busy_port}" in line and "in use" in line
    assert not home.exists()  # no server directory, no services, no database file


def test_serve_names_a_token_file_that_is_not_there_as_resolved(tmp_path: Path) -> None:
    """A relative LOOPWRIGHT_TOKENS_FILE is taken from where serve was started; missing, it
    is one line naming it there, exit 2, before anything starts."""
    home = tmp_path / "home"
    with reserved_port() as port:
        refused = cli(
            *("serve", "--port", str(port)),
            cwd=tmp_path,
            env=clean_env(
                LOOPWRIGHT_HOME=str(home),
                LOOPWRIGHT_TOKENS_FILE="tokens.json",
                DATABASE_URL="postgresql://postgres@127.0.0.1:1/none",
            ),
        )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        f"loopwright: error: identities: token table file {tmp_path / 'tokens.json'}:"
        " No such file or directory"
    ]
    assert not home.exists()


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("192.0.2.1", "192.0.2.1 is no address of this machine: pick --host"),  # TEST-NET-1
        ("no-such-host.invalid", "no-such-host.invalid is no address this machine knows ("),
    ],
)
def test_serve_refuses_a_host_it_cannot_listen_on_saying_why(
    host: str, why: str, tmp_path: Path
) -> None:
    """Not "port 2024 is in use", as every failed bind was called."""
    home = tmp_path / "home"
    refused = cli(
        *("serve", "--host", host),
        env=clean_env(
            LOOPWRIGHT_HOME=str(home), DATABASE_URL="postgresql://postgres@127.0.0.1:1/none"
        ),
    )
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"loopwright: error: {why}"), line
    assert not home.exists()


@pytest.mark.postgres
def test_the_server_is_polled_where_langgraph_really_listens(
    busy_port: int, postgres_url: str, tmp_path: Path
) -> None:
    """`langgraph dev` moves off a busy port it is given; `start_server` follows it there."""
    env = server_env(
        clean_env(),
        {
            "DATABASE_URL": postgres_url,
            "PYTHONPATH": str(REPO),
            "LOOPWRIGHT_TOKENS_FILE": str(DEV_TOKENS),
            "LOOPWRIGHT_DEV_TOKENS": "1",
        },
    )
    with start_server(tmp_path / "server", env, port=busy_port) as server:
        assert server.url != f"http://127.0.0.1:{busy_port}"
        assert httpx.get(f"{server.url}/ok", timeout=5, verify=tls.context()).status_code == 200
    log = (tmp_path / "server" / LOG_FILE).read_text()
    assert f"Port {busy_port} is already in use" in log


@pytest.mark.postgres
def test_serve_killed_leaves_no_server_no_service_and_a_free_port(
    postgres_url: str, tmp_path: Path
) -> None:
    """Started in a directory of the user's with a relative LOOPWRIGHT_HOME, which the server
    (running in a directory of its own) and the business services serve starts for it use as
    the user meant."""
    home = tmp_path / "home"
    output = tmp_path / "serve.out"
    with reserved_port() as port, output.open("wb") as out:
        url = f"http://127.0.0.1:{port}"
        serving = subprocess.Popen(
            [sys.executable, "-m", "loopwright", "serve", "--port", str(port)],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(DATABASE_URL=postgres_url, LOOPWRIGHT_HOME="home", PYTHONPATH=str(REPO)),
        )
        with ChildProcess(serving):
            wait_for(lambda: _answers(url) or serving.poll() is not None)
            assert serving.poll() is None, output.read_text()
            # What the agent's servers share (its business services), then the server.
            server = dev_server(serving.pid)
            client = sdk_client(url=url, headers={"Authorization": "Bearer dev-u1"})
            thread = client.threads.create()["thread_id"]
            client.runs.wait(thread, "loopwright", input={"task": DEMO_TASK})
            assert client.threads.get_state(thread)["interrupts"]  # waits for an approver
            services = processes_using(home / "services")
            assert services and all(alive(pid) for pid in services)

            serving.kill()
            serving.wait()
        wait_for(lambda: not alive(server) and not processes_using(home))
        assert cannot_listen("127.0.0.1", port) is None
    assert "API" in (home / "server" / LOG_FILE).read_text()  # the log has what it said


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ok", timeout=1, verify=tls.context()).status_code == 200
    except httpx.TransportError:
        return False
