"""What a client may send to a run, and what the run makes of it.

Under a server, a run's input and resume values come from a client and are untrusted. The
graph's input channels are its whole state, so passing a client's input through would let it
write any channel: a `principal` of its choosing (guard takes the input's principal first), a
forged approval record, a journal projection. So the served graph never passes client input
through. It accepts three shapes and builds the graph's payload itself:

* a new run: `{"task": "..."}` and nothing else. The initial state is built here from the task
  and the principal the server authenticated; any other key (`principal` included) is refused.
* a resume: a `Command` with `resume` only (no `update`, no `goto`). An approval decision is
  accepted from an approver only (a role the agent's `Roles.decide` names), never from the
  run's own user, and its `approver` field is
  overwritten with the authenticated user: a client cannot decide in someone else's name.
* nothing (`None`): continue from the last checkpoint, e.g. after a crash.

The same input can be delivered twice (a server re-queues a run whose worker died), so a
repeated start of the same task continues the run, and a resume whose interrupt is no longer
pending continues it too, instead of forking it or resuming a later interrupt with a stale
answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from langgraph.types import Command, StateSnapshot

from loopwright._agent import Agent
from loopwright.core.roles import Roles
from loopwright.core.state import Principal, RunState, initial_state
from loopwright.core.text import MAX_TASK_CHARS, InvalidText, checked_text
from loopwright.server.users import SERVICE_ROLE

NEW_RUN_TAKES = 'a new run takes {"task": "<what to do>"}'


class RunRefused(ValueError):
    """The input is not something this client may ask of this run; nothing was written.

    A ValueError: the LangGraph server tells a run's client a ValueError's message, where it
    says only "An internal error occurred" of a PermissionError's, so a refusal only the run
    could make (the auth hook, which refuses before a run, did not see it) still says why."""


@dataclass(frozen=True)
class NewRun:
    task: str


@dataclass(frozen=True)
class Resume:
    command: Command[Any]


@dataclass(frozen=True)
class Continue:
    pass


RunRequest = NewRun | Resume | Continue


def principal_of_user(user: Any) -> Principal | None:
    """The principal for the server's authenticated user object (LangGraph's or Aegra's): its
    `user_id` (the `identity` is the engine's, the tenant: see `server.engine`)."""
    if user is None:
        return None
    identity = _field(user, "user_id") or _field(user, "identity")
    if not isinstance(identity, str) or not identity:
        return None
    roles = _field(user, "roles") or ()
    tenant = _field(user, "tenant") or "default"
    return Principal(user_id=identity, tenant=str(tenant), roles=tuple(str(r) for r in roles))


def _field(user: Any, name: str) -> Any:
    if isinstance(user, Mapping) or hasattr(user, "get"):
        with contextlib.suppress(Exception):
            value = user.get(name)
            if value is not None:
                return value
    return getattr(user, name, None)


def parse_request(raw: Any, principal: Principal | None, *, roles: Roles) -> RunRequest:
    """Classify a client's input; refuse what no client may send (no thread state needed).
    `roles`: the hosted agent's, which say whose decisions count."""
    if raw is None:
        return Continue()
    if isinstance(raw, Command):
        if raw.update is not None or raw.goto:
            raise RunRefused("a client may resume a run, not write its state or route it")
        return Resume(Command(resume=_stamp_decisions(raw.resume, principal, roles)))
    task = new_run_task(raw)
    if principal is None:
        raise RunRefused("a run needs an authenticated principal")
    if SERVICE_ROLE in principal.roles:
        # The served process's own identity sends a run's task only to continue a run its
        # engine stopped advancing (`server.waker`; the edge lets it do nothing else): from
        # the run's latest checkpoint, as its own principal. It starts nothing.
        return Continue()
    return NewRun(task=task)


def new_run_task(raw: Any) -> str:
    """The task of a client's input for a new run, `{"task": "..."}` and nothing else (a key
    more is refused, not ignored: a client whose `principal` was dropped silently would learn
    nothing); RunRefused, saying what a new run takes, for any other input."""
    if not isinstance(raw, Mapping):
        raise RunRefused(f"a run's input of type {type(raw).__name__}: {NEW_RUN_TAKES}")
    task = raw.get("task")
    if task is None:
        raise RunRefused(f"an input without a task: {NEW_RUN_TAKES}")
    if more := sorted(str(key) for key in raw if key != "task"):
        raise RunRefused(f"an input naming {', '.join(more)[:200]}: {NEW_RUN_TAKES}")
    try:
        checked_text("the task", task, max_chars=MAX_TASK_CHARS)
    except InvalidText as exc:
        raise RunRefused(str(exc)) from None
    return str(task).strip()


def principal_for_task(agent: Agent[Any], deps: Any, user: Principal, task: str) -> Principal:
    """The run's principal: the authenticated user (identity, roles and tenant from the token
    table, the trusted session), scoped to the task's boundary as the agent draws it. Raises
    TaskRefused for a task the agent does not take for this user."""
    boundary = agent.boundary_of
    scope = boundary(deps, user, task) if boundary is not None else ()
    return user.model_copy(update={"scope": tuple(sorted(set(scope)))})


def payload_for(
    request: RunRequest,
    snapshot: StateSnapshot,
    run_id: str,
    principal: Principal | None,
    now: datetime | None = None,
) -> RunState | Command[Any] | None:
    """What to stream, given where the run stands (read under the run's lease). `principal`
    is the run's (already scoped to the task, for a new run); `now` the database's clock."""
    values = snapshot.values or {}
    # A run's state always names it once its input is in. A thread whose first attempt died
    # between saving the input and applying it holds state of no run (a delta channel's empty
    # default, say): that run has not begun, and a new run starts it as if nothing was there.
    if isinstance(request, NewRun) and values.get("run_id") is None:
        assert principal is not None  # parse_request refuses a new run without one
        return initial_state(run_id, request.task, principal, now=now)
    if values.get("run_id") is None:
        raise RunRefused(f"thread {run_id} has no run to continue")
    if values.get("run_id") != run_id:
        raise RunRefused(
            f"thread {run_id} is a copy of run {values.get('run_id')}; it is read-only"
        )
    if isinstance(request, NewRun):
        owner = (values.get("principal") or {}).get("user_id")
        if values.get("task") == request.task and principal and owner == principal.user_id:
            return None  # the same start delivered again: continue where it stands
        raise RunRefused(f"thread {run_id} already carries a run; start a new thread")
    if isinstance(request, Continue):
        return None
    return _pending_resume(request.command, snapshot, values, principal)


def _pending_resume(
    command: Command[Any],
    snapshot: StateSnapshot,
    values: Mapping[str, Any],
    principal: Principal | None,
) -> Command[Any] | None:
    """The resume to send, keeping only answers to interrupts that are still pending."""
    pending = {i.id: i.value for i in snapshot.interrupts}
    resume = command.resume
    if _is_id_map(resume):
        answers = {key: value for key, value in resume.items() if key in pending}
        decisions: list[Any] = list(answers.values())
        resume = answers or None
    else:
        decisions = [resume]
        resume = resume if pending else None
    if resume is None:
        return None  # nothing waits for this answer (any more): continue instead
    run_user = (values.get("principal") or {}).get("user_id")
    if (
        principal is not None
        and run_user == principal.user_id
        and any(_is_decision(d) for d in decisions)
    ):
        raise RunRefused(f"{principal.user_id} cannot decide about their own run")
    return Command(resume=resume)


def _stamp_decisions(resume: Any, principal: Principal | None, roles: Roles) -> Any:
    """Approval decisions in `resume`, each signed with the authenticated approver."""
    if _is_id_map(resume):
        return {key: _stamp(value, principal, roles) for key, value in resume.items()}
    return _stamp(resume, principal, roles)


def _stamp(value: Any, principal: Principal | None, roles: Roles) -> Any:
    if not _is_decision(value):
        return value
    if principal is None or not roles.grants("decide", principal.roles):
        raise RunRefused(roles.refusal("decide"))
    return {**value, "approver": principal.user_id}


def _is_decision(value: Any) -> bool:
    return isinstance(value, Mapping) and "approval_id" in value


def _is_id_map(resume: Any) -> TypeGuard[Mapping[str, Any]]:
    """A resume keyed by interrupt id, as opposed to one value (which is a dict itself here)."""
    return (
        isinstance(resume, Mapping)
        and bool(resume)
        and not _is_decision(resume)
        and "kind" not in resume
        and all(isinstance(v, Mapping) for v in resume.values())
    )
