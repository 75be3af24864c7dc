"""A test-only write tool with a sensitive argument (a card number), run without any service.

`PAY_WITH_CARD` charges in-process and its "business system" echoes the card back in the
outcome; `LOST_PAYMENT` never learns its outcome and cannot be asked, so the run escalates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel, Field

from loopwright import (
    Action,
    Agent,
    Decision,
    Effect,
    Guarantee,
    OutcomeUnknown,
    Runner,
    ScriptedChatModel,
    ToolContext,
    ToolContract,
    VerifyResult,
    open_runner,
)
from loopwright.core.state import digest
from loopwright.tools.contract import ToolArgs

CARD = "4111111111111111"
TASK = f"Pay 10.00 for order O-42 with card {CARD}."


class PayArgs(ToolArgs):
    order_id: str = Field(pattern=r"^O-\d{1,9}$")
    amount: str = Field(pattern=r"^\d{1,9}\.\d{2}$")
    card_number: str = Field(pattern=r"^\d{16}$")


class Payment(BaseModel):
    payment_id: str
    card_number: str
    status: str


def _charge(_ctx: ToolContext[None], args: PayArgs, key: str | None) -> dict[str, Any]:
    return {"payment_id": f"pay_{digest(key)[:8]}", "card_number": args.card_number, "status": "ok"}


def _verify(_ctx: ToolContext[None], action: Action) -> VerifyResult:
    return VerifyResult(verified=True, facts={"payment_id": (action.outcome or {})["payment_id"]})


def _lost(_ctx: ToolContext[None], _args: PayArgs, _key: str | None) -> dict[str, Any]:
    raise OutcomeUnknown("the card network did not answer")


PAY_WITH_CARD = ToolContract(
    name="pay_with_card",
    description="Charge a card for an order.",
    args_model=PayArgs,
    output_model=Payment,
    effect=Effect.WRITE,
    run=_charge,
    intent=lambda run_id, args: f"pay:{run_id}:{args.order_id}",
    verify=_verify,
    # The card network cannot be asked about a charge: an unknown one goes to a person.
    guarantee=Guarantee.NONE,
    needs_approval=False,
    sensitive={"card_number"},
)
LOST_PAYMENT = dataclasses.replace(PAY_WITH_CARD, run=_lost)


def pays_by_card(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    """Charge the card once, then say so, card number and all."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        args = {"order_id": "O-42", "amount": "10.00", "card_number": CARD}
        return Decision(tool_calls=[("pay_with_card", args)])
    return Decision(content=f"Charged card {CARD} for order O-42.")


def card_agent(contract: ToolContract) -> Agent[None]:
    """An agent with the one card tool. It declares no resources, so it needs no boundary."""
    return Agent(
        "cards",
        instructions="Charge cards for orders when asked.",
        tools=[contract],
        model=ScriptedChatModel(policy=pays_by_card),
    )


def card_runner(database_url: str, contract: ToolContract) -> AbstractContextManager[Runner]:
    # Nothing here calls a business service: the agent has no dependencies at all.
    return open_runner(database_url, card_agent(contract), deps=None)


# For commands in a new process (`--agent tests.card_payments:paying`).
paying = card_agent(PAY_WITH_CARD)
