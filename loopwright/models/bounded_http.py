"""An httpx transport that ends each request by its call's bound, whatever the server sends.

The runtime waits for a model request at most until its bound (`core.bounded.call_by`) and
then goes on without it. This transport makes the abandoned request itself end too, so that a
long-lived worker does not keep a thread reading a stream that never stops:

* no attempt starts once the bound has passed (the client's retries included), and an attempt's
  timeouts (connect, write, the wait for the answer) are what is left of the bound;
* every piece of a streamed body is checked against the bound, so bytes that keep coming (SSE
  comments, events of another protocol, a slow trickle) cannot carry the read on;
* when the caller abandons the call, the socket is shut down, which ends a read blocked on a
  server that sends nothing more.

Outside a bounded call it is the plain transport.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httpx

from loopwright.core.bounded import BoundedCall, current_call


class BoundedTransport(httpx.HTTPTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        call = current_call()
        if call is None:
            return super().handle_request(request)
        left = call.left()
        if call.expired():
            raise httpx.ConnectTimeout("the request's bound has passed: not sent", request=request)
        request.extensions["timeout"] = httpx.Timeout(left).as_dict()
        response = super().handle_request(request)
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            call.on_abandon(lambda: _shut(sock))
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _BoundedBody(response.stream, call, request)
        return response


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _BoundedBody(httpx.SyncByteStream):
    def __init__(self, body: httpx.SyncByteStream, call: BoundedCall, request: httpx.Request):
        self._body = body
        self._call = call
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._body:
            if self._call.expired():
                raise httpx.ReadTimeout(
                    "the answer was still coming at its request's bound: cut",
                    request=self._request,
                )
            yield piece

    def close(self) -> None:
        self._body.close()
