"""Whether a process serving runs can do its work now: what readiness probes ask.

A process is ready when every dependency it works with answers: its database (a new connection
answers a query, and so do the connections the process keeps), Redis where the engine queues
runs in it, and the agent's own dependencies (`Agent(health=...)`: the business systems its
tools call). Each check runs on a thread of its own, all at once, each bounded by
`PROBE_BOUND_S` (`core.bounded.call_by`): a dependency that hangs makes the process not ready
within the bound, it does not hang the probe. Liveness asks less: that the process answers.

What a probe answers is a status word, nothing else (no versions, hosts or errors: a probe is
unauthenticated); which check failed and why is logged, once each time the answer changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loopwright._agent import Agent
from loopwright.checkpoints.sql import Database, open_database
from loopwright.core.bounded import call_by

logger = logging.getLogger(__name__)

PROBE_BOUND_S = 2.0
READY = {"status": "ready"}
NOT_READY = {"status": "not ready"}
LIVE = {"status": "live"}

# A check returns when its dependency answers and raises when it does not.
Check = Callable[[], None]


class DependencyDown(RuntimeError):
    """A dependency answered that it cannot serve (the agent's health names what)."""


def database_answers(url: str) -> Check:
    """A new connection to the database at `url` answers a query (it accepts work now)."""

    def check() -> None:
        with open_database(url) as db:
            db.execute("SELECT 1")

    return check


def connections_answer(databases: Sequence[Database]) -> Check:
    """The connections this process keeps answer a query each (asking is also how a lost one
    is found out, for the process to open anew: `Runner.connection_lost`)."""

    def check() -> None:
        for db in databases:
            db.execute("SELECT 1")

    return check


def agent_answers(agent: Agent[Any], deps: Any) -> Check:
    """The agent's own dependencies answer, as its `health` hook says (none declared: yes)."""

    def check() -> None:
        if agent.health is not None and (down := list(agent.health(deps))):
            raise DependencyDown(", ".join(str(name) for name in down))

    return check


def failing(checks: Mapping[str, Check], bound_s: float = PROBE_BOUND_S) -> dict[str, str]:
    """The checks that did not pass within `bound_s`, each with why (an error's class and
    first line, for the log); all run at once."""

    def run(check: Check) -> str | None:
        try:
            call_by(bound_s, check, what="the check")
        except KeyboardInterrupt:
            return "the process is stopping"
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            return f"{type(exc).__name__}: {first}"[:300]
        return None

    if not checks:
        return {}
    with ThreadPoolExecutor(len(checks), thread_name_prefix="readiness") as pool:
        answers = dict(zip(checks, pool.map(run, checks.values()), strict=True))
    return {name: why for name, why in answers.items() if why is not None}


class ReadinessLog:
    """Logs what a readiness probe found each time it changes (not at every probe)."""

    def __init__(self) -> None:
        self._last: dict[str, str] | None = None
        self._lock = threading.Lock()

    def note(self, down: Mapping[str, str]) -> None:
        with self._lock:
            changed = self._last is None or set(self._last) != set(down)
            self._last = dict(down)
        if not changed:
            return
        if down:
            listed = "; ".join(f"{name}: {why}" for name, why in sorted(down.items()))
            logger.warning("not ready: %s", listed)
        else:
            logger.info("ready")
