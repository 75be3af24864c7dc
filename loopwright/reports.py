"""What commands tell scripts: `--json` documents, each naming its schema and version.

| schema | printed by | what it holds |
| --- | --- | --- |
| `loopwright.run/1` | run, resume, cancel, demo, approvals approve/reject/edit | where one run stands: its ending (below), phase, stop reason, verification, what waits, every action |
| `loopwright.run-history/1` | show | `loopwright.run/1`, each action's status history, and who wrote the steps (`writers`; of a run the retention job pruned, each writer with no step number, or null where it was pruned before summaries kept them) |
| `loopwright.runs/1` | runs | the runs listed (every one with an unconfirmed write, then the newest up to --limit): agent and version, phase, stop reason, unconfirmed writes, failures; `more`: how many the limit left out |
| `loopwright.approvals/1` | approvals list | the approvals waiting |
| `loopwright.retention/1` | retention | the runs pruned (or, with --dry-run, that would be), those kept and why, checkpoint bytes before and after |

A document's fields are only ever added to within a version; a change of meaning is a new
version. Sensitive arguments (the contracts' `sensitive`) are "[redacted]", and a
sensitive value is blanked wherever else it turns up (a task, an answer), as in the timeline.

`loopwright.run/1` (and so `run-history/1`) holds `ending`, the runtime's own account
(`outcome.Ending`): `kind` (below), `statement`, `effects` (each `verified` or not),
`refusals` (each `by` a rule, a check, an approver or the business system, with `code` and
`reason`), `unconfirmed`, then `model_answer` (the model's words, never the runtime's) and
`answer_notes`. `exit_code` is what a command that advanced the run to where it stands exits
with, by the ending's kind (`EXIT_CODES`):

| exit | kind | the run |
| --- | --- | --- |
| 0 | `completed` | completed, its effects verified in the business system |
| 2 | | (bad input or usage: nothing was done) |
| 3 | `waiting` | waits for a person (an approval) |
| 4 | `incomplete` | ended with a typed stop reason other than completed |
| 5 | `unfinished` | parked until a reconciliation is due, or still advancing |
| 6 | `completed_no_effect` | completed without changing anything in the business system: the task owed no effect |
| 7 | `completed_with_refusal` | completed, and a write it asked for was refused (rule, check, approver, business system) or not done: the task is done without it |
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from loopwright.core.state import Action
from loopwright.observability.redaction import redact
from loopwright.outcome import Ending, EndingKind, RunOutcome, ending_of
from loopwright.timeline import Redactor, handovers, kept_writers

if TYPE_CHECKING:
    from datetime import datetime

    from loopwright.checkpoints.journal import ActionEvent
    from loopwright.checkpoints.retention import RetentionReport
    from loopwright.run_list import RunList
    from loopwright.runner import Runner, Step
    from loopwright.tools.registry import ToolRegistry

# How a command that advanced or read one run exits, by how the run ended (the table above).
EXIT_CODES = {
    EndingKind.COMPLETED.value: 0,
    "usage": 2,
    EndingKind.WAITING.value: 3,
    EndingKind.INCOMPLETE.value: 4,
    EndingKind.UNFINISHED.value: 5,
    EndingKind.COMPLETED_NO_EFFECT.value: 6,
    EndingKind.COMPLETED_WITH_REFUSAL.value: 7,
}


def exit_code(ending: Ending) -> int:
    """The exit code that says how the run ended."""
    return EXIT_CODES[ending.kind.value]


def _redactor(tools: ToolRegistry, actions: list[Action]) -> Redactor:
    """A redactor that knows every sensitive value in `actions` (arguments and outcomes)."""
    redactor = Redactor(tools)
    for action in actions:
        redactor.learn(action.tool, action.args)
        redactor.learn(action.tool, action.outcome or {})
    return redactor


def _request(request: dict[str, Any], redactor: Redactor) -> dict[str, Any]:
    """An approval request with its arguments redacted as its tool's contract says."""
    sensitive = redactor.sensitive(request["tool"])
    return {**request, "args": redact(request.get("args") or {}, sensitive)}


def _action(action: Action, runner: Runner) -> dict[str, Any]:
    sensitive = Redactor(runner.tools).sensitive(action.tool)
    return {
        "action_id": action.action_id,
        "tool": action.tool,
        "args": redact(action.args, sensitive),
        "intent_key": action.intent_key,
        "status": action.status.value,
        "attempts": action.attempts,
        "outcome": redact(action.outcome, sensitive) if action.outcome else None,
    }


def run_document(runner: Runner, outcome: RunOutcome) -> dict[str, Any]:
    return _redactor(runner.tools, outcome.actions).scrub(_run_fields(runner, outcome))


def _run_fields(runner: Runner, outcome: RunOutcome) -> dict[str, Any]:
    record = runner.leases.get(outcome.run_id)
    ending = ending_of(outcome, runner.tools)
    return {
        "schema": "loopwright.run/1",
        "run_id": outcome.run_id,
        "agent": record.agent if record else "",
        "agent_version": record.agent_version if record else "",
        "phase": outcome.phase,
        "stop_reason": outcome.stop_reason,
        "stop_detail": outcome.stop_detail,
        "exit_code": exit_code(ending),
        "ending": ending.document(),
        "verification": outcome.verification,
        "waiting_for_approval": [
            _request(r, Redactor(runner.tools)) for r in outcome.waiting_for_approval
        ],
        "next_attempt_at": outcome.next_attempt_at.isoformat() if outcome.next_attempt_at else None,
        "actions": [_action(a, runner) for a in outcome.actions],
        "compensations": outcome.compensations,
    }


def _event(event: ActionEvent) -> dict[str, Any]:
    return {
        "from": event.from_status,
        "to": event.to_status,
        "fence": event.fence,
        "at": event.at.isoformat(),
        "detail": event.detail,
        "attempt": event.attempt,
        "found": event.found,
        "why": event.why,
    }


def run_history_document(runner: Runner, outcome: RunOutcome) -> dict[str, Any]:
    document = _run_fields(runner, outcome)
    document["schema"] = "loopwright.run-history/1"
    if (pruned := outcome.pruned) is not None:  # its steps went with its checkpoints
        record = runner.leases.get(outcome.run_id)
        document["task"] = record.task if record else ""
        document["user"] = record.user_id if record else None
        document["steps"] = []
        document["pruned"] = {
            "pruned_at": _iso(pruned.pruned_at),
            "steps": pruned.steps,
            "checkpoints": pruned.checkpoints,
            "bytes": pruned.bytes,
            "answer": pruned.answer,
        }
        # Its steps are gone: each writer from where it took the run, with no step number.
        document["writers"] = (
            None
            if pruned.writers is None
            else [
                {"step": None, "how": how.value, **dataclasses.asdict(writer)}
                for how, writer, _ in kept_writers(pruned.writers)
            ]
        )
    else:
        state = runner.state(outcome.run_id)
        document["task"] = state["task"]
        document["user"] = (state.get("principal") or {}).get("user_id")
        steps = runner.written_steps(outcome.run_id)
        document["steps"] = [step.node for step in steps]
        document["writers"] = _writers(steps)
    events = runner.history(outcome.run_id)
    for action in document["actions"]:
        action["history"] = [_event(e) for e in events[action["action_id"]]]
    return _redactor(runner.tools, outcome.actions).scrub(document)


def _writers(steps: list[Step]) -> list[dict[str, Any]]:
    """Who wrote the steps, as `show` heads them: each writer from its first step on (`step`,
    1 for the first), how it took the run (`timeline.Handover`), and what its checkpoints
    name it by."""
    written = ((step.writer, step.answered) for step in steps)
    return [
        {"step": index + 1, "how": how.value, **dataclasses.asdict(writer)}
        for index, how, writer, _ in handovers(written)
    ]


def runs_document(listed: RunList, tools: ToolRegistry) -> dict[str, Any]:
    lines = listed.lines
    redactor = _redactor(tools, [a for line in lines for a in line.actions])
    return redactor.scrub(
        {
            "schema": "loopwright.runs/1",
            "more": listed.more,
            "runs": [
                {
                    "run_id": line.record.run_id,
                    "agent": line.record.agent,
                    "agent_version": line.record.agent_version,
                    "phase": line.phase,
                    "stop_reason": line.stop_reason or None,
                    "task": line.task,
                    "user": line.record.user_id,
                    "created_at": line.record.created_at.isoformat(),
                    "leased_by": line.record.owner if line.record.lease_live else None,
                    "unconfirmed": [a.action_id for a in line.unconfirmed],
                    "failures": line.record.failures,
                    "last_error": line.record.last_error,
                }
                for line in lines
            ],
        }
    )


def approvals_document(pending: list[dict[str, Any]], tools: ToolRegistry) -> dict[str, Any]:
    """The approvals waiting; a request's arguments are redacted as its tool's contract says."""
    redactor = Redactor(tools)
    for request in pending:
        redactor.learn(request["tool"], request.get("args") or {})
    shown = [_request(r, redactor) for r in pending]
    return redactor.scrub({"schema": "loopwright.approvals/1", "approvals": shown})


def _iso(moment: datetime | str | None) -> str | None:
    return moment if moment is None or isinstance(moment, str) else moment.isoformat()


def retention_document(report: RetentionReport) -> dict[str, Any]:
    """What the retention job pruned (no values of a run's own: ids, stop reasons, sizes)."""
    return {
        "schema": "loopwright.retention/1",
        "older_than_days": report.older_than_days,
        "cutoff": _iso(report.cutoff),
        "dry_run": report.dry_run,
        "pruned": [
            {
                "run_id": run.run_id,
                "ended_at": _iso(run.ended_at),
                "stop_reason": run.summary.stop_reason if run.summary else None,
                "checkpoints": run.checkpoints,
                "bytes": run.bytes,
            }
            for run in report.pruned
        ],
        "kept": [{"run_id": run.run_id, "reason": run.kept} for run in report.kept],
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
    }
