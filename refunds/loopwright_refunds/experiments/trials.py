"""One trial: stage a scenario, arm a fault, let a system do the job, judge the outcome.

The trial's wall time runs from the first delivery to the end of the last process that worked on
the job (recovery waits included: a lease that must expire is part of what a crash costs). The
seed of a trial depends on the repetition, the scenario and the fault, not on the system, so in
each repetition the three systems meet the same orders, amounts and fault timings.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loopwright_refunds.experiments.faults import Execution, Plan, disarm
from loopwright_refunds.experiments.matrix import Cell
from loopwright_refunds.experiments.model import experiment_model, read_bill
from loopwright_refunds.experiments.processes import crash_then_recover, kill_then_recover
from loopwright_refunds.experiments.scenarios import SCENARIOS, OrderIds, Stage, staged
from loopwright_refunds.experiments.systems import Deployment, Job, Trace, make_system
from loopwright_refunds.experiments.truth import before_trial, judge


@dataclass(frozen=True)
class TrialResult:
    """Everything measured in one trial; one row of results.json."""

    system: str
    scenario: str
    fault: str
    fault_kind: str
    repetition: int
    seed: str
    long: bool
    concurrent: bool
    success: bool
    duplicates: int
    unauthorized: int
    unauthorized_reasons: list[str]
    # Refunds the refund policy did not allow, and why (`truth.policy_breaches`).
    policy_violations: int
    policy_reasons: list[str]
    crashed: bool  # a process died mid-run (a crash point fired, or a kill landed)
    latency_s: float
    model_calls: int
    input_tokens: int
    output_tokens: int
    unknown_windows_s: list[float] | None
    end: str
    refunds: dict[str, list[str]]
    expected: dict[str, list[str]]
    error: str | None = None
    # The store-credit entries the trial left and the ones it should have, customer -> amounts.
    credits: dict[str, list[str]] = field(default_factory=dict)
    expected_credits: dict[str, list[str]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": self.outcome}

    @property
    def outcome_kinds(self) -> list[str]:
        """What the trial left in the business system: ["done"], or each way it went wrong.

        A baseline that refunds twice did what the experiment exists to show, and a trial whose
        task was not done is no failure of the experiment itself: the names say what happened
        ("duplicate refund", "task not done"), and only a system that raised is an "error".
        """
        effect = "credit" if self.credits or self.expected_credits else "refund"
        kinds = [
            kind
            for kind, found in (
                ("error", self.error is not None),
                (f"duplicate {effect}", self.duplicates > 0),
                (f"unauthorized {effect}", self.unauthorized > 0),
                ("policy-violating refund", self.policy_violations > 0),
            )
            if found
        ]
        if not kinds:
            kinds = ["done" if self.success else "task not done"]
        return kinds

    @property
    def outcome(self) -> str:
        """`outcome_kinds` in words, each with why: "unauthorized refund (another user's)"."""
        why = {
            "error": [(self.error or "").split(":")[0]],
            "unauthorized": [UNAUTHORIZED_WHY.get(r, r) for r in self.unauthorized_reasons],
            "policy-violating": [POLICY_WHY.get(r, r) for r in self.policy_reasons],
        }
        words = []
        for kind in self.outcome_kinds:
            reasons = ", ".join(dict.fromkeys(why.get(kind.split(" ")[0], [])))
            words.append(f"{kind} ({reasons})" if reasons else kind)
        return ", ".join(words)


# The judge's reason codes (`truth.judge`), as a reader of the outcome wants them.
UNAUTHORIZED_WHY = {
    "owner": "another user's",
    "scope": "outside the task",
    "approval": "no approval",
}
POLICY_WHY = {
    "delivery": "not delivered",
    "window": "outside the window",
    "balance": "above the balance",
    "currency": "another currency",
}

# Without an unfaulted trial of the same task to time, a kill lands this long after the start.
DEFAULT_RUN_S = 1.0


def _execute(
    cell: Cell, deployment: Deployment, job: Job, plan: Plan, log: Path, typical_s: float | None
) -> bool:
    """Run the job the way the fault asks; returns whether a process died mid-run."""
    execution = cell.fault.execution
    if execution is Execution.CRASH:
        return crash_then_recover(cell.system, deployment, job, cell.fault.crash_at, log) > 0
    if execution is Execution.KILL:
        kill_after = plan.kill_at_fraction * (typical_s or DEFAULT_RUN_S)
        return kill_then_recover(cell.system, deployment, job, kill_after, log)
    system = make_system(cell.system, deployment)
    failures: list[Exception] = []

    def deliver() -> None:
        try:
            system.deliver(job, experiment_model(job.ledger, plan.change, deployment.endpoints))
        except Exception as exc:  # reported by the thread that waits for both deliveries
            failures.append(exc)

    if execution is Execution.DUPLICATE:
        second = threading.Timer(plan.second_delivery_after_s, deliver)
        second.start()
        deliver()
        second.join()
    else:
        deliver()
    if failures:
        raise failures[0]
    return False


def run_trial(
    cell: Cell,
    repetition: int,
    seed: int,
    deployment: Deployment,
    ids: OrderIds,
    workdir: Path,
    typical_s: float | None = None,
) -> TrialResult:
    """Run one cell once. `typical_s`: how long this system took for the same task unfaulted
    (a worker kill lands at a seeded fraction of it, so it falls mid-run for fast and slow
    systems alike)."""
    seed_text = f"{seed}:{repetition}:{cell.scenario}:{cell.fault.name}"
    rng = random.Random(seed_text)
    scenario = SCENARIOS[cell.scenario]
    endpoints = deployment.endpoints
    tag = f"{cell.system}-{uuid.uuid4().hex[:10]}"
    with staged(scenario, Stage(endpoints, rng, ids)) as trial:
        plan = cell.fault.plan(rng, trial)
        job = Job(
            job_id=tag,
            task=trial.task,
            user_id=trial.user_id,
            ledger=workdir / f"{tag}.ledger",
            approval_ttl_s=plan.approval_ttl_s,
            approve_after_s=plan.approve_after_s,
        )
        before = before_trial(endpoints, trial)
        cell.fault.arm(endpoints, rng)
        error = None
        crashed = False
        started = time.monotonic()
        try:
            crashed = _execute(cell, deployment, job, plan, workdir / f"{tag}.log", typical_s)
        except Exception as exc:  # a system that falls over is a result, not a reason to stop
            error = f"{type(exc).__name__}: {exc}"
        finally:
            latency = time.monotonic() - started
            disarm(endpoints)
        expected = cell.fault.expected(trial)
        try:
            trace = make_system(cell.system, deployment).inspect(job)
        except Exception as exc:
            trace = Trace(end=f"not inspectable: {type(exc).__name__}")
        verdict = judge(endpoints, trial, expected, before, trace.approved_keys)
    bill = read_bill(job.ledger)
    return TrialResult(
        system=cell.system,
        scenario=cell.scenario,
        fault=cell.fault.name,
        fault_kind=cell.fault.kind.value,
        repetition=repetition,
        seed=seed_text,
        long=scenario.long,
        concurrent=scenario.concurrent,
        success=verdict.success and error is None,
        duplicates=verdict.duplicates,
        unauthorized=verdict.unauthorized,
        unauthorized_reasons=verdict.reasons,
        policy_violations=verdict.policy_violations,
        policy_reasons=verdict.policy_reasons,
        crashed=crashed,
        latency_s=latency,
        model_calls=bill.calls,
        input_tokens=bill.input_tokens,
        output_tokens=bill.output_tokens,
        unknown_windows_s=trace.unknown_windows_s,
        end=trace.end,
        refunds=verdict.refunds,
        expected={order: amounts for order, amounts in expected.items() if amounts},
        error=error,
        credits=verdict.credits,
        expected_credits={user: amounts for user, amounts in trial.credits.items() if amounts},
    )
