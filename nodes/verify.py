"""verify: "completed" means the task's effects happened, verified in the business system.

When the model gives a final answer, the run's writes are checked:

* every write that succeeded is checked against the business system (the contract's verify:
  e.g. the booking exists under the intent key, with the journaled parameters). A write whose
  contract declares it replaces another tool's writes (`replaces`, e.g. a status set twice)
  supersedes an earlier one on a resource both touch: the latest is checked against what the
  business system holds now, the earlier ones by their own recorded outcome (the run's final
  intended state, not every write against today's state); writes that merely touch one
  resource are each verified;
* a write the run planned that did not happen (failed, rejected by an approver or by the
  downstream, cancelled, escalated) keeps the task from being done, unless the agent's
  completion check (`Agent(done=...)`) says it is done without it;
* the answer may cite an identifier of the kinds the agent's writes produce (each write contract
  declares which, with a pattern) only where the run can back it: a write of this run produced
  it and was verified, a tool observed it, or the task itself names it.

* a write call refused by a rule before it was journaled (a business precondition, the
  task's boundary) is named in words; without the agent's completion check, a run whose writes
  were all refused (none succeeded) is not done;
* the answer may not claim an effect the journal does not hold: the agent's claim check
  (`Agent(claims=...)`) names each such claim.

Anything else goes back to the model as feedback. An answer refused twice in a row ends the
run INCOMPLETE: `not_done` naming the writes that did not happen, the rules that refused, the
false claims; or `no_progress`. Except where the business state speaks for itself: when the task
is done and every write it made is verified, and the only fault of the answer is its form (a
call written as text), the run completes with an answer written from the journal; the model's
text stays in the history and in `facts["model_answer"]`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime
from pydantic import ValidationError

from loopwright.graph.context import RunContext
from loopwright.graph.crashpoints import crash_point
from loopwright.graph.state import (
    UNRESOLVED_STATUSES,
    Action,
    ActionStatus,
    Phase,
    RunState,
    StopReason,
    Verification,
)
from loopwright.graph.text import storable, validation_problems
from loopwright.graph.views import (
    evidence_of,
    latest_per_intent,
    messages_of,
    not_done,
    rule_refusals,
    stop,
    why_not,
)
from loopwright.tools.contract import Effect

# An identifier quoted back in a problem is cut to this length (a model can invent huge ones).
QUOTED_ID_CHARS = 64
# Final answers refused in a row before the run stops: told once, stopped on the second.
MAX_REFUSED_ANSWERS = 2


def _observed_text(state: RunState) -> str:
    """Everything the run was told as data: the task and every observation, as one text."""
    contents = [json.dumps(e.content, default=str) for e in evidence_of(state)]
    return "\n".join([state["task"], *contents])


def _superseded(writes: list[Action], context: RunContext) -> dict[str, str]:
    """Succeeded writes a later succeeded write of the run replaces: action id -> the action
    that replaces it. A write replaces an earlier one only where its contract declares so
    (`replaces` names the earlier one's tool) and the two touch a resource in common: touching
    the same resource alone is no replacement (a credit and a close of one ticket are two
    effects, each verified)."""
    later: dict[str, str] = {}
    # resource -> the later writes touching it, the latest first: (action id, what it replaces)
    seen: dict[str, list[tuple[str, frozenset[str]]]] = {}
    for action in reversed(writes):
        contract = context.tools.get(action.tool)
        if contract is None or action.status is not ActionStatus.SUCCEEDED:
            continue
        try:
            touched = contract.resources_of(contract.args_model.model_validate(action.args))
        except ValueError:
            continue
        replacing = (
            action_id
            for resource in sorted(touched)
            for action_id, replaces in seen.get(resource, [])
            if action.tool in replaces
        )
        if superseder := next(replacing, None):
            later[action.action_id] = superseder
        for resource in touched:
            seen.setdefault(resource, []).append((action.action_id, frozenset(contract.replaces)))
    return later


def check_outcome(state: RunState, context: RunContext) -> Verification:
    ctx = context.tool_context(state)
    facts: dict[str, Any] = {"writes": [], "not_done": []}
    problems: list[str] = []
    backed: set[str] = set()
    writes = [
        a
        for a in context.journal.for_run(state["run_id"])
        if (c := context.tools.get(a.tool)) is None or c.effect is Effect.WRITE
    ]
    superseded = _superseded(writes, context)
    for action in writes:
        contract = context.tools.get(action.tool)
        if action.status in UNRESOLVED_STATUSES:
            problems.append(f"{action.action_id} is {action.status}: its outcome is not confirmed")
        if contract is None or action.status is not ActionStatus.SUCCEEDED:
            continue
        if action.action_id in superseded:
            result_facts = {"superseded_by": superseded[action.action_id]}
        elif contract.verify is None:
            problems.append(f"{action.tool} declares no way to verify its outcome")
            continue
        else:
            result = contract.verify(ctx, action)
            if not result.verified:
                problems.append(result.problem)
                continue
            result_facts = result.facts
        produced = contract.produced_ids(action.outcome)
        args = contract.args_model.model_validate(action.args)
        facts["writes"].append(
            {
                "action_id": action.action_id,
                "tool": action.tool,
                "summary": contract.describe(args),
                "produced": produced,
                **result_facts,
            }
        )
        backed.update(produced.values())
        backed.update(str(v) for v in result_facts.values())
    missing = not_done(writes)
    facts["not_done"] = [
        {"action_id": a.action_id, "tool": a.tool, "status": a.status, "why": why_not(a)}
        for a in missing
    ]
    write_tools = {c.name for c in context.tools if c.effect is Effect.WRITE}
    refused = rule_refusals(state, write_tools, {a.call_id for a in writes})
    facts["refused"] = refused
    latest = latest_per_intent(writes)
    check_failed = None
    if context.done is not None:
        try:
            done = context.done(ctx, state["task"], latest)
        except Exception as exc:  # the agent's own code: its failure is told, not the run's end
            done, check_failed = False, f"the agent's completion check failed: {_why(exc)}"
    else:
        succeeded = any(a.status is ActionStatus.SUCCEEDED for a in latest)
        done = not missing and (succeeded or not refused)
    facts["task_done"] = done
    if not done:
        problems += [f"not done: {why_not(a)}" for a in missing]
        problems += [f"not done: {r}" for r in refused]
        if check_failed is not None:
            problems.append(check_failed)
        elif not missing and not refused:
            problems.append(
                "the task is not done: the agent's completion check finds an effect it needs "
                "missing"
            )
    final = messages_of(state)[-1]
    answer = final.text if isinstance(final, AIMessage) else ""
    try:
        false_claims = context.claims(ctx, answer, latest) if context.claims is not None else []
    except Exception as exc:  # as for the completion check: told, not a crash of the run
        false_claims = [f"what the agent's claim check could not read ({_why(exc)})"]
    facts["false_claims"] = false_claims
    problems += [
        f"the answer claims {claim}, which the journal does not hold" for claim in false_claims
    ]
    patterns = [p for c in context.tools if c.effect is Effect.WRITE for p in c.id_patterns()]
    observed = _ids(patterns, _observed_text(state))
    for claim in sorted(_ids(patterns, answer) - backed - observed):
        problems.append(
            f"the answer cites {claim[:QUOTED_ID_CHARS]!r}, which no verified write of this run "
            "produced and nothing the run observed holds"
        )
    facts["answer_form"] = []
    if (called := _written_call(answer, [c.name for c in context.tools])) is not None:
        facts["answer_form"].append(
            f"the answer looks like a call of {called} written as text: call the tool, or "
            "answer in words"
        )
        problems += facts["answer_form"]
    facts["answer"] = answer
    summary = "; ".join(_described(w) for w in facts["writes"]) or "no business effect"
    if missing:
        summary += "; not done: " + "; ".join(why_not(a) for a in missing)
    if refused:
        summary += "; refused by a rule: " + "; ".join(refused)
    return Verification(verified=not problems, summary=summary, facts=facts, problems=problems)


def _why(exc: Exception) -> str:
    """An agent callback's failure in one line (e.g. a business record its models refuse)."""
    detail = validation_problems(exc) if isinstance(exc, ValidationError) else str(exc)
    return storable(f"{type(exc).__name__}: {' '.join(detail.split())}")[:500]


def _spoken_by_the_journal(verification: Verification) -> Verification | None:
    """The verification of a run whose business state speaks for itself though its answer
    cannot: the task done, every write it made verified (at least one), and nothing wrong but
    the answer's form. Its answer is then written from the journal; None for any other run."""
    facts = verification.facts
    form = facts.get("answer_form") or []
    if not (facts["task_done"] and facts["writes"] and form) or verification.problems != form:
        return None
    told = {
        **facts,
        "answer": f"Done, as the business system confirms: {verification.summary}.",
        "model_answer": facts["answer"],
    }
    return Verification(verified=True, summary=verification.summary, facts=told, problems=[])


# A tool call written out as text, as weak models do on servers without tool-call parsing:
# `name(...`, a JSON object naming the function, or a fenced JSON block with its arguments.
_FENCED_CALL = re.compile(r"```(?:json)?\s*\{[^`]*\"(?:arguments|parameters)\"\s*:", re.DOTALL)


def _written_call(answer: str, tools: list[str]) -> str | None:
    """The tool the answer writes a call of, instead of calling it (None if it does not)."""
    for name in tools:
        named = re.escape(name)
        if re.search(rf"\b{named}\s*\(", answer) or re.search(
            rf'"(?:name|function|tool)"\s*:\s*"{named}"', answer
        ):
            return name
    return "a tool" if _FENCED_CALL.search(answer) else None


def _ids(patterns: list[re.Pattern[str]], text: str) -> set[str]:
    return {match.group(0) for pattern in patterns for match in pattern.finditer(text)}


def _described(write: dict[str, Any]) -> str:
    produced = ", ".join(f"{k} {v}" for k, v in write["produced"].items())
    return f"{write['summary']} ({produced})" if produced else write["summary"]


def verify(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:verify:start")
    verification = check_outcome(state, runtime.context)
    recorded = verification.model_dump(mode="json")
    if verification.verified:
        return {
            "verification": recorded,
            "phase": Phase.COMPLETED.value,
            "stop_reason": StopReason.COMPLETED.value,
        }
    refused = state.get("refused_answers", 0) + 1
    if refused >= MAX_REFUSED_ANSWERS and (spoken := _spoken_by_the_journal(verification)):
        return {
            "verification": spoken.model_dump(mode="json"),
            "phase": Phase.COMPLETED.value,
            "stop_reason": StopReason.COMPLETED.value,
        }
    if refused >= MAX_REFUSED_ANSWERS:
        reason = StopReason.NO_PROGRESS if verification.facts["task_done"] else StopReason.NOT_DONE
        detail = f"the final answer was refused {refused} times: {'; '.join(verification.problems)}"
        return {**stop(reason, detail), "verification": recorded, "refused_answers": refused}
    return {
        "verification": recorded,
        "feedback": [*verification.problems, NOT_DONE_HINT]
        if not verification.facts["task_done"]
        else verification.problems,
        "phase": Phase.READY.value,
        "refused_answers": refused,
    }


NOT_DONE_HINT = (
    "The task is not complete while a write it needs did not happen. Do it another way if the "
    "task allows; otherwise answer that it was not done, and why."
)
