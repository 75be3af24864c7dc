"""The timeline of a run, for people.

`TimelinePrinter` prints a line per committed node step as a run advances: what was decided,
checked, approved, done and found. `render_run` (`loopwright show`) reads a whole run back from
the database alone, finished or interrupted: where the run stands and the budget it used, its
committed steps, each group of them headed by the process (and instance) that wrote them, as
their checkpoints name it, a takeover marked as such, then each action once with its full
status history from the journal (times and fences).

Arguments are always shown with the fields a tool contract marks sensitive replaced by
"[redacted]" (raw trace capture does not change that: a timeline gets pasted into tickets), and
a sensitive value seen in a run's arguments is blanked wherever else it turns up (a task, an
answer, a summary, an outcome).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, ToolMessage
from rich.console import Console

from loopwright.checkpoints.journal import ActionEvent
from loopwright.checkpoints.writers import ANSWER
from loopwright.core.budget import Budget, Usage
from loopwright.core.protocol import parse_tool_content
from loopwright.core.state import (
    UNRESOLVED_STATUSES,
    Action,
    ActionStatus,
    ApprovalRecord,
    EvidenceNote,
    PendingCall,
    Verification,
)
from loopwright.display import flat, inline
from loopwright.nodes.verify import refusal_words
from loopwright.observability.redaction import REDACTED, redact, redacted_digest
from loopwright.outcome import Ending, EndingKind, RunOutcome, ending_of
from loopwright.tools.program import ProgramRun
from loopwright.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from loopwright.checkpoints.writers import Writer
    from loopwright.runner import Runner

# Shorter sensitive values are not blanked in free text: they would blank ordinary words.
MIN_SECRET_CHARS = 4
DIGEST_CHARS = 12
# Writes whose outcome nobody has confirmed: in flight, unknown, or left to a person.
UNCONFIRMED = UNRESOLVED_STATUSES | {ActionStatus.ESCALATED}


class Redactor:
    """Hides sensitive argument values: structurally in arguments, by value in free text."""

    def __init__(self, tools: ToolRegistry) -> None:
        self.tools = tools
        self.secrets: set[str] = set()

    def sensitive(self, tool: str) -> frozenset[str]:
        contract = self.tools.get(tool)
        return frozenset(contract.sensitive) if contract is not None else frozenset()

    def learn(self, tool: str, value: Any) -> None:
        """Remember the sensitive values in `value` (arguments or an outcome) of a `tool` call."""
        sensitive = self.sensitive(tool)
        if isinstance(value, Mapping):
            for key, item in value.items():
                if key in sensitive:
                    self.secrets.update(s for s in _leaves(item) if len(s) >= MIN_SECRET_CHARS)
                else:
                    self.learn(tool, item)
        elif isinstance(value, list):
            for item in value:
                self.learn(tool, item)

    def call(self, tool: str, args: Mapping[str, Any]) -> str:
        """`tool(k=v, ...)` with sensitive values redacted, and the digest traces carry."""
        self.learn(tool, args)
        sensitive = self.sensitive(tool)
        shown = ", ".join(f"{k}={v}" for k, v in redact(dict(args), sensitive).items())
        return f"[cyan]{inline(tool)}[/]({inline(shown)}) #{redacted_digest(args, sensitive)[:DIGEST_CHARS]}"

    def outcome(self, tool: str, outcome: Mapping[str, Any]) -> str:
        self.learn(tool, outcome)
        return inline(
            ", ".join(f"{k}={v}" for k, v in redact(outcome, self.sensitive(tool)).items())
        )

    def text(self, line: str, *, markup: bool = True) -> str:
        """A line (of rich markup, unless not `markup`) with every known sensitive value blanked."""
        # Longest first: a longer secret may contain a shorter one. A secret is blanked as it
        # was given and as a line shows it (`inline`, `flat`: its brackets escaped, its control
        # characters spelled out).
        for secret in sorted(self.secrets, key=len, reverse=True):
            shown = inline(secret) if markup else flat(secret)
            for form in dict.fromkeys((shown, secret)):
                line = line.replace(form, inline(REDACTED) if markup else REDACTED)
        return line

    def scrub(self, value: Any) -> Any:
        """`value` (JSON-like: dicts, lists, strings) with every known sensitive value blanked
        in each string, at any depth."""
        if isinstance(value, str):
            return self.text(value, markup=False)
        if isinstance(value, Mapping):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value


PAST_TENSE = {"approve": "approved", "reject": "rejected", "edit": "edited"}


def _leaves(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [str(value)]


def _time(moment: datetime | str) -> str:
    parsed = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return parsed.isoformat(timespec="milliseconds")


def _learn_step(update: dict[str, Any], redactor: Redactor) -> None:
    """Learn the sensitive values a step carries before any of its lines is printed."""
    for item in update.get("history") or []:
        if isinstance(item, AIMessage):
            for call in item.tool_calls:
                redactor.learn(call["name"], call["args"])
    for pending in update.get("pending") or []:
        redactor.learn(pending["tool"], pending["args"])
    for action in (update.get("journal") or {}).values():
        redactor.learn(action["tool"], action["args"])
        redactor.learn(action["tool"], action.get("outcome") or {})


# A step's lines: one describer per part of a node's update, each in turn as printed.
Describer = Callable[[str, dict[str, Any], Redactor], list[str]]


def _stop_line(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    if not update.get("stop_reason") or node == "verify":  # verify's ending is its own line
        return []
    detail = inline(update.get("stop_detail", ""))
    return [f"[bold red]stop[/]: {update['stop_reason']} ({detail})"]


def _decision_lines(message: AIMessage, redactor: Redactor) -> list[str]:
    lines = [f"decides {redactor.call(c['name'], c['args'])}" for c in message.tool_calls]
    lines += [
        f"decides [red]unparsable[/] call {inline(invalid.get('name'))}"
        for invalid in message.invalid_tool_calls
    ]
    return lines or [f"the model answers: [italic]{inline(message.text)}[/]"]


def _result_line(message: ToolMessage) -> str:
    envelope = parse_tool_content(str(message.content))
    if envelope.status == "ok":
        return f"{inline(message.name)} [green]ok[/]"
    error = envelope.error or {}
    return (
        f"{inline(message.name)} [red]{envelope.status}[/]: {inline(error.get('code'))}"
        f" {inline(error.get('detail', ''))}"
    )


def _history_lines(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    lines: list[str] = []
    for item in update.get("history") or []:
        if isinstance(item, AIMessage):
            lines += _decision_lines(item, redactor)
        elif isinstance(item, ToolMessage):
            lines.append(_result_line(item))
    return lines


def _pending_line(pending: PendingCall) -> list[str]:
    if pending.verdict == "ready":
        return [f"allows [cyan]{inline(pending.tool)}[/] for {inline(pending.call_id)}"]
    request = pending.approval
    if pending.verdict != "needs_approval" or request is None:
        return []
    return [
        f"[yellow]needs approval[/] {inline(request.approval_id)}: {inline(request.summary)}"
        f" (digest {request.digest[:DIGEST_CHARS]}, expires {_time(request.expires_at)})"
        + (f"; why: {inline(request.why)}" if request.why else "")
        + (f", a call of program {inline(pending.program)}" if pending.program else "")
    ]


def _program_line(raw: dict[str, Any], redactor: Redactor) -> str:
    """Where a program action stands after validate: the calls it made with their outcomes,
    and the one it waits on, or its end."""
    program = ProgramRun.model_validate(raw)
    made = [c for c in program.calls if c.outcome != "waiting"]
    so_far = ", ".join(f"{inline(c.tool)} {inline(c.code or c.outcome)}" for c in made)
    line = f"program {inline(program.call_id)}"
    if program.skill:
        line += f" (skill {inline(program.skill)})"
    if program.waiting is not None:
        call = program.waiting
        line += f" waits on call {len(program.calls)}: {redactor.call(call.tool, call.args)}"
    else:
        line += f" [bold]ended[/] after {len(made)} calls"
    return line + (f"; calls so far: {so_far}" if so_far else "")


def _validate_lines(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    if node != "validate":
        return []
    pending = (PendingCall.model_validate(p) for p in update.get("pending") or [])
    lines = [line for call in pending for line in _pending_line(call)]
    if update.get("program"):
        lines.append(_program_line(update["program"], redactor))
    return lines


def _evidence_lines(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    lines = []
    for raw in update.get("evidence") or []:
        evidence = EvidenceNote.model_validate(raw)
        about = [*evidence.resources]
        if evidence.version is not None:
            about.append(f"version {evidence.version}")
        lines.append(
            f"evidence {inline(evidence.evidence_id)} from {inline(evidence.source)}"
            + (f" ({inline(', '.join(about))})" if about else "")
        )
    return lines


def _cancel_line(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    if not update.get("cancel_requested"):
        return []
    return ["[yellow]cancel requested[/]: no new step or action starts"]


def _handoff_line(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    if node != "handoff" or not update.get("handoffs"):
        return []
    record = update["handoffs"][-1]  # the one just made
    return [
        f"passes the run from {inline(record.get('from'))} to [bold]{inline(record.get('to'))}[/]"
        f": {inline(record.get('reason', ''))}"
    ]


def _decided_line(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    if node != "approval" or not update.get("approvals"):
        return []
    record = ApprovalRecord.model_validate(update["approvals"][-1])  # the one just decided
    return [
        f"{PAST_TENSE.get(record.decision, record.decision)} by {inline(record.approver)}"
        f" at {_time(record.decided_at)} (digest {record.digest[:DIGEST_CHARS]})"
    ]


def _journal_lines(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    actions = (Action.model_validate(raw) for raw in (update.get("journal") or {}).values())
    return [
        f"action {inline(a.action_id)} {inline(a.tool)} [bold]{a.status}[/] (attempts {a.attempts})"
        for a in actions
    ]


def _verification_line(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    if not update.get("verification"):
        return []
    v = Verification.model_validate(update["verification"])
    mark = "[green]verified[/]" if v.verified else "[red]not verified[/]"
    # A problem the summary already says (a write not done) is said once.
    problems = [p for p in v.problems if p not in v.summary]
    return [f"{mark}: {inline(v.summary)}" + "".join(f"; {inline(p)}" for p in problems)]


DESCRIBERS: tuple[Describer, ...] = (
    _stop_line,
    _history_lines,
    _validate_lines,
    _evidence_lines,
    _cancel_line,
    _handoff_line,
    _decided_line,
    _journal_lines,
    _verification_line,
)


def describe_step(node: str, update: dict[str, Any], redactor: Redactor) -> list[str]:
    """Plain-text lines (rich markup) for one node's committed update."""
    _learn_step(update, redactor)
    lines = [line for describe in DESCRIBERS for line in describe(node, update, redactor)]
    return [redactor.text(line) for line in lines]


class TimelinePrinter:
    """A StepListener that prints the timeline as the run advances.

    `tools` (the run's agent's) names the sensitive fields to redact.
    """

    def __init__(self, console: Console, tools: ToolRegistry) -> None:
        self.console = console
        self.redactor = Redactor(tools)
        self.step = 0

    def __call__(self, node: str, update: dict[str, Any]) -> None:
        self.step += 1
        lines = describe_step(node, update, self.redactor)
        lines = lines or [f"phase {update.get('phase', '')}".strip()]
        self.console.print(f"[dim]{self.step:3d}[/] [bold]{node:<15}[/] {lines[0]}")
        for line in lines[1:]:
            self.console.print(f"{'':19} {line}")


def _event_line(event: ActionEvent) -> str:
    moved = f"{event.from_status or 'new'} -> {event.to_status}"
    detail = event.detail or {}
    why = "; ".join(
        f"{k} {detail[k]}" for k in ("reason", "reconciled", "stage", "approver") if k in detail
    )
    return f"{_time(event.at)}  {moved:<28} fence {event.fence}" + (
        f"  {inline(why)}" if why else ""
    )


def _describe_action(action: Action, events: list[ActionEvent], redactor: Redactor) -> list[str]:
    if action.status is ActionStatus.SUCCEEDED:
        style = "green"
    elif action.status in UNCONFIRMED:
        style = "bold red"
    else:
        style = "yellow"
    lines = [
        f"[bold]{inline(action.action_id)}[/] {redactor.call(action.tool, action.args)}",
        f"    intent {inline(action.intent_key)}, attempts {action.attempts},"
        f" now [{style}]{action.status}[/]",
    ]
    lines += [f"    {_event_line(event)}" for event in events]
    if action.outcome:
        lines.append(f"    outcome: {redactor.outcome(action.tool, action.outcome)}")
    return lines


def _budget_line(usage: Usage, budget: Budget) -> str:
    return (
        f"steps {usage.steps}/{budget.max_steps}, model requests {usage.model_requests},"
        f" tokens in {usage.input_tokens}/{budget.max_input_tokens}"
        f" out {usage.output_tokens}/{budget.max_output_tokens},"
        f" cost ${usage.cost_usd:.4f}/${budget.max_cost_usd:.2f},"
        f" tool calls {usage.tool_calls}, tool attempts {usage.tool_attempts}/{budget.max_tool_attempts},"
        f" result bytes {usage.tool_result_bytes}/{budget.max_tool_result_bytes}"
    )


# What each completed ending is, in the line that heads it.
COMPLETED_AS = {
    EndingKind.COMPLETED: "its effects are verified in the business system",
    EndingKind.COMPLETED_NO_EFFECT: "no business effect, and the task owed none",
    EndingKind.COMPLETED_WITH_REFUSAL: "done without what was refused",
}
MODEL_ANSWER = "the model's answer (its own words; loopwright vouches only for the lines above)"
NO_EFFECT_LINE = "  no business effect: this run changed nothing in the business system"
# A write in one of these may have changed the business system (done, or not known).
MAY_HAVE_EFFECT = UNRESOLVED_STATUSES | {ActionStatus.SUCCEEDED, ActionStatus.ESCALATED}
NOT_SENT_YET = frozenset({ActionStatus.PLANNED, ActionStatus.NEEDS_APPROVAL, ActionStatus.APPROVED})


def ending_lines(outcome: RunOutcome, redactor: Redactor, *, run: str = "") -> list[str]:
    """How a run ended, as a command prints it (rich markup, sensitive values blanked): a line
    saying how it ended (none for a run that waits for a person: the command says what to
    decide), what happened in the business system and every refusal, and last the model's
    answer, labelled as the model's. `run` names the run in the first line (a command's
    report does; `show` has said which run it is)."""
    ending = ending_of(outcome, redactor.tools)
    lines = [] if ending.kind is EndingKind.WAITING else [_headline(outcome, ending, run)]
    if ending.kind in COMPLETED_AS:
        lines += _effect_lines(ending)
    else:
        lines += _call_lines(outcome, ending, redactor)
    if ending.model_answer:
        lines.append(f"  {MODEL_ANSWER}: {inline(ending.model_answer)}")
        lines += [f"    note: {inline(note)}" for note in ending.answer_notes]
    lines += [
        f"  compensation you may want (not performed): {inline(offer)}"
        for offer in outcome.compensations
    ]
    return [redactor.text(line) for line in lines]


def _headline(outcome: RunOutcome, ending: Ending, run: str) -> str:
    """`COMPLETED[ run R]: completed, <what kind>` or `PHASE[ run R]: reason detail`."""
    named = f" run {inline(run)}" if run else ""
    if ending.kind in COMPLETED_AS:
        return f"[bold green]COMPLETED[/]{named}: completed, {COMPLETED_AS[ending.kind]}"
    ended = outcome.stop_reason or "not finished"
    return f"[bold red]{outcome.phase}[/]{named}: {ended} {inline(outcome.stop_detail)}".rstrip()


def _effect_lines(ending: Ending) -> list[str]:
    """A completed run's effects (every one verified) and refusals, in the runtime's words."""
    lines = []
    for effect in ending.effects:
        produced = ", ".join(f"{k} {v}" for k, v in effect["produced"].items())
        said = f"{effect['summary']} ({produced})" if produced else effect["summary"]
        lines.append(f"  verified in the business system: {inline(said)}")
    if not ending.effects:
        lines.append(NO_EFFECT_LINE)
    return lines + [f"  {inline(refusal_words(r))}" for r in ending.refusals]


def _call_lines(outcome: RunOutcome, ending: Ending, redactor: Redactor) -> list[str]:
    """What a run that did not complete did in the business system, call by call from the
    journal (done, not confirmed, not done and why), and the refusals of calls never journaled."""
    verified = {e["action_id"] for e in ending.effects if e["verified"]}
    refused = {r.get("action_id"): r for r in ending.refusals}
    lines = []
    for action in outcome.actions:
        call = redactor.call(action.tool, action.args)
        if action.status is ActionStatus.SUCCEEDED:
            done = redactor.outcome(action.tool, action.outcome or {})
            check = " (verified)" if action.action_id in verified else " (not verified)"
            lines.append(f"  done: {call} -> {done}{check}")
        elif action.status in UNRESOLVED_STATUSES or action.status is ActionStatus.ESCALATED:
            lines.append(
                f"  [bold red]unconfirmed write[/] {inline(action.action_id)} {call}: {action.status}"
            )
        elif action.status in NOT_SENT_YET:
            lines.append(f"  not sent yet: {call} ({action.status})")
        else:
            why = refused.get(action.action_id)
            said = f": {inline(refusal_words(why))}" if why else ""
            lines.append(f"  not done: {call} ({action.status}){said}")
    if not any(a.status in MAY_HAVE_EFFECT for a in outcome.actions):
        lines.insert(0, NO_EFFECT_LINE)
    return lines + [
        f"  {inline(refusal_words(r))}" for r in ending.refusals if not r.get("action_id")
    ]


def render_run(runner: Runner, run_id: str, console: Console) -> None:
    """Print a run from the database: where it stands (the runtime's account of its ending
    first, the model's answer last), then its steps and each action's history."""
    outcome = runner.outcome(run_id)
    if outcome.pruned is not None:
        render_pruned_run(runner, outcome, console)
        return
    steps = runner.written_steps(run_id)
    state = runner.state(run_id)
    printer = TimelinePrinter(console, runner.tools)
    redactor = printer.redactor
    for step in steps:  # learn every sensitive value first: the task may repeat one
        _learn_step(step.update, redactor)
    _learn_actions(redactor, outcome.actions)

    def say(line: str) -> None:
        console.print(redactor.text(line))

    console.rule(f"run {inline(run_id)}")
    say(f"task: {inline(state['task'])}")
    say(f"user: {inline((state.get('principal') or {}).get('user_id', '?'))}")
    say("\n[bold]where it stands[/]")
    for line in ending_lines(outcome, redactor):
        say(line)
    for request in outcome.interrupts:
        for line in _interrupt_line(request):
            say(line)
    record = runner.leases.get(run_id)
    if record is not None and record.failures:
        retry = (
            f", next attempt at {_time(record.next_attempt_at)}" if record.next_attempt_at else ""
        )
        say(
            f"[bold red]failing[/]: {record.failures} attempts in a row did not go through{retry}:"
            f" {inline(record.last_error or '')}"
        )
    say(
        f"budget used: {_budget_line(Usage.model_validate(state.get('usage') or {}), runner.budget)}"
    )
    say("\n[bold]steps[/]")
    before: Writer | None = None
    for step in steps:
        if (header := writer_line(before, step.writer, answered=step.answered)) is not None:
            say(header)
        before = step.writer or before
        printer(step.node, step.update)
    if outcome.actions:
        say("\n[bold]actions[/]")
    for action in outcome.actions:
        for line in _describe_action(action, runner.journal.events(action.action_id), redactor):
            say(line)


def who(writer: Writer) -> str:
    """A step's writer as people read it: the instance its deployment named (aegra-2), the
    lease's owner (host:pid:nonce) and fence."""
    fence = f", fence {writer.fence}" if writer.fence is not None else ""
    if writer.instance:
        return f"[bold]{inline(writer.instance)}[/] ({inline(writer.owner)}{fence})"
    return f"[bold]{inline(writer.owner)}[/]{f' ({fence[2:]})' if fence else ''}"


class Handover(StrEnum):
    """How a writer came to write the run, against the writer before it."""

    FIRST = "first"  # the run's first writer
    ANSWERED = "answered"  # went on with the answer the run waited for (approval, parked retry)
    TAKEN_OVER = "taken_over"  # went on where the last writer stopped mid-way
    AGAIN = "again"  # the same owner, under a new fence: it claimed the run again


def handover(before: Writer | None, writer: Writer | None, *, answered: bool) -> Handover | None:
    """How `writer` took the run from `before`, None where it is `before` (or is not named): a
    writer that went on where the last one stopped mid-way took it over (a crash, a lost lease,
    an instance handing its runs back); one that was `answered` (its first step is a node that
    had waited) went on with the answer the run waited for."""
    if writer is None or (before is not None and writer.same_attempt(before)):
        return None
    if before is None:
        return Handover.FIRST
    if answered:
        return Handover.ANSWERED
    return Handover.AGAIN if writer.owner == before.owner else Handover.TAKEN_OVER


def writer_line(before: Writer | None, writer: Writer | None, *, answered: bool) -> str | None:
    """The line that heads the steps of a writer (see `handover`), None within them."""
    how = handover(before, writer, answered=answered)
    if how is None or writer is None:
        return None
    return _writer_line(how, writer, before)


def _writer_line(how: Handover, writer: Writer, before: Writer | None) -> str:
    if how is Handover.FIRST:
        return f"[dim]──[/] by {who(writer)}"
    if how is Handover.ANSWERED:
        return f"[dim]──[/] by {who(writer)}, with the answer the run waited for"
    assert before is not None
    again = "taken up again" if how is Handover.AGAIN else "[bold yellow]taken over[/]"
    return f"[dim]──[/] {again} by {who(writer)}, from {who(before)}"


def handovers(
    written: Iterable[tuple[Writer | None, bool]],
) -> Iterator[tuple[int, Handover, Writer, Writer | None]]:
    """Where the run changed hands along `written` (each step's writer, or each writer kept,
    and whether it was answered): the index, how the writer took the run, the writer, and the
    writer before it."""
    before: Writer | None = None
    for index, (writer, answered) in enumerate(written):
        how = handover(before, writer, answered=answered)
        if how is not None and writer is not None:
            yield index, how, writer, before
        before = writer or before


def kept_writers(writers: Sequence[Writer]) -> list[tuple[Handover, Writer, Writer | None]]:
    """How each writer a pruned run's summary kept took the run, and from whom: the summary
    keeps each writer once, from where it took the run (`checkpoints.writers.handed_over`), and
    a writer given an answer went on with it."""
    answered = ((writer, writer.advance == ANSWER) for writer in writers)
    return [(how, writer, before) for _, how, writer, before in handovers(answered)]


def _interrupt_line(request: dict[str, Any]) -> list[str]:
    if request.get("kind") == "reconcile_wait":
        return [f"parked: reconciliation looks again at {_time(request['retry_at'])}"]
    if request.get("kind") != "approval":
        return []
    return [
        f"waiting for approval {inline(request['approval_id'])}: {inline(request['summary'])}"
        f" (digest {request['digest'][:DIGEST_CHARS]}, expires {_time(request['expires_at'])})"
    ]


def _learn_actions(redactor: Redactor, actions: Iterable[Action]) -> None:
    """Every sensitive value of the journal's actions, arguments and outcomes alike."""
    for action in actions:
        redactor.learn(action.tool, action.args)
        redactor.learn(action.tool, action.outcome or {})


def render_pruned_run(runner: Runner, outcome: RunOutcome, console: Console) -> None:
    """A run the retention job pruned: its steps are gone with its checkpoints; the journal
    (each action's history) and the summary say how it ended."""
    assert outcome.pruned is not None
    summary = outcome.pruned
    record = runner.leases.get(outcome.run_id)
    redactor = Redactor(runner.tools)
    _learn_actions(redactor, outcome.actions)

    def say(line: str) -> None:
        console.print(redactor.text(line))

    console.rule(f"run {inline(outcome.run_id)}")
    if record is not None:
        say(f"task: {inline(record.task)}")
        say(f"user: {inline(record.user_id)}")
    say(
        f"pruned by the retention job at {_time(summary.pruned_at) if summary.pruned_at else '?'}:"
        f" its {summary.steps}"
        f" steps went with its {summary.checkpoints} checkpoints ({summary.bytes} bytes); the"
        " journal and this summary remain"
    )
    say("\n[bold]where it stands[/]")
    for line in ending_lines(outcome, redactor):
        say(line)
    say(f"budget used: {_budget_line(Usage.model_validate(summary.usage), runner.budget)}")
    say("\n[bold]written by[/]")
    if summary.writers is None:
        say("[dim]not kept: the run was pruned before summaries kept its writers[/]")
    for how, writer, before in kept_writers(summary.writers or ()):
        say(_writer_line(how, writer, before))
    if outcome.actions:
        say("\n[bold]actions[/]")
    for action in outcome.actions:
        for line in _describe_action(action, runner.journal.events(action.action_id), redactor):
            say(line)
