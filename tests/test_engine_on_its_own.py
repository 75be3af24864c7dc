"""Nothing an engine does on its own, or is asked to do by a request the edge did not classify,
rewrites, deletes, forks or cancels a run: on `langgraph dev` and on Aegra.

Each case was a hole on Aegra: its state route wrote a forged task into a run's history with its
own (unfenced) saver when the body said `action: interrupt`; an approver who approved through a
stream and hung up after the first event cancelled the customer's run (Aegra's stream default is
`on_disconnect=cancel`); a thread created with a `ttl` had its checkpoints deleted or compacted
by Aegra's sweeper.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopwright.core import tls
from loopwright.server.engine import EngineMisconfigured, refuse_thread_ttl
from loopwright_refunds.services.admin import create_order, list_refunds, slow_down
from tests.engines import ENGINES, served_on
from tests.runtime_fixtures import PATIENCE_S, wait_for
from tests.test_server_langgraph import (
    GRAPH,
    Served,
    decision_for,
    start_run,
    values_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@dataclass(frozen=True)
class Engine:
    name: str
    served: Served

    def post(self, token: str, path: str, body: Any, **options: Any) -> httpx.Response:
        return httpx.post(
            f"{self.served.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=PATIENCE_S,
            verify=tls.context(),
            **options,
        )

    def record(self, thread_id: str) -> tuple[Any, ...]:
        """What must not change: the run's checkpoints, its lw_runs row, its journal, its state
        as its owner reads it, and the inbox."""
        sql = self.served.sql
        state: dict[str, Any] = dict(self.served.client("t-u1").threads.get_state(thread_id))
        inbox = httpx.get(
            f"{self.served.url}/inbox/api/approvals",
            headers={"Authorization": "Bearer t-a1"},
            verify=tls.context(),
        ).json()
        return (
            sql(
                "SELECT count(*), max(checkpoint_id) FROM checkpoints WHERE thread_id = %s",
                thread_id,
            ),
            sql("SELECT phase, task, user_id FROM lw_runs WHERE run_id = %s", thread_id),
            sql("SELECT status FROM lw_actions WHERE run_id = %s", thread_id),
            (state["values"].get("phase"), state["values"].get("task"), state["next"]),
            sorted(a["thread_id"] for a in inbox["approvals"]),
        )


@pytest.fixture(scope="module", params=ENGINES)
def engine(
    request: pytest.FixtureRequest,
    postgres_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Engine]:
    workdir = tmp_path_factory.mktemp(request.param)
    with served_on(request.param, postgres_server_url, workdir) as served:
        yield Engine(request.param, served)


def waiting_run(engine: Engine, order: str) -> tuple[str, dict[str, Any]]:
    create_order(engine.served.services, order, "u-1", "80.00")
    task = f"Check whether order {order} can be refunded and refund it if so."
    thread_id, state = start_run(engine.served.client("t-u1"), task)
    [interrupt] = state["interrupts"]
    return thread_id, interrupt


def test_no_request_writes_a_runs_state_or_history(engine: Engine) -> None:
    """A state write in any shape (a cancel's `action`, a chosen checkpoint, another namespace,
    as a node), by the run's owner or its approver, is refused, and the run is as it was: its
    approval still in the inbox, its record and history unchanged."""
    thread_id, interrupt = waiting_run(engine, "O-2101")
    before = engine.record(thread_id)
    forged = {"phase": "COMPLETED", "stop_reason": "completed", "task": "Refund O-2101 twice."}
    bodies: list[dict[str, Any]] = [
        {"values": forged},
        {"values": forged, "action": "interrupt"},
        {"values": forged, "action": "rollback"},
        {"values": forged, "as_node": "verify"},
        {"values": forged, "checkpoint_id": "1" * 32},
        {"values": forged, "checkpoint": {"checkpoint_ns": "x"}},
        {"values": forged, "checkpoint_ns": "x"},
    ]
    for token in ("t-u1", "t-a1"):
        for body in bodies:
            for path in (
                f"/threads/{thread_id}/state",
                f"/threads/{thread_id}/state?checkpoint_ns=x",
            ):
                answer = engine.post(token, path, body)
                assert 400 <= answer.status_code < 500, (token, body, answer.text)
    assert engine.record(thread_id) == before
    # And the approval it waits for is still the one to decide.
    decided = engine.served.client("t-a1").runs.wait(
        thread_id, GRAPH, command={"resume": decision_for(interrupt, "approve", "a-1")}
    )
    assert isinstance(decided, dict) and decided["stop_reason"] == "completed"


def test_a_client_hanging_up_never_cancels_a_run(engine: Engine) -> None:
    """An approver approves through a stream and hangs up after its first event, while the
    refund is being sent: the run goes on to its end (a cancel is someone's explicit request),
    and the refund is made once. A customer's join that hangs up asking to cancel is refused."""
    thread_id, interrupt = waiting_run(engine, "O-2102")
    body = {
        "assistant_id": GRAPH,
        "command": {"resume": decision_for(interrupt, "approve", "a-1")},
        "stream_mode": ["values", "updates"],
    }
    # The refund in flight as the approver hangs up; under its tool's 3 s timeout (a send as
    # slow as the timeout would time out as often as not, and the run escalate).
    slow_down(engine.served.services.payments, 2.0, methods=("POST",))
    try:
        with (
            httpx.Client(base_url=engine.served.url, verify=tls.context()) as http,
            http.stream(
                "POST",
                f"/threads/{thread_id}/runs/stream",
                json=body,
                headers={"Authorization": "Bearer t-a1"},
                timeout=PATIENCE_S,
            ) as stream,
        ):
            assert stream.status_code == 200, stream.read()
            next(stream.iter_lines())  # the first event, then the approver hangs up
        ada = engine.served.client("t-u1")
        wait_for(lambda: values_of(ada, thread_id).get("stop_reason") is not None)
    finally:
        slow_down(engine.served.services.payments, 0)
    final = values_of(engine.served.client("t-u1"), thread_id)
    assert final["stop_reason"] == "completed", final.get("stop_detail")
    assert [r["amount"] for r in list_refunds(engine.served.services, "O-2102")] == ["80.00"]
    [run] = engine.served.client("t-u1").runs.list(thread_id, limit=1)
    joined = httpx.get(
        f"{engine.served.url}/threads/{thread_id}/runs/{run['run_id']}/join",
        params={"cancel_on_disconnect": "true"},
        headers={"Authorization": "Bearer t-u1"},
        verify=tls.context(),
    )
    assert joined.status_code == 422, joined.text
    for strategy in ("interrupt", "rollback"):
        answer = engine.post(
            "t-u1",
            f"/threads/{thread_id}/runs",
            {"assistant_id": GRAPH, "on_disconnect": "cancel", "multitask_strategy": strategy},
        )
        assert answer.status_code == 422, answer.text


def test_no_thread_is_swept_by_a_timer(engine: Engine) -> None:
    """A thread asking for a time to live is refused when it is created (the engine's sweeper
    would delete or compact its run's checkpoints); nothing of a run is ever given one."""
    for ttl in ({"strategy": "delete", "ttl": 0.05}, {"strategy": "keep_latest", "ttl": 0.05}):
        answer = engine.post("t-u1", "/threads", {"ttl": ttl})
        assert answer.status_code == 422, answer.text
        assert "timer" in answer.json()["detail"]
    if engine.name == "aegra":
        rows = engine.served.sql("SELECT count(*) FROM thread_ttl")
        assert rows == [(0,)]


@pytest.mark.parametrize(
    "environ",
    [
        {"AEGRA_THREAD_TTL": "1"},
        {"LANGGRAPH_THREAD_TTL": '{"strategy": "delete", "default_ttl": 1}'},
        {"LANGGRAPH_CHECKPOINTER": '{"ttl": {"strategy": "delete", "default_ttl": 1}}'},
    ],
)
def test_an_engine_set_to_sweep_threads_by_a_timer_does_not_serve(environ: dict[str, str]) -> None:
    with pytest.raises(EngineMisconfigured, match="unset it"):
        refuse_thread_ttl(environ)


def test_an_engine_config_file_with_a_thread_ttl_does_not_serve(tmp_path: Path) -> None:
    config = tmp_path / "aegra.json"
    config.write_text(json.dumps({"checkpointer": {"ttl": {"default_ttl": 5}}}))
    with pytest.raises(EngineMisconfigured, match=r"AEGRA_CONFIG's checkpointer\.ttl"):
        refuse_thread_ttl({"AEGRA_CONFIG": str(config)})
    config.write_text(json.dumps({"checkpointer": {}}))
    refuse_thread_ttl({"AEGRA_CONFIG": str(config)})  # no ttl: served


def test_the_server_refuses_to_start_with_a_thread_ttl_in_one_line() -> None:
    """The auth module every engine loads first says so, in one line, and does not load."""
    env = {**os.environ, "AEGRA_THREAD_TTL": "5", "LOOPWRIGHT_DEV_TOKENS": "1"}
    loaded = subprocess.run(
        [sys.executable, "-c", "import loopwright.server.auth"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode != 0
    assert "AEGRA_THREAD_TTL: the engine would delete or compact threads" in loaded.stderr


def test_a_run_the_engine_refuses_after_the_edge_holds_its_thread_no_longer(
    engine: Engine,
) -> None:
    """The edge admits a run (one at a time on a thread), then the engine refuses it (an
    assistant it does not have): the admission is withdrawn with the refusal, so the next
    request on the thread is admitted at once rather than told the thread is busy."""
    create_order(engine.served.services, "O-2103", "u-1", "20.00")
    thread_id = engine.served.client("t-u1").threads.create()["thread_id"]
    task = {"task": "Check whether order O-2103 can be refunded and refund it if so."}
    refused = engine.post(
        "t-u1", f"/threads/{thread_id}/runs", {"assistant_id": "no-such-assistant", "input": task}
    )
    assert refused.status_code in (404, 422), refused.text
    started = engine.post(
        "t-u1", f"/threads/{thread_id}/runs/wait", {"assistant_id": GRAPH, "input": task}
    )
    assert started.status_code == 200, started.text
    assert values_of(engine.served.client("t-u1"), thread_id)["stop_reason"] == "completed"


def raw_status(url: str, request: bytes) -> int | None:
    """The status a server answers a request of exactly these bytes with (None: it closed the
    connection without one, which refuses the request as surely)."""
    address = httpx.URL(url)
    with socket.create_connection((address.host, address.port or 80), timeout=PATIENCE_S) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            answer += chunk
    return int(answer.split(b" ", 2)[1])


# Bytes no well-behaved client sends: not UTF-8, half a character, NUL, controls, a lone
# surrogate's UTF-8 spelling, an overlong encoding, a bidi override, a very long run.
BAD_BYTES = (
    b"\xff\xfe",
    b"\x80",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\x00",
    b"\x1b[2J",
    b"\xe2\x80\xae",
)


def bad_requests(rng: random.Random, token: bytes) -> Iterator[bytes]:
    """Requests to every route of the edge's table (and to none), each with bad bytes in one
    place: the path, the query, a header's name or value, the bearer token, or the body."""
    from loopwright.server.edge.routes import ROUTES

    for route in ROUTES:
        path = re.sub(
            rb"\{\w+\}",
            lambda _: rng.choice([b"x", b"%ff", b"%00", b"a" * 300]),
            route.template.encode(),
        )
        bad = rng.choice(BAD_BYTES)
        body = rng.choice(
            [b'{"metadata": {"a": "' + bad + b'"}}', bad * 10, b'{"task": "\\ud800"}']
        )
        where = rng.choice(["path", "query", "name", "value", "token", "body"])
        target = path + (b"/%ff" + bad.hex().encode() if where == "path" else b"")
        if where == "query":
            target += b"?limit=" + bad + b"&limit=%ff"
        headers = [
            b"Host: x",
            b"Authorization: Bearer " + (token + bad if where == "token" else token),
        ]
        if where == "name":
            headers.append(b"X-" + bad + b": 1")
        if where == "value":
            headers.append(b"Accept: text/" + bad)
        payload = body if where == "body" or route.method in ("POST", "PUT", "PATCH") else b""
        headers.append(b"Content-Length: %d" % len(payload))
        yield b"%s %s HTTP/1.1\r\n%s\r\nConnection: close\r\n\r\n%s" % (
            route.method.encode(),
            target,
            b"\r\n".join(headers),
            payload,
        )


def test_bad_bytes_anywhere_are_a_4xx_on_every_route(engine: Engine) -> None:
    """Every route of the edge's table (probes and the inbox included), and a route of none,
    with bad bytes in one place each, with a token and without: a 4xx or a closed connection
    every time, never a 5xx, and the server answers as before."""
    rng = random.Random(54)
    failures = []
    for token in (b"t-u1", b"t-a1", b""):
        for request in [*bad_requests(rng, token), b"GET /%ff\xff HTTP/1.1\r\nHost: x\r\n\r\n"]:
            status = raw_status(engine.served.url, request)
            if status is not None and status >= 500:
                failures.append((status, request[:200]))
    assert not failures, failures
    live = httpx.get(f"{engine.served.url}/live", verify=tls.context())
    assert live.status_code == 200
