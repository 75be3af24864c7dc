"""The run state S = (H, E, J, P, B, V) plus run control.

Two layers:

* Typed pydantic models for each part (`Principal`, `Action`, `Evidence`, ...). Nodes work with
  these.
* `RunState`, the LangGraph channel layout. Channels hold JSON-native values (dicts, lists,
  strings), so a checkpoint is plain data: readable by any process and replayable as a golden
  state per schema version. The one exception is history, which holds langchain messages, the
  protocol items themselves, which LangGraph's serializer knows and Studio shows as a chat.

Storage stays linear in the number of steps: the two lists that grow with every step, history (H)
and evidence (E), are `DeltaChannel`s, so a checkpoint stores only the items a step appended, not
the whole list again. Everything else is small and bounded by the task, not by the step count.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    TypedDict,
    get_args,
    get_origin,
    get_type_hints,
)

from langchain_core.messages import AnyMessage
from langgraph.channels import DeltaChannel
from pydantic import BaseModel, ConfigDict, Field, model_validator

from loopwright.core.roles import DEFAULT_ROLES

STATE_SCHEMA_VERSION = 1


def utcnow() -> datetime:
    return datetime.now(UTC)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces. Digests are taken over this."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


class Phase(StrEnum):
    """Where a run stands: READY to ask the model, waiting on tools or a person, reconciling,
    verifying, or ended (COMPLETED only when verified; INCOMPLETE with a typed stop reason)."""

    READY = "READY"
    MODEL_STEP = "MODEL_STEP"
    WAITING_TOOLS = "WAITING_TOOLS"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    RECONCILING = "RECONCILING"
    VERIFYING = "VERIFYING"
    COMPLETED = "COMPLETED"
    INCOMPLETE = "INCOMPLETE"


# The phases a run ends in: nothing advances it, nobody is asked anything about it.
ENDED_PHASES = frozenset({Phase.COMPLETED.value, Phase.INCOMPLETE.value})
# The phases a served run its engine stopped advancing is never in: ended, waiting for a
# person, or parked in a reconciliation (woken by a rule of its own). `server.waker` continues a
# run in any other phase that nothing holds.
NEVER_STRANDED = ENDED_PHASES | {Phase.WAITING_APPROVAL.value, Phase.RECONCILING.value}


class StopReason(StrEnum):
    """Why a run ended. Only `completed` means the outcome was verified in the business system."""

    COMPLETED = "completed"
    MAX_STEPS = "max_steps"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BUDGET_EXHAUSTED = "budget_exhausted"
    NO_PROGRESS = "no_progress"
    PERMISSION_DENIED = "permission_denied"
    TOOL_UNAVAILABLE = "tool_unavailable"
    CANCELLED = "cancelled"
    NEEDS_HUMAN = "needs_human"
    # The task's effects did not happen (a write refused, rejected, failed) and the model's
    # answers could not change that.
    NOT_DONE = "not_done"


class ActionStatus(StrEnum):
    """Where one journaled action stands; `TRANSITIONS` says which moves are legal. UNKNOWN (sent,
    no answer) is never FAILED: it is reconciled by asking the business system."""

    PLANNED = "PLANNED"
    NEEDS_APPROVAL = "NEEDS_APPROVAL"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    DISPATCHED = "DISPATCHED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    RECONCILING = "RECONCILING"
    ESCALATED = "ESCALATED"
    CANCELLED = "CANCELLED"


S = ActionStatus
# The legal moves of an action. A journal refuses any other (and any move from a stale status).
# DISPATCHED -> UNKNOWN is the crash/timeout edge; RECONCILING -> DISPATCHED is a re-send under
# the same intent key after the business system said the intent is definitively absent.
TRANSITIONS: dict[ActionStatus, frozenset[ActionStatus]] = {
    S.PLANNED: frozenset({S.NEEDS_APPROVAL, S.APPROVED, S.DISPATCHED, S.REJECTED, S.CANCELLED}),
    S.NEEDS_APPROVAL: frozenset({S.APPROVED, S.REJECTED, S.CANCELLED}),
    S.APPROVED: frozenset({S.DISPATCHED, S.REJECTED, S.CANCELLED}),
    S.DISPATCHED: frozenset({S.SUCCEEDED, S.FAILED, S.UNKNOWN}),
    S.UNKNOWN: frozenset({S.RECONCILING}),
    S.RECONCILING: frozenset({S.SUCCEEDED, S.DISPATCHED, S.UNKNOWN, S.ESCALATED, S.FAILED}),
    S.REJECTED: frozenset(),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.ESCALATED: frozenset(),
    S.CANCELLED: frozenset(),
}
TERMINAL_STATUSES = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
UNRESOLVED_STATUSES = frozenset({S.DISPATCHED, S.UNKNOWN, S.RECONCILING})
# A write the run planned that did not happen, and will not unless something new is planned.
NOT_DONE_STATUSES = frozenset({S.FAILED, S.REJECTED, S.CANCELLED, S.ESCALATED})


# The tenant of a principal nobody named one for (a single-tenant deployment's only one).
DEFAULT_TENANT = "default"


class Principal(BaseModel):
    """Who the run acts for. Set by the trusted caller (CLI flag, server auth), never by a model."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    tenant: str = DEFAULT_TENANT
    # The role names of the identity it acts for (a server's token or JWT; an agent's
    # `principal`); by default the default ones that start runs. What they grant: `Roles`.
    roles: tuple[str, ...] = DEFAULT_ROLES.start
    # The task boundary: the resources this run may touch, e.g. ("ticket:T-42",), from the
    # agent's `boundary`. An entry ending in "*" covers every resource it is a prefix of ("*"
    # alone: everything). Empty: the run may touch no declared resource at all.
    scope: tuple[str, ...] = ()

    def covers(self, resource: str) -> bool:
        """Whether `resource` is inside the task boundary."""
        return any(
            entry == resource or (entry.endswith("*") and resource.startswith(entry[:-1]))
            for entry in self.scope
        )


class Action(BaseModel):
    """One journaled action: the state's view (J) of a row in the action journal."""

    action_id: str
    run_id: str
    call_id: str
    tool: str
    args: dict[str, Any]
    args_digest: str
    intent_key: str
    status: ActionStatus
    attempts: int = 0
    fence: int = 0
    outcome: dict[str, Any] | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    @property
    def digest(self) -> str:
        """What an approval is bound to: the tool, its canonical arguments and the intent."""
        return digest({"tool": self.tool, "args": self.args, "intent_key": self.intent_key})


class Evidence(BaseModel):
    """An observation from a tool: kept raw, cited by id, never confused with a plan.

    The run state holds it without its content, which the history's answer to the same call
    holds already: `core.views.stored_evidence` and `evidence_of`, which gives it back checked
    against `content_hash`."""

    evidence_id: str
    source: str
    call_id: str
    # What the observation is about (e.g. "ticket:T-42"), and that thing's version when observed.
    resources: list[str] = Field(default_factory=list)
    version: str | None = None
    observed_at: datetime = Field(default_factory=utcnow)
    content_hash: str
    content: Any
    verified: bool = False


class Fact(BaseModel):
    """One labelled fact an approver decides from (a write contract's `facts`)."""

    model_config = ConfigDict(frozen=True)

    label: str
    value: str


# A request names at most this many of the run's observations (the newest), however long it ran.
MAX_EVIDENCE_NOTES = 20


class EvidenceNote(BaseModel):
    """An observation a request rests on, without its content: what was read, about what, in
    which version, when. The content stays in the run's evidence (E)."""

    model_config = ConfigDict(frozen=True)

    evidence_id: str
    source: str
    resources: tuple[str, ...] = ()
    version: str | None = None
    observed_at: datetime

    @classmethod
    def of_run(cls, evidence: Sequence[Evidence]) -> tuple[EvidenceNote, ...]:
        """The newest observation of each thing the run read (source and resources), oldest
        first: what the model had seen when it asked for the action."""
        newest: dict[tuple[str, tuple[str, ...]], Evidence] = {}
        for item in evidence:
            key = (item.source, tuple(item.resources))
            newest.pop(key, None)  # re-inserted last: the dict keeps the newest last
            newest[key] = item
        return tuple(
            cls(
                evidence_id=item.evidence_id,
                source=item.source,
                resources=tuple(item.resources),
                version=item.version,
                observed_at=item.observed_at,
            )
            for item in list(newest.values())[-MAX_EVIDENCE_NOTES:]
        )


class ApprovalRequest(BaseModel):
    """The interrupt payload a human sees. Bound to one action's digest, valid until expiry."""

    kind: Literal["approval"] = "approval"
    approval_id: str
    run_id: str
    action_id: str
    digest: str
    tool: str
    args: dict[str, Any]
    summary: str
    requested_by: str
    expires_at: datetime
    # When the run asked (the database's clock): the wait until the decision does not count
    # against the run's end-to-end deadline, which is the machine's, not the person's.
    requested_at: datetime | None = None
    # The arguments an approver may change (the write contract's `editable`).
    editable: tuple[str, ...] = ()
    # The approvers whose edits made these arguments (set by the approval node from the run's
    # approval records): separation of duties, none of them may approve this action.
    edited_by: tuple[str, ...] = ()
    # What a person decides from, fixed when the action was planned (a pure function of the
    # committed state): the run's task in its user's words, the write contract's facts (drawn
    # from the run's evidence), the observations the run rests on, and whether approving takes
    # a second, deliberate confirmation (the contract's `confirm`).
    task: str = ""
    facts: tuple[Fact, ...] = ()
    evidence: tuple[EvidenceNote, ...] = ()
    confirm: bool = False
    # Why a person is asked: the reason the tool's approval rule gave (its condition or threshold),
    # and the checks the call passed before anyone was asked ("" and () in requests of earlier
    # releases).
    why: str = ""
    checks: tuple[str, ...] = ()

    def refusal(self, decision: ApprovalChoice, approver: str) -> str | None:
        """Why `approver` may not make `decision` on this request, or None: none of the
        approvers whose edits made its arguments (`edited_by`) approves it (separation of
        duties). Every path asks this, the run's own approval node last."""
        if decision == "approve" and approver in self.edited_by:
            return (
                f"{approver} edited {self.approval_id} and cannot also approve it: "
                "another approver must (separation of duties)"
            )
        return None

    def answer(
        self,
        decision: ApprovalChoice,
        approver: str,
        comment: str = "",
        changes: dict[str, Any] | None = None,
    ) -> ApprovalDecision:
        """The decision on this request. An edit replaces the arguments named in `changes`
        (which must be arguments the action has) and keeps the rest; nothing else changes any.
        Raises ValueError (a pydantic ValidationError for malformed fields)."""
        if decision == "edit":
            if not changes:
                raise ValueError("an edit changes at least one argument")
            if not self.editable:
                raise ValueError(f"{self.tool} allows no edits: approve or reject it")
            if unknown := sorted(set(changes) - set(self.editable)):
                known = ", ".join(sorted(self.editable))
                raise ValueError(
                    f"cannot edit {', '.join(unknown)}: the editable arguments are {known}"
                )
        elif changes:
            raise ValueError("only an edit changes arguments")
        if (why := self.refusal(decision, approver)) is not None:
            raise ValueError(why)
        return ApprovalDecision(
            approval_id=self.approval_id,
            digest=self.digest,
            decision=decision,
            approver=approver,
            comment=comment,
            args={**self.args, **(changes or {})} if decision == "edit" else None,
        )


ApprovalChoice = Literal["approve", "reject", "edit"]


class ApprovalDecision(BaseModel):
    """The resume value of an approval interrupt, validated before it means anything.

    `edit` carries the complete arguments the approver wants instead (`args`): the action asked
    about is then rejected, and the edited call needs an approval of its own.

    The fields are constrained because they reach the model's trusted context (runtime
    feedback) and the journal: a resume value must not smuggle instructions, or NUL characters
    (which Postgres cannot store), into either.
    """

    model_config = ConfigDict(extra="forbid")

    approval_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    decision: ApprovalChoice
    approver: str = Field(pattern=r"^[A-Za-z0-9._@-]{1,64}$")
    comment: str = Field(default="", max_length=500, pattern=r"^[^\x00]*$")
    args: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _args_only_for_edit(self) -> ApprovalDecision:
        if (self.decision == "edit") != (self.args is not None):
            raise ValueError("an edit carries the new args; approve and reject carry none")
        return self


class ApprovalRecord(BaseModel):
    approval_id: str
    action_id: str
    digest: str
    decision: ApprovalChoice
    approver: str
    decided_at: datetime
    expires_at: datetime
    comment: str = ""
    args: dict[str, Any] | None = None  # an edit's new arguments


class CallVerdict(StrEnum):
    READY = "ready"
    NEEDS_APPROVAL = "needs_approval"
    REJECTED = "rejected"
    DONE = "done"
    # A program action whose program is running: answered when the program ends.
    RUNNING = "running"


class PendingCall(BaseModel):
    """A tool call of the current model decision and what validation made of it."""

    call_id: str
    tool: str
    args: dict[str, Any]
    verdict: CallVerdict | None = None
    error: dict[str, Any] | None = None
    action_id: str | None = None
    approval: ApprovalRequest | None = None
    # How many times an approver edited this call's arguments. Part of a write's intent key, so
    # an edited write is a new intent that never reuses (or conflicts with) the rejected one.
    revision: int = 0
    # Set by execute when the tool said "not finished yet, ask again after this many seconds".
    poll_after_s: float | None = None
    # The program action (its call id) that made this call, if a program did.
    program: str | None = None


class Versions(BaseModel):
    """V: what the run was started with. A process that resumes it compares (see `nodes.guard`)."""

    state_schema: int = STATE_SCHEMA_VERSION
    agent: str = ""
    agent_version: str = ""
    model_id: str = ""
    # The model as the run was started with it: "" for its agent's own, else the spec
    # ("openai:gpt-5-mini") and its settings (API, base URL, streaming, temperature, ...).
    model_spec: str = ""
    model_settings: dict[str, Any] = Field(default_factory=dict)
    # Each change of the model an operator asked for on resuming (`--model-change`): when, from
    # which spec and settings to which; model_spec and model_settings are then the new ones.
    model_changes: list[dict[str, Any]] = Field(default_factory=list)
    prompt_version: str = ""
    tool_schemas: dict[str, str] = Field(default_factory=dict)
    # The sandbox the run's programs are paused in (a paused program is its bytes), and each
    # skill the run loaded by its content hash: a resumed run goes on with what it had.
    sandbox: str = ""
    skills: dict[str, str] = Field(default_factory=dict)


class Verification(BaseModel):
    """What verify found in the business system. `completed` is only ever set from this.

    `facts` keeps apart what the business system holds (the writes verified there, `writes`;
    those the run planned that did not happen, `not_done`; every refusal, `refusals`), the
    runtime's account of it (`answer`, `outcome`), and what the model said (`model_answer`,
    never passed on as fact, with the runtime's `answer_notes` on it): see `nodes.verify`."""

    verified: bool
    summary: str
    facts: dict[str, Any] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)


# A DeltaChannel stores only each step's new items, plus a full snapshot every N updates. Reading
# the state replays the items since the last snapshot, which costs what reading the list costs
# anyway; a snapshot of a long list costs as much as the list. So snapshots are rare.
SNAPSHOT_EVERY = 10_000


class _Keyed(list[Any]):
    """A list that remembers its items' keys, and how long it was then, so that the next append
    asks only the new items for theirs: history and evidence are appended to at every step, and
    asking every item again made a step cost as much as the run so far (0.32 ms a step at 400
    steps). Stored and sent as a plain list; a list changed in place since is asked again."""

    __slots__ = ("item_keys", "keyed_len")

    item_keys: set[str]
    keyed_len: int


def _append_new(
    current: list[Any], batches: Sequence[list[Any]], key: Callable[[Any], str | None]
) -> list[Any]:
    """Append each batch's items whose key is not there yet (an item without a key always is).

    Batching-invariant, as DeltaChannel requires. Skipping known keys makes a write idempotent:
    a node that runs again after a crash, or a subgraph handing back the history it was given,
    adds nothing twice.
    """
    out = _Keyed(current)
    if isinstance(current, _Keyed) and current.keyed_len == len(current):
        seen = set(current.item_keys)
    else:
        seen = {k for k in map(key, current) if k is not None}
    for batch in batches:
        for item in batch:
            k = key(item)
            if k is not None and k in seen:
                continue
            if k is not None:
                seen.add(k)
            out.append(item)
    out.item_keys, out.keyed_len = seen, len(out)
    return out


def append_messages(current: list[Any], batches: Sequence[list[Any]]) -> list[Any]:
    return _append_new(current, batches, lambda message: getattr(message, "id", None))


def append_evidence(current: list[Any], batches: Sequence[list[Any]]) -> list[Any]:
    return _append_new(current, batches, lambda item: item.get("evidence_id"))


def merge_actions(
    current: dict[str, dict[str, Any]], batches: Sequence[dict[str, dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    out = dict(current)
    for batch in batches:
        out.update(batch)
    return out


class RunState(TypedDict):
    """LangGraph channels. Values are JSON-native; see the models above for their shapes."""

    schema_version: int
    run_id: str
    task: str
    # P: set by the trusted caller, in the input or (through the run context) by the first guard.
    principal: NotRequired[dict[str, Any]]
    # H: protocol items (langchain messages), appended only.
    history: Annotated[
        list[AnyMessage], DeltaChannel(append_messages, snapshot_frequency=SNAPSHOT_EVERY)
    ]
    # E: evidence items (Evidence dumps), appended only.
    evidence: Annotated[
        list[dict[str, Any]], DeltaChannel(append_evidence, snapshot_frequency=SNAPSHOT_EVERY)
    ]
    # J: action_id -> Action dump; a projection of the journal table, merged by action id.
    journal: NotRequired[
        Annotated[
            dict[str, dict[str, Any]],
            DeltaChannel(merge_actions, snapshot_frequency=SNAPSHOT_EVERY),
        ]
    ]
    # The tool calls of the current decision (PendingCall dumps), replaced every model step.
    pending: NotRequired[list[dict[str, Any]]]
    approvals: NotRequired[list[dict[str, Any]]]
    # B: usage so far (Usage dump); limits come from the run context.
    usage: NotRequired[dict[str, Any]]
    # V
    versions: NotRequired[dict[str, Any]]
    # Which agent owns the run now (handoff), and the record of every handoff.
    owner: NotRequired[str]
    handoffs: NotRequired[list[dict[str, Any]]]
    # The current plan (PlanStep dumps): revisable, shown to the model, never a permission.
    plan: NotRequired[list[dict[str, Any]]]
    # The run's current (or last) program action (a ProgramRun dump; tools.program).
    program: NotRequired[dict[str, Any]]
    # The skills the run loaded: name -> the version it loaded (a LoadedSkill dump).
    skills: NotRequired[dict[str, dict[str, Any]]]
    # What compile_context decided the next model step sees (small: no copies of history).
    context: NotRequired[dict[str, Any]]
    # Run control.
    phase: NotRequired[str]
    step: NotRequired[int]
    stop_reason: NotRequired[str | None]
    stop_detail: NotRequired[str]
    feedback: NotRequired[list[str]]
    # No-progress detection: recent step signatures, and whether the model was already nudged.
    progress: NotRequired[list[str]]
    nudged: NotRequired[bool]
    # The id of the model decision guard last did this book-keeping for (once per decision).
    checked_step: NotRequired[str | None]
    # Calls refused for lack of permission so far; a second one stops the run.
    denials: NotRequired[int]
    verification: NotRequired[dict[str, Any] | None]
    # Final answers verify refused in a row (a run that keeps answering without the effects
    # its task needs is stopped, not asked for ever).
    refused_answers: NotRequired[int]
    started_at: NotRequired[str]
    # Seconds the run spent waiting for people (approvals): not counted against its deadline.
    paused_s: NotRequired[float]
    cancel_requested: NotRequired[bool]
    # Set by reconcile when a cancelled run's writes were asked about once: stop waiting for them.
    reconciled_for_cancel: NotRequired[bool]


def initial_state(
    run_id: str, task: str, principal: Principal | None = None, *, now: datetime | None = None
) -> RunState:
    state = RunState(
        schema_version=STATE_SCHEMA_VERSION,
        run_id=run_id,
        task=task,
        history=[],
        evidence=[],
        phase=Phase.READY.value,
        step=0,
        stop_reason=None,  # the run's status: there for every reader from the start
        started_at=(now or utcnow()).isoformat(),
    )
    if principal is not None:
        state["principal"] = principal.model_dump(mode="json")
    return state


def _channel_kinds() -> tuple[frozenset[str], frozenset[str]]:
    """The channels an update is merged into (appended to) rather than replacing, and those a
    state may lack (`NotRequired`: read with a falsy default, never subscripted)."""
    reduced, optional = set(), set()
    for name, hint in get_type_hints(RunState, include_extras=True).items():
        while get_origin(hint) in (NotRequired, Annotated):
            if get_origin(hint) is NotRequired:
                optional.add(name)
            elif hint.__metadata__:
                reduced.add(name)
            hint = get_args(hint)[0]
    return frozenset(reduced), frozenset(optional)


REDUCED_CHANNELS, OPTIONAL_CHANNELS = _channel_kinds()
# What an optional channel that is absent holds, as far as its readers can tell.
EMPTY_VALUES: tuple[Any, ...] = (None, False, 0, "", [], {})


def changes(state: RunState, update: Mapping[str, Any]) -> dict[str, Any]:
    """`update` less the writes that would leave the state as it is: a value a channel already
    holds, an empty value for an optional channel the state lacks, an empty batch for a channel
    that is appended to.

    A write costs a row of the node's commit (and a blob, and a version in every checkpoint
    after), whatever it changes; nodes write their whole view of the channels they own (no
    denial yet: 0; no new journal entries: {}), and about a third of a tool step's writes
    changed nothing. An optional channel that no node set is not in the checkpoint at all:
    each channel a checkpoint holds costs it a version, in every checkpoint after.
    """
    held: Mapping[str, Any] = state

    def unchanged(channel: str, value: Any) -> bool:
        if channel in REDUCED_CHANNELS:
            return value in ([], {})
        if channel in held:
            return bool(held[channel] == value)
        return channel in OPTIONAL_CHANNELS and value in EMPTY_VALUES

    return {channel: value for channel, value in update.items() if not unchanged(channel, value)}
