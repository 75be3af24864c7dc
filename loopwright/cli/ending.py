"""How a command that advanced a run ends: where the run stands (text or a JSON document),
and the exit code that says so (`loopwright.reports.EXIT_CODES`)."""

from __future__ import annotations

import typer

from loopwright.cli.output import console, print_json
from loopwright.display import flat, inline
from loopwright.graph.state import UNRESOLVED_STATUSES
from loopwright.outcome import RunOutcome
from loopwright.reports import exit_code, run_document
from loopwright.runner import Runner
from loopwright.timeline import Redactor, TimelinePrinter


def report(
    outcome: RunOutcome, redactor: Redactor, *, again: str = "", approver: str = "APPROVER"
) -> None:
    """The run's end; for a run that did not complete, what it did and did not do in the
    business system, with sensitive arguments redacted as in the timeline. `again` is what a
    command printed for a person to type needs besides its arguments (--agent, --db)."""
    console.print()
    if outcome.stop_reason == "completed":
        facts = (outcome.verification or {}).get("facts", {})
        console.print(
            f"[bold green]COMPLETED[/] run {inline(outcome.run_id)}, verified in the business system:"
        )
        for write in facts.get("writes", []):
            produced = ", ".join(f"{k} {v}" for k, v in (write.get("produced") or {}).items())
            line = f"  {write.get('summary', write.get('tool'))}" + (
                f" ({produced})" if produced else ""
            )
            console.print(redactor.text(inline(line)))
        if not facts.get("writes"):
            console.print("  no business effect was needed")
        console.print(
            redactor.text(f"  answer: {flat(facts.get('answer', ''))}", markup=False), markup=False
        )
    elif outcome.waiting_for_approval:
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
    else:
        console.print(
            f"[bold red]{outcome.phase}[/] run {inline(outcome.run_id)}: {outcome.stop_reason or 'not finished'} {inline(outcome.stop_detail)}"
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
                        f"  [bold red]unconfirmed write[/] {inline(action.action_id)} {call}: {action.status}"
                    )
                )
            else:
                console.print(redactor.text(f"  not done: {call} ({action.status})"))
    for offer in outcome.compensations:
        console.print(f"  compensation you may want (not performed): {flat(offer)}", markup=False)


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
    raise typer.Exit(exit_code(outcome))
