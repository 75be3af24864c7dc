"""What a scrape reads from the database: gauges of stored state, and the exposition.

Runs by phase, approvals waiting and the age of the oldest, and the journal's actions by status
describe what the database holds, not what one process saw: read from lw_runs and lw_actions at
each scrape, every instance and worker on one database reports the same values (a process that
restarted forgets nothing). `exposition` serves them with this process's own counters and
histograms (`observability.metrics`). A scrape whose database does not answer still serves the
process's instruments, with `loopwright_database_up 0` and no stored gauges.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from loopwright.checkpoints.sql import Database, open_database
from loopwright.observability.metrics import REGISTRY

logger = logging.getLogger(__name__)

# Approvals that wait: a journaled action asking for one, of a run that waits for a person.
_WAITING = (
    "SELECT COUNT(*) AS n, MIN(a.updated_at) AS oldest, MAX(now()) AS now"
    " FROM lw_actions a JOIN lw_runs r ON r.run_id = a.run_id"
    " WHERE a.status = 'NEEDS_APPROVAL' AND r.phase = 'WAITING_APPROVAL'"
)


def _moment(value: Any) -> datetime:
    """A timestamp as read back: Postgres's TIMESTAMPTZ, or SQLite's ISO text (UTC)."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def stored_metrics(db: Database) -> list[Metric]:
    """The gauges of what `db` holds now (raises what the database raises)."""
    runs = GaugeMetricFamily(
        "loopwright_runs",
        "Runs recorded in lw_runs, by agent and phase.",
        labels=["agent", "phase"],
    )
    for row in db.execute("SELECT agent, phase, COUNT(*) AS n FROM lw_runs GROUP BY agent, phase"):
        runs.add_metric([row["agent"], row["phase"]], row["n"])
    actions = GaugeMetricFamily(
        "loopwright_actions",
        "Journaled actions by status (UNKNOWN and ESCALATED: writes a reconciliation or a person"
        " still has to settle).",
        labels=["status"],
    )
    for row in db.execute("SELECT status, COUNT(*) AS n FROM lw_actions GROUP BY status"):
        actions.add_metric([row["status"]], row["n"])
    waiting = db.one(_WAITING) or {}
    oldest = waiting.get("oldest")
    age = (_moment(waiting["now"]) - _moment(oldest)).total_seconds() if oldest else 0.0
    return [
        runs,
        actions,
        GaugeMetricFamily(
            "loopwright_approvals_waiting",
            "Actions waiting for a person's approval.",
            value=waiting.get("n") or 0,
        ),
        GaugeMetricFamily(
            "loopwright_approval_oldest_age_seconds",
            "How long the oldest approval still waiting has waited (0: none waits), by the"
            " database's clock.",
            value=max(0.0, age),
        ),
    ]


class _Scrape:
    """This process's instruments and, if `db` answers, the stored gauges."""

    def __init__(self, db: Database | None) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        stored: Iterable[Metric] = ()
        if self.db is not None:
            try:
                stored = stored_metrics(self.db)
            except Exception as exc:  # the process's own figures are still worth serving
                logger.warning("metrics: the database did not answer: %s", type(exc).__name__)
        yield GaugeMetricFamily(
            "loopwright_database_up",
            "1 if this scrape read the stored gauges from the database, else 0.",
            value=1 if stored else 0,
        )
        yield from stored


def exposition(db: Database | None) -> bytes:
    """The Prometheus text exposition of loopwright's metrics, stored gauges read from `db`."""
    return generate_latest(_Scrape(db))


def scrape(database_url: str) -> bytes:
    """`exposition`, the stored gauges read on a connection of the scrape's own (a slow
    database keeps the scrape waiting, not the runs, which share the process's connections)."""
    try:
        with open_database(database_url) as db:
            return exposition(db)
    except Exception:  # unreachable: the process's own counters are still worth serving
        return exposition(None)
