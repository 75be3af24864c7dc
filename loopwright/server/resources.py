"""What a server process needs to advance runs, created once per process from the environment.

The graph's nodes are sync functions that use live objects from the run context: a journal, the
agent's dependencies and a model. The LangGraph server builds graphs per request but has no
notion of these, so they are created here, once per process, on first use:

| variable | meaning | default |
| --- | --- | --- |
| `DATABASE_URL` | the Postgres database of checkpoints, journal and leases | required |
| `LOOPWRIGHT_AGENT` | the agent the server hosts, as `module:attribute` | the reference agent |
| `LOOPWRIGHT_MODEL` | `openai:<model>` instead of the agent's own model | the agent's |
| `LOOPWRIGHT_LEASE_TTL_S` | run lease time to live, seconds | 30 |

A server process hosts one agent (`graph_for(path)` in `loopwright.server.graph` names it from
code instead of the environment). Its dependencies are opened once, by the agent's own `deps`
factory, and stay open for the life of the process. The runner is the CLI's `Runner`
(`open_runner`): its journal and lease store each hold one connection, shared by the runs of the
process (their `Database` serialises use with a lock); every served run gets a checkpointer
connection of its own, because a fenced saver carries one run's fence, from a pool of as many
as the engine advances runs at once (`run_pool_size`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass

import psycopg
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from loopwright._agent import Agent
from loopwright._loading import AgentNotFound, load_agent
from loopwright.checkpoints.database import DatabaseKind, database_kind, postgres_pool, redact
from loopwright.checkpoints.leases import LeaseStore
from loopwright.checkpoints.sql import Database, open_database
from loopwright.core.roles import Roles
from loopwright.observability.tracing import TraceSettings
from loopwright.runner import Runner, lease_ttl_from_env, open_runner
from loopwright.server.admissions import (
    EngineAdmissions,
    ThreadAdmissions,
    admissions,
    per_principal_from_env,
)
from loopwright.server.engine import EngineThreads

log = logging.getLogger(__name__)

DATABASE_ENV = "DATABASE_URL"
AGENT_ENV = "LOOPWRIGHT_AGENT"
MODEL_ENV = "LOOPWRIGHT_MODEL"
DEFAULT_AGENT = "loopwright_refunds.agent:agent"


class ServerMisconfigured(RuntimeError):
    """The server's environment lacks something it needs; the message names the variable."""


def server_database_url(environ: dict[str, str] | None = None) -> str:
    """The Postgres URL from DATABASE_URL: the server keeps everything in one Postgres database."""
    url = (environ if environ is not None else os.environ).get(DATABASE_ENV, "")
    if not url:
        raise ServerMisconfigured(f"{DATABASE_ENV} is not set: the server needs a Postgres URL")
    if database_kind(url) is not DatabaseKind.POSTGRES:
        raise ServerMisconfigured(f"{DATABASE_ENV}={redact(url)!r} is not a Postgres URL")
    return url


@dataclass
class ServerResources:
    """The live objects every run of this process shares: the CLI's `Runner`, and its database.

    The runner is what the CLI advances runs with; the server uses its journal, lease store,
    agent, dependencies, model, budget and `context()` (so a served run gets the very run
    context the CLI would build), not its checkpointer: each served run has its own, fenced.
    """

    database_url: str
    runner: Runner
    # The engine's own record of threads (Aegra's), read by the auth hooks: see `server.engine`.
    engine_threads: EngineThreads
    # Where each run's checkpointer connection comes from (`checkpoints.database.pooled`).
    run_connections: ConnectionPool[psycopg.Connection[DictRow]]
    # Who admits runs (`server.admissions`): the database the instances share on Aegra, this
    # process's record on LangGraph's server.
    admissions: ThreadAdmissions | EngineAdmissions

    @property
    def agent(self) -> Agent[object]:
        return self.runner.agent

    @property
    def databases(self) -> tuple[Database, ...]:
        """Every connection the process keeps: the runner's, and the engine admissions' own."""
        own = (self.admissions.db,) if isinstance(self.admissions, EngineAdmissions) else ()
        return (*self.runner.databases, *own)

    def connection_lost(self) -> bool:
        """Whether a kept connection was lost: the next use opens them anew (`resources`)."""
        return any(db.lost for db in self.databases)

    @property
    def leases(self) -> LeaseStore:
        return self.runner.leases

    @property
    def lease_ttl_s(self) -> float:
        return self.runner.lease_ttl_s


_lock = threading.Lock()
_resources: ServerResources | None = None
_agent_path: str | None = None
_agent_lock = threading.Lock()
_agent: Agent[object] | None = None
_stack = ExitStack()  # kept open for the life of the process
_runner_stack = ExitStack()  # the runner's connections: opened anew when one is lost


def host(path: str) -> None:
    """Name the agent this process serves (before its first run). One agent per process."""
    global _agent_path
    with _lock:
        if _agent_path not in (None, path):
            raise ServerMisconfigured(
                f"this server already hosts {_agent_path}; one agent per server process"
            )
        _agent_path = path


def run_pool_size(environ: Mapping[str, str] | None = None) -> int:
    """The most runs the engine advances at once in one process: Aegra's `WORKER_COUNT` loops
    of `N_JOBS_PER_WORKER` runs each (3 and 10 by default; LangGraph's server has one loop of
    `N_JOBS_PER_WORKER`), so that no run waits for a connection while the engine would run it."""
    env = environ if environ is not None else os.environ
    sizes = []
    for name, default in (("WORKER_COUNT", 3), ("N_JOBS_PER_WORKER", 10)):
        try:
            sizes.append(max(1, int(env.get(name) or default)))
        except ValueError:
            sizes.append(default)  # the engine refuses it, in its own words
    return sizes[0] * sizes[1]


def hosted_agent_path() -> str:
    return _agent_path or os.environ.get(AGENT_ENV) or DEFAULT_AGENT


def hosted_agent() -> Agent[object]:
    """The agent this process serves, loaded and checked once (blocking: call from a thread),
    without opening its dependencies or a database: what a route asks that must answer whether
    they do or not (the metrics route: which roles operate). ServerMisconfigured otherwise."""
    global _agent
    with _agent_lock:
        if _agent is None:
            try:
                agent = load_agent(hosted_agent_path())
                agent.check()
            except (AgentNotFound, ValueError, TypeError) as exc:
                raise ServerMisconfigured(str(exc)) from exc
            _agent = agent
        return _agent


async def hosted_roles() -> Roles:
    """Which role names grant what on this server: the hosted agent's `Roles`."""
    agent = _agent if _agent is not None else await asyncio.to_thread(hosted_agent)
    return agent.roles


def resources() -> ServerResources:
    """The process's resources, created on first use (blocking: call from a thread).

    Where a connection the process keeps was lost (the database restarted, a failover), the
    runner is opened anew on the next use, as `loopwright worker` reconnects: the requests in
    flight on the lost connection fail, the ones after it are served (and readiness says so).
    The agent's dependencies and the runs' connection pool are kept."""
    global _resources
    with _lock:
        if _resources is not None and not _resources.connection_lost():
            return _resources
        if _resources is None:
            url, agent, spec = _configured()
            deps = _stack.enter_context(agent.open_deps())
            pool = _stack.enter_context(postgres_pool(url, run_pool_size()))
        else:
            log.warning("a database connection this server keeps was lost: reconnecting")
            url, agent, deps = _resources.database_url, _resources.agent, _resources.runner.deps
            spec, pool = _resources.runner.model_spec, _resources.run_connections
            _runner_stack.close()
        runner = _runner_stack.enter_context(open_runner(url, agent, deps=deps, model_spec=spec))
        threads = EngineThreads(runner.leases.db)
        admitting: ThreadAdmissions | EngineAdmissions = admissions
        if threads.kept:  # many instances: the record they share, the operator's bound
            # On a connection of its own: an admission's transaction does not wait behind the
            # runs' lease renewals on the runner's, nor they behind it.
            own = _runner_stack.enter_context(open_database(url))
            admitting = EngineAdmissions(own, per_principal=per_principal_from_env(os.environ))
        _resources = ServerResources(url, runner, threads, pool, admitting)
        return _resources


def check_settings(agent: Agent[object]) -> None:
    """The settings a server of `agent` reads from its environment, each checked: its model,
    the lease's time to live, the per-principal bound, the tracing switches. Raises
    ServerMisconfigured, in one line, for one that cannot be used (what `loopwright serve` and
    each engine's process refuse at their start, and a server's first run otherwise)."""
    spec = os.environ.get(MODEL_ENV) or None
    try:
        agent.chat_model(spec)
    except (ValueError, TypeError) as exc:
        raise ServerMisconfigured(f"{MODEL_ENV}={spec!r}: {exc}" if spec else str(exc)) from exc
    try:
        lease_ttl_from_env()
        per_principal_from_env(os.environ)
        TraceSettings.from_env()  # a tracing switch neither on nor off
    except (ValueError, TypeError) as exc:
        raise ServerMisconfigured(str(exc)) from exc


def _configured() -> tuple[str, Agent[object], str | None]:
    """The database URL, the hosted agent and the model spec, each checked: a setting that
    cannot be used stops the server here, in one line."""
    url = server_database_url()
    agent = hosted_agent()
    check_settings(agent)
    return url, agent, os.environ.get(MODEL_ENV) or None


async def aresources() -> ServerResources:
    """`resources()` from async code: the first call connects (and a call after a connection
    was lost reconnects), which must not block the loop."""
    if _resources is not None and not _resources.connection_lost():
        return _resources
    return await asyncio.to_thread(resources)
