"""Run and resume agent runs in this process, against SQLite (default) or Postgres.

`Runner` owns what one process needs to advance the runs of one agent: the compiled graph with
its fenced checkpointer, the action journal, the run leases, the agent's dependencies (what its
`deps` factory opened) and the model. Runs are LangGraph threads; the thread id is the run id.
A run belongs to the agent that started it: a runner of another agent refuses it
(`OtherAgentsRun`), whatever it is asked to do with it.

Advancing a run is one attempt (`loopwright.attempt`, the protocol the served graph follows
too): claim its lease (one writer per run; a live lease held by another process is refused),
stream the graph fenced to the lease with `durability="sync"` (each node's update committed
before the next node starts) while a keeper renews the lease, record where the run stands (or
count the failure), release the lease. The fence travels with the attempt, so one runner may
advance several runs at once, from several threads.
"""

from __future__ import annotations

import functools
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import get_checkpoint_id
from langgraph.pregel.debug import tasks_w_writes
from langgraph.types import Command, Interrupt, PregelTask, StateSnapshot

from loopwright._agent import Agent
from loopwright.attempt import (
    MAX_FAILURES,
    Claim,
    Turn,
    attempt,
    claim,
    worker_name,
)
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import FencedSaver, Superstep
from loopwright.checkpoints.journal import (
    ActionEvent,
    ActionJournal,
    VersionedJournal,
    open_journal,
)
from loopwright.checkpoints.leases import (
    Lease,
    LeaseHeld,
    LeaseStore,
    RunPruned,
    RunRecord,
    open_lease_store,
)
from loopwright.checkpoints.retention import summary_of
from loopwright.checkpoints.sql import Database
from loopwright.checkpoints.writers import ANSWER, RESUME, START, VERSION_METADATA_KEY, Writer
from loopwright.core.budget import Budget
from loopwright.core.state import (
    DEFAULT_TENANT,
    ApprovalChoice,
    Phase,
    Principal,
    RunState,
    initial_state,
)
from loopwright.core.text import (
    MAX_TASK_CHARS,
    checked_run_id,
    checked_tenant,
    checked_text,
    named_run,
)
from loopwright.decisions import Asked, check_taken, prepare
from loopwright.graph.build import RUN_DURABILITY, SPECIALIST_NODE, compile_graph
from loopwright.models.factory import changed_settings, make_model, model_settings
from loopwright.nodes.context import RunContext
from loopwright.observability.metrics import note_run_end
from loopwright.observability.tracing import TraceSettings
from loopwright.outcome import RunOutcome
from loopwright.run_spans import note_run, traced_journal

# Called with (node name, that node's update) after each committed step, e.g. to print a timeline.
StepListener = Callable[[str, dict[str, Any]], None]
StepUpdates = dict[str, dict[str, Any] | None]
# Where LangGraph's streamed state carries the interrupts of its superstep (documented, as in
# `invoke`'s result).
INTERRUPTS_KEY = "__interrupt__"
# What a run parked in a reconciliation is resumed with to look again (the value means nothing).
WAKE_VALUE = {"kind": "retry"}
# How LangGraph names a node's task in its path (`task_path_str` of (PULL, node)).
_PULL_PATH = "~__pregel_pull, "


def is_step(node: str, *, in_subgraph: bool) -> bool:
    """Whether a node's update is a step of the run, as a timeline shows it: a subgraph's own
    steps are, one by one; its node in the graph only hands its final state back. Keys of
    LangGraph's own (__start__, __interrupt__, __metadata__) are no node's step."""
    return not node.startswith("__") and (in_subgraph or node != SPECIALIST_NODE)


@dataclass(frozen=True)
class Step:
    """A committed node step of a run: the node, its update, who wrote it (None: a checkpoint
    written before writers were named), and whether the node had waited for an answer (an
    approval, a parked reconciliation) before it finished."""

    node: str
    update: dict[str, Any]
    writer: Writer | None = None
    answered: bool = False


@dataclass(frozen=True)
class Ended:
    """Where an attempt left the run: its state and its pending interrupts."""

    values: Mapping[str, Any]
    interrupts: Sequence[Interrupt]


def advance_kind(payload: Any) -> str:
    """What a process advancing a run was given: a new run, an answer, or nothing (a resume)."""
    if isinstance(payload, Command):
        return ANSWER
    return START if payload is not None else RESUME


def finished(snapshot: StateSnapshot) -> bool:
    """Whether a run's graph has ended. Not `not snapshot.next`: `next` leaves out a task whose
    writes were saved before its process died, though the run still has to apply them and go on."""
    return not snapshot.tasks and not snapshot.next


def writer_version(snapshot: StateSnapshot) -> str | None:
    """The agent version that wrote the checkpoint `snapshot` was read from, if it says."""
    version = (snapshot.metadata or {}).get(VERSION_METADATA_KEY)
    return str(version) if version else None


def check_new_run(run_id: str, task: str, principal: Principal) -> None:
    """Refuse a new run whose text no run could keep, or whose id is not a run id's name
    (`InvalidText`), before anything of it is written: its id, its task, its user's id."""
    checked_run_id(run_id)
    checked_text("the task", task, max_chars=MAX_TASK_CHARS)
    checked_text("the user id", principal.user_id)


def checked_start(user_id: str, task: str, tenant: str) -> None:
    """Refuse (`InvalidText`) a user id, task or tenant that no run could be started on, before
    the agent is asked: a caller that checks first opens nothing (no database, no services) for
    a start it would refuse."""
    checked_text("the user id", user_id)
    checked_text("the task", task, max_chars=MAX_TASK_CHARS)
    checked_tenant(tenant)


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


# `open_runner`'s default: enter the agent's own `deps` factory.
OPEN_DEPS: Any = object()
DEFAULT_LEASE_TTL_S = 30.0
LEASE_TTL_ENV = "LOOPWRIGHT_LEASE_TTL_S"


MAX_LEASE_TTL_S = 86_400.0  # a day: longer, a crashed worker's run would wait that long


def lease_ttl_from_env() -> float:
    """LOOPWRIGHT_LEASE_TTL_S, or the default; ValueError naming the variable for a value that
    is not a number of seconds above 0 and up to a day."""
    raw = os.environ.get(LEASE_TTL_ENV) or ""
    if not raw.strip():
        return DEFAULT_LEASE_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = math.nan
    if not 0 < ttl <= MAX_LEASE_TTL_S:  # NaN too
        raise ValueError(
            f"{LEASE_TTL_ENV}={raw!r}: a lease's time to live is seconds above 0, at most"
            f" {MAX_LEASE_TTL_S:g}"
        )
    return ttl


class Runner:
    """Runs of one agent in one database, advanced by this process (several at once, from
    several threads: each attempt holds its own lease and fence).

    `deps` is what the agent's `deps` factory opened (tools get it as `ctx.deps`). `model` and
    `budget` replace the agent's own (the CLI's `--model`, an experiment's tighter budget).
    """

    def __init__(
        self,
        *,
        saver: FencedSaver,
        journal: ActionJournal,
        leases: LeaseStore,
        agent: Agent[Any],
        deps: Any,
        model: BaseChatModel | None = None,
        model_spec: str | None = None,
        model_change: bool = False,
        budget: Budget | None = None,
        owner: str | None = None,
        lease_ttl_s: float | None = None,
        lease_wait_s: float = 0.0,
        databases: Sequence[Database] = (),
    ) -> None:
        agent.check()
        self.agent = agent
        self.deps = deps
        self.tools = agent.tools
        self.budget = budget or agent.budget
        self._model = model
        # What `model` is, or is to be built from: a spec ("openai:..."); None: the agent's own
        # (or the object given). A run keeps the model it was started with (`model_for`).
        self.model_spec = model_spec
        # The operator asked to change a resumed run's model to this runner's (`model_for`).
        self.model_change = model_change
        self.saver = saver
        self.graph = compile_graph(saver)
        self.journal = journal
        self.leases = leases
        self.owner = owner or worker_name()
        self.lease_ttl_s = lease_ttl_s or lease_ttl_from_env()
        TraceSettings.from_env()  # a tracing switch set to neither on nor off: refused now
        # How long to wait for another owner's lease to expire (a crashed process holds its
        # lease until expiry) before giving up with LeaseHeld.
        self.lease_wait_s = lease_wait_s
        # Told once when a claim has to wait for another owner's lease (a command says whose,
        # and until when: a silent wait of a lease's length reads as a hang).
        self.on_lease_wait: Callable[[LeaseHeld], None] | None = None
        # Attempts in a row that may end in an error before the run ends typed (needs_human).
        self.max_failures = MAX_FAILURES
        # The connections the runner keeps (`open_runner`'s): readiness asks each to answer,
        # and `connection_lost` says whether one was found lost.
        self.databases = tuple(databases)

    def connection_lost(self) -> bool:
        """Whether a connection this runner keeps was lost: it cannot go on; a process that
        must outlive a database restart opens a new runner (`open_runner`)."""
        return any(db.lost for db in self.databases)

    @property
    def model(self) -> BaseChatModel:
        """The model, made on first use: listing and showing runs never needs one."""
        if self._model is None:
            self._model = self.agent.chat_model(self.model_spec)
        return self._model

    def model_for(
        self, run_id: str, values: Mapping[str, Any] | None = None
    ) -> tuple[BaseChatModel, str]:
        """The model a run is advanced with, and its spec: exactly the one it recorded (V).

        A new run takes this runner's. A run is resumed with a model rebuilt from its recorded
        spec and settings (endpoint, API, timeout, retries, ...: this environment's are not
        looked at), unless this runner was given a spec of its own (`--model`), which must then
        be the run's, with the same settings: ModelChanged (or ModelSettingsChanged, naming what
        differs) otherwise. Only a runner told to change the run's model (`model_change`,
        `--model-change`) uses its own (or the recorded spec with this environment's settings),
        and the run records the change in V. `values`: the run's state as the caller has just
        read it, if it has (a read less)."""
        if values is None:
            values = self.graph.get_state(self.config(run_id)).values or {}
        versions = values.get("versions")
        mine = self.model_spec or ""
        if not versions or "model_spec" not in versions:
            return self.model, mine
        recorded = str(versions["model_spec"])
        settings = versions.get("model_settings") or {}
        if self.model_change:  # the operator's explicit change, recorded in V at the next gate
            if self.model_spec is None and recorded:
                return make_model(recorded), recorded  # this environment's settings
            return self.model, mine
        if recorded != mine:
            if self.model_spec is not None:
                raise ModelChanged(run_id, recorded, mine)
            if not recorded:
                return self.agent.chat_model(), recorded
            return make_model(recorded, settings or None), recorded
        if settings and (changed := changed_settings(settings, model_settings(self.model))):
            raise ModelSettingsChanged(run_id, recorded, changed)
        return self.model, mine

    def config(self, run_id: str) -> RunnableConfig:
        return {"configurable": {"thread_id": run_id}, "recursion_limit": 10_000}

    def is_approver(self, user_id: str) -> bool:
        return self.agent.is_approver(self.deps, user_id)

    def principal_for(self, user_id: str, task: str, *, tenant: str = DEFAULT_TENANT) -> Principal:
        """The trusted principal of a new run (the agent's answer; may raise TaskRefused, or
        InvalidText before the agent is asked)."""
        checked_start(user_id, task, tenant)
        return self.agent.principal_for(self.deps, user_id, task, tenant=tenant)

    def context(
        self, run_id: str, fence: int, values: Mapping[str, Any] | None = None
    ) -> RunContext:
        """The principal travels in the run's input, committed before any node runs. `values`:
        the run's state as the caller has just read it, if it has (see `model_for`)."""
        agent = self.agent
        model, spec = self.model_for(run_id, values)
        cancel_requested = functools.partial(self.leases.cancel_requested, run_id)
        return RunContext(
            cancel_requested=cancel_requested,
            cancel_requested_now=cancel_requested,
            clock=self.leases.now,
            is_approver=self.is_approver,
            model=model,
            model_spec=spec,
            model_settings=model_settings(model),
            model_change=self.model_change,
            tools=self.tools,
            deps=self.deps,
            agent_name=agent.name,
            agent_version=agent.version,
            instructions=agent.instructions,
            prompt_version=agent.prompt_version,
            journal=traced_journal(VersionedJournal(self.journal, agent.version)),
            budget=self.budget,
            approval_ttl=agent.approval_ttl,
            fence=fence,
            planner=agent.planner,
            agents=agent.specialists,
            done=agent.done,
            claims=agent.claims,
        )

    def owned(self, run_id: str) -> RunRecord:
        """The run's record, if this runner's agent may touch the run; else OtherAgentsRun.
        Raises UnknownRun for a run this database does not have."""
        record = self.leases.get(run_id)
        if record is None:
            raise UnknownRun(run_id)
        self._check_agent(record)
        return record

    def start(
        self,
        task: str,
        principal: Principal,
        *,
        run_id: str | None = None,
        on_step: StepListener | None = None,
        wait: float = 0.0,
    ) -> RunOutcome:
        """Start a run of `task` for `principal`.

        Starting a run id that exists already, with the same task and user, is a retry of the
        start (the caller may not know whether the first got through): it resumes the run and
        never begins it again, which would ask the model anew. Another task or user under an
        existing id is refused (`RunExists`). `wait`: seconds to go on through parked
        reconciliations (see `settle`); 0 returns a run parked in RECONCILING as it is.
        """
        outcome = self._start(task, principal, run_id or new_run_id(), on_step)
        return self._settled(outcome, wait, on_step)

    def settle(
        self, run_id: str, *, wait: float, on_step: StepListener | None = None
    ) -> RunOutcome:
        """Resume the run each time its parked reconciliation is due, for at most `wait`
        seconds from now: what an embedding program would otherwise do by sleeping and calling
        `resume`. Returns where the run stands then: parked still if its next look comes after
        the bound; a run waiting for a person, or ended, at once."""
        return self._settled(self.outcome(run_id), wait, on_step)

    def _settled(
        self, outcome: RunOutcome, wait: float, on_step: StepListener | None
    ) -> RunOutcome:
        bound = time.monotonic() + wait
        while outcome.phase == Phase.RECONCILING and (due := outcome.next_attempt_at) is not None:
            # Judged on the database's clock, as the park itself was.
            delay = max(0.0, (due - self.leases.now()).total_seconds())
            if time.monotonic() + delay > bound:
                break
            time.sleep(delay)
            outcome = self._resume(outcome.run_id, None, on_step)
        return outcome

    def _start(
        self, task: str, principal: Principal, run_id: str, on_step: StepListener | None
    ) -> RunOutcome:
        # A new run is registered already leased to this runner: no claim, and no state to read.
        record, lease = self.begin(run_id, task, principal, self.owner, self.lease_ttl_s)
        # The run began when it was registered, by the database's clock.
        begun = initial_state(run_id, task, principal, now=record.created_at)
        if lease is not None:
            return self._advance(run_id, begun, on_step, {}, lease=lease)
        if (record.task, record.user_id) != (task, principal.user_id):
            raise RunExists(run_id)
        # A run never leased (fence 0) has no step yet: nothing writes one without a lease.
        values = self.graph.get_state(self.config(run_id)).values if record.fence else {}
        if values:
            return self.resume(run_id, on_step=on_step)
        return self._advance(run_id, begun, on_step, values)

    def resume(
        self,
        run_id: str,
        value: Any = None,
        *,
        on_step: StepListener | None = None,
        wait: float = 0.0,
    ) -> RunOutcome:
        """Continue a run: after a crash, after a parked reconciliation's wait (value None), or
        with a person's answer to its approval interrupt (value: an ApprovalDecision dump).

        A run waiting for approval is not advanced without an answer; a finished run stays as it
        is. Both just report where they stand. `wait`: as for `start`.
        """
        return self._settled(self._resume(run_id, value, on_step), wait, on_step)

    def _resume(self, run_id: str, value: Any, on_step: StepListener | None) -> RunOutcome:
        self.owned(run_id)
        snapshot = self.graph.get_state(self.config(run_id))
        kinds = {i.value.get("kind") for i in snapshot.interrupts}
        if finished(snapshot):
            return self._record_finished(run_id, snapshot)
        if "approval" in kinds and value is None:
            return self.outcome(run_id)
        if snapshot.interrupts:
            # A parked reconciliation is resumed to look again; the value carries no meaning.
            payload: Any = Command(resume=value if value is not None else WAKE_VALUE)
        else:
            payload = None
        return self._advance(run_id, payload, on_step, snapshot.values)

    def decide(
        self,
        run_id: str,
        decision: ApprovalChoice,
        approver: str,
        *,
        approval_id: str | None = None,
        comment: str = "",
        changes: dict[str, Any] | None = None,
        on_step: StepListener | None = None,
        wait: float = 0.0,
    ) -> RunOutcome:
        """Answer the approval the run waits for (`approval_id`, or its first), as `approver`,
        and advance the run (through parked reconciliations for up to `wait` seconds, as
        `start`).

        The decision names the request's digest (it authorises that action and nothing else);
        an edit changes only `changes`, arguments the write declares editable. Raises
        DecisionRefused (`loopwright.decisions`) for a decision the run would not take, with
        the request still waiting, and DecisionNotTaken for one it did not record."""
        prepared = prepare(
            self,
            run_id,
            approver,
            decision,
            asked=Asked(approval_id=approval_id),
            comment=comment,
            changes=changes,
        )
        outcome = self._resume(run_id, prepared.resume, on_step)
        check_taken(self, run_id, prepared.answer)
        return self._settled(outcome, wait, on_step)

    def cancel(self, run_id: str, *, on_step: StepListener | None = None) -> RunOutcome:
        """Ask a run to stop: no new model step or action starts; writes in flight are settled.

        A run another live process is advancing stops at its next step (the request is in the
        database). A run that waits (for approval, or for a parked reconciliation) is advanced
        here to its typed end.
        """
        self.owned(run_id)
        run = self.leases.request_cancel(run_id)
        snapshot = self.graph.get_state(self.config(run_id))
        if finished(snapshot) or (run.lease_live and run.owner != self.owner):
            return self.outcome(run_id)
        kinds = {i.value.get("kind") for i in snapshot.interrupts}
        if "approval" in kinds:
            # Answer the approval interrupt with the cancellation itself, under our lease.
            answer = {"cancel_requested": True}
            with attempt(
                self.leases, run_id, graph=self.graph, saver=self.saver, how=self._claim_as()
            ) as turn:
                turn.graph.update_state(self.config(run_id), answer, as_node="approval")
            if on_step is not None:  # the approval's step, as `steps` reads it back
                on_step("approval", answer)
            return self._advance(run_id, None, on_step)
        payload: Command[Any] | None = (
            Command(resume={"kind": "cancel"}) if snapshot.interrupts else None
        )
        return self._advance(run_id, payload, on_step)

    def _record_finished(self, run_id: str, snapshot: StateSnapshot) -> RunOutcome:
        """A run whose graph has ended, but whose last writer died before noting it in lw_runs
        (which workers poll): note it now, so that no worker takes it for unfinished. The run
        stays the version that wrote its last step, not this process's."""
        outcome = self.outcome(run_id)
        run = self.leases.get(run_id)
        if run is not None and run.phase != outcome.phase:
            lease = claim(self.leases, run_id, self._claim_as())
            try:
                self.leases.record(
                    lease, outcome.phase, release=True, agent_version=writer_version(snapshot)
                )
            except BaseException:
                self.leases.release(lease)
                raise
        return outcome

    def submit(self, task: str, principal: Principal, *, run_id: str | None = None) -> str:
        """Create a run without advancing it: any worker may pick it up."""
        run_id = run_id or new_run_id()
        check_new_run(run_id, task, principal)
        self.graph.update_state(
            self.config(run_id),
            initial_state(run_id, task, principal, now=self.leases.now()),
            as_node="__start__",
        )
        self.register(run_id, task, principal)
        return run_id

    def register(self, run_id: str, task: str, principal: Principal) -> RunRecord:
        """Record the run as this agent's (at its version); another agent's is refused."""
        record = self.leases.register(
            run_id,
            task=task,
            user_id=principal.user_id,
            agent=self.agent.name,
            agent_version=self.agent.version,
            tenant=principal.tenant,
        )
        self._check_agent(record)
        return record

    def begin(
        self,
        run_id: str,
        task: str,
        principal: Principal,
        owner: str,
        ttl_s: float,
        *,
        engine: str = "",
    ) -> tuple[RunRecord, Lease | None]:
        """Register a new run as this agent's, leased to `owner` from the start (`LeaseStore.
        begin`); a run registered before keeps its row and gets no lease (another agent's is
        refused). `engine` names the server engine that hosts it, if one does."""
        check_new_run(run_id, task, principal)
        record, lease = self.leases.begin(
            run_id,
            owner,
            ttl_s,
            task=task,
            user_id=principal.user_id,
            agent=self.agent.name,
            agent_version=self.agent.version,
            tenant=principal.tenant,
            engine=engine,
        )
        if lease is None:
            self._check_agent(record)
        return record, lease

    def _check_agent(self, record: RunRecord) -> None:
        if record.agent and record.agent != self.agent.name:
            raise OtherAgentsRun(record.run_id, record.agent, self.agent.name)

    def _advance(
        self,
        run_id: str,
        payload: Any,
        on_step: StepListener | None,
        values: Mapping[str, Any] | None = None,
        *,
        lease: Lease | None = None,
    ) -> RunOutcome:
        """One attempt at the run (`loopwright.attempt`): its outcome. `values`: the run's
        state as the caller has just read it, if it has; `lease`: the new run's, if it was
        registered leased to this runner."""
        if lease is None:
            # A model the run was not started with: refused before anything (and again, on the
            # state read under the lease, by `context`). A new run has none yet.
            self.model_for(run_id, values)
        with attempt(
            self.leases,
            run_id,
            graph=self.graph,
            saver=self.saver,
            how=self._claim_as(),
            lease=lease,
            kind=advance_kind(payload),
            max_failures=self.max_failures,
        ) as turn:
            return self._attempted(turn, payload, on_step, new=lease is not None)

    def _attempted(
        self, turn: Turn, payload: Any, on_step: StepListener | None, *, new: bool
    ) -> RunOutcome:
        run_id = turn.run_id
        # The state as of the claim: one read for the start's check and the run's model. A new
        # run's first lease (fence 1, taken as it was registered) finds none to read.
        values = {} if new else turn.graph.get_state(self.config(run_id)).values
        if isinstance(payload, dict) and values:
            # A concurrent start of this run got its first step in before our claim: go on from
            # there rather than begin again.
            payload = None
        context = turn.context(self.context(run_id, turn.lease.fence, values))
        ended = self._stream(turn, payload, context, on_step)
        version = None  # the claim's: this process wrote the run's last step
        if ended is None:  # nothing ran: where the run stands is its checkpoint's
            snapshot = turn.graph.get_state(self.config(run_id))
            ended = Ended(snapshot.values, snapshot.interrupts)
            version = writer_version(snapshot)
        outcome = self._outcome(run_id, ended.values, ended.interrupts)
        turn.record(outcome.phase, outcome.next_attempt_at, version)
        note_run_end(values, ended.values)
        note_run(turn.span, outcome, cast(RunState, ended.values))
        return outcome

    def _stream(
        self,
        turn: Turn,
        payload: Any,
        context: RunContext,
        on_step: StepListener | None,
    ) -> Ended | None:
        """Run the graph, telling `on_step` of every node's step (a specialist's one by one), and
        say where it ended (None if no step ran): the state after its last superstep, as
        LangGraph streams it, and the interrupts raised in that superstep, which are the run's
        pending ones (the graph stops at the superstep that interrupts). Reading them off the
        stream spares a read of the state from the checkpoints, which replays the whole
        history of its delta channels.

        Streaming a subgraph's steps makes LangGraph run every node on its thread pool, a hop
        there and back per superstep, where it otherwise runs a lone task in this thread: asked
        for only where someone listens to the steps."""
        stream = turn.graph.stream(
            payload,
            turn.config(self.config(turn.run_id)),  # each checkpoint names its writer
            context=context,
            durability=RUN_DURABILITY,
            stream_mode=["values", "updates"] if on_step else ["values"],
            subgraphs=on_step is not None,
        )
        ended: Ended | None = None
        for item in stream:
            namespace, mode, chunk = item if on_step else ((), *item)
            if mode == "values" and not namespace:
                values = dict(cast(Mapping[str, Any], chunk))
                interrupts = values.pop(INTERRUPTS_KEY, ())
                ended = Ended(values, tuple(interrupts))
            elif mode == "updates" and on_step is not None:
                for node, update in cast(StepUpdates, chunk).items():
                    if is_step(node, in_subgraph=bool(namespace)):
                        on_step(node, update or {})
        return ended

    def _claim_as(self) -> Claim:
        """How this runner claims a run: as its owner, for its agent's version, waiting for
        another owner's lease as long as it was told to."""
        return Claim(
            self.owner,
            self.lease_ttl_s,
            self.agent.version,
            wait_s=self.lease_wait_s,
            on_wait=self.on_lease_wait,
        )

    def run_ids(self) -> list[str]:
        return [run.run_id for run in self.leases.runs()]

    def steps(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Every committed node step of a run, oldest first: each node's name and update."""
        return [(step.node, step.update) for step in self.written_steps(run_id, writers=False)]

    def written_steps(self, run_id: str, *, writers: bool = True) -> list[Step]:
        """Every committed node step of a run, oldest first, read back from the checkpoints
        as `_stream` reports them live (a specialist's one by one): each finished task and its
        writes to the state, as LangGraph's history shows them (`tasks_w_writes`), read in
        one pass where the saver can (`supersteps`: the history would rebuild every
        checkpoint's values, and has a subgraph's in a history of its own); and, with
        `writers`, who wrote it, as the checkpoint its commit saved names them
        (`checkpoints.writers.Writer`: a second read of the thread's checkpoints)."""
        supersteps = self.saver.supersteps(run_id)
        if supersteps is not None:
            written = self._writers(run_id) if writers else {}
            tasks = [
                (s.checkpoint_ns, written.get((s.checkpoint_ns, s.checkpoint_id)), task)
                for s in supersteps
                for task in self._tasks(s)
            ]
        elif history := list(self.graph.get_state_history(self.config(run_id))):
            # A forked or older thread: the graph's own steps (not a subgraph's), each written
            # by the process that saved the checkpoint after it.
            chain = history[::-1]
            after = [Writer.of(s.metadata) for s in chain[1:]] + [None]
            tasks = [
                ("", writer, task)
                for snapshot, writer in zip(chain, after, strict=True)
                for task in snapshot.tasks
            ]
        elif summary_of(self.leases.db, run_id) is not None:
            raise RunPruned(run_id)  # its steps went with its checkpoints
        else:
            raise UnknownRun(run_id)
        return [
            Step(task.name, task.result or {}, writer, answered=bool(task.interrupts))
            for ns, writer, task in tasks
            if is_step(task.name, in_subgraph=bool(ns)) and task.result is not None
        ]

    def _writers(self, run_id: str) -> dict[tuple[str, str], Writer | None]:
        """Who committed the superstep run from each checkpoint of the run's thread (by its
        namespace and id): the writer the checkpoint saved after it names."""
        return {
            (str(saved.config["configurable"]["checkpoint_ns"]), parent): Writer.of(saved.metadata)
            for saved in self.saver.list({"configurable": {"thread_id": run_id}})
            if saved.parent_config and (parent := get_checkpoint_id(saved.parent_config))
        }

    def _tasks(self, superstep: Superstep) -> tuple[PregelTask, ...]:
        """The tasks of nodes that wrote in a superstep, as a snapshot of its checkpoint shows
        them (a node's task is a pull task: its path names it)."""
        tasks: dict[str, PregelTask] = {}
        for task_id, path, _channel, _value in superstep.writes:
            if path.startswith(_PULL_PATH) and task_id not in tasks:
                tasks[task_id] = PregelTask(task_id, path.removeprefix(_PULL_PATH), (path,))
        writes = [(task_id, channel, value) for task_id, _, channel, value in superstep.writes]
        return tasks_w_writes(tasks.values(), writes, None, self.graph.stream_channels_asis)

    def history(self, run_id: str) -> dict[str, list[ActionEvent]]:
        """Each action of the run (by id, first planned first) with every status change it
        went through: whether a write was reconciled as applied or re-sent, at which attempt,
        what reconciliation found and why, read from the journal."""
        return {a.action_id: self.journal.events(a.action_id) for a in self.journal.for_run(run_id)}

    def state(self, run_id: str) -> RunState:
        values = self.graph.get_state(self.config(run_id)).values
        if not values:
            raise UnknownRun(run_id)
        return cast(RunState, values)

    def outcome(self, run_id: str) -> RunOutcome:
        snapshot = self.graph.get_state(self.config(run_id))
        return self._outcome(run_id, snapshot.values, snapshot.interrupts)

    def _outcome(
        self, run_id: str, values: Mapping[str, Any], raised: Sequence[Interrupt]
    ) -> RunOutcome:
        if not values:
            summary = summary_of(self.leases.db, run_id)
            if summary is None:
                raise UnknownRun(run_id)
            return RunOutcome(
                run_id=run_id,
                phase=summary.phase,
                stop_reason=summary.stop_reason,
                stop_detail=summary.stop_detail,
                verification=summary.verification,
                actions=self.journal.for_run(run_id),
                pruned=summary,
            )
        interrupts = [i.value | {"interrupt_id": i.id} for i in raised]
        phase = values.get("phase", Phase.READY)
        if any(i.get("kind") == "approval" for i in interrupts):
            phase = Phase.WAITING_APPROVAL
        elif any(i.get("kind") == "reconcile_wait" for i in interrupts):
            phase = Phase.RECONCILING
        actions = self.journal.for_run(run_id)
        compensations = []
        if values.get("stop_reason") == "cancelled":
            for action in actions:
                contract = self.tools.get(action.tool)
                if action.status == "SUCCEEDED" and contract and contract.compensation:
                    compensations.append(contract.compensation(action))
        return RunOutcome(
            run_id=run_id,
            phase=str(phase),
            stop_reason=values.get("stop_reason"),
            stop_detail=values.get("stop_detail", ""),
            verification=values.get("verification"),
            interrupts=interrupts,
            actions=actions,
            compensations=compensations,
        )


class RunExists(ValueError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} exists already, with another task or user")
        self.run_id = run_id


class ModelChanged(ValueError):
    """A run resumed with a model other than the one it was started with."""

    def __init__(self, run_id: str, recorded: str, given: str) -> None:
        started = recorded or "its agent's own model"
        super().__init__(
            f"run {run_id} was started with {started}; resume it with that"
            + (f" (--model {recorded})" if recorded else " (no --model)")
            + f", not {given or 'the agent default'}, or change it with --model-change"
            " (recorded in the run)"
        )


class ModelSettingsChanged(ModelChanged):
    """A run resumed with its model's name but other settings (another endpoint, timeout...)."""

    def __init__(self, run_id: str, spec: str, changed: list[str]) -> None:
        ValueError.__init__(
            self,
            f"run {run_id} was started with {spec} at other settings ({'; '.join(changed)}):"
            " resume it without --model to keep its own, or add --model-change to apply these"
            " (recorded in the run)",
        )


class OtherAgentsRun(PermissionError):
    """A run of another agent: this process has not its tools, rules or model, so it never
    validates, approves, cancels or resumes it."""

    def __init__(self, run_id: str, agent: str, mine: str) -> None:
        super().__init__(f"run {run_id} belongs to agent {agent!r}, not {mine!r}")
        self.run_id = run_id
        self.agent = agent


class UnknownRun(LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {named_run(run_id)} in this database")
        self.run_id = run_id


@contextmanager
def open_runner(
    database_url: str,
    agent: Agent[Any],
    *,
    deps: Any = OPEN_DEPS,
    model: BaseChatModel | None = None,
    model_spec: str | None = None,
    model_change: bool = False,
    budget: Budget | None = None,
    lease_wait_s: float = 0.0,
) -> Iterator[Runner]:
    """A runner of `agent` on the database at `database_url`, with the agent's dependencies
    opened for as long as it is (or `deps`, given: `None` for a runner that only reads runs)."""
    with ExitStack() as stack:
        saver = stack.enter_context(open_checkpointer(database_url))
        journal = stack.enter_context(open_journal(database_url))
        leases = stack.enter_context(open_lease_store(database_url))
        if deps is OPEN_DEPS:
            deps = stack.enter_context(agent.open_deps())
        yield Runner(
            saver=saver,
            journal=journal,
            leases=leases,
            agent=agent,
            deps=deps,
            model=model,
            model_spec=model_spec,
            model_change=model_change,
            budget=budget,
            lease_wait_s=lease_wait_s,
            databases=(saver.db, journal.db, leases.db),
        )
