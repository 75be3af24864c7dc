"""The `loopwright` command: demo, run, resume, show, approvals, graph, services.

Errors a user can cause (a bad database URL, an unknown user, order or run) end with one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import click
import httpx
import typer
from rich.console import Console

from loopwright.checkpoints.database import (
    DATABASE_FAULTS,
    DatabaseKind,
    DatabaseUnavailable,
    DatabaseUrlError,
    database_kind,
    loopwright_home,
    resolve_database_url,
)
from loopwright.checkpoints.journal import StaleTransition
from loopwright.checkpoints.leases import LeaseHeld, LeaseLost, StaleWriter
from loopwright.graph.build import compile_graph
from loopwright.graph.state import (
    UNRESOLVED_STATUSES,
    ApprovalChoice,
    ApprovalRequest,
    Principal,
)
from loopwright.models.factory import make_model
from loopwright.run_list import render_runs
from loopwright.runner import (
    RunExists,
    Runner,
    RunOutcome,
    UnknownRun,
    lease_ttl_from_env,
    new_run_id,
    open_runner,
)
from loopwright.server.launch import ServerFailedToStart
from loopwright.timeline import Redactor, TimelinePrinter, render_run
from loopwright.worker import work
from loopwright_refunds.contracts import ORDER_IN_TEXT, task_scope
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import ServicesFailedToStart, start_services

DEMO_TASK = "Check whether order O-42 can be refunded and refund it if so."
DEMO_USER = "u-1"
DEMO_APPROVER = "a-1"

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
approvals_app = typer.Typer(no_args_is_help=True, help="List and decide pending approvals.")
app.add_typer(approvals_app, name="approvals")
console = Console(highlight=False, soft_wrap=True)
errors = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL (sqlite:///FILE or postgresql://...). Default: $DATABASE_URL, else the embedded SQLite file.",
    ),
]
ModelOption = Annotated[
    str | None, typer.Option("--model", help="scripted (default) or openai:<model>.")
]


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


def services_dir() -> Path:
    return loopwright_home() / "services"


@contextmanager
def business_services(*, fresh: bool = False) -> Iterator[ServiceEndpoints]:
    """The reference services: those named by $LOOPWRIGHT_SERVICES, or started here."""
    configured = ServiceEndpoints.from_env()
    if configured is not None:
        yield configured
        return
    if fresh:
        shutil.rmtree(services_dir(), ignore_errors=True)
    with start_services(services_dir()) as running:
        yield running.endpoints


@contextmanager
def session(
    db: str | None, model: str | None = None, *, fresh_services: bool = False
) -> Iterator[Runner]:
    try:
        chat_model = make_model(model)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    url = resolve_database_url(db)
    with ExitStack() as stack:
        endpoints = stack.enter_context(business_services(fresh=fresh_services))
        # A run whose last process died holds its lease until expiry: wait that long, no longer.
        runner = stack.enter_context(
            open_runner(
                url,
                endpoints,
                model=chat_model,
                lease_wait_s=lease_ttl_from_env() + 1,
            )
        )
        yield runner


def principal_for(runner: Runner, user_id: str, task: str) -> Principal:
    """The trusted principal of a new run: a known user, scoped to the orders the task names."""
    endpoints = runner.env.endpoints
    response = runner.env.http.get(f"{endpoints.orders}/users/{user_id}", timeout=5.0)
    if response.status_code == 404:
        raise UsageError(f"unknown user {user_id!r}")
    response.raise_for_status()
    for order_id in ORDER_IN_TEXT.findall(task):
        if (
            runner.env.http.get(f"{endpoints.orders}/orders/{order_id}", timeout=5.0).status_code
            == 404
        ):
            raise UsageError(f"unknown order {order_id!r}")
    roles = tuple(response.json().get("roles", ["customer"]))
    return Principal(user_id=user_id, roles=roles, scope=task_scope(task))


def require_approver(runner: Runner, approver: str) -> None:
    endpoints = runner.env.endpoints
    response = runner.env.http.get(f"{endpoints.orders}/users/{approver}", timeout=5.0)
    if response.status_code == 404 or "approver" not in response.json().get("roles", []):
        raise UsageError(f"{approver!r} is not an approver")


def decide(
    request: dict[str, Any],
    decision: ApprovalChoice,
    approver: str,
    comment: str = "",
    *,
    changes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The resume value that answers `request`; an edit changes `changes` and keeps the rest."""
    try:
        answer = ApprovalRequest.model_validate(request).answer(
            decision, approver, comment, changes
        )
    except ValueError as exc:  # pydantic's ValidationError included
        raise UsageError(str(exc)) from None
    return answer.model_dump(mode="json")


def report(outcome: RunOutcome, redactor: Redactor) -> None:
    """The run's end; for a run that did not complete, what it did and did not do in the
    business system, with sensitive arguments redacted as in the timeline."""
    console.print()
    if outcome.stop_reason == "completed":
        facts = (outcome.verification or {}).get("facts", {})
        console.print(
            f"[bold green]COMPLETED[/] run {outcome.run_id}, verified in the business system:"
        )
        for write in facts.get("writes", []):
            console.print(
                f"  refund [bold]{write.get('refund_id')}[/] order {write.get('order_id')} "
                f"{write.get('amount')} {write.get('currency')} ({write.get('status')})"
            )
        if not facts.get("writes"):
            console.print("  no business effect was needed")
        console.print(f"  answer: {facts.get('answer', '')}")
    elif outcome.waiting_for_approval:
        request = outcome.waiting_for_approval[0]
        console.print(
            f"[bold yellow]WAITING_APPROVAL[/] run {outcome.run_id}: {request['summary']}"
        )
        console.print(
            f"  approve: loopwright approvals approve {request['approval_id']} --as {DEMO_APPROVER}"
        )
        console.print(
            f"  reject:  loopwright approvals reject {request['approval_id']} --as {DEMO_APPROVER}"
        )
    else:
        console.print(
            f"[bold red]{outcome.phase}[/] run {outcome.run_id}: {outcome.stop_reason or 'not finished'} {outcome.stop_detail}"
        )
    if outcome.stop_reason != "completed":
        # An honest account of what happened in the business system, whatever the run's end.
        for action in outcome.actions:
            call = redactor.call(action.tool, action.args)
            if action.status == "SUCCEEDED":
                done = redactor.outcome(action.tool, action.outcome or {})
                console.print(redactor.text(f"  done: {call} -> {done}"))
            elif action.status in UNRESOLVED_STATUSES or action.status == "ESCALATED":
                console.print(
                    redactor.text(
                        f"  [bold red]unconfirmed write[/] {action.action_id} {call}: {action.status}"
                    )
                )
            else:
                console.print(redactor.text(f"  not done: {call} ({action.status})"))
    for offer in outcome.compensations:
        console.print(f"  compensation you may want (not performed): {offer}", markup=False)


def drive(
    runner: Runner, outcome: RunOutcome, *, yes: bool, approver: str, printer: TimelinePrinter
) -> RunOutcome:
    """Answer approval interrupts on the terminal (or with --yes) until the run stops asking."""
    while outcome.waiting_for_approval:
        request = outcome.waiting_for_approval[0]
        if yes:
            decision: Literal["approve", "reject"] = "approve"
        elif sys.stdin.isatty():
            prompt = (
                f"Approve '{request['summary']}' (digest {request['digest'][:12]}) as {approver}?"
            )
            decision = "approve" if typer.confirm(prompt, default=False) else "reject"
        else:
            return outcome
        outcome = runner.resume(
            outcome.run_id, decide(request, decision, approver), on_step=printer
        )
    return outcome


@app.command()
def demo(
    db: DbOption = None,
    yes: Annotated[
        bool, typer.Option("--yes", help=f"Approve as the demo approver {DEMO_APPROVER}.")
    ] = False,
) -> None:
    """Run the refund scenario end to end on fresh reference services and print its timeline."""
    with session(db, fresh_services=True) as runner:
        principal = principal_for(runner, DEMO_USER, DEMO_TASK)
        console.rule("[bold]loopwright demo")
        console.print(f"task: {DEMO_TASK}\nuser: {DEMO_USER}\n")
        printer = TimelinePrinter(console)
        outcome = runner.start(DEMO_TASK, principal, on_step=printer)
        outcome = drive(runner, outcome, yes=yes, approver=DEMO_APPROVER, printer=printer)
        report(outcome, printer.redactor)


@app.command()
def run(
    task: str,
    user: Annotated[str, typer.Option("--user", help="The trusted principal the run acts for.")],
    db: DbOption = None,
    model: ModelOption = None,
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
) -> None:
    """Start a run of TASK for USER."""
    with session(db, model) as runner:
        principal = principal_for(runner, user, task)
        run_id = run_id or new_run_id()
        console.print(f"run {run_id}")
        printer = TimelinePrinter(console)
        report(runner.start(task, principal, run_id=run_id, on_step=printer), printer.redactor)


@app.command()
def resume(run_id: str, db: DbOption = None, model: ModelOption = None) -> None:
    """Continue a run that stopped mid-way (a crash, or a parked reconciliation)."""
    with session(db, model) as runner:
        printer = TimelinePrinter(console)
        report(runner.resume(run_id, on_step=printer), printer.redactor)


@app.command()
def cancel(run_id: str, db: DbOption = None) -> None:
    """Stop a run: no new step or action starts, writes in flight are reconciled first."""
    with session(db) as runner:
        printer = TimelinePrinter(console)
        report(runner.cancel(run_id, on_step=printer), printer.redactor)


# `show` and `runs` read the database only: no business service is started, none is called.
NO_SERVICES = ServiceEndpoints(orders="", policies="", payments="")


@contextmanager
def records(db: str | None) -> Iterator[Runner]:
    with open_runner(resolve_database_url(db), NO_SERVICES, model=make_model("scripted")) as runner:
        yield runner


@app.command()
def show(run_id: str, db: DbOption = None) -> None:
    """Print a run's timeline from the database: its steps, each action's full history, its end."""
    with records(db) as runner:
        render_run(runner, run_id, console)


@app.command()
def runs(db: DbOption = None) -> None:
    """List runs: phase, stop reason, age; runs with unconfirmed writes first."""
    with records(db) as runner:
        render_runs(runner, console)


def _pending_approvals(runner: Runner) -> list[dict[str, Any]]:
    found = []
    for run_id in runner.run_ids():
        found += runner.outcome(run_id).waiting_for_approval
    return found


@approvals_app.command("list")
def approvals_list(db: DbOption = None) -> None:
    """Pending approvals across runs."""
    with session(db) as runner:
        pending = _pending_approvals(runner)
        for request in pending:
            console.print(
                f"{request['approval_id']}  run {request['run_id']}  {request['summary']}  expires {request['expires_at']}  digest {request['digest'][:12]}"
            )
        if not pending:
            console.print("no pending approvals")


def _decide_command(
    approval_id: str,
    decision: ApprovalChoice,
    approver: str,
    db: str | None,
    comment: str,
    changes: list[str] | None = None,
) -> None:
    with session(db) as runner:
        require_approver(runner, approver)
        match = [r for r in _pending_approvals(runner) if r["approval_id"] == approval_id]
        if not match:
            raise UsageError(f"no pending approval {approval_id!r}")
        request = match[0]
        edits = _parse_changes(changes or []) if decision == "edit" else None
        printer = TimelinePrinter(console)
        outcome = runner.resume(
            request["run_id"],
            decide(request, decision, approver, comment, changes=edits),
            on_step=printer,
        )
        report(outcome, printer.redactor)


def _parse_changes(changes: list[str]) -> dict[str, str]:
    """`FIELD=VALUE` pairs (which fields an edit may change, `ApprovalRequest.answer` says)."""
    parsed: dict[str, str] = {}
    for change in changes:
        field, sep, value = change.partition("=")
        if not sep or not field:
            raise UsageError(f"--set {change!r}: expected FIELD=VALUE")
        parsed[field] = value
    return parsed


ApproverOption = Annotated[str, typer.Option("--as", help="The approver's user id.")]


@approvals_app.command("approve")
def approvals_approve(
    approval_id: str, approver: ApproverOption, db: DbOption = None, comment: str = ""
) -> None:
    """Approve one pending action (exactly the digest it names) and resume its run."""
    _decide_command(approval_id, "approve", approver, db, comment)


@approvals_app.command("reject")
def approvals_reject(
    approval_id: str, approver: ApproverOption, db: DbOption = None, comment: str = ""
) -> None:
    """Reject one pending action and resume its run."""
    _decide_command(approval_id, "reject", approver, db, comment)


@approvals_app.command("edit")
def approvals_edit(
    approval_id: str,
    approver: ApproverOption,
    changes: Annotated[
        list[str], typer.Option("--set", help="FIELD=VALUE to change; repeat for more fields.")
    ],
    db: DbOption = None,
    comment: str = "",
) -> None:
    """Change some arguments of one pending action and resume its run.

    The action asked about is rejected; the edited one waits for an approval of its own.
    """
    _decide_command(approval_id, "edit", approver, db, comment, changes)


RECONNECT_FIRST_S = 1.0
RECONNECT_MAX_S = 30.0


@app.command()
def worker(
    db: DbOption = None,
    model: ModelOption = None,
    poll: Annotated[
        float, typer.Option("--poll", help="Seconds between looks for due runs.")
    ] = 0.5,
) -> None:
    """Claim and advance runs that need it (expired leases, due reconciliations) until stopped.

    A database that goes away does not end the worker: it reconnects, waiting 1, 2, 4, ... up
    to 30 s between tries. One it cannot reach at all at start is a configuration error."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def show_attempt(run_id: str, result: RunOutcome | Exception) -> None:
        if isinstance(result, Exception):
            console.print(f"{run_id}: gave up ({type(result).__name__}: {result})", markup=False)
        else:
            console.print(f"{run_id}: {result.phase} {result.stop_reason or ''}", markup=False)

    reconnect_s = RECONNECT_FIRST_S
    connected = False
    while not stop.is_set():
        try:
            with session(db, model) as runner:
                runner.lease_wait_s = 0  # a run held by another worker is theirs: skip it
                console.print(f"worker {runner.owner} polling every {poll}s", markup=False)
                connected, reconnect_s = True, RECONNECT_FIRST_S
                work(runner, stop=stop, poll_s=poll, on_attempt=show_attempt)
        except DATABASE_FAULTS as exc:
            if not connected:
                raise  # never reached: a wrong URL or a database that is not there
            # The connections are suspect: open new ones (after a pause) rather than exit.
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            console.print(
                f"worker: database fault ({first_line}); reconnecting in {reconnect_s:g}s",
                markup=False,
            )
            stop.wait(reconnect_s)
            reconnect_s = min(2 * reconnect_s, RECONNECT_MAX_S)


@app.command()
def graph(
    png: Annotated[
        Path | None,
        typer.Option("--png", help="Render the graph to this PNG file (needs Graphviz's dot)."),
    ] = None,
) -> None:
    """Print the loop's graph as Mermaid text, or render it to a PNG offline."""
    drawable = compile_graph().get_graph()
    if png is None:
        console.print(drawable.draw_mermaid(), markup=False)
        return
    dot = shutil.which("dot")
    if dot is None:
        raise UsageError(
            "--png needs Graphviz's `dot` (Debian: apt-get install graphviz);"
            " without it, `loopwright graph` prints the graph as Mermaid text"
        )
    result = subprocess.run(
        [dot, "-Tpng", "-o", str(png)],
        input=graph_dot(drawable),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise UsageError(f"dot could not render the graph: {result.stderr.strip()}")
    console.print(f"wrote {png}", markup=False)


def graph_dot(drawable: Any) -> str:
    """The graph in Graphviz's language: routed (conditional) edges dashed, as in Mermaid."""
    lines = [
        "digraph loopwright {",
        '  graph [rankdir=TB, fontname="Helvetica"];',
        '  node [shape=box, style="rounded,filled", fillcolor="#eef0fb", fontname="Helvetica"];',
        '  edge [fontname="Helvetica"];',
    ]
    for node_id, node in drawable.nodes.items():
        label = {"__start__": "START", "__end__": "END"}.get(node_id, node.name)
        shape = ', shape=oval, fillcolor="#dddddd"' if node_id in ("__start__", "__end__") else ""
        lines.append(f'  "{node_id}" [label="{label}"{shape}];')
    for edge in drawable.edges:
        style = " [style=dashed]" if edge.conditional else ""
        lines.append(f'  "{edge.source}" -> "{edge.target}"{style};')
    lines.append("}")
    return "\n".join(lines) + "\n"


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 2024,
    db: DbOption = None,
) -> None:
    """Serve runs over HTTP: `langgraph dev`, offline, on Postgres, with the approval inbox."""
    from loopwright.server.launch import DEV_TOKENS, server_env, start_server

    url = resolve_database_url(db)
    if database_kind(url) is not DatabaseKind.POSTGRES:
        raise UsageError("serving needs Postgres: --db postgresql://... or DATABASE_URL")
    extra = {"DATABASE_URL": url}
    if not (os.environ.get("LOOPWRIGHT_TOKENS") or os.environ.get("LOOPWRIGHT_TOKENS_FILE")):
        extra["LOOPWRIGHT_TOKENS_FILE"] = str(DEV_TOKENS)
        errors.print(f"no token table configured: using the dev tokens in {DEV_TOKENS}")
    with business_services() as endpoints:
        extra.update(endpoints.to_env())
        env = server_env(os.environ, extra)
        with start_server(
            loopwright_home() / "server", env, host=host, port=port, stdout=sys.stdout.buffer
        ) as running:
            console.print(f"API    {running.url}", markup=False)
            console.print(f"inbox  {running.url}/inbox", markup=False)
            console.print(
                f"Studio https://smith.langchain.com/studio/?baseUrl={running.url}", markup=False
            )
            # SIGTERM too stops the server and the services this command started.
            signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
            with contextlib.suppress(KeyboardInterrupt):
                running.process.wait()


def _raise_keyboard_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@app.command()
def services() -> None:
    """Run the reference services in the foreground (their URLs are printed)."""
    with start_services(services_dir()) as running:
        for name, value in running.endpoints.to_env().items():
            console.print(f"export {name}='{value}'", markup=False)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


@app.command()
def experiment(
    repetitions: Annotated[
        int, typer.Option("--repetitions", "-n", min=1, help="Seeded repetitions of the matrix.")
    ] = 3,
    out: Annotated[
        Path, typer.Option("--out", help="Where results.json, report.md and the plots go.")
    ] = Path(".loopwright/experiment"),
    seed: Annotated[int, typer.Option("--seed", help="Seeds amounts and fault timings.")] = 1,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Postgres server to create the experiment's database on (dropped after). Default: $DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres.",
        ),
    ] = None,
    scenario: Annotated[
        list[str] | None, typer.Option("--scenario", help="Only these scenarios (repeatable).")
    ] = None,
    fault: Annotated[
        list[str] | None,
        typer.Option("--fault", help="Only these faults, by kind or full name (repeatable)."),
    ] = None,
    system: Annotated[
        list[str] | None, typer.Option("--system", help="Only these systems (repeatable).")
    ] = None,
) -> None:
    """Run the fault-injection experiment: loopwright against two baselines, then report."""
    from loopwright_refunds.experiments.run import Settings, run_experiment

    settings = Settings(
        repetitions=repetitions,
        seed=seed,
        out=out,
        database_server=db,
        scenarios=scenario or (),
        faults=fault or (),
        systems=system or (),
    )
    if not settings.matrix():
        raise UsageError("no cell of the matrix matches --scenario, --fault and --system")
    run_experiment(settings, console=errors)
    console.print((out / "report.md").read_text().split("\n## By fault")[0], markup=False)
    console.print(f"wrote {out}/results.json, report.md and the plots", markup=False)


def main() -> None:
    try:
        app(standalone_mode=False)
    except (
        UsageError,
        UnknownRun,
        RunExists,
        LeaseHeld,
        LeaseLost,
        StaleWriter,
        StaleTransition,
        DatabaseUrlError,
        DatabaseUnavailable,
        ServicesFailedToStart,
        ServerFailedToStart,
    ) as exc:
        errors.print(f"loopwright: error: {exc}", markup=False)
        raise SystemExit(2) from None
    except httpx.TransportError as exc:
        errors.print(f"loopwright: error: a business service is unreachable: {exc}", markup=False)
        raise SystemExit(2) from None
    except (typer.Abort, KeyboardInterrupt):
        raise SystemExit(130) from None
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None
