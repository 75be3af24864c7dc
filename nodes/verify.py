"""verify: "completed" means verified in the business system, not "the model said so".

When the model gives a final answer, every write the run made is checked against the business
system (the contract's verify: the refund exists under the intent key, succeeded, with the
journaled parameters), and every business identifier the answer cites must be one of those
verified facts. Anything else goes back to the model as feedback and the loop continues (within
its budget).
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime

from loopwright.graph.context import RunContext
from loopwright.graph.crashpoints import crash_point
from loopwright.graph.state import ActionStatus, Phase, RunState, StopReason, Verification
from loopwright.graph.views import messages_of
from loopwright.tools.contract import Effect

CITED_IDS = re.compile(r"\brf_[0-9]+\b")


def check_outcome(state: RunState, context: RunContext) -> Verification:
    facts: dict[str, Any] = {"writes": []}
    problems: list[str] = []
    verified_ids: set[str] = set()
    for action in context.journal.for_run(state["run_id"]):
        contract = context.tools.get(action.tool)
        if contract is None or contract.effect is not Effect.WRITE:
            continue
        if action.status in (
            ActionStatus.DISPATCHED,
            ActionStatus.UNKNOWN,
            ActionStatus.RECONCILING,
        ):
            problems.append(f"{action.action_id} is {action.status}: its outcome is not confirmed")
        if action.status is not ActionStatus.SUCCEEDED:
            continue
        if contract.verify is None:
            problems.append(f"{action.tool} declares no way to verify its outcome")
            continue
        result = contract.verify(context.env, action)
        if not result.verified:
            problems.append(result.problem)
            continue
        facts["writes"].append({"action_id": action.action_id, "tool": action.tool, **result.facts})
        verified_ids.update(str(v) for v in result.facts.values())
    final = messages_of(state)[-1]
    answer = final.text if isinstance(final, AIMessage) else ""
    for cited in sorted(set(CITED_IDS.findall(answer)) - verified_ids):
        problems.append(f"the answer cites {cited}, which no verified action of this run produced")
    facts["answer"] = answer
    summary = (
        "; ".join(
            f"{w['tool']} {w.get('refund_id', '')} order {w.get('order_id', '')} {w.get('amount', '')} {w.get('currency', '')}".strip()
            for w in facts["writes"]
        )
        or "no business effect"
    )
    return Verification(verified=not problems, summary=summary, facts=facts, problems=problems)


def verify(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:verify:start")
    verification = check_outcome(state, runtime.context)
    if verification.verified:
        return {
            "verification": verification.model_dump(mode="json"),
            "phase": Phase.COMPLETED.value,
            "stop_reason": StopReason.COMPLETED.value,
        }
    return {
        "verification": verification.model_dump(mode="json"),
        "feedback": verification.problems,
        "phase": Phase.READY.value,
    }
