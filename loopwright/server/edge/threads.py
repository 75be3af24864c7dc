"""Whose a thread is, and who may therefore read it, delete it or cancel its run.

A thread's owner is its run's user and tenant once a run is registered on it (lw_runs), else
those the edge stamped on the engine's thread row when it was created (Aegra's; LangGraph's
server keeps no such row here, and filters its reads by the same stamp instead). Another
tenant's thread is not even named (404, as for a thread that does not exist); another user's
thread of the same tenant is a 403, unless the caller is an approver, who reads every thread of
their tenant (the inbox, the SDK's state read and a decision need it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from loopwright.checkpoints.leases import RunRecord
from loopwright.core.roles import Roles
from loopwright.server.edge.http import Refused
from loopwright.server.engine import TENANT_KEY, USER_KEY
from loopwright.server.resources import aresources
from loopwright.server.users import User


@dataclass(frozen=True)
class ThreadOwner:
    """Whose a thread is, as far as loopwright or the engine knows (`known`: either has it)."""

    known: bool
    user_id: str | None = None
    tenant: str | None = None
    run: RunRecord | None = None  # the loopwright run on it, if one was registered


async def thread_owner(thread_id: str) -> ThreadOwner:
    res = await aresources()

    def read() -> ThreadOwner:
        run = res.leases.get(thread_id)
        if run is not None:
            return ThreadOwner(True, run.user_id, run.tenant, run)
        known, user_id, tenant = res.engine_threads.owner(thread_id)
        return ThreadOwner(known, user_id, tenant)

    return await asyncio.to_thread(read)


def not_found(thread_id: str) -> Refused:
    return Refused(404, f"thread {thread_id} not found")


def refuse_unless_own(user: User, owner: ThreadOwner, thread_id: str, refusal: str) -> None:
    """403 unless the thread is the caller's, 404 if it is another tenant's; nothing for a
    thread nobody knows (the engine answers 404 itself)."""
    if owner.tenant is not None and owner.tenant != user.tenant:
        raise not_found(thread_id)
    if owner.user_id is not None and owner.user_id != user.user_id:
        raise Refused(403, refusal)


def refuse_unless_visible(user: User, roles: Roles, owner: ThreadOwner, thread_id: str) -> None:
    """What a caller may read: an approver their tenant's threads, anyone else their own."""
    if not roles.grants("decide", user.roles):
        refuse_unless_own(user, owner, thread_id, "this run belongs to another user")
    elif owner.tenant not in (None, user.tenant):
        raise not_found(thread_id)


async def journaled(thread_id: str) -> bool:
    """Whether the run on a thread has journaled actions (whose record must not be erased)."""
    res = await aresources()
    return bool(await asyncio.to_thread(res.runner.journal.for_run, thread_id))


def owner_filter(user: User, roles: Roles) -> dict[str, str]:
    """The threads `user` acts on, for the engine to apply where it applies filters:
    approvers their tenant's, anyone else their own."""
    if roles.grants("decide", user.roles):
        return {TENANT_KEY: user.tenant}
    return {USER_KEY: user.user_id, TENANT_KEY: user.tenant}


def stamp(user_id: str, tenant: str) -> dict[str, str]:
    """The metadata keys naming whose a thread or a run is (written over a client's own)."""
    return {USER_KEY: user_id, TENANT_KEY: tenant}
