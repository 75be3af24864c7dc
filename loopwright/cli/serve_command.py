"""`loopwright serve`: the agent's runs over HTTP on Postgres, with the approval inbox, on
`langgraph dev` (one process) or a cluster of Aegra instances."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from loopwright.cli.errors import UsageError
from loopwright.cli.options import AgentOption
from loopwright.cli.output import console, errors

if TYPE_CHECKING:
    from loopwright._agent import Agent
    from loopwright.graph.roles import Roles

app = typer.Typer()


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            "--port",
            min=1,
            max=65_535,
            help="Port to listen on (aegra: the first instance's; the next ones follow);"
            " refused if a server holds it.",
        ),
    ] = 2024,
    db: Annotated[
        str | None,
        typer.Option("--db", help="Postgres URL (postgresql://...). Default: $DATABASE_URL."),
    ] = None,
    agent: AgentOption = None,
    engine: Annotated[
        Literal["langgraph", "aegra"],
        typer.Option(
            "--engine",
            help="langgraph: `langgraph dev`, one process, the zero-setup path. aegra: --instances"
            " instances of Aegra on Postgres and Redis, for production (pip install"
            " 'loopwright[aegra]').",
        ),
    ] = "langgraph",
    instances: Annotated[
        int | None,
        typer.Option("--instances", min=1, max=32, help="aegra: how many instances (default 2)."),
    ] = None,
    redis: Annotated[
        str | None,
        typer.Option(
            "--redis", help="aegra: Redis URL (redis://host:port/db). Default: $REDIS_URL."
        ),
    ] = None,
    dev_tokens: Annotated[
        bool,
        typer.Option(
            "--dev-tokens",
            help="aegra: serve with the development token table (dev-u1, dev-a1, ...: plain"
            " tokens, published) where no identities are configured; otherwise set"
            " LOOPWRIGHT_JWKS (JWTs) or LOOPWRIGHT_TOKENS_FILE (hashed tokens).",
        ),
    ] = False,
) -> None:
    """Serve the agent's runs over HTTP, on Postgres, with the approval inbox: `langgraph dev`
    (one process), or a cluster of Aegra instances (`--engine aegra --instances N`)."""
    from loopwright.checkpoints.database import DatabaseKind, database_kind, resolve_database_url
    from loopwright.cli import hosting
    from loopwright.server.launch import cannot_listen

    if engine == "langgraph" and instances not in (None, 1):
        raise UsageError("--instances: langgraph dev serves from one process; use --engine aegra")
    count = (instances or 2) if engine == "aegra" else 1
    ports = list(range(port, port + count))
    if ports[-1] > 65_535:
        raise UsageError(f"--port {port} leaves no room for {instances} instances")
    # Refused before anything starts: langgraph would move to another port, or fail later.
    for candidate in ports:
        if (why := cannot_listen(host, candidate)) is not None:
            raise UsageError(why)
    path = hosting.configured_agent_path(agent) or hosting.DEFAULT_AGENT
    hosted = hosting.agent_for(path)
    url = resolve_database_url(db)
    if database_kind(url) is not DatabaseKind.POSTGRES:
        raise UsageError("serving needs Postgres: --db postgresql://... or DATABASE_URL")
    _check_server_settings()
    extra = {"DATABASE_URL": url, hosting.AGENT_ENV: path, **_paths_from_here()}
    extra |= _identity_env(use_dev=dev_tokens or engine == "langgraph", roles=hosted.roles)
    # SIGTERM too stops the server (and whatever the agent's dependencies started in it).
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    console.print(f"agent  {hosted.name} {hosted.version} ({path})", markup=False)
    if engine == "aegra":
        _serve_aegra(hosted, url, redis, extra, host=host, ports=ports)
    else:
        _serve_langgraph(extra, host=host, port=port)


def _check_server_settings() -> None:
    """The run settings a server reads from the environment, refused here in one line rather
    than by the server at its first request, after it has started."""
    from loopwright.observability.tracing import TraceSettings
    from loopwright.runner import lease_ttl_from_env
    from loopwright.server.admissions import per_principal_from_env

    try:
        lease_ttl_from_env()
        per_principal_from_env(os.environ)
        TraceSettings.from_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _paths_from_here() -> dict[str, str]:
    """The paths the environment names, resolved against the directory the command was started
    in, for a server that runs in a directory of its own: the application stays importable
    (this directory, then PYTHONPATH's entries), and loopwright's home and trace file are
    where the user meant them."""
    from loopwright.checkpoints.database import HOME_ENV
    from loopwright.observability.tracing import TRACE_FILE_ENV

    named = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = {"PYTHONPATH": os.pathsep.join([os.getcwd(), *(os.path.abspath(p) for p in named)])}
    for name in (HOME_ENV, TRACE_FILE_ENV):
        if value := os.environ.get(name):
            paths[name] = os.path.abspath(value)
    return paths


def _identity_env(*, use_dev: bool, roles: Roles) -> dict[str, str]:
    """The identities the server takes: the operator's JWT keys and token table (relative
    files made absolute: the server runs in a directory of its own), else the development
    table where allowed, saying so. Refused here, in one line, if a server could not use them
    (an Aegra instance whose auth module fails to load would serve without any)."""
    from loopwright.server.bearer_tokens import PLAIN_TOKENS_ENV, TOKENS_ENV, TOKENS_FILE_ENV
    from loopwright.server.identities import Identities
    from loopwright.server.jwt_identity import JWKS_ENV, JwtSettings
    from loopwright.server.launch import DEV_TOKENS
    from loopwright.server.users import IdentityConfigError

    env: dict[str, str] = {}
    if named := os.environ.get(TOKENS_FILE_ENV):
        env[TOKENS_FILE_ENV] = str(Path(named).absolute())
    try:
        jwt_settings = JwtSettings.from_env(os.environ)
    except IdentityConfigError as exc:
        raise UsageError(f"identities: {exc}") from None
    if jwt_settings is not None and not jwt_settings.is_url:
        env[JWKS_ENV] = str(Path(jwt_settings.jwks).absolute())
    if not (named or jwt_settings or os.environ.get(TOKENS_ENV)):
        if not use_dev:
            raise UsageError(
                f"no identities: set {JWKS_ENV} (your identity provider's keys) or name a token"
                f" table in {TOKENS_FILE_ENV}, or serve with --dev-tokens for the development"
                " one (never in production)"
            )
        env[TOKENS_FILE_ENV] = str(DEV_TOKENS)
        env[PLAIN_TOKENS_ENV] = "1"  # its tokens are plain, and published: development only
        errors.print(f"no identities configured: using the development tokens in {DEV_TOKENS}")
        dev_roles = {
            r for user in json.loads(DEV_TOKENS.read_text()).values() for r in user["roles"]
        }
        if idle := sorted(r for r in dev_roles if not roles.granting(r)):
            errors.print(
                f"their roles {', '.join(idle)} grant nothing with this agent, whose roles are"
                f" {roles}: give its people tokens of those (loopwright tokens new --role ROLE)"
                f" in a table of your own, {TOKENS_FILE_ENV}"
            )
    try:
        Identities({**os.environ, **env})  # what each server builds at its start
    except IdentityConfigError as exc:
        raise UsageError(f"identities: {exc}") from None
    return env


def _serve_langgraph(extra: dict[str, str], *, host: str, port: int) -> None:
    from loopwright.checkpoints.database import loopwright_home
    from loopwright.server.launch import server_env, start_server

    env = server_env(os.environ, extra)
    with start_server(
        loopwright_home() / "server", env, host=host, port=port, stdout=sys.stdout.buffer
    ) as running:
        console.print(f"API    {running.url}", markup=False)
        console.print(f"inbox  {running.url}/inbox", markup=False)
        console.print(
            f"Studio https://smith.langchain.com/studio/?baseUrl={running.url}", markup=False
        )
        with contextlib.suppress(KeyboardInterrupt):
            running.process.wait()


def _serve_aegra(
    hosted: Agent[Any],
    url: str,
    redis: str | None,
    extra: dict[str, str],
    *,
    host: str,
    ports: list[int],
) -> None:
    """`--engine aegra`: what the agent's instances share, started once, then the instances."""
    import importlib.util

    from loopwright.checkpoints.database import loopwright_home
    from loopwright.server import cluster

    if importlib.util.find_spec("aegra_api") is None:
        raise UsageError("the aegra engine is not installed: pip install 'loopwright[aegra]'")
    redis_url = redis or os.environ.get(cluster.REDIS_ENV) or ""
    if not redis_url:
        raise UsageError("--engine aegra needs Redis: --redis redis://host:port/db or REDIS_URL")
    if (why := cluster.redis_unreachable(redis_url)) is not None:
        raise UsageError(f"--redis: {why}")
    workdir = loopwright_home() / "aegra"
    with ExitStack() as stack:
        if hosted.shared is not None:
            extra = {**extra, **stack.enter_context(hosted.shared())}
        env = cluster.instance_env(
            os.environ,
            database_url=url,
            redis_url=redis_url,
            config=cluster.write_config(workdir),
            extra=extra,
        )
        running = stack.enter_context(cluster.started_cluster(workdir, env, host=host, ports=ports))
        prefix = cluster.deployment_prefix(url)
        console.print(f"engine aegra, {len(running)} instances; Redis keys {prefix}*", markup=False)
        for instance in running:
            console.print(f"API    {instance.url}  (log {instance.log})", markup=False)
        console.print(f"inbox  {running[0].url}/inbox (on every instance)", markup=False)
        console.print(
            f"handover: a killed instance's runs go on within {cluster.KILLED_HANDOVER_S:.0f} s,"
            f" a stopped one's within {cluster.STOPPED_HANDOVER_S:.0f} s",
            markup=False,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while all(instance.process.poll() is None for instance in running):
                time.sleep(0.5)
            gone = [i for i in running if i.process.poll() is not None]
            errors.print(
                f"loopwright: error: instance {gone[0].url} exited; see {gone[0].log}",
                markup=False,
            )
            raise typer.Exit(1)


def _raise_keyboard_interrupt(*_: object) -> None:
    raise KeyboardInterrupt
