"""The commands of a run's life: demo, run, resume, cancel, show, runs, retention.

Each parses its options, calls the runtime (`loopwright.cli.hosting` opens it: imported in the
command's body, so that help needs none of it) and prints.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from loopwright.cli.errors import UsageError
from loopwright.cli.options import (
    AgentOption,
    DbOption,
    JsonOption,
    ModelOption,
    RunIdArgument,
    TenantOption,
)
from loopwright.cli.output import console, print_json
from loopwright.display import flat

if TYPE_CHECKING:
    from loopwright.outcome import RunOutcome
    from loopwright.runner import Runner
    from loopwright.timeline import TimelinePrinter

# `loopwright runs` without --limit: a screenful and more, never a whole database of runs.
DEFAULT_RUNS_LISTED = 100
MAX_RUNS_LISTED = 1_000_000
# Bounds of the numeric options: a value past them is a usage error (one line, exit 2), not a
# traceback from where it would first overflow (a timer, a date, a socket).
MAX_RETENTION_DAYS = 36_500.0

app = typer.Typer()


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
        outcome = runner.decide(
            outcome.run_id,
            decision,
            approver,
            comment=why,
            on_step=printer,
            approval_id=request["approval_id"],
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
    from loopwright.cli import hosting
    from loopwright.cli.ending import conclude
    from loopwright.runner import new_run_id

    hosted = hosting.agent_for(agent)
    script = hosted.demo
    if script is None:
        raise UsageError(f"agent {hosted.name} declares no demo (Agent(demo=Demo(...)))")
    with hosting.session(hosted, db, deps=script.deps) as runner:
        principal = hosting.principal_for(runner, script.user, script.task)
        printer = hosting.step_printer(runner, as_json)
        printer.console.rule(f"[bold]loopwright demo: {hosted.name}")
        printer.console.print(f"task: {script.task}\nuser: {script.user}\n", markup=False)
        run_id, again = new_run_id(), hosting.repeat_options(agent, db)
        with hosting.advancing(run_id, again):
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
    from loopwright.cli import hosting
    from loopwright.cli.ending import conclude
    from loopwright.core.text import checked_run_id
    from loopwright.runner import checked_start, new_run_id

    run_id = new_run_id() if run_id is None else checked_run_id(run_id)
    hosting.checked_person(user, "--user")
    tenant_name = hosting.tenant_of(tenant)
    checked_start(user, task, tenant_name)  # refused before a database or service is opened
    with hosting.session(hosting.agent_for(agent), db, model) as runner:
        principal = hosting.principal_for(runner, user, task, tenant_name)
        printer = hosting.step_printer(runner, as_json)
        printer.console.print(f"run {run_id}", markup=False)
        again = hosting.repeat_options(agent, db)
        with hosting.advancing(run_id, again):
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
    from loopwright.cli import hosting
    from loopwright.cli.ending import conclude

    hosted = hosting.agent_for(agent)
    hosting.require_run(hosted, db, run_id)
    with hosting.session(hosted, db, model, model_change=model_change) as runner:
        printer = hosting.step_printer(runner, as_json, run_id)
        again = hosting.repeat_options(agent, db)
        with hosting.advancing(run_id, again):
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
    from loopwright.cli import hosting
    from loopwright.cli.ending import conclude

    hosted = hosting.agent_for(agent)
    hosting.require_run(hosted, db, run_id)
    with hosting.session(hosted, db) as runner:
        printer = hosting.step_printer(runner, as_json, run_id)
        with hosting.advancing(run_id, hosting.repeat_options(agent, db)):
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
    from loopwright.cli import hosting
    from loopwright.reports import run_history_document
    from loopwright.runner import UnknownRun
    from loopwright.timeline import render_run

    with hosting.records(hosting.agent_for(agent), db) as runner:
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
    from loopwright.cli import hosting
    from loopwright.reports import runs_document
    from loopwright.run_list import RunList, render_runs, run_lines

    named = hosting.configured_agent_path(agent)
    hosted = hosting.agent_for(named)
    with hosting.records(hosted, db) as runner:
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
    from loopwright.checkpoints.retention import retain
    from loopwright.cli.hosting import existing_database
    from loopwright.reports import retention_document

    url = existing_database(db)
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
