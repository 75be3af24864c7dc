"""Store credit: a write with no idempotency key, the kind of downstream many systems still are.

`POST /credits` adds an entry to a customer's credit ledger and answers the new balance; sending
it twice credits twice. A request may carry a `Request-Deadline` (an ISO timestamp): one that
arrives after it, or is held up past it, is refused (409 `deadline_passed`) and applies nothing,
which is what lets a caller send again safely once the deadline has passed. What it offers instead is a readable state with a version that moves on
every change (`GET /credits/{user_id}`), which is enough for a caller that recorded the state
before writing (a pre-image) to tell afterwards whether its write was applied. It shares the
payments service's fault switch, so the same failures can be injected.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from fastapi import APIRouter, Header
from pydantic import BaseModel

from loopwright_refunds.services.errors import ServiceError
from loopwright_refunds.services.faults import FaultSwitch
from loopwright_refunds.services.money import format_cents, to_cents
from loopwright_refunds.services.storage import open_database, transaction, utc_now

SCHEMA = """
CREATE TABLE IF NOT EXISTS credit_entries (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    note TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS credit_entries_by_user ON credit_entries (user_id);
"""


class CreditRequest(BaseModel):
    user_id: str
    amount: Decimal
    currency: str
    note: str = ""


class CreditEntry(BaseModel):
    entry_id: int
    amount: str
    currency: str
    note: str


class CreditAccount(BaseModel):
    user_id: str
    balance: str
    version: int  # the number of entries: moves on every change
    entries: list[CreditEntry]


def credits_router(db_path: Path, faults: FaultSwitch) -> APIRouter:
    db = open_database(db_path, SCHEMA)

    @asynccontextmanager
    async def lifespan(_: APIRouter) -> AsyncIterator[None]:
        yield
        db.close()  # the app stops: no handle outlives it in a process that serves on

    router = APIRouter(lifespan=lifespan)

    def account(user_id: str) -> CreditAccount:
        rows = db.execute(
            "SELECT entry_id, amount_cents, currency, note FROM credit_entries"
            " WHERE user_id = ? ORDER BY entry_id",
            (user_id,),
        ).fetchall()
        entries = [
            CreditEntry(
                entry_id=r["entry_id"],
                amount=format_cents(r["amount_cents"]),
                currency=r["currency"],
                note=r["note"],
            )
            for r in rows
        ]
        total = sum(r["amount_cents"] for r in rows)
        return CreditAccount(
            user_id=user_id, balance=format_cents(total), version=len(entries), entries=entries
        )

    @router.post("/credits", status_code=201)
    async def add_credit(
        request: CreditRequest, deadline: str | None = Header(None, alias="Request-Deadline")
    ) -> CreditAccount:
        cents = to_cents(request.amount)
        if cents <= 0:
            raise ServiceError(422, "invalid_amount", "a credit must be positive")
        fault = faults.take()
        if fault.mode == "fail_before_commit":
            raise ServiceError(500, "internal_error", "injected fault: failed before commit")
        if fault.mode == "latency":  # held up on the way: it may arrive after its deadline
            await asyncio.sleep(fault.delay_s)
        if deadline is not None and utc_now() > datetime.fromisoformat(deadline):
            raise ServiceError(409, "deadline_passed", f"arrived after its deadline {deadline}")
        with transaction(db):
            db.execute(
                "INSERT INTO credit_entries (user_id, amount_cents, currency, note, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (request.user_id, cents, request.currency, request.note, utc_now().isoformat()),
            )
        if fault.mode == "accept_then_timeout":
            await asyncio.sleep(fault.delay_s)
        return account(request.user_id)

    @router.get("/credits/{user_id}")
    async def get_credit(user_id: str) -> CreditAccount:
        return account(user_id)

    return router
