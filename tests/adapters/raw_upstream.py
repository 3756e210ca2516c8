"""A raw HTTP/1.1 upstream on a loopback port whose every answer a test writes byte for byte (an
``asyncio`` server: no framework to tidy a misbehaving answer up).

Imported by the tests of ``tests/adapters`` as ``from raw_upstream import ...`` (a module of its
own: ``conftest`` is a name every test directory has)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from gpugate.adapters.upstream_client import Timeouts


@dataclass(frozen=True)
class Request:
    head: bytes  # the request line and headers, as they arrived
    body: bytes

    @property
    def line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    def header(self, name: bytes) -> list[bytes]:
        """Every value of ``name`` (matched case-insensitively), as sent."""
        found = []
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower():
                found.append(value.strip())
        return found


@dataclass
class Peer:
    """One connection the upstream accepted."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    closed_by_client: bool = False

    async def request(self) -> Request | None:
        """The next request on this connection, or None once the client closed it."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client = True
            return None
        request = Request(head[:-4], b"")
        length = request.header(b"content-length")
        if length:
            return Request(request.head, await self.reader.readexactly(int(length[0])))
        if request.header(b"transfer-encoding") == [b"chunked"]:
            parts = []
            while size := int((await self.reader.readline()).strip(), 16):
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            await self.reader.readline()
            return Request(request.head, b"".join(parts))
        return request

    async def answer(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def wait_closed_by_client(self) -> None:
        """Until the client closes this connection (reading whatever else it sends)."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass
        self.closed_by_client = True

    def reset(self) -> None:
        """Close with a TCP reset (SO_LINGER 0), not a FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Handler = Callable[[Peer, int], Awaitable[None]]


@dataclass
class Upstream:
    """A loopback server running ``handler(peer, index)`` for each connection it accepts."""

    handler: Handler
    port: int = 0
    peers: list[Peer] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer)
        self.peers.append(peer)
        # the client may be gone mid-answer: uvloop says so with a RuntimeError
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.handler(peer, len(self.peers) - 1)
        with contextlib.suppress(ConnectionError):
            writer.close()

    def open_connections(self) -> int:
        return sum(not p.writer.is_closing() and not p.reader.at_eof() for p in self.peers)


@contextlib.asynccontextmanager
async def upstream(handler: Handler, host: str = "127.0.0.1") -> AsyncIterator[Upstream]:
    up = Upstream(handler)
    server = await asyncio.start_server(up.serve, host, 0)
    up.port = server.sockets[0].getsockname()[1]
    try:
        yield up
    finally:
        for peer in up.peers:
            peer.writer.transport.abort()
        server.close()
        await server.wait_closed()


def keep_alive(answer: bytes, upstream_requests: list[Request] | None = None) -> Handler:
    """A handler answering every request on a connection with ``answer``."""

    async def handler(peer: Peer, _: int) -> None:
        while (request := await peer.request()) is not None:
            if upstream_requests is not None:
                upstream_requests.append(request)
            await peer.answer(answer)

    return handler


def ok(body: bytes = b"hello", *extra: bytes) -> bytes:
    """A 200 with ``body``, Content-Length framed, with ``extra`` header lines."""
    lines = b"".join(line + b"\r\n" for line in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), lines, body)


TIMEOUTS = Timeouts(connect_s=2.0, first_byte_s=2.0, total_s=5.0)
