"""The `loopwright` command: host an agent's runs (run, resume, cancel, approvals, worker,
serve), read them back (show, runs), and the demo.

Every command hosts one agent, named by import path (`--agent module:attribute`,
`$LOOPWRIGHT_AGENT`, or `agent = "..."` in a `[tool.loopwright]` table of ./pyproject.toml);
the reference agent (`loopwright_refunds`) is the default. Errors a user can cause (a bad
database URL, a user or task the agent refuses, an unknown run, another agent's run) end with
one line on stderr and exit code 2, never a traceback. The exit code of a command that advances
a run says where it stands: 0 completed, 3 waiting for a person, 4 incomplete, 5 parked.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import click
import typer
from rich.console import Console
from typer.core import TyperOption

from loopwright.display import SafeConsole, flat, inline

if TYPE_CHECKING:
    from loopwright._agent import Agent
    from loopwright.checkpoints.leases import LeaseHeld
    from loopwright.graph.roles import Roles
    from loopwright.graph.state import (
        ApprovalChoice,
        Principal,
    )
    from loopwright.probe_port import ProbePort
    from loopwright.runner import (
        Runner,
        RunOutcome,
    )
    from loopwright.timeline import Redactor, TimelinePrinter


# The agent a command hosts when none is named: the reference agent (the demo's).
DEFAULT_AGENT = "loopwright_refunds.agent:agent"
AGENT_ENV = "LOOPWRIGHT_AGENT"
# `loopwright runs` without --limit: a screenful and more, never a whole database of runs.
DEFAULT_RUNS_LISTED = 100
MAX_RUNS_LISTED = 1_000_000
# Bounds of the numeric options: a value past them is a usage error (one line, exit 2), not a
# traceback from where it would first overflow (a timer, a date, a socket).
MAX_RETENTION_DAYS = 36_500.0
MIN_POLL_S, MAX_POLL_S = 0.01, 3_600.0

# Help texts are Markdown: `code` stays literal, and a `[table]` is text, not Rich markup.
app = typer.Typer(
    no_args_is_help=True,
    help=__doc__,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
approvals_app = typer.Typer(
    no_args_is_help=True, help="List and decide pending approvals.", rich_markup_mode="markdown"
)
app.add_typer(approvals_app, name="approvals")
tokens_app = typer.Typer(
    no_args_is_help=True,
    help="Entries of a token table (`LOOPWRIGHT_TOKENS_FILE`): tokens stored hashed.",
    rich_markup_mode="markdown",
)
app.add_typer(tokens_app, name="tokens")
console = SafeConsole(highlight=False, soft_wrap=True)
errors = SafeConsole(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="Database URL (sqlite:///FILE or postgresql://...). Default: $DATABASE_URL, else the embedded SQLite file.",
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="openai:MODEL",
        envvar="LOOPWRIGHT_MODEL",
        help="An OpenAI-compatible model instead of the agent's own (a run keeps the model it started with).",
    ),
]
AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent",
        metavar="MODULE:ATTR",
        help=(
            "The agent to host, as module:attribute. Default: $LOOPWRIGHT_AGENT, else "
            "[tool.loopwright] agent in ./pyproject.toml, else the reference agent."
        ),
    ),
]


TenantOption = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        metavar="TENANT",
        help="The user's tenant (default: the default one): a principal is a tenant's user, the"
        " same user id in another tenant is someone else.",
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document (its schema named in it; see the README) instead of text.",
    ),
]


RunIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="RUN_ID", help="The run's id, as `run` printed it (`loopwright runs` lists them)."
    ),
]
ApprovalIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="APPROVAL_ID", help="As `loopwright approvals list` shows it (`apr_...`)."
    ),
]


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


def _print_version(value: bool) -> None:
    if value:
        from loopwright import __version__

        console.print(f"loopwright {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """loopwright: a recoverable agent runtime on LangGraph."""


class DepsUnavailable(Exception):
    """The agent's dependencies could not be opened (its business systems are not there)."""


def configured_agent_path(given: str | None) -> str | None:
    """The agent named by --agent, $LOOPWRIGHT_AGENT or ./pyproject.toml, if any."""
    if given:
        return given
    if os.environ.get(AGENT_ENV):
        return os.environ[AGENT_ENV]
    pyproject = Path.cwd() / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        document = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise UsageError(f"{pyproject}: {exc}") from None
    tool = document.get("tool", {})
    table = tool.get("loopwright", {}) if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        what = "tool.loopwright" if isinstance(tool, dict) else "tool"
        raise UsageError(f"{pyproject}: {what} is not a table")
    agent = table.get("agent")
    if agent is not None and not isinstance(agent, str):
        raise UsageError(
            f"{pyproject}: tool.loopwright.agent is {type(agent).__name__}: an import path"
            ' like "mypackage.agents:agent"'
        )
    return agent


def agent_for(given: str | None) -> Agent[Any]:
    """The agent a command hosts (see `configured_agent_path`; default: the reference one)."""
    from loopwright._loading import AgentNotFound, load_agent
    from loopwright.tools.contract import ToolDefinitionError

    path = configured_agent_path(given) or DEFAULT_AGENT
    try:
        agent = load_agent(path)
        agent.check()
    except (AgentNotFound, ToolDefinitionError) as exc:
        raise UsageError(str(exc)) from None
    return agent


@contextmanager
def session(
    agent: Agent[Any],
    db: str | None,
    model: str | None = None,
    *,
    deps: Callable[[], AbstractContextManager[Any]] | None = None,
    model_change: bool = False,
) -> Iterator[Runner]:
    """A runner of `agent` on the database, with the agent's dependencies open (or `deps`);
    `model_change`: a run it resumes takes this command's model (see `Runner.model_for`)."""
    from loopwright.checkpoints.database import resolve_database_url
    from loopwright.observability.tracing import TraceSettings
    from loopwright.runner import lease_ttl_from_env, open_runner

    try:
        if model:
            agent.chat_model(model)  # a bad spec is the user's to fix, before anything opens
        lease_ttl_s = lease_ttl_from_env()
        TraceSettings.from_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    url = resolve_database_url(db)
    with ExitStack() as stack:
        try:
            opened = stack.enter_context((deps or agent.open_deps)())
        except Exception as exc:
            raise DepsUnavailable(
                f"agent {agent.name}: its dependencies could not be opened: {_why(exc)}"
            ) from exc
        # A run whose last process died holds its lease until expiry: wait that long, no longer.
        runner = stack.enter_context(
            open_runner(
                url,
                agent,
                deps=opened,
                model_spec=model or None,
                model_change=model_change,
                lease_wait_s=lease_ttl_s + 1,
            )
        )
        runner.on_lease_wait = say_lease_wait
        yield runner


def say_lease_wait(held: LeaseHeld) -> None:
    """On stderr (stdout may be a --json document): whose lease a command waits out."""
    until = held.expires_at.strftime("%H:%M:%S UTC") if held.expires_at else "its expiry"
    errors.print(
        f"run {flat(held.run_id)} is leased by {flat(held.owner)} until {until}: waiting for it to finish"
        " or its lease to expire (a process that died holds it until then; Ctrl-C stops"
        " waiting)",
        markup=False,
    )


@contextmanager
def records(agent: Agent[Any], db: str | None) -> Iterator[Runner | None]:
    """A runner that only reads: the agent's dependencies are not opened, no service starts;
    None where there is no database yet (the embedded file before a first run): reading
    creates nothing."""
    from loopwright.checkpoints.database import database_exists, resolve_database_url
    from loopwright.runner import open_runner

    url = resolve_database_url(db, create=False)
    if not database_exists(url):
        yield None
        return
    with open_runner(url, agent, deps=None) as runner:
        yield runner


def tenant_of(given: str | None) -> str:
    """The tenant an option names (checked: one line, exit 2 if it is no tenant's name), or
    the default one."""
    from loopwright.graph.state import DEFAULT_TENANT
    from loopwright.graph.text import checked_tenant

    return DEFAULT_TENANT if given is None else checked_tenant(given)


def require_run(agent: Agent[Any], db: str | None, run_id: str) -> None:
    """UnknownRun (or OtherAgentsRun) before a command that advances `run_id` opens anything:
    a run that is not there is told from the records alone, so that no database is created
    and no business service started for it."""
    from loopwright.runner import UnknownRun

    with records(agent, db) as runner:
        if runner is None:
            raise UnknownRun(run_id)
        runner.owned(run_id)


def _why(exc: Exception) -> str:
    """What went wrong, in one line: a validation error's every problem (its first line only
    counts them), else the first line of the message."""
    from pydantic import ValidationError

    from loopwright.graph.text import validation_problems

    if isinstance(exc, ValidationError):
        return f"{exc.title}: {validation_problems(exc)}"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def principal_for(runner: Runner, user_id: str, task: str, tenant: str | None = None) -> Principal:
    """The trusted principal of a new run, as the agent derives it from the user and task."""
    from loopwright._agent import TaskRefused

    try:
        return runner.principal_for(user_id, task, tenant=tenant_of(tenant))
    except TaskRefused as exc:
        raise UsageError(str(exc)) from None


def require_approver(runner: Runner, approver: str) -> None:
    if not runner.is_approver(approver):
        raise UsageError(f"{approver!r} is not an approver of agent {runner.agent.name}")


def decide(
    request: dict[str, Any],
    decision: ApprovalChoice,
    approver: str,
    comment: str = "",
    *,
    changes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The resume value that answers `request`; an edit changes `changes` and keeps the rest."""
    from pydantic import ValidationError

    from loopwright.graph.state import ApprovalRequest
    from loopwright.graph.text import validation_problems

    try:
        answer = ApprovalRequest.model_validate(request).answer(
            decision, approver, comment, changes
        )
    except ValidationError as exc:
        raise UsageError(validation_problems(exc)) from None
    except ValueError as exc:  # separation of duties; an edit of what may not change
        raise UsageError(str(exc)) from None
    return answer.model_dump(mode="json")


def report(
    outcome: RunOutcome, redactor: Redactor, *, again: str = "", approver: str = "APPROVER"
) -> None:
    """The run's end (`reports.ending_lines`: the runtime's account, then the model's answer),
    with sensitive arguments redacted as in the timeline; for a run that waits for a person,
    what to decide. `again` is what a command printed for a person to type needs besides its
    arguments (--agent, --db)."""
    from loopwright.timeline import ending_lines

    console.print()
    if outcome.stop_reason != "completed" and outcome.waiting_for_approval:
        request = outcome.waiting_for_approval[0]
        console.print(
            f"[bold yellow]WAITING_APPROVAL[/] run {inline(outcome.run_id)}: {inline(request['summary'])}"
        )
        # An edit is approved by someone else than its editors: never suggest one of them.
        editors = list(request.get("edited_by") or [])
        confirm = " --yes" if request.get("confirm") else ""  # the write asks to be confirmed
        for verb, why in (("approve", confirm), ("reject", " --comment REASON")):
            who = "APPROVER" if verb == "approve" and approver in editors else approver
            console.print(
                f"  {verb}: loopwright approvals {verb} {request['approval_id']} --as {who}"
                f"{why}{again}",
                markup=False,
            )
        if editors:
            console.print(
                f"  edited by {flat(', '.join(editors))}: another approver must approve it",
                markup=False,
            )
    for line in ending_lines(outcome, redactor, run=outcome.run_id):
        console.print(line)


def step_printer(runner: Runner, as_json: bool, run_id: str | None = None) -> TimelinePrinter:
    """The timeline as the run advances; with --json, stdout holds the document alone. For a
    run that has steps already (resume, cancel, a decision), numbering goes on from its last
    committed step, as `show` numbers them."""
    from loopwright.timeline import TimelinePrinter

    printer = TimelinePrinter(Console(quiet=True) if as_json else console, runner.tools)
    if run_id is not None:
        runner.owned(run_id)  # another agent's or an unknown run: its own one-line error
        printer.step = len(runner.steps(run_id))
    return printer


@contextmanager
def advancing(run_id: str, again: str) -> Iterator[None]:
    """Where Ctrl-C (or SIGTERM) stops a run this command advances, at once in any phase
    (`stopping_at_once`): the run keeps every step it committed (a step in flight is run
    again, an action in flight reconciled), its lease is given up, and the user is told how it
    goes on; the command still ends with 130, as an interrupted one does."""
    from loopwright.stopping import stopping_at_once

    def tell() -> None:
        errors.print(
            f"loopwright: interrupted: run {run_id} keeps the steps it committed; go on with:"
            f" loopwright resume {run_id}{again}",
            markup=False,
        )

    with stopping_at_once(tell):
        yield


def print_json(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def conclude(
    runner: Runner,
    outcome: RunOutcome,
    printer: TimelinePrinter,
    *,
    as_json: bool,
    again: str = "",
    approver: str = "APPROVER",
) -> None:
    """Tell where the run stands (text or JSON) and exit with the code that says so."""
    from loopwright.outcome import ending_of
    from loopwright.reports import exit_code, run_document

    if as_json:
        print_json(run_document(runner, outcome))
    else:
        report(outcome, printer.redactor, again=again, approver=approver)
    raise typer.Exit(exit_code(ending_of(outcome, runner.tools)))


def repeat_options(agent: str | None, db: str | None) -> str:
    """The options a printed follow-up command needs to reach the same agent and database."""
    from loopwright.checkpoints.database import redact

    shown = ""
    if agent:
        shown += f" --agent {agent}"
    if db:
        shown += f" --db {redact(db)}"
    return shown


def drive(
    runner: Runner,
    outcome: RunOutcome,
    *,
    yes: bool,
    approver: str,
    printer: TimelinePrinter,
    interactive: bool = True,
) -> RunOutcome:
    """Answer approval interrupts on the terminal (or with --yes) until the run stops asking."""
    while outcome.waiting_for_approval:
        request = outcome.waiting_for_approval[0]
        if yes:
            decision: Literal["approve", "reject"] = "approve"
        elif interactive and sys.stdin.isatty():
            prompt = (
                f"Approve '{request['summary']}' (digest {request['digest'][:12]}) as {approver}?"
            )
            decision = "approve" if typer.confirm(prompt, default=False) else "reject"
        else:
            return outcome
        # A rejection says why, as `approvals reject` must: the model tells the customer.
        why = (
            typer.prompt("Why not?", default="rejected at the prompt")
            if decision == "reject"
            else ""
        )
        outcome = runner.resume(
            outcome.run_id, decide(request, decision, approver, why), on_step=printer
        )
    return outcome


@app.command()
def demo(
    db: DbOption = None,
    agent: AgentOption = None,
    yes: Annotated[
        bool,
        typer.Option("--yes", help="Approve every request as the demo's approver."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run the agent's demo end to end and print its timeline (default: the reference one)."""
    from loopwright.runner import new_run_id

    hosted = agent_for(agent)
    script = hosted.demo
    if script is None:
        raise UsageError(f"agent {hosted.name} declares no demo (Agent(demo=Demo(...)))")
    with session(hosted, db, deps=script.deps) as runner:
        principal = principal_for(runner, script.user, script.task)
        printer = step_printer(runner, as_json)
        printer.console.rule(f"[bold]loopwright demo: {hosted.name}")
        printer.console.print(f"task: {script.task}\nuser: {script.user}\n", markup=False)
        run_id, again = new_run_id(), repeat_options(agent, db)
        with advancing(run_id, again):
            outcome = runner.start(script.task, principal, run_id=run_id, on_step=printer)
            outcome = drive(
                runner,
                outcome,
                yes=yes,
                approver=script.approver,
                printer=printer,
                interactive=not as_json,
            )
        conclude(runner, outcome, printer, as_json=as_json, again=again, approver=script.approver)


@app.command()
def run(
    task: Annotated[str, typer.Argument(metavar="TASK", help="What the agent is asked to do.")],
    user: Annotated[
        str, typer.Option("--user", metavar="USER", help="The trusted principal the run acts for.")
    ],
    db: DbOption = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id",
            help="The run's id (default: a new one): letters, digits and . _ : -, at most 128."
            " A run of this id that exists is refused.",
        ),
    ] = None,
    tenant: TenantOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a run of TASK for USER (of TENANT)."""
    from loopwright.graph.text import checked_run_id
    from loopwright.runner import checked_start, new_run_id

    run_id = new_run_id() if run_id is None else checked_run_id(run_id)
    tenant_name = tenant_of(tenant)
    checked_start(user, task, tenant_name)  # refused before a database or service is opened
    with session(agent_for(agent), db, model) as runner:
        principal = principal_for(runner, user, task, tenant_name)
        printer = step_printer(runner, as_json)
        printer.console.print(f"run {run_id}", markup=False)
        again = repeat_options(agent, db)
        with advancing(run_id, again):
            outcome = runner.start(task, principal, run_id=run_id, on_step=printer)
        conclude(runner, outcome, printer, as_json=as_json, again=again)


@app.command()
def resume(
    run_id: RunIdArgument,
    db: DbOption = None,
    agent: AgentOption = None,
    model: ModelOption = None,
    model_change: Annotated[
        bool,
        typer.Option(
            "--model-change",
            help="Go on with this command's model (--model, or the run's own with this"
            " environment's settings) instead of the one the run recorded; the change is"
            " recorded in the run.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Continue a run that stopped mid-way (a crash, or a parked reconciliation). It keeps
    the model it recorded (endpoint, timeout, retries), unless --model-change."""
    hosted = agent_for(agent)
    require_run(hosted, db, run_id)
    with session(hosted, db, model, model_change=model_change) as runner:
        printer = step_printer(runner, as_json, run_id)
        again = repeat_options(agent, db)
        with advancing(run_id, again):
            outcome = runner.resume(run_id, on_step=printer)
        conclude(runner, outcome, printer, as_json=as_json, again=again)


@app.command()
def cancel(
    run_id: RunIdArgument,
    db: DbOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop a run: no new step or action starts, writes in flight are reconciled first."""
    hosted = agent_for(agent)
    require_run(hosted, db, run_id)
    with session(hosted, db) as runner:
        printer = step_printer(runner, as_json, run_id)
        with advancing(run_id, repeat_options(agent, db)):
            outcome = runner.cancel(run_id, on_step=printer)
        conclude(runner, outcome, printer, as_json=as_json)


@app.command()
def show(
    run_id: RunIdArgument,
    db: DbOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a run's timeline from the database: its steps, each action's full history, its end."""
    from loopwright.reports import run_history_document
    from loopwright.runner import UnknownRun
    from loopwright.timeline import render_run

    with records(agent_for(agent), db) as runner:
        if runner is None:
            raise UnknownRun(run_id)
        runner.owned(run_id)
        if as_json:
            print_json(run_history_document(runner, runner.outcome(run_id)))
        else:
            render_run(runner, run_id, console)


@app.command()
def runs(
    db: DbOption = None,
    agent: AgentOption = None,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            metavar="VERSION",
            help="Only runs this agent version advanced last (a run continued by a new version"
            " is the new version's).",
        ),
    ] = None,
    unfinished: Annotated[
        bool,
        typer.Option(
            "--unfinished",
            help="Only runs that have not ended (running, waiting for a person, parked): what a"
            " drain waits for.",
        ),
    ] = False,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            min=0,
            max=MAX_RUNS_LISTED,
            help="List at most this many runs besides those with unconfirmed writes, which are"
            " always listed; 0: every run.",
        ),
    ] = DEFAULT_RUNS_LISTED,
    as_json: JsonOption = False,
) -> None:
    """List runs: agent and version, phase, stop reason, age; unconfirmed writes first, then
    the newest.

    Every agent's runs, unless an agent is named (--agent, $LOOPWRIGHT_AGENT, pyproject)."""
    from loopwright.reports import runs_document
    from loopwright.run_list import RunList, render_runs, run_lines

    named = configured_agent_path(agent)
    hosted = agent_for(named)
    with records(hosted, db) as runner:
        shown = hosted.name if named else None
        listed = (
            run_lines(
                runner, agent=shown, version=version, limit=limit or None, unfinished=unfinished
            )
            if runner
            else RunList([], 0)
        )
        if as_json:
            print_json(runs_document(listed, hosted.tools))
        else:
            render_runs(listed, console)


@app.command()
def retention(
    older_than: Annotated[
        float,
        typer.Option(
            "--older-than",
            metavar="DAYS",
            min=0,
            max=MAX_RETENTION_DAYS,
            help="Prune runs that ended this long ago.",
        ),
    ],
    db: DbOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be pruned; change nothing.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Remove the checkpoints of finished runs that ended more than DAYS ago (an operator's job).

    Keeps every journal row and a final summary of each run (stop reason, verification, each
    action's final status, the final answer): `show` and `runs` still say how it ended. Never
    touches a run that is running, waiting for a person or parked, or whose writes are not
    settled."""
    from loopwright.checkpoints.database import database_exists, redact, resolve_database_url
    from loopwright.checkpoints.retention import retain
    from loopwright.reports import retention_document

    url = resolve_database_url(db, create=False)
    if not database_exists(url):
        raise UsageError(f"no loopwright database at {redact(url)}")
    report = retain(url, older_than, dry_run=dry_run)
    if as_json:
        print_json(retention_document(report))
        return
    verb = "would prune" if dry_run else "pruned"
    for run in report.pruned:
        assert run.summary is not None
        console.print(
            f"{verb} {flat(run.run_id)}  {run.summary.stop_reason}  ended {run.ended_at}"
            f"  {run.checkpoints} checkpoints, {run.bytes} bytes",
            markup=False,
        )
    for run in report.kept:
        console.print(f"kept {flat(run.run_id)}: {run.kept}", markup=False)
    console.print(
        f"{len(report.pruned)} runs {verb}, {len(report.kept)} kept (ended before"
        f" {report.cutoff}); checkpoint bytes before {report.bytes_before},"
        f" after {report.bytes_after}",
        markup=False,
    )


@app.command()
def faults(
    agent: AgentOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Prove the agent before production: its scenarios (else its demo) run once clean, then
    under each fault at each write the clean run sent (request lost, answer lost, answer late,
    request delivered late, delivered twice, a process killed before and after the send and
    the run resumed by another), injected around the send whatever the tool's transport. Each
    trial is judged in the business system: effects per intent and whether the ending is
    truthful. Exits 1 if any trial made a duplicate effect, claimed COMPLETED with an effect
    missing, or never met its fault."""
    from loopwright.checkpoints.database import resolve_database_url
    from loopwright.faults import Trial, prove, scenarios_of

    hosted = agent_for(agent)
    path = configured_agent_path(agent) or DEFAULT_AGENT
    scenarios_of(hosted)  # an agent with nothing to prove it on is refused before anything runs
    url = resolve_database_url(db)

    def show_trial(trial: Trial) -> None:
        if as_json:
            return
        where = f"write {trial.write} ({trial.tool})" if trial.write else "clean run"
        fault = trial.fault.value if trial.fault else "-"
        effects = ", ".join(f"{n}" for n in trial.effects.values()) or "none"
        console.print(
            f"{trial.scenario}  {where:<28} {fault:<17} {trial.stop_reason or trial.phase:<14}"
            f" effects per intent: {effects:<6} {trial.verdict}",
            markup=False,
        )

    proof = prove(hosted, database_url=url, agent_path=path, on_trial=show_trial)
    if as_json:
        print_json(proof.as_json())
    else:
        for skipped in proof.skipped:
            console.print(f"not tried: {skipped}", markup=False)
        trials, failed = len(proof.trials), len(proof.failures)
        verdict = (
            f"held under every fault tried: {trials} trials, 0 failed"
            if proof.held
            else f"did not hold: {failed} of {trials} trials failed"
        )
        console.print(f"{hosted.name}: {verdict}", markup=False)
    if not proof.held:
        raise typer.Exit(1)


def _pending_approvals(runner: Runner, tenant: str | None = None) -> list[dict[str, Any]]:
    """The approval requests of the agent's runs (of `tenant`'s users, if given) that have not
    ended (only their states are read: a database's runs are mostly ended ones)."""
    found = []
    for record in runner.leases.unended():
        if record.agent in ("", runner.agent.name) and tenant in (None, record.tenant):
            found += runner.outcome(record.run_id).waiting_for_approval
    return found


def _pending_approval(runner: Runner, approval_id: str, tenant: str) -> dict[str, Any] | None:
    """The pending request `approval_id` names, if it is pending in a run of `tenant`'s."""
    pending = _pending_approvals(runner, tenant)
    return next((r for r in pending if r["approval_id"] == approval_id), None)


@approvals_app.command("list")
def approvals_list(
    db: DbOption = None,
    agent: AgentOption = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", metavar="TENANT", help="Only the runs of this tenant's users."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Pending approvals across the agent's runs (every tenant's, unless one is named)."""
    from loopwright.reports import approvals_document

    hosted = agent_for(agent)
    with records(hosted, db) as runner:
        named = None if tenant is None else tenant_of(tenant)
        pending = _pending_approvals(runner, named) if runner else []
        if as_json:
            print_json(approvals_document(pending, hosted.tools))
            return
        now = runner.leases.now() if runner else None
        for request in pending:
            print_request(request, now, hosted)
        if not pending:
            console.print("no pending approvals")


def print_request(request: dict[str, Any], now: datetime | None, agent: Agent[Any]) -> None:
    """One pending approval as a person decides from it: what, for whom and why, the facts the
    agent declares, until when (on the database's clock, as expiry is judged)."""
    from loopwright.graph.state import ApprovalRequest
    from loopwright.timeline import Redactor

    parsed = ApprovalRequest.model_validate(request)
    redactor = Redactor(agent.tools)
    redactor.learn(parsed.tool, parsed.args)
    left = (parsed.expires_at - now).total_seconds() if now and parsed.expires_at else None
    when = f"expires {until(left)}" if left is not None else f"expires {parsed.expires_at}"
    lines = [
        f"{flat(parsed.approval_id)}  run {flat(parsed.run_id)}  {flat(parsed.summary)}",
        f"  for {flat(parsed.requested_by)}: {flat(parsed.task)}" if parsed.task else "",
        f"  why: {flat(parsed.why)}" if parsed.why else "",
        *(f"  {flat(fact.label)}: {flat(fact.value)}" for fact in parsed.facts),
        f"  {when}; digest {parsed.digest[:12]}"
        + ("; approving asks for a confirmation (--yes)" if parsed.confirm else ""),
    ]
    for line in filter(None, lines):
        console.print(redactor.text(line, markup=False), markup=False)


def confirm_approval(request: dict[str, Any]) -> None:
    """The second, deliberate step the write asks for before this approval (as the inbox's
    confirmation): a prompt on a terminal, else --yes; refused, the request still waits."""
    what = f"approving '{request['summary']}' needs a confirmation"
    if not sys.stdin.isatty():
        raise UsageError(f"{what}: add --yes; {request['approval_id']} still waits for a decision")
    if not typer.confirm(f"Really approve '{request['summary']}'?", default=False):
        raise UsageError(f"not confirmed; {request['approval_id']} still waits for a decision")


def until(seconds: float) -> str:
    """`in 23 h`, `in 12 min`, `5 min ago`: how far an expiry is, for a person."""
    minutes = abs(seconds) / 60
    amount = f"{minutes / 60:.0f} h" if minutes >= 90 else f"{max(1, round(minutes))} min"
    return f"in {amount}" if seconds >= 0 else f"{amount} ago"


def _decide_command(
    approval_id: str,
    decision: ApprovalChoice,
    approver: str,
    db: str | None,
    agent: str | None,
    comment: str,
    as_json: bool,
    changes: list[str] | None = None,
    *,
    confirmed: bool = False,
    server: str | None = None,
    tenant: str | None = None,
) -> None:
    """An approver of `tenant` decides a request of that tenant's runs (another tenant's are
    not theirs to see: the same answer as for no request at all)."""
    from loopwright.decisions import Asked, prepare

    hosted = agent_for(agent)
    of_tenant = tenant_of(tenant)
    missing = f"no pending approval {approval_id!r} of tenant {of_tenant!r}"
    # An approval that is not pending is told from the records alone: no database is created
    # and no business service started for it.
    with records(hosted, db) as reader:
        if reader is None or _pending_approval(reader, approval_id, of_tenant) is None:
            raise UsageError(missing)
    with session(hosted, db) as runner:
        require_approver(runner, approver)
        request = _pending_approval(runner, approval_id, of_tenant)
        if request is None:  # decided by someone else meanwhile
            raise UsageError(missing)
        if decision == "approve" and request.get("confirm") and not confirmed:
            confirm_approval(request)
        edits = _parse_changes(changes or []) if decision == "edit" else None
        run_id = request["run_id"]
        printer = step_printer(runner, as_json, run_id)
        record = runner.leases.get(run_id)
        if record is not None and record.engine:
            # Resumed by the engine that hosts it, never behind its back: the engine's own run
            # and thread records then end as the run does. Refused here first, as there.
            asked = Asked(approval_id=approval_id)
            prepare(runner, run_id, approver, decision, asked=asked, comment=comment, changes=edits)
            decided_by_server(server, request, decision, comment, edits)
            outcome = runner.outcome(run_id)
            conclude(runner, outcome, printer, as_json=as_json, again=repeat_options(agent, db))
        with advancing(run_id, repeat_options(agent, db)):
            outcome = runner.decide(
                run_id,
                decision,
                approver,
                approval_id=approval_id,
                comment=comment,
                changes=edits,
                on_step=printer,
            )
        conclude(runner, outcome, printer, as_json=as_json, again=repeat_options(agent, db))


TOKEN_ENV = "LOOPWRIGHT_TOKEN"


def decided_by_server(
    server: str | None,
    request: dict[str, Any],
    decision: ApprovalChoice,
    comment: str,
    changes: dict[str, str] | None,
) -> None:
    """Hand a decision about a served run to its server's inbox, as the approver whose token
    is in LOOPWRIGHT_TOKEN, and wait for the run it resumes (the server answers then)."""
    import httpx

    from loopwright import tls

    run_id, approval_id = request["run_id"], request["approval_id"]
    if not server:
        raise UsageError(
            f"run {run_id} is served: its server resumes it. Decide in its inbox (/inbox), or"
            f" here with --server URL and {TOKEN_ENV}=<your approver token>"
        )
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise UsageError(f"--server needs your approver token in {TOKEN_ENV}")
    body = {
        "thread_id": run_id,
        "interrupt_id": request["interrupt_id"],
        "decision": decision,
        "comment": comment,
        "changes": changes or {},
        "confirmed": True,  # asked here already, where the write wants it (--yes or a prompt)
    }
    try:
        answer = httpx.post(
            f"{server.rstrip('/')}/inbox/api/decisions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(600.0, connect=10.0),
            verify=tls.context(),
        )
    except httpx.HTTPError as exc:
        raise UsageError(f"--server {server}: {exc}") from None
    if answer.status_code != 200:
        try:
            detail = answer.json().get("detail", answer.text)
        except ValueError:
            detail = answer.text
        raise UsageError(f"the server refused ({answer.status_code}): {detail}; {approval_id}")


def _parse_changes(changes: list[str]) -> dict[str, str]:
    """`FIELD=VALUE` pairs (which fields an edit may change, `ApprovalRequest.answer` says)."""
    parsed: dict[str, str] = {}
    for change in changes:
        field, sep, value = change.partition("=")
        if not sep or not field:
            raise UsageError(f"--set {change!r}: expected FIELD=VALUE")
        parsed[field] = value
    return parsed


ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        help="For a run a server hosts: decide through it (its inbox's decision route), as the"
        " approver whose token is in LOOPWRIGHT_TOKEN.",
    ),
]
ApproverOption = Annotated[
    str, typer.Option("--as", metavar="APPROVER", help="The approver's user id.")
]
CommentOption = Annotated[
    str,
    typer.Option(
        "--comment",
        metavar="TEXT",
        help="Why: recorded with the decision, shown in the run's timeline and to its model.",
    ),
]
ReasonOption = Annotated[
    str,
    typer.Option(
        "--comment",
        metavar="TEXT",
        help="Why it is rejected (required): recorded with the decision, shown in the run's"
        " timeline and to its model, which tells the customer.",
    ),
]


@approvals_app.command("approve")
def approvals_approve(
    approval_id: ApprovalIdArgument,
    approver: ApproverOption,
    db: DbOption = None,
    agent: AgentOption = None,
    comment: CommentOption = "",
    as_json: JsonOption = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes",
            help="Confirm an approval the write asks to be confirmed (its `confirm`, e.g. above"
            " an amount) without a prompt; without a terminal it is required for those.",
        ),
    ] = False,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Approve one pending action (exactly the digest it names) and resume its run."""
    _decide_command(
        approval_id,
        "approve",
        approver,
        db,
        agent,
        comment,
        as_json,
        confirmed=yes,
        server=server,
        tenant=tenant,
    )


@approvals_app.command("reject")
def approvals_reject(
    approval_id: ApprovalIdArgument,
    approver: ApproverOption,
    comment: ReasonOption,
    db: DbOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Reject one pending action and resume its run."""
    if not comment.strip():
        raise UsageError("a rejection needs a reason: --comment TEXT")
    _decide_command(
        approval_id, "reject", approver, db, agent, comment, as_json, server=server, tenant=tenant
    )


@approvals_app.command("edit")
def approvals_edit(
    approval_id: ApprovalIdArgument,
    approver: ApproverOption,
    changes: Annotated[
        list[str],
        typer.Option(
            "--set", metavar="FIELD=VALUE", help="FIELD=VALUE to change; repeat for more fields."
        ),
    ],
    db: DbOption = None,
    agent: AgentOption = None,
    comment: CommentOption = "",
    as_json: JsonOption = False,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Change some arguments of one pending action and resume its run.

    The action asked about is rejected; the edited one waits for an approval of its own.
    """
    _decide_command(
        approval_id,
        "edit",
        approver,
        db,
        agent,
        comment,
        as_json,
        changes,
        server=server,
        tenant=tenant,
    )


RECONNECT_FIRST_S = 1.0
RECONNECT_MAX_S = 30.0


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
    from loopwright.graph.bounded import stop_all
    from loopwright.worker import work

    hosted = agent_for(agent)
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
            with session(hosted, db, model) as runner:
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


@app.command()
def graph(
    png: Annotated[
        Path | None,
        typer.Option(
            "--png",
            metavar="FILE",
            help="Render the graph to this PNG file (needs Graphviz's dot).",
        ),
    ] = None,
) -> None:
    """Print the loop's graph as Mermaid text, or render it to a PNG offline."""
    from loopwright.graph.build import compile_graph

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
    path = configured_agent_path(agent) or DEFAULT_AGENT
    hosted = agent_for(path)
    url = resolve_database_url(db)
    if database_kind(url) is not DatabaseKind.POSTGRES:
        raise UsageError("serving needs Postgres: --db postgresql://... or DATABASE_URL")
    _check_server_settings()
    extra = {"DATABASE_URL": url, AGENT_ENV: path, **_paths_from_here()}
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


@tokens_app.command("new")
def tokens_new(
    user: Annotated[str, typer.Option("--user", metavar="USER_ID", help="Whom the token names.")],
    role: Annotated[
        list[str],
        typer.Option(
            "--role",
            metavar="ROLE",
            help="A role name the agent grants something by (its roles=: who starts runs,"
            " decides approvals, reads the metrics); repeatable.",
        ),
    ],
    tenant: Annotated[str, typer.Option("--tenant", help="The user's tenant.")] = "default",
    agent: AgentOption = None,
) -> None:
    """A new random token and its table entry: the token on the first line (hand it to its
    user; it is stored nowhere), the entry (its hash) as JSON on the second, to add to the
    table's object. A role the agent grants nothing by is refused: the token would be refused
    everywhere it was used."""
    from loopwright.server.bearer_tokens import hash_token, new_token
    from loopwright.server.users import user_of

    try:
        named = user_of({"user_id": user, "roles": role, "tenant": tenant})
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    hosted = agent_for(agent)
    if idle := [name for name in named.roles if not hosted.roles.granting(name)]:
        raise UsageError(
            f"role {', '.join(map(repr, idle))} grants nothing with agent {hosted.name},"
            f" whose roles are {hosted.roles} (--agent names another agent)"
        )
    token = new_token()
    entry = {"user_id": named.user_id, "roles": list(named.roles), "tenant": named.tenant}
    console.print(token, markup=False)
    console.print(json.dumps({hash_token(token): entry}), markup=False)


@tokens_app.command("hash")
def tokens_hash(
    token: Annotated[
        str | None,
        typer.Argument(help="The token; default: read from standard input (out of the history)."),
    ] = None,
) -> None:
    """The table key of a token you have: `sha256:<hex>`."""
    from loopwright.server.bearer_tokens import MIN_TOKEN_CHARS, hash_token

    given = (token if token is not None else sys.stdin.readline()).strip()
    if not given or any(character.isspace() for character in given):
        raise UsageError("a token is one word, not blank")
    if len(given) < MIN_TOKEN_CHARS:
        raise UsageError(
            f"a token of {len(given)} characters is guessable from its hash: take one of at"
            f" least {MIN_TOKEN_CHARS} (loopwright tokens new makes one)"
        )
    console.print(hash_token(given), markup=False)


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


def main() -> None:
    command = typer.main.get_command(app)
    plain_help(command)
    if (problem := undecodable_argument(sys.argv[1:])) is not None:
        errors.print(f"loopwright: error: {problem}", markup=False)
        raise SystemExit(2)
    try:
        code = command.main(prog_name="loopwright", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        raise SystemExit(130) from None
    except CLICK_ERRORS as exc:
        raise SystemExit(usage_error(exc)) from None
    except Exception as exc:
        message = user_error(exc)
        if message is None:
            raise  # a bug: its traceback is what a report needs
        errors.print(f"loopwright: error: {flat(message)}", markup=False)
        raise SystemExit(2) from None
    # A command's own exit code (typer.Exit): how the run it advanced stands (EXIT_CODES).
    raise SystemExit(code if isinstance(code, int) else 0)


def undecodable_argument(args: Sequence[str]) -> str | None:
    """What is wrong with the first argument that is not UTF-8 (Python hands its bytes over as
    unpaired surrogates, which no run, database or service takes), or None. Checked before any
    command runs, so that no command meets it half-way (a run registered, a service asked)."""
    for position, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            given = arg.encode("utf-8", "surrogateescape")
            shown = repr(given) if len(given) <= 60 else f"{given[:57]!r}..."
            return f"argument {position} is not UTF-8 text: {shown}"
    return None


def plain_help(command: Any) -> None:
    """Help that shows what to type: a flag shows no value type (typer prints `<bool>` after
    --json, --help, --install-completion), an option without its own metavar shows its name
    (RUN_ID, not `<str>`). For `command` and every command under it."""
    help_option = command.get_help_option(command.context_class(command))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if param.metavar is None and isinstance(param, click.Option | TyperOption):
            param.metavar = "" if param.is_flag else (param.name or "").upper()
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)


def user_error(exc: Exception) -> str | None:
    """The one line an error a user can cause or fix is reported with (bad input, a run that is
    not theirs, a system that is not there or went away); None for anything else."""
    import httpx

    from loopwright._agent import TaskRefused
    from loopwright.checkpoints.database import (
        DATABASE_FAULTS,
        DatabaseUnavailable,
        DatabaseUrlError,
        HomeUnusable,
    )
    from loopwright.checkpoints.journal import StaleTransition
    from loopwright.checkpoints.leases import LeaseHeld, LeaseLost, RunPruned, StaleWriter
    from loopwright.decisions import DecisionNotTaken, DecisionRefused
    from loopwright.graph.text import InvalidText
    from loopwright.observability.tracing import TraceSettingsError
    from loopwright.runner import ModelChanged, OtherAgentsRun, RunExists, UnknownRun
    from loopwright.server.launch import ServerFailedToStart

    refused = (
        UsageError,
        DepsUnavailable,
        TaskRefused,
        InvalidText,
        UnknownRun,
        OtherAgentsRun,
        ModelChanged,
        DecisionRefused,
        DecisionNotTaken,
        RunExists,
        LeaseHeld,
        LeaseLost,
        RunPruned,
        StaleWriter,
        StaleTransition,
        DatabaseUrlError,
        DatabaseUnavailable,
        HomeUnusable,
        ServerFailedToStart,
        TraceSettingsError,
    )
    if isinstance(exc, refused):
        return str(exc)
    if isinstance(exc, httpx.TransportError):
        return f"a business service is unreachable: {exc}"
    if isinstance(exc, DATABASE_FAULTS):  # reached, then lost mid-command (a failover)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"the database failed: {first}"
    return None


def _click_errors() -> tuple[type[Exception], ...]:
    """The ClickException classes of the click typer really uses: its own copy (typer._click,
    since typer 0.2x), and the click package, which typer used before and may again."""
    found: list[type[Exception]] = [click.ClickException]
    with contextlib.suppress(ImportError):
        from typer._click.exceptions import ClickException as vendored

        found.append(vendored)
    return tuple(found)


CLICK_ERRORS = _click_errors()


def usage_error(exc: Exception) -> int:
    """Report a usage error in one line, with the command's usage as a hint; its exit code.
    A command given no arguments that needs some prints its help instead."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        console.print(ctx.get_help(), markup=False)
        return 2
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    errors.print(f"loopwright: error: {flat(message)}", markup=False)
    if ctx is not None:
        usage = ctx.get_usage().removeprefix("Usage: ")
        errors.print(f"usage: {usage}  (more: {ctx.command_path} --help)", markup=False)
    return int(getattr(exc, "exit_code", 2))
