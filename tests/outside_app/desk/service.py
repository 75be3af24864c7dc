"""The desk's business system: slots with bookings (no idempotency keys: a booking sent twice is
booked twice) and confirmations (idempotent by key). Real HTTP on loopback, state in SQLite, so
it outlives the processes that talk to it.

    python -m desk.service --data DIR --ready-file FILE [--port 0]

`POST /admin/fault {"path": "/slots", "delay_s": 3}` makes the next write under that path
apply, then answer only after `delay_s` (accept then time out).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sqlite3
import threading
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Header, HTTPException

SCHEMA = """
CREATE TABLE IF NOT EXISTS bookings (booking_id INTEGER PRIMARY KEY, slot TEXT, guest TEXT);
CREATE TABLE IF NOT EXISTS confirmations (
    confirmation_id INTEGER PRIMARY KEY, key TEXT UNIQUE, slot TEXT, guest TEXT
);
"""


def create_app(db_path: Path) -> FastAPI:
    db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
    db.executescript(SCHEMA)
    lock = threading.Lock()
    faults: dict[str, float] = {}
    app = FastAPI()

    def slot_view(slot: str) -> dict[str, Any]:
        rows = db.execute(
            "SELECT booking_id, guest FROM bookings WHERE slot = ? ORDER BY booking_id", (slot,)
        ).fetchall()
        bookings = [{"booking_id": f"bk_{i}", "slot": slot, "guest": g} for i, g in rows]
        return {"slot": slot, "version": len(bookings), "bookings": bookings}

    async def maybe_hang(path: str) -> None:
        delay = faults.pop(path, None)
        if delay:
            await asyncio.sleep(delay)

    @app.get("/slots/{slot}")
    async def get_slot(slot: str) -> dict[str, Any]:
        return slot_view(slot)

    @app.post("/slots/{slot}/bookings")
    async def book(slot: str, body: dict[str, str]) -> dict[str, Any]:
        with lock:
            cursor = db.execute(
                "INSERT INTO bookings (slot, guest) VALUES (?, ?)", (slot, body["guest"])
            )
        await maybe_hang("/slots")
        return {"booking_id": f"bk_{cursor.lastrowid}", "slot": slot, "guest": body["guest"]}

    @app.post("/confirmations")
    async def confirm(
        body: dict[str, str], idempotency_key: str = Header(alias="Idempotency-Key")
    ) -> dict[str, Any]:
        with lock:
            db.execute(
                "INSERT OR IGNORE INTO confirmations (key, slot, guest) VALUES (?, ?, ?)",
                (idempotency_key, body["slot"], body["guest"]),
            )
        await maybe_hang("/confirmations")
        return by_key(idempotency_key)

    def by_key(key: str) -> dict[str, Any]:
        row = db.execute(
            "SELECT confirmation_id, slot, guest FROM confirmations WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            raise HTTPException(404, {"error": "not_found"})
        return {"confirmation_id": f"cf_{row[0]}", "slot": row[1], "guest": row[2]}

    @app.get("/confirmations/by-key/{key:path}")
    async def get_confirmation(key: str) -> dict[str, Any]:
        return by_key(key)

    @app.post("/admin/fault")
    async def fault(body: dict[str, Any]) -> dict[str, str]:
        faults[str(body["path"])] = float(body["delay_s"])
        return {"armed": str(body["path"])}

    @app.get("/admin/state")
    async def state() -> dict[str, Any]:
        bookings = db.execute("SELECT slot, guest FROM bookings").fetchall()
        confirmations = db.execute("SELECT slot, guest FROM confirmations").fetchall()
        return {"bookings": bookings, "confirmations": confirmations}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m desk.service")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    server = uvicorn.Server(
        uvicorn.Config(create_app(args.data / "desk.sqlite3"), log_level="warning")
    )

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.02)
        # Atomically: whoever waits for the file never reads it half written.
        partial = args.ready_file.with_name(args.ready_file.name + ".tmp")
        partial.write_text(f"http://127.0.0.1:{sock.getsockname()[1]}")
        partial.replace(args.ready_file)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
