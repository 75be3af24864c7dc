"""How a command that advanced a run ends: where the run stands (text or a JSON document),
and the exit code that says so (`loopwright.reports.EXIT_CODES`)."""

from __future__ import annotations

import typer

from loopwright.cli.output import console, print_json
from loopwright.display import flat, inline
from loopwright.outcome import RunOutcome, ending_of
from loopwright.reports import exit_code, run_document
from loopwright.runner import Runner
from loopwright.timeline import Redactor, TimelinePrinter, ending_lines


def report(
    outcome: RunOutcome, redactor: Redactor, *, again: str = "", approver: str = "APPROVER"
) -> None:
    """The run's end (`timeline.ending_lines`: the runtime's account, then the model's answer),
    with sensitive arguments redacted as in the timeline; for a run that waits for a person,
    what to decide. `again` is what a command printed for a person to type needs besides its
    arguments (--agent, --db)."""
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
    if as_json:
        print_json(run_document(runner, outcome))
    else:
        report(outcome, printer.redactor, again=again, approver=approver)
    raise typer.Exit(exit_code(ending_of(outcome, runner.tools)))
