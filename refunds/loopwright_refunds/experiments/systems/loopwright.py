"""The system under test: loopwright's runner, driven as an operator or a worker would.

A delivery starts the run under the job id; a second delivery of the same job meets the first
one's lease and leaves the run to it. After a crash, recovery resumes the run once the dead
process's lease has expired. While it drives a run, the harness plays the human approver
(`a-1`), answering each approval request after `Job.approve_after_s`, and wakes parked
reconciliations when they are due.

The agent is the refund agent with store credit added (`loopwright_refunds.store_credit`), the
write to a downstream without idempotency keys. Its deadline is shortened for the experiment: an
absent credit is sent again 3 s + 0.5 s of skew after the first send, not the shipped 10 s + 2 s,
so a lost request or a crash before the send costs a trial about 4-6 s rather than 12-15 s (the
wait is the deadline, whatever its length: the same mechanism, on a shorter clock).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import timedelta
from itertools import pairwise
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig

from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.journal import ActionEvent, open_journal
from loopwright.checkpoints.leases import LeaseHeld, open_lease_store
from loopwright.graph.budget import Budget
from loopwright.graph.build import compile_graph
from loopwright.graph.context import RunContext
from loopwright.graph.protocol import parse_tool_content
from loopwright.graph.state import (
    TERMINAL_STATUSES,
    ActionStatus,
    ApprovalDecision,
    Principal,
    utcnow,
)
from loopwright.runner import Runner, RunOutcome, UnknownRun
from loopwright.tools.contract import ResendAfterDeadline
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect, task_scope
from loopwright_refunds.experiments.systems import MAX_MODEL_CALLS, Deployment, Job, Trace
from loopwright_refunds.store_credit import STORE_CREDIT

APPROVER = "a-1"
BUDGET = Budget(max_steps=MAX_MODEL_CALLS, deadline_s=120)
# A run is driven through at most this many approvals and parked waits before the harness stops.
MAX_WAKEUPS = 10
CREDIT_RESEND = ResendAfterDeadline(seconds=3.0, skew_s=0.5)
AGENT = refunds.replace(tools=[*refunds.tools, replace(STORE_CREDIT, resend=CREDIT_RESEND)])


class ExperimentRunner(Runner):
    """A `Runner` whose approvals expire after `approval_ttl` (the approval-expiry fault)."""

    approval_ttl = timedelta(hours=24)

    def context(
        self, run_id: str, fence: int, values: Mapping[str, Any] | None = None
    ) -> RunContext:
        return replace(super().context(run_id, fence, values), approval_ttl=self.approval_ttl)


class LoopwrightSystem:
    name = "loopwright"

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    @contextmanager
    def _runner(
        self, job: Job, model: BaseChatModel, *, lease_wait_s: float
    ) -> Iterator[ExperimentRunner]:
        url = self.deployment.database_url
        with ExitStack() as stack:
            runner = ExperimentRunner(
                saver=stack.enter_context(open_checkpointer(url)),
                journal=stack.enter_context(open_journal(url)),
                leases=stack.enter_context(open_lease_store(url)),
                agent=AGENT,
                deps=stack.enter_context(connect(self.deployment.endpoints)),
                model=model,
                budget=BUDGET,
                lease_ttl_s=self.deployment.lease_ttl_s,
                lease_wait_s=lease_wait_s,
            )
            if job.approval_ttl_s is not None:
                runner.approval_ttl = timedelta(seconds=job.approval_ttl_s)
            yield runner

    def deliver(self, job: Job, model: BaseChatModel) -> None:
        principal = Principal(user_id=job.user_id, scope=task_scope(job.task))
        with self._runner(job, model, lease_wait_s=0) as runner:
            try:
                outcome = runner.start(job.task, principal, run_id=job.job_id)
            except LeaseHeld:
                return  # another delivery is advancing this run: it is theirs
            self._drive(runner, outcome, job)

    def recover(self, job: Job, model: BaseChatModel) -> None:
        # Wait out the dead process's lease: it holds the run until it expires.
        wait = self.deployment.lease_ttl_s + 2
        with self._runner(job, model, lease_wait_s=wait) as runner:
            try:
                outcome = runner.resume(job.job_id)
            except UnknownRun:
                # It died before its run's first checkpoint: nothing to resume, start it.
                principal = Principal(user_id=job.user_id, scope=task_scope(job.task))
                outcome = runner.start(job.task, principal, run_id=job.job_id)
            self._drive(runner, outcome, job)

    @staticmethod
    def _drive(runner: Runner, outcome: RunOutcome, job: Job) -> None:
        """Answer approvals and wake parked reconciliations until the run ends."""
        for _ in range(MAX_WAKEUPS):
            if outcome.waiting_for_approval:
                request = outcome.waiting_for_approval[0]
                time.sleep(job.approve_after_s)
                decision = ApprovalDecision(
                    approval_id=request["approval_id"],
                    digest=request["digest"],
                    decision="approve",
                    approver=APPROVER,
                )
                outcome = runner.resume(outcome.run_id, decision.model_dump(mode="json"))
            elif (due := outcome.next_attempt_at) is not None:
                time.sleep(max(0.0, (due - utcnow()).total_seconds()))
                outcome = runner.resume(outcome.run_id)
            else:
                return

    def inspect(self, job: Job) -> Trace:
        with open_journal(self.deployment.database_url) as journal:
            actions = journal.for_run(job.job_id)
            histories = {a.action_id: journal.events(a.action_id) for a in actions}
        with open_checkpointer(self.deployment.database_url) as saver:
            config: RunnableConfig = {"configurable": {"thread_id": job.job_id}}
            values = compile_graph(saver).get_state(config).values
        approved = frozenset(
            a.intent_key
            for a in actions
            if any(e.to_status is ActionStatus.APPROVED for e in histories[a.action_id])
        )
        return Trace(
            approved_keys=approved,
            unknown_windows_s=[
                w for events in histories.values() if (w := unknown_window(events)) is not None
            ],
            end=_ending(values),
        )


def _ending(values: dict[str, Any]) -> str:
    """How the run ended, and the errors the model was shown on the way (for the report)."""
    if not values:
        return "no checkpoint"
    envelopes = [
        parse_tool_content(m.text) for m in values["history"] if isinstance(m, ToolMessage)
    ]
    codes = [str((e.error or {}).get("code")) for e in envelopes if e.status == "error"]
    end = f"{values.get('phase')} {values.get('stop_reason') or ''}".strip()
    return f"{end}; model saw: {', '.join(codes)}" if codes else end


def unknown_window(events: list[ActionEvent]) -> float | None:
    """Seconds from the send whose answer never came to the status that settled the action.

    The window opens at the DISPATCHED that was followed by UNKNOWN (a timeout, a 5xx, a crash
    found on re-entry: until then nobody knows whether the refund happened) and closes at the
    first terminal status after it. None for a write that was answered directly.
    """
    opened = None
    for previous, event in pairwise(events):
        if (
            opened is None
            and previous.to_status is ActionStatus.DISPATCHED
            and event.to_status is ActionStatus.UNKNOWN
        ):
            opened = previous.at
        if opened is not None and event.to_status in TERMINAL_STATUSES:
            return (event.at - opened).total_seconds()
    return None
