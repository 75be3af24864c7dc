"""No-progress detection: a signature per loop step, and what to do when it repeats.

A step's signature is the normalised action it took (tool names and canonical arguments, sequence
ignored) and a hash of what it observed (the tool results, which carry versions). The same
signature again means the same question was asked and the same answer came back: no new
evidence. After `NUDGE_AFTER` identical steps the model gets one strategy-change message; if it
repeats once more the run stops with `no_progress`.

A step whose tool said "pending, poll again later" is not counted: polling an asynchronous
operation repeats by design. Neither is a final answer (verify deals with those).
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from pydantic import BaseModel

from loopwright.core.protocol import parse_tool_content
from loopwright.core.state import canonical_json, digest

NUDGE_AFTER = 3
WINDOW = 8

STRATEGY_CHANGE = (
    "No progress: your last {n} steps asked the same thing and got the same answer. Change "
    "strategy: use what you already know, try a different step, or give your final answer."
)


def last_step(history: Sequence[BaseMessage]) -> tuple[AIMessage | None, list[ToolMessage]]:
    """The newest model decision and the tool results that answered it."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if isinstance(message, AIMessage):
            return message, [m for m in history[index + 1 :] if isinstance(m, ToolMessage)]
    return None, []


def step_signature(history: Sequence[BaseMessage]) -> str | None:
    decision, results = last_step(history)
    if decision is None or not decision.tool_calls:
        return None
    calls = sorted((c["name"], canonical_json(c["args"])) for c in decision.tool_calls)
    observed = sorted(str(m.content).partition("\n")[2] for m in results)
    return digest({"calls": calls, "observed": observed})[:16]


def error_codes(results: Sequence[ToolMessage]) -> list[str]:
    codes = []
    for message in results:
        envelope = parse_tool_content(str(message.content))
        if envelope.status == "error" and envelope.error:
            codes.append(str(envelope.error.get("code")))
    return codes


class ProgressCheck(BaseModel):
    """What guard does about the newest step: carry on, nudge the model, or stop."""

    signatures: list[str]
    repeats: int
    nudge: str | None = None
    stop: bool = False


def check_progress(
    previous: Sequence[str], signature: str | None, *, nudged: bool
) -> ProgressCheck:
    if signature is None:
        return ProgressCheck(signatures=list(previous), repeats=0)
    signatures = [*previous, signature][-WINDOW:]
    repeats = 0
    for seen in reversed(signatures):
        if seen != signature:
            break
        repeats += 1
    if repeats > NUDGE_AFTER and nudged:
        return ProgressCheck(signatures=signatures, repeats=repeats, stop=True)
    if repeats >= NUDGE_AFTER and not nudged:
        nudge = STRATEGY_CHANGE.format(n=repeats)
        return ProgressCheck(signatures=signatures, repeats=repeats, nudge=nudge)
    return ProgressCheck(signatures=signatures, repeats=repeats)
