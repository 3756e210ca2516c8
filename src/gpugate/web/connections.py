"""Connection-level limits uvicorn's httptools protocol does not have (issue #15 finding 3).

:func:`guarded_protocol` is uvicorn's own ``HttpToolsProtocol`` with, per connection:

- a **header read timeout** (``server.header_timeout_s``): from the connection's start, or a
  keep-alive request's first byte, to the end of its headers → ``408 REQUEST_TIMEOUT``;
- a **header size and count cap** (``server.max_header_bytes``, ``server.max_headers``): the
  request line and headers together, counted as they arrive (httptools would buffer a 40 MiB
  header whole) and as parsed (a whole request in one packet) → ``431 HEADERS_TOO_LARGE``;
- a **body read timeout** (``server.body_timeout_s``): the longest silence between two pieces
  of a request body while the app is waiting for it (not while the app is not reading) →
  ``408`` if nothing was answered yet, and the app sees the client gone;
- a **connection cap** (``server.max_connections``): a request on a connection beyond it gets
  ``503 TOO_MANY_CONNECTIONS`` with ``Retry-After`` and the connection is closed.

Each refusal is the usual JSON error body, then the connection is closed, as nginx
(``client_header_timeout``, ``large_client_header_buffers``, ``client_body_timeout``) and Envoy
(``request_headers_timeout``, ``max_request_headers_kb``) do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpugate.errors import GpugateError, HeadersTooLarge, RequestTimeout, TooManyConnections
from gpugate.web.errors import error_body, error_headers, status_of

log = logging.getLogger("gpugate.server")

LINGER_S = 2.0
"""After a refusal, how long the connection is kept half-open, discarding what the client still
sends, so that it reads the answer (nginx's ``lingering_close``) rather than a TCP reset."""
_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The limits one server applies to every connection (``server.*``)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    body_timeout_s: float = 30.0
    max_connections: int = 2048


def refusal(exc: GpugateError) -> bytes:
    """A whole HTTP/1.1 response for ``exc`` that closes the connection."""
    status = status_of(exc)
    body = error_body(exc)
    lines = [
        b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Error")),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        *(f"{k}: {v}".encode() for k, v in error_headers(exc).items()),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def guarded_protocol(
    limits: ConnectionLimits,
    inner: type[HttpToolsProtocol] = HttpToolsProtocol,
    **attributes: object,
) -> type[HttpToolsProtocol]:
    """Uvicorn's httptools protocol class with ``limits`` (pass it as ``Config(http=...)``);
    ``inner``, a subclass of it, serves what passes the limits (the fast path) with
    ``attributes`` set on the class."""
    bases = (_Guarded,) if inner is HttpToolsProtocol else (_Guarded, inner)
    name = "GuardedHttpToolsProtocol" if inner is HttpToolsProtocol else f"Guarded{inner.__name__}"
    return type(name, bases, {"limits": limits, **attributes})


class _Guarded(HttpToolsProtocol):
    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._in_head = True  # between a message's first byte and the end of its headers
        self._head_bytes = 0  # bytes received while in the head (a bound on what is buffered)
        self._too_large = False
        self._awaiting_body = False  # headers done, the body not yet whole
        self._head_started = False  # a request's first byte came, its headers not yet all
        self._head_timer = _Timer(self.loop, self._head_late)
        self._body_timer = _Timer(self.loop, self._body_late)

    # --- the connection -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused:
            return
        if self._too_large or (self._in_head and self._head_bytes > self.limits.max_header_bytes):
            self._refuse(HeadersTooLarge(self._too_large_message()))
        # Timers only for what one packet left unfinished: a request that arrives whole (the
        # common case) costs none.
        elif self._head_started:
            if not self._head_timer.armed:  # from the first packet of an unfinished head
                self._arm_head_timer()
        elif self._awaiting_body:
            self._arm_body_timer()  # silence is counted from the last piece of the body

    def _too_large_message(self) -> str:
        return (
            f"the request line and headers exceed {self.limits.max_header_bytes} bytes or"
            f" {self.limits.max_headers} headers (server.max_header_bytes, server.max_headers)"
        )

    # --- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_started = False
        self._cancel_head_timer()
        if self._refused:
            return
        # A head that came in one packet is whole here (what data_received counted is a bound
        # on what was buffered only across packets): its size and count are checked now.
        headers = self.headers
        if len(headers) > self.limits.max_headers or (
            len(self.url) + sum(len(k) + len(v) + 4 for k, v in headers)
            > self.limits.max_header_bytes
        ):
            self._too_large = True
            return
        if len(self.connections) > self.limits.max_connections:
            log.warning("refused a request: %d connections open", len(self.connections))
            self._refuse(
                TooManyConnections(
                    f"this replica holds {self.limits.max_connections} connections"
                    " (server.max_connections); retry",
                    retry_after_s=1,
                )
            )
            return
        super().on_headers_complete()
        self._awaiting_body = True

    def on_body(self, body: bytes) -> None:
        if not (self._refused or self._too_large):
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._awaiting_body = False
        self._in_head = True  # what comes next is the next request's head
        self._head_bytes = 0
        self._cancel_body_timer()
        if not (self._refused or self._too_large):
            super().on_message_complete()

    # --- timers ---------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_timer.arm(self.limits.header_timeout_s)

    def _cancel_head_timer(self) -> None:
        self._head_timer.cancel()

    def _head_late(self) -> None:
        # A head under way, or a new connection that never sent one (an idle keep-alive
        # connection is uvicorn's timeout_keep_alive's, not this)
        if not self._refused and (self._head_started or self.cycle is None):
            self._refuse(
                RequestTimeout(
                    f"the request headers did not arrive within {self.limits.header_timeout_s:g} s"
                    " (server.header_timeout_s)"
                )
            )

    def _arm_body_timer(self) -> None:
        self._body_timer.arm(self.limits.body_timeout_s)

    def _cancel_body_timer(self) -> None:
        self._body_timer.cancel()

    def _body_late(self) -> None:
        cycle = self.cycle
        if self._refused or cycle is None or not cycle.more_body or not self._awaiting_body:
            return
        if self.flow.read_paused and not cycle.response_complete:
            self._arm_body_timer()  # the app is not reading: the client is not the slow one
            return
        message = (
            f"no request body arrived for {self.limits.body_timeout_s:g} s (server.body_timeout_s)"
        )
        answered = cycle.response_started
        cycle.disconnected = True  # the app's receive() says the client is gone
        cycle.message_event.set()
        if answered:
            self._refused = True
            self.transport.close()
        else:
            self._refuse(RequestTimeout(message))

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()

    # --- refusing -------------------------------------------------------------------------

    def _refuse(self, exc: GpugateError) -> None:
        """Answer ``exc`` (nothing else is sent on this connection) and close it."""
        self._refused = True
        self._cancel_timers()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(refusal(exc))
        if transport.can_write_eof():  # a lingering close: a client still sending reads the
            transport.write_eof()  # answer instead of a reset; what it sends is discarded
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()


class _Timer:
    """One re-armable timer of a connection."""

    __slots__ = ("_callback", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, delay_s: float) -> None:
        self.cancel()
        self._handle = self._loop.call_later(delay_s, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._callback()
