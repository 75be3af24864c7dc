"""Baseline B: a plain agent loop with the semantics of the popular agent SDKs.

Ask the model; run each tool call it makes; append the results; repeat until it answers. A tool
that raises, a timeout included, is reported to the model as an error it may act on (the OpenAI
Agents SDK's default error text), so the model may try again. Nothing is persisted: a process
that dies loses the conversation, and the job is delivered again by whatever queue feeds the
loop. The payment service's required idempotency key is a fresh uuid per request, which is what
a tool without a notion of intent ends up sending.
"""

from __future__ import annotations

import uuid

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from loopwright.graph.crashpoints import crash_point
from loopwright_refunds.experiments.systems import MAX_MODEL_CALLS, Deployment, Job, Trace
from loopwright_refunds.experiments.systems.http_tools import (
    RefundHttp,
    credit_tool,
    read_tools,
)
from loopwright_refunds.services.endpoints import tls_context

ERROR_TEXT = "An error occurred while running the tool. Please try again. Error: {error}"


def submit_tool(http: RefundHttp) -> BaseTool:
    @tool
    def submit_refund(order_id: str, amount: str, currency: str, reason: str) -> str:
        """Refund an amount of an order to the customer. Moves money."""
        args = {"order_id": order_id, "amount": amount, "currency": currency, "reason": reason}
        return http.submit_refund(args, idempotency_key=str(uuid.uuid4()))

    return submit_refund


def run_loop(model: BaseChatModel, tools: list[BaseTool], task: str) -> list[BaseMessage]:
    """The loop itself; returns the conversation, ending with the model's answer if it gave one."""
    by_name = {t.name: t for t in tools}
    bound = model.bind_tools(tools)
    messages: list[BaseMessage] = [HumanMessage(task)]
    for _ in range(MAX_MODEL_CALLS):
        crash_point("node:model_step:start")
        reply = bound.invoke(messages)
        assert isinstance(reply, AIMessage)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            crash_point("node:execute:start")
            try:
                if call["name"] not in by_name:
                    raise LookupError(f"no tool named {call['name']}")
                content = str(by_name[call["name"]].invoke(call["args"]))
            except Exception as exc:  # every tool failure goes back to the model
                content = ERROR_TEXT.format(error=exc)
            messages.append(ToolMessage(content, tool_call_id=call["id"] or "", name=call["name"]))
    return messages


class PlainLoop:
    name = "plain_loop"

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def deliver(self, job: Job, model: BaseChatModel) -> None:
        with httpx.Client(verify=tls_context()) as client:
            http = RefundHttp(self.deployment.endpoints, client)
            run_loop(model, [*read_tools(http), submit_tool(http), credit_tool(http)], job.task)

    def recover(self, job: Job, model: BaseChatModel) -> None:
        """Nothing survived the crash: the queue delivers the job again."""
        self.deliver(job, model)

    def inspect(self, job: Job) -> Trace:
        return Trace(end="not recorded (nothing is persisted)")
