"""`loopwright runs`: every run in a database, those with unconfirmed writes first.

A run with a write in flight, of unknown outcome, being reconciled or escalated is the one a
person may have to look at, so it heads the list whatever its age; the rest follow newest first.
A run whose attempts keep failing with an error says so, with the last error.
Phase and stop reason come from the run's checkpoint (`lw_runs` is only as fresh as the last
process that let go of the run normally), the actions from the journal.

Reading a run's checkpoint costs a few milliseconds, so a database of many runs is listed up to
a limit: every run with an unconfirmed write (found with one query of the journal), then the
newest of the others; the rest are counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rich.console import Console

from loopwright.checkpoints.leases import RunRecord
from loopwright.core.state import ENDED_PHASES, Action
from loopwright.display import flat
from loopwright.runner import Runner, UnknownRun
from loopwright.timeline import UNCONFIRMED, Redactor


@dataclass(frozen=True)
class RunLine:
    record: RunRecord
    phase: str
    stop_reason: str
    actions: list[Action]
    # The task, with any sensitive value of the run's arguments blanked (a card number in it).
    task: str

    @property
    def unconfirmed(self) -> list[Action]:
        return [a for a in self.actions if a.status in UNCONFIRMED]

    def writes(self) -> str:
        """The unconfirmed writes by id (a person may have to look), the others counted by
        status: a completed run that paid reads `1 SUCCEEDED`, a rejected one `1 REJECTED`."""
        shown = [f"{a.action_id} {a.status}" for a in self.unconfirmed]
        settled = Counter(a.status.value for a in self.actions if a.status not in UNCONFIRMED)
        shown += [f"{count} {status}" for status, count in sorted(settled.items())]
        return ", ".join(shown) or "-"


def age(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class RunList:
    lines: list[RunLine]
    more: int  # runs left out by the limit


def run_lines(
    runner: Runner,
    *,
    agent: str | None = None,
    version: str | None = None,
    limit: int | None = None,
    unfinished: bool = False,
) -> RunList:
    """The registered runs (of `agent`, at `version`, that have not ended: if given): every one
    with an unconfirmed write, then the newest `limit` of the others (all, if None).

    A run's version is the version of its agent that last advanced it (a run begun by version 1
    and continued by version 2 is version 2's): `unfinished` runs at an old version are what an
    upgrade still has to see through, whatever the new version continues."""
    unconfirmed = {action.run_id for action in runner.journal.in_status(UNCONFIRMED)}
    candidates = runner.leases.unended() if unfinished else runner.leases.runs()
    records = [
        record
        for record in candidates  # newest first
        if not (agent and record.agent != agent)
        and not (version and record.agent_version != version)
    ]
    first = [record for record in records if record.run_id in unconfirmed]
    others = [record for record in records if record.run_id not in unconfirmed]
    shown = others if limit is None else others[:limit]
    lines = []
    for record in [*first, *shown]:
        try:
            outcome = runner.outcome(record.run_id)
        except UnknownRun:  # registered, but its process died before the first checkpoint
            lines.append(RunLine(record, record.phase, "", [], record.task))
            continue
        redactor = Redactor(runner.tools)
        for action in outcome.actions:
            redactor.learn(action.tool, action.args)
        task = redactor.text(record.task, markup=False)
        if unfinished and outcome.phase in ENDED_PHASES:
            continue  # ended since its process last wrote lw_runs (it died after the end)
        stop = outcome.stop_reason or ""
        lines.append(RunLine(record, outcome.phase, stop, outcome.actions, task))
    # Stable: newest first stays. Sorted again: a write may have settled, or begun, meanwhile.
    return RunList(sorted(lines, key=lambda line: not line.unconfirmed), len(others) - len(shown))


TASK_WIDTH = 40


def _cut(text: str, width: int) -> str:
    text = flat(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"


def render_runs(listed: RunList, console: Console) -> None:
    """One line per run; columns as wide as their longest value (a server's run ids are 36
    characters, the CLI's 20), the task cut to its first 40; then how many were left out."""
    lines = listed.lines
    if not lines:
        console.print("no runs")
        return
    now = datetime.now(UTC)
    rows = [
        [
            flat(line.record.run_id),
            flat(f"{line.record.agent or '?'} {line.record.agent_version}".strip()),
            line.phase,
            line.stop_reason or "-",
            age(now - line.record.created_at),
            flat(line.record.user_id or "-"),
            _cut(line.task, TASK_WIDTH),
        ]
        for line in lines
    ]
    header = ["RUN", "AGENT", "PHASE", "STOP", "AGE", "USER", "TASK"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def cells(row: list[str]) -> str:
        return "  ".join(
            cell.rjust(width) if column == "AGE" else cell.ljust(width)
            for column, cell, width in zip(header, row, widths, strict=True)
        )

    console.print(f"{cells(header)}  WRITES", markup=False)
    for line, row in zip(lines, rows, strict=True):
        leased = f"  (leased by {flat(line.record.owner)})" if line.record.lease_live else ""
        failing = ""
        if line.record.failures:
            failing = f"  (failed {line.record.failures}x in a row: {flat(line.record.last_error)})"
        console.print(f"{cells(row)}  {line.writes()}{leased}{failing}", markup=False)
    if listed.more:
        runs = "run" if listed.more == 1 else "runs"
        console.print(f"... {listed.more} older {runs} not listed (--limit 0 lists every run)")
