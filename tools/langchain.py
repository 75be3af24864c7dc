"""LangChain tools (`@tool`, `BaseTool`) as tool contracts, for teams coming from
`create_react_agent`: their tools keep working, as reads directly, as writes only once the
write's declarations (intent key, guarantee, reconcile) are added.

The model sees the tool's own name, description and call schema. A LangChain tool returns any
value, so the output contract is `{"result": <value>}`. A read that raises is a definitive
fault the model hears about; a write that raises anything but a `ToolFault` may have applied
downstream, so its outcome is UNKNOWN and reconciled, never taken for a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool
from pydantic import BaseModel

from loopwright.tools.contract import (
    Effect,
    OutcomeUnknown,
    ToolContext,
    ToolContract,
    ToolDefinitionError,
    ToolFault,
)
from loopwright.tools.define import function_contract
from loopwright.tools.json_schema import schema_model


class LangChainResult(BaseModel):
    """What a LangChain tool returned."""

    result: Any


def _args_model(tool: BaseTool) -> type[BaseModel]:
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema
    # A JSON Schema (or a pydantic v1 model, described by one).
    raw = schema if isinstance(schema, dict) else schema.schema()
    return schema_model(f"{tool.name}_args", raw, closed=True)


def _as_function(tool: BaseTool, *, write: bool) -> Any:
    """A typed function calling `tool`, in the shape a read's or a write's function has."""
    if getattr(tool, "func", True) is None and getattr(tool, "coroutine", None) is not None:
        raise ToolDefinitionError(
            f"tool {tool.name}: it is async only (coroutine=, no func=), and loopwright calls"
            " tools synchronously: give it a plain function too"
        )

    def invoke(args: BaseModel) -> LangChainResult:
        try:
            return LangChainResult(result=tool.invoke(args.model_dump(mode="json")))
        except ToolFault:
            raise
        except Exception as exc:
            if write:
                raise OutcomeUnknown(f"{tool.name} raised {type(exc).__name__}") from exc
            raise ToolFault("tool_error", f"{tool.name}: {exc}") from exc

    def read(ctx: ToolContext[Any], args: BaseModel) -> LangChainResult:
        return invoke(args)

    def written(ctx: ToolContext[Any], args: BaseModel, intent_key: str) -> LangChainResult:
        return invoke(args)

    function = written if write else read
    function.__annotations__ = {"args": _args_model(tool), "return": LangChainResult}
    function.__name__ = tool.name
    function.__doc__ = tool.description
    return function


def langchain_contract(tool: BaseTool, effect: Effect, options: Mapping[str, Any]) -> ToolContract:
    """A LangChain tool as a tool of `effect`, with its options (named as the tool, unless
    `name=`)."""
    return function_contract(_as_function(tool, write=effect is Effect.WRITE), effect, options)
