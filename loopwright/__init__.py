"""loopwright: a recoverable agent runtime on LangGraph.

Define an agent and its tools, then run, resume and serve it:

    from loopwright import Agent, Guarantee, ToolContext

    agent = Agent("ops", instructions="Restart services on request.", deps=open_inventory)

    @agent.write(intent=lambda run_id, a: f"restart:{run_id}:{a.name}",
                 guarantee=Guarantee.QUERYABLE, reconcile=was_restarted)
    def restart(ctx: ToolContext[Inventory], args: Restart, intent_key: str) -> Restarted:
        '''Restart a service.'''
        ...

Everything a user writes goes through the names below (`__all__`). They load on first use, so
that importing loopwright (or asking its CLI for help) costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
import inspect
from enum import Enum
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# Public name -> the module that defines it.
_HOMES = {
    # Agents and their tools
    "Agent": "loopwright._agent",
    "Demo": "loopwright._agent",
    "TaskRefused": "loopwright._agent",
    "Roles": "loopwright.core.roles",
    "InvalidText": "loopwright.core.text",
    "load_agent": "loopwright._loading",
    "AgentProfile": "loopwright.nodes.agents",
    "ToolContext": "loopwright.tools.contract",
    "ToolContract": "loopwright.tools.contract",
    "Effect": "loopwright.tools.contract",
    "Guarantee": "loopwright.tools.contract",
    "ToolFault": "loopwright.tools.contract",
    "PermissionDenied": "loopwright.tools.contract",
    "PreconditionFailed": "loopwright.tools.contract",
    "OutcomeUnknown": "loopwright.tools.contract",
    "ReconcileResult": "loopwright.tools.contract",
    "ReconcileStatus": "loopwright.tools.contract",
    "ResendAfterDeadline": "loopwright.tools.contract",
    "VerifyResult": "loopwright.tools.contract",
    "read_tool": "loopwright.tools.define",
    "write_tool": "loopwright.tools.define",
    "ToolDefinitionError": "loopwright.tools.contract",
    "read_json": "loopwright.tools.http",
    "write_json": "loopwright.tools.http",
    "McpServer": "loopwright.tools.mcp",
    "McpAnswer": "loopwright.tools.mcp",
    "ReadOptions": "loopwright.tools.options",
    "WriteOptions": "loopwright.tools.options",
    "Programs": "loopwright.tools.program",
    "SandboxLimits": "loopwright.tools.sandbox",
    # What runs are made of
    "Action": "loopwright.core.state",
    "ActionEvent": "loopwright.checkpoints.journal",
    "ActionStatus": "loopwright.core.state",
    "Principal": "loopwright.core.state",
    "Phase": "loopwright.core.state",
    "StopReason": "loopwright.core.state",
    "RunState": "loopwright.core.state",
    "ApprovalDecision": "loopwright.core.state",
    "ApprovalRequest": "loopwright.core.state",
    "Evidence": "loopwright.core.state",
    "Fact": "loopwright.core.state",
    "Budget": "loopwright.core.budget",
    "Price": "loopwright.core.budget",
    "ToolEnvelope": "loopwright.core.protocol",
    "parse_tool_content": "loopwright.core.protocol",
    "Planner": "loopwright.core.plan",
    "PlannerDecision": "loopwright.core.plan",
    "PlanStep": "loopwright.core.plan",
    "StepStatus": "loopwright.core.plan",
    "crash_point": "loopwright.core.crashpoints",
    "CrashPoint": "loopwright.core.crashpoints",
    # Proving them under faults
    "Fault": "loopwright.tools.faults",
    "Scenario": "loopwright._agent",
    "prove": "loopwright.testing.faults",
    # Running them
    "Runner": "loopwright.runner",
    "RunOutcome": "loopwright.outcome",
    "open_runner": "loopwright.runner",
    "loopwright_home": "loopwright.core.home",
    # Models for tests and demos
    "ScriptedChatModel": "loopwright.testing.scripted",
    "Decision": "loopwright.testing.scripted",
}
__all__ = [
    "Action",
    "ActionEvent",
    "ActionStatus",
    "Agent",
    "AgentProfile",
    "ApprovalDecision",
    "ApprovalRequest",
    "Budget",
    "CrashPoint",
    "Decision",
    "Demo",
    "Effect",
    "Evidence",
    "Fact",
    "Fault",
    "Guarantee",
    "InvalidText",
    "McpAnswer",
    "McpServer",
    "OutcomeUnknown",
    "PermissionDenied",
    "Phase",
    "PlanStep",
    "Planner",
    "PlannerDecision",
    "PreconditionFailed",
    "Price",
    "Principal",
    "Programs",
    "ReadOptions",
    "ReconcileResult",
    "ReconcileStatus",
    "ResendAfterDeadline",
    "Roles",
    "RunOutcome",
    "RunState",
    "Runner",
    "SandboxLimits",
    "Scenario",
    "ScriptedChatModel",
    "StepStatus",
    "StopReason",
    "TaskRefused",
    "ToolContext",
    "ToolContract",
    "ToolDefinitionError",
    "ToolEnvelope",
    "ToolFault",
    "VerifyResult",
    "WriteOptions",
    "crash_point",
    "load_agent",
    "loopwright_home",
    "open_runner",
    "parse_tool_content",
    "prove",
    "read_json",
    "read_tool",
    "write_json",
    "write_tool",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'loopwright' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    from pydantic import BaseModel  # loaded by then: every home imports it

    # One namespace, as httpx does: `loopwright.Agent`, not `loopwright._agent.Agent`. Not for
    # models and enums: LangGraph's serializer stores their module path in checkpoints.
    if (inspect.isclass(value) and not issubclass(value, BaseModel | Enum)) or inspect.isfunction(
        value
    ):
        value.__module__ = __name__
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from loopwright._agent import Agent, Demo, Scenario, TaskRefused
    from loopwright._loading import load_agent
    from loopwright.checkpoints.journal import ActionEvent
    from loopwright.core.budget import Budget, Price
    from loopwright.core.crashpoints import CrashPoint, crash_point
    from loopwright.core.home import loopwright_home
    from loopwright.core.plan import Planner, PlannerDecision, PlanStep, StepStatus
    from loopwright.core.protocol import ToolEnvelope, parse_tool_content
    from loopwright.core.roles import Roles
    from loopwright.core.state import (
        Action,
        ActionStatus,
        ApprovalDecision,
        ApprovalRequest,
        Evidence,
        Fact,
        Phase,
        Principal,
        RunState,
        StopReason,
    )
    from loopwright.core.text import InvalidText
    from loopwright.nodes.agents import AgentProfile
    from loopwright.outcome import RunOutcome
    from loopwright.runner import Runner, open_runner
    from loopwright.testing.faults import prove
    from loopwright.testing.scripted import Decision, ScriptedChatModel
    from loopwright.tools.contract import (
        Effect,
        Guarantee,
        OutcomeUnknown,
        PermissionDenied,
        PreconditionFailed,
        ReconcileResult,
        ReconcileStatus,
        ResendAfterDeadline,
        ToolContext,
        ToolContract,
        ToolDefinitionError,
        ToolFault,
        VerifyResult,
    )
    from loopwright.tools.define import read_tool, write_tool
    from loopwright.tools.faults import Fault
    from loopwright.tools.http import read_json, write_json
    from loopwright.tools.mcp import McpAnswer, McpServer
    from loopwright.tools.options import ReadOptions, WriteOptions
    from loopwright.tools.program import Programs
    from loopwright.tools.sandbox import SandboxLimits
