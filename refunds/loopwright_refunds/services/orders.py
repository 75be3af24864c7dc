"""The orders service: customers, their orders, and each order's refundable balance.

Only the payments service moves a balance (``POST /orders/{id}/refunds``), idempotently by the
refund's key, so a payments retry can never refund an order twice. ``/admin/...`` lets tests
create orders and change an order behind the runtime's back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from loopwright_refunds.services.errors import ServiceError, install_error_handlers
from loopwright_refunds.services.money import format_cents, to_cents
from loopwright_refunds.services.storage import open_database, transaction, utc_now

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    user_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    roles TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    refunded_cents INTEGER NOT NULL,
    delivered_at TEXT,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS applied_refunds (
    refund_key TEXT PRIMARY KEY,
    refund_id TEXT NOT NULL,
    order_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    applied_at TEXT NOT NULL
);
"""

SEED_USERS = [
    ("u-1", "Ada", "customer"),
    ("u-2", "Bo", "customer"),
    ("a-1", "Ann Approver", "approver"),
    ("a-2", "Al Approver", "approver"),
]

# (order_id, owner, amount_cents, delivered how many days before seeding; None = not delivered)
SEED_ORDERS: list[tuple[str, str, int, int | None]] = [
    ("O-42", "u-1", 10_000, 10),
    ("O-43", "u-1", 3_000, 5),
    ("O-44", "u-1", 8_000, 90),
    ("O-45", "u-1", 6_000, None),
    ("O-46", "u-1", 100_000, 3),
    ("O-47", "u-1", 12_000, 4),
    ("O-99", "u-2", 1_000_000, 2),
]


class User(BaseModel):
    user_id: str
    name: str
    roles: list[str]


class Order(BaseModel):
    order_id: str
    owner: str
    status: str
    amount: str
    currency: str
    refunded: str
    refundable: str
    delivered_at: str | None
    version: int


class AppliedRefund(BaseModel):
    """Sent by payments once it has committed a refund."""

    refund_key: str
    refund_id: str
    amount: Decimal


class OrderChange(BaseModel):
    """Admin edit; fields left out stay as they are (``delivered_at: null`` clears it)."""

    status: str | None = None
    amount: Decimal | None = None
    delivered_at: datetime | None = None
    owner: str | None = None


def _a_day_ago() -> datetime:
    return utc_now() - timedelta(days=1)


class NewOrder(BaseModel):
    """Admin creation of an order, by default one that is refundable now (delivered yesterday).

    Benchmarks and tests need many orders beyond the seeded ones; ``delivered_at: null`` creates
    one without a delivery date.
    """

    order_id: str
    owner: str
    amount: Decimal
    currency: str = "USD"
    status: str = "delivered"
    delivered_at: datetime | None = Field(default_factory=_a_day_ago)


class OrdersStore:
    def __init__(self, db_path: Path) -> None:
        self._db = open_database(db_path, SCHEMA)
        self._seed()

    def close(self) -> None:
        self._db.close()

    def _seed(self) -> None:
        with transaction(self._db) as db:
            if db.execute("SELECT 1 FROM users LIMIT 1").fetchone():
                return
            db.executemany("INSERT INTO users VALUES (?, ?, ?)", SEED_USERS)
            now = utc_now()
            db.executemany(
                "INSERT INTO orders VALUES (?, ?, ?, ?, 'USD', 0, ?, 1)",
                [
                    (
                        order_id,
                        owner,
                        "shipped" if days is None else "delivered",
                        cents,
                        None if days is None else (now - timedelta(days=days)).isoformat(),
                    )
                    for order_id, owner, cents, days in SEED_ORDERS
                ],
            )

    def user(self, user_id: str) -> User:
        row = self._db.execute("SELECT * FROM users WHERE user_id = ?", (user_id,)).fetchone()
        if row is None:
            raise ServiceError(404, "user_not_found", f"no user {user_id!r}")
        return User(user_id=row["user_id"], name=row["name"], roles=row["roles"].split(","))

    def order(self, order_id: str) -> Order:
        return _to_order(self._order_row(order_id))

    def orders(self, owner: str | None) -> list[Order]:
        rows = self._db.execute(
            "SELECT * FROM orders WHERE ? IS NULL OR owner = ? ORDER BY order_id", (owner, owner)
        )
        return [_to_order(row) for row in rows]

    def apply_refund(self, order_id: str, refund: AppliedRefund) -> Order:
        cents = to_cents(refund.amount)
        if cents <= 0:
            raise ServiceError(422, "invalid_amount", "a refund must be positive")
        with transaction(self._db) as db:
            row = self._order_row(order_id)
            seen = db.execute(
                "SELECT 1 FROM applied_refunds WHERE refund_key = ?", (refund.refund_key,)
            ).fetchone()
            if seen:
                return _to_order(row)
            refundable = row["amount_cents"] - row["refunded_cents"]
            if cents > refundable:
                raise ServiceError(
                    409,
                    "refund_exceeds_balance",
                    f"{format_cents(cents)} exceeds the refundable {format_cents(refundable)}",
                )
            db.execute(
                "UPDATE orders SET refunded_cents = refunded_cents + ?, version = version + 1"
                " WHERE order_id = ?",
                (cents, order_id),
            )
            db.execute(
                "INSERT INTO applied_refunds VALUES (?, ?, ?, ?, ?)",
                (refund.refund_key, refund.refund_id, order_id, cents, utc_now().isoformat()),
            )
        return self.order(order_id)

    def create_order(self, new: NewOrder) -> Order:
        """Insert an order at version 1 with nothing refunded; 409 if the id is taken."""
        cents = to_cents(new.amount)
        if cents <= 0:
            raise ServiceError(422, "invalid_amount", "an order must be worth something")
        with transaction(self._db) as db:
            if db.execute("SELECT 1 FROM orders WHERE order_id = ?", (new.order_id,)).fetchone():
                raise ServiceError(409, "order_exists", f"order {new.order_id!r} exists already")
            db.execute(
                "INSERT INTO orders VALUES (?, ?, ?, ?, ?, 0, ?, 1)",
                (
                    new.order_id,
                    new.owner,
                    new.status,
                    cents,
                    new.currency.upper(),
                    _iso_utc(new.delivered_at),
                ),
            )
        return self.order(new.order_id)

    def change_order(self, order_id: str, change: OrderChange) -> Order:
        columns: dict[str, Any] = {}
        if change.status is not None:
            columns["status"] = change.status
        if change.owner is not None:
            columns["owner"] = change.owner
        if change.amount is not None:
            columns["amount_cents"] = to_cents(change.amount)
        if "delivered_at" in change.model_fields_set:
            columns["delivered_at"] = _iso_utc(change.delivered_at)
        with transaction(self._db) as db:
            row = self._order_row(order_id)
            if columns.get("amount_cents", row["amount_cents"]) < row["refunded_cents"]:
                raise ServiceError(
                    422, "amount_below_refunded", "an order cannot be worth less than refunded"
                )
            assignments = "".join(f"{column} = ?, " for column in columns)
            db.execute(
                f"UPDATE orders SET {assignments}version = version + 1 WHERE order_id = ?",
                (*columns.values(), order_id),
            )
        return self.order(order_id)

    def _order_row(self, order_id: str) -> sqlite3.Row:
        row = self._db.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone()
        if row is None:
            raise ServiceError(404, "order_not_found", f"no order {order_id!r}")
        return row


def _to_order(row: sqlite3.Row) -> Order:
    return Order(
        order_id=row["order_id"],
        owner=row["owner"],
        status=row["status"],
        amount=format_cents(row["amount_cents"]),
        currency=row["currency"],
        refunded=format_cents(row["refunded_cents"]),
        refundable=format_cents(row["amount_cents"] - row["refunded_cents"]),
        delivered_at=row["delivered_at"],
        version=row["version"],
    )


def _iso_utc(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def create_app(db_path: Path) -> FastAPI:
    """The orders app on `db_path`, seeded with the reference customers and orders once."""
    store = OrdersStore(db_path)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="orders", lifespan=lifespan)
    install_error_handlers(app)

    @app.get("/users/{user_id}")
    async def get_user(user_id: str) -> User:
        return store.user(user_id)

    @app.get("/orders/{order_id}")
    async def get_order(order_id: str) -> Order:
        return store.order(order_id)

    @app.get("/orders")
    async def list_orders(owner: str | None = None) -> list[Order]:
        return store.orders(owner)

    @app.post("/orders/{order_id}/refunds")
    async def apply_refund(order_id: str, refund: AppliedRefund) -> Order:
        return store.apply_refund(order_id, refund)

    @app.post("/admin/orders", status_code=201)
    async def create_order(new: NewOrder) -> Order:
        return store.create_order(new)

    @app.post("/admin/orders/{order_id}")
    async def change_order(order_id: str, change: OrderChange) -> Order:
        return store.change_order(order_id, change)

    return app
