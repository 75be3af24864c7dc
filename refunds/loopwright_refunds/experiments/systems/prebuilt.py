"""Baseline A: the stock LangGraph tool-calling agent, as the documentation builds it.

`create_react_agent` from langgraph-prebuilt with a `ToolNode` that returns tool errors to the
model, checkpointed by LangGraph's own `PostgresSaver` (the same kind of checkpointer loopwright
uses) with the default durability. The refund is sent under an idempotency key derived from the
model's tool call id, the usual way to make a tool "idempotent" in such an agent: a re-executed
tool node re-sends the same call under the same key, but a call the model makes again after an
error is a new call with a new key.

Recovery after a crash is LangGraph's documented one: invoke the thread again with no input, so
it continues from its last checkpoint.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, create_react_agent
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from langgraph.warnings import LangGraphDeprecatedSinceV10

from loopwright.graph.crashpoints import crash_point
from loopwright_refunds.experiments.systems import MAX_MODEL_CALLS, Deployment, Job, Trace
from loopwright_refunds.experiments.systems.http_tools import (
    RefundHttp,
    credit_tool,
    read_tools,
)
from loopwright_refunds.services.endpoints import tls_context

# pre-model hook, model, tools: three supersteps per model call.
RECURSION_LIMIT = 3 * MAX_MODEL_CALLS + 5


def submit_tool(http: RefundHttp) -> BaseTool:
    @tool
    def submit_refund(
        order_id: str,
        amount: str,
        currency: str,
        reason: str,
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> str:
        """Refund an amount of an order to the customer. Moves money."""
        args = {"order_id": order_id, "amount": amount, "currency": currency, "reason": reason}
        return http.submit_refund(args, idempotency_key=f"call:{tool_call_id}")

    return submit_refund


def _before_model(_state: dict[str, Any]) -> dict[str, Any]:
    """The crash window "the model is about to be asked", as in loopwright's model step."""
    crash_point("node:model_step:start")
    return {}


def _before_tool(
    request: ToolCallRequest, execute: Callable[[ToolCallRequest], ToolMessage | Command]
) -> ToolMessage | Command:
    """The crash window "the decision is made, its tools have not run", as loopwright's execute."""
    crash_point("node:execute:start")
    return execute(request)


class PrebuiltAgent:
    name = "prebuilt"

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    @contextmanager
    def _agent(
        self, model: BaseChatModel
    ) -> Iterator[tuple[CompiledStateGraph[Any, Any, Any, Any], PostgresSaver]]:
        with (
            PostgresSaver.from_conn_string(self.deployment.database_url) as saver,
            httpx.Client(verify=tls_context()) as client,
        ):
            saver.setup()
            http = RefundHttp(self.deployment.endpoints, client)
            tools = ToolNode(
                [*read_tools(http), submit_tool(http), credit_tool(http)],
                handle_tool_errors=True,
                wrap_tool_call=_before_tool,
            )
            with warnings.catch_warnings():
                # Deprecated for langchain's create_agent, which needs the langchain package; the
                # prebuilt agent is still LangGraph's own stock tool-calling agent.
                warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
                agent = create_react_agent(
                    model, tools, checkpointer=saver, pre_model_hook=_before_model
                )
            yield agent, saver

    @staticmethod
    def _config(job: Job) -> RunnableConfig:
        return {"configurable": {"thread_id": job.job_id}, "recursion_limit": RECURSION_LIMIT}

    def deliver(self, job: Job, model: BaseChatModel) -> None:
        with self._agent(model) as (agent, _):
            agent.invoke({"messages": [HumanMessage(job.task)]}, self._config(job))

    def recover(self, job: Job, model: BaseChatModel) -> None:
        """Continue from the last checkpoint; start over only if nothing was checkpointed.

        Not keyed on `get_state().next`: with the default (async) durability a crash can leave
        a checkpoint whose pending task already wrote, which `next` leaves out, so the thread
        would look finished when it is not. Invoking with no input is harmless on a finished one.
        """
        with self._agent(model) as (agent, saver):
            config = self._config(job)
            if saver.get_tuple(config) is None:
                agent.invoke({"messages": [HumanMessage(job.task)]}, config)
            else:
                agent.invoke(None, config)

    def inspect(self, job: Job) -> Trace:
        with PostgresSaver.from_conn_string(self.deployment.database_url) as saver:
            checkpoint = saver.get_tuple(self._config(job))
        messages = checkpoint.checkpoint["channel_values"].get("messages", []) if checkpoint else []
        answered = bool(messages) and isinstance(messages[-1], AIMessage)
        answered = answered and not messages[-1].tool_calls
        return Trace(end="answered" if answered else "unfinished")
