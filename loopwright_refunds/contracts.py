"""Tool contracts of the reference refund domain: orders, refund policy, payments.

Authorisation always comes from the trusted principal, checked against the business system's own
record of who owns an order: a model naming another user's order gets `permission_denied`.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx
from pydantic import BaseModel, Field

from loopwright.graph.state import Action, Principal
from loopwright.tools.contract import (
    Effect,
    Guarantee,
    OutcomeUnknown,
    PermissionDenied,
    ReconcileResult,
    ReconcileStatus,
    ToolArgs,
    ToolContract,
    ToolEnv,
    ToolFault,
    VerifyResult,
)
from loopwright.tools.http import read_json, write_json

ORDER_ID = r"^O-[0-9]{1,9}$"
MONEY = r"^[0-9]{1,9}\.[0-9]{2}$"
REFUND_ID = r"^rf_[0-9]{1,12}$"
DEFAULT_APPROVAL_THRESHOLD = Decimal("50.00")


class GetOrderArgs(ToolArgs):
    order_id: str = Field(pattern=ORDER_ID, description="Order id, e.g. O-42")


class Order(BaseModel):
    order_id: str
    owner: str
    status: str
    amount: str = Field(pattern=MONEY)
    currency: str
    refunded: str = Field(pattern=MONEY)
    refundable: str = Field(pattern=MONEY)
    delivered_at: datetime | None
    version: int


class GetPolicyArgs(ToolArgs):
    pass


class Policy(BaseModel):
    name: str
    version: int
    window_days: int
    requires_delivery: bool
    approval_threshold: str = Field(pattern=MONEY)
    text: str
    created_at: datetime


class SubmitRefundArgs(ToolArgs):
    order_id: str = Field(pattern=ORDER_ID)
    amount: str = Field(pattern=MONEY, description="Amount with two decimals, e.g. 100.00")
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    reason: str = Field(min_length=1, max_length=500)


class Refund(BaseModel):
    refund_id: str = Field(pattern=REFUND_ID)
    idempotency_key: str
    order_id: str
    amount: str = Field(pattern=MONEY)
    currency: str
    status: str


class GetRefundStatusArgs(ToolArgs):
    refund_id: str = Field(pattern=REFUND_ID)


READ_TIMEOUT_S = 5.0


def fetch_order(env: ToolEnv, order_id: str) -> Order:
    return Order.model_validate(
        read_json(
            env.http,
            f"{env.endpoints.orders}/orders/{order_id}",
            timeout=env.timeout(READ_TIMEOUT_S),
        )
    )


def fetch_policy(env: ToolEnv) -> Policy:
    return Policy.model_validate(
        read_json(
            env.http,
            f"{env.endpoints.policies}/policies/refunds",
            timeout=env.timeout(READ_TIMEOUT_S),
        )
    )


def owns_order(principal: Principal, order_id: str, env: ToolEnv) -> None:
    try:
        order = fetch_order(env, order_id)
    except ToolFault as fault:
        if fault.code == "order_not_found":
            # Same answer as "not yours": existence of other users' orders is not disclosed.
            raise PermissionDenied(
                f"order {order_id} is not an order of {principal.user_id}"
            ) from fault
        raise
    if order.owner != principal.user_id:
        raise PermissionDenied(f"order {order_id} is not an order of {principal.user_id}")


def _order_resource(args: Any) -> frozenset[str]:
    return frozenset({f"order:{args.order_id}"})


def order_version(env: ToolEnv, args: Any) -> dict[str, str]:
    return {f"order:{args.order_id}": str(fetch_order(env, args.order_id).version)}


# --- reads -----------------------------------------------------------------------------------


def _get_order(env: ToolEnv, args: GetOrderArgs, _key: str | None) -> dict[str, Any]:
    return fetch_order(env, args.order_id).model_dump(mode="json")


def _get_policy(env: ToolEnv, _args: GetPolicyArgs, _key: str | None) -> dict[str, Any]:
    return fetch_policy(env).model_dump(mode="json")


def _get_refund(env: ToolEnv, args: GetRefundStatusArgs, _key: str | None) -> dict[str, Any]:
    url = f"{env.endpoints.payments}/refunds/{args.refund_id}"
    return Refund.model_validate(
        read_json(env.http, url, timeout=env.timeout(READ_TIMEOUT_S))
    ).model_dump(mode="json")


def _authorize_refund_read(principal: Principal, args: GetRefundStatusArgs, env: ToolEnv) -> None:
    refund = Refund.model_validate(
        read_json(
            env.http,
            f"{env.endpoints.payments}/refunds/{args.refund_id}",
            timeout=env.timeout(READ_TIMEOUT_S),
        )
    )
    owns_order(principal, refund.order_id, env)


# --- the write -------------------------------------------------------------------------------


def _submit_refund(env: ToolEnv, args: SubmitRefundArgs, key: str | None) -> dict[str, Any]:
    assert key is not None, "a write is only ever sent under its intent key"
    body = {
        "order_id": args.order_id,
        "amount": args.amount,
        "currency": args.currency,
        "reason": args.reason,
    }
    answer = write_json(
        env.http,
        f"{env.endpoints.payments}/refunds",
        body,
        idempotency_key=key,
        timeout=env.timeout(SUBMIT_REFUND.timeout_s),
    )
    refund = Refund.model_validate(answer)
    if refund.status != "succeeded":
        # Accepted but not final: only the payments service can say later how it ended.
        raise OutcomeUnknown(f"refund {refund.refund_id} is {refund.status}")
    return refund.model_dump(mode="json")


def _refund_intent_key(run_id: str, args: SubmitRefundArgs) -> str:
    """One refund intent per order per run; amount and currency are bound to it by the journal."""
    return f"refund:{run_id}:{args.order_id}"


def _refund_needs_approval(args: SubmitRefundArgs, env: ToolEnv) -> bool:
    try:
        threshold = Decimal(fetch_policy(env).approval_threshold)
    except ToolFault:
        threshold = DEFAULT_APPROVAL_THRESHOLD  # fail closed: the reference threshold applies
    return Decimal(args.amount) > threshold


def _refund_by_key(env: ToolEnv, key: str) -> httpx.Response:
    return env.http.get(
        f"{env.endpoints.payments}/refunds/by-key/{key}", timeout=env.timeout(READ_TIMEOUT_S)
    )


def _reconcile_refund(env: ToolEnv, action: Action, _pre_image: object) -> ReconcileResult:
    """Ask the payments service about the intent key: the only source of truth for the outcome."""
    try:
        response = _refund_by_key(env, action.intent_key)
    except httpx.TransportError as exc:
        return ReconcileResult(ReconcileStatus.PENDING, detail=f"payments unreachable: {exc!r}")
    if response.status_code == 404:
        return ReconcileResult(
            ReconcileStatus.ABSENT, detail="payments has no refund under this key"
        )
    if response.status_code != 200:
        return ReconcileResult(
            ReconcileStatus.UNCONFIRMABLE,
            detail=f"payments answered {response.status_code} to a status query",
        )
    refund = Refund.model_validate(response.json())
    if refund.status == "succeeded":
        return ReconcileResult(ReconcileStatus.APPLIED, outcome=refund.model_dump(mode="json"))
    return ReconcileResult(
        ReconcileStatus.PENDING, detail=f"refund {refund.refund_id} is {refund.status}"
    )


def _verify_refund(env: ToolEnv, action: Action) -> VerifyResult:
    """A refund is done when payments has it as succeeded with the journaled parameters."""
    try:
        response = _refund_by_key(env, action.intent_key)
    except httpx.TransportError as exc:
        return VerifyResult(False, {}, f"payments unreachable: {exc!r}")
    if response.status_code != 200:
        return VerifyResult(False, {}, f"payments has no refund under {action.intent_key}")
    refund = Refund.model_validate(response.json())
    facts = refund.model_dump(mode="json")
    expected = (action.args["order_id"], action.args["amount"], action.args["currency"])
    if (refund.order_id, refund.amount, refund.currency) != expected:
        return VerifyResult(
            False, facts, f"refund {refund.refund_id} does not match the journaled intent"
        )
    if refund.status != "succeeded":
        return VerifyResult(False, facts, f"refund {refund.refund_id} is {refund.status}")
    return VerifyResult(True, facts)


GET_ORDER = ToolContract(
    name="get_order",
    description="Read an order: status, amount, refundable balance, delivery date, version.",
    args_model=GetOrderArgs,
    output_model=Order,
    effect=Effect.READ,
    run=_get_order,
    resources=_order_resource,
    authorize=lambda principal, args, env: owns_order(principal, args.order_id, env),
)

GET_POLICY = ToolContract(
    name="get_policy",
    description="Read the current refund policy document.",
    args_model=GetPolicyArgs,
    output_model=Policy,
    effect=Effect.READ,
    run=_get_policy,
)

SUBMIT_REFUND = ToolContract(
    name="submit_refund",
    description="Refund an amount of an order to the customer. Moves money.",
    args_model=SubmitRefundArgs,
    output_model=Refund,
    effect=Effect.WRITE,
    run=_submit_refund,
    resources=_order_resource,
    authorize=lambda principal, args, env: owns_order(principal, args.order_id, env),
    needs_approval=_refund_needs_approval,
    intent_key=_refund_intent_key,
    current_versions=order_version,
    compensation=lambda action: (
        f"refund {(action.outcome or {}).get('refund_id')} of {action.args['amount']} "
        f"{action.args['currency']} cannot be undone by the runtime; reversing it means charging "
        f"the customer of order {action.args['order_id']} again, which a person must decide"
    ),
    reconcile=_reconcile_refund,
    verify=_verify_refund,
    summarize=lambda args: f"Refund {args.amount} {args.currency} to order {args.order_id}",
    guarantee=Guarantee.IDEMPOTENT_BY_KEY,
    timeout_s=3.0,
)

GET_REFUND_STATUS = ToolContract(
    name="get_refund_status",
    description="Read a refund by its refund id.",
    args_model=GetRefundStatusArgs,
    output_model=Refund,
    effect=Effect.READ,
    run=_get_refund,
    authorize=_authorize_refund_read,
    poll_after=lambda result: 1.0 if result.get("status") == "processing" else None,
)

REFUND_TOOLS = (GET_ORDER, GET_POLICY, SUBMIT_REFUND, GET_REFUND_STATUS)

ORDER_IN_TEXT = re.compile(r"\bO-[0-9]{1,9}\b")


def task_scope(task: str) -> tuple[str, ...]:
    """The resources a refund task may touch: the orders it names."""
    return tuple(sorted({f"order:{order_id}" for order_id in ORDER_IN_TEXT.findall(task)}))


def is_approver(env: ToolEnv, user_id: str) -> bool:
    """The reference user directory (the orders service) says who holds the approver role."""
    try:
        user = read_json(
            env.http, f"{env.endpoints.orders}/users/{user_id}", timeout=READ_TIMEOUT_S
        )
    except ToolFault:
        return False
    return "approver" in user.get("roles", [])
