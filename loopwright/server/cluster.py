"""`loopwright serve --engine aegra`: N instances of Aegra on one Postgres and one Redis.

Aegra (an Agent Protocol server, the `aegra` extra) queues runs in Redis for whichever
instance's workers are free and re-queues a run whose instance died. loopwright's leases and
fencing keep one writer per run whatever the engine does; what this module adds is a
deployment an operator can plan on:

* every instance gets the same environment: the database, Redis under a key prefix of this
  deployment's own (two deployments on one Redis never share a queue), the agent, the
  identities the operator configures (JWT keys, a token table), and what the agent's instances must share (`Agent(shared=...)`,
  started once here: e.g. the reference agent's business services);
* the engine's and loopwright's timings are one set (`HANDOVER_SETTINGS`), chosen so that a
  killed instance's runs are continued by another within `KILLED_HANDOVER_S` and a SIGTERM'd
  instance's within `STOPPED_HANDOVER_S` (each overridable from the environment; the README
  states the bound and the arithmetic);
* the first instance starts alone (it migrates Aegra's tables), the others after it answers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from loopwright import tls
from loopwright._agent import Agent
from loopwright.processes import START_TIMEOUT_S, ChildProcess, spawn
from loopwright.server.aegra import GRACE_S
from loopwright.server.launch import (
    OFFLINE_ENV,
    ServingRefused,
    file_config,
    wait_until_answering,
)

# The engine's worker lease and its reaper decide when a dead instance's run is re-queued;
# loopwright's run lease when another instance may take it; the drain how long a SIGTERM'd
# instance lets its runs go on before it hands them back (each run stops at its next step
# boundary and gives its lease up before it is re-queued: `server.graph`).
HANDOVER_SETTINGS: dict[str, str] = {
    "LEASE_DURATION_SECONDS": "4",  # Aegra: a run's worker lease (> 2 heartbeats)
    "HEARTBEAT_INTERVAL_SECONDS": "1",
    "REAPER_INTERVAL_SECONDS": "1",  # Aegra: how often expired leases are looked for
    # A run a dead instance took from the queue but never started is re-queued after this.
    "STUCK_PENDING_THRESHOLD_SECONDS": "5",
    "WORKER_DRAIN_TIMEOUT": "1",  # Aegra: how long SIGTERM waits before handing runs back
    "LOOPWRIGHT_LEASE_TTL_S": "4",  # loopwright: a run's lease (renewed every third of it)
}
# What else an instance runs with unless the operator says otherwise: log lines as JSON, one a
# line (what a log shipper reads; Aegra's default renders each for a terminal, with colours and
# highlighted tracebacks, at several times the CPU).
ENGINE_SETTINGS: dict[str, str] = {"ENV_MODE": "PRODUCTION"}
# Killed: the engine's lease runs out (4 s after the last heartbeat), its reaper re-queues the
# run (1 s), another instance claims it once loopwright's lease has run out too (4 s after its
# last renewal, claims polled every 0.2 s): at most ~6 s, stated with margin.
KILLED_HANDOVER_S = 10.0
# SIGTERM'd: the drain (1 s), the run's current step, its lease released and the run re-queued
# at once; another instance's worker takes it from Redis as it is pushed.
STOPPED_HANDOVER_S = 2.0
REDIS_ENV = "REDIS_URL"
INSTANCE_LOG = "aegra-{index}.log"


def deployment_prefix(database_url: str) -> str:
    """The Redis key prefix of the deployment serving `database_url`'s runs: every instance
    on that database shares it, a deployment on another database (or server) never does."""
    parts = urlsplit(database_url)
    where = f"{parts.hostname}:{parts.port}/{parts.path.lstrip('/')}?{parts.query}"
    return f"loopwright:{hashlib.sha256(where.encode()).hexdigest()[:12]}:"


def instance_env(
    base: Mapping[str, str],
    *,
    database_url: str,
    redis_url: str,
    config: Path,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of every instance: `base` (the operator's, whose own settings win over
    `HANDOVER_SETTINGS` and `ENGINE_SETTINGS`), then the deployment's (database, Redis and its
    prefix, config)."""
    prefix = deployment_prefix(database_url)
    env = {**HANDOVER_SETTINGS, **ENGINE_SETTINGS, **base, **(extra or {}), **OFFLINE_ENV}
    env.update(
        DATABASE_URL=database_url,
        REDIS_BROKER_ENABLED="true",
        REDIS_URL=redis_url,
        REDIS_CHANNEL_PREFIX=f"{prefix}run:",
        WORKER_QUEUE_KEY=f"{prefix}jobs",
        AEGRA_CONFIG=str(config),
    )
    env.setdefault("LANGSMITH_TRACING", "false")
    return env


def write_config(workdir: Path) -> Path:
    """The langgraph.json Aegra reads: the installed loopwright's own files."""
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "aegra.json"
    target.write_text(json.dumps(file_config(), indent=2))
    return target


class Instance(ChildProcess):
    """One running Aegra instance, at its URL."""

    grace_s = GRACE_S

    def __init__(
        self, process: subprocess.Popen[bytes], lifeline: int, url: str, log: Path
    ) -> None:
        super().__init__(process, lifeline)
        self.url = url
        self.log = log


def start_instance(
    workdir: Path,
    env: Mapping[str, str],
    *,
    index: int,
    host: str,
    port: int,
    timeout: float = START_TIMEOUT_S,
    program: Sequence[str] = ("loopwright.server.aegra",),
) -> Instance:
    """Start instance `index` and wait until it answers; its output goes to its log. What runs
    is `python -m PROGRAM --host H --port P`: loopwright's instance, or (a benchmark's
    baseline) uvicorn serving Aegra's own app."""
    log = workdir / INSTANCE_LOG.format(index=index)
    with log.open("ab") as sink:
        process, lifeline = spawn(
            [sys.executable, "-m", *program, "--host", host, "--port", str(port)],
            cwd=workdir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    instance = Instance(process, lifeline, f"http://{host}:{port}", log)
    try:
        wait_until_answering(
            process,
            lambda: (
                httpx.get(f"{instance.url}/health", timeout=1, verify=tls.context()).status_code
                == 200
            ),
            what="Aegra",
            log=log,
            timeout=timeout,
            where=lambda: instance.url,
        )
    except BaseException:
        instance.stop()
        raise
    return instance


@contextmanager
def started_cluster(
    workdir: Path, env: Mapping[str, str], *, host: str, ports: Sequence[int]
) -> Iterator[list[Instance]]:
    """Instances on `ports`, the first alone (it applies Aegra's migrations), then the rest;
    all stopped (SIGTERM: each hands its runs back) when the block ends."""
    with ExitStack() as stack:
        instances = []
        for index, port in enumerate(ports, 1):
            instance = start_instance(workdir, env, index=index, host=host, port=port)
            instances.append(stack.enter_context(instance))
        yield instances


def checked_redis_url(given: str | None, environ: Mapping[str, str]) -> str:
    """The Redis a deployment runs on (`given`, else REDIS_URL), answering; ServingRefused in
    one line otherwise, or where the engine is not installed."""
    if importlib.util.find_spec("aegra_api") is None:
        raise ServingRefused("the aegra engine is not installed: pip install 'loopwright[aegra]'")
    redis_url = given or environ.get(REDIS_ENV) or ""
    if not redis_url:
        raise ServingRefused(
            "--engine aegra needs Redis: --redis redis://host:port/db or REDIS_URL"
        )
    if (why := redis_unreachable(redis_url)) is not None:
        raise ServingRefused(f"--redis: {why}")
    return redis_url


@contextmanager
def deployment(
    agent: Agent[Any],
    base: Mapping[str, str],
    *,
    database_url: str,
    redis_url: str,
    extra: Mapping[str, str],
    workdir: Path,
    host: str,
    ports: Sequence[int],
) -> Iterator[list[Instance]]:
    """What the agent's instances share (`Agent(shared=...)`), started once, then the instances
    (`started_cluster`), each with `instance_env`; all stopped when the block ends."""
    with ExitStack() as stack:
        if agent.shared is not None:
            extra = {**extra, **stack.enter_context(agent.shared())}
        env = instance_env(
            base,
            database_url=database_url,
            redis_url=redis_url,
            config=write_config(workdir),
            extra=extra,
        )
        yield stack.enter_context(started_cluster(workdir, env, host=host, ports=ports))


def first_to_exit(instances: Sequence[Instance], poll_s: float = 0.5) -> Instance:
    """Wait until an instance exits; that instance."""
    while True:
        for instance in instances:
            if instance.process.poll() is not None:
                return instance
        time.sleep(poll_s)


def redis_unreachable(redis_url: str, timeout: float = 2.0) -> str | None:
    """Why Redis at `redis_url` cannot be reached, or None if it answers a PING."""
    parts = urlsplit(redis_url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return f"{redis_url!r} is not a Redis URL (redis://host:port/db)"
    try:
        with socket.create_connection((parts.hostname, parts.port or 6379), timeout) as conn:
            conn.sendall(b"PING\r\n")
            answer = conn.recv(64)
    except OSError as exc:
        return f"no Redis answers at {parts.hostname}:{parts.port or 6379} ({exc.strerror or exc})"
    if not answer.startswith((b"+PONG", b"-NOAUTH")):
        return f"{parts.hostname}:{parts.port or 6379} does not answer as Redis does"
    return None


def forget_keys(redis_url: str, prefix: str) -> None:
    """Delete a deployment's keys (its queue, channels and done-markers) from Redis: for a
    deployment that is gone for good, e.g. one a test or a benchmark made."""
    import redis  # installed with the aegra extra

    client = redis.Redis.from_url(redis_url)
    try:
        if keys := list(client.scan_iter(f"{prefix}*")):
            client.delete(*keys)
    finally:
        client.close()
