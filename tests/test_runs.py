"""`loopwright runs`: runs whose writes nobody has confirmed come first, whatever their age."""

from __future__ import annotations

import io
from datetime import timedelta

from rich.console import Console

from loopwright.run_list import age, render_runs, run_lines
from tests.card_payments import CARD, LOST_PAYMENT, PAY_WITH_CARD, TASK, card_runner
from tests.runtime_fixtures import principal


def test_runs_lists_unconfirmed_writes_first_then_newest_first(database_url: str) -> None:
    with card_runner(database_url, LOST_PAYMENT) as runner:
        escalated = runner.start(TASK, principal(task=TASK), run_id="run-lost")
    with card_runner(database_url, PAY_WITH_CARD) as runner:
        runner.start(TASK, principal(task=TASK), run_id="run-paid-1")
        runner.start(TASK, principal(task=TASK), run_id="run-paid-2")
        output = io.StringIO()
        render_runs(run_lines(runner), Console(file=output, width=200, soft_wrap=True))
    [lost] = escalated.actions
    assert (escalated.stop_reason, lost.status) == ("needs_human", "ESCALATED")
    header, *lines = output.getvalue().splitlines()
    assert header.split()[:5] == ["RUN", "AGENT", "PHASE", "STOP", "AGE"]
    # Each run names the agent (and version) it belongs to: the card agent, version 1. The
    # oldest run comes first: a person must look at it.
    assert [line.split()[:5] for line in lines] == [
        ["run-lost", "cards", "1", "INCOMPLETE", "needs_human"],
        ["run-paid-2", "cards", "1", "COMPLETED", "completed"],
        ["run-paid-1", "cards", "1", "COMPLETED", "completed"],
    ]
    assert lines[0].endswith(f"{lost.action_id} ESCALATED")
    # Settled writes are counted by status; the task is cut to 40 characters, and the card
    # number in it blanked first.
    assert lines[1].endswith("Pay 10.00 for order O-42 with card [red…  1 SUCCEEDED")
    assert CARD not in output.getvalue()


def test_a_limit_lists_every_unconfirmed_write_then_the_newest_and_counts_the_rest(
    database_url: str,
) -> None:
    """The run with the escalated write is the oldest: a limit of one still lists it, and the
    newest of the others; the two left out are counted."""
    with card_runner(database_url, LOST_PAYMENT) as runner:
        runner.start(TASK, principal(task=TASK), run_id="run-lost")
    with card_runner(database_url, PAY_WITH_CARD) as runner:
        for n in (1, 2, 3):
            runner.start(TASK, principal(task=TASK), run_id=f"run-paid-{n}")
        listed = run_lines(runner, limit=1)
        everything = run_lines(runner)
        output = io.StringIO()
        render_runs(listed, Console(file=output, width=200, soft_wrap=True))
    assert [line.record.run_id for line in listed.lines] == ["run-lost", "run-paid-3"]
    assert listed.more == 2
    assert output.getvalue().splitlines()[-1] == (
        "... 2 older runs not listed (--limit 0 lists every run)"
    )
    assert len(everything.lines) == 4 and everything.more == 0


def test_age_is_shown_in_its_largest_whole_unit() -> None:
    assert [age(timedelta(seconds=s)) for s in (-1, 59, 60, 7_199, 86_400 * 3)] == [
        "0s",
        "59s",
        "1m",
        "1h",
        "3d",
    ]
