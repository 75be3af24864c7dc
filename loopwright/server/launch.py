"""Start `langgraph dev` for an agent, offline, as a child process.

Used by `loopwright serve` and by the tests. Offline means: no browser is opened, the CLI's
analytics and the server's version check are off, and LangSmith tracing is off unless the
environment configures it. The in-memory runtime keeps its thread registry in `.langgraph_api/`
under its working directory, so the server runs in a directory of its own (under
LOOPWRIGHT_HOME, or a test's temp dir), with a langgraph.json written there (`SERVER_CONFIG`:
every piece named by module, so it works the same from a checkout and from an installed
wheel). The agent it hosts is `LOOPWRIGHT_AGENT` in its environment; checkpoints, journal and
leases are in Postgres (`DATABASE_URL`). The server dies with the process that started it, even
a killed one (`loopwright.server.dev`), and is found at the URL it announces.

What every engine's servers are given is checked here before any starts (`serving_env`): the
settings a server reads from the environment and the identities it takes, each refused in one
line (`ServingRefused`) rather than by a server after it has started.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from loopwright._agent import Agent
from loopwright.core import tls
from loopwright.core.home import DEFAULT_HOME, HOME_ENV
from loopwright.core.roles import Roles
from loopwright.observability.tracing import TRACE_FILE_ENV
from loopwright.processes import START_TIMEOUT_S, ChildProcess, spawn
from loopwright.server.admissions import RUN_SLOTS
from loopwright.server.bearer_tokens import (
    DEV_TOKENS,
    PLAIN_TOKENS_ENV,
    PUBLISHED_REFUSED_ENV,
    TOKENS_ENV,
    TOKENS_FILE_ENV,
    PublishedTokenTaken,
    plain_tokens_allowed,
)
from loopwright.server.dev import GRACE_S
from loopwright.server.identities import Identities
from loopwright.server.jwt_identity import JWKS_ENV, JwtSettings
from loopwright.server.resources import ServerMisconfigured, check_settings
from loopwright.server.users import IdentityConfigError

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
LOG_FILE = "server.log"
OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
}
TRACING_VARS = ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING_V2")
# The line of its welcome banner where `langgraph dev` says where it listens (colours aside).
ANNOUNCED_URL = re.compile(rb"API: (?:\x1b\[[0-9;]*m)?(https?://[^\s\x1b]+)")


class ServerFailedToStart(RuntimeError):
    pass


class ServingRefused(ValueError):
    """What the servers would be given, refused before any starts; the message says why."""


@dataclass
class ServingEnv:
    """What every server of a deployment is given besides the operator's environment, and what
    a person starting it must be told about it (the development identities, say)."""

    env: dict[str, str]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Listening:
    """Where a deployment's servers listen, and whether the development token table may serve
    them: asked for (`--dev-tokens`), or the fallback where no identities are configured, on
    the langgraph engine and a loopback host only."""

    host: str
    dev_tokens: bool = False
    dev_fallback: bool = True

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def serving_env(
    environ: Mapping[str, str],
    *,
    database_url: str,
    agent_path: str,
    agent: Agent[Any],
    listening: Listening,
) -> ServingEnv:
    """The environment each server of `agent` (at `agent_path`) on `database_url` gets: the
    settings it reads checked, the paths the environment names made absolute, and its
    identities. ServingRefused, in one line, for what no server could serve with."""
    try:
        check_settings(agent)
    except ServerMisconfigured as exc:
        raise ServingRefused(str(exc)) from None
    served = identity_env(environ, roles=agent.roles, listening=listening)
    served.env |= {"DATABASE_URL": database_url, "LOOPWRIGHT_AGENT": agent_path}
    served.env |= paths_from_here(environ)
    return served


@contextmanager
def shared_by_servers(agent: Agent[Any]) -> Iterator[dict[str, str]]:
    """What every server of `agent` must share (`Agent(shared=...)`, e.g. a business service
    started locally), started once for the block, as the environment that points each
    server's dependencies at it (empty for an agent that declares nothing). ServingRefused, in
    one line, where it cannot be started (a setting of the agent's that is wrong)."""
    if agent.shared is None:
        yield {}
        return
    with ExitStack() as stack:
        try:
            shared = dict(stack.enter_context(agent.shared()))
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ServingRefused(
                f"agent {agent.name}: what its servers share could not be started: {first}"
            ) from exc
        yield shared


def paths_from_here(environ: Mapping[str, str]) -> dict[str, str]:
    """The paths the environment names, resolved against the directory the command was started
    in, for a server that runs in a directory of its own: the application stays importable
    (this directory, then PYTHONPATH's entries), and loopwright's home (named, or the default
    one here) and trace file are where the user meant them: the server's files (its trace
    file too) in the command's home, not in a home of the server's own under its directory."""
    named = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = {"PYTHONPATH": os.pathsep.join([os.getcwd(), *(os.path.abspath(p) for p in named)])}
    paths[HOME_ENV] = os.path.abspath(environ.get(HOME_ENV) or DEFAULT_HOME)
    if value := environ.get(TRACE_FILE_ENV):
        paths[TRACE_FILE_ENV] = os.path.abspath(value)
    return paths


def identity_env(environ: Mapping[str, str], *, roles: Roles, listening: Listening) -> ServingEnv:
    """The identities the server takes: the operator's JWT keys and token table (relative
    files made absolute: the server runs in a directory of its own), else the development
    table where `listening` allows it, saying so. Refused here, in one line, if a server could
    not use them (an Aegra instance whose auth module fails to load would serve without any),
    or if they would let the published development tokens in on an address others reach."""
    if listening.dev_tokens and not listening.loopback:
        raise ServingRefused(f"--dev-tokens: {published_off_loopback(listening)}")
    served = ServingEnv({})
    if named := environ.get(TOKENS_FILE_ENV):
        served.env[TOKENS_FILE_ENV] = str(Path(named).absolute())
    try:
        jwt_settings = JwtSettings.from_env(environ)
    except IdentityConfigError as exc:
        raise ServingRefused(f"identities: {exc}") from None
    if jwt_settings is not None and not jwt_settings.is_url:
        served.env[JWKS_ENV] = str(Path(jwt_settings.jwks).absolute())
    if not (named or jwt_settings or environ.get(TOKENS_ENV)):
        refuse_dev_tokens(listening)
        served.env[TOKENS_FILE_ENV] = str(DEV_TOKENS)
        served.env[PLAIN_TOKENS_ENV] = "1"  # its tokens are plain, and published
        served.notes += dev_token_notes(roles, listening)
    if not listening.loopback:
        refuse_plain_tokens(environ, listening)
        # Each server refuses a table taking a published token, now and at every edit.
        served.env[PUBLISHED_REFUSED_ENV] = "1"
    try:
        Identities({**environ, **served.env})  # what each server builds at its start
    except PublishedTokenTaken as exc:
        raise ServingRefused(
            f"{exc}, not {listening.host}: remove its entry ({CONFIGURE_IDENTITIES})"
        ) from None
    except IdentityConfigError as exc:
        raise ServingRefused(f"identities: {exc}") from None
    return served


# How to give a server identities of its own, as each refusal to serve without them says.
CONFIGURE_IDENTITIES = (
    f"set {JWKS_ENV} (your identity provider's keys) or name a token table in"
    f" {TOKENS_FILE_ENV} (loopwright tokens new makes its entries)"
)


def published_off_loopback(listening: Listening) -> str:
    return (
        "the development tokens are published: they serve a loopback --host only, not"
        f" {listening.host}; {CONFIGURE_IDENTITIES}"
    )


def refuse_dev_tokens(listening: Listening) -> None:
    """ServingRefused, saying how to configure identities, where no identities are configured
    and the development table (its tokens published) may not take their place."""
    if listening.dev_tokens:
        return
    if not listening.dev_fallback:
        raise ServingRefused(
            f"no identities: {CONFIGURE_IDENTITIES}, or serve with --dev-tokens for the"
            " development one (never in production)"
        )
    if not listening.loopback:
        raise ServingRefused(f"no identities, and {published_off_loopback(listening)}")


def refuse_plain_tokens(environ: Mapping[str, str], listening: Listening) -> None:
    """ServingRefused where identities configured for an address others reach would take plain
    tokens, which are for development only."""
    if plain_tokens_allowed(environ):
        raise ServingRefused(
            f"{PLAIN_TOKENS_ENV}=1 takes plain tokens, for development only: they serve a"
            f" loopback --host only, not {listening.host}; {CONFIGURE_IDENTITIES}"
        )


def dev_token_notes(roles: Roles, listening: Listening) -> list[str]:
    """What a person serving with the development table is told: that it is (and, off
    loopback, who can use it), and which of its roles grant nothing with the agent."""
    notes = [f"no identities configured: using the development tokens in {DEV_TOKENS}"]
    if not listening.loopback:
        notes.append(
            f"they are published: anyone who reaches {listening.host} can use them (development"
            " only)"
        )
    dev_roles = {r for user in json.loads(DEV_TOKENS.read_text()).values() for r in user["roles"]}
    if idle := sorted(r for r in dev_roles if not roles.granting(r)):
        notes.append(
            f"their roles {', '.join(idle)} grant nothing with this agent, whose roles are"
            f" {roles}: give its people tokens of those (loopwright tokens new --role ROLE)"
            f" in a table of your own, {TOKENS_FILE_ENV}"
        )
    return notes


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
    """`langgraph dev` through `loopwright.server.dev`, so that it dies with its parent."""
    return [
        *(sys.executable, "-m", "loopwright.server.dev"),
        *("--no-browser", "--no-reload", "--n-jobs-per-worker", str(RUN_SLOTS)),
        *("--host", host, "--port", str(port), "--config", str(config)),
    ]


def cannot_listen(host: str, port: int) -> str | None:
    """Why a server could not listen on `host`:`port` (a server listens there already; the
    host is no address of this machine; the port needs privileges), or None if it can: the
    bind uvicorn will attempt (SO_REUSEADDR, so a port merely bound, as
    `tests.ports.reserved_port` holds one, is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:
            return f"{host} is no address this machine knows ({exc.strerror}): pick --host"
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use: stop what listens there or pick --port"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host} is no address of this machine: pick --host"
            if exc.errno == errno.EACCES:
                return f"port {port} needs privileges: pick one above 1023 with --port"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


class ServerOutput:
    """The server's output, copied as it comes to server.log (and to a terminal, if given),
    and read for the URL the server announces.

    That URL, not the one asked for, is where the server is: `langgraph dev` moves to another
    port when the one asked for is taken (a caller that would rather refuse checks
    `cannot_listen` first), and polling the old one would wait for nothing, or for someone
    else's server."""

    def __init__(self, source: IO[bytes], log: Path, copy: IO[bytes] | None) -> None:
        self.url: str | None = None
        self.log = log
        self._thread = threading.Thread(
            target=self._copy, args=(source, copy), name="langgraph-output", daemon=True
        )
        self._thread.start()

    def _copy(self, source: IO[bytes], copy: IO[bytes] | None) -> None:
        with source, self.log.open("ab") as log:
            for line in source:
                log.write(line)
                log.flush()
                if copy is not None:
                    try:
                        copy.write(line)
                        copy.flush()
                    except (OSError, ValueError):  # the terminal went away: the log goes on
                        copy = None
                if self.url is None and (announced := ANNOUNCED_URL.search(line)):
                    self.url = announced.group(1).decode()

    def finish(self, timeout: float) -> None:
        """Wait until everything the (stopped) server wrote is in the log."""
        self._thread.join(timeout)


class RunningServer(ChildProcess):
    """A `langgraph dev` child process, at the URL it announced."""

    grace_s = GRACE_S

    def __init__(
        self, process: subprocess.Popen[bytes], lifeline: int, output: ServerOutput
    ) -> None:
        super().__init__(process, lifeline)
        self.output = output
        self.log = output.log

    @property
    def url(self) -> str:
        if self.output.url is None:
            raise ServerFailedToStart(f"langgraph dev announced no URL; see {self.log}")
        return self.output.url

    def stop(self) -> None:
        super().stop()
        self.output.finish(self.grace_s)


def start_server(
    workdir: Path,
    env: Mapping[str, str],
    *,
    host: str = "127.0.0.1",
    port: int = 2024,
    timeout: float = START_TIMEOUT_S,
    stdout: IO[bytes] | None = None,
) -> RunningServer:
    """Start the server in `workdir` and wait until it answers at the URL it announced; its
    output is appended to server.log and copied to `stdout`, if given. The server stops when
    this process dies, however it dies (`loopwright.server.dev`)."""
    config = served_config(workdir)
    process, lifeline = spawn(
        dev_command(config, host=host, port=port),
        cwd=workdir,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None  # a pipe, asked for above
    server = RunningServer(
        process, lifeline, ServerOutput(process.stdout, workdir / LOG_FILE, stdout)
    )
    try:
        _wait_until_answering(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_until_answering(server: RunningServer, timeout: float) -> None:
    def answers() -> bool:
        url = server.output.url
        return (
            url is not None
            and httpx.get(f"{url}/ok", timeout=1, verify=tls.context()).status_code == 200
        )

    wait_until_answering(
        server.process,
        answers,
        what="langgraph dev",
        log=server.log,
        timeout=timeout,
        where=lambda: server.output.url or "the URL it announces",
        # Everything the stopped server wrote, in the log before it is quoted.
        on_exit=lambda: server.output.finish(server.grace_s),
    )


def wait_until_answering(
    process: subprocess.Popen[bytes],
    answers: Callable[[], bool],
    *,
    what: str,
    log: Path,
    timeout: float,
    where: Callable[[], str],
    on_exit: Callable[[], None] = lambda: None,
) -> None:
    """Poll `answers` (a transport error is no answer yet) until it holds; ServerFailedToStart,
    quoting the end of `log`, if the process exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            on_exit()
            raise ServerFailedToStart(
                f"{what} exited with {process.returncode}; see {log}:\n"
                + log.read_text(errors="replace")[-4000:]
            )
        try:
            if answers():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise ServerFailedToStart(f"{what} did not answer at {where()} within {timeout} s; see {log}")
