"""loopwright's own Prometheus instruments: what this process saw happen.

Counters and histograms of events, per process (Prometheus adds the processes up): runs ended
by stop reason, writes whose outcome became unknown, escalated to a person or reconciled (by
what the business system said), lease takeovers, writes refused by a fence, node commit and
model request latency. What describes stored state (runs by phase, approvals waiting) is read
from the database at scrape time instead (`loopwright.stored_state`), so that every
instance reports the same truth.

The instruments live in a registry of loopwright's own (`REGISTRY`), not prometheus_client's
default one: LangGraph's server serves the default registry at `/metrics` to anyone, and these
are served behind an operator's token (or on a port of their own, `loopwright worker
--metrics-port`). This module imports nothing of loopwright, so every layer may count here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry()
# A commit is a fraction of a millisecond to tens of ms; a model request seconds to a minute.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

RUNS_ENDED = Counter(
    "loopwright_runs_ended",
    "Runs this process ended, by stop reason.",
    ["stop_reason"],
    registry=REGISTRY,
)
WRITES_UNKNOWN = Counter(
    "loopwright_writes_unknown",
    "Writes whose outcome became unknown (a timeout, a lost answer, a crash after the send).",
    registry=REGISTRY,
)
WRITES_ESCALATED = Counter(
    "loopwright_writes_escalated",
    "Writes handed to a person (an outcome nobody could confirm, or a resend nothing makes safe).",
    registry=REGISTRY,
)
WRITES_RECONCILED = Counter(
    "loopwright_writes_reconciled",
    "Reconciliations of unknown writes, by what the business system said (applied, absent, ...).",
    ["outcome"],
    registry=REGISTRY,
)
LEASE_TAKEOVERS = Counter(
    "loopwright_lease_takeovers",
    "Runs this process claimed from another owner whose lease had expired unreleased.",
    registry=REGISTRY,
)
FENCE_REFUSALS = Counter(
    "loopwright_fence_refusals",
    "Writes refused because the writer's lease or fence no longer held the run, by store.",
    ["store"],
    registry=REGISTRY,
)
NODE_COMMIT_SECONDS = Histogram(
    "loopwright_node_commit_seconds",
    "Time to commit a node's writes and the checkpoint after them (fence check included).",
    buckets=COMMIT_BUCKETS,
    registry=REGISTRY,
)
MODEL_REQUEST_SECONDS = Histogram(
    "loopwright_model_request_seconds",
    "Time from a model request to its answer (or its failure), by model.",
    ["model"],
    buckets=MODEL_BUCKETS,
    registry=REGISTRY,
)

# Series that exist from the start, so that a rate() over them is 0 rather than absent.
for _store in ("checkpoint", "journal", "lease"):
    FENCE_REFUSALS.labels(_store)


def note_transition(to: str, detail: Mapping[str, Any] | None) -> None:
    """Count a journal status change (`to`, a status's value) that matters to an operator."""
    if to == "UNKNOWN":
        WRITES_UNKNOWN.inc()
    elif to == "ESCALATED":
        WRITES_ESCALATED.inc()
    if detail and "reconciled" in detail:
        WRITES_RECONCILED.labels(str(detail["reconciled"])).inc()


def note_run_end(before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Count a run's end, if the attempt that went from state `before` to `after` ended it."""
    if (reason := after.get("stop_reason")) and not before.get("stop_reason"):
        RUNS_ENDED.labels(str(reason)).inc()
