"""Where a run stands after a process stopped advancing it: what `Runner` returns and what
reports, the timeline and tracing read. Its own module so that those lower layers need not
import the runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loopwright.checkpoints.journal import Action
from loopwright.checkpoints.retention import Summary


@dataclass
class RunOutcome:
    """Where a run stands after this process stopped advancing it."""

    run_id: str
    phase: str
    stop_reason: str | None
    stop_detail: str
    verification: dict[str, Any] | None
    interrupts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    # For a cancelled run: how its succeeded writes could be undone, offered, never performed.
    compensations: list[str] = field(default_factory=list)
    # For a run the retention job pruned: the summary it kept (the checkpoints are gone).
    pruned: Summary | None = None

    @property
    def waiting_for_approval(self) -> list[dict[str, Any]]:
        return [i for i in self.interrupts if i.get("kind") == "approval"]

    @property
    def next_attempt_at(self) -> datetime | None:
        """When a parked reconciliation should look again, if the run is parked."""
        waits = [i["retry_at"] for i in self.interrupts if i.get("kind") == "reconcile_wait"]
        return datetime.fromisoformat(min(waits)) if waits else None
