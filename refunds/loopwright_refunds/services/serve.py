"""Run the three reference services in this process: ``python -m loopwright_refunds.services --data-dir DIR``.

One asyncio loop serves all three apps, each on its own loopback socket. The sockets are bound
before the apps are built so that payments can be told where orders listens, and port 0 lets
the OS pick free ports. Once every server accepts connections the endpoints are published (to
the ready file, atomically, and as one line on stdout) for whoever started the process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from loopwright.processes import exit_with_parent
from loopwright_refunds.services import observe, orders, payments, policies
from loopwright_refunds.services.endpoints import ServiceEndpoints

HOST = "127.0.0.1"
ANY_HOST = "0.0.0.0"  # every interface: a container's services, reached from other containers


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to `serve`.

    uvicorn installs process-wide handlers per server; with three servers in one process they
    would replace one another, and only the last server would ever hear SIGTERM.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without, each answer waits ~40 ms for a delayed ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def _url(sock: socket.socket) -> str:
    """Where this process reaches the socket (every interface: through loopback). Other
    hosts reach it by a name of theirs (a container's), which they are given."""
    host = sock.getsockname()[0]
    return f"http://{HOST if host == ANY_HOST else host}:{sock.getsockname()[1]}"


def _publish(endpoints: ServiceEndpoints, ready_file: Path | None) -> None:
    line = endpoints.model_dump_json()
    if ready_file is not None:
        partial = ready_file.with_name(ready_file.name + ".tmp")
        partial.write_text(line)
        os.replace(partial, ready_file)
    print(line, flush=True)


async def serve(
    data_dir: Path,
    ready_file: Path | None = None,
    ports: tuple[int, int, int] = (0, 0, 0),
    host: str = HOST,
    stop_when: asyncio.Event | None = None,
    graceful_s: int = 3,
) -> None:
    """Serve orders, policies and payments (ports in that order) on `host` until SIGTERM or
    SIGINT, or, given `stop_when`, until that is set (signals are then left to the caller: a
    process serving several sets of services one after another, each on fresh storage).
    Stopping, a request still being answered is given `graceful_s` to finish, then cut off.

    The ready file exists exactly while all three listen: written once they do, removed on exit.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    orders_sock, policies_sock, payments_sock = (_bind(host, port) for port in ports)
    endpoints = ServiceEndpoints(
        orders=_url(orders_sock), policies=_url(policies_sock), payments=_url(payments_sock)
    )
    apps: list[tuple[FastAPI, socket.socket]] = [
        (orders.create_app(data_dir / "orders.sqlite3"), orders_sock),
        (policies.create_app(data_dir / "policies.sqlite3"), policies_sock),
        (payments.create_app(data_dir / "payments.sqlite3", endpoints.orders), payments_sock),
    ]
    for app, _ in apps:
        observe.install(app)
    servers = [
        _Server(
            uvicorn.Config(
                app, log_level="warning", access_log=False, timeout_graceful_shutdown=graceful_s
            )
        )
        for app, _ in apps
    ]

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    watcher = None
    if stop_when is None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
    else:
        watcher = asyncio.create_task(_call_when_set(stop_when, stop))
    tasks = [
        asyncio.create_task(server.serve(sockets=[sock]))
        for server, (_, sock) in zip(servers, apps, strict=True)
    ]
    while not all(server.started for server in servers):
        if any(task.done() for task in tasks):
            stop()  # one server failed or was stopped early: take the others down with it
            break
        await asyncio.sleep(0.01)
    else:
        _publish(endpoints, ready_file)
    await asyncio.gather(*tasks)
    if watcher is not None:
        watcher.cancel()
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)  # stopped: the endpoints are no longer true


async def _call_when_set(event: asyncio.Event, stop: Callable[[], None]) -> None:
    await event.wait()
    stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loopwright_refunds.services", description=__doc__
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, help="where to write the endpoints JSON")
    parser.add_argument("--orders-port", type=int, default=0)
    parser.add_argument("--policies-port", type=int, default=0)
    parser.add_argument("--payments-port", type=int, default=0)
    parser.add_argument(
        "--host", default=HOST, help=f"interface to listen on ({ANY_HOST}: every one)"
    )
    args = parser.parse_args(argv)
    ports = (args.orders_port, args.policies_port, args.payments_port)
    exit_with_parent()  # started by `launcher.start_services`: never outlive that process
    asyncio.run(serve(args.data_dir, args.ready_file, ports, args.host))
