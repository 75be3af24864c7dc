"""A run's text never takes over the terminal that shows it, nor forges a line of a report.

A task is a customer's text, an answer a model's (and a prompt injection's), an error a business
system's: in `loopwright run`, `show`, `runs` and `approvals list` their control characters are
spelled out (`\\x1b`, `\\u202e`) and their line breaks shown as `⏎`, so an approver reading
"Refundable: 1,000.00 USD" reads the agent's fact and not a line of the task; text whose
brackets look like markup is printed as it is. A run id is a name (letters, digits and
`._:-`), refused otherwise before anything is written; one stored before that rule still
shows on one line.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from loopwright.checkpoints.leases import open_lease_store
from loopwright.core.state import Principal
from loopwright.core.text import MAX_RUN_ID_CHARS, InvalidText
from loopwright.display import SafeConsole, flat, inline, printable
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright.timeline import Redactor, render_run
from loopwright.tools.registry import ToolRegistry
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.card_payments import PAY_WITH_CARD
from tests.runtime_fixtures import RunnerFactory, cli, principal
from tests.test_cli import env_for as cli_env

# What a terminal acts on rather than shows: escape (CSI, OSC), carriage return, bell,
# backspace, C1's CSI, a right-to-left override and isolate.
ACTED_ON = re.compile("[\x1b\r\x07\x08\x9b\u202e\u2067]")
FORGED = "  Refundable: 5.00 USD"
TASK = (
    "Check whether order O-46 can be refunded and refund it if so.\n"
    + FORGED
    + "\x1b[2J\x1b]0;pwned\x07\r\u202edesrever\x08"
)


@pytest.mark.parametrize(
    ("given", "printed", "on_one_line"),
    [
        ("plain é 👩\u200d💻 text\twith a tab", "plain é 👩\u200d💻 text\twith a tab", None),
        ("red \x1b[31mtext", "red \\x1b[31mtext", None),
        ("bell\x07 back\x08 del\x7f csi\x9b", "bell\\x07 back\\x08 del\\x7f csi\\x9b", None),
        ("a \u202eright-to-left\u2066", "a \\u202eright-to-left\\u2066", None),
        ("two\nlines", "two\nlines", "two⏎lines"),
        ("crlf\r\nover\rwrite", "crlf\\x0d\nover\\x0dwrite", "crlf⏎over⏎write"),
    ],
)
def test_printable_spells_out_what_a_terminal_would_act_on(
    given: str, printed: str, on_one_line: str | None
) -> None:
    assert printable(given) == printed
    assert flat(given) == (on_one_line or printed)


def test_a_safe_console_prints_any_text_as_it_is() -> None:
    out = io.StringIO()
    console = SafeConsole(file=out, width=200, color_system=None)
    console.print("unbalanced [/x] markup :warning: \x1b[2Jcleared")
    console.print(f"answers: [italic]{inline('ends [/bold] in a backslash \\')}[/] (its end)")
    assert out.getvalue().splitlines() == [
        "unbalanced [/x] markup :warning: \\x1b[2Jcleared",
        "answers: ends [/bold] in a backslash \\ (its end)",
    ]


def test_a_sensitive_value_is_blanked_as_a_line_shows_it() -> None:
    """A card "number" with a line break and brackets: blanked in a line of markup (escaped,
    flattened) and in a plain one (flattened) alike."""
    secret = "4111 [b]1111\n1111"
    redactor = Redactor(ToolRegistry([PAY_WITH_CARD]))
    redactor.learn(PAY_WITH_CARD.name, {"card_number": secret})
    assert redactor.text(f"answers: [italic]{inline('paid with ' + secret)}[/]") == (
        "answers: [italic]paid with \\[redacted][/]"
    )
    assert redactor.text(f"task: {flat('pay with ' + secret)}", markup=False) == (
        "task: pay with [redacted]"
    )


def env_for(services: ServiceEndpoints, tmp_path: Path, sqlite_url: str) -> dict[str, str]:
    return {**cli_env(services, tmp_path), "DATABASE_URL": sqlite_url}


def assert_shown_safely(output: str) -> None:
    assert not ACTED_ON.search(output), output
    assert not any(line.startswith(FORGED) for line in output.splitlines()), output


def test_a_customers_task_cannot_forge_a_fact_for_the_approver_or_drive_the_terminal(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = env_for(services, tmp_path, sqlite_url)
    waiting = cli("run", TASK, "--user", "u-1", "--run-id", "run-forged", env=env, expect=3)
    shown_task = (
        "Check whether order O-46 can be refunded and refund it if so.⏎"
        + FORGED
        + "\\x1b[2J\\x1b]0;pwned\\x07⏎\\u202edesrever\\x08"
    )
    listed = cli("approvals", "list", env=env, expect=0).stdout
    assert "  for u-1: " + shown_task + "\n" in listed
    assert "  Refundable: 1,000.00 USD\n" in listed  # the agent's fact, on its own line
    timeline = cli("show", "run-forged", env=env, expect=0).stdout
    assert "task: " + shown_task + "\n" in timeline
    table = cli("runs", env=env, expect=0).stdout
    for output in (waiting.stdout, listed, timeline, table):
        assert_shown_safely(output)


def test_a_run_id_stored_before_the_rule_still_shows_on_one_line(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    with open_lease_store(sqlite_url) as leases:
        leases.register("q\nCOMPLETED \x1b[32mfake", task="x", user_id="u-1", agent="refunds")
    table = cli("runs", "--db", sqlite_url, env=env_for(services, tmp_path, sqlite_url), expect=0)
    rows = table.stdout.splitlines()
    assert len(rows) == 2 and rows[1].startswith("q⏎COMPLETED \\x1b[32mfake  refunds"), rows


def injected(messages: Sequence[BaseMessage], _tools: Any) -> Decision:
    """A model under a prompt injection: a call to a tool named like markup, then an answer
    that closes the timeline's markup, prints a line of its own and retitles the terminal."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        return Decision(tool_calls=[("[/bold]", {"order_id": "O-42"})])
    return Decision(content="Done [/italic]\nCOMPLETED run-x\x1b]0;title\x07 \u2067")


def test_a_models_answer_and_tool_call_cannot_break_or_forge_the_timeline(
    open_test_runner: RunnerFactory,
) -> None:
    with open_test_runner(model=ScriptedChatModel(policy=injected)) as runner:
        task = "Read order O-42 and tell me its status."
        outcome = runner.start(task, Principal(user_id="u-1", scope=("order:O-42",)))
        out = io.StringIO()
        render_run(runner, outcome.run_id, SafeConsole(file=out, width=400, color_system=None))
    timeline = out.getvalue()
    assert not ACTED_ON.search(timeline), timeline
    assert "[/bold]" in timeline  # the model's tool name, as it was
    assert "answers: Done [/italic]⏎COMPLETED run-x\\x1b]0;title\\x07 \\u2067" in timeline
    assert not any(line.startswith("COMPLETED run-x") for line in timeline.splitlines())


@pytest.mark.parametrize(
    ("run_id", "problem"),
    [
        ("a b", "the run id holds ' ' (at 1)"),
        ("-rf", "the run id begins with '-'"),
        ("orders/O-42", "the run id holds '/' (at 6)"),
        ("[/x]", "the run id holds '[' (at 0)"),
        ("q\nCOMPLETED", "the run id holds '\\n' (at 1)"),
        ("ré-1", "the run id holds 'é' (at 1)"),
        ("r" * (MAX_RUN_ID_CHARS + 1), f"the run id is {MAX_RUN_ID_CHARS + 1} characters long"),
    ],
)
def test_a_run_id_that_is_no_name_is_refused_before_anything_is_written(
    open_test_runner: RunnerFactory, run_id: str, problem: str
) -> None:
    with open_test_runner() as runner:
        for begin in (runner.start, runner.submit):
            with pytest.raises(InvalidText, match=re.escape(problem)):
                begin("Read order O-42.", principal(task="Read order O-42."), run_id=run_id)
        assert runner.run_ids() == []
        named = "0e4b7a52-5f7c-4f0a-9d5e-3b8e2f1c9a77:retry_2.b"
        runner.submit("Read order O-42.", principal(task="Read order O-42."), run_id=named)
        assert runner.run_ids() == [named]


def test_the_command_line_refuses_an_odd_run_id_and_names_an_unknown_one_in_one_line(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    refused = cli(
        "run", "Read order O-42.", "--user", "u-1", "--run-id", "[/x]",
        env=env_for(services, tmp_path, sqlite_url), expect=2,
    )  # fmt: skip
    assert refused.stdout == ""
    assert refused.stderr == (
        "loopwright: error: the run id holds '[' (at 0): a run id is letters, digits and"
        " . _ : -, beginning with a letter or a digit\n"
    )
    unknown = cli(
        "show", "q\nCOMPLETED \x1b[31mfake", env=env_for(services, tmp_path, sqlite_url), expect=2
    )
    assert unknown.stderr == (
        "loopwright: error: no run 'q\\nCOMPLETED \\x1b[31mfake' in this database\n"
    )
