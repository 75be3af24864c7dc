"""The span of a model call (`model_span`, `note_model_reply`): a `chat MODEL` span with the
OpenTelemetry GenAI attributes trace viewers read (operation, provider, requested and answering
model, token usage, finish reasons, the request's temperature and token limit where the model
says them), the prompt version, latency (the span's duration) and error class. No message
content: the prompt holds what tools returned, arguments marked sensitive included.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind

from loopwright.nodes.context import model_name
from loopwright.observability.attributes import Attributes
from loopwright.observability.tracing import active_tracer, span


def model_span(model: BaseChatModel, prompt_version: str) -> AbstractContextManager[Span]:
    if active_tracer() is None:
        return nullcontext(INVALID_SPAN)
    model_id = model_name(model)
    return span(
        f"chat {model_id}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model_id,
            **_request_params(model),
            "loopwright.prompt_version": prompt_version,
        },
    )


# What LangChain says of a model's requests (`_get_ls_params`, the hook its own tracing reads),
# as the GenAI conventions name it.
_REQUEST_PARAMS = {
    "ls_temperature": "gen_ai.request.temperature",
    "ls_max_tokens": "gen_ai.request.max_tokens",
}


def _request_params(model: BaseChatModel) -> Attributes:
    """The model's provider (under the conventions' current name and the one older viewers
    read), and the temperature and token limit it asks with, where it says them."""
    try:
        params: Mapping[str, Any] = model._get_ls_params()
    except Exception:  # a model of the user's own that cannot say: the span goes without
        return {}
    attributes: Attributes = {}
    if provider := params.get("ls_provider"):
        attributes["gen_ai.provider.name"] = attributes["gen_ai.system"] = str(provider)
    for key, name in _REQUEST_PARAMS.items():
        if isinstance(value := params.get(key), int | float) and not isinstance(value, bool):
            attributes[name] = value
    return attributes


def note_model_reply(opened: Span, reply: object) -> None:
    if not opened.is_recording() or not isinstance(reply, AIMessage):
        return
    attributes: Attributes = {"loopwright.tool_calls": len(reply.tool_calls)}
    if reply.usage_metadata:
        attributes["gen_ai.usage.input_tokens"] = reply.usage_metadata["input_tokens"]
        attributes["gen_ai.usage.output_tokens"] = reply.usage_metadata["output_tokens"]
    metadata = reply.response_metadata
    if answered_by := metadata.get("model_name") or metadata.get("model"):
        attributes["gen_ai.response.model"] = str(answered_by)
    if reply.id:
        attributes["gen_ai.response.id"] = reply.id
    if finish := metadata.get("finish_reason"):
        attributes["gen_ai.response.finish_reasons"] = [str(finish)]
    opened.set_attributes(attributes)
