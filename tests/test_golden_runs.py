"""Golden runs: runs parked by a release, replayed against the code of every later one.

Each folder under tests/fixtures/runs/ (one per release that made it) holds SQL dumps of a
run database and of the reference services' data, with runs parked where a deploy is most
likely to meet them:

* `golden-approval`  waits for a person to approve a 100.00 refund;
* `golden-unknown`   its process was killed right after payments applied a 30.00 refund
                     (`executor:after_send`): DISPATCHED in the journal, no outcome;
* `golden-parked`    its refund was still processing at payments: parked reconciliation.

Replayed by today's code, each ends verified with exactly one refund: the approval executes
the action it names, the unknown write is reconciled (never re-sent), the parked one settles.
A release that can no longer finish them must say so by a migration, not break them. The
current release's folder is written with `LOOPWRIGHT_WRITE_GOLDEN=1 pytest tests/test_golden_runs.py`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_SINGLE_ARG, JsonPlusSerializer

import loopwright
from loopwright import open_runner
from loopwright_refunds.agent import SubmitRefundArgs, connect
from loopwright_refunds.services.admin import create_order, list_refunds, set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import start_services
from tests.golden_agent import agent as golden_agent
from tests.runtime_fixtures import DEMO_TASK, cli, principal

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
SERVICE_FILES = ("orders", "policies", "payments")
PARKED_TASK = "Check whether order O-811 can be refunded and refund it if so."
UNKNOWN_TASK = "Check whether order O-43 can be refunded and refund it if so."
GOLDEN_AGENT = "tests.golden_agent:agent"


def dump(database: Path, target: Path) -> None:
    with sqlite3.connect(database) as db:
        target.write_text("\n".join(db.iterdump()) + "\n")


def restore(dumped: Path, database: Path) -> None:
    with sqlite3.connect(database) as db:
        db.executescript(dumped.read_text())


def deliveries_as_of_now(runs: Path, orders: Path) -> None:
    """Move the orders' delivery dates forward by the time since the runs were parked, so that
    a replay meets each order as old as the parked run knew it. Whether a refund still fits its
    window is the calendar's business, not what a replay tests (like the golden agent's approval
    expiry and deadline): a release must finish its runs on any day, not only for 30 days."""
    with closing(sqlite3.connect(runs)) as db:
        (parked_at,) = db.execute("SELECT max(updated_at) FROM lw_runs").fetchone()
    elapsed = datetime.now(UTC) - datetime.fromisoformat(parked_at)
    with closing(sqlite3.connect(orders)) as db, db:
        delivered = db.execute(
            "SELECT order_id, delivered_at FROM orders WHERE delivered_at IS NOT NULL"
        ).fetchall()
        db.executemany(
            "UPDATE orders SET delivered_at = ? WHERE order_id = ?",
            [
                ((datetime.fromisoformat(at) + elapsed).isoformat(), order)
                for order, at in delivered
            ],
        )


@pytest.mark.skipif(
    not os.environ.get("LOOPWRIGHT_WRITE_GOLDEN"), reason="writes golden runs on request"
)
def test_write_golden_runs(tmp_path: Path) -> None:
    folder = FIXTURES / f"v{loopwright.__version__}"
    database = tmp_path / "loopwright.sqlite3"
    url = f"sqlite:///{database}"
    env = {"LOOPWRIGHT_HOME": str(tmp_path / "home")}
    with start_services(tmp_path / "services") as running:
        services = running.endpoints
        create_order(services, "O-811", "u-1", "20.00")
        with connect(services) as deps, open_runner(url, golden_agent, deps=deps) as runner:
            waiting = runner.start(DEMO_TASK, principal(), run_id="golden-approval")
            assert waiting.phase == "WAITING_APPROVAL"
            set_fault(services, "processing", delay_s=1)
            parked = runner.start(PARKED_TASK, principal(task=PARKED_TASK), run_id="golden-parked")
            assert parked.phase == "RECONCILING"
        crashed = cli(
            *("run", UNKNOWN_TASK, "--user", "u-1", "--run-id", "golden-unknown"),
            *("--db", url, "--agent", GOLDEN_AGENT),
            env={**services.to_env(), **env, "LOOPWRIGHT_CRASH_AT": "executor:after_send"},
        )
        assert crashed.returncode == 137, crashed.stderr
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    dump(database, folder / "loopwright.sql")
    for name in SERVICE_FILES:
        dump(tmp_path / "services" / f"{name}.sqlite3", folder / f"{name}.sql")
    made = {"release": loopwright.__version__, "agent": GOLDEN_AGENT}
    (folder / "made.json").write_text(json.dumps(made, indent=1) + "\n")


@pytest.fixture(params=sorted(p.name for p in FIXTURES.iterdir()) if FIXTURES.exists() else [])
def golden(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, ServiceEndpoints]]:
    """A release's parked runs, restored into a database and services of their own."""
    folder = FIXTURES / request.param
    database = tmp_path / "loopwright.sqlite3"
    restore(folder / "loopwright.sql", database)
    data = tmp_path / "services"
    data.mkdir()
    for name in SERVICE_FILES:
        restore(folder / f"{name}.sql", data / f"{name}.sqlite3")
    deliveries_as_of_now(database, data / "orders.sqlite3")
    with start_services(data) as running:
        yield f"sqlite:///{database}", running.endpoints


def test_a_release_can_finish_the_runs_an_earlier_one_parked(
    golden: tuple[str, ServiceEndpoints],
) -> None:
    url, services = golden
    with connect(services) as deps, open_runner(url, golden_agent, deps=deps, lease_wait_s=5) as r:
        approved = r.decide("golden-approval", "approve", "a-1")
        unknown = r.resume("golden-unknown")
        parked = r.resume("golden-parked")
        events = [e.to_status for a in unknown.actions for e in r.journal.events(a.action_id)]
    for outcome in (approved, unknown, parked):
        assert outcome.stop_reason == "completed", (outcome.run_id, outcome.stop_detail)
        assert (outcome.verification or {}).get("verified") is True
    assert [r["amount"] for r in list_refunds(services, "O-42")] == ["100.00"]
    assert [r["amount"] for r in list_refunds(services, "O-43")] == ["30.00"]  # never re-sent
    assert [r["status"] for r in list_refunds(services, "O-811")] == ["succeeded"]
    assert "UNKNOWN" in events and "RECONCILING" in events


def without(tool: str) -> loopwright.Agent[Any]:
    return golden_agent.replace(tools=[t for t in golden_agent.tools if t.name != tool])


class SubmitRefundWithChannel(SubmitRefundArgs):
    """The next release's arguments: a refund now names the channel it is paid through."""

    channel: str


def test_a_decision_saved_under_a_changed_contract_is_checked_again_before_anything_is_sent(
    golden: tuple[str, ServiceEndpoints],
) -> None:
    url, services = golden
    submit = golden_agent.tools.get("submit_refund")
    assert submit is not None
    changed = dataclasses.replace(submit, args_model=SubmitRefundWithChannel)
    assert changed.schema_hash != submit.schema_hash
    deployed = golden_agent.replace(
        tools=[changed if t.name == "submit_refund" else t for t in golden_agent.tools]
    )
    with connect(services) as deps, open_runner(url, deployed, deps=deps) as runner:
        outcome = runner.decide("golden-approval", "approve", "a-1")
        [action] = outcome.actions
    assert action.status == "REJECTED"
    assert (action.outcome or {})["error"]["code"] == "invalid_arguments"
    assert list_refunds(services, "O-42") == []


def test_a_tool_gone_since_the_decision_refuses_it_and_its_unknown_write_goes_to_a_person(
    golden: tuple[str, ServiceEndpoints],
) -> None:
    url, services = golden
    deployed = without("submit_refund")
    with connect(services) as deps, open_runner(url, deployed, deps=deps, lease_wait_s=5) as r:
        approved = r.decide("golden-approval", "approve", "a-1")
        unknown = r.resume("golden-unknown")
    [refused] = approved.actions
    assert (refused.outcome or {})["error"]["code"] == "unknown_tool"
    assert list_refunds(services, "O-42") == []
    assert unknown.stop_reason == "needs_human"
    [escalated] = unknown.actions
    assert escalated.status == "ESCALATED"
    assert [r["amount"] for r in list_refunds(services, "O-43")] == ["30.00"]


def importable(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def unimportable_types_read(read: Callable[[], object]) -> tuple[set[tuple[str, str]], object]:
    """The types of their own (not LangGraph's safe ones) that the values `read` decodes name,
    those of them that do not import today, and what `read` returned. LangGraph's serializer
    stores a model, an enum or a dataclass by its module and class, and reads a name that no
    longer imports back as raw data, without an error: a module moved without its old path
    would change a saved run quietly."""
    named: set[tuple[str, str]] = set()

    def heard(event: SerdeEvent) -> None:
        named.add((event["module"], event["name"]))

    stop = register_serde_event_listener(heard)
    try:
        result = read()
    finally:
        stop()
    return {(module, name) for module, name in named if not importable(module, name)}, result


def test_every_type_a_release_stored_in_its_checkpoints_imports_today(
    golden: tuple[str, ServiceEndpoints],
) -> None:
    """Every checkpoint and pending write of the release's runs is read through the runtime's
    saver (its whole history, both layouts), and every type the values name imports."""
    url, services = golden

    def history() -> list[Any]:
        with connect(services) as deps, open_runner(url, golden_agent, deps=deps) as runner:
            return [
                snapshot
                for run_id in ("golden-approval", "golden-unknown", "golden-parked")
                for snapshot in runner.graph.get_state_history(runner.config(run_id))
            ]

    missing, snapshots = unimportable_types_read(history)
    assert missing == set()
    assert isinstance(snapshots, list) and len(snapshots) > 10
    # The values were decoded, not handed back raw: the model's decisions are messages again.
    assert any(
        isinstance(message, AIMessage) and message.tool_calls
        for snapshot in snapshots
        for message in snapshot.values.get("history", [])
    )


def test_a_stored_type_whose_module_moved_is_found() -> None:
    """The check above can fail: a value naming a class by a module path that is gone (here a
    stop reason, as if stored by a release whose state types lived in `graph/`) is read back
    raw by LangGraph, and named by the check."""
    moved = ormsgpack.packb(("loopwright.graph.state", "StopReason", "completed"))
    stored = ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, moved))
    missing, value = unimportable_types_read(
        lambda: JsonPlusSerializer().loads_typed(("msgpack", stored))
    )
    assert value == "completed"  # raw, not a StopReason: nothing else would have told
    assert missing == {("loopwright.graph.state", "StopReason")}
