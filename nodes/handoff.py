"""handoff: record that another agent now owns the run; the specialist subgraph takes it from here.

The handoff call itself was validated and answered like any tool call (it touches no business
system). This node only records ownership, durably, before the specialist runs: who handed what
to whom, why, and when.
"""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from loopwright.core.crashpoints import crash_point
from loopwright.core.state import CallVerdict, Phase, RunState
from loopwright.core.views import pending_of
from loopwright.nodes.agents import PRIMARY, handoff_target
from loopwright.nodes.context import RunContext


def handoff(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:handoff:start")
    call = next(
        c for c in pending_of(state) if c.verdict is CallVerdict.DONE and handoff_target(c.tool)
    )
    record = {
        "from": state.get("owner") or PRIMARY,
        "to": handoff_target(call.tool),
        "reason": call.args.get("reason", ""),
        "call_id": call.call_id,
        "at": runtime.context.now().isoformat(),
    }
    return {
        "owner": record["to"],
        "handoffs": [*(state.get("handoffs") or []), record],
        "phase": Phase.READY.value,
    }
