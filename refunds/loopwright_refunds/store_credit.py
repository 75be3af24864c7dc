"""A write without an idempotency key: store credit, reconciled through a pre-image.

The credit service cannot dedupe a re-sent request. What this contract declares instead is a
pre-image read: the executor journals the customer's credit account (balance and version) with
DISPATCHED, before the write is sent. When the outcome is unknown, reconciliation reads the
account again and compares: unchanged means the write was not applied (absent); exactly one new
entry of this amount means it was; anything else (someone else changed the account meanwhile)
cannot be told apart and escalates. An absent credit is sent again only once the deadline its
request carried has passed (`ResendAfterDeadline`: the credits service refuses a request that
arrives after its deadline), so a first request still on its way can never apply twice.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from loopwright import (
    Action,
    Guarantee,
    ReconcileResult,
    ReconcileStatus,
    ResendAfterDeadline,
    ToolFault,
    VerifyResult,
    read_json,
    write_json,
    write_tool,
)
from loopwright_refunds.agent import (
    MONEY,
    ORDER_ID,
    READ_TIMEOUT_S,
    Ctx,
    fetch_order,
    order_resource,
    order_version,
    owns_order,
)

CREDIT_TIMEOUT_S = 3.0


class IssueStoreCreditArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(pattern=ORDER_ID, description="The order the credit compensates")
    amount: str = Field(pattern=MONEY)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    note: str = Field(min_length=1, max_length=200)


class CreditEntry(BaseModel):
    entry_id: int
    amount: str
    currency: str
    note: str


class CreditAccount(BaseModel):
    user_id: str
    balance: str
    version: int
    entries: list[CreditEntry]


def _account(ctx: Ctx, user_id: str) -> CreditAccount:
    url = f"{ctx.deps.endpoints.payments}/credits/{user_id}"
    return CreditAccount.model_validate(
        read_json(ctx.deps.http, url, timeout=ctx.timeout(READ_TIMEOUT_S))
    )


def _owner(ctx: Ctx, order_id: str) -> str:
    return fetch_order(ctx, order_id).owner


def _pre_image(ctx: Ctx, args: IssueStoreCreditArgs) -> dict[str, Any]:
    account = _account(ctx, _owner(ctx, args.order_id))
    return {"user_id": account.user_id, "version": account.version, "balance": account.balance}


def _new_entries(before: dict[str, Any], now: CreditAccount) -> list[CreditEntry]:
    return now.entries[int(before["version"]) :]


def _reconcile(ctx: Ctx, action: Action, pre_image: dict[str, Any] | None) -> ReconcileResult:
    if pre_image is None:
        return ReconcileResult(ReconcileStatus.UNCONFIRMABLE, detail="no pre-image was journaled")
    try:
        now = _account(ctx, pre_image["user_id"])
    except ToolFault as fault:
        return ReconcileResult(ReconcileStatus.PENDING, detail=f"credits unreadable: {fault}")
    new = _new_entries(pre_image, now)
    if not new:
        return ReconcileResult(ReconcileStatus.ABSENT, detail="the account is as it was before")
    mine = [
        e for e in new if (e.amount, e.currency) == (action.args["amount"], action.args["currency"])
    ]
    if len(new) == 1 and len(mine) == 1:
        return ReconcileResult(ReconcileStatus.APPLIED, outcome=now.model_dump(mode="json"))
    return ReconcileResult(
        ReconcileStatus.UNCONFIRMABLE,
        detail=f"{len(new)} entries since the pre-image: cannot tell which is ours",
    )


def _verify(ctx: Ctx, action: Action) -> VerifyResult:
    outcome = CreditAccount.model_validate(action.outcome)
    ours = outcome.entries[-1] if outcome.entries else None
    current = _account(ctx, outcome.user_id)
    if ours is None or ours not in current.entries:
        return VerifyResult(False, {}, "the credit entry is not in the customer's ledger")
    facts = {"credit_entry": ours.entry_id, "amount": ours.amount, "currency": ours.currency}
    return VerifyResult(True, facts)


def issue_store_credit(ctx: Ctx, args: IssueStoreCreditArgs, intent_key: str) -> CreditAccount:
    """Give the customer store credit for an order. Moves money; cannot be deduped."""
    body = {
        "user_id": _owner(ctx, args.order_id),
        "amount": args.amount,
        "currency": args.currency,
        "note": args.note,
    }
    url = f"{ctx.deps.endpoints.payments}/credits"
    # No idempotency key exists downstream; the deadline it honours makes a re-send safe.
    deadline = {"Request-Deadline": ctx.send_by.isoformat()} if ctx.send_by else {}
    answer = write_json(
        ctx.deps.http,
        url,
        body,
        idempotency_key=None,
        timeout=ctx.timeout(CREDIT_TIMEOUT_S),
        headers=deadline,
    )
    return CreditAccount.model_validate(answer)


STORE_CREDIT = write_tool(
    issue_store_credit,
    intent=lambda run_id, args: f"credit:{run_id}:{args.order_id}",
    guarantee=Guarantee.QUERYABLE,
    # Every request carries a deadline the credits service honours: absent after it (and two
    # seconds for the clocks), the credit is sent again as a new attempt of the same intent.
    resend=ResendAfterDeadline(seconds=10.0, skew_s=2.0),
    reconcile=_reconcile,
    verify=_verify,
    needs_approval=False,
    pre_image=_pre_image,
    current_versions=order_version,
    compensation=lambda action: (
        f"remove the {action.args['amount']} {action.args['currency']} credit entry for order "
        f"{action.args['order_id']} from the customer's ledger"
    ),
    summary=lambda args: f"Store credit {args.amount} {args.currency} for order {args.order_id}",
    resources=order_resource,
    authorize=lambda ctx, args: owns_order(ctx, args.order_id),
    timeout_s=CREDIT_TIMEOUT_S,
)
