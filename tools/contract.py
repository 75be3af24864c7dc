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

`ToolContract` is the runtime's own, complete form, and every way a tool is made ends in it:
applications write typed functions and declare the rest with `Agent.read` / `Agent.write`
(`loopwright.tools.define`), with the options `loopwright.tools.options` names; LangChain tools
and MCP servers' tools take the same options. Every contract is checked when it is made.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields, replace
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict

from loopwright.core.state import Action, Evidence, Principal, digest, utcnow
from loopwright.tools.json_schema import JsonSchemaModel

MIN_TIMEOUT_S = 0.05
# A tool call's own bound unless its contract says otherwise (the run's deadline bounds it too).
DEFAULT_TIMEOUT_S = 5.0


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


Precondition = Callable[[ToolContext[Any], Any], None]
# Whether a write asks a person first: always (True, or a reason in words, which the approver is
# shown), never (False), or a condition on the call answering one of them.
ApprovalRule = bool | str | Callable[[ToolContext[Any], Any], bool | str | None]
# Ask the business system about an intent: (ctx, action), or (ctx, action, pre_image) for a
# write that journals a pre-image before its send.
Reconcile = (
    Callable[[ToolContext[Any], Action], ReconcileResult]
    | Callable[[ToolContext[Any], Action, dict[str, Any] | None], ReconcileResult]
)
Verify = Callable[[ToolContext[Any], Action], VerifyResult]

# What a model may call a function (OpenAI's rule), the whole name (`fullmatch`: a `$` would
# let a trailing newline through).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A pydantic `pattern` anchors with ^ and $; finding an id in text needs it unanchored.
_ANCHORS = re.compile(r"^\^|\$$")


def _takes_pre_image(reconcile: Reconcile) -> bool:
    return len(inspect.signature(reconcile).parameters) == 3


@dataclass(frozen=True)
class AskedAgain:
    """The default verification of a write that declares reconcile (and no pre-image): the
    business system is asked again whether the intent is applied."""

    reconcile: Reconcile

    def __call__(self, ctx: ToolContext[Any], action: Action) -> VerifyResult:
        if _takes_pre_image(self.reconcile):
            answer = self.reconcile(ctx, action, None)  # type: ignore[call-arg]
        else:
            answer = self.reconcile(ctx, action)  # type: ignore[call-arg]
        if answer.status is ReconcileStatus.APPLIED:
            return VerifyResult(True, dict(answer.outcome or action.outcome or {}))
        detail = answer.detail or str(answer.status)
        return VerifyResult(False, {}, f"{action.tool} {action.action_id}: {detail}")


def closed(model: type[BaseModel]) -> type[BaseModel]:
    """`model`, refusing arguments it does not name (a model's call is never trimmed silently).

    A JSON Schema model is closed by its schema (see `schema_model`)."""
    if model.model_config.get("extra") == "forbid" or issubclass(model, JsonSchemaModel):
        return model
    config = ConfigDict(**{**model.model_config, "extra": "forbid"})
    namespace = {"model_config": config, "__module__": model.__module__, "__doc__": model.__doc__}
    return type(model.__name__, (model,), namespace)


@dataclass(frozen=True, eq=False, kw_only=True)
class ToolContract:
    """A tool as the runtime uses it: what it is (name, description, models, effect, the call)
    and what it declares. The declarations are the fields `ReadOptions` and `WriteOptions`
    (`loopwright.tools.options`) name, with the same names, types and defaults: every way a tool
    is made (`Agent.read`/`write`, `read_tool`/`write_tool`, LangChain tools, MCP servers'
    tools, this class itself, `dataclasses.replace`) ends here, and every contract is checked
    once, here, when it is made (`ToolDefinitionError`, saying what to add).

    Compared (and hashed) by identity: two contracts are the same only if they are one."""

    # --- what the tool is --------------------------------------------------------------------
    name: str
    description: str
    args_model: type[BaseModel]
    output_model: type[BaseModel]
    effect: Effect
    # Perform the call. For writes, the third argument is the business intent key (never the
    # model's call id). Raises ToolFault (definitive) or OutcomeUnknown (writes only).
    run: Callable[[ToolContext[Any], Any, str | None], Mapping[str, Any] | BaseModel]
    # What the tool's calls go through that a process opens once (an MCP server's session),
    # given the agent's tools that use it (to check them against what it finds): entered with
    # the agent's dependencies. None: the tool needs nothing opened.
    connection: Callable[[Sequence[ToolContract]], AbstractContextManager[object]] | None = None
    # --- what every tool declares --------------------------------------------------------------
    resources: Callable[[Any], Iterable[str]] = _no_resources
    authorize: Callable[[ToolContext[Any], Any], bool | None] = _always_allowed
    sensitive: Collection[str] = frozenset()
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_result_bytes: int = 64_000
    # --- reads -------------------------------------------------------------------------------
    poll_after: Callable[[dict[str, Any]], float | None] | None = None
    max_attempts: int = 2
    # --- writes ------------------------------------------------------------------------------
    intent: Callable[[str, Any], str] | None = None
    guarantee: Guarantee = Guarantee.NONE
    reconcile: Reconcile | None = None
    verify: Verify | None = None
    needs_approval: ApprovalRule = True
    preconditions: Precondition | Sequence[Precondition] = ()
    pre_image: Callable[[ToolContext[Any], Any], dict[str, Any]] | None = None
    current_versions: Callable[[ToolContext[Any], Any], dict[str, str]] | None = None
    compensation: Callable[[Action], str] | None = None
    summary: Callable[[Any], str] | None = None
    produces: Sequence[str] | Mapping[str, str] = ()
    editable: Collection[str] = frozenset()
    facts: Callable[[Any, Sequence[Evidence]], Iterable[tuple[str, str]]] | None = None
    confirm: Callable[[Any], bool] | None = None
    resend: ResendAfterDeadline | None = None
    replaces: Collection[str] = frozenset()

    def __post_init__(self) -> None:
        # Declared in the forms a team writes them; kept in one form each (what `replace()`
        # passes on is kept as it is).
        normal: dict[str, Any] = {
            "args_model": closed(self.args_model) if _is_model(self.args_model) else None,
            "preconditions": _rules(self.preconditions),
            "sensitive": frozenset(_words(self.sensitive)),
            "editable": frozenset(_words(self.editable)),
            "replaces": frozenset(_words(self.replaces)),
            "verify": None if isinstance(self.verify, AskedAgain) else self.verify,
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value if value is not None else getattr(self, name))
        check_contract(self)
        if self.effect is Effect.WRITE:
            object.__setattr__(self, "produces", _produced(self))
            if self.verify is None and self.reconcile is not None:
                object.__setattr__(self, "verify", AskedAgain(self.reconcile))

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
        if self.summary is not None:
            return self.summary(args)
        # Without the write's own words: its name and each argument as a person reads it
        # ("issue_credit: ticket_id T-1, amount 40.00"), never a raw dict.
        shown = [
            f"{k} {'[redacted]' if k in self.sensitive else _readable(v)}"
            for k, v in args.model_dump(mode="json").items()
            if v is not None
        ]
        return f"{self.name}: {', '.join(shown)}" if shown else self.name

    def reconcile_intent(
        self, ctx: ToolContext[Any], action: Action, pre_image: dict[str, Any] | None
    ) -> ReconcileResult:
        """The business system's answer about `action`'s intent (`reconcile`, given the
        pre-image journaled with its send if it takes one)."""
        if self.reconcile is None:
            raise ToolDefinitionError(f"tool {self.name} declares no reconcile")
        if _takes_pre_image(self.reconcile):
            return self.reconcile(ctx, action, pre_image)  # type: ignore[call-arg]
        return self.reconcile(ctx, action)  # type: ignore[call-arg]

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
        """Why a call of this write waits for a person, in words (the approver is shown it);
        None if it does not. `needs_approval` (or what its condition answers) is False for no;
        True, a reason, or anything else asks (a condition that cannot be read asks too)."""
        rule = self.needs_approval
        answer: object = rule(ctx, args) if callable(rule) else rule
        if answer is False:
            return None
        if isinstance(answer, str) and answer.strip():
            return answer.strip()
        if answer is True and not callable(rule):
            return f"every call of {self.name} needs a person's approval (its contract says so)"
        if answer is True:
            return f"the approval rule of {self.name} asks for one (it gave no reason)"
        return (
            f"the approval rule of {self.name} answered a {type(answer).__name__}, not True,"
            " False or a reason: a person decides"
        )

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

    @property
    def rules(self) -> tuple[Precondition, ...]:
        """The write's business rules (`preconditions`), as they are checked, first to last."""
        return _rules(self.preconditions)

    def check_preconditions(self, ctx: ToolContext[Any], args: BaseModel) -> None:
        """Raise the first PreconditionFailed (or other ToolFault) of the write's rules. A rule
        refuses by raising; one that answers False (a check written as a predicate) refuses
        too, as does any answer but None or True: a rule that cannot be read never holds."""
        for rule in self.rules:
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
        assert isinstance(self.produces, Mapping)  # one form since __post_init__
        return [re.compile(rf"(?<![\w-]){p}(?![\w-])") for p in self.produces.values()]


# --- the checks every contract passes when it is made ------------------------------------------

# Declarations that mean something for one effect only, with the value that declares nothing.
_WRITE_ONLY: dict[str, object] = {
    "intent": None,
    "guarantee": Guarantee.NONE,
    "reconcile": None,
    "verify": None,
    "needs_approval": True,
    "preconditions": (),
    "pre_image": None,
    "current_versions": None,
    "compensation": None,
    "summary": None,
    "produces": (),
    "editable": frozenset(),
    "facts": None,
    "confirm": None,
    "resend": None,
    "replaces": frozenset(),
}
_READ_ONLY: dict[str, object] = {"poll_after": None, "max_attempts": 2}


def _is_model(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _rules(preconditions: Precondition | Sequence[Precondition]) -> tuple[Precondition, ...]:
    return (preconditions,) if callable(preconditions) else tuple(preconditions)


def _words(names: Collection[str]) -> Collection[str]:
    # A single string is a collection of letters: taken for the one name it means.
    return (names,) if isinstance(names, str) else names


def _fail(name: str, problem: str) -> ToolDefinitionError:
    return ToolDefinitionError(f"tool {name}: {problem}")


def check_contract(contract: ToolContract) -> None:
    """Refuse a contract the runtime cannot use safely, saying what to add or remove."""
    if not isinstance(contract.name, str) or not TOOL_NAME.fullmatch(contract.name):
        raise ToolDefinitionError(f"tool name {contract.name!r} is not a valid function name")
    name = contract.name
    if not isinstance(contract.description, str) or not contract.description.strip():
        raise _fail(name, "give it a docstring or description=...: the model reads it")
    for what in ("args_model", "output_model"):
        if not _is_model(getattr(contract, what)):
            raise _fail(
                name, f"{what}= takes a pydantic model class (got {getattr(contract, what)!r})"
            )
    if not isinstance(contract.effect, Effect):
        raise _fail(name, f"effect is {contract.effect!r}, not Effect.READ or Effect.WRITE")
    _check_numbers(contract)
    _check_fields(contract, "sensitive", contract.args_model)
    _check_fields(contract, "editable", contract.args_model)
    _check_effect(contract)
    if contract.effect is Effect.WRITE:
        _check_write(contract)
    functions = {f.name: getattr(contract, f.name) for f in fields(contract)}
    rules = _rules(contract.preconditions)
    functions |= {f"preconditions[{i}]": rule for i, rule in enumerate(rules)}
    for what, function in functions.items():
        if callable(function) and not isinstance(function, type):
            synchronous(f"tool {name}", what, function)


def _check_numbers(contract: ToolContract) -> None:
    limits = {
        "timeout_s": contract.timeout_s,
        "max_result_bytes": contract.max_result_bytes,
        "max_attempts": contract.max_attempts,
    }
    for what, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise _fail(contract.name, f"{what} must be a number above 0, not {value!r}")
        if not math.isfinite(value):
            raise _fail(contract.name, f"{what} must be finite, not {value!r}")


def _check_fields(contract: ToolContract, what: str, model: type[BaseModel]) -> None:
    unknown = sorted(set(getattr(contract, what)) - set(model.model_fields))
    if unknown:
        raise _fail(
            contract.name, f"{what} names {', '.join(unknown)}, which {model.__name__} lacks"
        )


def _declared(contract: ToolContract, defaults: Mapping[str, object]) -> list[str]:
    """The declarations of `defaults` that `contract` makes (an empty collection declares none)."""
    return [
        what
        for what, default in defaults.items()
        if (value := getattr(contract, what)) != default
        and not (isinstance(value, Collection) and not value and not isinstance(value, str))
    ]


def _check_effect(contract: ToolContract) -> None:
    if contract.effect is Effect.READ and (misplaced := _declared(contract, _WRITE_ONLY)):
        raise _fail(
            contract.name,
            f"{', '.join(misplaced)}: a write's declarations, and this tool is a read (a read is "
            "never journaled, approved or reconciled): declare it a write, or drop them",
        )
    if contract.effect is Effect.WRITE and (misplaced := _declared(contract, _READ_ONLY)):
        raise _fail(
            contract.name,
            f"{', '.join(misplaced)}: a read's declarations, and this tool is a write (a write is "
            "sent once and reconciled, never retried or polled): drop them",
        )


def _check_write(contract: ToolContract) -> None:
    name = contract.name
    if contract.intent is None:
        raise _fail(
            name,
            "a write needs its business intent key: intent=lambda run_id, args: "
            "f'<what>:{run_id}:<the target>' (one intent per business effect, never a call id)",
        )
    if contract.guarantee is not Guarantee.NONE and contract.reconcile is None:
        raise _fail(
            name,
            f"guarantee {contract.guarantee.value} needs reconcile=... (how to ask the business "
            "system whether an intent happened), or declare guarantee=Guarantee.NONE (every "
            "unknown outcome then goes to a person)",
        )
    if contract.resend is not None and contract.guarantee is not Guarantee.QUERYABLE:
        raise _fail(
            name,
            "resend= is for a downstream without keys (guarantee=Guarantee.QUERYABLE): one that "
            "dedupes by key is re-sent under its key, one that cannot be asked never is",
        )
    if contract.verify is None and (contract.reconcile is None or contract.pre_image is not None):
        raise _fail(
            name,
            "declare verify=... (how to check in the business system that a succeeded write is "
            "there): without it no run with this write can be verified complete",
        )
    if not isinstance(contract.needs_approval, bool | str) and not callable(
        contract.needs_approval
    ):
        raise _fail(
            name,
            f"needs_approval is {contract.needs_approval!r}: True (always), a reason in words"
            " (always, saying why), False (never) or a condition needs_approval=lambda ctx,"
            " args: ... answering one of them",
        )
    _produced(contract)


def _produced(contract: ToolContract) -> dict[str, str]:
    """Each produced identifier field with the pattern that finds it in text."""
    produces, output = contract.produces, contract.output_model
    given = dict(produces) if isinstance(produces, Mapping) else dict.fromkeys(_words(produces), "")
    unknown = sorted(set(given) - set(output.model_fields))
    if unknown:
        raise _fail(
            contract.name, f"produces names {', '.join(unknown)}, which {output.__name__} lacks"
        )
    properties = output.model_json_schema().get("properties", {})
    patterns = {}
    for field_name, pattern in given.items():
        pattern = pattern or properties.get(field_name, {}).get("pattern", "")
        if not pattern:
            raise _fail(
                contract.name,
                f"produces {field_name!r} has no pattern: give produces={{{field_name!r}: "
                "r'...'} or a Field(pattern=...) on the output model",
            )
        patterns[field_name] = _ANCHORS.sub("", pattern)
    return patterns
