"""Checkpoint storage grows linearly with the number of steps (history and evidence are deltas)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.messages import BaseMessage

from benchmarks.perf_setup import thread_bytes
from benchmarks.storage import time_reads
from loopwright.checkpoints.sql import open_database
from loopwright.core.budget import Budget
from loopwright.nodes import model_step
from loopwright.nodes.compile_context import render
from loopwright.runner import Runner
from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.long_task import KeepsReading
from tests.runtime_fixtures import RunnerFactory, principal

STEPS = 200
WINDOW = 50
APPENDED = ("history", "evidence", "journal")  # an update's items are added to these


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_checkpoint_bytes_per_step_stay_flat_over_200_steps(
    database_url: str, open_test_runner: RunnerFactory
) -> None:
    task = "Read orders O-42, O-43 and O-44 in turn, again and again."
    model = ScriptedChatModel(policy=KeepsReading(reads=STEPS))
    sizes: list[int] = []
    with (
        open_database(database_url) as db,
        open_test_runner(
            model=model,
            budget=Budget(max_steps=STEPS + 5, max_tool_attempts=STEPS * 3, max_input_tokens=10**9),
        ) as runner,
    ):
        run_id = "run-growth"

        def measure(node: str, _update: dict[str, Any]) -> None:
            if node == "model_step":
                sizes.append(thread_bytes(db, run_id))

        outcome = runner.start(task, principal(task=task), run_id=run_id, on_step=measure)
        assert outcome.stop_reason == "completed", outcome.stop_detail
        assert len(runner.state(run_id)["history"]) == 2 * STEPS + 2
    assert len(sizes) == STEPS + 1
    first = (sizes[WINDOW] - sizes[0]) / WINDOW
    last = (sizes[STEPS] - sizes[STEPS - WINDOW]) / WINDOW
    print(
        f"bytes/step: first {WINDOW} steps {first:.0f}, last {WINDOW} steps {last:.0f}, ratio {last / first:.2f}"
    )
    assert last <= 1.5 * first


def test_an_unchanged_context_is_not_stored_again(
    open_test_runner: RunnerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compile_context writes the compiled context only when it differs from the state's: the
    system text is most of a step's bookkeeping. Every model step still sees it."""
    reads = 4
    task = "Read orders O-42, O-43 and O-44 in turn, again and again."
    seen: list[str] = []

    def spying_render(state: Any) -> list[BaseMessage]:
        messages = render(state)
        seen.append(str(messages[0].content))
        return messages

    monkeypatch.setattr(model_step, "render", spying_render)
    model = ScriptedChatModel(policy=KeepsReading(reads=reads))
    with open_test_runner(model=model) as runner:
        outcome = runner.start(task, principal(task=task), run_id="run-context")
        assert outcome.stop_reason == "completed", outcome.stop_detail
        compiled = [
            update for node, update in runner.steps("run-context") if node == "compile_context"
        ]
        system = runner.state("run-context")["context"]["system"]
    assert ["context" in update for update in compiled] == [True] + [False] * reads
    assert seen == [system] * (reads + 1) and "get_order" in system


@contextmanager
def reading_run(open_test_runner: RunnerFactory, run_id: str, reads: int) -> Iterator[Runner]:
    """A runner after a reading run of `reads` tool steps, `run_id`, that completed."""
    task = "Read orders O-42, O-43 and O-44 in turn, again and again."
    model = ScriptedChatModel(policy=KeepsReading(reads=reads))
    with open_test_runner(model=model) as runner:
        outcome = runner.start(task, principal(task=task), run_id=run_id)
        assert outcome.stop_reason == "completed", outcome.stop_detail
        yield runner


def test_a_tool_step_is_four_commits_and_a_run_three_more(open_test_runner: RunnerFactory) -> None:
    """The card's boundaries and no more: a commit after each of compile_context (guard's gate
    inside it), model_step, validate and execute per tool step; then the last compile_context,
    the final model_step and verify. No guard superstep, not even at the start."""
    reads = 3
    with reading_run(open_test_runner, "run-commits", reads) as runner:
        history = list(runner.graph.get_state_history(runner.config("run-commits")))
        steps = [node for node, _ in runner.steps("run-commits")]
    per_step = ["compile_context", "model_step", "validate", "execute"]
    assert steps == per_step * reads + ["compile_context", "model_step", "verify"]
    # The input's checkpoint and the one that applies it (step 0), then one for every node step.
    loop = [s for s in history if s.metadata and s.metadata.get("source") == "loop"]
    assert len(loop) == 1 + len(steps) and len(history) == 2 + len(steps)


def test_the_storage_benchmark_times_reading_back_every_checkpoint(
    open_test_runner: RunnerFactory,
) -> None:
    """`benchmarks.storage` prints how long a run's history takes to read: all of it, not the
    latest checkpoint's namespace or a page of it."""
    reads = 2
    with reading_run(open_test_runner, "run-reads", reads) as runner:
        timed = time_reads(runner, "run-reads")
    assert timed.checkpoints == 2 + 4 * reads + 3
    assert timed.state_s > 0 and timed.history_s > 0


def test_a_node_commits_only_writes_that_change_the_state(open_test_runner: RunnerFactory) -> None:
    """Nodes return their whole view of the channels they own (no denial yet: 0; no new journal
    entries: {}); a write that changes nothing (an optional channel the state lacks set to its
    empty value included) is left out of the commit, so it costs no row."""
    reads = 3
    with reading_run(open_test_runner, "run-writes", reads) as runner:
        history = list(runner.graph.get_state_history(runner.config("run-writes")))
    unchanged = [
        (task.name, channel)
        for snapshot in history
        for task in snapshot.tasks
        if task.name != "__start__"  # the run's input, not a node
        for channel, value in (task.result or {}).items()
        if (value in ([], {}) and channel in APPENDED)
        or (channel not in APPENDED and snapshot.values.get(channel, object()) == value)
        or (channel not in snapshot.values and value in (None, False, 0, "", [], {}))
    ]
    written = [c for s in history for t in s.tasks for c in (t.result or {})]
    assert len(written) >= 20 * reads and unchanged == []
