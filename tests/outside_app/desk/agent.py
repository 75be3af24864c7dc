"""The booking desk agent: book the slot a guest asks for, then confirm it.

`book` writes to a system without idempotency keys: its outcome, when lost, is reconciled by
comparing the slot with the pre-image journaled before the send. `confirm` is idempotent by key
and needs a person's approval.
"""

from __future__ import annotations

import re
from typing import Any

from models import Book, Booking, Confirmation, Slot, SlotRef
from tools.desk_client import Desk, fetch_slot, open_desk

from graph import book_then_confirm
from loopwright import (
    Action,
    Agent,
    Guarantee,
    Principal,
    ReconcileResult,
    ReconcileStatus,
    Scenario,
    ScriptedChatModel,
    TaskRefused,
    ToolContext,
    VerifyResult,
    write_json,
)

SLOTS = re.compile(r"\bslot ([0-9]{1,4})\b")


def slots_named(deps: Desk, principal: Principal, task: str) -> set[str]:
    if principal.user_id not in task:
        raise TaskRefused(f"{principal.user_id} may only book for themselves")
    return {f"slot:{slot}" for slot in SLOTS.findall(task)}


agent: Agent[Desk] = Agent(
    "desk",
    version="1",
    instructions="Book the slot the guest asks for, then confirm the booking.",
    deps=open_desk,
    model=lambda: ScriptedChatModel(policy=book_then_confirm),
    boundary=slots_named,
    approvers={"boss"},
)


def on_slot(args: Any) -> set[str]:
    return {f"slot:{args.slot}"}


@agent.read(resources=on_slot)
def get_slot(ctx: ToolContext[Desk], args: SlotRef) -> Slot:
    """Read a slot and its bookings."""
    return fetch_slot(ctx, args.slot)


def before_booking(ctx: ToolContext[Desk], args: Book) -> dict[str, Any]:
    return {"version": fetch_slot(ctx, args.slot).version}


def booking_happened(
    ctx: ToolContext[Desk], action: Action, pre_image: dict[str, Any] | None
) -> ReconcileResult:
    if pre_image is None:
        return ReconcileResult(ReconcileStatus.UNCONFIRMABLE, detail="no pre-image")
    now = fetch_slot(ctx, action.args["slot"])
    new = now.bookings[int(pre_image["version"]) :]
    if not new:
        return ReconcileResult(ReconcileStatus.ABSENT, detail="the slot is as it was")
    if [b.guest for b in new] == [action.args["guest"]]:
        return ReconcileResult(ReconcileStatus.APPLIED, outcome=new[0].model_dump())
    return ReconcileResult(ReconcileStatus.UNCONFIRMABLE, detail=f"{len(new)} new bookings")


def booking_is_there(ctx: ToolContext[Desk], action: Action) -> VerifyResult:
    ours = Booking.model_validate(action.outcome)
    if ours in fetch_slot(ctx, ours.slot).bookings:
        return VerifyResult(True, {"booking_id": ours.booking_id})
    return VerifyResult(False, {}, f"{ours.booking_id} is not on slot {ours.slot}")


@agent.write(
    intent=lambda run_id, args: f"book:{run_id}:{args.slot}",
    guarantee=Guarantee.QUERYABLE,
    pre_image=before_booking,
    reconcile=booking_happened,
    verify=booking_is_there,
    needs_approval=False,
    resources=on_slot,
    produces=["booking_id"],
    timeout_s=1.0,
)
def book(ctx: ToolContext[Desk], args: Book, intent_key: str) -> Booking:
    """Book a slot for a guest."""
    url = f"{ctx.deps.url}/slots/{args.slot}/bookings"
    answer = write_json(
        ctx.deps.http, url, {"guest": args.guest}, idempotency_key=None, timeout=ctx.timeout(1.0)
    )
    return Booking.model_validate(answer)


def confirmation_by_key(ctx: ToolContext[Desk], action: Action) -> ReconcileResult:
    response = ctx.deps.http.get(f"{ctx.deps.url}/confirmations/by-key/{action.intent_key}")
    if response.status_code == 404:
        return ReconcileResult(ReconcileStatus.ABSENT, detail="no confirmation under this key")
    response.raise_for_status()
    return ReconcileResult(ReconcileStatus.APPLIED, outcome=response.json())


@agent.write(
    intent=lambda run_id, args: f"confirm:{run_id}:{args.slot}",
    guarantee=Guarantee.IDEMPOTENT_BY_KEY,
    reconcile=confirmation_by_key,
    resources=on_slot,
    produces=["confirmation_id"],
    timeout_s=1.0,
)
def confirm(ctx: ToolContext[Desk], args: Book, intent_key: str) -> Confirmation:
    """Confirm a guest's booking of a slot."""
    answer = write_json(
        ctx.deps.http,
        f"{ctx.deps.url}/confirmations",
        {"slot": args.slot, "guest": args.guest},
        idempotency_key=intent_key,
        timeout=ctx.timeout(1.0),
    )
    return Confirmation.model_validate(answer)


def effects(ctx: ToolContext[Desk], action: Action, before: dict[str, Any] | None) -> int:
    """How many times an intent happened: the bookings a slot gained since the pre-image of
    the first send (a keyless write's second one shows), a confirmation found by its key."""
    if action.tool == "book":
        assert before is not None
        return len(fetch_slot(ctx, action.args["slot"]).bookings[int(before["version"]) :])
    return int(confirmation_by_key(ctx, action).status is ReconcileStatus.APPLIED)


# What `loopwright faults` proves the desk on (every trial on the same slot: each is judged by
# what it added).
agent = agent.replace(
    scenarios=[Scenario("Book slot 9 for g-1.", "g-1", approver="boss", effects=effects)]
)

# The application's second agent: the desk's runs are not its to advance, nor its runs the desk's.
lookout = agent.replace(name="lookout")
