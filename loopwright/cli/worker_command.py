"""`loopwright worker`: claim and advance the agent's runs that need it until stopped, with
probes and metrics on a port of its own if asked (`loopwright.worker`)."""

from __future__ import annotations

import signal
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
    from loopwright.worker import Worker

# Bounds of --poll: a value past them is a usage error (one line, exit 2), not a traceback
# from the timer it would overflow.
MIN_POLL_S, MAX_POLL_S = 0.01, 3_600.0

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
    from loopwright.checkpoints.database import resolve_database_url
    from loopwright.cli import hosting
    from loopwright.worker import Worker

    hosted = hosting.agent_for(agent)

    def started(runner: Runner) -> None:
        console.print(
            f"worker {runner.owner} for agent {hosted.name} {hosted.version},"
            f" polling every {poll}s",
            markup=False,
        )

    def reconnecting(fault: str, pause_s: float) -> None:
        console.print(
            f"worker: database fault ({fault}); reconnecting in {pause_s:g}s", markup=False
        )

    running = Worker(
        lambda: hosting.session(hosted, db, model),
        poll_s=poll,
        on_session=started,
        on_attempt=show_attempt,
        on_idle=lambda line: console.print(f"worker: {flat(line)}", markup=False),
        on_fault=reconnecting,
    )
    probes = _probe_port(metrics_host, metrics_port, resolve_database_url(db), running)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: running.stop())
    try:
        running.run()
    finally:
        if probes is not None:
            probes.close()


def show_attempt(run_id: str, result: RunOutcome | Exception) -> None:
    """One attempt's end: where the run stands, or the error that ended the attempt."""
    if isinstance(result, Exception):
        console.print(
            f"{flat(run_id)}: gave up ({type(result).__name__}: {flat(result)})", markup=False
        )
    else:
        console.print(f"{flat(run_id)}: {result.phase} {result.stop_reason or ''}", markup=False)


def _probe_port(
    host: str, port: int | None, database_url: str, running: Worker
) -> ProbePort | None:
    """The worker's probes and metrics on `port` (None: not asked for); a port it cannot
    listen on is refused in one line, before the worker starts."""
    if port is None:
        return None
    from loopwright.probe_port import ProbePort
    from loopwright.stored_state import scrape

    try:
        return ProbePort(
            host,
            port,
            down=lambda: running.down(database_url),
            scrape=lambda: scrape(database_url),
        )
    except OSError as exc:
        raise UsageError(
            f"--metrics-port {port}: cannot listen on {host}: {exc.strerror or exc}"
        ) from None
