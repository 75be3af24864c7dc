"""Budgets as a small typed value with pure checks against the projected usage.

In the spirit of pydantic-ai's `UsageLimits`: `Budget` holds the limits (from the run context),
`Usage` what the run has used so far (in state, B). The checks are pure functions of both and of
the clock, so a resumed run decides exactly as the original would have.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from loopwright.core.state import StopReason


class Price(BaseModel):
    """What a model costs, in USD per million tokens."""

    model_config = ConfigDict(frozen=True)

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


class Usage(BaseModel):
    steps: int = 0
    model_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    tool_calls: int = 0
    tool_attempts: int = 0
    tool_result_bytes: int = 0

    def after_model_request(self, input_tokens: int, output_tokens: int, price: Price) -> Usage:
        return self.model_copy(
            update={
                "steps": self.steps + 1,
                "model_requests": self.model_requests + 1,
                "input_tokens": self.input_tokens + input_tokens,
                "output_tokens": self.output_tokens + output_tokens,
                "cost_usd": self.cost_usd + price.cost(input_tokens, output_tokens),
            }
        )

    def after_failed_model_request(self) -> Usage:
        """A request that raised: counted, though no tokens are known for it."""
        return self.model_copy(
            update={"steps": self.steps + 1, "model_requests": self.model_requests + 1}
        )


@dataclass(frozen=True)
class RequestBounds:
    """What bounds the model request being made now: when it must be over, how many tokens it
    may answer with. Set by the model step for the request (`REQUEST_BOUNDS`); a model client
    that can enforce them does (`loopwright.models.openai_chat`)."""

    stop_by: datetime
    max_output_tokens: int


REQUEST_BOUNDS: ContextVar[RequestBounds | None] = ContextVar("request_bounds", default=None)


class BudgetExceeded(BaseModel):
    reason: StopReason
    detail: str


class Budget(BaseModel):
    """The limits of a run: steps, end-to-end deadline, tokens, cost, parallel tools, result
    bytes, tool attempts. Checks are pure functions of the limits, the usage and the clock."""

    model_config = ConfigDict(frozen=True)

    max_steps: int = 20
    deadline_s: float = 300.0
    max_input_tokens: int = 200_000
    # What one model request may be sent; older history is summarised to fit (compaction).
    max_context_tokens: int = 24_000
    max_output_tokens: int = 50_000
    # One model request: at most this long (streamed or not, whatever the run's deadline
    # leaves), and at most this many output tokens (whatever the run's token budget leaves).
    max_model_request_s: float = 120.0
    max_output_tokens_per_request: int = 4_096
    max_cost_usd: float = 5.0
    max_parallel_tools: int = 4
    max_tool_result_bytes: int = 1_000_000
    max_tool_attempts: int = 50
    # USD per million tokens by model id; a model not listed costs nothing (the scripted one).
    prices: dict[str, Price] = Field(default_factory=dict)

    def request_bounds(self, usage: Usage, started_at: datetime, now: datetime) -> RequestBounds:
        """The bounds of the next model request: its own limits, and what the run has left."""
        stop_by = min(now + timedelta(seconds=self.max_model_request_s), self.deadline(started_at))
        left = max(1, self.max_output_tokens - usage.output_tokens)
        return RequestBounds(stop_by, min(self.max_output_tokens_per_request, left))

    def price(self, model_id: str) -> Price:
        return self.prices.get(model_id, Price())

    def deadline(self, started_at: datetime) -> datetime:
        return started_at + timedelta(seconds=self.deadline_s)

    def check_deadline(self, started_at: datetime, now: datetime) -> BudgetExceeded | None:
        if now >= self.deadline(started_at):
            return BudgetExceeded(
                reason=StopReason.DEADLINE_EXCEEDED,
                detail=f"the run passed its {self.deadline_s:g}s deadline",
            )
        return None

    def check_before_request(
        self, usage: Usage, started_at: datetime, now: datetime
    ) -> BudgetExceeded | None:
        """May the run ask the model once more?"""
        if usage.steps + 1 > self.max_steps:
            return BudgetExceeded(
                reason=StopReason.MAX_STEPS, detail=f"{usage.steps} of {self.max_steps} steps used"
            )
        if (late := self.check_deadline(started_at, now)) is not None:
            return late
        for used, limit, what in (
            (usage.input_tokens, self.max_input_tokens, "input tokens"),
            (usage.output_tokens, self.max_output_tokens, "output tokens"),
        ):
            if used >= limit:
                return BudgetExceeded(
                    reason=StopReason.BUDGET_EXHAUSTED, detail=f"{used} of {limit} {what} used"
                )
        if usage.cost_usd >= self.max_cost_usd:
            return BudgetExceeded(
                reason=StopReason.BUDGET_EXHAUSTED,
                detail=f"${usage.cost_usd:.4f} of ${self.max_cost_usd:.2f} spent",
            )
        return None

    def check_before_tool_call(
        self, usage: Usage, started_at: datetime, now: datetime, *, calls: int = 1
    ) -> BudgetExceeded | None:
        """May the run start `calls` more tool calls?"""
        if (late := self.check_deadline(started_at, now)) is not None:
            return late
        if usage.tool_attempts + calls > self.max_tool_attempts:
            return BudgetExceeded(
                reason=StopReason.BUDGET_EXHAUSTED,
                detail=f"{usage.tool_attempts} of {self.max_tool_attempts} tool attempts used",
            )
        if usage.tool_result_bytes >= self.max_tool_result_bytes:
            return BudgetExceeded(
                reason=StopReason.BUDGET_EXHAUSTED,
                detail=f"{usage.tool_result_bytes} of {self.max_tool_result_bytes} result bytes",
            )
        return None
