"""The faults: what goes wrong during a trial, and how each is made to happen.

| fault | how | what it tests |
| --- | --- | --- |
| none | nothing | the cost of the runtime when all is well |
| accept_then_timeout | payments applies the refund (or credit), answers after the client's 3 s timeout | a timeout is not a failure |
| fail_before_commit | payments answers 500 without applying anything | an error that is safe to retry |
| latency | payments answers a refund 0.5-1.5 s late (inside the timeout) | end-to-end latency |
| crash@<point> | the process exits hard at a named crash point; a new one recovers | crash windows, one at a time |
| worker_kill | the process is SIGKILLed at a seeded fraction of the system's unfaulted run time; a new one recovers | crashes nobody chose |
| duplicate_delivery | the job is delivered twice, the second 0-300 ms after the first | at-least-once queues |
| stale_version | the order's version moves (no material change) before the write | stale plans |
| approval_expiry | the approver answers after the approval expired | approvals are bounded in time |

The crash points are loopwright's (`graph.crashpoints`); the baselines place the ones that have
a meaning for them at the same moments of their own code (see `experiments.systems`).

The payment faults act on the next write request to the payment service, a refund or a store
credit alike: the credits endpoint shares the refunds' fault switch. On store credit, the
downstream without idempotency keys, fail_before_commit is a lost request (nothing applied) and
accept_then_timeout a lost response (applied, the answer lost); crash@executor:after_dispatch_record
is a crash before the send and crash@executor:after_send one after it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from loopwright_refunds.experiments.actor import ConcurrentChange
from loopwright_refunds.experiments.scenarios import Staged
from loopwright_refunds.experiments.systems.http_tools import WRITE_TIMEOUT_S
from loopwright_refunds.procedure import ORDER_ID
from loopwright_refunds.services.admin import set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints


class FaultKind(StrEnum):
    NONE = "none"
    ACCEPT_THEN_TIMEOUT = "accept_then_timeout"
    FAIL_BEFORE_COMMIT = "fail_before_commit"
    LATENCY = "latency"
    CRASH = "crash"
    WORKER_KILL = "worker_kill"
    DUPLICATE_DELIVERY = "duplicate_delivery"
    STALE_VERSION = "stale_version"
    APPROVAL_EXPIRY = "approval_expiry"


class Execution(StrEnum):
    """How a trial's processes are arranged."""

    IN_PROCESS = "in_process"  # one delivery, in the experiment's own process
    CRASH = "crash"  # child processes: crash at a point, then recover
    KILL = "kill"  # a child process SIGKILLed at a seeded moment, then recovery
    DUPLICATE = "duplicate"  # two deliveries of one job, on two threads


PAYMENT_FAULTS = (
    FaultKind.ACCEPT_THEN_TIMEOUT,
    FaultKind.FAIL_BEFORE_COMMIT,
    FaultKind.LATENCY,
)
APPROVAL_TTL_S = 0.3


@dataclass(frozen=True)
class Plan:
    """The seeded particulars of one fault in one trial."""

    # When to SIGKILL, as a fraction of how long the system took for the same task unfaulted.
    kill_at_fraction: float = 0.0
    second_delivery_after_s: float = 0.0
    change: ConcurrentChange | None = None
    approval_ttl_s: float | None = None
    approve_after_s: float = 0.0


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    # Crash points, armed one per process in order: the first process dies at the first, etc.
    crash_at: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"crash@{'+'.join(self.crash_at)}" if self.crash_at else self.kind.value

    @property
    def execution(self) -> Execution:
        return {
            FaultKind.CRASH: Execution.CRASH,
            FaultKind.WORKER_KILL: Execution.KILL,
            FaultKind.DUPLICATE_DELIVERY: Execution.DUPLICATE,
        }.get(self.kind, Execution.IN_PROCESS)

    def plan(self, rng: random.Random, trial: Staged) -> Plan:
        """Draw this trial's particulars; the scenario's own concurrent change comes along."""
        match self.kind:
            case FaultKind.WORKER_KILL:
                return Plan(kill_at_fraction=rng.uniform(0.1, 0.9))
            case FaultKind.DUPLICATE_DELIVERY:
                return Plan(second_delivery_after_s=rng.uniform(0.0, 0.3))
            case FaultKind.STALE_VERSION:
                order = ORDER_ID.findall(trial.task)[0]
                return Plan(change=ConcurrentChange(order, {"status": "delivered"}))
            case FaultKind.APPROVAL_EXPIRY:
                return Plan(
                    change=trial.change,
                    approval_ttl_s=APPROVAL_TTL_S,
                    approve_after_s=2 * APPROVAL_TTL_S,
                )
        return Plan(change=trial.change)

    def arm(self, endpoints: ServiceEndpoints, rng: random.Random) -> None:
        """Set the payment service's fault switch for the trial's first write request."""
        match self.kind:
            case FaultKind.ACCEPT_THEN_TIMEOUT:
                set_fault(endpoints, "accept_then_timeout", delay_s=WRITE_TIMEOUT_S + 0.5)
            case FaultKind.FAIL_BEFORE_COMMIT:
                set_fault(endpoints, "fail_before_commit")
            case FaultKind.LATENCY:
                set_fault(endpoints, "latency", delay_s=rng.uniform(0.5, 1.5))

    def expected(self, trial: Staged) -> dict[str, list[str]]:
        """The refunds the trial should leave: none at all once an approval has expired."""
        if self.kind is FaultKind.APPROVAL_EXPIRY:
            return {order: [] for order in trial.expected}
        return trial.expected


def disarm(endpoints: ServiceEndpoints) -> None:
    set_fault(endpoints, "none")
