"""verify: "completed" means verified in the business system, not "the model said so".

When the model gives a final answer, every write the run made is checked against the business
system (the contract's verify: e.g. the booking exists under the intent key, succeeded, with
the journaled parameters). The answer may cite an identifier of the kinds the agent's writes
produce (each write contract declares which, with a pattern) only where the run can back it: a
write of this run produced it and was verified, a tool observed it, or the task itself names
it. Anything else goes back to the model as feedback and the loop continues (within its
budget).
"""

from __future__ import annotations

import json
import re
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime

from loopwright.graph.context import RunContext
from loopwright.graph.crashpoints import crash_point
from loopwright.graph.state import ActionStatus, Phase, RunState, StopReason, Verification
from loopwright.graph.views import messages_of
from loopwright.tools.contract import Effect

# An identifier quoted back in a problem is cut to this length (a model can invent huge ones).
QUOTED_ID_CHARS = 64


def _observed_text(state: RunState) -> str:
    """Everything the run was told as data: the task and every observation, as one text."""
    contents = [json.dumps(e.get("content"), default=str) for e in state["evidence"]]
    return "\n".join([state["task"], *contents])


def check_outcome(state: RunState, context: RunContext) -> Verification:
    ctx = context.tool_context(state)
    facts: dict[str, Any] = {"writes": []}
    problems: list[str] = []
    backed: set[str] = set()
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
        result = contract.verify(ctx, action)
        if not result.verified:
            problems.append(result.problem)
            continue
        produced = contract.produced_ids(action.outcome)
        args = contract.args_model.model_validate(action.args)
        facts["writes"].append(
            {
                "action_id": action.action_id,
                "tool": action.tool,
                "summary": contract.describe(args),
                "produced": produced,
                **result.facts,
            }
        )
        backed.update(produced.values())
        backed.update(str(v) for v in result.facts.values())
    final = messages_of(state)[-1]
    answer = final.text if isinstance(final, AIMessage) else ""
    patterns = [p for c in context.tools if c.effect is Effect.WRITE for p in c.id_patterns()]
    observed = _ids(patterns, _observed_text(state))
    for claim in sorted(_ids(patterns, answer) - backed - observed):
        problems.append(
            f"the answer cites {claim[:QUOTED_ID_CHARS]!r}, which no verified write of this run "
            "produced and nothing the run observed holds"
        )
    facts["answer"] = answer
    summary = "; ".join(_described(w) for w in facts["writes"]) or "no business effect"
    return Verification(verified=not problems, summary=summary, facts=facts, problems=problems)


def _ids(patterns: list[re.Pattern[str]], text: str) -> set[str]:
    return {match.group(0) for pattern in patterns for match in pattern.finditer(text)}


def _described(write: dict[str, Any]) -> str:
    produced = ", ".join(f"{k} {v}" for k, v in write["produced"].items())
    return f"{write['summary']} ({produced})" if produced else write["summary"]


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
