"""Which (scenario, fault, system) cells the experiment runs, and why the others are left out.

Not every combination means something. The rules, cell by cell:

* **none**: every scenario, every system. The baseline of everything else, and where the
  authorization scenarios (other user's order, injected policy, approval required) and the
  model that skips the policy (`skips_policy`: three refunds the policy does not allow, asked
  for without a read) are decided.
* **payment faults** (accept_then_timeout, fail_before_commit, latency): the scenarios whose
  task, done right, sends a refund (eligible, partial, long_task, approval_required). The fault
  switch acts on the next refund request; in a scenario that should send none it would never
  fire, or fire on a refund that is already wrong.
* **crash@point**: every crash point of loopwright on `partial` (a third of the order, so a
  second refund fits the balance and a duplicate is visible), except `node:approval:start`, on
  `approval_required` (the only path through the approval node), and `node:reconcile:start`,
  reached only with an unknown outcome: the process first dies after DISPATCHED, its successor
  dies entering reconcile (as in tests/test_crash_matrix.py). The baselines run the points that
  exist in their code (before the model call, before the tools run, and the three moments of the
  write); guard, compile_context, validate, approval, reconcile and verify have no counterpart.
* **worker_kill** and **duplicate_delivery**: `partial` and `long_task` (a duplicate is visible;
  a long run gives the kill something to interrupt).
* **stale_version**: `eligible` and `partial`, the scenarios with one plain write to re-check.
* **approval_expiry**: `approval_required`, the only scenario with an approval to expire.
* **keyless_credit** (store credit, a downstream without idempotency keys), every system: the
  lost request (fail_before_commit), the lost response (accept_then_timeout), a crash before the
  send (`executor:after_dispatch_record`: for the baselines the moment before their request
  leaves) and a crash after it (`executor:after_send`), besides none.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from loopwright.graph.crashpoints import POINTS
from loopwright_refunds.experiments.faults import PAYMENT_FAULTS, Fault, FaultKind
from loopwright_refunds.experiments.scenarios import KEYLESS, SCENARIOS
from loopwright_refunds.experiments.systems import SYSTEMS

BASELINE_CRASH_POINTS = frozenset(
    {
        "node:model_step:start",
        "node:execute:start",
        "executor:after_dispatch_record",
        "executor:after_send",
        "executor:before_outcome_record",
    }
)
# reconcile only runs when an outcome is unknown: crash after DISPATCHED first, then in reconcile.
RECONCILE_POINTS = ("node:reconcile:start", "reconcile:after_settle")
# The keyless write's faults: lost request, lost response, crash before and after the send.
KEYLESS_FAULTS = (
    Fault(FaultKind.FAIL_BEFORE_COMMIT),
    Fault(FaultKind.ACCEPT_THEN_TIMEOUT),
    Fault(FaultKind.CRASH, ("executor:after_dispatch_record",)),
    Fault(FaultKind.CRASH, ("executor:after_send",)),
)


@dataclass(frozen=True)
class Cell:
    scenario: str
    fault: Fault
    system: str


Row = tuple[str, Fault, tuple[str, ...]]  # scenario, fault, the systems that run it


def _crash_faults() -> list[Row]:
    """One row per crash point."""
    found: list[Row] = []
    for point in POINTS:
        if point in RECONCILE_POINTS:
            crashes = ("executor:after_dispatch_record", point)
            found.append(("partial", Fault(FaultKind.CRASH, crashes), ("loopwright",)))
            continue
        scenario = "approval_required" if point == "node:approval:start" else "partial"
        systems = SYSTEMS if point in BASELINE_CRASH_POINTS else ("loopwright",)
        found.append((scenario, Fault(FaultKind.CRASH, (point,)), systems))
    return found


def full_matrix() -> list[Cell]:
    rows: list[Row] = []
    rows += [(s, Fault(FaultKind.NONE), SYSTEMS) for s in SCENARIOS]
    writing = ("eligible", "partial", "long_task", "approval_required")
    rows += [(s, Fault(kind), SYSTEMS) for kind in PAYMENT_FAULTS for s in writing]
    rows += _crash_faults()
    for kind in (FaultKind.WORKER_KILL, FaultKind.DUPLICATE_DELIVERY):
        rows += [(s, Fault(kind), SYSTEMS) for s in ("partial", "long_task")]
    rows += [(s, Fault(FaultKind.STALE_VERSION), SYSTEMS) for s in ("eligible", "partial")]
    rows += [("approval_required", Fault(FaultKind.APPROVAL_EXPIRY), SYSTEMS)]
    rows += [(KEYLESS, fault, SYSTEMS) for fault in KEYLESS_FAULTS]
    return [Cell(s, f, system) for s, f, systems in rows for system in systems]


def select(
    cells: list[Cell],
    *,
    scenarios: Collection[str] = (),
    faults: Collection[str] = (),
    systems: Collection[str] = (),
) -> list[Cell]:
    """The cells matching every filter given; a fault filter matches a kind or a full name."""
    return [
        c
        for c in cells
        if (not scenarios or c.scenario in scenarios)
        and (not faults or c.fault.kind.value in faults or c.fault.name in faults)
        and (not systems or c.system in systems)
    ]
