"""Prove an agent: its scenarios run once clean, then with each fault at each write they sent.

What a team runs before its agent's first production deploy (`loopwright faults --agent
MODULE:ATTR`, or `prove(agent, database_url=...)` in its own tests). The faults are injected by
the runtime around the send of a write (`loopwright.tools.faults`), so every tool is covered,
whatever client it uses. Each trial is judged in the business system: how many effects each
intent has there (the scenario's `effects`, else the write's own reconcile: applied is one), and
whether the run's ending is truthful: a run that says COMPLETED has every effect it intended. A
duplicate effect, or a COMPLETED run with an effect missing, fails the proof.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel

from loopwright._agent import Agent, TaskRefused
from loopwright.graph.state import Action, Principal
from loopwright.runner import Runner, RunOutcome, open_runner
from loopwright.tools import faults as injected
from loopwright.tools.contract import Guarantee, ReconcileStatus, ToolContext
from loopwright.tools.faults import Fault, FaultPlan

# How long a trial goes on through parked reconciliations (a keyless write's resend deadline).
SETTLE_S = 120.0
# Approvals answered in one trial at most: a scenario asking for more is looping.
MAX_DECISIONS = 20


@dataclass(frozen=True)
class Scenario:
    """One task to prove the agent on: who asks, who approves (every request, as a person
    would), a fresh business world per trial (`deps`, else the agent's own), the scripted model
    that plays it (else the agent's own), and how many effects an intent has in the business
    system (`effects(ctx, action, before)`, `before` the pre-image journaled with its first
    send, if the write takes one; else the write's reconcile, which cannot see a second)."""

    task: str
    user: str
    approver: str | None = None
    deps: Callable[[], AbstractContextManager[Any]] | None = None
    model: Callable[[], BaseChatModel] | None = None
    effects: Callable[[ToolContext[Any], Action, dict[str, Any] | None], int] | None = None


@dataclass(frozen=True)
class Trial:
    """One run of a scenario: under `fault` at its `write`-th send (None: the clean run)."""

    scenario: str
    write: int | None
    tool: str | None
    fault: Fault | None
    run_id: str
    phase: str
    stop_reason: str | None
    stop_detail: str
    effects: dict[str, int]
    sends: list[str] = field(default_factory=list)

    @property
    def reached(self) -> bool:
        """Whether the trial sent the write its fault was aimed at."""
        return self.write is None or len(self.sends) >= self.write

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.effects.values() if n > 1)

    @property
    def truthful(self) -> bool:
        """COMPLETED only with every intended effect there; any other ending claims nothing."""
        return self.stop_reason != "completed" or all(self.effects.values())

    @property
    def verdict(self) -> str:
        if not self.reached:
            # A scenario whose world is not fresh each trial plays out otherwise the second time.
            return f"fail: write {self.write} was never sent; the fault was not tried"
        if self.duplicates:
            return "fail: duplicate effect"
        if not self.truthful:
            return "fail: completed with an effect missing"
        return "ok"

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "write": self.write,
            "tool": self.tool,
            "fault": self.fault.value if self.fault else None,
            "run_id": self.run_id,
            "phase": self.phase,
            "stop_reason": self.stop_reason,
            "stop_detail": self.stop_detail,
            "effects": self.effects,
            "duplicates": self.duplicates,
            "truthful": self.truthful,
            "reached": self.reached,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Proof:
    """Every trial of every scenario; `held` is whether the agent held under every fault."""

    agent: str
    trials: list[Trial]

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.verdict != "ok"]

    @property
    def held(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": "loopwright.faults/1",
            "agent": self.agent,
            "held": self.held,
            "trials": [t.as_json() for t in self.trials],
            "failures": len(self.failures),
        }


def scenarios_of(agent: Agent[Any]) -> list[Scenario]:
    """The agent's own scenario: its `Demo`. Raises TaskRefused for an agent without one."""
    if agent.demo is None:
        raise TaskRefused(
            f"agent {agent.name} declares no demo (Agent(demo=Demo(...))) and no scenarios "
            "were given: nothing to prove it on"
        )
    demo = agent.demo
    return [Scenario(task=demo.task, user=demo.user, approver=demo.approver, deps=demo.deps)]


def prove(
    agent: Agent[Any],
    *,
    database_url: str,
    scenarios: Sequence[Scenario] | None = None,
    faults: Sequence[Fault] = tuple(Fault),
    on_trial: Callable[[Trial], None] | None = None,
) -> Proof:
    """Run each scenario clean, then under each fault at each write the clean run sent (a
    duplicate delivery only at writes declared idempotent by key)."""
    trials: list[Trial] = []
    numbers = itertools.count(1)
    for index, scenario in enumerate(scenarios or scenarios_of(agent), start=1):
        name = f"s{index}"
        clean = _trial(agent, scenario, database_url, name, FaultPlan(), next(numbers))
        trials.append(clean)
        if on_trial:
            on_trial(clean)
        for write, fault in itertools.product(range(1, len(clean.sends) + 1), faults):
            if fault is Fault.DUPLICATE and not _keyed(agent, clean.sends[write - 1]):
                continue  # without a key, a request delivered twice is two requests
            plan = FaultPlan(fault=fault, at=write)
            tool = clean.sends[write - 1]
            trial = _trial(agent, scenario, database_url, name, plan, next(numbers), tool)
            trials.append(trial)
            if on_trial:
                on_trial(trial)
    return Proof(agent.name, trials)


def _keyed(agent: Agent[Any], tool: str) -> bool:
    contract = agent.tools.get(tool)
    return contract is not None and contract.guarantee is Guarantee.IDEMPOTENT_BY_KEY


@contextlib.contextmanager
def _installed(plan: FaultPlan) -> Iterator[FaultPlan]:
    injected.install(plan)
    try:
        yield plan
    finally:
        injected.install(None)


def _trial(
    agent: Agent[Any],
    scenario: Scenario,
    database_url: str,
    name: str,
    plan: FaultPlan,
    number: int,
    tool: str | None = None,
) -> Trial:
    deps_of = scenario.deps or agent.open_deps
    model = scenario.model() if scenario.model else None
    with (
        deps_of() as deps,
        open_runner(database_url, agent, deps=deps, model=model) as runner,
        _installed(plan),
    ):
        principal = runner.principal_for(scenario.user, scenario.task)
        run_id = f"faults-{name}-{number}-{plan.fault or 'clean'}"
        outcome = runner.start(scenario.task, principal, run_id=run_id, wait=SETTLE_S)
        outcome = _approved(runner, outcome, scenario.approver)
        plan.deliver_held()  # whatever is still on its way arrives before the judging
        effects = _effects(runner, outcome, principal, scenario)
    return Trial(
        scenario=name,
        write=plan.at,
        tool=tool,
        fault=plan.fault,
        run_id=run_id,
        phase=outcome.phase,
        stop_reason=outcome.stop_reason,
        stop_detail=outcome.stop_detail,
        effects=effects,
        sends=list(plan.tools),
    )


def _approved(runner: Runner, outcome: RunOutcome, approver: str | None) -> RunOutcome:
    for _ in range(MAX_DECISIONS):
        if not outcome.waiting_for_approval or approver is None:
            return outcome
        outcome = runner.decide(outcome.run_id, "approve", approver, wait=SETTLE_S)
    return outcome


def _effects(
    runner: Runner, outcome: RunOutcome, principal: Principal, scenario: Scenario
) -> dict[str, int]:
    """Effects in the business system per intent the run sent (its latest action each)."""
    latest: dict[str, Action] = {}
    for action in runner.journal.for_run(outcome.run_id):
        if action.attempts:
            latest[action.intent_key] = action
    ctx = ToolContext(deps=runner.deps, run_id=outcome.run_id, principal=principal)
    counts = {}
    for key, action in latest.items():
        sends = [e for e in runner.journal.events(action.action_id) if e.to_status == "DISPATCHED"]
        before = (sends[0].detail or {}).get("pre_image") if sends else None
        if scenario.effects is not None:
            counts[key] = scenario.effects(ctx, action, before)
            continue
        contract = runner.tools.get(action.tool)
        if contract is None or contract.reconcile is None:
            counts[key] = 0
            continue
        answer = contract.reconcile(ctx, action, before)
        counts[key] = int(answer.status is ReconcileStatus.APPLIED)
    return counts
