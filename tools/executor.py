"""Journaled execution of validated tool calls.

Reads run directly, with transport faults retried in this one layer. A write follows the
journal protocol that makes one intent produce at most one effect:

1. DISPATCHED (with the writer's fencing token) is committed in its own transaction *before*
   the request is sent;
2. the answer is recorded right after: SUCCEEDED, FAILED (a definitive refusal), or UNKNOWN (a
   timeout, a dropped connection, a 5xx, an unreadable answer: the write may have applied);
3. on re-entry after a crash, DISPATCHED without an outcome becomes UNKNOWN. It is never sent
   again from here: only reconciliation, after asking the business system, may re-send.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from loopwright.checkpoints.journal import ActionJournal
from loopwright.core.crashpoints import CrashPoint, crash_point
from loopwright.core.protocol import ToolEnvelope
from loopwright.core.state import Action, ActionStatus, Evidence, canonical_json, digest, utcnow
from loopwright.observability.tracing import record_error
from loopwright.tools import faults
from loopwright.tools.contract import OutcomeUnknown, ToolContext, ToolContract, ToolFault
from loopwright.tools.tool_spans import tool_span

BACKOFF_BASE_S = 0.05


@dataclass(frozen=True)
class ReadResult:
    envelope: ToolEnvelope
    evidence: Evidence | None
    attempts: int
    result_bytes: int
    # The tool was unavailable: a transient fault outlasted the retry layer.
    exhausted: bool = False
    # The result says "not finished yet, ask again in this many seconds".
    poll_after_s: float | None = None


def check_output(contract: ToolContract, raw: Any) -> dict[str, Any]:
    """The output contract: a result that does not meet its declared shape is a tool fault."""
    try:
        return contract.output_model.model_validate(raw).model_dump(mode="json")
    except ValidationError as exc:
        raise ToolFault(
            "malformed_output",
            f"{contract.name} returned data that does not meet its output contract "
            f"({exc.error_count()} errors)",
        ) from exc


def run_read(
    contract: ToolContract, args: BaseModel, ctx: ToolContext[Any], call_id: str
) -> ReadResult:
    with tool_span(contract, args, call_id=call_id) as span:
        read = _read(contract, args, ctx, call_id)
        if span.is_recording():
            span.set_attributes(
                {
                    "loopwright.tool.status": read.envelope.status,
                    "loopwright.tool.attempts": read.attempts,
                    "loopwright.tool.result_bytes": read.result_bytes,
                    "loopwright.evidence_ids": [read.evidence.evidence_id] if read.evidence else [],
                    "loopwright.error.code": str((read.envelope.error or {}).get("code", "")),
                }
            )
        return read


def _read(
    contract: ToolContract, args: BaseModel, ctx: ToolContext[Any], call_id: str
) -> ReadResult:
    attempts = 0
    while True:
        attempts += 1
        try:
            result = check_output(contract, contract.run(ctx, args, None))
        except ToolFault as fault:
            record_error(fault)
            if fault.transient and attempts < contract.max_attempts:
                time.sleep(BACKOFF_BASE_S * 2 ** (attempts - 1) * (1 + random.random()))
                continue
            envelope = ToolEnvelope(status="error", error=fault.as_error())
            return ReadResult(envelope, None, attempts, 0, exhausted=fault.transient)
        size = len(canonical_json(result))
        if size > contract.max_result_bytes:
            too_large = {
                "code": "result_too_large",
                "detail": f"{size} bytes > cap {contract.max_result_bytes}",
            }
            return ReadResult(ToolEnvelope(status="error", error=too_large), None, attempts, 0)
        evidence = Evidence(
            evidence_id=f"ev_{digest([call_id, result])[:12]}",
            source=contract.name,
            call_id=call_id,
            resources=sorted(contract.resources_of(args)),
            version=str(result["version"]) if "version" in result else None,
            content_hash=digest(result),
            content=result,
        )
        poll_after = contract.poll_after(result) if contract.poll_after else None
        envelope = ToolEnvelope(status="ok", result=result)
        return ReadResult(envelope, evidence, attempts, size, poll_after_s=poll_after)


def dispatch_write(
    contract: ToolContract,
    action: Action,
    ctx: ToolContext[Any],
    journal: ActionJournal,
    fence: int,
    *,
    found: dict[str, Any] | None = None,
) -> Action:
    """Send a planned (or approved, or absent-after-reconcile) write once, journaled.

    A contract that declares a pre-image read has it taken now and journaled with DISPATCHED,
    in the same transaction, so reconciliation can compare before and after. Without a readable
    pre-image the write is not sent at all. `found`: what reconciliation learnt that led to
    this send, journaled with DISPATCHED (the action's history tells a re-send so).

    Each send is a tool span; the journal moves it makes are events on it (a traced journal).
    """
    with tool_span(contract, action.args, call_id=action.call_id, action=action) as span:
        settled = _dispatch(contract, action, ctx, journal, fence, found or {})
        span.set_attribute("loopwright.action.status", settled.status.value)
        return settled


def _dispatch(
    contract: ToolContract,
    action: Action,
    ctx: ToolContext[Any],
    journal: ActionJournal,
    fence: int,
    found: dict[str, Any],
) -> Action:
    args = contract.args_model.model_validate(action.args)
    # The contract it is sent under: reconciliation after a deploy checks it is still the same.
    detail: dict[str, Any] = {
        **found,
        "contract": contract.schema_hash,
        "guarantee": contract.guarantee,
    }
    if contract.resend is not None:
        # Journaled before the send: reconciliation never re-sends before it has passed.
        ctx = replace(ctx, send_by=utcnow() + timedelta(seconds=contract.resend.seconds))
        detail["send_by"] = ctx.send_by.isoformat() if ctx.send_by else None
    if contract.pre_image is not None:
        try:
            detail["pre_image"] = contract.pre_image(ctx, args)
        except ToolFault as fault:
            record_error(fault)
            return journal.transition(
                action.action_id,
                action.status,
                ActionStatus.REJECTED,
                fence=fence,
                outcome={"error": {"code": "pre_image_unavailable", "detail": fault.detail}},
            )
    action = journal.transition(
        action.action_id,
        action.status,
        ActionStatus.DISPATCHED,
        fence=fence,
        count_attempt=True,
        detail=detail,
    )
    crash_point(CrashPoint.AFTER_DISPATCH_RECORD)
    try:
        raw = faults.send(contract.name, lambda: contract.run(ctx, args, action.intent_key))
        # The business system answered; whatever the tool's transport, nothing is recorded yet.
        crash_point(CrashPoint.AFTER_SEND)
        outcome = check_output(contract, raw)
    except OutcomeUnknown as exc:
        record_error(exc)
        return journal.transition(
            action.action_id,
            ActionStatus.DISPATCHED,
            ActionStatus.UNKNOWN,
            fence=fence,
            detail={"reason": str(exc)},
        )
    except ToolFault as fault:
        record_error(fault)
        if fault.code == "malformed_output":
            # It answered, but not in a way we can trust: the write may have applied.
            return journal.transition(
                action.action_id,
                ActionStatus.DISPATCHED,
                ActionStatus.UNKNOWN,
                fence=fence,
                detail={"reason": fault.detail},
            )
        return journal.transition(
            action.action_id,
            ActionStatus.DISPATCHED,
            ActionStatus.FAILED,
            fence=fence,
            outcome={"error": fault.as_error()},
        )
    crash_point(CrashPoint.BEFORE_OUTCOME_RECORD)
    return journal.transition(
        action.action_id,
        ActionStatus.DISPATCHED,
        ActionStatus.SUCCEEDED,
        fence=fence,
        outcome=outcome,
        detail={"at": utcnow().isoformat()},
    )


def dispatch_record(journal: ActionJournal, action_id: str) -> dict[str, Any]:
    """What was journaled with the action's latest DISPATCHED: the contract's schema hash and
    guarantee it was sent under, and its pre-image if the contract took one."""
    for event in reversed(journal.events(action_id)):
        if event.to_status == ActionStatus.DISPATCHED:
            return dict(event.detail or {})
    return {}


def settle_reentry(action: Action, journal: ActionJournal, fence: int) -> Action:
    """A DISPATCHED action met again means a crash between send and record: UNKNOWN."""
    if action.status is ActionStatus.DISPATCHED:
        return journal.transition(
            action.action_id,
            ActionStatus.DISPATCHED,
            ActionStatus.UNKNOWN,
            fence=fence,
            detail={"reason": "found DISPATCHED without an outcome on re-entry"},
        )
    return action


def envelope_of(action: Action) -> ToolEnvelope:
    """What the model is told about a settled write. UNKNOWN is never shown as success or failure."""
    if action.status is ActionStatus.SUCCEEDED:
        return ToolEnvelope(status="ok", result=action.outcome)
    if action.status in (ActionStatus.FAILED, ActionStatus.REJECTED, ActionStatus.CANCELLED):
        error = (action.outcome or {}).get("error") or {"code": action.status.lower()}
        return ToolEnvelope(status="error", error=error)
    return ToolEnvelope(
        status="unknown",
        error={"code": "outcome_unknown", "detail": f"action is {action.status}; do not retry it"},
    )
