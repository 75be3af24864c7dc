"""The HTTP protocol both engines' servers speak, with a request's head bounded as it arrives.

uvicorn parses requests with httptools where it is installed, which keeps a request's line and
headers whole in memory however long they are (a 16 MB bearer token was read whole, then
verified on the event loop, holding every other request up). `BoundedHttpTools` counts the bytes
of a request's head (up to the blank line that ends it) as they arrive and answers 431, closing
the connection, as soon as they pass `MAX_HEAD_BYTES`: nothing past the bound is parsed or
kept. No request the edge takes comes near it (its headers are at most 16 KiB). The edge bounds what is
inside the head more tightly (`edge.http.MAX_HEADER_BYTES`, the token's own bound); this keeps
a head that could never pass from being read at all.

`install()` makes it the protocol `uvicorn.run` picks by default ("auto"), for an engine whose
entry point calls uvicorn itself (`langgraph dev`); `server.aegra` names it directly.
"""

from __future__ import annotations

import json
from typing import Any

import uvicorn.config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# A request's line and headers, and whatever of its body arrived with them, before the headers
# are complete: well above what the edge lets through, well below what holds a process up.
MAX_HEAD_BYTES = 65_536
PROTOCOL = "loopwright.server.edge.protocol:BoundedHttpTools"

_REFUSAL = json.dumps({"detail": f"a request's head is at most {MAX_HEAD_BYTES} bytes"}).encode()
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL)
)


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's HTTP protocol, refusing a head past `MAX_HEAD_BYTES` as it arrives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._begin_head()

    def _begin_head(self) -> None:
        self._head_bytes = 0
        self._in_head = True
        self._tail = b""  # the last bytes of the head so far: its end may straddle two reads

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begin_head()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._tail))
            self._tail = seen[-3:]
            if self._head_bytes > MAX_HEAD_BYTES:
                self.transport.write(_TOO_LARGE)
                self.transport.close()
                return
        super().data_received(data)


def install() -> None:
    """Make `BoundedHttpTools` what uvicorn serves with when told nothing else ("auto")."""
    uvicorn.config.HTTP_PROTOCOLS["auto"] = PROTOCOL
