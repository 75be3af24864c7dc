"""A loopback port for a server a test starts in another process, held until that server has it.

Picking a free port (bind to port 0, close) and passing it to a child races every other process
on the machine: between the close and the child's bind, another test's server or an outgoing
connection may be handed the same port, and the child then fails to bind, or a readiness check
is answered by someone else's server. `reserved_port` keeps a socket bound to the port (not
listening) for the whole block. Linux then hands the port to no `bind(("...", 0))` and no
outgoing connection, while a server that binds it explicitly with SO_REUSEADDR, as uvicorn (and
so `langgraph dev` and Aegra) does, still can: a bound socket that does not listen does not
conflict with it.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def reserved_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port on `host` that no other process is given while the block runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        yield port


@contextmanager
def reserved_ports(count: int, host: str = "127.0.0.1") -> Iterator[int]:
    """The first of `count` consecutive ports on `host`, all held as `reserved_port` holds one
    (for a command that serves on --port P, P+1, ...)."""
    for _attempt in range(100):
        with reserved_port(host) as first, contextlib.ExitStack() as stack:
            try:
                for port in range(first + 1, first + count):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((host, port))
            except OSError:
                continue  # a port after the first is taken: another first
            yield first
            return
    raise RuntimeError(f"no {count} consecutive free ports on {host}")
