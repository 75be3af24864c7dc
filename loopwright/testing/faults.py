"""Prove an agent: its scenarios run once clean, then with each fault at each write they sent.

What a team runs before its agent's first production deploy (`loopwright faults --agent
MODULE:ATTR`, or `prove(agent, database_url=...)` in its own tests). The network's faults are
injected by the runtime around the send of a write (`loopwright.tools.faults`), so every tool is
covered, whatever client it uses; the crash faults kill a real process at the k-th write's crash
point and resume the run in another. Each trial is judged in the business system: how many
effects each intent has there (the scenario's `effects`, else the write's own reconcile: applied
is one), and whether the run's ending is truthful: a run that says COMPLETED has every effect it
intended. A duplicate effect, or a COMPLETED run with an effect missing, fails the proof.

Each proof runs on trials of its own: its runs' ids carry an id of the proof's (`Proof.proof`),
so proving again on the same database starts every trial afresh, never resumes an earlier
proof's finished runs, and gives the same verdict.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from loopwright._agent import Agent, Scenario, TaskRefused
from loopwright._loading import load_agent
from loopwright.attempt import process_owner
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.core.crashpoints import EXIT_CODE as CRASHED
from loopwright.core.crashpoints import nth
from loopwright.core.state import Action, ActionStatus, Principal
from loopwright.outcome import RunOutcome
from loopwright.runner import Runner, open_runner
from loopwright.tools import faults as injected
from loopwright.tools.contract import Guarantee, ReconcileStatus, ToolContext
from loopwright.tools.faults import Fault, FaultPlan

# How long a trial goes on through parked reconciliations (a keyless write's resend deadline).
SETTLE_S = 120.0
# Approvals answered in one trial at most: a scenario asking for more is looping.
MAX_DECISIONS = 20
# How long the resuming process waits for a lease that is still held (the crashed process's
# is given up for it as soon as it has been reaped).
LEASE_WAIT_S = 30.0
CHILD_TIMEOUT_S = 300.0


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
    # The tool of each send the trial's processes made (a crashed one's before it died).
    sends: list[str] = field(default_factory=list)
    crashed: bool = False

    @property
    def reached(self) -> bool:
        """Whether the trial met its fault: sent the write it was aimed at (and, for a crash
        fault, died there)."""
        if self.fault is None or self.write is None:
            return True
        return self.crashed if self.fault.crash_point else len(self.sends) >= self.write

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
    # Faults not tried, and why (crash faults without the agent's import path).
    skipped: list[str] = field(default_factory=list)
    # What the ids of this proof's runs begin with (`faults-<id>-`): `loopwright show` them.
    proof: str = ""

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
            "proof": self.proof,
            "held": self.held,
            "failures": len(self.failures),
            "skipped": self.skipped,
            "trials": [t.as_json() for t in self.trials],
        }


def scenarios_of(agent: Agent[Any]) -> list[Scenario]:
    """The agent's scenarios, else its `Demo`. Raises TaskRefused for an agent with neither."""
    if agent.scenarios:
        return list(agent.scenarios)
    if agent.demo is None:
        raise TaskRefused(
            f"agent {agent.name} declares no scenarios (Agent(scenarios=[Scenario(...)])) and "
            "no demo: nothing to prove it on"
        )
    demo = agent.demo
    return [Scenario(task=demo.task, user=demo.user, approver=demo.approver, deps=demo.deps)]


def prove(
    agent: Agent[Any],
    *,
    database_url: str,
    scenarios: Sequence[Scenario] | None = None,
    faults: Sequence[Fault] = tuple(Fault),
    agent_path: str | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> Proof:
    """Run each scenario clean, then under each fault at each write the clean run sent (a
    duplicate delivery only at writes declared idempotent by key). The crash faults run the
    trial in a process of its own, which loads the agent from `agent_path` ("module:attr") and
    its scenario by number from the agent's own: without a path, or with scenarios given here,
    they are skipped (and said so in `Proof.skipped`)."""
    given = scenarios is not None
    chosen = list(scenarios) if scenarios is not None else scenarios_of(agent)
    skipped = []
    if any(f.crash_point for f in faults) and (agent_path is None or given):
        faults = [f for f in faults if not f.crash_point]
        skipped.append(
            "crash faults: they need the agent's import path and its own scenarios "
            "(a new process loads both)"
        )
    trials: list[Trial] = []
    numbers = itertools.count(1)
    proof = f"faults-{uuid.uuid4().hex[:8]}"

    def run_id(name: str, plan: FaultPlan) -> str:
        return f"{proof}-{name}-{next(numbers)}-{plan.fault or 'clean'}"

    def record(trial: Trial) -> None:
        trials.append(trial)
        if on_trial:
            on_trial(trial)

    for index, scenario in enumerate(chosen):
        name = f"s{index + 1}"
        plan = FaultPlan()
        clean = _trial(agent, scenario, database_url, name, plan, run_id(name, plan))
        record(clean)
        for write, fault in itertools.product(range(1, len(clean.sends) + 1), faults):
            tool = clean.sends[write - 1]
            if fault is Fault.DUPLICATE and not _keyed(agent, tool):
                continue  # without a key, a request delivered twice is two requests
            plan = FaultPlan(fault=fault, at=write)
            crash = _Crash(agent_path, index) if fault.crash_point and agent_path else None
            trial_id = run_id(name, plan)
            record(_trial(agent, scenario, database_url, name, plan, trial_id, tool, crash))
    return Proof(agent.name, trials, skipped, proof)


def _keyed(agent: Agent[Any], tool: str) -> bool:
    contract = agent.tools.get(tool)
    return contract is not None and contract.guarantee is Guarantee.IDEMPOTENT_BY_KEY


@dataclass(frozen=True)
class _Crash:
    """Where a crash trial's first process finds the agent and its scenario."""

    agent_path: str
    scenario: int


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
    run_id: str,
    tool: str | None = None,
    crash: _Crash | None = None,
) -> Trial:
    deps_of = scenario.deps or agent.open_deps
    model = scenario.model() if scenario.model else None
    crashed = False
    with (
        deps_of() as deps,
        open_runner(
            database_url, agent, deps=deps, model=model, lease_wait_s=LEASE_WAIT_S
        ) as runner,
    ):
        principal = runner.principal_for(scenario.user, scenario.task)
        if crash is not None:
            assert plan.fault is not None and plan.fault.crash_point and plan.at
            point = nth(plan.fault.crash_point, plan.at)
            env = dict(scenario.env(deps)) if scenario.env else {}
            crashed = _first_process(crash, database_url, run_id, point, env, runner)
            plan.tools.extend(_sent(runner, run_id))
            # The run goes on in this process: the one that died is not coming back.
            outcome = runner.resume(run_id, wait=SETTLE_S)
        else:
            with _installed(plan):
                outcome = runner.start(scenario.task, principal, run_id=run_id, wait=SETTLE_S)
        with _installed(plan):
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
        crashed=crashed,
    )


def _sent(runner: Runner, run_id: str) -> list[str]:
    """The tool of each send journaled for the run, first to last (each DISPATCHED)."""
    sends = [
        (event.at, event.seq, action.tool)
        for action in runner.journal.for_run(run_id)
        for event in runner.journal.events(action.action_id)
        if event.to_status is ActionStatus.DISPATCHED
    ]
    return [tool for _, _, tool in sorted(sends)]


def _first_process(
    crash: _Crash, database_url: str, run_id: str, point: str, env: dict[str, str], runner: Runner
) -> bool:
    """Start the trial's run in a new process armed to die at `point`; whether it died there.
    The dead process's lease is given up for it: the run goes on at once, and the process ran
    with the lease's usual time to live (a short one, waited out faster, lapsed while a loaded
    machine kept it from renewing, and the process stopped short of its crash point)."""
    job = {
        "agent": crash.agent_path,
        "scenario": crash.scenario,
        "database_url": database_url,
        "run_id": run_id,
    }
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; from loopwright.testing.faults import child; child()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env, CRASH_ENV: point},
        text=True,
    ) as process:
        try:
            process.communicate(json.dumps(job), timeout=CHILD_TIMEOUT_S)
        finally:
            process.kill()
            process.wait()
    runner.leases.release_for_dead(run_id, process_owner(process.pid))
    return process.returncode == CRASHED


def child() -> None:
    """A crash trial's first process: the scenario's run, started as the trial's (the job on
    stdin), approved as the scenario says, until it ends or the armed crash point kills it."""
    job = json.loads(sys.stdin.read())
    agent = load_agent(job["agent"])
    scenario = scenarios_of(agent)[job["scenario"]]
    model = scenario.model() if scenario.model else None
    with open_runner(job["database_url"], agent, model=model) as runner:
        principal = runner.principal_for(scenario.user, scenario.task)
        outcome = runner.start(scenario.task, principal, run_id=job["run_id"], wait=SETTLE_S)
        _approved(runner, outcome, scenario.approver)


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
        sends = [
            e
            for e in runner.journal.events(action.action_id)
            if e.to_status is ActionStatus.DISPATCHED
        ]
        before = (sends[0].detail or {}).get("pre_image") if sends else None
        if scenario.effects is not None:
            counts[key] = scenario.effects(ctx, action, before)
            continue
        contract = runner.tools.get(action.tool)
        if contract is None or contract.reconcile is None:
            counts[key] = 0
            continue
        answer = contract.reconcile_intent(ctx, action, before)
        counts[key] = int(answer.status is ReconcileStatus.APPLIED)
    return counts
