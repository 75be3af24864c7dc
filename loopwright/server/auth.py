"""Who may do what on the server (langgraph.json `auth`): bearer tokens to principals, and rules.

A bearer token is a JWT signed by the identity provider, or an entry of a token table (see
`server.identities`); the user it proves is a user id, a tenant and roles. With neither
configured, every request is refused: a server without them has no trusted identity.

The rules, enforced here and again by the served graph (`server.inputs`), so that a server whose
auth hooks differ (Aegra calls them with other shapes) still cannot be talked into more:

* a request without a known token gets 401;
* customers (a role the hosted agent's `Roles.start` names) see and start runs on their own
  threads only, on tasks the hosted agent takes for them (its `boundary`: e.g. the reference
  agent refuses a target that is not the user's); asking for another customer's thread gets
  403; a task no run could keep (blank, over 2,000 characters) gets 422 before any run starts,
  as does a run whose input, resume value or metadata holds text no store keeps (a NUL
  character, text that is not UTF-8), or whose metadata and configurable values (copied into
  every checkpoint) pass 1 KB, or whose input or resume value passes 16 KB; a thread's
  metadata is bounded as a run's;
* only approvers (a role its `Roles.decide` names) list or decide approvals (they may read
  every thread of their tenant for that), and never on a run they started themselves; every
  filter names the caller's tenant, so nobody reads, lists, cancels or decides anything of
  another tenant's;
* nobody writes a thread's state or metadata through the API, and assistants, crons and the
  store are read-only or closed: a run changes only by running;
* nothing runs on a thread whose run the retention job pruned (410): it would start the run
  over from an empty state (the served graph refuses it too, with RunPruned).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

from langgraph_sdk import Auth
from pydantic import ValidationError

from loopwright._agent import TaskRefused
from loopwright.checkpoints.decision_claims import DecisionClaims
from loopwright.checkpoints.leases import SERVER_ENGINE, RunRecord
from loopwright.graph.roles import Roles
from loopwright.graph.state import ApprovalDecision, ApprovalRequest, Phase, Principal
from loopwright.graph.text import unstorable_in, validation_problems
from loopwright.runner import WAKE_VALUE, EditRefused, UnknownRun
from loopwright.server import identities
from loopwright.server.admissions import Refusal
from loopwright.server.engine import TENANT_KEY, USER_KEY, engine_identity
from loopwright.server.inputs import (
    NEW_RUN_TAKES,
    RunRefused,
    new_run_task,
    principal_for_task,
    principal_of_user,
)
from loopwright.server.resources import aresources, hosted_roles
from loopwright.server.service_identity import is_service
from loopwright.server.users import User

# What a client may have copied into every checkpoint of its run (`copied_into_checkpoints`):
# past it, one request would make every step of the run store as much again.
MAX_COPIED_BYTES = 1_024
# A run's input (a task of at most 2,000 characters) and a resume value (a decision: its comment
# at most 500, at most 20 changes) fit in this many bytes of JSON; the server keeps either whole
# (a resume value as a write of the run).
MAX_INPUT_BYTES = 16_384


def _forbidden(detail: str) -> Auth.exceptions.HTTPException:
    return Auth.exceptions.HTTPException(status_code=403, detail=detail)


def _user(ctx: Auth.types.AuthContext) -> User:
    principal = principal_of_user(ctx.user)
    if principal is None:
        raise Auth.exceptions.HTTPException(status_code=401, detail="no authenticated user")
    return User(user_id=principal.user_id, roles=principal.roles, tenant=principal.tenant)


async def task_refusal(user: User, task: str) -> str | None:
    """Why the hosted agent does not take `task` for `user`, or None if it does."""
    res = await aresources()
    principal = Principal(user_id=user.user_id, roles=user.roles, tenant=user.tenant)
    try:
        await asyncio.to_thread(principal_for_task, res.agent, res.runner.deps, principal, task)
    except TaskRefused as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Waiting:
    """An approval request a run waits on, and the interrupt that asks it now (each asking of
    one request, after a decision the run did not take, is a new interrupt)."""

    request: ApprovalRequest
    interrupt_id: str


async def waiting_requests(thread_id: Any) -> dict[str, Waiting]:
    """What the run on the thread waits on, by approval id."""
    res = await aresources()
    try:
        outcome = await asyncio.to_thread(res.runner.outcome, str(thread_id or ""))
    except UnknownRun:
        return {}
    return {
        str(r.get("approval_id")): Waiting(ApprovalRequest.model_validate(r), r["interrupt_id"])
        for r in outcome.waiting_for_approval
    }


async def decision_refusal(
    asked: Mapping[str, Waiting], decisions: Sequence[ApprovalDecision]
) -> Auth.exceptions.HTTPException | None:
    """Why the run would not take a decision, or None. A 409 when its approval does not wait
    (decided, expired, never asked there) or asks about another action than the digest names;
    a 422 for a decision the request does not allow (an edit of an argument the write keeps
    fixed, or that its rules refuse; an approval by whoever edited the action). The run would
    re-ask, or end the action, and the client be told 200: this answers truthfully, as the
    inbox and the CLI do."""
    res = await aresources()
    for decision in decisions:
        approval = decision.approval_id
        if (waiting := asked.get(approval)) is None:
            detail = f"approval {approval} does not wait on this run: decided, expired or not asked"
            return Auth.exceptions.HTTPException(409, detail=detail)
        request = waiting.request
        if decision.digest != request.digest:
            detail = (
                f"the decision's digest is not that of the action approval {approval} asks"
                " about: read the request again"
            )
            return Auth.exceptions.HTTPException(409, detail=detail)
        args = decision.args
        changes = {k: v for k, v in (args or {}).items() if request.args.get(k) != v}
        try:  # the request's own rules: editable arguments, separation of duties
            if args is not None and set(args) - set(request.args):
                raise ValueError(f"an edit names arguments {request.tool} does not have")
            request.answer(decision.decision, decision.approver, changes=changes or None)
            if args is not None and changes:
                await asyncio.to_thread(res.runner.check_edit, request, args)
        except (ValueError, EditRefused) as exc:
            detail = f"{exc}; approval {approval} still waits"
            return Auth.exceptions.HTTPException(422, detail=detail)
    return None


@asynccontextmanager
async def claimed(
    asked: Mapping[str, Waiting], decisions: Sequence[ApprovalDecision]
) -> AsyncIterator[None]:
    """Hold the claim on each decided request (`checkpoints.decision_claims`) for the block,
    and keep them if it succeeds: two approvers deciding at once through any route or any
    instance are told 200 and 409, not 200 twice with one decision taken. Claims are given
    back if the block raises (the run was not admitted)."""
    claims = DecisionClaims((await aresources()).leases.db)
    held: list[tuple[str, str, str, str]] = []
    try:
        for decision in decisions:
            waiting = asked[decision.approval_id]
            key = (waiting.request.run_id, decision.approval_id, waiting.interrupt_id)
            holder = await asyncio.to_thread(
                claims.claim, *key, decision.approver, decision.decision
            )
            if holder is not None:
                raise Auth.exceptions.HTTPException(
                    409,
                    detail=f"approval {decision.approval_id} is being decided already"
                    f" ({holder.decision} by {holder.approver}): read the request again",
                )
            held.append((*key, decision.approver))
        yield
    except BaseException:
        for claim in held:
            await asyncio.to_thread(claims.release, *claim)
        raise


def refuse_copied(value: Mapping[str, Any], kwargs: Mapping[str, Any], what: str) -> None:
    """422 for a thread or run whose metadata (and, for a run, arguments) hold text no store
    keeps, or whose values copied into every checkpoint pass MAX_COPIED_BYTES."""
    problem = unstorable_in(value.get("metadata"), f"the {what}'s metadata") or unstorable_in(
        kwargs, f"the {what}"
    )
    if problem is not None:
        raise Auth.exceptions.HTTPException(status_code=422, detail=problem)
    if (copied := copied_into_checkpoints(value, kwargs)) > MAX_COPIED_BYTES:
        raise Auth.exceptions.HTTPException(
            status_code=422,
            detail=f"the {what}'s metadata and configurable values go into every checkpoint of"
            f" its runs: {copied} bytes of them, at most {MAX_COPIED_BYTES}",
        )


def copied_into_checkpoints(value: Mapping[str, Any], kwargs: Mapping[str, Any]) -> int:
    """The bytes of a client's run metadata and configurable values that LangGraph copies into
    every checkpoint's metadata (`get_checkpoint_metadata`: their strings and numbers), the
    server's own (`langgraph_...`, `__...__`) left out."""
    config = kwargs.get("config") or {}
    copied = {
        key: item
        for source in (value.get("metadata"), config.get("metadata"), config.get("configurable"))
        if isinstance(source, Mapping)
        for key, item in source.items()
        if isinstance(item, str | int | float | bool)
        and not str(key).startswith(("langgraph_", "__"))
    }
    return _json_bytes(copied)


def _json_bytes(value: Any) -> int:
    """The bytes of `value` as UTF-8 JSON (its text already checked storable)."""
    return len(json.dumps(value, ensure_ascii=False, default=str).encode())


def decisions_in(resume: Any) -> list[Mapping[str, Any]]:
    """The approval decisions a resume value is, or maps interrupt ids to."""
    if not isinstance(resume, Mapping):
        return []
    if "approval_id" in resume:
        return [resume]
    return [v for v in resume.values() if isinstance(v, Mapping) and "approval_id" in v]


identities.configured()  # a broken identity configuration stops the server at its start
auth = Auth()


def authorization_of(headers: Mapping[Any, Any]) -> str | None:
    """The Authorization header from LangGraph's (bytes) or Aegra's (str) header mapping."""
    for key, value in headers.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name.lower() == "authorization":
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


@auth.authenticate
async def authenticate(headers: Mapping[Any, Any]) -> Auth.types.MinimalUserDict:
    """Bearer token (a JWT, or one of the token table's) to user (`server.identities`). Takes
    `headers` (not `authorization`): Aegra passes them whole."""
    try:
        user = await identities.authenticated_user(authorization_of(headers))
    except identities.IdentityRefused as exc:
        raise Auth.exceptions.HTTPException(status_code=exc.status, detail=exc.detail) from None
    return {
        # The engine scopes its rows to the identity: the tenant, whose approvers see every
        # thread of it (see `server.engine`); the hooks below draw each user's part.
        "identity": engine_identity(user.tenant),
        "user_id": user.user_id,  # type: ignore[typeddict-unknown-key]  # kept on the user
        "roles": list(user.roles),
        "tenant": user.tenant,
        "permissions": list(user.roles),
    }


def _filter(user: User, roles: Roles | None) -> Auth.types.FilterType:
    """The threads a hook lets `user` act on, for the engine to apply where it applies filters
    (approvers, by the hosted agent's `roles`: their tenant's; customers, and anyone without
    `roles`: their own). Where the engine does not apply it, the hooks raise."""
    if roles is not None and roles.grants("decide", user.roles):
        return {TENANT_KEY: user.tenant}
    return {USER_KEY: user.user_id, TENANT_KEY: user.tenant}


@dataclass(frozen=True)
class ThreadOwner:
    """Whose a thread is, as far as loopwright or the engine knows (`known`: either has it)."""

    known: bool
    user_id: str | None = None
    tenant: str | None = None
    run: RunRecord | None = None  # the loopwright run on it, if one was registered


async def thread_owner(thread_id: Any) -> ThreadOwner:
    """Whose the thread is: its run's user and tenant once a run is registered on it (lw_runs),
    else those stamped on the engine's thread (Aegra's; LangGraph's server filters instead)."""
    if not thread_id:
        return ThreadOwner(False)
    res = await aresources()

    def read() -> ThreadOwner:
        run = res.leases.get(str(thread_id))
        if run is not None:
            return ThreadOwner(True, run.user_id, run.tenant, run)
        known, user_id, tenant = res.engine_threads.owner(str(thread_id))
        return ThreadOwner(known, user_id, tenant)

    return await asyncio.to_thread(read)


def _not_found(thread_id: Any) -> Auth.exceptions.HTTPException:
    return Auth.exceptions.HTTPException(status_code=404, detail=f"thread {thread_id} not found")


def refuse_unless_own(user: User, owner: ThreadOwner, thread_id: Any, refusal: str) -> None:
    """403 unless the thread is the caller's, 404 if it is another tenant's (whose threads are
    not even named); nothing for a thread nobody knows (the engine answers 404 itself)."""
    if owner.tenant is not None and owner.tenant != user.tenant:
        raise _not_found(thread_id)
    if owner.user_id is not None and owner.user_id != user.user_id:
        raise _forbidden(refusal)


def refuse_unless_visible(user: User, roles: Roles, owner: ThreadOwner, thread_id: Any) -> None:
    """What a caller may read: an approver their tenant's threads, anyone else their own."""
    if not roles.grants("decide", user.roles):
        refuse_unless_own(user, owner, thread_id, "this run belongs to another user")
    elif owner.tenant not in (None, user.tenant):
        raise _not_found(thread_id)


@auth.on.threads.create
async def on_thread_create(
    ctx: Auth.types.AuthContext, value: Auth.types.ThreadsCreate
) -> Auth.types.FilterType:
    """A new thread belongs to whoever creates it, in their tenant. Its metadata goes into every
    checkpoint of its runs, as a run's does: bounded the same way."""
    user = _user(ctx)
    if value.get("metadata") is None:
        value["metadata"] = {}
    refuse_copied(value, {}, "thread")
    # In place: the server keeps this dict. Whatever the client sent under these keys is gone
    # (and "owner", which Aegra sets to the engine identity, names nobody a client chose).
    value["metadata"].pop("owner", None)
    value["metadata"][USER_KEY] = user.user_id
    value["metadata"][TENANT_KEY] = user.tenant
    return _filter(user, await hosted_roles())


@auth.on.threads.read
async def on_thread_read(
    ctx: Auth.types.AuthContext, value: Auth.types.ThreadsRead
) -> Auth.types.FilterType | None:
    """A thread, its state, history, runs and streams: its own user's, or an approver's of
    its tenant (the engine keeps tenants apart, see `server.engine`)."""
    user = _user(ctx)
    thread_id = value.get("thread_id")
    roles = await hosted_roles()
    refuse_unless_visible(user, roles, await thread_owner(thread_id), thread_id)
    return _filter(user, roles)


@auth.on.threads.search
async def on_thread_search(
    ctx: Auth.types.AuthContext, value: Auth.types.ThreadsSearch
) -> Auth.types.FilterType | None:
    """A search of threads (filtered), or of one thread's runs (Aegra: its own user's only)."""
    user = _user(ctx)
    thread_id = cast(Mapping[str, Any], value).get("thread_id")
    roles = await hosted_roles()
    refuse_unless_visible(user, roles, await thread_owner(thread_id), thread_id)
    return _filter(user, roles)


# What a client may send along with a cancel (Aegra passes a route's body and path together).
_CANCEL_FIELDS = frozenset({"thread_id", "run_id", "run_ids", "status", "action", "wait"})


def is_cancel(value: Mapping[str, Any]) -> bool:
    """Whether a thread update is a cancel of a run: LangGraph's server says so (`action`);
    Aegra's cancel routes carry the run's id and nothing that writes a thread."""
    if value.get("action") in ("interrupt", "rollback"):
        return True
    return bool(value.get("run_id") or value.get("run_ids")) and value.keys() <= _CANCEL_FIELDS


@auth.on.threads.update
async def on_thread_update(
    ctx: Auth.types.AuthContext, value: Auth.types.ThreadsUpdate
) -> Auth.types.FilterType:
    """Only cancelling one's own run; a thread's state and metadata change by running only."""
    update = cast(Mapping[str, Any], value)
    if not is_cancel(update):
        if update.get("status") and not update.get("thread_id"):
            # Every run of the caller's engine identity (their whole tenant) with that status.
            raise _forbidden("cancel a run by its thread and run id")
        raise _forbidden("a thread changes only by running; its state cannot be written")
    user = _user(ctx)
    if not update.get("thread_id"):
        raise _forbidden("cancel a run by its thread and run id")
    thread_id = update.get("thread_id")
    owner = await thread_owner(thread_id)
    refuse_unless_own(user, owner, thread_id, "only the run's own user may cancel it")
    return _filter(user, await hosted_roles())


async def journaled(thread_id: Any) -> bool:
    """Whether the run on a thread has journaled actions (whose record must not be erased)."""
    if not thread_id:
        return False
    res = await aresources()
    return bool(await asyncio.to_thread(res.runner.journal.for_run, str(thread_id)))


@auth.on.threads.delete
async def on_thread_delete(
    ctx: Auth.types.AuthContext, value: Auth.types.ThreadsDelete
) -> Auth.types.FilterType:
    """Deleting a thread, or a server run on it (which deletes the checkpoints it wrote): never
    for a run with journaled actions, whose record (what was executed, verified, ended) stays."""
    thread_id = value.get("thread_id")
    if await journaled(thread_id):
        raise _forbidden("this run has journaled actions: its record cannot be deleted")
    user = _user(ctx)
    if thread_id is None and (await aresources()).engine_threads.kept:
        # Aegra's prune: every expired thread of the engine identity, the tenant's.
        raise _forbidden("threads are deleted one by one, by their own user")
    refuse_unless_own(
        user, await thread_owner(thread_id), thread_id, "this thread belongs to another user"
    )
    return _filter(user, None)  # approvers read their tenant's threads, not delete them


# Fields of run creation that would have the server send a request of the client's naming: to
# any address (a webhook: into the server's own network, too), or to LangSmith (a feedback key:
# offline, the run fails on it).
_OUTBOUND_FIELDS = {
    "webhook": "the server makes no request to an address a client names",
    "feedback_keys": "the server sends nothing to LangSmith",
}
# Fields of run creation that would read or write another history than the run's own latest
# checkpoint: a chosen checkpoint, another namespace (a fresh, empty state to start over in).
_CHECKPOINT_FIELDS = ("checkpoint_id", "checkpoint_ns", "checkpoint_map", "checkpoint")


def checkpoint_choice(kwargs: Mapping[str, Any]) -> str | None:
    """The checkpoint field a client set, if any: in `config.configurable`, on its own (Aegra
    takes `checkpoint_id` as the short form of `checkpoint`) or in `checkpoint`."""
    configurable = ((kwargs.get("config") or {}).get("configurable")) or {}
    for field in _CHECKPOINT_FIELDS:
        if configurable.get(field):
            return f"config.configurable.{field}"
        if field != "checkpoint" and kwargs.get(field):  # `checkpoint` itself: below
            return field
    checkpoint = kwargs.get("checkpoint") or {}
    chosen = [k for k, v in checkpoint.items() if v and k != "thread_id"]
    return f"checkpoint.{chosen[0]}" if chosen else None


def stamp_owner(value: Any, kwargs: Mapping[str, Any], owner: str, tenant: str) -> None:
    """The run's metadata (and its config's) name the thread's user and tenant, whatever the
    client sent under those keys: they go into every checkpoint of the run, and a client's own
    would name someone else."""
    config = kwargs.get("config")
    for metadata in (value.get("metadata"), isinstance(config, dict) and config.get("metadata")):
        if isinstance(metadata, dict):  # in place: the server keeps these dicts
            metadata.update({USER_KEY: owner, TENANT_KEY: tenant})


async def admit(user: User, thread_id: Any, *, bounded: bool = True) -> None:
    """`server.admissions`, on either engine: 409 while another run is admitted on the thread
    and has not ended (one waiting behind it would hold up everyone's), 429 while the caller
    holds as many runs as one principal may (unless not `bounded`)."""
    admitting = (await aresources()).admissions
    principal = (user.tenant, user.user_id)
    refusal = await asyncio.to_thread(admitting.admit, str(thread_id), principal, bounded=bounded)
    if refusal is Refusal.THREAD_BUSY:
        raise Auth.exceptions.HTTPException(
            status_code=409,
            detail="Thread is already running a task: a thread runs one run at a time, and"
            " none waits behind it; ask again once it has ended",
        )
    if refusal is Refusal.PRINCIPAL_FULL:
        raise Auth.exceptions.HTTPException(
            status_code=429,
            detail=f"you have {admitting.per_principal} runs in flight, as many as one user"
            " may: ask again once one has ended",
        )


NO_THREAD = "a run is a thread: create one first (POST /threads), then start the run on it"


async def refuse_threadless(
    value: Mapping[str, Any], kwargs: Mapping[str, Any], owner: ThreadOwner
) -> None:
    """A run only on a thread that exists: not a stateless run (whose thread the server deletes
    as the run stops, leaving a waiting approval nobody can decide, on LangGraph's server) nor
    one that creates its thread (Aegra creates a missing one, stamped with nothing of ours)."""
    thread_id = value.get("thread_id")
    creates = kwargs.get("if_not_exists") or value.get("if_not_exists")
    if not thread_id or creates == "create":
        raise Auth.exceptions.HTTPException(status_code=422, detail=NO_THREAD)
    if not owner.known and (await aresources()).engine_threads.kept:
        raise Auth.exceptions.HTTPException(
            status_code=404, detail=f"thread {thread_id} not found: {NO_THREAD}"
        )


@auth.on.threads.create_run
async def on_run_create(
    ctx: Auth.types.AuthContext, value: Auth.types.RunsCreate
) -> Auth.types.FilterType | None:
    """Starting a run: a customer, their thread, a task the agent takes for them. Deciding: an
    approver, not on their own run, at once and without interrupting what is in flight. Other
    runs on a thread: its run's own user, unless an approval waits. Nothing on a thread whose
    run was pruned (410).
    The run's metadata names the thread's owner and tenant (a new thread's come from it)."""
    user = _user(ctx)
    if "method" in value and "params" in value:
        # A protocol v2 command (POST /threads/{id}/commands: run.start, input.respond). Aegra
        # authorizes it as a run creation but gives the hook the envelope, not the run it
        # builds from it (its input, config, resume, strategy): the rules below could not see
        # what it asks, and the run would refuse it only once the engine had started it.
        raise _forbidden(
            "protocol v2 commands are not served: start and resume runs through"
            " POST /threads/{thread_id}/runs (or /runs/wait, /runs/stream)"
        )
    # LangGraph's server passes the run's arguments under "kwargs"; Aegra passes them flat.
    kwargs: Mapping[str, Any] = value.get("kwargs") or cast(Mapping[str, Any], value)
    # Its metadata goes into every checkpoint, its input and resume values into the run.
    refuse_copied(value, kwargs, "run")
    for part in ("input", "command"):  # a task, or a decision: small; kept whole as given
        if (size := _json_bytes(kwargs.get(part))) > MAX_INPUT_BYTES:
            raise Auth.exceptions.HTTPException(
                status_code=422,
                detail=f"the run's {part} is {size} bytes: at most {MAX_INPUT_BYTES}",
            )
    command = kwargs.get("command") or {}
    thread_id = value.get("thread_id")
    owner = await thread_owner(thread_id)  # read once: every check below judges by it
    run = owner.run
    if command.get("update") is not None or command.get("goto"):
        raise _forbidden("a client may resume a run, not write its state or route it")
    if (field := checkpoint_choice(kwargs)) is not None:
        raise _forbidden(f"{field}: a run continues from its own latest checkpoint")
    strategy = kwargs.get("multitask_strategy") or value.get("multitask_strategy")
    if strategy == "rollback":
        raise _forbidden("multitask_strategy rollback would erase a run's record: use reject")
    await refuse_threadless(value, kwargs, owner)
    if is_service(user):
        return await service_wake(user, value, kwargs, owner)
    # Before anything that tells a thread's state: another tenant's threads are not named.
    roles = await hosted_roles()
    refuse_unless_visible(user, roles, owner, thread_id)
    for field, why in _OUTBOUND_FIELDS.items():
        if kwargs.get(field) or value.get(field):
            raise Auth.exceptions.HTTPException(status_code=422, detail=f"{field}: {why}")
    if kwargs.get("after_seconds") or value.get("after_seconds"):
        # Pending for its delay, then due on a thread that may be busy: LangGraph's server
        # looks past no queued run whose thread is busy (`server.admissions`).
        raise Auth.exceptions.HTTPException(
            status_code=422, detail="a run starts now: after_seconds is not taken"
        )
    if any(kwargs.get(field) for field in ("interrupt_before", "interrupt_after")):
        # A run paused at a node of the client's choosing waits for nothing anybody is asked.
        raise Auth.exceptions.HTTPException(
            status_code=422,
            detail="interrupt_before/interrupt_after: a run stops only where it asks a person",
        )
    if run is not None and run.pruned_at is not None:
        # Its checkpoints are gone: any run on the thread would start it over from nothing.
        raise Auth.exceptions.HTTPException(
            status_code=410, detail=f"run {run.run_id} was pruned by the retention job: it ended"
        )
    if decisions := decisions_in(command.get("resume")):
        if not roles.grants("decide", user.roles):
            raise _forbidden(roles.refusal("decide"))
        if run is not None and run.user_id == user.user_id:
            raise _forbidden("an approver cannot decide about their own run")
        if strategy == "interrupt":  # it would cancel the run in flight: only its user may
            raise _forbidden("a decision cannot interrupt the run in flight: use reject")
        try:  # as the run will read them, signed by the authenticated approver
            signed = [
                ApprovalDecision.model_validate({**decision, "approver": user.user_id})
                for decision in decisions
            ]
        except ValidationError as exc:  # the run would take no such decision
            raise Auth.exceptions.HTTPException(
                status_code=422, detail=f"bad decision: {validation_problems(exc)}"
            ) from None
        asked = await waiting_requests(thread_id)
        if (refused := await decision_refusal(asked, signed)) is not None:
            raise refused
        # The resumed run is its customer's, in flight on their account; not bounded by the
        # approver's: clearing an inbox faster than its runs end is no approver's fault, and
        # the runs it resumes were each admitted under their customer's bound when they began.
        customer = User(
            user_id=run.user_id if run is not None else user.user_id, roles=(), tenant=user.tenant
        )
        async with claimed(asked, signed):
            await admit(customer, value.get("thread_id"), bounded=False)
        stamp_owner(value, kwargs, customer.user_id, user.tenant)
        return _filter(user, roles)  # and only in their own tenant
    if not roles.grants("start", user.roles):
        if "resume" in command:  # most likely a decision that is not one
            raise _forbidden(
                f"{roles.refusal('start')} (resuming one too); an approver's resume is a decision:"
                ' {"approval_id": ..., "digest": ..., "decision": "approve" | "reject" | "edit"},'
                " or a map of interrupt ids to decisions"
            )
        raise _forbidden(roles.refusal("start"))
    refuse_unless_own(user, owner, thread_id, "this run belongs to another user")
    if run is not None and run.phase == Phase.WAITING_APPROVAL:
        # A resume would answer the approval (ignored, and the request asked again, anew); any
        # other run is queued behind it, and cancelled before it runs it leaves the thread
        # "idle": the approval would be gone from the inbox, which lists interrupted threads.
        raise _forbidden("this run waits for an approval: only an approver's decision resumes it")
    run_input = kwargs.get("input")
    if isinstance(run_input, dict):
        run_input.pop("principal", None)  # never trusted anyway: the served graph ignores it
    if run_input is not None:
        try:
            task = new_run_task(run_input)
        except RunRefused as exc:  # refused now, not in the run it would start
            raise Auth.exceptions.HTTPException(status_code=422, detail=str(exc)) from None
        if run is not None and run.task != task:
            # Refused now: the run would refuse it (`inputs.payload_for`) once the engine had
            # started it, leaving the thread of a finished run in error and the client a 200
            # with no reason. The same task again continues the run (a start delivered twice).
            raise Auth.exceptions.HTTPException(
                status_code=409,
                detail=f"thread {thread_id} already carries a run of another task: start a new"
                " thread",
            )
        if (refusal := await task_refusal(user, task)) is not None:
            raise _forbidden(refusal)
    elif run is None:  # nothing to continue, nor to resume (the run would refuse it)
        raise Auth.exceptions.HTTPException(
            status_code=422, detail=f"the thread has no run to continue: {NEW_RUN_TAKES}"
        )
    stamp_owner(value, kwargs, user.user_id, user.tenant)
    await admit(user, value.get("thread_id"))
    return _filter(user, roles)


async def service_wake(
    user: User, value: Mapping[str, Any], kwargs: Mapping[str, Any], owner: ThreadOwner
) -> Auth.types.FilterType:
    """The served process continuing a run parked in a reconciliation (`server.waker`): that
    resume of a run the engine hosts, parked, in the tenant its token names; nothing else. The
    run is its user's, as before."""
    run = owner.run
    if (
        kwargs.get("command") != {"resume": WAKE_VALUE}
        or kwargs.get("input") is not None
        or run is None
        or run.tenant != user.tenant
        or run.engine != SERVER_ENGINE
        or run.phase != Phase.RECONCILING
    ):
        raise _forbidden("the service identity only wakes runs parked in a reconciliation")
    run_user = User(user_id=run.user_id, roles=(), tenant=run.tenant)
    stamp_owner(value, kwargs, run.user_id, run.tenant)
    # Not bounded by the user's runs in flight: a write whose outcome is not known yet must be
    # found out however many other runs its user keeps busy.
    await admit(run_user, value.get("thread_id"), bounded=False)
    return _filter(run_user, None)  # the run user's own thread


@auth.on.assistants
async def on_assistants(
    ctx: Auth.types.AuthContext, value: dict[str, Any]
) -> Auth.types.FilterType | None:
    """Assistants may be read (Studio lists them); the server's own one is the only one."""
    if ctx.action not in ("read", "search"):
        raise _forbidden("assistants are read-only")
    return None


@auth.on
async def closed(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType | None:
    """Everything not named above (the store, crons) is closed."""
    raise _forbidden(f"{ctx.resource}.{ctx.action} is not available")
