"""An approver's decision through the runs API: checked by the one decision path
(`loopwright.decisions.prepare`: the request waits now, on the interrupt the decision names,
about the action its digest names, for an approver the agent's rule takes, as the request
allows), then claimed, so two approvers deciding at once are told 200 and 409, not 200 twice
with one decision taken.

Everything here is refused before the decision reaches the run: the run would re-ask, or end the
action, and the client be told 200. This answers truthfully, as the inbox and the CLI do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic import ValidationError

from loopwright.checkpoints.decision_claims import DecisionClaims
from loopwright.core.state import ApprovalDecision
from loopwright.core.text import validation_problems
from loopwright.decisions import Asked, DecisionRefused, Prepared, prepare
from loopwright.server.edge.http import Refused
from loopwright.server.resources import aresources


def decisions_in(resume: Any) -> list[tuple[str | None, Mapping[str, Any]]]:
    """The approval decisions a resume value is (keyed by nothing), or maps interrupt ids to."""
    if not isinstance(resume, Mapping):
        return []
    if "approval_id" in resume:
        return [(None, resume)]
    return [(str(k), v) for k, v in resume.items() if isinstance(v, Mapping) and "approval_id" in v]


async def prepared(thread_id: str, approver: str, resume: Any) -> list[Prepared]:
    """The decisions of a resume value, each as the run will take it, signed by `approver`;
    Refused with the status `loopwright.decisions` gives otherwise."""
    runner = (await aresources()).runner
    ready = []
    for interrupt_id, value in decisions_in(resume):
        try:
            decision = ApprovalDecision.model_validate({**value, "approver": approver})
        except ValidationError as exc:  # the run would take no such decision
            raise Refused(422, f"bad decision: {validation_problems(exc)}") from None
        asked = Asked(decision.approval_id, interrupt_id, decision.digest)
        try:
            ready.append(
                await asyncio.to_thread(
                    prepare,
                    runner,
                    thread_id,
                    approver,
                    decision.decision,
                    asked=asked,
                    comment=decision.comment,
                    args=decision.args,
                )
            )
        except DecisionRefused as exc:
            raise Refused(exc.status, str(exc)) from None
    return ready


@asynccontextmanager
async def claimed(decisions: Sequence[Prepared]) -> AsyncIterator[None]:
    """Hold the claim on each decided request (`checkpoints.decision_claims`) for the block, and
    keep them if it succeeds (the run's attempt gives them up as it ends: `server.graph`).
    Claims are given back if the block raises (the run was not admitted)."""
    claims = DecisionClaims((await aresources()).leases.db)
    held: list[tuple[str, str, str, str]] = []
    try:
        for ready in decisions:
            answer = ready.answer
            key = (ready.request.run_id, answer.approval_id, ready.interrupt_id)
            holder = await asyncio.to_thread(claims.claim, *key, answer.approver, answer.decision)
            if holder is not None:
                raise Refused(
                    409,
                    f"approval {answer.approval_id} is being decided already"
                    f" ({holder.decision} by {holder.approver}): read the request again",
                )
            held.append((*key, answer.approver))
        yield
    except BaseException:
        for claim in held:
            await asyncio.to_thread(claims.release, *claim)
        raise
