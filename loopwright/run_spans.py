"""What a run's span says as a process lets go of it (`note_run`), and every journal status
change, whoever makes it (the executor, reconcile, validate, guard), as a `journal.transition`
event on the span current at that moment (`TracedJournal`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from loopwright.checkpoints.journal import ActionJournal, JournalWrapper
from loopwright.core.state import UNRESOLVED_STATUSES, Action, ActionStatus, RunState
from loopwright.observability.attributes import Attributes, usage_attributes
from loopwright.observability.tracing import active_tracer
from loopwright.outcome import RunOutcome

# Actions a person may have to look at: outcome not confirmed, or escalated.
_UNSETTLED = UNRESOLVED_STATUSES | {ActionStatus.ESCALATED}
# Journal event details that say why a status moved; the others (a pre-image) are business data.
_DETAIL_KEYS = ("reason", "reconciled", "stage", "approval_id", "approver", "version")


def note_run(opened: Span, outcome: RunOutcome, state: RunState) -> None:
    """Where the run stands as this process lets go of it."""
    if not opened.is_recording():
        return
    versions = state.get("versions") or {}
    unresolved = [a for a in outcome.actions if a.status in _UNSETTLED]
    opened.set_attributes(
        {
            "loopwright.phase": outcome.phase,
            "loopwright.stop_reason": outcome.stop_reason or "",
            "loopwright.stop_detail": outcome.stop_detail,
            "loopwright.model_id": versions.get("model_id", ""),
            "loopwright.prompt_version": versions.get("prompt_version", ""),
            "loopwright.interrupts": [str(i.get("kind")) for i in outcome.interrupts],
            "loopwright.unresolved_action_ids": [a.action_id for a in unresolved],
            **usage_attributes(state.get("usage") or {}),
        }
    )


def traced_journal(journal: ActionJournal) -> ActionJournal:
    """`journal`, noting its status changes on spans when tracing is on."""
    return journal if active_tracer() is None else TracedJournal(journal)


class TracedJournal(JournalWrapper):
    """An `ActionJournal` that notes every status change as an event on the current span."""

    def _journaled(
        self, expected: ActionStatus | None, action: Action, detail: dict[str, Any] | None
    ) -> None:
        name = "journal.plan" if expected is None else "journal.transition"
        _note_move(name, expected, action, detail)


def _note_move(
    name: str, before: ActionStatus | None, action: Action, detail: Mapping[str, Any] | None
) -> None:
    current = trace.get_current_span()
    if not current.is_recording():
        return
    attributes: Attributes = {
        "loopwright.action_id": action.action_id,
        "loopwright.intent_key": action.intent_key,
        "loopwright.run_id": action.run_id,
        "gen_ai.tool.name": action.tool,
        "gen_ai.tool.call.id": action.call_id,
        "loopwright.to": action.status.value,
        "loopwright.fence": action.fence,
        "loopwright.attempts": action.attempts,
        "loopwright.at": action.updated_at.isoformat(),
    }
    if before is not None:
        attributes["loopwright.from"] = before.value
    for key in _DETAIL_KEYS:
        if detail and key in detail:
            attributes[f"loopwright.{key}"] = str(detail[key])
    current.add_event(name, attributes)
