"""What a client may send to a served run (`server.inputs`) and who it is (`server.auth`).

Pure functions, no server: the served graph's own line of defence, which holds whatever the
server's auth hooks do (Aegra calls them with other shapes, `langgraph dev` may run without).
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from langgraph.types import Command, Interrupt, StateSnapshot

from loopwright.checkpoints.leases import SERVER_ENGINE, RunRecord
from loopwright.core.roles import DEFAULT_ROLES, Roles
from loopwright.core.state import Principal, initial_state
from loopwright.runner import WAKE_VALUE
from loopwright.server.bearer_tokens import TokenTableError, token_table
from loopwright.server.edge import runs as edge_runs
from loopwright.server.edge.bodies import RunCreate
from loopwright.server.edge.decisions import decisions_in
from loopwright.server.edge.http import Refused
from loopwright.server.edge.threads import ThreadOwner
from loopwright.server.graph import _cancel_and_settle, _settled, is_user_cancel
from loopwright.server.inputs import (
    Continue,
    NewRun,
    Resume,
    RunRefused,
    parse_request,
    payload_for,
    principal_of_user,
)
from loopwright.server.resources import ServerResources
from loopwright.server.users import SERVICE_ROLE, SERVICE_USER_ID, User
from tests.runtime_fixtures import PATIENCE_S

TASK = "Check whether order O-42 can be refunded and refund it if so."
ADA = Principal(user_id="u-1", roles=("customer",))
ANN = Principal(user_id="a-1", roles=("approver",))
AL = Principal(user_id="a-2", roles=("customer", "approver"))


def snapshot(
    values: dict[str, Any] | None = None, interrupts: tuple[Interrupt, ...] = ()
) -> StateSnapshot:
    return StateSnapshot(values or {}, (), {}, None, None, None, (), interrupts)


def running(run_id: str = "t-1", user: Principal = ADA) -> dict[str, Any]:
    return dict(initial_state(run_id, TASK, user))


def decision(approver: str = "someone") -> dict[str, Any]:
    return {"approval_id": "apr_1", "digest": "0" * 64, "decision": "approve", "approver": approver}


def test_a_new_run_takes_its_principal_from_the_server_never_from_the_input() -> None:
    forged = {"user_id": "u-2", "roles": ["approver"], "scope": []}
    with pytest.raises(RunRefused, match="an input naming journal, principal"):
        parse_request({"task": TASK, "principal": forged, "journal": {}}, ADA, roles=DEFAULT_ROLES)
    request = parse_request({"task": TASK}, ADA, roles=DEFAULT_ROLES)
    assert request == NewRun(task=TASK)
    scoped = ADA.model_copy(update={"scope": ("order:O-42",)})  # by the agent's boundary
    state = payload_for(request, snapshot(), "t-1", scoped)
    assert isinstance(state, dict)
    assert state["principal"]["user_id"] == "u-1"
    assert state["principal"]["scope"] == ["order:O-42"]
    assert "journal" not in state and state["run_id"] == "t-1"


def test_a_thread_whose_first_attempt_died_before_its_input_was_in_starts_the_run() -> None:
    """Aegra re-ran such a run on another instance after its first was killed: the thread held
    state naming no run (an input saved, never applied), and the takeover refused it as "a copy
    of run None", leaving the run READY and nobody's. A state that names no run has none begun."""
    unbegun = snapshot({"events": []})
    state = payload_for(NewRun(task=TASK), unbegun, "t-1", ADA)
    assert isinstance(state, dict) and state["run_id"] == "t-1"
    with pytest.raises(RunRefused, match="has no run to continue"):
        payload_for(Continue(), unbegun, "t-1", ADA)


@pytest.mark.parametrize(
    "raw",
    [
        {"principal": {"user_id": "u-1"}},  # no task
        {"task": "   "},
        {"task": "x" * 2001},
        "refund everything",
        Command(update={"approvals": [{"approval_id": "apr_1"}]}),
        Command(goto="execute"),
    ],
)
def test_what_no_client_may_send(raw: Any) -> None:
    with pytest.raises(RunRefused):
        parse_request(raw, ADA, roles=DEFAULT_ROLES)


def test_a_new_run_needs_an_authenticated_principal() -> None:
    with pytest.raises(RunRefused):
        parse_request({"task": TASK}, None, roles=DEFAULT_ROLES)
    assert parse_request(None, None, roles=DEFAULT_ROLES) == Continue()


def test_a_decision_is_signed_by_the_authenticated_approver() -> None:
    request = parse_request(
        Command(resume={"int-1": decision(approver="u-1")}), ANN, roles=DEFAULT_ROLES
    )
    assert isinstance(request, Resume)
    assert request.command.resume == {"int-1": {**decision(), "approver": "a-1"}}
    single = parse_request(Command(resume=decision(approver="u-1")), ANN, roles=DEFAULT_ROLES)
    assert isinstance(single, Resume) and isinstance(single.command.resume, dict)
    assert single.command.resume["approver"] == "a-1"


def test_only_approvers_decide() -> None:
    with pytest.raises(RunRefused):
        parse_request(Command(resume={"int-1": decision()}), ADA, roles=DEFAULT_ROLES)
    with pytest.raises(RunRefused):
        parse_request(Command(resume=decision()), None, roles=DEFAULT_ROLES)
    # Other resume values (a parked reconciliation's) are not decisions.
    assert isinstance(
        parse_request(Command(resume={"kind": "retry"}), ADA, roles=DEFAULT_ROLES), Resume
    )


def test_whose_decisions_count_is_the_agents_roles_to_say() -> None:
    """An agent whose deciders are `supervisor`s: a decision of one is signed, one of an
    identity holding the runtime's own word `approver` is refused, saying which role decides."""
    desk = Roles(start=("agent",), decide=("supervisor", "lead"), operate=("sre",))
    sue = Principal(user_id="s-1", roles=("supervisor",))
    request = parse_request(Command(resume={"int-1": decision()}), sue, roles=desk)
    assert isinstance(request, Resume) and request.command.resume == {
        "int-1": {**decision(), "approver": "s-1"}
    }
    with pytest.raises(
        RunRefused, match="deciding approvals takes one of the roles supervisor, lead"
    ):
        parse_request(Command(resume={"int-1": decision()}), ANN, roles=desk)


def test_an_approver_never_decides_their_own_run() -> None:
    waiting = snapshot(running(user=AL), (Interrupt(value={"kind": "approval"}, id="int-1"),))
    request = parse_request(Command(resume={"int-1": decision()}), AL, roles=DEFAULT_ROLES)
    with pytest.raises(RunRefused):
        payload_for(request, waiting, "t-1", AL)
    allowed = payload_for(
        parse_request(Command(resume={"int-1": decision()}), ANN, roles=DEFAULT_ROLES),
        waiting,
        "t-1",
        ANN,
    )
    assert isinstance(allowed, Command) and isinstance(allowed.resume, dict)
    assert allowed.resume["int-1"]["approver"] == "a-1"


def test_a_repeated_start_continues_and_a_different_one_is_refused() -> None:
    started = snapshot(running())
    assert payload_for(NewRun(task=TASK), started, "t-1", ADA) is None
    with pytest.raises(RunRefused):
        payload_for(NewRun(task="Refund order O-43."), started, "t-1", ADA)
    with pytest.raises(RunRefused):
        payload_for(NewRun(task=TASK), started, "t-1", Principal(user_id="u-2"))


def test_a_stale_answer_continues_the_run_instead_of_answering_a_later_question() -> None:
    waiting = snapshot(running(), (Interrupt(value={"kind": "approval"}, id="int-2"),))
    request = parse_request(Command(resume={"int-1": decision()}), ANN, roles=DEFAULT_ROLES)
    assert payload_for(request, waiting, "t-1", ANN) is None
    single = parse_request(Command(resume=decision()), ANN, roles=DEFAULT_ROLES)
    assert payload_for(single, snapshot(running()), "t-1", ANN) is None


def test_a_copied_thread_is_read_only_and_an_empty_one_has_nothing_to_continue() -> None:
    for request in (Continue(), NewRun(task=TASK)):
        with pytest.raises(RunRefused):
            payload_for(request, snapshot(running(run_id="t-1")), "t-2", ADA)
    with pytest.raises(RunRefused):
        payload_for(Continue(), snapshot(), "t-1", ADA)


class AegraUser:
    """Aegra's user: attributes, no `get`."""

    identity = "a-1"
    roles = ("approver",)


def test_principal_of_either_servers_user_object() -> None:
    assert principal_of_user({"identity": "u-1", "roles": ["customer"]}) == ADA
    assert principal_of_user(AegraUser()) == ANN
    assert principal_of_user(None) is None
    assert principal_of_user({"roles": ["approver"]}) is None


def test_token_table_and_authorization_header() -> None:
    environ = {
        "LOOPWRIGHT_TOKENS": '{"t": {"user_id": "a-2", "roles": ["customer", "approver"]}}',
        "LOOPWRIGHT_DEV_TOKENS": "1",
    }
    user = token_table(environ).user_for("t")
    assert user is not None and user.user_id == "a-2" and user.roles == ("customer", "approver")
    assert len(token_table({})) == 0


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('{"t": {"user_id": null}}', "user_id: Input should be a valid string"),
        ('{"t": {"user_id": "u-1"}, "t": {"user_id": "a-1"}}', "appears twice"),
        ('{"t": ["u-1"]}', "Input should be a valid dictionary"),
        ('{"t": null}', "Input should be a valid dictionary"),
        ('["t"]', "expected an object of token -> user entries"),
        ('{"t": {"user_id": "u-1", "role": "approver"}}', "role: Extra inputs are not permitted"),
        ("{nope", "not JSON"),
        # Never sent as such: a bearer header's token is what follows "Bearer ", stripped.
        ('{"": {"user_id": "u-1"}}', "a token is one word"),
        ('{" t ": {"user_id": "u-1"}}', "a token is one word"),
        ('{"t t": {"user_id": "u-1"}}', "a token is one word"),
    ],
)
def test_a_token_table_that_cannot_be_used_is_refused_in_one_line(table: str, problem: str) -> None:
    """A null user id is not the user "None", a repeated token is not the last one, an entry
    that is not an object is not a raw Python error: each says what is wrong, and where."""
    with pytest.raises(TokenTableError, match=problem) as refused:
        token_table({"LOOPWRIGHT_TOKENS": table, "LOOPWRIGHT_DEV_TOKENS": "1"})
    assert "\n" not in str(refused.value)


def test_decisions_in_finds_a_decision_alone_or_by_interrupt_id() -> None:
    assert decisions_in(decision()) and decisions_in({"int-1": decision()})
    assert not decisions_in({"kind": "retry"}) and not decisions_in(None)


class UserInterrupt(Exception):
    """Stands in for langgraph_api's reason for a user's cancel (matched by name)."""


def test_only_a_users_cancel_cancels_a_served_run() -> None:
    assert is_user_cancel(asyncio.CancelledError(UserInterrupt()), None)
    assert not is_user_cancel(asyncio.CancelledError(), None)  # e.g. a server shutting down
    assert not is_user_cancel(GeneratorExit(), "run-1")


def test_a_run_handed_back_is_waited_for_however_often_the_engine_cancels() -> None:
    """An engine shutting down may cancel the task waiting for a handed-back run's thread more
    than once; the wait lasts until the thread has stopped (and released its lease), not until
    the next cancel: an instance that exited with a run mid-step left its lease live (a loaded
    CI run found it), and no other instance could take the run until the lease lapsed."""

    async def handed_back() -> None:
        finished = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(_settled("run-1", finished, timeout_s=PATIENCE_S))
        for _ in range(3):
            for _ in range(5):  # the cancel delivered, and waited on again
                await asyncio.sleep(0)
            waiting.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done(), "the wait ended while the run's thread was mid-step"
        finished.set_result(None)
        await waiting

    asyncio.run(handed_back())


def test_a_run_the_server_cancelled_is_waited_for_however_often_the_engine_cancels() -> None:
    """A user's cancel asks the run to stop, then waits for its typed end; an engine cancelling
    the waiting task again, while the request is still being written or after, ends neither
    wait: the run's cancel is asked for once and its end is waited for."""
    asked: list[str] = []
    written = threading.Event()

    def request_cancel(run_id: str) -> None:
        asked.append(run_id)
        written.wait(PATIENCE_S)  # a slow database

    res = cast(
        ServerResources, SimpleNamespace(leases=SimpleNamespace(request_cancel=request_cancel))
    )

    async def cancelled() -> None:
        finished = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(_cancel_and_settle(res, "run-1", finished))

        async def cancel_again() -> None:
            for _ in range(3):
                for _ in range(5):
                    await asyncio.sleep(0)
                waiting.cancel()
            for _ in range(5):
                await asyncio.sleep(0)

        try:
            await cancel_again()
            assert not waiting.done(), "the wait ended while the cancel was being asked"
        finally:
            written.set()  # however it went, the request's thread is let go
        await asyncio.to_thread(lambda: None)  # the request's thread hands its answer back
        await cancel_again()
        assert not waiting.done(), "the wait ended before the run did"
        finished.set_result(None)
        await waiting
        assert asked == ["run-1"]

    asyncio.run(cancelled())


SERVICE = Principal(user_id=SERVICE_USER_ID, tenant="bank-a", roles=(SERVICE_ROLE,))


def test_the_service_identity_sending_a_task_continues_a_run_and_starts_none() -> None:
    # What `server.waker` sends a run its engine stopped advancing: no principal is taken
    # from it, and on a thread with no run it is refused, not a new run.
    assert isinstance(parse_request({"task": TASK}, SERVICE, roles=DEFAULT_ROLES), Continue)
    with pytest.raises(RunRefused, match="no run to continue"):
        payload_for(Continue(), snapshot({}), "t-1", None)


def served_run(**fields: Any) -> RunRecord:
    now = datetime.now(UTC)
    record: dict[str, Any] = {
        "run_id": "t-1",
        "owner": None,
        "fence": 1,
        "lease_expires_at": now,
        "lease_live": False,
        "phase": "READY",
        "task": TASK,
        "user_id": "u-1",
        "next_attempt_at": None,
        "tenant": "bank-a",
        "engine": SERVER_ENGINE,
        "created_at": now,
        "updated_at": now,
    }
    return RunRecord.model_validate(record | fields)


WAKE = {"assistant_id": "loopwright", "command": {"resume": WAKE_VALUE}}
GO_ON = {"assistant_id": "loopwright", "input": {"task": TASK}}


@pytest.mark.parametrize(
    ("run", "body"),
    [
        (served_run(lease_live=True, owner="w-1"), GO_ON),  # an attempt holds it
        (served_run(phase="WAITING_APPROVAL"), GO_ON),  # a person decides
        (served_run(phase="COMPLETED"), GO_ON),
        (served_run(phase="RECONCILING"), GO_ON),  # parked: woken by its own rule
        (served_run(), {"assistant_id": "loopwright", "input": {"task": "another task"}}),
        (served_run(), WAKE),  # the engine resumes only an interrupted thread
        (served_run(phase="READY", engine=""), GO_ON),  # an in-process run: a worker's
        (served_run(tenant="bank-b"), GO_ON),  # another tenant's
        (served_run(phase="RECONCILING"), {**WAKE, "input": {"task": TASK}}),
    ],
)
def test_the_service_identity_wakes_nothing_but_a_stranded_or_parked_run(
    run: RunRecord, body: dict[str, Any]
) -> None:
    service = User(SERVICE_USER_ID, (SERVICE_ROLE,), "bank-a")
    owner = ThreadOwner(known=True, user_id="u-1", tenant=run.tenant, run=run)
    with pytest.raises(Refused) as refused:
        asyncio.run(edge_runs._wake(service, "t-1", owner, RunCreate.model_validate(body)))
    assert refused.value.status == 403


def test_a_refusal_only_the_run_could_make_tells_the_client_why() -> None:
    """The LangGraph server hands a failed run's error to its client by the error's type: some
    types' messages as they are, others' as "An internal error occurred". A run the graph
    refuses (its thread carries another agent's run, say, which the auth hook could not know
    before the run) says why."""
    from langgraph_api.serde import json_dumpb

    why = "run t-1 is another agent's run"
    assert json.loads(json_dumpb(RunRefused(why))) == {"error": "RunRefused", "message": why}
