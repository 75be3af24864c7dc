"""verify: "completed" means the task's effects happened, verified in the business system.

When the model gives a final answer, a list of checks (`CHECKS`) reads the run; each returns the
facts it found and the problems it has with the answer:

* `settled`: no write's outcome is still unknown;
* `writes_verified`: every write that succeeded is checked against the business system (the
  contract's verify: e.g. the booking exists under the intent key, with the journaled
  parameters). A write whose contract declares it replaces another tool's writes (`replaces`,
  e.g. a status set twice) supersedes an earlier one on a resource both touch: the latest is
  checked against what the business system holds now, the earlier ones by their own recorded
  outcome (the run's final intended state, not every write against today's state); writes that
  merely touch one resource are each verified;
* `not_done` and `refusals`: the writes the run planned that did not happen (failed, rejected by
  an approver or by the downstream, cancelled, escalated), and every refusal that shaped the
  outcome, said by whom: a rule (a business precondition), a check (the task's boundary,
  authorisation, a stale plan), an approver, or the business system;
* `task_done`: the agent's completion check (`Agent(done=...)`) says whether the task is done;
  without one, a run is done when every write it planned happened and, if a rule refused some,
  at least one succeeded;
* `claims`: the agent's claim check (`Agent(claims=...)`) names effects the answer claims that
  the journal does not hold;
* `cited_ids`: the answer may cite an identifier of the kinds the agent's writes produce (each
  write contract declares which, with a pattern) only where the run can back it: a write of this
  run produced it and was verified, a tool observed it, or the task itself names it;
* `answer_form`: an answer that is a tool call written as text is no answer.

Anything a check finds wrong goes back to the model as feedback. An answer refused twice in a
row ends the run INCOMPLETE: `not_done` naming the writes that did not happen, the rules that
refused, the false claims; or `no_progress`. Except where the business state speaks for itself:
when the task is done and every write it made is verified, and the only fault of the answer is
its form (a call written as text), the run completes.

The ending is the runtime's, whatever the model said (`ending_facts`): `answer` is loopwright's
own account of the run, written from the journal (the effects verified, or "no business effect",
then every refusal with its reason), and `stop_detail` of a completed run says the same. The
model's final text is kept apart as `model_answer`, never passed on as fact: no reading of free
text can tell, in every language and phrasing, what it claims happened, so the runtime claims
nothing on the model's behalf. It only annotates it (`answer_notes`): an answer of a run that
made no business effect is marked so, whatever its words, and one that names a value of a write
the run asked for that no verified effect holds (an id, an amount) is told so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.runtime import Runtime
from pydantic import ValidationError

from loopwright.core.crashpoints import crash_point
from loopwright.core.protocol import parse_tool_content
from loopwright.core.state import (
    UNRESOLVED_STATUSES,
    Action,
    ActionStatus,
    Phase,
    RunState,
    StopReason,
    Verification,
)
from loopwright.core.text import storable, validation_problems
from loopwright.core.views import (
    FORM_REFUSALS,
    evidence_of,
    latest_per_intent,
    messages_of,
    not_done,
    program_of_message,
    stop,
    why_not,
)
from loopwright.nodes.context import RunContext
from loopwright.tools.contract import Effect, ToolContext, ToolContract

# An identifier quoted back in a problem is cut to this length (a model can invent huge ones).
QUOTED_ID_CHARS = 64
# Final answers refused in a row before the run stops: told once, stopped on the second.
MAX_REFUSED_ANSWERS = 2

# Who refused a write, by the refusal's code (anything else a write's rule raised: a rule).
CHECK_CODES = frozenset(
    {
        "permission_denied",
        "out_of_scope",
        "intent_conflict",
        "stale_plan",
        "stale_check_failed",
        "approval_expired",
        "approval_mismatch",
        "edit_refused",
        "edit_not_allowed",
        "edit_changes_target",
    }
)
APPROVER_CODES = frozenset({"approval_rejected"})
# What each refuser is called in an ending.
REFUSED_BY = {
    "rule": "a rule",
    "check": "a check",
    "approver": "an approver",
    "business system": "the business system",
}
NO_EFFECT = "no business effect"
NO_EFFECT_NOTE = (
    "this run made no business effect: whatever this answer says was done, nothing was changed "
    "in the business system"
)


@dataclass(frozen=True)
class Judged:
    """The run as every check reads it, gathered once."""

    state: RunState
    context: RunContext
    ctx: ToolContext[Any]
    writes: list[Action]  # the run's writes, as the journal sequenced them
    answer: str

    @property
    def latest(self) -> list[Action]:
        return latest_per_intent(self.writes)

    @classmethod
    def of(cls, state: RunState, context: RunContext) -> Judged:
        writes = [
            a
            for a in context.journal.for_run(state["run_id"])
            if (c := context.tools.get(a.tool)) is None or c.effect is Effect.WRITE
        ]
        final = messages_of(state)[-1]
        answer = final.text if isinstance(final, AIMessage) else ""
        return cls(state, context, context.tool_context(state), writes, answer)


# A check: what it found (facts, merged into the verification's) and its problems with the
# answer. It is given the facts the checks before it found.
Found = tuple[dict[str, Any], list[str]]
Check = Callable[[Judged, dict[str, Any]], Found]


def settled(run: Judged, facts: dict[str, Any]) -> Found:
    return {}, [
        f"{a.action_id} is {a.status}: its outcome is not confirmed"
        for a in run.writes
        if a.status in UNRESOLVED_STATUSES
    ]


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


def _verified_write(
    action: Action, contract: ToolContract, superseded_by: str | None, run: Judged
) -> Found:
    """One succeeded write as the business system shows it: its fact, or the problem."""
    if superseded_by is not None:
        result_facts: dict[str, Any] = {"superseded_by": superseded_by}
    elif contract.verify is None:
        return {}, [f"{action.tool} declares no way to verify its outcome"]
    else:
        result = contract.verify(run.ctx, action)
        if not result.verified:
            return {}, [result.problem]
        result_facts = result.facts
    args = contract.args_model.model_validate(action.args)
    return {
        "action_id": action.action_id,
        "tool": action.tool,
        "summary": contract.describe(args),
        "produced": contract.produced_ids(action.outcome),
        **result_facts,
    }, []


def writes_verified(run: Judged, facts: dict[str, Any]) -> Found:
    superseded = _superseded(run.writes, run.context)
    verified: list[dict[str, Any]] = []
    problems: list[str] = []
    for action in run.writes:
        contract = run.context.tools.get(action.tool)
        if contract is None or action.status is not ActionStatus.SUCCEEDED:
            continue
        fact, said = _verified_write(action, contract, superseded.get(action.action_id), run)
        verified += [fact] if fact else []
        problems += said
    return {"writes": verified}, problems


def not_done_writes(run: Judged, facts: dict[str, Any]) -> Found:
    missing = not_done(run.writes)
    return {
        "not_done": [
            {"action_id": a.action_id, "tool": a.tool, "status": a.status, "why": why_not(a)}
            for a in missing
        ]
    }, []


def refused_by(code: str | None, status: ActionStatus | None = None) -> str:
    """Who refused a write: "approver", "check", "business system" (a send it failed) or
    "rule" (a business precondition, named by its own code)."""
    if code in APPROVER_CODES:
        return "approver"
    if code in CHECK_CODES:
        return "check"
    if status is ActionStatus.FAILED:
        return "business system"
    return "rule"


def _refusal(tool: str, error: dict[str, Any], **more: Any) -> dict[str, Any]:
    code = error.get("code")
    return {
        "by": refused_by(code, more.pop("status", None)),
        "tool": tool,
        "code": code or "",
        "reason": str(error.get("detail") or ""),
        **more,
    }


def refused_calls(
    state: RunState, writes: Collection[str], journaled: Collection[str]
) -> list[dict[str, Any]]:
    """The calls of the tools `writes` refused before they were ever journaled (at validate: a
    business precondition, the task's boundary, authorisation), oldest first. Calls in
    `journaled` (call ids of the run's actions) are the journal's to tell, and a refusal of how a
    call was made (`FORM_REFUSALS`) is the model's to put right, not a refusal of the write."""
    names: dict[str, str] = {}
    refused: list[dict[str, Any]] = []
    for message in messages_of(state):
        if isinstance(message, AIMessage):
            names.update({str(c["id"]): c["name"] for c in message.tool_calls})
        elif isinstance(message, ToolMessage) and isinstance(message.content, str):
            # A program's call is named by its answer (the model never asked for it by name).
            tool = names.get(message.tool_call_id) or (
                message.name if program_of_message(message) else None
            )
            if tool is None or tool not in writes or message.tool_call_id in journaled:
                continue
            try:
                error = parse_tool_content(message.content).error or {}
            except ValueError:
                continue
            if error.get("code") and error["code"] not in FORM_REFUSALS:
                refused.append(_refusal(tool, error, call_id=message.tool_call_id))
    return refused


def _rule_words(refusal: dict[str, Any]) -> str:
    """A refusal at validate as the model and `stop_detail` have always been told it."""
    said = ": ".join(x for x in (refusal["code"], refusal["reason"]) if x)
    return f"{refusal['tool']} refused: {said}"


def refusals(run: Judged, facts: dict[str, Any]) -> Found:
    write_tools = {c.name for c in run.context.tools if c.effect is Effect.WRITE}
    at_validate = refused_calls(run.state, write_tools, {a.call_id for a in run.writes})
    in_journal = [
        _refusal(
            a.tool,
            (a.outcome or {}).get("error") or {},
            status=a.status,
            action_id=a.action_id,
        )
        for a in not_done(run.writes)
        if a.status in (ActionStatus.REJECTED, ActionStatus.FAILED)
    ]
    return {
        "refused": [_rule_words(r) for r in at_validate],
        "refusals": [*at_validate, *in_journal],
    }, []


def _why(exc: Exception) -> str:
    """An agent callback's failure in one line (e.g. a business record its models refuse)."""
    detail = validation_problems(exc) if isinstance(exc, ValidationError) else str(exc)
    return storable(f"{type(exc).__name__}: {' '.join(detail.split())}")[:500]


def task_done(run: Judged, facts: dict[str, Any]) -> Found:
    missing, refused = facts["not_done"], facts["refused"]
    check_failed = None
    latest = run.latest
    if run.context.done is not None:
        try:
            done = run.context.done(run.ctx, run.state["task"], latest)
        except Exception as exc:  # the agent's own code: its failure is told, not the run's end
            done, check_failed = False, f"the agent's completion check failed: {_why(exc)}"
    else:
        succeeded = any(a.status is ActionStatus.SUCCEEDED for a in latest)
        done = not missing and (succeeded or not refused)
    if done:
        return {"task_done": True}, []
    problems = [f"not done: {m['why']}" for m in missing] + [f"not done: {r}" for r in refused]
    if check_failed is not None:
        problems.append(check_failed)
    elif not missing and not refused:
        problems.append(
            "the task is not done: the agent's completion check finds an effect it needs missing"
        )
    return {"task_done": False}, problems


def claims(run: Judged, facts: dict[str, Any]) -> Found:
    try:
        false_claims = (
            run.context.claims(run.ctx, run.answer, run.latest)
            if run.context.claims is not None
            else []
        )
    except Exception as exc:  # as for the completion check: told, not a crash of the run
        false_claims = [f"what the agent's claim check could not read ({_why(exc)})"]
    return {"false_claims": false_claims}, [
        f"the answer claims {claim}, which the journal does not hold" for claim in false_claims
    ]


def _observed_text(state: RunState) -> str:
    """Everything the run was told as data: the task and every observation, as one text."""
    contents = [json.dumps(e.content, default=str) for e in evidence_of(state)]
    return "\n".join([state["task"], *contents])


def _ids(patterns: list[re.Pattern[str]], text: str) -> set[str]:
    return {match.group(0) for pattern in patterns for match in pattern.finditer(text)}


def cited_ids(run: Judged, facts: dict[str, Any]) -> Found:
    tools = run.context.tools
    patterns = [p for c in tools if c.effect is Effect.WRITE for p in c.id_patterns()]
    if not patterns:
        return {}, []
    backed = {str(v) for w in facts["writes"] for v in _held_values(w)}
    observed = _ids(patterns, _observed_text(run.state))
    return {}, [
        f"the answer cites {claim[:QUOTED_ID_CHARS]!r}, which no verified write of this run "
        "produced and nothing the run observed holds"
        for claim in sorted(_ids(patterns, run.answer) - backed - observed)
    ]


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


def answer_form(run: Judged, facts: dict[str, Any]) -> Found:
    called = _written_call(run.answer, [c.name for c in run.context.tools])
    if called is None:
        return {"answer_form": []}, []
    problem = (
        f"the answer looks like a call of {called} written as text: call the tool, or answer in "
        "words"
    )
    return {"answer_form": [problem]}, [problem]


CHECKS: tuple[Check, ...] = (
    settled,
    writes_verified,
    not_done_writes,
    refusals,
    task_done,
    claims,
    cited_ids,
    answer_form,
)


# --- the ending: the runtime's account, and the model's answer kept apart --------------------


def _held_values(write: dict[str, Any]) -> Iterable[Any]:
    """What a verified write's fact holds: the identifiers it produced, the facts verify found."""
    yield from write["produced"].values()
    yield from (
        v for k, v in write.items() if k not in {"action_id", "tool", "summary", "produced"}
    )


def _described(write: dict[str, Any]) -> str:
    produced = ", ".join(f"{k} {v}" for k, v in write["produced"].items())
    return f"{write['summary']} ({produced})" if produced else write["summary"]


def refusal_words(refusal: dict[str, Any]) -> str:
    """One refusal as an ending says it: who refused what, and why."""
    said = ": ".join(x for x in (refusal["code"], refusal["reason"]) if x)
    by = REFUSED_BY.get(refusal["by"], refusal["by"])
    return f"refused by {by}: {refusal['tool']}" + (f" ({said})" if said else "")


def _clauses(facts: dict[str, Any]) -> list[str]:
    """Every refusal, then every other write that did not happen (cancelled, escalated)."""
    refused = {r.get("action_id") for r in facts["refusals"]}
    return [refusal_words(r) for r in facts["refusals"]] + [
        f"not done: {m['why']}" for m in facts["not_done"] if m["action_id"] not in refused
    ]


# An identifying value of a write's arguments: one with a digit in it (an id, an amount), not a
# word the answer could use for anything.
_IDENTIFYING = re.compile(r"\d")


def _asked_values(run: Judged) -> set[str]:
    """The identifying values of every write call the model asked for in this run (made,
    refused, or not done), sensitive arguments left out."""
    calls = [
        (str(c["name"]), c["args"])
        for m in messages_of(run.state)
        if isinstance(m, AIMessage)
        for c in m.tool_calls
    ]
    calls += [(a.tool, a.args) for a in run.writes]
    values: set[str] = set()
    for tool, args in calls:
        contract = run.context.tools.get(tool)
        if contract is None or contract.effect is not Effect.WRITE or not isinstance(args, dict):
            continue
        values.update(
            str(v)
            for k, v in args.items()
            if k not in contract.sensitive
            and isinstance(v, str | int | float)
            and _IDENTIFYING.search(str(v))
        )
    return values


def _named(value: str, text: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w-]|\.\d)", text) is not None


def answer_notes(run: Judged, facts: dict[str, Any]) -> list[str]:
    """What the runtime says about the model's answer, without reading what it claims: a run
    that made no business effect is marked so whatever its words; a value of a write the run
    asked for that no verified effect holds is named where the answer names it."""
    if not run.answer.strip():
        return []
    notes = [] if facts["writes"] else [NO_EFFECT_NOTE]
    verified = {w["action_id"] for w in facts["writes"]}
    held = {str(v) for w in facts["writes"] for v in _held_values(w)}
    held |= {str(v) for a in run.writes if a.action_id in verified for v in a.args.values()}
    for value in sorted(_asked_values(run) - held):
        if _named(value, run.answer):
            notes.append(
                f"it names {value[:QUOTED_ID_CHARS]!r}, which no verified effect of this run holds"
            )
    return notes


def ending_facts(run: Judged, facts: dict[str, Any]) -> dict[str, Any]:
    """The runtime's account of the run (`answer`), what kind of outcome it is (`outcome`:
    "effects", "no_effect" or "refusal"), the model's own answer kept apart (`model_answer`),
    and what the runtime says about it (`answer_notes`)."""
    effects = "; ".join(_described(w) for w in facts["writes"])
    lead = (
        f"verified in the business system: {effects}"
        if effects
        else f"{NO_EFFECT}: this run changed nothing in the business system"
    )
    clauses = _clauses(facts)
    outcome = "refusal" if clauses else "effects" if effects else "no_effect"
    return {
        "outcome": outcome,
        "summary": "; ".join([effects or NO_EFFECT, *clauses]),
        "answer": "; ".join([lead, *clauses]),
        "model_answer": run.answer,
        "answer_notes": answer_notes(run, facts),
    }


def check_outcome(state: RunState, context: RunContext) -> Verification:
    run = Judged.of(state, context)
    facts: dict[str, Any] = {}
    problems: list[str] = []
    for check in CHECKS:
        found, said = check(run, facts)
        facts |= found
        problems += said
    facts |= ending_facts(run, facts)
    return Verification(
        verified=not problems, summary=facts.pop("summary"), facts=facts, problems=problems
    )


def _spoken_by_the_journal(verification: Verification) -> bool:
    """Whether the business state speaks for a run whose answer cannot: the task done, every
    write it made verified (at least one), and nothing wrong but the answer's form."""
    facts = verification.facts
    form = facts.get("answer_form") or []
    return bool(facts["task_done"] and facts["writes"] and form) and verification.problems == form


def _completed(verification: Verification) -> dict[str, Any]:
    """The update that completes the run: `stop_detail` is the runtime's account."""
    return {
        "verification": verification.model_dump(mode="json"),
        "phase": Phase.COMPLETED.value,
        "stop_reason": StopReason.COMPLETED.value,
        "stop_detail": verification.facts["answer"],
    }


def verify(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:verify:start")
    verification = check_outcome(state, runtime.context)
    if verification.verified:
        return _completed(verification)
    refused = state.get("refused_answers", 0) + 1
    if refused >= MAX_REFUSED_ANSWERS and _spoken_by_the_journal(verification):
        return _completed(verification.model_copy(update={"verified": True, "problems": []}))
    recorded = verification.model_dump(mode="json")
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
