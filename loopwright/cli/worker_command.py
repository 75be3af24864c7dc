"""`loopwright worker`: claim and advance the agent's runs that need it until stopped, with
probes and metrics on a port of its own if asked (`loopwright.worker`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from loopwright.cli.errors import UsageError
from loopwright.cli.options import AgentOption, DbOption, ModelOption
from loopwright.cli.output import console
from loopwright.display import flat

if TYPE_CHECKING:
    from loopwright.outcome import RunOutcome
    from loopwright.probe_port import ProbePort
    from loopwright.runner import Runner

# Bounds of --poll: a value past them is a usage error (one line, exit 2), not a traceback
# from the timer it would overflow.
MIN_POLL_S, MAX_POLL_S = 0.01, 3_600.0
RECONNECT_FIRST_S = 1.0
RECONNECT_MAX_S = 30.0

app = typer.Typer()


@app.command()
def worker(
    db: DbOption = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    poll: Annotated[
        float,
        typer.Option(
            "--poll",
            metavar="SECONDS",
            min=MIN_POLL_S,
            max=MAX_POLL_S,
            help="Seconds between looks for due runs.",
        ),
    ] = 0.5,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65_535,
            help="Serve /metrics (Prometheus), /ready and /live on this port; no token: keep it"
            " where only your scraper and probes reach it.",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Interface --metrics-port listens on.")
    ] = "127.0.0.1",
) -> None:
    """Claim and advance the agent's runs that need it (expired leases, due reconciliations)
    until stopped.

    A database that goes away does not end the worker: it reconnects, waiting 1, 2, 4, ... up
    to 30 s between tries. One it cannot connect to at all at start is a configuration error
    (one that drops the worker's first connections has been reached: it reconnects)."""
    from loopwright.checkpoints.database import (
        DATABASE_FAULTS,
        DatabaseUnavailable,
        resolve_database_url,
    )
    from loopwright.cli import hosting
    from loopwright.graph.bounded import stop_all
    from loopwright.worker import work

    hosted = hosting.agent_for(agent)
    stop = threading.Event()
    current: list[Runner] = []  # the worker's session, while it has one (for its probes)
    probes = _probe_port(
        metrics_host,
        metrics_port,
        resolve_database_url(db),
        lambda: current[0] if current else None,
    )

    def stop_now(*_: object) -> None:
        """No run started after this; a model request in flight ends now (the attempt unwinds
        and gives its lease up), rather than at its timeout."""
        stop.set()
        stop_all()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_now)

    def show_attempt(run_id: str, result: RunOutcome | Exception) -> None:
        if isinstance(result, Exception):
            console.print(
                f"{flat(run_id)}: gave up ({type(result).__name__}: {flat(result)})", markup=False
            )
        else:
            console.print(
                f"{flat(run_id)}: {result.phase} {result.stop_reason or ''}", markup=False
            )

    reconnect_s = RECONNECT_FIRST_S
    connected = False
    while not stop.is_set():
        try:
            with hosting.session(hosted, db, model) as runner:
                runner.lease_wait_s = 0  # a run held by another worker is theirs: skip it
                console.print(
                    f"worker {runner.owner} for agent {hosted.name} {hosted.version},"
                    f" polling every {poll}s",
                    markup=False,
                )
                connected, reconnect_s = True, RECONNECT_FIRST_S
                current[:] = [runner]
                try:
                    work(
                        runner,
                        stop=stop,
                        poll_s=poll,
                        on_attempt=show_attempt,
                        on_idle=lambda line: console.print(f"worker: {flat(line)}", markup=False),
                    )
                finally:
                    current.clear()
        except DATABASE_FAULTS as exc:
            if not connected and isinstance(exc, DatabaseUnavailable):
                raise  # never reached: a wrong URL or a database that is not there
            # Reached, then lost (while starting up, too): the database is there; reconnect.
            # The connections are suspect: open new ones (after a pause) rather than exit.
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            console.print(
                f"worker: database fault ({first_line}); reconnecting in {reconnect_s:g}s",
                markup=False,
            )
            stop.wait(reconnect_s)
            reconnect_s = min(2 * reconnect_s, RECONNECT_MAX_S)
    if probes is not None:
        probes.close()


def _probe_port(
    host: str, port: int | None, database_url: str, runner: Callable[[], Runner | None]
) -> ProbePort | None:
    """The worker's probes and metrics on `port` (None: not asked for); a port it cannot
    listen on is refused in one line, before the worker starts."""
    if port is None:
        return None
    from loopwright.observability.stored_state import scrape
    from loopwright.probe_port import ProbePort
    from loopwright.worker import worker_down

    try:
        return ProbePort(
            host,
            port,
            down=lambda: worker_down(database_url, runner()),
            scrape=lambda: scrape(database_url),
        )
    except OSError as exc:
        raise UsageError(
            f"--metrics-port {port}: cannot listen on {host}: {exc.strerror or exc}"
        ) from None
