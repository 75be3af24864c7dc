"""Who may create a run on a thread, and with what: the rules of `POST /threads/{id}/runs`
(and `/runs/wait`, `/runs/stream`), over the normalised request (`edge.bodies.RunCreate`).

A run request is one of three, told apart by its fields and the caller, never by guessing:

* a decision (`command.resume` holding approval decisions): an approver of the thread's tenant,
  never on their own run, whom the agent's own approver rule takes, answering a request the run
  waits on now (`edge.decisions`);
* the service identity waking a run the engine hosts, in the tenant its token names
  (`server.waker`): a run parked in a reconciliation, resumed to look again; or a run the
  engine stopped advancing (no attempt holds it, nothing waits on a person), sent its own task,
  which continues it; nothing else;
* a start or a continue by the thread's own user: a task the agent takes for them (the same
  task again continues the run, as a start delivered twice does; another task on it is a 409),
  or a resume of their own run.

Each is then admitted (`server.admissions`: one run at a time on a thread, a bound per user),
and its metadata names the thread's owner, whatever the client wrote there. An admission the
engine then refuses (its answer a 4xx or 5xx: no run was made) is withdrawn (`withdraw`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from loopwright._agent import TaskRefused
from loopwright.checkpoints.decision_claims import DecisionClaims
from loopwright.checkpoints.leases import SERVER_ENGINE
from loopwright.core.roles import Roles
from loopwright.core.state import NEVER_STRANDED, Phase, Principal
from loopwright.runner import WAKE_VALUE
from loopwright.server.admissions import Refusal
from loopwright.server.edge import bodies
from loopwright.server.edge.decisions import claimed, decisions_in, prepared
from loopwright.server.edge.http import Refused
from loopwright.server.edge.threads import (
    ThreadOwner,
    owner_filter,
    refuse_unless_own,
    refuse_unless_visible,
    stamp,
    thread_owner,
)
from loopwright.server.inputs import NEW_RUN_TAKES, principal_for_task
from loopwright.server.resources import aresources, hosted_roles
from loopwright.server.service_identity import is_service
from loopwright.server.users import User

NO_THREAD = "a run is a thread: create one first (POST /threads), then start the run on it"


@dataclass(frozen=True)
class Admitted:
    """A run request let through: the body the engine is sent, and the filter its hooks give."""

    body: dict[str, Any]
    filter: dict[str, str]


@dataclass(frozen=True)
class Ask:
    """A run request, normalised: who asks, on which thread (and whose it is), for what."""

    user: User
    roles: Roles
    thread_id: str
    owner: ThreadOwner
    body: bodies.RunCreate

    @property
    def resume(self) -> Any:
        return self.body.command.resume if self.body.command is not None else None

    def sent(self, owner_id: str) -> dict[str, Any]:
        """The normalised body, its metadata naming `owner_id` as the run's user."""
        normalised = self.body.normalised()
        metadata = {**(normalised.get("metadata") or {}), **stamp(owner_id, self.user.tenant)}
        return {**normalised, "metadata": metadata}


async def admit_run(user: User, thread_id: str, body: bodies.RunCreate) -> Admitted:
    owner = await thread_owner(thread_id)
    if not owner.known and (await aresources()).engine_threads.kept:
        # Aegra creates a missing thread, stamped with nothing of ours.
        raise Refused(404, f"thread {thread_id} not found: {NO_THREAD}")
    if is_service(user):
        return await _wake(user, thread_id, owner, body)
    roles = await hosted_roles()
    # Before anything that tells a thread's state: another tenant's threads are not named.
    refuse_unless_visible(user, roles, owner, thread_id)
    ask = Ask(user, roles, thread_id, owner, body)
    if owner.run is not None and owner.run.pruned_at is not None:
        # Its checkpoints are gone: any run on the thread would start it over from nothing.
        raise Refused(410, f"run {owner.run.run_id} was pruned by the retention job: it ended")
    if decisions_in(ask.resume):
        return await _decide(ask)
    return await _start_or_continue(ask)


async def _decide(ask: Ask) -> Admitted:
    user, run = ask.user, ask.owner.run
    if not ask.roles.grants("decide", user.roles):
        raise Refused(403, ask.roles.refusal("decide"))
    decisions = await prepared(ask.thread_id, user.user_id, ask.resume)
    # The resumed run is its customer's, in flight on their account; not bounded by the
    # approver's: clearing an inbox faster than its runs end is no approver's fault, and the
    # runs it resumes were each admitted under their customer's bound when they began.
    customer = run.user_id if run is not None else user.user_id
    async with claimed(decisions):
        await admit(User(customer, (), user.tenant), ask.thread_id, bounded=False)
    resume = {k: v for ready in decisions for k, v in ready.resume.items()}
    sent = ask.sent(customer)
    return Admitted({**sent, "command": {"resume": resume}}, owner_filter(user, ask.roles))


async def _start_or_continue(ask: Ask) -> Admitted:
    user, roles, run = ask.user, ask.roles, ask.owner.run
    if not roles.grants("start", user.roles):
        if ask.body.command is not None:  # most likely a decision that is not one
            raise Refused(
                403,
                f"{roles.refusal('start')} (resuming one too); an approver's resume is a"
                ' decision: {"approval_id": ..., "digest": ..., "decision": "approve" |'
                ' "reject" | "edit"}, or a map of interrupt ids to decisions',
            )
        raise Refused(403, roles.refusal("start"))
    refuse_unless_own(user, ask.owner, ask.thread_id, "this run belongs to another user")
    if run is not None and run.phase == Phase.WAITING_APPROVAL:
        # A resume would answer the approval (ignored, and the request asked again, anew); any
        # other run is queued behind it, and cancelled before it runs it leaves the thread
        # "idle": the approval would be gone from the inbox, which lists interrupted threads.
        raise Refused(403, "this run waits for an approval: only an approver's decision resumes it")
    if ask.body.input is not None:
        task = ask.body.input["task"]
        if run is not None and run.task != task:
            # The run would refuse it once the engine had started it, leaving the thread of a
            # finished run in error. The same task again continues the run (a start delivered
            # twice).
            raise Refused(
                409,
                f"thread {ask.thread_id} already carries a run of another task: start a new thread",
            )
        if (refusal := await task_refusal(user, task)) is not None:
            raise Refused(403, refusal)
    elif ask.body.command is None:  # Aegra refuses it in its own words, after admission
        raise Refused(422, f"nothing to run: the same task again continues a run; {NEW_RUN_TAKES}")
    elif run is None:  # nothing to resume (the run would refuse it)
        raise Refused(422, f"the thread has no run to continue: {NEW_RUN_TAKES}")
    await admit(user, ask.thread_id)
    return Admitted(ask.sent(user.user_id), owner_filter(user, roles))


async def _wake(user: User, thread_id: str, owner: ThreadOwner, body: bodies.RunCreate) -> Admitted:
    """The served process continuing a run its engine hosts: a run parked in a reconciliation,
    or one the engine stopped advancing; nothing else."""
    run = owner.run
    if run is None or run.tenant != user.tenant or run.engine != SERVER_ENGINE:
        raise Refused(403, WAKES_ONLY)
    parked = (
        run.phase == Phase.RECONCILING
        and body.input is None
        and body.command is not None
        and body.command.resume == WAKE_VALUE
    )
    # The engine resumes only a thread it left interrupted: a stranded run is sent its own
    # task, which from this identity continues it and starts nothing (`server.inputs`).
    stranded = (
        run.phase not in NEVER_STRANDED
        and not run.lease_live
        and body.command is None
        and body.input == {"task": run.task}
    )
    if not (parked or stranded):
        raise Refused(403, WAKES_ONLY)
    # Not bounded by the user's runs in flight: a write whose outcome is not known yet must be
    # found out however many other runs its user keeps busy.
    run_user = User(run.user_id, (), run.tenant)
    await admit(run_user, thread_id, bounded=False)
    sent = {**body.normalised(), "metadata": stamp(run.user_id, run.tenant)}
    return Admitted(sent, stamp(run.user_id, run.tenant))


WAKES_ONLY = (
    "the service identity only wakes runs its engine hosts: one parked in a reconciliation, or"
    " one the engine stopped advancing"
)


async def task_refusal(user: User, task: str) -> str | None:
    """Why the hosted agent does not take `task` for `user`, or None if it does."""
    res = await aresources()
    principal = Principal(user_id=user.user_id, roles=user.roles, tenant=user.tenant)
    try:
        await asyncio.to_thread(principal_for_task, res.agent, res.runner.deps, principal, task)
    except TaskRefused as exc:
        return str(exc)
    return None


async def admit(user: User, thread_id: str, *, bounded: bool = True) -> None:
    """`server.admissions`, on either engine: 409 while another run is admitted on the thread
    and has not ended (one waiting behind it would hold up everyone's), 429 while the caller
    holds as many runs as one principal may (unless not `bounded`)."""
    admitting = (await aresources()).admissions
    principal = (user.tenant, user.user_id)
    refusal = await asyncio.to_thread(admitting.admit, thread_id, principal, bounded=bounded)
    if refusal is Refusal.THREAD_BUSY:
        raise Refused(
            409,
            "Thread is already running a task: a thread runs one run at a time, and none waits"
            " behind it; ask again once it has ended",
        )
    if refusal is Refusal.PRINCIPAL_FULL:
        raise Refused(
            429,
            f"you have {admitting.per_principal} runs in flight, as many as one user may: ask"
            " again once one has ended",
        )


async def withdraw(thread_id: str) -> None:
    """The engine refused a run the edge admitted: its admission, and the claims a decision
    took with it, hold nobody off any longer."""
    res = await aresources()

    def withdrawn() -> None:
        try:
            DecisionClaims(res.leases.db).released(thread_id)
        finally:
            res.admissions.ended(thread_id)

    await asyncio.to_thread(withdrawn)
