"""One request and its response as the data plane sees them, whichever server carries them.

:class:`Exchange` is what :class:`gpugate.web.dataplane.Handler` is written against: read the
body, start, body pieces, one whole answer, and running the relay while the client is connected.
:class:`AsgiExchange` implements it over ASGI's ``receive`` and ``send`` (``/u/``, and every
route with ``GPUGATE_FASTPATH=0``); :class:`gpugate.web.fastpath.FastCycle` over the socket.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from starlette.types import Receive, Scope, Send

from gpugate.errors import PayloadTooLarge

if TYPE_CHECKING:
    from gpugate.services.proxy import Reply
    from gpugate.telemetry import Generated

log = logging.getLogger("gpugate.proxy")


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


class BrokenStream(Exception):
    """The upstream broke off a non-SSE body: drop the connection so the client sees it."""


class Exchange(Protocol):
    """One request and its response, as the data plane needs them (ASGI or the fast path).

    Headers are lower-cased ``(name, value)`` pairs; ``path`` is decoded, ``query`` the raw
    query string. A response is :meth:`start` then :meth:`body` pieces (the last with
    ``more=False``), or one :meth:`answer`; raising :class:`BrokenStream` drops the connection.
    """

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    server: tuple[str, int] | None

    @property
    def keyed(self) -> Keyed | None:
        """The client key's part in this request (``auth.mode: keys`` on the fast path), or
        None: the data plane has it admit the parsed body and tells it what a whole answer
        said (:class:`Keyed`)."""
        ...

    def raw_target(self) -> bytes:
        """The path as the client sent it (percent-encoded)."""
        ...

    async def read_body(self, declared: int | None, limit: int) -> bytes:
        """The whole request body; :class:`PayloadTooLarge` past ``limit``, :class:`ClientGone`
        when the client left first."""
        ...

    async def start(
        self, status: int, headers: list[tuple[bytes, bytes]], *, hold: bool = False
    ) -> None:
        """The response's status and headers (``hold``: the body follows at once, so the head
        may wait for its first piece and go out with it)."""
        ...

    async def body(self, chunk: bytes, *, more: bool) -> None:
        """A piece of the response body; ``more=False`` ends the response."""
        ...

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole response at once."""
        ...

    async def while_connected(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work``; if the client goes away meanwhile, it is cancelled (and that is not an
        error: the upstream request is closed and the slot freed)."""
        ...


class Keyed(Protocol):
    """What a client key does inside the data plane (:class:`gpugate.web.auth.Keyed`): the
    checks that need the parsed body, and the usage of the answer."""

    waiting: bool  # after :meth:`admit`: the estimate is still to be held (:meth:`reserve`)

    def admit(self, doc: dict[str, Any], body: bytes, model: str, *, stream: bool) -> bytes:
        """The body the upstream gets, or a :class:`~gpugate.errors.GpugateError` refusing it."""
        ...

    async def reserve(self, doc: dict[str, Any], size: int) -> None:
        """Hold the request's estimate in the store (a 429 when a limit is reached)."""
        ...

    def usage_read(self) -> tuple[int | None, int | None] | None:
        """The answer's prompt and completion tokens when the key read every piece of it (a
        stream whose usage it hides), else None: the data plane reads them itself."""
        ...

    def generated(self, reply: Reply, told: Generated) -> None:
        """Told what a whole answer said: the reply it came from and the data plane's reading
        of it (its usage)."""
        ...


class AsgiExchange:
    """An :class:`Exchange` over ASGI's ``receive`` and ``send``."""

    __slots__ = ("headers", "method", "path", "query", "receive", "scope", "send", "server")
    keyed = None  # the ASGI path's keys watch the messages (gpugate.web.auth._Watch)

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.query: bytes = scope.get("query_string", b"")
        self.headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.server: tuple[str, int] | None = scope.get("server")

    def raw_target(self) -> bytes:
        return _raw_path_of(self.scope)

    async def read_body(self, declared: int | None, limit: int) -> bytes:
        return await _read_body(self.receive, declared, limit)

    async def start(
        self, status: int, headers: list[tuple[bytes, bytes]], *, hold: bool = False
    ) -> None:
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, chunk: bytes, *, more: bool) -> None:
        await self.send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    async def while_connected(self, work: Coroutine[Any, Any, None]) -> None:
        """Relay while a watcher waits for the client to go away; if it does, this task is
        cancelled, which closes the upstream request and frees the slot at once.

        Every body is read whole before it is forwarded, so the watcher owns ``receive`` from
        the start and never competes with the body for it.
        """
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(_wait_for_disconnect(self.receive))

        def client_left(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                task.cancel()

        watcher.add_done_callback(client_left)
        try:
            await work
        except asyncio.CancelledError:
            if not (watcher.done() and not watcher.cancelled()):
                raise
            task.uncancel()
            log.info("client disconnected; upstream request closed")
        finally:
            watcher.remove_done_callback(client_left)
            watcher.cancel()


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _receive_chunk(receive: Receive) -> tuple[bytes, bool]:
    """One piece of the request body and whether more follows."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    return message.get("body", b""), message.get("more_body", False)


async def _read_body(receive: Receive, declared: int | None, limit: int) -> bytes:
    check_length(declared, limit)
    body, more = await _receive_chunk(receive)
    parts = [body]
    size = len(body)
    while more:
        chunk, more = await _receive_chunk(receive)
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds max_body_bytes ({limit})")
        parts.append(chunk)
    if size > limit:
        raise PayloadTooLarge(f"request body exceeds max_body_bytes ({limit})")
    return body if len(parts) == 1 else b"".join(parts)


def _raw_path_of(scope: Scope) -> bytes:
    """The path as the client sent it (percent-encoded), not the decoded ``path``."""
    raw: bytes | None = scope.get("raw_path")
    return raw if raw is not None else quote(scope["path"]).encode("ascii")


def check_length(declared: int | None, limit: int) -> None:
    """:class:`PayloadTooLarge` for a declared ``Content-Length`` past ``limit``."""
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds max_body_bytes ({limit})")
