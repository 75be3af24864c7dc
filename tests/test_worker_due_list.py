"""A worker reads the due runs again after each attempt: while it advanced one, other workers
took or finished the others it had listed, and resuming those is work for nothing."""

from __future__ import annotations

import threading
from typing import Any

from loopwright.outcome import RunOutcome
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright.worker import work
from tests.runtime_fixtures import RunnerFactory, principal

TASK = "Say hello."


def says_hello(*_seen: object) -> Decision:
    return Decision(content="Hello.")


def test_a_run_another_worker_finished_meanwhile_is_not_resumed(
    open_test_runner: RunnerFactory,
) -> None:
    model = ScriptedChatModel(policy=says_hello)
    with open_test_runner(model=model) as runner, open_test_runner(model=model) as other:
        first, second = (runner.submit(TASK, principal(task=TASK)) for _ in range(2))
        resumed: list[str] = []
        resume = runner.resume

        def resume_while_another_finishes(run_id: str, *args: Any, **kwargs: Any) -> RunOutcome:
            resumed.append(run_id)
            outcome = resume(run_id, *args, **kwargs)
            if len(resumed) == 1:
                # Another worker finished the other run while this one advanced its first.
                other.resume(second if run_id == first else first)
            return outcome

        runner.resume = resume_while_another_finishes  # type: ignore[method-assign]
        stop = threading.Event()
        work(runner, stop=stop, poll_s=0.01, on_idle=lambda _line: stop.set())
        phases = {run_id: runner.outcome(run_id).phase for run_id in (first, second)}

    assert phases == {first: "COMPLETED", second: "COMPLETED"}
    assert len(resumed) == 1, resumed
