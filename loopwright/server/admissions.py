"""One run at a time on a thread, none queued behind it, and a bound per principal, on every
engine.

`langgraph dev` runs `RUN_SLOTS` runs at once (`loopwright serve` asks for them: its own
default is one), starts queued runs oldest first, and looks past none whose thread is busy. Its
default multitask strategy is `enqueue`, decided before the auth hook is called: so one client's
second run on a thread with a run in flight would sit at the head of the queue and hold up every
other user's runs and every approver's decision until the first one ended. Aegra ignores the
multitask strategy and starts every run it is given: a second run on a busy thread takes one of
the instance's job slots and waits there for loopwright's lease, so a client sending many would
fill the slots everyone shares.

The auth hook therefore admits a run on a thread only while no other is admitted there, and no
more than `PER_PRINCIPAL` runs of one principal at once (so no principal fills the slots
everyone shares: a 429 past it), and the served graph says when an admitted run ends. A run
admitted but never started (cancelled while pending, refused by the server after the hook) stops
counting after `UNSTARTED_S`.

On LangGraph's server (one process) the record is in memory (`ThreadAdmissions`); on Aegra it is
in the database the instances share (`EngineAdmissions`), so the bound holds across instances
and an instance that dies cannot hold anyone's place: a run counts while it holds a live lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from psycopg import sql

from loopwright.checkpoints.sql import Database

# How long a run admitted on a thread may take to start before another may be admitted there.
UNSTARTED_S = 10.0
# Runs `langgraph dev` runs at once, and how many of them one principal may hold.
RUN_SLOTS = 10
PER_PRINCIPAL = 3
# On an engine of many instances (more slots), the operator may allow one principal more.
PER_PRINCIPAL_ENV = "LOOPWRIGHT_RUNS_PER_PRINCIPAL"


def per_principal_from_env(environ: Mapping[str, str]) -> int:
    """LOOPWRIGHT_RUNS_PER_PRINCIPAL, or `PER_PRINCIPAL`; ValueError naming the variable for a
    value that is not a whole number from 1 up."""
    raw = (environ.get(PER_PRINCIPAL_ENV) or "").strip()
    if not raw:
        return PER_PRINCIPAL
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(
            f"{PER_PRINCIPAL_ENV}={raw!r}: how many runs one user may have in flight"
            " is a whole number from 1 up"
        )
    return int(raw)


class Refusal(Enum):
    THREAD_BUSY = "a run is admitted on the thread and has not ended"
    PRINCIPAL_FULL = "the principal holds as many runs as one may"


@dataclass
class _Admission:
    principal: tuple[str, str]  # (tenant, user)
    at: float
    started: bool = False

    def holds(self, now: float, unstarted_s: float) -> bool:
        return self.started or now - self.at < unstarted_s


class ThreadAdmissions:
    """The runs this server process has admitted, by thread, until each ends."""

    def __init__(
        self, unstarted_s: float = UNSTARTED_S, per_principal: int = PER_PRINCIPAL
    ) -> None:
        self.unstarted_s = unstarted_s
        self.per_principal = per_principal
        self._lock = threading.Lock()
        self._admitted: dict[str, _Admission] = {}

    def admit(
        self, thread_id: str, principal: tuple[str, str], *, bounded: bool = True
    ) -> Refusal | None:
        """Admit a run of `principal` (tenant, user) on the thread, or say why not; a run not
        `bounded` (the server continuing one it admitted before) is refused for a busy thread
        only."""
        now = time.monotonic()
        with self._lock:
            held = self._admitted.get(thread_id)
            if held is not None and held.holds(now, self.unstarted_s):
                return Refusal.THREAD_BUSY
            holding = sum(
                a.principal == principal and a.holds(now, self.unstarted_s)
                for a in self._admitted.values()
            )
            if bounded and holding >= self.per_principal:
                return Refusal.PRINCIPAL_FULL
            self._admitted[thread_id] = _Admission(principal, now)
            return None

    def started(self, thread_id: str) -> None:
        with self._lock:
            if (held := self._admitted.get(thread_id)) is not None:
                held.started = True

    def ended(self, thread_id: str) -> None:
        with self._lock:
            self._admitted.pop(thread_id, None)


admissions = ThreadAdmissions()


# Aegra's own record of runs (aegra_api.core.orm.Run): thread_id, status.
_ENGINE_RUNS = "runs"
# The gap between the hook's admission and the engine's record of the run it admitted (the same
# request, milliseconds apart); a run the engine refuses after the hook holds its thread no longer.
RECORDING_S = 2.0
# An admission holds while it is new (the engine has not recorded its run yet), while the engine
# has a run on its thread queued or running (on any instance), or while that run holds a live
# lease (an attempt the engine re-queued); the served graph deletes it as the run's attempt ends,
# so a thread waiting for a person holds nobody's place.
_HOLDS = f"""(a.admitted_at > now() - make_interval(secs => {RECORDING_S})
    OR EXISTS (SELECT 1 FROM {_ENGINE_RUNS} e WHERE e.thread_id = a.thread_id
        AND e.status IN ('pending', 'running'))
    OR EXISTS (SELECT 1 FROM lw_runs r WHERE r.run_id = a.thread_id AND r.owner IS NOT NULL
        AND r.lease_expires_at > now()))"""
# One admission: locks on the thread and the principal (held to COMMIT, so a second instance's
# admission waits, then reads this one), then the verdict and, if it is none, the admission, in
# one statement. The thread is busy while it holds an admission (as `_HOLDS` says, with the
# thread's own run read directly: one that began without an admission, re-queued or from before
# this record, keeps it busy too).
_ADMIT = f"""BEGIN;
SELECT pg_advisory_xact_lock(hashtext('lw_admissions.thread'), hashtext({{thread}})),
    pg_advisory_xact_lock(hashtext('lw_admissions.principal'), hashtext({{principal}}));
WITH verdict AS (SELECT CASE
    WHEN EXISTS (SELECT 1 FROM lw_admissions WHERE thread_id = {{thread}}
            AND admitted_at > now() - make_interval(secs => {RECORDING_S}))
        OR EXISTS (SELECT 1 FROM {_ENGINE_RUNS} WHERE thread_id = {{thread}}
            AND status IN ('pending', 'running'))
        OR EXISTS (SELECT 1 FROM lw_runs WHERE run_id = {{thread}} AND owner IS NOT NULL
            AND lease_expires_at > now())
        THEN '{{busy}}'
    WHEN {{bound}} IS NOT NULL AND (SELECT count(*) FROM lw_admissions a WHERE a.tenant = {{tenant}}
            AND a.user_id = {{user}} AND {_HOLDS}) >= {{bound}}
        THEN '{{full}}'
    ELSE '' END AS refusal),
admitted AS (INSERT INTO lw_admissions (thread_id, tenant, user_id, admitted_at)
    SELECT {{thread}}, {{tenant}}, {{user}}, now() FROM verdict WHERE refusal = ''
    ON CONFLICT (thread_id) DO UPDATE SET tenant = excluded.tenant,
        user_id = excluded.user_id, admitted_at = excluded.admitted_at)
SELECT refusal FROM verdict;
COMMIT;"""


class EngineAdmissions:
    """The same rules as `ThreadAdmissions` across the instances of Aegra, recorded in
    lw_admissions beside the engine's own runs table; each admission is one transaction holding
    advisory locks on the thread and the principal, so two instances cannot both admit past a
    rule, sent as one batch: one round trip (a run's creation waits for it, and each round trip
    of a thread in a busy process waits for the interpreter too). A served run's id is its
    thread's, so its lease in lw_runs says whether it runs."""

    def __init__(self, db: Database, per_principal: int = PER_PRINCIPAL) -> None:
        self.db = db
        self.per_principal = per_principal

    def admit(
        self, thread_id: str, principal: tuple[str, str], *, bounded: bool = True
    ) -> Refusal | None:
        """As `ThreadAdmissions.admit`."""
        tenant, user_id = principal
        statements = sql.SQL(_ADMIT).format(
            thread=sql.Literal(thread_id),
            principal=sql.Literal(f"{tenant}/{user_id}"),
            tenant=sql.Literal(tenant),
            user=sql.Literal(user_id),
            bound=sql.Literal(self.per_principal if bounded else None),
            busy=sql.SQL(Refusal.THREAD_BUSY.name),
            full=sql.SQL(Refusal.PRINCIPAL_FULL.name),
        )
        [row] = self.db.batch(statements)
        return Refusal[row["refusal"]] if row["refusal"] else None

    def started(self, thread_id: str) -> None:
        """Nothing to note: a run that started holds its lease, which is what counts here."""

    def ended(self, thread_id: str) -> None:
        """The run's attempt on the thread ended (it ran out, waits for a person, or stopped)."""
        self.db.write("DELETE FROM lw_admissions WHERE thread_id = %s", (thread_id,))
