"""One decision path: what makes an approver's decision one a run takes, checked before the run
sees it, the same way whichever way it comes (the CLI, `Runner.decide`, the inbox, the runs
API through the served edge).

`prepare` refuses (`DecisionRefused`, with the status a server answers) a decision:

* 409: for a request the run does not wait on (decided, expired, never asked), asked by another
  interrupt than the one the decision names, or about another action than its digest names;
* 403: by the run's own user, or by someone the agent's approver rule does not take;
* 422: that the request does not allow: an edit of an argument the write keeps fixed, an edit
  its arguments' model or business rules refuse (`EditRefused`), an approval by one of the
  action's editors (separation of duties, judged on the run's records: `editors_of`).

What it returns is the request as asked and the signed answer to resume the run with. After the
run has resumed, `check_taken` says whether the run recorded this very decision: one that did
not take effect never reads as if it had. The run itself refuses all of it again
(`nodes.approval`): these checks only make sure nobody is told 200 or "approved" for a decision
the run would not take.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from loopwright._agent import Agent
from loopwright.checkpoints.leases import LeaseStore, RunRecord
from loopwright.core.state import ApprovalChoice, ApprovalDecision, ApprovalRequest, RunState
from loopwright.core.text import validation_problems
from loopwright.nodes.approval import editors_of
from loopwright.nodes.context import RunContext
from loopwright.outcome import RunOutcome
from loopwright.tools.contract import ToolFault
from loopwright.tools.registry import ToolRegistry


class Runner(Protocol):
    """What deciding reads of a runner (`loopwright.runner.Runner`): the run, its agent's
    approvers, tools and rules."""

    agent: Agent[Any]
    tools: ToolRegistry
    leases: LeaseStore

    def owned(self, run_id: str) -> RunRecord: ...
    def outcome(self, run_id: str) -> RunOutcome: ...
    def state(self, run_id: str) -> RunState: ...
    def is_approver(self, user_id: str) -> bool: ...
    def context(
        self, run_id: str, fence: int, values: Mapping[str, Any] | None = None
    ) -> RunContext: ...


class DecisionRefused(ValueError):
    """A decision refused before the run sees it; the request still waits. `status`: what a
    server answers (409, 403 or 422, as the module says)."""

    status = 422

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        if status is not None:
            self.status = status


class NoPendingApproval(DecisionRefused):
    """The decision names no request the run waits on; the message says what became of it."""

    status = 409


class EditRefused(DecisionRefused):
    """An approver's edit the write could not be planned with."""


class DecisionNotTaken(RuntimeError):
    """An approval decision the run did not record; the message says why."""


@dataclass(frozen=True)
class Prepared:
    """A decision the run will take: the request as asked (with every editor of its action),
    the interrupt that asks it, and the signed answer."""

    request: ApprovalRequest
    interrupt_id: str
    answer: ApprovalDecision

    @property
    def resume(self) -> dict[str, Any]:
        """The resume value: the answer, keyed by the interrupt it answers."""
        return {self.interrupt_id: self.answer.model_dump(mode="json")}


@dataclass(frozen=True)
class Asked:
    """What a decision says of the request it answers (None: whatever the run waits on)."""

    approval_id: str | None = None
    interrupt_id: str | None = None
    digest: str | None = None


def prepare(
    runner: Runner,
    run_id: str,
    approver: str,
    choice: ApprovalChoice,
    *,
    asked: Asked = Asked(),
    comment: str = "",
    changes: Mapping[str, Any] | None = None,
    args: Mapping[str, Any] | None = None,
) -> Prepared:
    """The decision `approver` makes on the request of run `run_id` that `asked` names, ready to
    resume the run with; DecisionRefused otherwise. An edit names its `changes`, or (as the runs
    API carries one) the edited action's complete `args`."""
    runner.owned(run_id)  # another agent's run is not this process's to decide
    request, interrupt_id = _waiting(runner, run_id, asked)
    if approver in (request.requested_by, _owner(runner, run_id)):
        raise DecisionRefused("an approver cannot decide about their own run", 403)
    if not runner.is_approver(approver):
        raise DecisionRefused(f"{approver} is not an approver of agent {runner.agent.name}", 403)
    if args is not None:
        if unknown := sorted(set(args) - set(request.args)):
            raise DecisionRefused(
                f"an edit names arguments {request.tool} does not have: {unknown};"
                f" {request.approval_id} still waits for a decision"
            )
        changes = {k: v for k, v in args.items() if request.args.get(k) != v}
    still = f"; {request.approval_id} still waits for a decision"
    try:
        answer = request.answer(choice, approver, comment, dict(changes) if changes else None)
    except ValidationError as exc:
        raise DecisionRefused(f"bad decision: {validation_problems(exc)}{still}") from None
    except ValueError as exc:  # separation of duties; an edit of what may not change
        raise DecisionRefused(f"{exc}{still}") from None
    if answer.args is not None:
        try:
            check_edit(runner, request, answer.args)
        except EditRefused as exc:
            raise EditRefused(f"{exc}{still}") from None
    return Prepared(request, interrupt_id, answer)


def _waiting(runner: Runner, run_id: str, asked: Asked) -> tuple[ApprovalRequest, str]:
    """The request the decision answers, as the run asks it now, and its interrupt."""
    outcome = runner.outcome(run_id)
    found = [w for w in outcome.waiting_for_approval if _names(asked, w)]
    if not found:
        # A pruned run's decisions went with its checkpoints: none is recorded to name.
        recorded = [] if outcome.pruned else runner.state(run_id).get("approvals") or []
        raise NoPendingApproval(_not_waiting(run_id, asked, recorded))
    value = found[0]
    request = ApprovalRequest.model_validate(value)
    if asked.interrupt_id not in (None, value["interrupt_id"]):
        raise DecisionRefused(
            f"approval {request.approval_id} is asked by interrupt {value['interrupt_id']}, not"
            f" {asked.interrupt_id}: read the request again",
            409,
        )
    if asked.digest not in (None, request.digest):
        raise DecisionRefused(
            f"the decision's digest is not that of the action approval {request.approval_id}"
            " asks about: read the request again",
            409,
        )
    # Every editor of the action, from the run's records, whatever the request carried.
    editors = {*request.edited_by, *editors_of(runner.state(run_id), request.action_id)}
    return request.model_copy(update={"edited_by": tuple(sorted(editors))}), value["interrupt_id"]


def _not_waiting(run_id: str, asked: Asked, recorded: Sequence[Mapping[str, Any]]) -> str:
    """Why the run waits on no request the decision names: above all, a decision that came
    second (the request was decided meanwhile) is told who decided it, as `check_taken` tells
    one that lost the race later."""
    if asked.approval_id is None and asked.interrupt_id is None:
        return f"run {run_id} waits for no approval"
    decided = [r for r in recorded if asked.approval_id and r["approval_id"] == asked.approval_id]
    if decided:
        return (
            f"{asked.approval_id} was decided already ({_decided(decided[0])}): this decision"
            " did not take effect"
        )
    named = asked.approval_id or f"the approval of interrupt {asked.interrupt_id}"
    return f"{named} does not wait on this run ({run_id}): decided, expired or not asked"


def _names(asked: Asked, waiting: Mapping[str, Any]) -> bool:
    """Whether `asked` names the waiting request: by its approval id where it gives one, else
    by its interrupt, else (nothing named) the run's first."""
    if asked.approval_id is not None:
        return bool(waiting.get("approval_id") == asked.approval_id)
    return asked.interrupt_id in (None, waiting.get("interrupt_id"))


def _owner(runner: Runner, run_id: str) -> str | None:
    record = runner.leases.get(run_id)
    return record.user_id if record is not None else None


def check_edit(runner: Runner, request: ApprovalRequest, args: Mapping[str, Any]) -> None:
    """Refuse (EditRefused) an edit the write could not be planned with: its arguments must be
    valid for the tool and meet its business rules, now. A refused edit changes nothing."""
    contract = runner.tools.get(request.tool)
    if contract is None:
        raise EditRefused(f"{request.tool} is not a tool of agent {runner.agent.name}")
    try:
        edited = contract.args_model.model_validate(dict(args))
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise EditRefused(f"the edited {request.tool} is invalid: {problems}") from None
    state = runner.state(request.run_id)
    ctx = runner.context(request.run_id, 0).tool_context(state)
    try:
        contract.check_preconditions(ctx, edited)
    except ToolFault as fault:
        raise EditRefused(f"the edited {request.tool} breaks a rule: {fault}") from None


def check_taken(runner: Runner, run_id: str, answer: ApprovalDecision) -> None:
    """Raise DecisionNotTaken unless the run recorded this very decision: a decision that did
    not take effect (another was first, the request was no longer pending) must never read as
    if it had."""
    state = runner.state(run_id)
    for record in state.get("approvals") or []:
        if record["approval_id"] == answer.approval_id:
            if (record["approver"], record["decision"]) == (answer.approver, answer.decision):
                return
            raise DecisionNotTaken(
                f"{answer.decision} of {answer.approval_id} by {answer.approver} did not "
                f"take effect: it had been decided already ({_decided(record)})"
            )
    why = "; ".join(state.get("feedback") or []) or "the run did not take it"
    raise DecisionNotTaken(
        f"{answer.decision} of {answer.approval_id} by {answer.approver} did not take effect: {why}"
    )


def _decided(record: Mapping[str, Any]) -> str:
    return f"{record['decision']} by {record['approver']} at {record['decided_at']}"
