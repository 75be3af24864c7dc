"""The payments service: refunds, idempotent by the caller's ``Idempotency-Key``.

A refund is committed here first (status "processing"), then applied to the order's balance
in the orders service, then marked "succeeded". If applying fails half-way, the refund stays
"processing" and any later read or replay finishes it; the orders service dedupes by key, so
finishing twice is harmless. That keeps the two stores consistent without a distributed
transaction, and makes every outcome answerable by a lookup on the key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal

import httpx
from fastapi import FastAPI, Header, Response
from pydantic import BaseModel

from loopwright_refunds.services.credits import credits_router
from loopwright_refunds.services.endpoints import tls_context
from loopwright_refunds.services.errors import ServiceError, install_error_handlers
from loopwright_refunds.services.faults import Fault, FaultSwitch
from loopwright_refunds.services.money import format_cents, to_cents
from loopwright_refunds.services.storage import open_database, transaction, utc_now

SCHEMA = """
CREATE TABLE IF NOT EXISTS refunds (
    refund_id TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    order_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    body_digest TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    ready_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS refunds_by_order ON refunds (order_id);
"""


class RefundRequest(BaseModel):
    order_id: str
    amount: Decimal
    currency: str
    reason: str | None = None


class Refund(BaseModel):
    refund_id: str
    idempotency_key: str
    order_id: str
    amount: str
    currency: str
    status: Literal["succeeded", "processing"]
    created_at: str


class RefundList(BaseModel):
    refunds: list[Refund]


@dataclass(frozen=True)
class StoredRefund:
    refund_id: str
    idempotency_key: str
    order_id: str
    amount_cents: int
    currency: str
    body_digest: str
    status: str
    created_at: str
    ready_at: str

    @property
    def due(self) -> bool:
        """A processing refund whose settlement time has come."""
        return self.status == "processing" and datetime.fromisoformat(self.ready_at) <= utc_now()

    def public(self) -> Refund:
        return Refund(
            refund_id=self.refund_id,
            idempotency_key=self.idempotency_key,
            order_id=self.order_id,
            amount=format_cents(self.amount_cents),
            currency=self.currency,
            status=self.status,
            created_at=self.created_at,
        )


def body_digest(order_id: str, amount_cents: int, currency: str) -> str:
    """What a replay must match: the refund's substance, not its formatting or its reason."""
    canonical = {"order_id": order_id, "amount": format_cents(amount_cents), "currency": currency}
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


class RefundsStore:
    def __init__(self, db_path: Path) -> None:
        self._db = open_database(db_path, SCHEMA)

    def close(self) -> None:
        self._db.close()

    def by_key(self, key: str) -> StoredRefund | None:
        return self._one("SELECT * FROM refunds WHERE idempotency_key = ?", key)

    def by_id(self, refund_id: str) -> StoredRefund | None:
        return self._one("SELECT * FROM refunds WHERE refund_id = ?", refund_id)

    def for_order(self, order_id: str | None) -> list[StoredRefund]:
        rows = self._db.execute(
            "SELECT * FROM refunds WHERE ? IS NULL OR order_id = ? ORDER BY refund_id",
            (order_id, order_id),
        )
        return [StoredRefund(**row) for row in rows]

    def pending_cents(self, order_id: str) -> int:
        """Committed here but not yet applied to the order's balance."""
        row = self._db.execute(
            "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds"
            " WHERE order_id = ? AND status = 'processing'",
            (order_id,),
        ).fetchone()
        return int(row[0])

    def insert(
        self, key: str, order_id: str, cents: int, currency: str, digest: str, ready_at: datetime
    ) -> StoredRefund:
        with transaction(self._db) as db:
            (last,) = db.execute(
                "SELECT COALESCE(MAX(CAST(substr(refund_id, 4) AS INTEGER)), 0) FROM refunds"
            ).fetchone()
            refund = StoredRefund(
                refund_id=f"rf_{last + 1:06d}",
                idempotency_key=key,
                order_id=order_id,
                amount_cents=cents,
                currency=currency,
                body_digest=digest,
                status="processing",
                created_at=utc_now().isoformat(),
                ready_at=ready_at.isoformat(),
            )
            db.execute(
                "INSERT INTO refunds VALUES (:refund_id, :idempotency_key, :order_id,"
                " :amount_cents, :currency, :body_digest, :status, :created_at, :ready_at)",
                refund.__dict__,
            )
        return refund

    def mark_succeeded(self, refund: StoredRefund) -> StoredRefund:
        self._db.execute(
            "UPDATE refunds SET status = 'succeeded' WHERE refund_id = ?", (refund.refund_id,)
        )
        return replace(refund, status="succeeded")

    def delete(self, refund: StoredRefund) -> None:
        self._db.execute("DELETE FROM refunds WHERE refund_id = ?", (refund.refund_id,))

    def _one(self, query: str, value: str) -> StoredRefund | None:
        row = self._db.execute(query, (value,)).fetchone()
        return None if row is None else StoredRefund(**row)


class OrdersUnavailable(ServiceError):
    def __init__(self, detail: str) -> None:
        super().__init__(502, "orders_unavailable", detail)


class OrderBalance(BaseModel):
    """The part of the orders service's order a refund is checked against."""

    currency: str
    refundable: Decimal


class OrdersClient:
    def __init__(self, base_url: str) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=5.0, verify=tls_context())

    async def aclose(self) -> None:
        await self._http.aclose()

    async def balance(self, order_id: str) -> OrderBalance | None:
        response = await self._send("GET", f"/orders/{order_id}")
        if response.status_code == 404:
            return None
        self._expect(response, 200)
        return OrderBalance.model_validate_json(response.content)

    async def apply(self, refund: StoredRefund) -> bool:
        """Reduce the order's balance; False if the balance no longer covers the refund."""
        response = await self._send(
            "POST",
            f"/orders/{refund.order_id}/refunds",
            {
                "refund_key": refund.idempotency_key,
                "refund_id": refund.refund_id,
                "amount": format_cents(refund.amount_cents),
            },
        )
        if response.status_code == 409:
            return False
        self._expect(response, 200)
        return True

    async def _send(self, method: str, path: str, body: object = None) -> httpx.Response:
        try:
            return await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise OrdersUnavailable(f"{method} {path}: {exc!r}") from exc

    @staticmethod
    def _expect(response: httpx.Response, status: int) -> None:
        if response.status_code != status:
            raise OrdersUnavailable(f"orders answered {response.status_code}: {response.text}")


class Payments:
    def __init__(self, store: RefundsStore, orders: OrdersClient) -> None:
        self._store = store
        self._orders = orders
        # Creation checks a balance, then commits against it; serialising creations (all in
        # this one process) keeps two concurrent refunds from both spending the same balance.
        self._creating = asyncio.Lock()

    async def create(
        self, key: str, request: RefundRequest, settle_after: float | None
    ) -> tuple[StoredRefund, bool]:
        """The refund for `key` and whether this call created it (False: a replay).

        `settle_after` (the "processing" fault) leaves a new refund processing for that long.
        """
        cents = to_cents(request.amount)
        currency = request.currency.upper()
        digest = body_digest(request.order_id, cents, currency)
        async with self._creating:
            existing = self._store.by_key(key)
            if existing is not None:
                if existing.body_digest != digest:
                    raise ServiceError(
                        409,
                        "idempotency_key_reused",
                        f"key {key!r} was used for a different refund ({existing.refund_id})",
                    )
                return await self.settle(existing), False
            await self._check_refundable(request.order_id, cents, currency)
            ready_at = utc_now() + timedelta(seconds=settle_after or 0)
            refund = self._store.insert(key, request.order_id, cents, currency, digest, ready_at)
            if settle_after is not None:
                return refund, True
            applied = await self._apply(refund)
            if applied is None:
                self._store.delete(refund)
                raise _not_refundable(cents, "the order's balance changed meanwhile")
            return applied, True

    async def settle(self, refund: StoredRefund) -> StoredRefund:
        """Finish a due processing refund, lazily on read; unchanged if orders cannot be reached."""
        if not refund.due:
            return refund
        try:
            return await self._apply(refund) or refund
        except OrdersUnavailable:
            return refund

    async def _check_refundable(self, order_id: str, cents: int, currency: str) -> None:
        order = await self._orders.balance(order_id)
        if order is None:
            raise ServiceError(422, "order_not_found", f"no order {order_id!r}")
        if order.currency != currency:
            raise ServiceError(422, "currency_mismatch", f"order {order_id} is in {order.currency}")
        available = to_cents(order.refundable) - self._store.pending_cents(order_id)
        if not 0 < cents <= available:
            raise _not_refundable(cents, f"refundable now: {format_cents(available)}")

    async def _apply(self, refund: StoredRefund) -> StoredRefund | None:
        if not await self._orders.apply(refund):
            return None
        return self._store.mark_succeeded(refund)


def _not_refundable(cents: int, why: str) -> ServiceError:
    return ServiceError(
        422, "amount_exceeds_refundable", f"cannot refund {format_cents(cents)}; {why}"
    )


async def _before_commit(fault: Fault) -> None:
    """What an armed fault does before a refund is stored: fail, or take its time."""
    if fault.mode == "fail_before_commit":
        raise ServiceError(500, "internal_error", "injected fault: failed before commit")
    if fault.mode == "latency":
        await asyncio.sleep(fault.delay_s)


def create_app(db_path: Path, orders_url: str) -> FastAPI:
    """The payments app on `db_path`; `orders_url` is where it applies refunds to balances."""
    store = RefundsStore(db_path)
    orders = OrdersClient(orders_url)
    payments = Payments(store, orders)
    faults = FaultSwitch()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await orders.aclose()
        store.close()

    app = FastAPI(title="payments", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(credits_router(db_path.with_name("credits.sqlite3"), faults))

    @app.post("/refunds", status_code=201)
    async def create_refund(
        request: RefundRequest,
        response: Response,
        idempotency_key: Annotated[str | None, Header()] = None,
    ) -> Refund:
        if not idempotency_key:
            raise ServiceError(400, "missing_idempotency_key", "send an Idempotency-Key header")
        fault = faults.take()
        await _before_commit(fault)
        settle_after = fault.delay_s if fault.mode == "processing" else None
        refund, created = await payments.create(idempotency_key, request, settle_after)
        if not created:
            response.status_code = 200
        if fault.mode == "accept_then_timeout":
            await asyncio.sleep(fault.delay_s)
        return refund.public()

    @app.get("/refunds/by-key/{key:path}")
    async def get_by_key(key: str) -> Refund:
        if faults.blocks_queries:
            raise ServiceError(501, "query_not_supported", "this provider cannot look up keys")
        return await _found(store.by_key(key), f"no refund with key {key!r}")

    @app.get("/refunds/{refund_id}")
    async def get_refund(refund_id: str) -> Refund:
        return await _found(store.by_id(refund_id), f"no refund {refund_id!r}")

    @app.get("/refunds")
    async def list_refunds(order_id: str | None = None) -> RefundList:
        return RefundList(
            refunds=[(await payments.settle(r)).public() for r in store.for_order(order_id)]
        )

    @app.post("/admin/faults")
    async def arm_fault(fault: Fault) -> Fault:
        faults.current = fault
        return fault

    @app.get("/admin/faults")
    async def current_fault() -> Fault:
        return faults.current

    async def _found(refund: StoredRefund | None, detail: str) -> Refund:
        if refund is None:
            raise ServiceError(404, "refund_not_found", detail)
        return (await payments.settle(refund)).public()

    return app
