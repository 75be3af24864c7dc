"""How a command that advanced a run ends: where the run stands (text or a JSON document),
and the exit code that says so (`loopwright.reports.EXIT_CODES`)."""

from __future__ import annotations

from collections.abc import Callable

import typer

from loopwright.cli.output import console, print_json
from loopwright.display import flat, inline
from loopwright.graph.state import UNRESOLVED_STATUSES, ActionStatus
from loopwright.outcome import RunOutcome
from loopwright.reports import exit_code, run_document
from loopwright.runner import Runner
from loopwright.timeline import Redactor, TimelinePrinter


def report(
    outcome: RunOutcome, redactor: Redactor, *, again: str = "", approver: str = "APPROVER"
) -> None:
    """The run's end (`ENDINGS`, the first that applies); for a run that did not complete, what
    it did and did not do in the business system (`ACTION_LINES`), with sensitive arguments
    redacted as in the timeline. `again` is what a command printed for a person to type needs
    besides its arguments (--agent, --db)."""
    console.print()
    tell = next(tell for applies, tell in ENDINGS if applies(outcome))
    tell(outcome, redactor, again, approver)
    if outcome.stop_reason != "completed":
        # An honest account of what happened in the business system, whatever the run's end.
        for action in outcome.actions:
            line = ACTION_LINES.get(action.status, NOT_DONE)
            call = redactor.call(action.tool, action.args)
            done = redactor.outcome(action.tool, action.outcome or {})
            console.print(
                redactor.text(
                    line.format(
                        call=call, done=done, id=inline(action.action_id), status=action.status
                    )
                )
            )
    for offer in outcome.compensations:
        console.print(f"  compensation you may want (not performed): {flat(offer)}", markup=False)


def _completed(outcome: RunOutcome, redactor: Redactor, again: str, approver: str) -> None:
    """Each write verified in the business system, and the answer."""
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


def _waiting(outcome: RunOutcome, redactor: Redactor, again: str, approver: str) -> None:
    """What waits, and the commands that decide it (never suggesting an editor to approve
    their own edit; --yes where the write asks to be confirmed)."""
    request = outcome.waiting_for_approval[0]
    console.print(
        f"[bold yellow]WAITING_APPROVAL[/] run {inline(outcome.run_id)}: {inline(request['summary'])}"
    )
    editors = list(request.get("edited_by") or [])
    confirm = " --yes" if request.get("confirm") else ""
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


def _stopped(outcome: RunOutcome, redactor: Redactor, again: str, approver: str) -> None:
    """Any other end: the phase, the stop reason (or that it has not finished) and why."""
    console.print(
        f"[bold red]{outcome.phase}[/] run {inline(outcome.run_id)}:"
        f" {outcome.stop_reason or 'not finished'} {inline(outcome.stop_detail)}"
    )


# How a run's end is told: the first entry whose test the outcome meets.
ENDINGS: tuple[
    tuple[Callable[[RunOutcome], bool], Callable[[RunOutcome, Redactor, str, str], None]], ...
] = (
    (lambda outcome: outcome.stop_reason == "completed", _completed),
    (lambda outcome: bool(outcome.waiting_for_approval), _waiting),
    (lambda outcome: True, _stopped),
)
# What an action of a run that did not complete did in the business system, by its status:
# done, not confirmed either way (sent, its outcome not known; or escalated to a person), or
# not done (NOT_DONE, every other status).
NOT_DONE = "  not done: {call} ({status})"
ACTION_LINES: dict[ActionStatus, str] = {
    ActionStatus.SUCCEEDED: "  done: {call} -> {done}",
    **{
        status: "  [bold red]unconfirmed write[/] {id} {call}: {status}"
        for status in (*UNRESOLVED_STATUSES, ActionStatus.ESCALATED)
    },
}


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
