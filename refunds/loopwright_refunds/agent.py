"""The refund agent: loopwright's reference tenant, written against its public API only.

It checks orders against the refund policy and refunds what the policy allows, through three
reference services (orders, policies, payments; `loopwright_refunds.services`). What must hold
for a refund is not left to the model: the policy (delivered, inside the window), the
refundable balance and the currency are preconditions of `submit_refund`, checked when the call
is validated and again right before it is sent, on current data. Authorisation comes from the
trusted principal, checked against the orders service's own record of who owns an order: a
model naming another user's order gets `permission_denied`.

    loopwright demo                                     # this agent is the default
    loopwright run "Check whether order O-43 can be refunded and refund it if so." --user u-1
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field

from loopwright import (
    Action,
    ActionStatus,
    Agent,
    Demo,
    Evidence,
    Guarantee,
    OutcomeUnknown,
    PermissionDenied,
    PreconditionFailed,
    Principal,
    Programs,
    ReconcileResult,
    ReconcileStatus,
    Scenario,
    ScriptedChatModel,
    TaskRefused,
    ToolContext,
    ToolFault,
    VerifyResult,
    loopwright_home,
    read_json,
    write_json,
)
from loopwright_refunds.procedure import RefundProcedure
from loopwright_refunds.services.endpoints import ServiceEndpoints, tls_context
from loopwright_refunds.services.launcher import start_services

ORDER_ID = r"^O-[0-9]{1,9}$"
MONEY = r"^[0-9]{1,9}\.[0-9]{2}$"
REFUND_ID = r"^rf_[0-9]{1,12}$"
ORDER_IN_TEXT = re.compile(r"\bO-[0-9]{1,9}\b")
# "refund it", "refund order O-42", "refund 40.00": a task that asks for one (not "the refund
# policy", nor "can it be refunded" alone).
ASKS_FOR_A_REFUND = re.compile(r"\brefund\b(?!\s+(polic|status|window))", re.IGNORECASE)
# A task is about a few orders: each one named is looked up (it must exist and be the user's).
MAX_ORDERS_PER_TASK = 10
DEFAULT_APPROVAL_THRESHOLD = Decimal("50.00")
# Approving a refund above this takes a second, deliberate click (the write's `confirm`).
CONFIRM_ABOVE = Decimal("1000.00")
READ_TIMEOUT_S = 5.0
REFUND_TIMEOUT_S = 3.0
MODEL_NAME = "scripted-refund-v1"

INSTRUCTIONS = """\
You handle refund requests for orders. Read the order and the current refund policy before you
refund anything. Refund only what the policy allows: a delivered order, inside the policy's
refund window, at most its refundable balance, in the order's currency. Confirm a refund by its
status before you say it is done."""


# --- dependencies --------------------------------------------------------------------------


@dataclass(frozen=True)
class RefundServices:
    """The agent's dependencies: where the reference services listen, and one HTTP client."""

    endpoints: ServiceEndpoints
    http: httpx.Client


Ctx = ToolContext[RefundServices]


@contextmanager
def connect(endpoints: ServiceEndpoints) -> Iterator[RefundServices]:
    """The agent's dependencies on services that already run at `endpoints`."""
    with httpx.Client(verify=tls_context()) as http:
        yield RefundServices(endpoints, http)


def services_dir() -> Path:
    return loopwright_home() / "services"


@contextmanager
def open_services() -> Iterator[RefundServices]:
    """The services named by $LOOPWRIGHT_SERVICES, or started here (stopped on exit), on the
    data kept under LOOPWRIGHT_HOME/services."""
    with ExitStack() as stack:
        endpoints = ServiceEndpoints.from_env()
        if endpoints is None:
            endpoints = stack.enter_context(start_services(services_dir())).endpoints
        yield stack.enter_context(connect(endpoints))


@contextmanager
def shared_services() -> Iterator[dict[str, str]]:
    """What every instance serving the agent shares: the services named by
    $LOOPWRIGHT_SERVICES, or started here once (on the data kept under LOOPWRIGHT_HOME/
    services), as the environment that points each instance's `open_services` at them."""
    endpoints = ServiceEndpoints.from_env()
    if endpoints is not None:
        yield endpoints.to_env()
        return
    with start_services(services_dir()) as started:
        yield started.endpoints.to_env()


HEALTH_TIMEOUT_S = 0.5


def services_down(services: RefundServices) -> list[str]:
    """The reference services that do not answer their health check now (readiness)."""
    down = []
    for name, url in services.endpoints.model_dump().items():
        try:
            services.http.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S).raise_for_status()
        except httpx.HTTPError:
            down.append(name)
    return down


@contextmanager
def fresh_services() -> Iterator[RefundServices]:
    """Like `open_services`, on freshly seeded data when it starts the services itself."""
    if ServiceEndpoints.from_env() is None:
        shutil.rmtree(services_dir(), ignore_errors=True)
    with open_services() as services:
        yield services


# --- the business data ---------------------------------------------------------------------


class GetOrderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

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


class GetPolicyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Policy(BaseModel):
    name: str
    version: int
    window_days: int
    requires_delivery: bool
    approval_threshold: str = Field(pattern=MONEY)
    text: str
    created_at: datetime


class SubmitRefundArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

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


class GetRefundStatusArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    refund_id: str = Field(pattern=REFUND_ID)


def fetch_order(ctx: Ctx, order_id: str) -> Order:
    url = f"{ctx.deps.endpoints.orders}/orders/{order_id}"
    return Order.model_validate(read_json(ctx.deps.http, url, timeout=ctx.timeout(READ_TIMEOUT_S)))


def fetch_policy(ctx: Ctx) -> Policy:
    url = f"{ctx.deps.endpoints.policies}/policies/refunds"
    return Policy.model_validate(read_json(ctx.deps.http, url, timeout=ctx.timeout(READ_TIMEOUT_S)))


def fetch_refund(ctx: Ctx, refund_id: str) -> Refund:
    url = f"{ctx.deps.endpoints.payments}/refunds/{refund_id}"
    return Refund.model_validate(read_json(ctx.deps.http, url, timeout=ctx.timeout(READ_TIMEOUT_S)))


def _not_theirs(order_id: str, user_id: str) -> str:
    return f"order {order_id} is not an order of {user_id}"


# The reference business keeps the orders of one tenant's users: a principal of another tenant
# owns none of them, whatever its user id (the same id may be a user of two tenants).
ORDERS_TENANT = "default"


def _of_other_tenant(principal: Principal) -> str | None:
    if principal.tenant == ORDERS_TENANT:
        return None
    return (
        f"the orders service keeps the orders of tenant {ORDERS_TENANT!r}, not"
        f" {principal.tenant!r}: none is {principal.user_id}'s there"
    )


def owns_order(ctx: Ctx, order_id: str) -> None:
    """PermissionDenied unless the run's user owns the order (an unknown order answers the
    same: the existence of other users' orders is not disclosed)."""
    if (other := _of_other_tenant(ctx.user)) is not None:
        raise PermissionDenied(other)
    try:
        order = fetch_order(ctx, order_id)
    except ToolFault as fault:
        if fault.code == "order_not_found":
            raise PermissionDenied(_not_theirs(order_id, ctx.user.user_id)) from fault
        raise
    if order.owner != ctx.user.user_id:
        raise PermissionDenied(_not_theirs(order_id, ctx.user.user_id))


def order_resource(args: Any) -> set[str]:
    return {f"order:{args.order_id}"}


def order_version(ctx: Ctx, args: Any) -> dict[str, str]:
    return {f"order:{args.order_id}": str(fetch_order(ctx, args.order_id).version)}


# --- who the agent acts for, and on what ---------------------------------------------------


def _user(deps: RefundServices, user_id: str) -> dict[str, Any] | None:
    url = f"{deps.endpoints.orders}/users/{quote(user_id, safe='')}"
    response = deps.http.get(url, timeout=READ_TIMEOUT_S)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    user: dict[str, Any] = response.json()
    return user


def principal(deps: RefundServices, user_id: str) -> Principal:
    """A user the orders service knows, with the roles it records."""
    user = _user(deps, user_id)
    if user is None:
        raise TaskRefused(f"unknown user {user_id!r}")
    return Principal(user_id=user_id, roles=tuple(user.get("roles", ["customer"])))


def boundary(deps: RefundServices, principal: Principal, task: str) -> set[str]:
    """The orders the task names; each must exist and belong to the user (of the tenant whose
    orders the service keeps)."""
    orders = sorted(set(ORDER_IN_TEXT.findall(task)))
    if orders and (other := _of_other_tenant(principal)) is not None:
        raise TaskRefused(other)
    if len(orders) > MAX_ORDERS_PER_TASK:
        raise TaskRefused(f"a task may name at most {MAX_ORDERS_PER_TASK} orders")
    for order_id in orders:
        response = deps.http.get(f"{deps.endpoints.orders}/orders/{order_id}", timeout=5.0)
        if response.status_code == 404:
            raise TaskRefused(f"unknown order {order_id!r}")
        response.raise_for_status()
        if response.json().get("owner") != principal.user_id:
            raise TaskRefused(_not_theirs(order_id, principal.user_id))
    return {f"order:{order_id}" for order_id in orders}


def is_approver(deps: RefundServices, user_id: str) -> bool:
    """The reference user directory (the orders service) says who holds the approver role."""
    try:
        user = _user(deps, user_id)
    except httpx.HTTPError:
        return False
    return user is not None and "approver" in user.get("roles", [])


# --- the business rules -------------------------------------------------------------------


def policy_breach(
    order: Order, policy: Policy, args: SubmitRefundArgs, now: datetime
) -> PreconditionFailed | None:
    """Which rule of the refund policy a refund of `args` breaks on these records at `now`, or
    None: delivered (if the policy asks), inside the window, in the order's currency, at most
    the refundable balance. Pure: the precondition judges current data with it, the approval's
    facts what the run read."""
    if policy.requires_delivery and (order.status != "delivered" or order.delivered_at is None):
        return PreconditionFailed(
            "not_delivered", f"order {order.order_id} has not been delivered ({order.status})"
        )
    if order.delivered_at is not None:
        delivered = order.delivered_at
        delivered = delivered if delivered.tzinfo else delivered.replace(tzinfo=UTC)
        if now - delivered > timedelta(days=policy.window_days):
            return PreconditionFailed(
                "outside_refund_window",
                f"order {order.order_id} was delivered on {delivered.date().isoformat()}, "
                f"outside the {policy.window_days}-day window of policy v{policy.version}",
            )
    if args.currency != order.currency:
        return PreconditionFailed(
            "wrong_currency", f"order {order.order_id} is in {order.currency}, not {args.currency}"
        )
    if Decimal(args.amount) <= 0 or Decimal(args.amount) > Decimal(order.refundable):
        return PreconditionFailed(
            "amount_exceeds_refundable",
            f"{args.amount} {args.currency} is not within the {order.refundable} "
            f"{order.currency} left to refund on order {order.order_id}",
        )
    return None


def refund_policy_holds(ctx: Ctx, args: SubmitRefundArgs) -> None:
    """The refund policy, on the order and policy as they are now."""
    order, policy = fetch_order(ctx, args.order_id), fetch_policy(ctx)
    breach = policy_breach(order, policy, args, datetime.now(UTC))
    if breach is not None:
        raise breach


def refunds_done(ctx: Ctx, task: str, writes: list[Action]) -> bool:
    """A task that asks for a refund is done when every order of the user's it names that the
    policy lets refund now got its refund in this run. An order still eligible and refundable
    without one (the model gave up, a person rejected it, payments refused it) is a task not
    done; an order the policy does not let refund needed none. Fails closed: a lookup that
    fails is not done."""
    if not ASKS_FOR_A_REFUND.search(task):
        return True
    refunded = {
        a.args["order_id"]
        for a in writes
        if a.tool == "submit_refund" and a.status == ActionStatus.SUCCEEDED
    }
    for resource in ctx.user.scope:
        order_id = resource.removeprefix("order:")
        if order_id in refunded:
            continue
        try:
            order = fetch_order(ctx, order_id)
            if order.owner != ctx.user.user_id:
                continue  # not the user's to have refunded
            owed = SubmitRefundArgs(
                order_id=order_id,
                amount=order.refundable,
                currency=order.currency,
                reason="completion check",
            )
            refund_policy_holds(ctx, owed)
        except PreconditionFailed:
            continue
        except ToolFault:
            return False
        return False
    return True


# A sentence that says a refund happened: "I have refunded O-42", "O-43 was refunded", "the
# refund of 100.00 USD was submitted successfully", "Refunded 20.00 USD". One that negates it
# ("could not be refunded", "no refund was made") says the opposite and claims nothing.
_CLAIMS_A_REFUND = re.compile(
    r"\b(?:I|we)\s+(?:have\s+|'ve\s+|just\s+)?refunded\b"
    r"|\b(?:has|have|had)\s+been\s+refunded\b|\b(?:was|were|is)\s+(?:successfully\s+)?refunded\b"
    r"|\bsuccessfully\s+refunded\b|\brefunded\s+(?:\$?\d|[A-Z]{3}\s*\d)"
    r"|\brefund\b(?:[^.!?\n]|\.(?=\d)){0,80}?\b(?:was|has\s+been|have\s+been|is)\s+(?:successfully\s+)?"
    r"(?:submitted|issued|processed|completed|sent|confirmed|made|done|succeeded|created)\b",
    re.IGNORECASE,
)
_NEGATED = re.compile(
    r"\b(?:not|no|never|cannot|unable|failed|refused|ineligible)\b|n't\b", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_ORDER_ID = re.compile(r"\bO-\d+\b")
_MONEY = re.compile(r"\b\d+\.\d{2}\b")
# A claim is quoted back this long at most.
QUOTED_CLAIM_CHARS = 80


def refund_claims(ctx: Ctx | None, answer: str, writes: list[Action]) -> list[str]:
    """The refunds the answer claims that the run's journal does not hold, in words: a refund
    claimed where no refund of this run succeeded, or one of an order or an amount no
    succeeded refund has. The ids a refund produces (`rf_...`) are the runtime's to check.
    Judged on the journal alone: `ctx` is not needed (a benchmark judges endings with None)."""
    refunds = [
        a for a in writes if a.tool == "submit_refund" and a.status == ActionStatus.SUCCEEDED
    ]
    orders = {str(a.args["order_id"]) for a in refunds}
    amounts = {Decimal(str(a.args["amount"])) for a in refunds}
    false: list[str] = []
    for sentence in _SENTENCE_END.split(answer):
        if not _CLAIMS_A_REFUND.search(sentence) or _NEGATED.search(sentence):
            continue
        quoted = sentence.strip()[:QUOTED_CLAIM_CHARS]
        if not refunds:
            false.append(f"a refund ({quoted!r}) where this run made none")
            continue
        false += [
            f"a refund of order {o} ({quoted!r})"
            for o in _ORDER_ID.findall(sentence)
            if o not in orders
        ]
        false += [
            f"a refund of {m} ({quoted!r})"
            for m in _MONEY.findall(sentence)
            if Decimal(m) not in amounts
        ]
    return list(dict.fromkeys(false))


agent: Agent[RefundServices] = Agent(
    "refunds",
    version="1",
    instructions=INSTRUCTIONS,
    deps=open_services,
    model=lambda: ScriptedChatModel(policy=RefundProcedure(), model_name=MODEL_NAME),
    boundary=boundary,
    principal=principal,
    approvers=is_approver,
    done=refunds_done,
    claims=refund_claims,
    demo=Demo(
        task="Check whether order O-42 can be refunded and refund it if so.",
        user="u-1",
        approver="a-1",
        deps=fresh_services,
    ),
    shared=shared_services,
    health=services_down,
    # "Refund each eligible order of mine": one program over the orders instead of a model step
    # per order; each refund in it is still checked, approved, journaled and reconciled.
    programs=Programs(tools=("get_order", "get_policy", "submit_refund", "get_refund_status")),
    # How to do that, loaded by the model when a task asks for it (skills/*/SKILL.md).
    skills=Path(__file__).parent / "skills",
    # What `loopwright faults` proves it on: the demo's task, each trial on fresh services, which
    # a crash trial's processes reach through $LOOPWRIGHT_SERVICES.
    scenarios=[
        Scenario(
            task="Check whether order O-42 can be refunded and refund it if so.",
            user="u-1",
            approver="a-1",
            deps=fresh_services,
            env=lambda services: services.endpoints.to_env(),
        )
    ],
)


# --- reads ---------------------------------------------------------------------------------


@agent.read(resources=order_resource, authorize=lambda ctx, a: owns_order(ctx, a.order_id))
def get_order(ctx: Ctx, args: GetOrderArgs) -> Order:
    """Read an order: status, amount, refundable balance, delivery date, version."""
    return fetch_order(ctx, args.order_id)


@agent.read
def get_policy(ctx: Ctx, args: GetPolicyArgs) -> Policy:
    """Read the current refund policy document."""
    return fetch_policy(ctx)


def _owns_refund(ctx: Ctx, args: GetRefundStatusArgs) -> None:
    owns_order(ctx, fetch_refund(ctx, args.refund_id).order_id)


@agent.read(
    authorize=_owns_refund,
    poll_after=lambda result: 1.0 if result.get("status") == "processing" else None,
)
def get_refund_status(ctx: Ctx, args: GetRefundStatusArgs) -> Refund:
    """Read a refund by its refund id."""
    return fetch_refund(ctx, args.refund_id)


# --- the write -----------------------------------------------------------------------------


def refund_needs_approval(ctx: Ctx, args: SubmitRefundArgs) -> str | Literal[False]:
    """A refund above the policy's approval threshold needs a person, the reason naming both;
    False for one at or below it (any other answer asks for a person)."""
    try:
        policy = fetch_policy(ctx)
        threshold, whose = Decimal(policy.approval_threshold), f"refund policy v{policy.version}"
    except ToolFault:  # fail closed: the reference threshold applies
        threshold, whose = DEFAULT_APPROVAL_THRESHOLD, "reference policy (the policy is unreadable)"
    if Decimal(args.amount) <= threshold:
        return False
    return f"{args.amount} {args.currency} is above the approval threshold of {threshold} ({whose})"


def _refund_by_key(ctx: Ctx, key: str) -> httpx.Response:
    url = f"{ctx.deps.endpoints.payments}/refunds/by-key/{quote(key, safe='')}"
    return ctx.deps.http.get(url, timeout=ctx.timeout(READ_TIMEOUT_S))


def reconcile_refund(ctx: Ctx, action: Action) -> ReconcileResult:
    """Ask the payments service about the intent key: the only source of truth for the outcome."""
    try:
        response = _refund_by_key(ctx, action.intent_key)
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


def verify_refund(ctx: Ctx, action: Action) -> VerifyResult:
    """A refund is done when payments has it as succeeded with the journaled parameters."""
    try:
        response = _refund_by_key(ctx, action.intent_key)
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


def _compensation(action: Action) -> str:
    return (
        f"refund {(action.outcome or {}).get('refund_id')} of {action.args['amount']} "
        f"{action.args['currency']} cannot be undone by the runtime; reversing it means charging "
        f"the customer of order {action.args['order_id']} again, which a person must decide"
    )


def money(amount: str, currency: str) -> str:
    return f"{Decimal(amount):,.2f} {currency}"


def _newest(
    evidence: Sequence[Evidence], source: str, resource: str | None = None
) -> Evidence | None:
    for item in reversed(evidence):
        if item.source == source and (resource is None or resource in item.resources):
            return item
    return None


def refund_facts(args: SubmitRefundArgs, evidence: Sequence[Evidence]) -> list[tuple[str, str]]:
    """What an approver decides a refund from, as the run read it: the order's total, what is
    left to refund, its delivery, and the policy's verdict on this very refund (judged when the
    order was read). A record the run did not read is said to be unread, never looked up here:
    the approver sees what the agent relied on."""
    order_read = _newest(evidence, "get_order", f"order:{args.order_id}")
    policy_read = _newest(evidence, "get_policy")
    if order_read is None:
        facts = [("Order", f"{args.order_id}: not read by the run")]
    else:
        order = Order.model_validate(order_read.content)
        delivered = order.delivered_at.date().isoformat() if order.delivered_at else "no"
        facts = [
            ("Order total", money(order.amount, order.currency)),
            ("Refunded so far", money(order.refunded, order.currency)),
            ("Refundable", money(order.refundable, order.currency)),
            ("Delivered", f"{delivered} (status {order.status})"),
        ]
    if policy_read is None:
        facts.append(("Policy", "not read by the run"))
    elif order_read is not None:
        policy = Policy.model_validate(policy_read.content)
        breach = policy_breach(order, policy, args, order_read.observed_at)
        verdict = "allows this refund" if breach is None else f"{breach.code}: {breach.detail}"
        facts.append(
            (
                "Policy",
                f"{policy.name} v{policy.version}, {policy.window_days}-day window: {verdict}",
            )
        )
    return facts


@agent.write(
    intent=lambda run_id, args: f"refund:{run_id}:{args.order_id}",
    guarantee=Guarantee.IDEMPOTENT_BY_KEY,
    reconcile=reconcile_refund,
    verify=verify_refund,
    needs_approval=refund_needs_approval,
    preconditions=refund_policy_holds,
    current_versions=order_version,
    compensation=_compensation,
    summary=lambda args: f"Refund {args.amount} {args.currency} to order {args.order_id}",
    facts=refund_facts,
    confirm=lambda args: Decimal(args.amount) > CONFIRM_ABOVE,
    produces=["refund_id"],
    editable=["amount", "reason"],
    resources=order_resource,
    authorize=lambda ctx, a: owns_order(ctx, a.order_id),
    timeout_s=REFUND_TIMEOUT_S,
)
def submit_refund(ctx: Ctx, args: SubmitRefundArgs, intent_key: str) -> Refund:
    """Refund an amount of an order to the customer. Moves money."""
    body = {
        "order_id": args.order_id,
        "amount": args.amount,
        "currency": args.currency,
        "reason": args.reason,
    }
    answer = write_json(
        ctx.deps.http,
        f"{ctx.deps.endpoints.payments}/refunds",
        body,
        idempotency_key=intent_key,
        timeout=ctx.timeout(REFUND_TIMEOUT_S),
    )
    refund = Refund.model_validate(answer)
    if refund.status != "succeeded":
        # Accepted but not final: only the payments service can say later how it ended.
        raise OutcomeUnknown(f"refund {refund.refund_id} is {refund.status}")
    return refund


def task_scope(task: str) -> tuple[str, ...]:
    """The resources a refund task names (without looking anything up): for tests and tools
    that build a principal themselves."""
    return tuple(sorted({f"order:{order_id}" for order_id in ORDER_IN_TEXT.findall(task)}))
