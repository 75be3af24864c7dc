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
process (their `Database` serialises use with a lock); every served run gets its own
checkpointer connection, because a fenced saver carries one run's fence.
"""

from __future__ import annotations

import asyncio
import os
import threading
from contextlib import ExitStack
from dataclasses import dataclass

from loopwright._agent import Agent
from loopwright._loading import AgentNotFound, load_agent
from loopwright.checkpoints.database import DatabaseKind, database_kind, redact
from loopwright.checkpoints.leases import LeaseStore
from loopwright.graph.roles import Roles
from loopwright.observability.tracing import TraceSettings
from loopwright.runner import Runner, lease_ttl_from_env, open_runner
from loopwright.server.engine import EngineThreads

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

    @property
    def agent(self) -> Agent[object]:
        return self.runner.agent

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


def host(path: str) -> None:
    """Name the agent this process serves (before its first run). One agent per process."""
    global _agent_path
    with _lock:
        if _agent_path not in (None, path):
            raise ServerMisconfigured(
                f"this server already hosts {_agent_path}; one agent per server process"
            )
        _agent_path = path


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
    """The process's resources, created on first use (blocking: call from a thread)."""
    global _resources
    with _lock:
        if _resources is None:
            url = server_database_url()
            agent = hosted_agent()
            try:
                spec = os.environ.get(MODEL_ENV) or None
                agent.chat_model(spec)  # a bad spec stops the server here, in one line
                lease_ttl_from_env()  # and so does a bad lease time to live
                TraceSettings.from_env()  # or a tracing switch neither on nor off
            except (ValueError, TypeError) as exc:
                raise ServerMisconfigured(str(exc)) from exc
            runner = _stack.enter_context(open_runner(url, agent, model_spec=spec))
            engine_threads = EngineThreads(runner.leases.db)
            _resources = ServerResources(url, runner, engine_threads)
        return _resources


async def aresources() -> ServerResources:
    """`resources()` from async code: the first call connects, which must not block the loop."""
    if _resources is not None:
        return _resources
    return await asyncio.to_thread(resources)
