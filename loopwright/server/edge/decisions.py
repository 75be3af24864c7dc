"""An approver's decision through the runs API: the request it answers must wait, now, on the
interrupt it names, for an approver the agent's own rule takes; and it is claimed, so two
approvers deciding at once are told 200 and 409, not 200 twice with one decision taken.

Everything here is refused before the decision reaches the run: the run would re-ask, or end the
action, and the client be told 200. This answers truthfully, as the inbox and the CLI do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from loopwright.checkpoints.decision_claims import DecisionClaims
from loopwright.graph.state import ApprovalDecision, ApprovalRequest
from loopwright.graph.text import validation_problems
from loopwright.runner import EditRefused, UnknownRun
from loopwright.server.edge.http import Refused
from loopwright.server.resources import aresources


@dataclass(frozen=True)
class Waiting:
    """An approval request a run waits on, and the interrupt that asks it now (each asking of
    one request, after a decision the run did not take, is a new interrupt)."""

    request: ApprovalRequest
    interrupt_id: str


@dataclass(frozen=True)
class Decided:
    """One decision of a resume: the interrupt it was keyed by (None: the run's one pending
    interrupt), and what it says, signed by the authenticated approver."""

    interrupt_id: str | None
    decision: ApprovalDecision


def decisions_in(resume: Any) -> list[tuple[str | None, Mapping[str, Any]]]:
    """The approval decisions a resume value is (keyed by nothing), or maps interrupt ids to."""
    if not isinstance(resume, Mapping):
        return []
    if "approval_id" in resume:
        return [(None, resume)]
    return [(str(k), v) for k, v in resume.items() if isinstance(v, Mapping) and "approval_id" in v]


def signed(found: Sequence[tuple[str | None, Mapping[str, Any]]], approver: str) -> list[Decided]:
    """The decisions as the run will read them, signed by `approver`; 422 for one the run would
    take for no decision."""
    try:
        return [
            Decided(key, ApprovalDecision.model_validate({**value, "approver": approver}))
            for key, value in found
        ]
    except ValidationError as exc:
        raise Refused(422, f"bad decision: {validation_problems(exc)}") from None


async def waiting_requests(thread_id: str) -> dict[str, Waiting]:
    """What the run on the thread waits on, by approval id."""
    res = await aresources()
    try:
        outcome = await asyncio.to_thread(res.runner.outcome, thread_id)
    except UnknownRun:
        return {}
    return {
        str(r.get("approval_id")): Waiting(ApprovalRequest.model_validate(r), r["interrupt_id"])
        for r in outcome.waiting_for_approval
    }


async def refuse_decisions(asked: Mapping[str, Waiting], decisions: Sequence[Decided]) -> None:
    """Refused unless each decision answers a request the run waits on, on the interrupt that
    asks it now (409), about the action its digest names (409), as the request allows (422:
    an edit of an argument the write keeps fixed, or that its rules refuse; an approval by
    whoever edited the action)."""
    res = await aresources()
    for decided in decisions:
        decision = decided.decision
        approval = decision.approval_id
        if (waiting := asked.get(approval)) is None:
            raise Refused(
                409, f"approval {approval} does not wait on this run: decided, expired or not asked"
            )
        if decided.interrupt_id not in (None, waiting.interrupt_id):
            raise Refused(
                409,
                f"approval {approval} is asked by interrupt {waiting.interrupt_id}, not"
                f" {decided.interrupt_id}: read the request again",
            )
        request = waiting.request
        if decision.digest != request.digest:
            raise Refused(
                409,
                f"the decision's digest is not that of the action approval {approval} asks"
                " about: read the request again",
            )
        args = decision.args
        changes = {k: v for k, v in (args or {}).items() if request.args.get(k) != v}
        try:  # the request's own rules: editable arguments, separation of duties
            if args is not None and set(args) - set(request.args):
                raise ValueError(f"an edit names arguments {request.tool} does not have")
            request.answer(decision.decision, decision.approver, changes=changes or None)
            if args is not None and changes:
                await asyncio.to_thread(res.runner.check_edit, request, args)
        except (ValueError, EditRefused) as exc:
            raise Refused(422, f"{exc}; approval {approval} still waits") from None


@asynccontextmanager
async def claimed(
    asked: Mapping[str, Waiting], decisions: Sequence[Decided]
) -> AsyncIterator[None]:
    """Hold the claim on each decided request (`checkpoints.decision_claims`) for the block, and
    keep them if it succeeds (the run's attempt gives them up as it ends: `server.graph`).
    Claims are given back if the block raises (the run was not admitted)."""
    claims = DecisionClaims((await aresources()).leases.db)
    held: list[tuple[str, str, str, str]] = []
    try:
        for decided in decisions:
            decision = decided.decision
            waiting = asked[decision.approval_id]
            key = (waiting.request.run_id, decision.approval_id, waiting.interrupt_id)
            holder = await asyncio.to_thread(
                claims.claim, *key, decision.approver, decision.decision
            )
            if holder is not None:
                raise Refused(
                    409,
                    f"approval {decision.approval_id} is being decided already"
                    f" ({holder.decision} by {holder.approver}): read the request again",
                )
            held.append((*key, decision.approver))
        yield
    except BaseException:
        for claim in held:
            await asyncio.to_thread(claims.release, *claim)
        raise
