"""Where a run stands after a process stopped advancing it: what `Runner` returns and what
reports, the timeline and tracing read. Its own module so that those lower layers need not
import the runner.

`ending_of` says how a run ended in the runtime's words, from the journal and the verification
alone: the kind of ending a script branches on (`EndingKind`), the effects verified in the
business system (or none), every refusal that shaped the outcome with its reason, the writes
whose outcome nobody confirmed, and only then the model's final answer, labelled as the model's
(with what the runtime says about it). Every way of showing a run (the CLI's text and `--json`,
`show`, the inbox) leads with it.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from loopwright.checkpoints.journal import Action
from loopwright.checkpoints.retention import Summary
from loopwright.core.state import UNRESOLVED_STATUSES, ActionStatus, Phase
from loopwright.core.views import latest_per_intent
from loopwright.nodes.verify import NO_EFFECT, NO_EFFECT_NOTE, refusal_words, refused_by
from loopwright.tools.registry import ToolRegistry


@dataclass
class RunOutcome:
    """Where a run stands after this process stopped advancing it."""

    run_id: str
    phase: str
    stop_reason: str | None
    stop_detail: str
    verification: dict[str, Any] | None
    interrupts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    # For a cancelled run: how its succeeded writes could be undone, offered, never performed.
    compensations: list[str] = field(default_factory=list)
    # For a run the retention job pruned: the summary it kept (the checkpoints are gone).
    pruned: Summary | None = None

    @property
    def waiting_for_approval(self) -> list[dict[str, Any]]:
        return [i for i in self.interrupts if i.get("kind") == "approval"]

    @property
    def next_attempt_at(self) -> datetime | None:
        """When a parked reconciliation should look again, if the run is parked."""
        waits = [i["retry_at"] for i in self.interrupts if i.get("kind") == "reconcile_wait"]
        return datetime.fromisoformat(min(waits)) if waits else None


class EndingKind(StrEnum):
    """How a run ended, for a script to branch on without reading text (`reports.EXIT_CODES`
    gives each its exit code)."""

    # Completed: every effect the run made is verified in the business system, at least one.
    COMPLETED = "completed"
    # Completed, and the run changed nothing in the business system: the task owed no effect
    # (the agent's completion check says it is done without one).
    COMPLETED_NO_EFFECT = "completed_no_effect"
    # Completed, and a write the run asked for was refused (by a rule, a check, an approver or
    # the business system) or did not happen: the task is done without it.
    COMPLETED_WITH_REFUSAL = "completed_with_refusal"
    WAITING = "waiting"  # a person must decide (an approval)
    INCOMPLETE = "incomplete"  # ended with a typed stop reason other than completed
    UNFINISHED = "unfinished"  # parked until a reconciliation is due, or still advancing


_COMPLETED_AS = {
    "effects": EndingKind.COMPLETED,
    "no_effect": EndingKind.COMPLETED_NO_EFFECT,
    "refusal": EndingKind.COMPLETED_WITH_REFUSAL,
}


@dataclass(frozen=True)
class Ending:
    """A run's ending as the runtime tells it (see the module's docstring)."""

    kind: EndingKind
    # The runtime's account in one line: effects verified (or "no business effect"), then every
    # refusal with its reason, every write not confirmed.
    statement: str
    # Each effect: action_id, tool, summary, produced (ids), verified (in the business system;
    # False for a write that succeeded in a run that ended before verifying it).
    effects: list[dict[str, Any]]
    # Each refusal: by ("rule", "check", "approver", "business system"), tool, code, reason.
    refusals: list[dict[str, Any]]
    unconfirmed: list[str]  # writes whose outcome nobody has confirmed: "act_... UNKNOWN"
    # The model's final answer, its own words, never the runtime's (None: it gave none).
    model_answer: str | None
    answer_notes: list[str]  # what the runtime says about that answer

    def document(self) -> dict[str, Any]:
        return asdict(self)


def _kind(outcome: RunOutcome, facts: dict[str, Any]) -> EndingKind:
    if outcome.stop_reason == "completed":
        if "outcome" in facts:
            return _COMPLETED_AS[facts["outcome"]]
        # Recorded by a release before endings had kinds: read from its facts.
        if facts.get("refused") or facts.get("not_done"):
            return EndingKind.COMPLETED_WITH_REFUSAL
        return EndingKind.COMPLETED if facts.get("writes") else EndingKind.COMPLETED_NO_EFFECT
    if outcome.waiting_for_approval:
        return EndingKind.WAITING
    if outcome.phase == Phase.INCOMPLETE:
        return EndingKind.INCOMPLETE
    return EndingKind.UNFINISHED


def _effects(
    outcome: RunOutcome, facts: dict[str, Any], tools: ToolRegistry
) -> list[dict[str, Any]]:
    """The verified writes, then those that succeeded and were never verified."""
    verified = [
        {k: w.get(k) for k in ("action_id", "tool", "summary")}
        | {"produced": w.get("produced") or {}, "verified": True}
        for w in facts.get("writes") or []
    ]
    seen = {e["action_id"] for e in verified}
    for action in outcome.actions:
        if action.status is ActionStatus.SUCCEEDED and action.action_id not in seen:
            verified.append(_unverified(action, tools))
    return verified


def _unverified(action: Action, tools: ToolRegistry) -> dict[str, Any]:
    """A write that succeeded and was never verified, described by its contract where this
    process has one that reads its arguments."""
    contract = tools.get(action.tool)
    summary, produced = action.tool, {}
    if contract is not None:
        produced = contract.produced_ids(action.outcome)
        # Arguments of another version of the contract are named by the tool alone.
        with suppress(ValueError):
            summary = contract.describe(contract.args_model.model_validate(action.args))
    return {
        "action_id": action.action_id,
        "tool": action.tool,
        "summary": summary,
        "produced": produced,
        "verified": False,
    }


def _journal_refusals(actions: list[Action]) -> list[dict[str, Any]]:
    """The refusals the journal shows (each intent's latest action, refused or failed)."""
    return [
        {
            "by": refused_by(error.get("code"), action.status),
            "tool": action.tool,
            "code": str(error.get("code") or ""),
            "reason": str(error.get("detail") or ""),
            "action_id": action.action_id,
        }
        for action in latest_per_intent(actions)
        if action.status in (ActionStatus.REJECTED, ActionStatus.FAILED)
        for error in [(action.outcome or {}).get("error") or {}]
    ]


def _refusals(outcome: RunOutcome, facts: dict[str, Any]) -> list[dict[str, Any]]:
    if "refusals" in facts:
        return list(facts["refusals"])
    before = []  # an earlier release's words: "tool refused: code: reason"
    for words in facts.get("refused") or []:
        tool, _, said = str(words).partition(" refused: ")
        code, _, reason = said.partition(": ")
        before.append({"by": refused_by(code), "tool": tool, "code": code, "reason": reason})
    return before + _journal_refusals(outcome.actions)


def _described(effect: dict[str, Any]) -> str:
    produced = ", ".join(f"{k} {v}" for k, v in effect["produced"].items())
    return f"{effect['summary']} ({produced})" if produced else str(effect["summary"])


def _statement(
    effects: list[dict[str, Any]], refusals: list[dict[str, Any]], unconfirmed: list[str]
) -> str:
    verified = [_described(e) for e in effects if e["verified"]]
    unverified = [_described(e) for e in effects if not e["verified"]]
    parts = []
    if verified:
        parts.append(f"verified in the business system: {'; '.join(verified)}")
    if unverified:
        parts.append(f"done in the business system, not verified: {'; '.join(unverified)}")
    if not effects and not unconfirmed:
        parts.append(f"{NO_EFFECT}: this run changed nothing in the business system")
    parts += [refusal_words(r) for r in refusals]
    parts += [f"outcome not confirmed: {u}" for u in unconfirmed]
    return "; ".join(parts)


def ending_of(outcome: RunOutcome, tools: ToolRegistry) -> Ending:
    """How `outcome`'s run ended, in the runtime's words (`tools`: the agent's contracts, which
    describe its writes)."""
    facts = (outcome.verification or {}).get("facts") or {}
    kind = _kind(outcome, facts)
    effects = _effects(outcome, facts, tools)
    refusals = _refusals(outcome, facts)
    unconfirmed = [
        f"{a.action_id} {a.status}"
        for a in outcome.actions
        if a.status in UNRESOLVED_STATUSES or a.status is ActionStatus.ESCALATED
    ]
    completed = kind in _COMPLETED_AS.values()
    statement = (
        str(facts["answer"])
        if completed and "outcome" in facts
        else _statement(effects, refusals, unconfirmed)
    )
    # An earlier release kept the model's words as `answer` (or, where the journal spoke for
    # it, as `model_answer`).
    model_answer = facts.get("model_answer", facts.get("answer")) if facts else None
    notes = facts.get("answer_notes")
    if notes is None:
        notes = [NO_EFFECT_NOTE] if model_answer and not facts.get("writes") else []
    return Ending(
        kind=kind,
        statement=statement,
        effects=effects,
        refusals=refusals,
        unconfirmed=unconfirmed,
        model_answer=str(model_answer) if model_answer is not None else None,
        answer_notes=list(notes),
    )
