"""The refund agent with store credit, whose keyless write is re-sent after a short deadline:
what tests/test_keyless_resend.py runs, in this process and in the ones it crashes; and the
same credit declared wrongly (idempotent by key), which tests/test_faults.py proves it on."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import httpx
from langchain_core.messages import BaseMessage, ToolMessage

from loopwright import (
    Action,
    Decision,
    Guarantee,
    ResendAfterDeadline,
    Scenario,
    ScriptedChatModel,
    ToolContext,
)
from loopwright.core import tls
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.store_credit import STORE_CREDIT

TASK = "Give 20.00 USD store credit for order O-43."
CREDIT = {"order_id": "O-43", "amount": "20.00", "currency": "USD", "note": "late delivery"}
DEADLINE = ResendAfterDeadline(seconds=6.0, skew_s=0.5)


def credit_once(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    """Ask for the credit once; then report what the runtime said."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return Decision(tool_calls=[("issue_store_credit", CREDIT)])
    return Decision(content=f"Store credit result: {results[-1].status}")


def with_resend(resend: ResendAfterDeadline | None) -> Any:
    credit = dataclasses.replace(STORE_CREDIT, resend=resend)
    return refunds.replace(
        tools=[*refunds.tools, credit],
        model=lambda: ScriptedChatModel(policy=credit_once),
    )


agent = with_resend(DEADLINE)


def credits_since(ctx: ToolContext[Any], action: Action, before: dict[str, Any] | None) -> int:
    """Credits the account gained since the pre-image of the intent's first send."""
    assert before is not None
    account = httpx.get(
        f"{ctx.deps.endpoints.payments}/credits/{before['user_id']}", verify=tls.context()
    ).json()
    return int(account["version"]) - int(before["version"])


CREDIT_SCENARIO = Scenario(task=TASK, user="u-1", approver="a-1", effects=credits_since)

# The credit declared idempotent by key, which the credits service is not: what `loopwright
# faults` must catch (a request delivered late or twice credits twice).
wrongly_keyed = agent.replace(
    tools=[
        *(c for c in agent.tools if c.name != STORE_CREDIT.name),
        dataclasses.replace(STORE_CREDIT, guarantee=Guarantee.IDEMPOTENT_BY_KEY, resend=None),
    ],
    scenarios=[CREDIT_SCENARIO],
)
