"""`loopwright runs`: every run in a database, those with unconfirmed writes first.

A run with a write in flight, of unknown outcome, being reconciled or escalated is the one a
person may have to look at, so it heads the list whatever its age; the rest follow newest first.
A run whose attempts keep failing with an error says so, with the last error.
Phase and stop reason come from the run's checkpoint (`lw_runs` is only as fresh as the last
process that let go of the run normally), the actions from the journal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rich.console import Console

from loopwright.checkpoints.leases import RunRecord
from loopwright.graph.state import Action
from loopwright.runner import Runner, UnknownRun
from loopwright.timeline import UNCONFIRMED


@dataclass(frozen=True)
class RunLine:
    record: RunRecord
    phase: str
    stop_reason: str
    unconfirmed: list[Action]


def age(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def run_lines(
    runner: Runner, *, agent: str | None = None, version: str | None = None
) -> list[RunLine]:
    """Every registered run (of `agent`, at `version`, if given), unconfirmed writes first,
    then newest first."""
    lines = []
    for record in runner.leases.runs():
        if (agent and record.agent != agent) or (version and record.agent_version != version):
            continue
        try:
            outcome = runner.outcome(record.run_id)
        except UnknownRun:  # registered, but its process died before the first checkpoint
            lines.append(RunLine(record, record.phase, "", []))
            continue
        unconfirmed = [a for a in outcome.actions if a.status in UNCONFIRMED]
        lines.append(RunLine(record, outcome.phase, outcome.stop_reason or "", unconfirmed))
    return sorted(lines, key=lambda line: not line.unconfirmed)  # stable: newest first stays


def render_runs(
    runner: Runner, console: Console, *, agent: str | None = None, version: str | None = None
) -> None:
    lines = run_lines(runner, agent=agent, version=version)
    if not lines:
        console.print("no runs")
        return
    now = datetime.now(UTC)
    console.print(
        f"{'RUN':<20} {'AGENT':<16} {'PHASE':<16} {'STOP':<18} {'AGE':>5}  UNCONFIRMED WRITES"
    )
    for line in lines:
        writes = ", ".join(f"{a.action_id} {a.status}" for a in line.unconfirmed) or "-"
        leased = f"  (leased by {line.record.owner})" if line.record.lease_live else ""
        failing = ""
        if line.record.failures:
            failing = f"  (failed {line.record.failures}x in a row: {line.record.last_error})"
        pinned = f"{line.record.agent or '?'} {line.record.agent_version}".strip()
        console.print(
            f"{line.record.run_id:<20} {pinned:<16} {line.phase:<16} {line.stop_reason or '-':<18}"
            f" {age(now - line.record.created_at):>5}  {writes}{leased}{failing}",
            markup=False,
        )
