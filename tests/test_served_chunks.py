"""A served run hands its engine values chunks whose history is already dumped
(`loopwright.server.chunks`): each engine must encode them to the very bytes it encoded the
messages to, or a client, Studio and a run's recorded output would read something else."""

from __future__ import annotations

from typing import Any

from aegra_api.core.sse import format_sse_message
from aegra_api.services.redis_broker import _serialize_payload
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph_api.serde import json_dumpb

from loopwright.server.chunks import DumpedHistory
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, decide, principal

ENCODERS = {
    "aegra broker": _serialize_payload,
    "aegra sse": lambda chunk: format_sse_message("values", chunk),
    "langgraph server": json_dumpb,
}
SHAPES = {
    # stream_mode as the engine passes it -> the chunk LangGraph streams for a state
    "values": lambda state: state,
    "['values', 'updates']": lambda state: ("values", state),
    "subgraphs": lambda state: ((), "values", state),
}


def finished_state(open_test_runner: RunnerFactory) -> dict[str, Any]:
    """The state of a refund run that asked for approval and completed: every kind of message
    a run's history holds (the task, tool calls, tool answers, the final answer)."""
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
        outcome = runner.resume(waiting.run_id, decide(waiting))
        assert outcome.stop_reason == "completed"
        return dict(runner.state(waiting.run_id))


def test_a_values_chunk_reaches_each_engine_as_the_same_bytes(
    open_test_runner: RunnerFactory,
) -> None:
    state = finished_state(open_test_runner)
    assert any(isinstance(m, BaseMessage) for m in state["history"])
    for shape, make in SHAPES.items():
        mode: Any = "values" if shape == "values" else ["values", "updates"]
        chunk, ready = make(state), DumpedHistory(mode)
        for encoder, encode in ENCODERS.items():
            # Twice: the second time from the dumps kept of the first.
            for _ in range(2):
                assert encode(ready(chunk)) == encode(chunk), (shape, encoder)


def test_a_message_is_dumped_as_it_is_when_the_chunk_comes() -> None:
    """A message object new to the attempt (a state read again) is dumped anew, and chunks of
    other modes pass untouched."""
    ready = DumpedHistory(["values", "updates"])
    first = [HumanMessage("refund O-42", id="m-1")]
    assert ready(("values", {"history": first}))[1]["history"][0]["content"] == "refund O-42"
    again = [HumanMessage("refund O-43", id="m-1"), AIMessage("done", id="m-2")]
    dumped = ready(("values", {"history": again, "step": 2}))[1]
    assert [m["content"] for m in dumped["history"]] == ["refund O-43", "done"]
    assert dumped["step"] == 2
    update = ("updates", {"model_step": {"history": again}})
    assert ready(update) is update
