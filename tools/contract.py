"""The tool contract: what the runtime must know about a tool before it lets a model use it.

A tool is more than a function. Its contract declares the argument schema and output contract,
whether it reads or writes, which resources it touches, how to authorise it for a principal,
when it needs approval, and for writes: the business intent it carries, how to ask the business
system about that intent (reconcile), how to check the outcome (verify), and what guarantee the
downstream gives (idempotent by key / queryable / neither).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import httpx
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict

from loopwright.graph.state import Action, Principal, digest, utcnow
from loopwright_refunds.services.endpoints import ServiceEndpoints

MIN_TIMEOUT_S = 0.05


class Effect(StrEnum):
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
class ToolEnv:
    """What tool code may use: the business services and one HTTP client (connection reuse).

    `deadline` is the run's end-to-end deadline; every call's own timeout is bounded by it
    (`timeout`), so no single call can outlive the run's budget.
    """

    endpoints: ServiceEndpoints
    http: httpx.Client
    deadline: datetime | None = None

    def timeout(self, seconds: float) -> float:
        if self.deadline is None:
            return seconds
        remaining = (self.deadline - utcnow()).total_seconds()
        return max(MIN_TIMEOUT_S, min(seconds, remaining))


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
    def __init__(self, detail: str) -> None:
        super().__init__("permission_denied", detail)


class OutcomeUnknown(Exception):
    """A write was (or may have been) sent and no definitive answer arrived.

    Never a failure: the business system may have applied it. The runtime reconciles.
    """


class ReconcileStatus(StrEnum):
    APPLIED = "applied"  # the business system has the intent and it succeeded
    ABSENT = "absent"  # definitively not there: safe to re-send under the same key
    PENDING = "pending"  # known to the business system, not finished yet
    UNCONFIRMABLE = "unconfirmable"  # cannot be asked, or the answer is not trustworthy


@dataclass(frozen=True)
class ReconcileResult:
    status: ReconcileStatus
    outcome: dict[str, Any] | None = None
    detail: str = ""
    retry_after_s: float = 1.0


@dataclass(frozen=True)
class VerifyResult:
    verified: bool
    facts: dict[str, Any]
    problem: str = ""


def _no_resources(_args: Any) -> frozenset[str]:
    return frozenset()


def _always_allowed(_principal: Principal, _args: Any, _env: ToolEnv) -> None:
    return None


def _never(_args: Any, _env: ToolEnv) -> bool:
    return False


@dataclass(frozen=True)
class ToolContract:
    name: str
    description: str
    args_model: type[BaseModel]
    output_model: type[BaseModel]
    effect: Effect
    # Perform the call. For writes, `idempotency_key` is the business intent key (never the
    # model's call id). Raises ToolFault (definitive) or OutcomeUnknown (writes only).
    run: Callable[[ToolEnv, Any, str | None], dict[str, Any]]
    resources: Callable[[Any], frozenset[str]] = _no_resources
    authorize: Callable[[Principal, Any, ToolEnv], None] = _always_allowed
    needs_approval: Callable[[Any, ToolEnv], bool] = _never
    # Writes: the intent key for these args within a run; for a downstream without keys, a
    # pre-image read journaled with DISPATCHED before the send; reconcile an unknown outcome
    # (given the journaled pre-image, if any); verify a succeeded one.
    intent_key: Callable[[str, Any], str] | None = None
    pre_image: Callable[[ToolEnv, Any], dict[str, Any]] | None = None
    reconcile: Callable[[ToolEnv, Action, dict[str, Any] | None], ReconcileResult] | None = None
    verify: Callable[[ToolEnv, Action], VerifyResult] | None = None
    summarize: Callable[[Any], str] | None = None
    # Reads of asynchronous operations: seconds until it is worth asking again when a result
    # says "not finished yet" (a poll is not mistaken for a loop without progress).
    poll_after: Callable[[dict[str, Any]], float | None] | None = None
    # Writes: the current version of each resource the write touches, compared right before the
    # send with the version the model observed when it planned the write.
    current_versions: Callable[[ToolEnv, Any], dict[str, str]] | None = None
    # Writes: how a succeeded action could be undone, offered to a person (never performed by
    # the runtime) when a run is cancelled after the write.
    compensation: Callable[[Action], str] | None = None
    guarantee: Guarantee = Guarantee.NONE
    timeout_s: float = 5.0
    max_attempts: int = 2  # reads: transport faults retried in this one layer
    max_result_bytes: int = 64_000
    sensitive_fields: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.effect is Effect.WRITE and self.intent_key is None:
            raise ValueError(f"write tool {self.name} must declare its business intent key")

    @property
    def schema_hash(self) -> str:
        """Changes whenever the model-visible schema or the output contract changes."""
        return digest(
            {
                "tool": self.openai_schema(),
                "output": self.output_model.model_json_schema(),
                "effect": self.effect,
            }
        )[:16]

    def openai_schema(self) -> dict[str, Any]:
        schema = convert_to_openai_tool(self.args_model)
        schema["function"]["name"] = self.name
        schema["function"]["description"] = self.description
        return schema

    def describe(self, args: BaseModel) -> str:
        """A one-line human summary of a call, shown to approvers."""
        if self.summarize is not None:
            return self.summarize(args)
        shown = {
            k: "[redacted]" if k in self.sensitive_fields else v
            for k, v in args.model_dump(mode="json").items()
        }
        return f"{self.name}({shown})"
