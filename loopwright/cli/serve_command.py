"""`loopwright serve`: the agent's runs over HTTP on Postgres, with the approval inbox, on
`langgraph dev` (one process) or a cluster of Aegra instances."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from loopwright.cli.errors import UsageError
from loopwright.cli.options import AgentOption
from loopwright.cli.output import console, errors

if TYPE_CHECKING:
    from loopwright._agent import Agent

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
    redis_prefix: Annotated[
        str | None,
        typer.Option(
            "--redis-prefix",
            metavar="PREFIX",
            envvar="LOOPWRIGHT_REDIS_PREFIX",
            help="aegra: the deployment's Redis key prefix (its queue and channels). Default:"
            " one derived from the database, so that deployments on other databases never"
            " share a queue.",
        ),
    ] = None,
    dev_tokens: Annotated[
        bool,
        typer.Option(
            "--dev-tokens",
            help="Serve with the development token table (dev-u1, dev-a1, ...: plain tokens,"
            " published) where no identities are configured, on a loopback --host only (refused"
            " on any other): langgraph falls back to it there, aegra only with this flag."
            " Otherwise set LOOPWRIGHT_JWKS (JWTs) or LOOPWRIGHT_TOKENS_FILE (hashed tokens).",
        ),
    ] = False,
) -> None:
    """Serve the agent's runs over HTTP, on Postgres, with the approval inbox: `langgraph dev`
    (one process), or a cluster of Aegra instances (`--engine aegra --instances N`)."""
    from loopwright.checkpoints.database import DatabaseKind, database_kind, resolve_database_url
    from loopwright.cli import hosting
    from loopwright.server.launch import Listening, cannot_listen, serving_env

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
    served = serving_env(
        os.environ,
        database_url=url,
        agent_path=path,
        agent=hosted,
        listening=Listening(host, dev_tokens=dev_tokens, dev_fallback=engine == "langgraph"),
    )
    for note in served.notes:
        errors.print(note, markup=False)
    # SIGTERM too stops the server (and whatever the agent's dependencies started in it).
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    console.print(f"agent  {hosted.name} {hosted.version} ({path})", markup=False)
    if engine == "aegra":
        _serve_aegra(hosted, url, redis, redis_prefix, served.env, host=host, ports=ports)
    else:
        _serve_langgraph(hosted, served.env, host=host, port=port)


def _serve_langgraph(hosted: Agent[Any], extra: dict[str, str], *, host: str, port: int) -> None:
    """`langgraph dev`: what the agent's servers share, started first, then the server."""
    from loopwright.core.home import loopwright_home
    from loopwright.server.launch import server_env, shared_by_servers, start_server

    with (
        shared_by_servers(hosted) as shared,
        start_server(
            loopwright_home() / "server",
            server_env(os.environ, {**extra, **shared}),
            host=host,
            port=port,
            stdout=sys.stdout.buffer,
        ) as running,
    ):
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
    prefix: str | None,
    extra: dict[str, str],
    *,
    host: str,
    ports: list[int],
) -> None:
    """`--engine aegra`: what the agent's instances share, started once, then the instances,
    kept running until SIGTERM (or Ctrl-C) drains them all."""
    from loopwright.core.home import loopwright_home
    from loopwright.server import cluster

    redis_url = cluster.checked_redis_url(redis, os.environ)
    keys = cluster.checked_prefix(prefix) if prefix else cluster.deployment_prefix(url)
    with cluster.deployment(
        hosted,
        os.environ,
        database_url=url,
        redis_url=redis_url,
        extra=extra,
        workdir=loopwright_home() / "aegra",
        host=host,
        ports=ports,
        prefix=keys,
        say=lambda line: errors.print(f"loopwright: {line}", markup=False),
    ) as running:
        instances = running.instances
        console.print(f"engine aegra, {len(instances)} instances; Redis keys {keys}*", markup=False)
        for instance in instances:
            console.print(f"API    {instance.url}  (log {instance.log})", markup=False)
        console.print(f"inbox  {instances[0].url}/inbox (on every instance)", markup=False)
        console.print(
            f"handover: a killed instance's runs go on within {cluster.KILLED_HANDOVER_S:.0f} s,"
            f" a stopped one's within {cluster.STOPPED_HANDOVER_S:.0f} s; a dead instance is"
            " started again",
            markup=False,
        )
        with contextlib.suppress(KeyboardInterrupt):
            running.watch()


def _raise_keyboard_interrupt(*_: object) -> None:
    raise KeyboardInterrupt
