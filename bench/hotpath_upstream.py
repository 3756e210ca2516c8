"""A raw upstream client for the hot-path prototypes: pooled keep-alive connections, each an
``asyncio.Protocol`` whose responses ``httptools`` parses. No client-library objects per request:
the request goes out as one ``writelines`` of a head and the client's original body bytes.

A response goes to the connection's :class:`Sink`, in one of two ways:

* **raw** (``RawConnection``, for ``hotpath_proto``): the sink gets the bytes exactly as they
  came, head and framing included, and is told when the head is complete and when the message
  is; it relays them without re-framing (only the head is rewritten).
* **decoded** (``DecodedConnection`` and :class:`Response`, for servers that frame responses
  themselves: uvicorn, granian): status, headers, then the body's pieces de-framed.

A connection goes back to its pool when a message is complete and both sides keep it alive; a
response abandoned half way closes its connection (so an abandoned generation stops upstream).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, cast

import httptools
from hotpath import HOP_BY_HOP


class UpstreamFailed(Exception):
    """The upstream could not be reached, broke off, or sent no head in time."""


class Sink(Protocol):
    def head(self, conn: Connection) -> None: ...
    def data(self, conn: Connection, data: bytes) -> None: ...
    def end(self, conn: Connection) -> None: ...
    def failed(self, conn: Connection, exc: Exception) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection to one upstream; at most one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.head_done = self.done = False
        self.keep = self.closed = False

    # -- asyncio --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        sink = self.sink
        if sink is None:  # nothing asked: an upstream talking out of turn
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.sink = None
            self.close()
            sink.failed(self, exc)
            return
        self.deliver(sink, data)
        if self.done:
            self.sink = None
            self.head_done = self.done = False
            sink.end(self)
            if self.keep and not self.closed:
                self.pool.give_back(self)
            else:
                self.close()

    def deliver(self, sink: Sink, data: bytes) -> None:
        """What this connection's kind hands the sink of each piece that arrived."""

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if (sink := self.sink) is not None:
            self.sink = None
            sink.failed(self, exc or UpstreamFailed("the upstream closed the connection"))

    # -- httptools --
    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_message_complete(self) -> None:
        self.done = True
        self.keep = self.parser.should_keep_alive()  # only valid inside this callback

    # -- ours --
    def send(self, sink: Sink, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.sink = sink
        self.transport.writelines((head, body))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()


class RawConnection(Connection):
    """Hands the sink the bytes as they came; tells it once when the head is complete."""

    def deliver(self, sink: Sink, data: bytes) -> None:
        sink.data(self, data)


class DecodedConnection(Connection):
    """Collects the head's headers and hands the sink the de-framed body."""

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.headers: list[tuple[bytes, bytes]] = []

    def on_message_begin(self) -> None:
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name not in HOP_BY_HOP:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        if self.sink is not None:
            self.sink.head(self)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.data(self, body)


class Pool:
    """Idle keep-alive connections to one upstream, and how to make more."""

    def __init__(self, host: str, port: int, kind: type[Connection]) -> None:
        self.host, self.port, self.kind = host, port, kind
        self.idle: list[Connection] = []

    def take(self) -> Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: self.kind(self), self.host, self.port)
        except OSError as exc:
            raise UpstreamFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def give_back(self, conn: Connection) -> None:
        self.idle.append(conn)

    def forget(self, conn: Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)


class Response:
    """A decoded response for servers that frame their own answers (a :class:`Sink`)."""

    __slots__ = ("_chunks", "_conn", "_eof", "_error", "_head", "_wake", "headers", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        loop = asyncio.get_running_loop()
        self._head: asyncio.Future[None] = loop.create_future()
        self._wake: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._eof = False
        self._error: Exception | None = None
        self._conn: Connection | None = None

    async def start(self, pool: Pool, head: bytes, body: bytes, first_byte_s: float) -> None:
        """Send the request; return when the response head has arrived."""
        conn = pool.take() or await pool.connect()
        self._conn = conn
        conn.send(self, head, body)
        timer = asyncio.get_running_loop().call_later(first_byte_s, self._late)
        try:
            await self._head
        finally:
            timer.cancel()

    def _late(self) -> None:
        if not self._head.done():
            self._head.set_exception(UpstreamFailed("no response head in time"))
            if self._conn is not None:
                self._conn.close()

    # -- Sink --
    def head(self, conn: Connection) -> None:
        assert isinstance(conn, DecodedConnection)
        self.status = conn.parser.get_status_code()
        self.headers = conn.headers
        if not self._head.done():
            self._head.set_result(None)

    def data(self, conn: Connection, data: bytes) -> None:  # noqa: ARG002
        self._chunks.append(data)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def end(self, conn: Connection) -> None:  # noqa: ARG002
        self._eof = True
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def failed(self, conn: Connection, exc: Exception) -> None:  # noqa: ARG002
        self._error = exc
        if not self._head.done():
            self._head.set_exception(UpstreamFailed(str(exc)))
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # -- the reader's side --
    async def read_chunk(self) -> bytes:
        """The next piece of the body, ``b""`` at the end; UpstreamFailed on a break."""
        while True:
            if self._chunks:
                return self._chunks.popleft()
            if self._eof:
                return b""
            if self._error is not None:
                raise UpstreamFailed(str(self._error))
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    def release(self) -> None:
        """Done with the response: a connection left half-read is closed."""
        if not self._eof and self._conn is not None:
            self._conn.close()
