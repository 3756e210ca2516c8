"""The protocol-level hot-path prototype: asyncio ``Protocol``s with ``httptools`` on both sides,
uvloop, no ASGI and no client-library objects per request.

The client's request is parsed by ``httptools.HttpRequestParser`` (callbacks for the URL, the
headers and the body only); the hot path of ``hotpath.HotPath`` decides (parse ``model`` and
``stream``, pick, claim, admit); the request goes to the upstream over a pooled keep-alive
``hotpath_upstream.RawConnection`` as a head and the client's original body bytes; the answer
comes back as bytes and is written to the client as they arrive, **without re-framing**: only
its head is rewritten (hop-by-hop headers dropped, ``x-gateway-upstream`` and ``x-request-id``
added), a ``Content-Length`` or chunked body passes through as the upstream framed it. Nothing
per request is a task or a coroutine when a pooled connection is free: it is callbacks from
the client's bytes to the upstream's and back. Backpressure: a client that reads slowly pauses
the upstream connection's reading. A client that goes away closes the upstream connection and
releases the slot at once.

    python bench/hotpath_proto.py --port 8200 --route json-model=127.0.0.1:9001 ...
        [--parse json|orjson|msgspec] [--metrics prom|cheap] [--workers N]

``--workers N`` starts N processes, each its own listening socket on the port with
``SO_REUSEPORT`` (the kernel spreads connections among them).

``--uvicorn`` runs the same protocol *inside uvicorn*, as its HTTP protocol class
(``uvicorn.Config(http=HostedConnection)``): uvicorn keeps the listening socket, the lifespan,
the signals and the graceful shutdown; each connection starts on the fast path, and the first
request for any other route hands the connection, with the bytes read so far, to uvicorn's own
``HttpToolsProtocol`` and so to the ASGI app (here a stand-in for gpugate's Starlette app).
That is how phase 2 can move the data plane without moving the admin plane and the console.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from typing import Any, ClassVar, cast

import httptools
import uvloop
from hotpath import HOP_BY_HOP, HotPath, Pass, Refused, arguments, routes_of, upstream_head
from hotpath_upstream import Connection, Pool, RawConnection, UpstreamFailed

ROUTES = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"})
FIRST_BYTE_S = 60.0
MAX_REQUEST_LINE = 8192
_DROP = HOP_BY_HOP - {b"transfer-encoding"}  # the body's framing is relayed as it is
_VALID_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
_IDS = (secrets.token_hex(6), itertools.count(1))

Request = tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes, bool, bytes | None]


def request_id(offered: bytes | None) -> bytes:
    if offered is not None and _VALID_ID.match(offered):
        return offered
    return f"{_IDS[0]}{next(_IDS[1]):08x}".encode()


def rewrite_head(head: bytes, extra: bytes) -> bytes:
    """The upstream's response head without its hop-by-hop headers, with ``extra`` added."""
    lines = head.split(b"\r\n")
    kept = [lines[0]]
    kept += [ln for ln in lines[1:] if ln[: ln.find(b":")].strip().lower() not in _DROP]
    return b"\r\n".join(kept) + extra + b"\r\n\r\n"


def plain_response(status: int, body: bytes, *, keep: bool, content_type: bytes) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 429: b"Too Many Requests"}
    head = [
        b"HTTP/1.1 " + str(status).encode() + b" " + reason.get(status, b"Error"),
        b"content-type: " + content_type,
        b"content-length: " + str(len(body)).encode(),
    ]
    if not keep:
        head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class App:
    def __init__(self, hot: HotPath) -> None:
        self.hot = hot
        self.pools = {up.id: Pool(up.host, up.port, RawConnection) for up in hot.upstreams()}
        self.tasks: set[asyncio.Task[None]] = set()


class ClientConnection(asyncio.Protocol):
    """One client connection: requests parsed, relayed one at a time (pipelined ones queue)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.rid: bytes | None = None
        self.waiting: deque[Request] = deque()
        # the exchange in flight
        self.current: Pass | None = None
        self.upstream: Connection | None = None
        self.keep = True
        self.head_buf = b""
        self.head_sent = False
        self.status = 0
        self.sent_at = 0.0
        self.ttfb = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.extra = b""

    # -- the client's side: asyncio --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._answer(400, b'{"error":"upgrades are not served"}', keep=False)
        except httptools.HttpParserError:
            self._answer(400, b'{"error":"malformed request"}', keep=False)

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        self.transport = None
        self.waiting.clear()
        if self.current is not None:  # gone mid-answer: stop the upstream, free the slot
            if self.upstream is not None:
                self.upstream.sink = None
                self.upstream.close()
            self._cancel_timer()
            self.app.hot.abandon(self.current)
            self.current = None

    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    # -- the client's side: httptools --
    def on_message_begin(self) -> None:
        self.url, self.headers, self.parts, self.rid = b"", [], [], None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"x-request-id":
            self.rid = value
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        parts = self.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        request = (
            self.parser.get_method(),
            self.url,
            self.headers,
            body,
            self.parser.should_keep_alive(),
            self.rid,
        )
        if self.current is None and not self.waiting:
            self._start(request)
        else:
            self.waiting.append(request)

    # -- one exchange --
    def _start(self, request: Request) -> None:
        method, url, headers, body, keep, rid = request
        started = time.perf_counter()
        self.keep = keep
        path = url.partition(b"?")[0]
        if path not in ROUTES or method != b"POST":
            self._local(path, keep=keep)
            return
        hot = self.app.hot
        try:
            p, _stream = hot.admit(body, started)
        except Refused as refused:
            self._answer(refused.status, refused.body(), keep=keep)
            return
        self.current = p
        self.head_buf, self.head_sent, self.status = b"", False, 0
        extra = b"\r\nx-gateway-upstream: " + p.upstream.id.encode()
        self.extra = extra + b"\r\nx-request-id: " + request_id(rid)
        if not keep:
            self.extra += b"\r\nconnection: close"
        head = upstream_head(method, url, headers, p.upstream, len(body))
        pool = self.app.pools[p.upstream.id]
        if (conn := pool.take()) is not None:
            self._send(conn, head, body)
        else:
            task = self.loop.create_task(self._connect_and_send(pool, head, body))
            self.app.tasks.add(task)
            task.add_done_callback(self.app.tasks.discard)

    async def _connect_and_send(self, pool: Pool, head: bytes, body: bytes) -> None:
        try:
            conn = await pool.connect()
        except UpstreamFailed as exc:
            self._fail_before_head(exc)
            return
        if self.current is None:  # the client left meanwhile
            pool.give_back(conn)
            return
        self._send(conn, head, body)

    def _send(self, conn: Connection, head: bytes, body: bytes) -> None:
        self.upstream = conn
        self.sent_at = time.perf_counter()
        conn.send(self, head, body)
        self.timer = self.loop.call_later(FIRST_BYTE_S, self._late)

    def _late(self) -> None:
        self.timer = None
        if self.upstream is not None and not self.head_sent:
            self.upstream.sink = None
            self.upstream.close()
            self._fail_before_head(UpstreamFailed("no response head in time"))

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # -- the upstream's side (the Sink of hotpath_upstream) --
    def head(self, conn: Connection) -> None:
        pass  # raw connections deliver the head within data()

    def data(self, conn: Connection, data: bytes) -> None:
        transport = self.transport
        if self.head_sent:
            if transport is not None:
                transport.write(data)
            return
        if not conn.head_done:
            self.head_buf += data
            return
        buf = self.head_buf + data if self.head_buf else data
        self.head_buf = b""
        end = buf.find(b"\r\n\r\n")
        self.head_sent = True
        self.status = conn.parser.get_status_code()
        self.ttfb = time.perf_counter() - self.sent_at
        self._cancel_timer()
        if transport is not None:
            transport.writelines((rewrite_head(buf[:end], self.extra), buf[end + 4 :]))

    def end(self, conn: Connection) -> None:  # noqa: ARG002
        p, self.current, self.upstream = self.current, None, None
        if p is not None:
            self.app.hot.finish(p, self.status, self.ttfb)
        self._next()

    def failed(self, conn: Connection, exc: Exception) -> None:  # noqa: ARG002
        if not self.head_sent:
            self._fail_before_head(exc)
            return
        p, self.current, self.upstream = self.current, None, None  # broken mid-body
        self._cancel_timer()
        if p is not None:
            self.app.hot.abandon(p)
        if self.transport is not None:
            self.transport.close()  # the client sees the truncation

    def _fail_before_head(self, exc: Exception) -> None:
        p, self.current, self.upstream = self.current, None, None
        self._cancel_timer()
        if p is not None:
            self.app.hot.abandon(p)
        body = b'{"error":{"code":"UPSTREAM_ERROR","message":"' + str(exc).encode() + b'"}}'
        self._answer(502, body, keep=self.keep)

    # -- answers of our own --
    def _local(self, path: bytes, *, keep: bool) -> None:
        if path == b"/metrics":
            text = self.app.hot.metrics.render()
            self._answer(200, text, keep=keep, content_type=b"text/plain; version=0.0.4")
        elif path in (b"/health", b"/readyz"):
            self._answer(200, b"ok", keep=keep, content_type=b"text/plain")
        else:
            self._answer(404, b'{"error":"not found"}', keep=keep)

    def _answer(
        self, status: int, body: bytes, *, keep: bool, content_type: bytes = b"application/json"
    ) -> None:
        if self.transport is None:
            return
        self.transport.write(plain_response(status, body, keep=keep, content_type=content_type))
        self.keep = keep
        self._next()

    def _next(self) -> None:
        if not self.keep:
            if self.transport is not None:
                self.transport.close()
            return
        if self.waiting and self.current is None:
            self._start(self.waiting.popleft())


class HostedConnection(ClientConnection):
    """The fast path as uvicorn's HTTP protocol; other routes go to uvicorn's own protocol."""

    app_holder: ClassVar[list[App]] = []  # the worker's App, made at the first connection
    routes: ClassVar[dict[str, tuple[str, int]]] = {}
    options: ClassVar[tuple[str, str]] = ("json", "prom")

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not self.app_holder:
            self.app_holder.append(App(HotPath(self.routes, *self.options)))
        super().__init__(self.app_holder[0])
        self.config, self.server_state, self.app_state = config, server_state, app_state
        self.pending = b""
        self.between = True  # no request begun and unanswered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server_state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close when idle, else after the answer in flight."""
        if self.current is None and self.transport is not None:
            self.transport.close()
        self.keep = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.between = False

    def _next(self) -> None:
        self.between = not self.waiting
        super()._next()

    def data_received(self, data: bytes) -> None:
        if self.between and self.current is None:
            buf = self.pending + data if self.pending else data
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                if len(buf) > MAX_REQUEST_LINE:  # nothing a client sends grows without bound
                    self._answer(414, b'{"error":"request line too long"}', keep=False)
                    return
                self.pending = buf  # the request line is not complete yet
                return
            self.pending = b""
            parts = buf[:line_end].split(b" ")
            target = parts[1].partition(b"?")[0] if len(parts) == 3 else b""
            if target not in ROUTES:
                self._hand_off(buf)
                return
            data = buf
        super().data_received(data)

    def _hand_off(self, buf: bytes) -> None:
        """Give the connection and what it has sent so far to uvicorn's own protocol."""
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        transport, self.transport = self.transport, None
        assert transport is not None
        self.server_state.connections.discard(self)
        inner = HttpToolsProtocol(
            config=self.config,
            server_state=self.server_state,
            app_state=self.app_state,
            _loop=self.loop,
        )
        transport.set_protocol(inner)
        inner.connection_made(transport)  # type: ignore[arg-type]
        inner.data_received(buf)


async def stand_in_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What gpugate's Starlette app is to the hosted fast path: everything that is not hot
    (here /metrics from the fast path's own registry, /health, and 404)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/metrics" and HostedConnection.app_holder:
        status, body = 200, HostedConnection.app_holder[0].hot.metrics.render()
    elif path in ("/health", "/readyz"):
        status, body = 200, b"ok"
    else:
        status, body = 404, b'{"error":"not found"}'
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_in_uvicorn(args: argparse.Namespace) -> None:
    import uvicorn
    from bare_proxy import uvicorn_config

    HostedConnection.routes = routes_of(args)
    HostedConnection.options = (args.parse, args.metrics)
    config = uvicorn_config(stand_in_app, host="127.0.0.1", port=args.port, http=HostedConnection)
    uvicorn.Server(config).run()


def listen(port: int, *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    sock.setblocking(False)  # noqa: FBT003
    return sock


async def serve(hot: HotPath, sock: socket.socket) -> None:
    app = App(hot)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ClientConnection(app), sock=sock, backlog=4096)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def supervise(workers: int) -> int:
    """Start ``workers`` copies of this process, each with its own SO_REUSEPORT socket, and stop
    them all on SIGTERM."""
    argv = [sys.executable, *sys.argv]
    at = argv.index("--workers")
    del argv[at : at + 2]
    children = [subprocess.Popen([*argv, "--reuse-port"]) for _ in range(workers)]

    def stop(_signum: int, _frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return max(child.wait() for child in children)


def main() -> int:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--uvicorn", action="store_true", help="run inside uvicorn")
    args = parser.parse_args()
    if args.workers > 1:
        return supervise(args.workers)
    if args.uvicorn:
        serve_in_uvicorn(args)
        return 0
    hot = HotPath(routes_of(args), args.parse, args.metrics)
    sock = listen(args.port, reuse_port=args.reuse_port)
    uvloop.run(serve(hot, sock))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
