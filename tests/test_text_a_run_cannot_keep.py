"""Text no store keeps (a NUL character, which Postgres refuses in TEXT and JSONB; an unpaired
surrogate, which is not UTF-8: Python's reading of command-line bytes that are not) is refused
where a caller hands it in, with one line, before anything is written; and text of that kind
that a run meets on its way (a model's answer, an error quoting a business system) is kept, on
both backends, through the run, its failure record and the retention job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, empty_checkpoint

from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.retention import retain, summary_of
from loopwright.core.state import Principal
from loopwright.core.text import MAX_TASK_CHARS, InvalidText
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright.tools.contract import Effect, ToolContext, ToolContract
from tests.runtime_fixtures import PATIENCE_S, REPO, RunnerFactory, principal
from tests.test_worker_failures import NoArgs, Nothing

TASK = "Read order O-42 and tell me its status."
FOREIGN = "status: shipped \x00 (as the ledger spelled it)"


@pytest.mark.parametrize(
    ("task", "user_id", "run_id", "problem"),
    [
        ("Read order O-42\x00 now.", "u-1", "r-1", "the task holds a NUL character (at 15)"),
        ("Read order O-42 \udcff.", "u-1", "r-1", "the task is not UTF-8 text"),
        ("   ", "u-1", "r-1", "the task is empty"),
        ("x" * (MAX_TASK_CHARS + 1), "u-1", "r-1", "the task is 2001 characters long"),
        (TASK, "u-1\x00", "r-1", "the user id holds a NUL character"),
        (TASK, "u-1", "r-\udcff", "the run id is not UTF-8 text"),
    ],
)
def test_a_run_is_never_begun_with_text_no_store_keeps(
    open_test_runner: RunnerFactory, task: str, user_id: str, run_id: str, problem: str
) -> None:
    who = Principal(user_id=user_id, scope=("order:O-42",))
    with open_test_runner() as runner:
        for begin in (runner.start, runner.submit):
            with pytest.raises(InvalidText, match=re.escape(problem)):
                begin(task, who, run_id=run_id)
        if not problem.startswith("the run id"):  # asked of the agent before any run id
            with pytest.raises(InvalidText, match=re.escape(problem)):
                runner.principal_for(user_id, task)
        assert runner.run_ids() == []  # nothing registered, no checkpoint written
        kept = runner.start(TASK, principal(task=TASK))  # the same runner goes on
        assert runner.run_ids() == [kept.run_id]


@pytest.mark.parametrize(
    "args",
    [
        [b"run", b"Read order O-42 \xff now.", b"--user", b"u-1"],
        [b"run", b"Read order O-42.", b"--user", b"u-\xff"],
        [b"show", b"run-\xff"],
        [b"resume", b"run-\xff"],
        [b"cancel", b"run-\xff"],
    ],
)
def test_a_command_line_that_is_not_utf8_is_one_line_and_exit_2(
    args: list[bytes], tmp_path: Path
) -> None:
    result = subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"loopwright", *args],
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), "LOOPWRIGHT_HOME": str(tmp_path)},
        capture_output=True,
        timeout=PATIENCE_S,
        cwd=REPO,
    )
    position = next(i for i, arg in enumerate(args, 1) if b"\xff" in arg)
    given = args[position - 1]
    assert result.returncode == 2, result.stderr
    assert result.stderr.decode() == (
        f"loopwright: error: argument {position} is not UTF-8 text: {given!r}\n"
    )
    assert result.stdout == b""


def answers_with_foreign_text(messages: Sequence[BaseMessage], _tools: Any) -> Decision:
    if not any(isinstance(m, ToolMessage) for m in messages):
        return Decision(tool_calls=[("get_order", {"order_id": "O-42"})])
    return Decision(content=FOREIGN)


def test_a_models_answer_with_a_nul_is_kept_through_retention(
    open_test_runner: RunnerFactory, database_url: str
) -> None:
    with open_test_runner(model=ScriptedChatModel(policy=answers_with_foreign_text)) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
    assert outcome.stop_reason == "completed", outcome.stop_detail
    report = retain(database_url, 0)
    assert [c.run_id for c in report.pruned] == [outcome.run_id]
    with open_test_runner() as runner:
        summary = summary_of(runner.leases.db, outcome.run_id)
    assert summary is not None and summary.answer == FOREIGN
    assert summary.verification is not None
    assert summary.verification["facts"]["model_answer"] == FOREIGN


def raises_foreign_text(_ctx: ToolContext[Any], _args: NoArgs, _key: str | None) -> Any:
    raise RuntimeError(f"the ledger answered {FOREIGN!s} \udcff")


LEDGER = ToolContract(
    name="read_ledger",
    description="Read the ledger.",
    args_model=NoArgs,
    output_model=Nothing,
    effect=Effect.READ,
    run=raises_foreign_text,
)


def reads_the_ledger(messages: Sequence[BaseMessage], _tools: Any) -> Decision:
    return Decision(tool_calls=[("read_ledger", {})])


def test_an_error_quoting_text_no_store_keeps_is_recorded_spelled_out(
    open_test_runner: RunnerFactory,
) -> None:
    model = ScriptedChatModel(policy=reads_the_ledger)
    with open_test_runner(model=model, tools=[LEDGER]) as runner:
        with pytest.raises(RuntimeError, match="the ledger answered"):
            runner.start("Check the ledger.", principal(task="Check the ledger."), run_id="r-l")
        record = runner.leases.get("r-l")
    assert record is not None and record.failures == 1
    assert record.last_error == (
        "RuntimeError: the ledger answered status: shipped \\x00 (as the ledger spelled it) \\udcff"
    )


def test_a_short_string_holding_a_nul_is_stored_as_it_is(database_url: str) -> None:
    """A value a node writes (an id a model endpoint sent, say) is kept whatever it holds; on
    Postgres a short string is inline in the checkpoint's JSONB, which cannot hold a NUL."""
    config: RunnableConfig = {"configurable": {"thread_id": "t-nul", "checkpoint_ns": ""}}
    values = {"short": "a\x00b", "long": f"{'x' * 20}\x00"}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = dict(values)
    versions: ChannelVersions = {"short": "1", "long": "1"}
    checkpoint["channel_versions"] = versions
    with open_checkpointer(database_url) as saver:
        saved = saver.put(config, checkpoint, {"source": "input", "step": -1}, versions)
        found = saver.get_tuple(saved)
    assert found is not None and found.checkpoint["channel_values"] == values
