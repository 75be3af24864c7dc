"""Who may start a run now, on either engine's record (`server.admissions`): one run per
thread, a bound per principal, a wake-up bounded by its thread only; on the engine's record
(Postgres, beside a table shaped as Aegra's runs), what holds a place and what frees it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loopwright.checkpoints.leases import LeaseStore, open_lease_store
from loopwright.server.admissions import (
    PER_PRINCIPAL,
    EngineAdmissions,
    Refusal,
    ThreadAdmissions,
    per_principal_from_env,
)

U1, U2 = ("default", "u-1"), ("default", "u-2")
BANK_B_U1 = ("bank-b", "u-1")  # the same user id in another tenant: another principal


@pytest.fixture
def leases(postgres_url: str) -> Iterator[LeaseStore]:
    with open_lease_store(postgres_url) as store:
        # Aegra's record of runs, as `aegra_api.core.orm.Run` keeps it (the columns read).
        store.db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, thread_id TEXT, status TEXT)")
        yield store


@pytest.fixture(params=["memory", pytest.param("engine", marks=pytest.mark.postgres)])
def admissions(request: pytest.FixtureRequest) -> ThreadAdmissions | EngineAdmissions:
    if request.param == "memory":
        return ThreadAdmissions()
    leases: LeaseStore = request.getfixturevalue("leases")
    return EngineAdmissions(leases.db)


def test_one_run_per_thread_and_a_bound_per_principal(
    admissions: ThreadAdmissions | EngineAdmissions,
) -> None:
    for n in range(PER_PRINCIPAL):
        assert admissions.admit(f"t-{n}", U1) is None
    assert admissions.admit("t-0", U2) is Refusal.THREAD_BUSY  # whoever asks
    assert admissions.admit("t-new", U1) is Refusal.PRINCIPAL_FULL
    assert admissions.admit("t-new", U2) is None  # another principal has room
    assert admissions.admit("t-other-tenant", BANK_B_U1) is None
    # A wake-up (the server continuing a run) is bounded by its thread only.
    assert admissions.admit("t-parked", U1, bounded=False) is None
    assert admissions.admit("t-0", U1, bounded=False) is Refusal.THREAD_BUSY
    admissions.ended("t-0")
    assert admissions.admit("t-0", U2) is None  # the thread is free; u-2 has room


@pytest.mark.postgres
def test_the_engine_record_holds_a_place_while_the_run_is_queued_running_or_leased(
    leases: LeaseStore,
) -> None:
    """An admission frees its thread once the engine neither holds its run queued or running
    nor anyone holds its lease, after the moment between the hook and the engine's record
    (aged here by hand): a run the engine refused after the hook frees it then."""
    record = EngineAdmissions(leases.db, per_principal=1)
    db = leases.db

    def age(thread_id: str) -> None:
        db.execute(
            "UPDATE lw_admissions SET admitted_at = now() - interval '1 hour' WHERE thread_id = %s",
            (thread_id,),
        )

    assert record.admit("t-1", U1) is None
    age("t-1")  # never recorded by the engine: refused after the hook
    assert record.admit("t-2", U1) is None  # u-1's place is free again
    assert record.admit("t-1", U1) is Refusal.PRINCIPAL_FULL

    db.execute("INSERT INTO runs VALUES ('r-2', 't-2', 'pending')")
    age("t-2")
    assert record.admit("t-2", U2) is Refusal.THREAD_BUSY  # queued on the engine
    assert record.admit("t-3", U1) is Refusal.PRINCIPAL_FULL
    db.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = 'r-2'")
    # Waits for a person: holds no place, its thread takes a decision.
    assert record.admit("t-2", U2) is None

    # A run another instance took again (re-queued) holds its lease: its thread is busy.
    _, lease = leases.begin("t-4", "instance-1", 30, task="x", user_id="u-3")
    assert lease is not None
    assert record.admit("t-4", U2) is Refusal.THREAD_BUSY
    leases.release(lease)
    age("t-2")
    assert record.admit("t-4", U2) is None


def test_the_engine_s_bound_is_the_operator_s_to_set() -> None:
    assert per_principal_from_env({}) == PER_PRINCIPAL
    assert per_principal_from_env({"LOOPWRIGHT_RUNS_PER_PRINCIPAL": " 12 "}) == 12
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ValueError, match="LOOPWRIGHT_RUNS_PER_PRINCIPAL"):
            per_principal_from_env({"LOOPWRIGHT_RUNS_PER_PRINCIPAL": bad})
