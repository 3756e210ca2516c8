"""HTTP/1.1 to model servers: pooled keep-alive connections, each an ``asyncio.Protocol`` whose
responses ``httptools`` parses. The data plane's client (:mod:`gpugate.adapters.upstream_client`)
is a thin layer of names and errors over this module.

Per request: one ``writelines`` of the head and the body, the response's head and body pieces
handed to a :class:`Response` by the parser's callbacks, no task and no timer of its own: the
first-byte deadline is watched by its pool's :class:`HeadDeadlines` (one timer for all), the
total deadline by a timer only when the body is still to come once the head is in. Why not a
client library: docs/decisions.md §11 (phase 2: aiohttp's client was ~45 % of the gateway's
CPU per request).

- **Pools**: one per origin (scheme, host, port), idle connections reused newest first, at most
  ``max_idle`` of them, each closed after ``keepalive_s`` unused; ``limit`` (0: none) bounds the
  connections in use across every pool, as aiohttp's connector did (a request waits for one).
- **Framing**: Content-Length, chunked and close-delimited bodies; HEAD, 204 and 304 have none;
  1xx heads are skipped; a head larger than :data:`MAX_HEAD_BYTES` is refused.
- **Reuse**: a connection goes back to its pool when its response is complete and both sides keep
  it alive; a response abandoned half way closes it (the upstream sees the generation's client
  leave). A pooled connection the server had closed while idle (it ends with a FIN and no byte
  of the response) is retried once on a fresh one: the pool's race, not the upstream's
  failure; a reset, or any byte of an answer, is the upstream's (:class:`Stale`).
- **Backpressure**: more than :data:`PAUSE_BYTES` of body buffered unread pauses reading the
  socket; reading resumes once the reader has taken them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Protocol, cast

import httptools

from gpugate.errors import UpstreamError, UpstreamTimeout

#: A response head (status line and headers) larger than this is refused.
MAX_HEAD_BYTES = 65536
#: Body bytes buffered unread above which the socket stops being read (until the reader has
#: taken them: :meth:`Response.read_chunk` hands over everything buffered at once).
PAUSE_BYTES = 256 * 1024

# RFC 9110 §7.6.1 connection-specific fields: never forwarded, either way.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


class ConnectFailed(Exception):
    """No connection: ``os_error`` says why (nothing reached the upstream)."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class ConnectTimedOut(Exception):
    """The connection was not established within the connect timeout."""


class HeadTimedOut(Exception):
    """No response head within the first-byte deadline."""


class HeadFailed(Exception):
    """The connection broke, or the upstream sent something unparsable, before a response head."""


class Stale(HeadFailed):
    """A reused connection ended with a FIN and no byte of the response: the server had closed
    it while idle, as the request went out. (A reset is the upstream's failure: a server closing
    a connection with our request unread in it resets it, so the FIN came first.)"""


class Owner(Protocol):
    """Where a connection reports that its exchange is done, or that it closed."""

    def done(self, conn: Connection, *, keep: bool) -> None: ...
    def lost(self, conn: Connection) -> None: ...


def default_ssl_context() -> ssl.SSLContext:
    """What aiohttp verified with: the system's CAs (``SSL_CERT_FILE`` honoured), hostnames
    checked, ALPN ``http/1.1``. Loads files: build it once, off the event loop."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(("http/1.1",))
    return context


class HeadDeadlines:
    """The responses waiting for their heads, each with its first-byte deadline, and one timer
    at the earliest: a uvloop timer made and cancelled per request costs ~2.7 µs, a dict entry
    added and removed ~0.1. A later deadline than the timer's (every request's, when they share
    a timeout) arms nothing; when the timer fires, the responses whose deadline has come fail
    with :class:`HeadTimedOut` and the timer is armed again at the earliest left, so each fails
    at its own deadline, as with a timer of its own."""

    __slots__ = ("_due", "_loop", "_timer", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: dict[Response, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf

    def add(self, response: Response, deadline: float) -> None:
        self._waiting[response] = deadline
        if deadline < self._due:
            if self._timer is not None:
                self._timer.cancel()
            self._due = deadline
            self._timer = self._loop.call_at(deadline, self._fire)

    def discard(self, response: Response) -> None:
        self._waiting.pop(response, None)

    def _fire(self) -> None:
        self._timer, self._due = None, math.inf
        now = self._loop.time()
        waiting = self._waiting
        for response in [r for r, deadline in waiting.items() if deadline <= now]:
            del waiting[response]
            response.late()
        if waiting:
            self._due = min(waiting.values())
            self._timer = self._loop.call_at(self._due, self._fire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._due = None, math.inf

    def __repr__(self) -> str:
        return f"<HeadDeadlines waiting={len(self._waiting)} due={self._due:.3f}>"


class Response:
    """One response whose head has arrived: status, headers, and the body as it comes.

    ``headers`` are ``(lower-case name, value)`` pairs without the hop-by-hop ones nor those a
    ``Connection`` header names."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_deadline",
        "_eof",
        "_error",
        "_idle_s",
        "_last_data",
        "_loop",
        "_timer",
        "_waiter",
        "head_done",
        "headers",
        "status",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: the running one, when the caller has it (asking costs a ``getpid``)."""
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self._loop = asyncio.get_running_loop() if loop is None else loop
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: list[bytes] = []  # a list, not a deque: 56 bytes, not ~0.7 KB a stream
        self._buffered = 0
        self._eof = False
        self._error: Exception | None = None
        self._conn: Connection | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = math.inf  # until arm()
        self._idle_s: float | None = None
        self._last_data = 0.0

    # -- the connection's side --
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def got_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.headers, self.head_done = status, headers, True
        self._wake()

    def got_data(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        self._last_data = self._loop.time()
        conn = self._conn
        if self._buffered > PAUSE_BYTES and conn is not None:
            conn.pause()
        self._wake()

    def got_end(self) -> None:
        """The whole body is in: the connection is no longer ours."""
        self._eof = True
        self._conn = None
        self._cancel_timer()
        self._wake()

    def got_failure(self, exc: Exception) -> None:
        if self._error is None and not self._eof:
            self._error = exc
        self._conn = None
        self._cancel_timer()
        self._wake()

    # -- the exchange's side --
    def attach(self, conn: Connection) -> None:
        """``conn`` carries this response from now on (its request is being written)."""
        self._conn = conn

    def reset(self) -> None:
        """Back to before the request was sent (a retry on a fresh connection)."""
        self.status, self.headers, self.head_done = 0, [], False
        self._chunks.clear()
        self._buffered, self._eof, self._error, self._conn = 0, False, None, None
        self._deadline = math.inf

    async def wait_head(self, deadline: float, deadlines: HeadDeadlines) -> None:
        """Until the head is in; the connection's failure, or :class:`HeadTimedOut` at
        ``deadline`` (loop time, watched by ``deadlines``), raised."""
        loop = self._loop
        deadlines.add(self, deadline)
        try:
            while not self.head_done:
                if self._error is not None:
                    raise self._error
                self._waiter = waiter = loop.create_future()
                await waiter
        finally:
            deadlines.discard(self)

    def late(self) -> None:
        """The first-byte deadline has come (:class:`HeadDeadlines`)."""
        if not self.head_done:
            self.got_failure(HeadTimedOut())

    def arm(self, deadline: float) -> None:
        """The whole response must be in by ``deadline`` (loop time), else the next read fails
        with :class:`UpstreamTimeout` and the connection is closed."""
        self._deadline = deadline
        if self._conn is not None:  # the body is still to come
            self._timer = self._loop.call_at(deadline, self._expired)

    def owner(self) -> Connection | None:
        """The connection still carrying this response, if any."""
        return self._conn

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        """The one timer: the total deadline, or the idle silence, whichever comes first."""
        self._timer = None
        now = self._loop.time()
        if now >= self._deadline:
            self._chunks.clear()
            self._timed_out()
            return
        wait_until = self._deadline
        idle_s = self._idle_s
        if idle_s is not None:
            silent_since = self._last_data
            conn = self._conn
            if self._chunks or (conn is not None and conn.paused):
                silent_since = now  # the silence is our reader's, not the upstream's
            if now - silent_since >= idle_s:
                self._timed_out()
                return
            wait_until = min(wait_until, silent_since + idle_s)
        if wait_until != math.inf:
            self._timer = self._loop.call_at(wait_until, self._expired)

    def _timed_out(self) -> None:
        conn = self._conn
        self.got_failure(UpstreamTimeout("the upstream stopped sending before the end"))
        if conn is not None:
            conn.close()

    # -- the reader's side --
    async def read_chunk(self) -> bytes:
        """The next piece of the body as soon as it arrives, ``b""`` at the end; a failure
        mid-body raises :class:`UpstreamError` (:class:`UpstreamTimeout` when it timed out)."""
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                conn = self._conn
                if conn is not None and conn.paused:  # all taken: read the socket again
                    conn.resume()
                return data
            if self._eof:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = waiter = self._loop.create_future()
            await waiter

    async def read_chunk_by(self, deadline: float) -> bytes:
        """:meth:`read_chunk`, failing with :class:`UpstreamTimeout` (the connection closed) when
        nothing has come by ``deadline`` (loop time); no timer when a piece is there already."""
        if self._chunks or self._eof or self._error is not None:
            return await self.read_chunk()
        timer = self._loop.call_at(deadline, self._timed_out)
        try:
            return await self.read_chunk()
        finally:
            timer.cancel()

    def at_eof(self) -> bool:
        """Whether the whole body has been read."""
        return self._eof and not self._chunks

    def set_idle_timeout(self, seconds: float | None) -> None:
        """From now on, a silence longer than ``seconds`` between two pieces of the body fails
        the next :meth:`read_chunk` with :class:`UpstreamTimeout` (time spent paused because
        the reader is behind does not count)."""
        self._idle_s = seconds
        if self._conn is None:
            return
        self._last_data = self._loop.time()
        self._cancel_timer()
        self._expired()

    async def read(self) -> bytes:
        """The whole body (for small, non-streaming responses)."""
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the body: a connection still carrying it is closed (so an abandoned
        generation stops on the upstream); one whose body was all in went back to its pool."""
        conn = self._conn
        if conn is not None:
            self.got_failure(UpstreamError("the response was released before its end"))
            conn.close()
        self._chunks.clear()


class Connection(asyncio.Protocol):
    """One keep-alive connection to one origin, carrying one exchange at a time."""

    __slots__ = (
        "_connection_named",
        "_framed",
        "_head_bytes",
        "_headers",
        "_informational",
        "_parser",
        "_pool",
        "_writable",
        "closed",
        "fin",
        "head_only",
        "idle_since",
        "paused",
        "received",
        "response",
        "reusable",
        "reused",
        "transport",
    )

    def __init__(self, pool: Owner) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = self.paused = self.head_only = self.reused = False
        self.reusable = True
        self.fin = False  # the server closed its side with a FIN (not a reset)
        self.received = 0  # bytes of the current exchange's response so far
        self.idle_since = 0.0
        self._head_bytes = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._connection_named: list[bytes] | None = None
        self._framed = False  # a Content-Length or chunked body: an EOF before its end is a break
        self._informational = False
        self._writable: asyncio.Future[None] | None = None

    # -- asyncio --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # nothing asked: an upstream talking out of turn
            self.close()
            return
        self.received += len(data)
        if not response.head_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(f"an invalid response ({type(exc).__name__})")
            return
        if not response.head_done and self._head_bytes > MAX_HEAD_BYTES and self.response:
            self._broken(f"a response head larger than {MAX_HEAD_BYTES} bytes")

    def eof_received(self) -> bool | None:
        self.fin = True
        return None  # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.lost(self)
        response = self.response
        if response is None:
            return
        self.response = None
        if response.head_done and not self._framed and exc is None:
            response.got_end()  # a close-delimited body ends with the connection
            return
        if not response.head_done and self.reused and self.received == 0 and self.fin:
            response.got_failure(Stale("the pooled connection was closed by the upstream"))
            return
        why = f": {exc}" if exc is not None else ""
        if response.head_done:
            response.got_failure(
                UpstreamError(f"the upstream broke off the response: the connection closed{why}")
            )
        else:
            response.got_failure(HeadFailed(f"the connection closed before a response{why}"))

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- httptools --
    def on_message_begin(self) -> None:
        if self.response is None:  # a second answer to one request: the connection is unusable
            self.close()
            return
        self._headers = []
        self._connection_named = None
        self._framed = self._informational = False

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in HOP_BY_HOP:
            if name == b"connection":
                named = self._connection_named or []
                named.extend(t.strip().lower() for t in value.split(b","))
                self._connection_named = named
            elif name == b"transfer-encoding":
                self._framed = True
            return
        if name == b"content-length":
            self._framed = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        status = self._parser.get_status_code()
        if status < 200:  # 1xx: an interim head; the real one follows
            self._informational = True
            self._head_bytes = 0
            return
        headers = self._headers
        if self._connection_named:
            named = frozenset(self._connection_named)
            headers = [(k, v) for k, v in headers if k not in named]
        if status in (204, 304):
            self._framed = True  # no body, whatever the head says
        response.got_head(status, headers)
        if self.head_only:  # a HEAD's answer has no body; the parser cannot be told: close
            self.response = None
            response.got_end()
            self.close()

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.got_data(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        response = self.response
        if response is None:
            return
        # should_keep_alive is only valid inside this callback; a streamed request body may
        # still be going out: that connection is not reused
        keep = self._parser.should_keep_alive() and self.reusable
        self.response = None
        if self.paused:
            self.resume()
        response.got_end()
        self._pool.done(self, keep=keep)

    # -- ours --
    def send(
        self,
        response: Response,
        head: bytes,
        body: bytes | AsyncIterator[bytes] | None,
        *,
        head_only: bool,
    ) -> asyncio.Task[None] | None:
        """Write a request for ``response``: at once when the whole body is at hand (one
        ``writelines``), else in a task (returned) writing the pieces chunked as they come."""
        assert self.transport is not None
        self.response, self.head_only = response, head_only
        self.received = self._head_bytes = 0
        response.attach(self)
        if body is None or isinstance(body, bytes):
            self.reusable = True
            if body:
                self.transport.writelines((head, body))
            else:
                self.transport.write(head)
            return None
        self.reusable = False  # the answer may come before the body's end: see on_message_complete
        return asyncio.get_running_loop().create_task(self._stream(head, body))

    async def _stream(self, head: bytes, body: AsyncIterator[bytes]) -> None:
        assert self.transport is not None
        self.transport.write(head)
        async for piece in body:
            if self.closed:
                return
            if piece:
                self.transport.writelines((b"%x\r\n" % len(piece), piece, b"\r\n"))
            if self._writable is not None:
                await self._writable
        if not self.closed:
            self.transport.write(b"0\r\n\r\n")

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def _broken(self, what: str) -> None:
        response = self.response
        self.response = None
        self.close()
        if response is None:
            return
        if response.head_done:
            response.got_failure(UpstreamError(f"the upstream broke off the response: {what}"))
        else:
            response.got_failure(HeadFailed(f"{what}"))

    def close(self) -> None:
        """Close our side; whoever held the response has been told (or is the caller)."""
        self.response = None
        if not self.closed:
            self.closed = True
            self._pool.lost(self)
            if self.transport is not None:
                self.transport.close()

    def idle(self) -> bool:
        """Fit to carry the next request."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()
