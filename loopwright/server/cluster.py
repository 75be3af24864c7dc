"""`loopwright serve --engine aegra`: N instances of Aegra on one Postgres and one Redis.

Aegra (an Agent Protocol server, the `aegra` extra) queues runs in Redis for whichever
instance's workers are free and re-queues a run whose instance died. loopwright's leases and
fencing keep one writer per run whatever the engine does; what this module adds is a
deployment an operator can plan on:

* every instance gets the same environment: the database, Redis under a key prefix of this
  deployment's own (derived from the database unless named: two deployments on one Redis
  never share a queue), the agent, the
  identities the operator configures (JWT keys, a token table), and what the agent's instances must share (`Agent(shared=...)`,
  started once here: e.g. the reference agent's business services);
* the engine's and loopwright's timings are one set (`HANDOVER_SETTINGS`), chosen so that a
  killed instance's runs are continued by another within `KILLED_HANDOVER_S` and a SIGTERM'd
  instance's within `STOPPED_HANDOVER_S` (each overridable from the environment;
  docs/serving.md states the bound and the arithmetic);
* the first instance starts alone (it migrates Aegra's tables), the others after it answers;
* an instance that dies is started again (`Cluster`) and never takes the others down; a
  SIGTERM to the deployment drains every instance at once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from loopwright._agent import Agent
from loopwright.core import tls
from loopwright.observability.tracing import INSTANCE_ENV
from loopwright.processes import START_TIMEOUT_S, ChildProcess, spawn, stop_together
from loopwright.server.aegra import GRACE_S
from loopwright.server.launch import (
    OFFLINE_ENV,
    ServerFailedToStart,
    ServingRefused,
    file_config,
    shared_by_servers,
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
REDIS_PREFIX_ENV = "LOOPWRIGHT_REDIS_PREFIX"
PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
INSTANCE_NAME = "aegra-{index}"
# An instance that exits is started again after 1 s, then 2, 4, ... up to 30 s while it keeps
# exiting within a minute of its start; one that ran longer starts at 1 s again.
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0


def deployment_prefix(database_url: str) -> str:
    """The Redis key prefix of the deployment serving `database_url`'s runs: every instance
    on that database shares it, a deployment on another database (or server) never does."""
    parts = urlsplit(database_url)
    where = f"{parts.hostname}:{parts.port}/{parts.path.lstrip('/')}?{parts.query}"
    return f"loopwright:{hashlib.sha256(where.encode()).hexdigest()[:12]}:"


def checked_prefix(given: str) -> str:
    """A Redis key prefix an operator names (`--redis-prefix`, `LOOPWRIGHT_REDIS_PREFIX`), with
    a `:` after it; ServingRefused, in one line, for one that is not letters, digits and
    `_ . : -` (at most 64)."""
    if not PREFIX_PATTERN.fullmatch(given):
        raise ServingRefused(
            f"--redis-prefix {given!r}: letters, digits and _ . : - (1 to 64), e.g. acme-prod"
        )
    return given if given.endswith(":") else f"{given}:"


def instance_env(
    base: Mapping[str, str],
    *,
    database_url: str,
    redis_url: str,
    config: Path,
    extra: Mapping[str, str] | None = None,
    prefix: str | None = None,
) -> dict[str, str]:
    """The environment of every instance: `base` (the operator's, whose own settings win over
    `HANDOVER_SETTINGS` and `ENGINE_SETTINGS`), then the deployment's (database, Redis and its
    key prefix, `deployment_prefix` unless one is named; config)."""
    prefix = prefix or deployment_prefix(database_url)
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
    baseline) uvicorn serving Aegra's own app. It is named `aegra-INDEX` (its log's name) on
    its spans and on the steps it writes."""
    name = INSTANCE_NAME.format(index=index)
    log = workdir / f"{name}.log"
    with log.open("ab") as sink:
        process, lifeline = spawn(
            [sys.executable, "-m", *program, "--host", host, "--port", str(port)],
            cwd=workdir,
            env={**env, INSTANCE_ENV: name},
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


class Cluster:
    """The instances of a deployment on `ports`, each kept running while the cluster runs.

    An instance that exits (killed, crashed, out of memory) never takes the others down: it is
    started again on its port after a pause, said through `say`: `RESTART_FIRST_S`, doubled
    for each exit (or failed start) that follows its start within `RESTART_RESET_S`, at most
    `RESTART_MAX_S`. Its runs meanwhile go on elsewhere (`KILLED_HANDOVER_S`). `stop` drains
    every instance at once (SIGTERM: each hands its runs back)."""

    def __init__(
        self,
        workdir: Path,
        env: Mapping[str, str],
        *,
        host: str,
        ports: Sequence[int],
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.workdir, self.env, self.host, self.ports, self.say = workdir, env, host, ports, say
        self.instances: list[Instance] = []
        self._started = [0.0] * len(ports)
        self._pause = [RESTART_FIRST_S] * len(ports)
        self._due: dict[int, float] = {}  # instance index -> when it is started again

    def __enter__(self) -> Cluster:
        """The instances, the first alone (it applies Aegra's migrations), then the rest, each
        once the one before answers."""
        try:
            for index in range(len(self.ports)):
                self.instances.append(self._start(index))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        stop_together(self.instances)

    def watch(self, poll_s: float = 0.5) -> None:
        """Keep the instances running until interrupted (KeyboardInterrupt, as SIGTERM is)."""
        while True:
            self.look()
            time.sleep(poll_s)

    def look(self) -> None:
        """One look at the instances: one found exited is due to start again after its pause;
        one whose pause has passed is started again."""
        for index, instance in enumerate(self.instances):
            code = instance.process.poll()
            if code is None:
                continue
            if index not in self._due:
                pause = self._next_pause(index)
                self._due[index] = time.monotonic() + pause
                self.say(
                    f"instance {index + 1} ({instance.url}) {_ended(code)}; starting it again in"
                    f" {pause:g} s (its log: {instance.log})"
                )
            elif time.monotonic() >= self._due[index]:
                self._restart(index)

    def _start(self, index: int) -> Instance:
        instance = start_instance(
            self.workdir, self.env, index=index + 1, host=self.host, port=self.ports[index]
        )
        self._started[index] = time.monotonic()
        return instance

    def _next_pause(self, index: int) -> float:
        """The pause before instance `index` starts again: the first one after it ran a while,
        else twice the last (at most `RESTART_MAX_S`)."""
        if time.monotonic() - self._started[index] >= RESTART_RESET_S:
            self._pause[index] = RESTART_FIRST_S
        pause = self._pause[index]
        self._pause[index] = min(2 * pause, RESTART_MAX_S)
        return pause

    def _restart(self, index: int) -> None:
        del self._due[index]
        try:
            self.instances[index] = self._start(index)
        except ServerFailedToStart as exc:
            pause = self._next_pause(index)
            self._due[index] = time.monotonic() + pause
            first = str(exc).splitlines()[0]
            self.say(f"instance {index + 1} did not start again ({first}); next try in {pause:g} s")
            return
        again = self.instances[index]
        self.say(f"instance {index + 1} ({again.url}) is back (pid {again.pid})")


def _ended(code: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"was killed ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed (signal {-code})"
    return f"exited with {code}"


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
    prefix: str | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> Iterator[Cluster]:
    """What the agent's instances share (`Agent(shared=...)`), started once, then the
    instances (`Cluster`), each with `instance_env`; all stopped when the block ends, the
    instances first."""
    with ExitStack() as stack:
        extra = {**extra, **stack.enter_context(shared_by_servers(agent))}
        env = instance_env(
            base,
            database_url=database_url,
            redis_url=redis_url,
            config=write_config(workdir),
            extra=extra,
            prefix=prefix,
        )
        yield stack.enter_context(Cluster(workdir, env, host=host, ports=ports, say=say))


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
