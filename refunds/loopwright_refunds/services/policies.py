"""The policies service: versioned refund policy documents.

Documents are never edited in place: publishing creates the next version, so a decision can
cite the exact text it relied on. The text is untrusted business data, and tests publish
versions carrying injected instructions to prove the runtime treats it as such.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel, Field

from loopwright_refunds.services.errors import ServiceError, install_error_handlers
from loopwright_refunds.services.money import format_cents, to_cents
from loopwright_refunds.services.storage import open_database, transaction, utc_now

SCHEMA = """
CREATE TABLE IF NOT EXISTS policies (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    window_days INTEGER NOT NULL,
    requires_delivery INTEGER NOT NULL,
    approval_threshold_cents INTEGER NOT NULL,
    text TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
"""

SEED_TEXT = (
    "Refund policy v1. A delivered order may be refunded up to its refundable balance within "
    "30 days of delivery. Refunds over 50.00 need a human approver."
)


class Policy(BaseModel):
    name: str
    version: int
    window_days: int
    requires_delivery: bool
    approval_threshold: str
    text: str
    created_at: str


class PolicyDraft(BaseModel):
    """The next version of a policy; omitted fields are copied from the latest version."""

    window_days: int | None = Field(default=None, ge=0)
    requires_delivery: bool | None = None
    approval_threshold: Decimal | None = Field(default=None, ge=0)
    text: str


class PoliciesStore:
    def __init__(self, db_path: Path) -> None:
        self._db = open_database(db_path, SCHEMA)
        with transaction(self._db) as db:
            if not db.execute("SELECT 1 FROM policies LIMIT 1").fetchone():
                db.execute(
                    "INSERT INTO policies VALUES ('refunds', 1, 30, 1, 5000, ?, ?)",
                    (SEED_TEXT, utc_now().isoformat()),
                )

    def close(self) -> None:
        self._db.close()

    def latest(self, name: str) -> Policy:
        return self._one(
            "SELECT * FROM policies WHERE name = ? ORDER BY version DESC LIMIT 1", name
        )

    def version(self, name: str, version: int) -> Policy:
        return self._one("SELECT * FROM policies WHERE name = ? AND version = ?", name, version)

    def publish(self, name: str, draft: PolicyDraft) -> Policy:
        with transaction(self._db) as db:
            latest = self.latest(name)
            threshold = (
                latest.approval_threshold
                if draft.approval_threshold is None
                else draft.approval_threshold
            )
            db.execute(
                "INSERT INTO policies VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    latest.version + 1,
                    latest.window_days if draft.window_days is None else draft.window_days,
                    latest.requires_delivery
                    if draft.requires_delivery is None
                    else draft.requires_delivery,
                    to_cents(threshold),
                    draft.text,
                    utc_now().isoformat(),
                ),
            )
        return self.version(name, latest.version + 1)

    def _one(self, query: str, name: str, *params: object) -> Policy:
        row = self._db.execute(query, (name, *params)).fetchone()
        if row is None:
            raise ServiceError(404, "policy_not_found", f"no such version of policy {name!r}")
        return _to_policy(row)


def _to_policy(row: sqlite3.Row) -> Policy:
    return Policy(
        name=row["name"],
        version=row["version"],
        window_days=row["window_days"],
        requires_delivery=bool(row["requires_delivery"]),
        approval_threshold=format_cents(row["approval_threshold_cents"]),
        text=row["text"],
        created_at=row["created_at"],
    )


def create_app(db_path: Path) -> FastAPI:
    """The policies app on `db_path`, seeded with version 1 of the "refunds" policy once."""
    store = PoliciesStore(db_path)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="policies", lifespan=lifespan)
    install_error_handlers(app)

    @app.get("/policies/{name}")
    async def get_latest(name: str) -> Policy:
        return store.latest(name)

    @app.get("/policies/{name}/versions/{version}")
    async def get_version(name: str, version: int) -> Policy:
        return store.version(name, version)

    @app.post("/admin/policies/{name}")
    async def publish(name: str, draft: PolicyDraft) -> Policy:
        return store.publish(name, draft)

    return app
