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

from loopwright.graph.state import Action, digest
from loopwright.models.scripted import Decision, ScriptedChatModel
from loopwright.runner import Runner, open_runner
from loopwright.tools.contract import (
    Effect,
    Guarantee,
    OutcomeUnknown,
    ToolArgs,
    ToolContract,
    ToolEnv,
    VerifyResult,
)
from loopwright.tools.registry import ToolRegistry
from loopwright_refunds.services.endpoints import ServiceEndpoints

CARD = "4111111111111111"
TASK = f"Pay 10.00 for order O-42 with card {CARD}."
# Nothing here calls a business service: runs need no services at all.
NO_SERVICES = ServiceEndpoints(orders="", policies="", payments="")


class PayArgs(ToolArgs):
    order_id: str = Field(pattern=r"^O-\d{1,9}$")
    amount: str = Field(pattern=r"^\d{1,9}\.\d{2}$")
    card_number: str = Field(pattern=r"^\d{16}$")


class Payment(BaseModel):
    payment_id: str
    card_number: str
    status: str


def _charge(_env: ToolEnv, args: PayArgs, key: str | None) -> dict[str, Any]:
    return {"payment_id": f"pay_{digest(key)[:8]}", "card_number": args.card_number, "status": "ok"}


def _verify(_env: ToolEnv, action: Action) -> VerifyResult:
    return VerifyResult(verified=True, facts={"payment_id": (action.outcome or {})["payment_id"]})


def _lost(_env: ToolEnv, _args: PayArgs, _key: str | None) -> dict[str, Any]:
    raise OutcomeUnknown("the card network did not answer")


PAY_WITH_CARD = ToolContract(
    name="pay_with_card",
    description="Charge a card for an order.",
    args_model=PayArgs,
    output_model=Payment,
    effect=Effect.WRITE,
    run=_charge,
    intent_key=lambda run_id, args: f"pay:{run_id}:{args.order_id}",
    verify=_verify,
    guarantee=Guarantee.QUERYABLE,
    sensitive_fields=frozenset({"card_number"}),
)
LOST_PAYMENT = dataclasses.replace(PAY_WITH_CARD, run=_lost)


def pays_by_card(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    """Charge the card once, then say so, card number and all."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        args = {"order_id": "O-42", "amount": "10.00", "card_number": CARD}
        return Decision(tool_calls=[("pay_with_card", args)])
    return Decision(content=f"Charged card {CARD} for order O-42.")


def card_runner(database_url: str, contract: ToolContract) -> AbstractContextManager[Runner]:
    return open_runner(
        database_url,
        NO_SERVICES,
        model=ScriptedChatModel(policy=pays_by_card),
        tools=ToolRegistry([contract]),
    )
