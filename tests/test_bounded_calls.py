"""A bounded call ends by the clock (`core.bounded.call_by`), and the model client's request
it abandoned ends too: no thread is left reading a stream that never stops."""

from __future__ import annotations

import os
import threading

import pytest
from langchain_core.messages import HumanMessage

from loopwright.core.bounded import CallOutlasted, call_by, current_call
from tests.openai_server import HOLDS, Hold, ModelFactory, OpenAIStub
from tests.runtime_fixtures import wait_for


def test_a_call_that_returns_in_time_gives_its_result_or_its_error() -> None:
    assert call_by(5, lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        call_by(5, lambda: 1 / 0)


def test_a_call_past_its_bound_is_abandoned_and_told_so() -> None:
    released = threading.Event()
    let_go: list[bool] = []

    def blocks() -> None:
        call = current_call()
        assert call is not None
        call.on_abandon(lambda: let_go.append(True))
        released.wait(30)

    with pytest.raises(CallOutlasted, match=r"the wait was still going after its bound of 0\.2 s"):
        call_by(0.2, blocks, what="the wait")
    released.set()
    assert let_go == [True]


def test_a_thread_whose_call_returned_runs_the_next_call() -> None:
    first = call_by(5, threading.get_ident)
    assert call_by(5, threading.get_ident) == first


def test_a_thread_whose_call_was_abandoned_runs_no_other_and_ends() -> None:
    released = threading.Event()
    ran_on: list[threading.Thread] = []

    def blocks() -> None:
        ran_on.append(threading.current_thread())
        released.wait(30)

    with pytest.raises(CallOutlasted):
        call_by(0.2, blocks)
    assert call_by(5, threading.current_thread) is not ran_on[0]
    released.set()
    ran_on[0].join(10)
    assert not ran_on[0].is_alive()


# Forking a process with threads is what is tested (the command-line server forks each command).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_runs_its_calls_on_threads_of_its_own() -> None:
    """The parent's idle threads are not in the child: a call given to one would never run."""
    call_by(5, lambda: None)  # leaves an idle thread in this process
    child = os.fork()
    if child == 0:
        try:
            code = 0 if call_by(5, lambda: 7) == 7 else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _bounded_call_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bounded-call"]


@pytest.mark.parametrize("how", HOLDS)
def test_an_abandoned_model_request_lets_go_of_its_connection(
    openai_stub: OpenAIStub, openai_model: ModelFactory, how: Hold
) -> None:
    """The client's transport ends the request the model step stopped waiting for: the
    thread that made it is gone soon after, whatever the server goes on sending."""
    model = openai_model("chat", stream=True, timeout_s=60, retries=2)
    openai_stub.hold_next(how)
    before = set(_bounded_call_threads())
    with pytest.raises(CallOutlasted):
        call_by(0.5, lambda: model.invoke([HumanMessage("hello")]), what="the model request")
    wait_for(lambda: not set(_bounded_call_threads()) - before)
    assert len(openai_stub.requests()) == 1  # and no retry after the bound
