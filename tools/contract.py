"""The tool contract: what the runtime must know about a tool before it lets a model use it.

A tool is more than a function. Its contract declares the argument schema and output contract,
whether it reads or writes, which resources it touches, how to authorise it for a principal,
when it needs approval, and for writes: the business intent it carries, the business rules that
must hold before it is sent (preconditions), how to ask the business system about that intent
(reconcile), how to check the outcome (verify), and what guarantee the downstream gives
(idempotent by key / queryable / neither).

Every function of a contract is given a `ToolContext`: the application's own dependencies (its
clients, endpoints, credentials: whatever the team's `deps` factory built) and the run the call
belongs to. The runtime never knows what is in `deps`.

`ToolContract` is the runtime's own, complete form. Applications write typed functions and
declare the rest with `Agent.read` / `Agent.write` (`loopwright.tools.define`), which build it.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict

from loopwright.graph.state import Action, Evidence, Principal, digest, utcnow

MIN_TIMEOUT_S = 0.05


class Effect(StrEnum):
    """Whether a tool only reads (retried on transport faults, never journaled) or writes
    (journaled, sent under its intent key, reconciled when its outcome is unknown)."""

    READ = "read"
    WRITE = "write"


class Guarantee(StrEnum):
    """What the downstream promises about a write whose outcome we did not see.

    idempotent_by_key  re-sending under the same key never applies twice, and the key can be
                       queried: an absent intent may be re-sent.
    queryable          the intent can be looked up, but a re-send could apply twice: an absent
                       intent is reported, never re-sent automatically.
    none               neither: an UNKNOWN outcome always escalates to a human.
    """

    IDEMPOTENT_BY_KEY = "idempotent_by_key"
    QUERYABLE = "queryable"
    NONE = "none"


@dataclass(frozen=True)
class ToolContext[DepsT]:
    """What a tool's functions are given besides their arguments.

    `deps` is the application's own object (built by its agent's `deps` factory, once per
    process); `run_id` and `principal` say which run and whom the call is for (the principal
    comes from the trusted caller, never from the model). `deadline` is the run's end-to-end
    deadline: pass every request's timeout through `timeout()` so that no single call can
    outlive the run's budget.
    """

    deps: DepsT
    run_id: str = ""
    principal: Principal | None = None
    deadline: datetime | None = None
    # A write whose contract re-sends after a deadline: the moment after which the downstream
    # must not apply this request (send it along, e.g. as a header the downstream honours).
    send_by: datetime | None = None

    def timeout(self, seconds: float) -> float:
        """`seconds`, or less if the run's deadline comes first (never below 50 ms)."""
        if self.deadline is None:
            return seconds
        remaining = (self.deadline - utcnow()).total_seconds()
        return max(MIN_TIMEOUT_S, min(seconds, remaining))

    @property
    def user(self) -> Principal:
        """The principal of the run; raises if the call is not made for one."""
        if self.principal is None:
            raise PermissionDenied("this call is not made for a principal")
        return self.principal

    def for_run(
        self, run_id: str, principal: Principal | None, deadline: datetime | None = None
    ) -> ToolContext[DepsT]:
        return replace(self, run_id=run_id, principal=principal, deadline=deadline)


class ToolArgs(BaseModel):
    """Base of argument models: an argument the schema does not name is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class ToolFault(Exception):
    """A tool call that failed with a known outcome: nothing happened in the business system.

    `code` is a stable snake_case identifier the model can act on; `transient` faults (transport
    errors on reads) may be retried by the single retry layer, nothing else is.
    """

    def __init__(self, code: str, detail: str, *, transient: bool = False) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.transient = transient

    def as_error(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail}


class PermissionDenied(ToolFault):
    """The principal may not make this call (raised by an `authorize` function)."""

    def __init__(self, detail: str) -> None:
        super().__init__("permission_denied", detail)


class PreconditionFailed(ToolFault):
    """A business rule of a write does not hold (raised by a precondition): nothing is sent.

    `code` names the rule (e.g. "outside_booking_window") so the model can act on it; the
    detail says why, in words.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail)


class OutcomeUnknown(Exception):
    """A write was (or may have been) sent and no definitive answer arrived.

    Never a failure: the business system may have applied it. The runtime reconciles.
    """


class ReconcileStatus(StrEnum):
    """The business system's answer about an intent whose outcome was unknown."""

    APPLIED = "applied"  # the business system has the intent and it succeeded
    ABSENT = "absent"  # definitively not there: safe to re-send under the same key
    PENDING = "pending"  # known to the business system, not finished yet
    UNCONFIRMABLE = "unconfirmable"  # cannot be asked, or the answer is not trustworthy


@dataclass(frozen=True)
class ResendAfterDeadline:
    """How an absent write to a downstream without keys is made safe to send again: every
    request carries a deadline (`ToolContext.send_by`, `seconds` after it is sent) that the
    downstream honours, refusing it afterwards. Once the deadline plus `skew_s` (for the two
    clocks) has passed, a request that never arrived can no longer apply: reconciliation that
    finds the intent absent then sends a new attempt of the same intent, never before."""

    seconds: float
    skew_s: float = 5.0

    def __post_init__(self) -> None:
        # A deadline of no length or a negative skew would let reconciliation re-send while the
        # first request can still arrive: the one thing this declaration exists to prevent.
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"ResendAfterDeadline: seconds must be > 0, not {self.seconds!r}")
        if not (math.isfinite(self.skew_s) and self.skew_s >= 0):
            raise ValueError(f"ResendAfterDeadline: skew_s must be >= 0, not {self.skew_s!r}")


@dataclass(frozen=True)
class ReconcileResult:
    """What a reconcile function found: the status, the business record if applied, why, and
    (for PENDING) when to ask again."""

    status: ReconcileStatus
    outcome: dict[str, Any] | None = None
    detail: str = ""
    retry_after_s: float = 1.0


@dataclass(frozen=True)
class VerifyResult:
    """What a verify function found: whether the write is there as journaled, the facts that
    show it (recorded in the run's verification), or the problem."""

    verified: bool
    facts: dict[str, Any]
    problem: str = ""


def _readable(value: Any) -> str:
    """An argument's value in a summary line: text as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


class ToolDefinitionError(TypeError):
    """A tool definition the runtime cannot use safely; the message says what to add."""


def synchronous(owner: str, what: str, fn: object) -> None:
    """Refuse an `async def` (or an object whose `__call__` is one) where loopwright calls a
    function and uses its answer: it would get a coroutine back, never the answer, and take it
    for one (an async `authorize` would allow every call, an async precondition never refuse).
    """
    call = getattr(fn, "__call__", None)  # noqa: B004 (an object's __call__, not callable())
    if any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f) for f in (fn, call)):
        raise ToolDefinitionError(
            f"{owner}: {what} is an async function, and loopwright calls it synchronously"
            " (from a worker thread): make it a plain def (an async client can be called"
            " through asyncio.run, or use its synchronous client)"
        )


def _no_resources(_args: Any) -> frozenset[str]:
    return frozenset()


def _always_allowed(_ctx: ToolContext[Any], _args: Any) -> bool:
    return True


def _never(_ctx: ToolContext[Any], _args: Any) -> bool:
    return False


Precondition = Callable[[ToolContext[Any], Any], None]


@dataclass(frozen=True, eq=False)
class ToolContract:
    """A tool as the runtime uses it. Every function takes the call's `ToolContext` first.

    Compared (and hashed) by identity: two contracts are the same only if they are one."""

    name: str
    description: str
    args_model: type[BaseModel]
    output_model: type[BaseModel]
    effect: Effect
    # Perform the call. For writes, the third argument is the business intent key (never the
    # model's call id). Raises ToolFault (definitive) or OutcomeUnknown (writes only).
    run: Callable[[ToolContext[Any], Any, str | None], Mapping[str, Any] | BaseModel]
    resources: Callable[[Any], Iterable[str]] = _no_resources
    # False (or raising PermissionDenied) refuses the call for the context's principal.
    authorize: Callable[[ToolContext[Any], Any], bool | None] = _always_allowed
    # Whether a call needs a person's approval: True, or a reason in words (the rule or the
    # threshold that asks: "amount above 50.00"); False or None for no. See `approval_reason`.
    needs_approval: Callable[[ToolContext[Any], Any], bool | str | None] = _never
    # Writes: business rules that must hold whatever the model read, checked at validate and
    # again right before the send, on current data; each raises PreconditionFailed.
    preconditions: tuple[Precondition, ...] = ()
    # Writes: the intent key for these args within a run; for a downstream without keys, a
    # pre-image read journaled with DISPATCHED before the send; reconcile an unknown outcome
    # (given the journaled pre-image, if any); verify a succeeded one.
    intent_key: Callable[[str, Any], str] | None = None
    pre_image: Callable[[ToolContext[Any], Any], dict[str, Any]] | None = None
    reconcile: (
        Callable[[ToolContext[Any], Action, dict[str, Any] | None], ReconcileResult] | None
    ) = None
    verify: Callable[[ToolContext[Any], Action], VerifyResult] | None = None
    summarize: Callable[[Any], str] | None = None
    # Writes: output fields that are identifiers the write produced (a booking id), each with
    # the pattern that finds it in text: an answer may cite only those the run can back.
    produces: Mapping[str, str] = field(default_factory=dict)
    # Reads of asynchronous operations: seconds until it is worth asking again when a result
    # says "not finished yet" (a poll is not mistaken for a loop without progress).
    poll_after: Callable[[dict[str, Any]], float | None] | None = None
    # Writes: the current version of each resource the write touches, compared right before the
    # send with the version the model observed when it planned the write.
    current_versions: Callable[[ToolContext[Any], Any], dict[str, str]] | None = None
    # Writes: how a succeeded action could be undone, offered to a person (never performed by
    # the runtime) when a run is cancelled after the write.
    compensation: Callable[[Action], str] | None = None
    guarantee: Guarantee = Guarantee.NONE
    # Writes: the tools whose earlier writes this one replaces where both touch a resource (a
    # status set again): verification then checks the latest only. Nothing unless declared.
    replaces: frozenset[str] = field(default_factory=frozenset)
    # Writes to a downstream without keys (queryable): how an intent proven absent is sent
    # again safely. Without one, an absent keyless write goes to a person (needs_human).
    resend: ResendAfterDeadline | None = None
    timeout_s: float = 5.0
    max_attempts: int = 2  # reads: transport faults retried in this one layer
    max_result_bytes: int = 64_000
    sensitive_fields: frozenset[str] = field(default_factory=frozenset)
    # Writes: the arguments an approver may change (an edit); none unless declared.
    editable: frozenset[str] = field(default_factory=frozenset)
    # Writes: what an approver decides from beyond the summary, as labelled facts drawn from
    # the call's arguments and the evidence the run holds (`facts(args, evidence)`); and whether
    # approving these arguments takes a second, deliberate confirmation (`confirm(args)`).
    facts: Callable[[Any, Sequence[Evidence]], Iterable[tuple[str, str]]] | None = None
    confirm: Callable[[Any], bool] | None = None

    def __post_init__(self) -> None:
        if self.effect is Effect.WRITE and self.intent_key is None:
            raise ValueError(f"write tool {self.name} must declare its business intent key")
        functions = {f.name: getattr(self, f.name) for f in fields(self)}
        functions |= {f"preconditions[{i}]": rule for i, rule in enumerate(self.preconditions)}
        for what, function in functions.items():
            if callable(function) and not isinstance(function, type):
                synchronous(f"tool {self.name}", what, function)

    # A contract is immutable: what is rendered from it (JSON schemas, their hash) is rendered
    # once per contract, not at every step that reads it. `replace()` builds a new contract,
    # which renders its own.
    @cached_property
    def schema_hash(self) -> str:
        """Changes whenever what a saved decision relies on changes: the model-visible schema,
        the output contract, the effect or the guarantee."""
        return digest(
            {
                "tool": self._openai_schema,
                "output": self.output_model.model_json_schema(),
                "effect": self.effect,
                "guarantee": self.guarantee,
            }
        )[:16]

    @cached_property
    def _openai_schema(self) -> dict[str, Any]:
        schema = convert_to_openai_tool(self.args_model)
        schema["function"]["name"] = self.name
        schema["function"]["description"] = self.description
        return schema

    def openai_schema(self) -> dict[str, Any]:
        """The tool as a model is shown it; a copy of its own to each caller (a model client's
        `bind_tools` may change what it is given)."""
        return copy.deepcopy(self._openai_schema)

    def resources_of(self, args: BaseModel) -> frozenset[str]:
        return frozenset(self.resources(args))

    @property
    def declares_resources(self) -> bool:
        return self.resources is not _no_resources

    def describe(self, args: BaseModel) -> str:
        """A one-line human summary of a call, shown to approvers."""
        if self.summarize is not None:
            return self.summarize(args)
        # Without the write's own words: its name and each argument as a person reads it
        # ("issue_credit: ticket_id T-1, amount 40.00"), never a raw dict.
        shown = [
            f"{k} {'[redacted]' if k in self.sensitive_fields else _readable(v)}"
            for k, v in args.model_dump(mode="json").items()
            if v is not None
        ]
        return f"{self.name}: {', '.join(shown)}" if shown else self.name

    def facts_of(
        self, args: BaseModel, evidence: Sequence[Evidence]
    ) -> tuple[tuple[str, str], ...]:
        """The facts an approver is shown with a call (none unless the contract declares them).

        Given only the arguments and the run's evidence, never a live read: the request is
        fixed when the call is planned, and must be the same however often that step runs."""
        if self.facts is None:
            return ()
        return tuple((str(label), str(value)) for label, value in self.facts(args, evidence))

    def needs_confirmation(self, args: BaseModel) -> bool:
        """Whether approving a call takes a second click (the contract's `confirm`)."""
        return self.confirm is not None and bool(self.confirm(args))

    def approval_reason(self, ctx: ToolContext[Any], args: BaseModel) -> str | None:
        """Why a call needs a person's approval, in words; None if it does not. The rule
        answers False or None for no, a reason (text) or True for yes; any other answer, and
        blank text, asks for an approval too (a rule that cannot be read fails closed)."""
        answer = self.needs_approval(ctx, args)
        if answer is False or answer is None:
            return None
        if isinstance(answer, str) and answer.strip():
            return answer.strip()
        return f"the approval rule of {self.name} asks for one (it gave no reason)"

    @property
    def declares_authorize(self) -> bool:
        return self.authorize is not _always_allowed

    def check_authorized(self, ctx: ToolContext[Any], args: BaseModel) -> None:
        """Raise PermissionDenied unless `authorize` allows the call for ctx's principal: it
        answers True or None to allow. Any other answer refuses (a truthy object is no "yes")."""
        answer = self.authorize(ctx, args)
        if answer is True or answer is None:
            return
        if answer is False:
            who = ctx.principal.user_id if ctx.principal is not None else "nobody"
            raise PermissionDenied(f"{self.name} is not allowed for {who} with these arguments")
        raise PermissionDenied(
            f"{self.name} is refused: its authorize answered a {type(answer).__name__}, not"
            " True, False or None"
        )

    def check_preconditions(self, ctx: ToolContext[Any], args: BaseModel) -> None:
        """Raise the first PreconditionFailed (or other ToolFault) of the write's rules. A rule
        refuses by raising; one that answers False (a check written as a predicate) refuses
        too, as does any answer but None or True: a rule that cannot be read never holds."""
        for rule in self.preconditions:
            answer: object = rule(ctx, args)
            if answer is None or answer is True:
                continue
            name = getattr(rule, "__name__", type(rule).__name__)
            said = "False" if answer is False else f"a {type(answer).__name__}"
            raise PreconditionFailed(
                "precondition_failed", f"{self.name}: its precondition {name} answered {said}"
            )

    def produced_ids(self, outcome: Mapping[str, Any] | None) -> dict[str, str]:
        """The identifiers a succeeded write's outcome holds, by field."""
        return {f: str(outcome[f]) for f in self.produces if outcome and outcome.get(f)}

    def id_patterns(self) -> list[re.Pattern[str]]:
        return [re.compile(rf"(?<![\w-]){p}(?![\w-])") for p in self.produces.values()]
