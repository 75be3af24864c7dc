"""The span of a tool call (`tool_span`, opened by the executor around each send): an
`execute_tool NAME` span with the contract's schema hash, the arguments' digest (the arguments
themselves only with raw capture, sensitive fields always redacted), and for writes the action
id, intent key and attempt."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry.trace import INVALID_SPAN, Span
from pydantic import BaseModel

from loopwright.core.state import Action
from loopwright.observability.attributes import Attributes, args_attributes
from loopwright.observability.tracing import active_tracer, span
from loopwright.tools.contract import ToolContract


def tool_span(
    contract: ToolContract,
    args: BaseModel | Mapping[str, Any],
    *,
    call_id: str,
    action: Action | None = None,
) -> AbstractContextManager[Span]:
    """The span of one tool call (a read, or one send of a write: `action`)."""
    if active_tracer() is None:
        return nullcontext(INVALID_SPAN)
    values = args.model_dump(mode="json") if isinstance(args, BaseModel) else args
    attributes: Attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": contract.name,
        "gen_ai.tool.call.id": call_id,
        "loopwright.tool.effect": contract.effect.value,
        "loopwright.tool.schema_hash": contract.schema_hash,
        **args_attributes(values, frozenset(contract.sensitive)),
    }
    if action is not None:
        attributes |= {
            "loopwright.action_id": action.action_id,
            "loopwright.intent_key": action.intent_key,
            "loopwright.attempt": action.attempts + 1,
        }
    return span(
        f"execute_tool {contract.name}",
        run_id=action.run_id if action is not None else None,
        attributes=attributes,
    )
