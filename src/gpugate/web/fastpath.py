"""The fast path: the OpenAI routes served by the HTTP protocol itself, without ASGI (#21).

:func:`fast_protocol` is the HTTP protocol class ``gpugate serve`` gives uvicorn
(``uvicorn.Config(http=...)``): uvicorn's own ``HttpToolsProtocol`` under the connection limits
of :mod:`gpugate.web.connections`, whose ``POST /v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings`` are served by :class:`~gpugate.web.dataplane.Handler` over a
:class:`FastCycle` that writes to the socket directly: one pre-encoded head, ``Content-Length``
when the whole body is known (an error, a replay, a body that came in one piece), chunked
otherwise. Every other request on the same connection (before, between or after) is uvicorn's
usual ASGI cycle into the Starlette app, so ``/u/``, the admin plane, the console and jobs are
unchanged. The connection is uvicorn's in every other way: it is in ``server_state.connections``
and its requests in ``server_state.tasks``, it answers ``shutdown()`` for the graceful drain,
``limit_concurrency`` and ``timeout_keep_alive`` hold, pipelined requests queue and are answered
in order, ``Expect: 100-continue`` is answered when the body is awaited, a malformed request gets
its 400, and the header, body and connection limits are the same code.

What the ASGI middlewares do for these routes happens here by calling the same objects, found in
the app's middleware chain (:meth:`FastRoutes.find`): the access-log line
(:func:`gpugate.web.access_log.write`), the security headers
(:func:`~gpugate.web.response_headers.headers_for`), the shutdown guard's answer at the cut
(:meth:`~gpugate.web.shutdown.ShutdownGuard.track`), ``admin_listen``'s split (the admin
listener's requests all go to the app). With ``auth.mode: keys`` the request goes through
:meth:`ClientKeys.serve <gpugate.web.auth.ClientKeys.serve>` over this cycle (no ASGI messages):
the key's checks, then the data plane over an exchange that counts the key's usage.

Per request: one task (the data plane awaits the admission queue, the upstream, the store), no
disconnect watcher — :meth:`connection_lost` cancels the request, which closes the upstream
request and frees the admission slot at once. ``GPUGATE_FASTPATH=0`` in the environment serves
everything through ASGI instead (A/B benchmarks, or a suspected fast-path bug).

``POST /v1/jobs`` without a query is served over the same cycle too, by the jobs route's own
operation (:mod:`gpugate.web.fast_jobs`); the other job routes stay on ASGI.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gpugate.errors import PayloadTooLarge
from gpugate.web import access_log
from gpugate.web.access_log import AccessLog
from gpugate.web.auth import ClientKeys, Keyed
from gpugate.web.connections import ConnectionLimits, guarded_protocol
from gpugate.web.dataplane import DataPlane, Handler
from gpugate.web.exchange import BrokenStream, ClientGone, check_length
from gpugate.web.fast_jobs import JobCreation
from gpugate.web.listeners import ListenerSplit
from gpugate.web.response_headers import SecurityHeaders, headers_for
from gpugate.web.shutdown import Progress, ShutdownGuard, answer

log = logging.getLogger("gpugate.proxy")

ENVIRONMENT = "GPUGATE_FASTPATH"
"""``GPUGATE_FASTPATH=0``: no fast path, every request through ASGI."""
ROUTES = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"})
PIPELINE_DEPTH = 16
"""Pipelined requests read ahead of the one being answered, at most (each body up to 64 KiB):
reading on behind it is how a client that leaves is noticed at once; then reading pauses."""
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY = (204, 304)
_ERROR_500 = b"Internal Server Error"


class _Signal:
    """What a cycle's ``message_event`` is asked (``set``, ``clear``, ``wait``) for its one
    waiter, the request's task: an ``asyncio.Event`` allocates a deque of waiters (~0.8 KB) per
    request, which 1,000 open streams hold as long as they run."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> bool:
        if not self._set:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return True


class _Unanswered:
    """Fast-path requests being served whose response has not begun: while there are any, the
    loop has work queued for a client (:func:`busy`; :mod:`gpugate.web.collector` waits)."""

    count = 0


def busy() -> bool:
    """Whether a fast-path request is being served and its answer has not begun (a stream whose
    events are being relayed has begun: waiting for its next token is not work)."""
    return _Unanswered.count > 0


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the fast path is on (it is unless ``GPUGATE_FASTPATH=0``)."""
    return (os.environ if environ is None else environ).get(ENVIRONMENT, "1").strip() != "0"


@dataclass(frozen=True, slots=True)
class FastRoutes:
    """What the fast path calls, found in the served app's middleware chain."""

    handler: Handler
    guard: ShutdownGuard | None
    keys: ClientKeys | None
    access_log: bool
    behind_tls_proxy: bool
    admin_port: int | None
    jobs: JobCreation | None = None  # POST /v1/jobs (gpugate.web.fast_jobs)

    @classmethod
    def find(cls, app: ASGIApp) -> FastRoutes | None:
        """The pieces of ``app`` (as :func:`gpugate.web.app.create_app` builds it, perhaps in
        a :class:`ListenerSplit`); None when it has no data plane (some other app)."""
        guard = keys = None
        logged = tls_proxy = False
        admin_port = None
        layer: object = app
        for _ in range(16):  # the chain is a handful of layers deep
            if isinstance(layer, DataPlane):
                jobs = JobCreation.find(layer.app)
                return cls(layer.handler, guard, keys, logged, tls_proxy, admin_port, jobs)
            if isinstance(layer, ListenerSplit):
                admin_port = layer.admin_port
            elif isinstance(layer, AccessLog):
                logged = True
            elif isinstance(layer, SecurityHeaders):
                tls_proxy = layer.behind_tls_proxy
            elif isinstance(layer, ShutdownGuard):
                guard = layer
            elif isinstance(layer, ClientKeys):
                keys = layer
            layer = getattr(layer, "app", None)
            if layer is None:
                break
        return None


def fast_protocol(
    app: ASGIApp, limits: ConnectionLimits, environ: Mapping[str, str] | None = None
) -> type[HttpToolsProtocol]:
    """The HTTP protocol class for ``app`` under ``limits``: with the fast path unless it is
    turned off (:func:`enabled`) or ``app`` has no data plane."""
    routes = FastRoutes.find(app) if enabled(environ) else None
    if routes is None:
        return guarded_protocol(limits)
    return guarded_protocol(limits, FastPathProtocol, routes=routes)


class FastPathProtocol(HttpToolsProtocol):
    """Uvicorn's protocol whose OpenAI-route requests are :class:`FastCycle`\\ s.

    Used under :mod:`gpugate.web.connections`' limits (:func:`fast_protocol`), which call these
    methods once a request has passed them.
    """

    routes: FastRoutes
    running: FastCycle | None = None  # the request being answered (others may queue behind)
    #: When the last answer ended with nothing after it (the keep-alive timeout counts from
    #: here); None while a request is being read or answered.
    idle_since: float | None = None

    def on_message_begin(self) -> None:
        # uvicorn's, without the ASGI scope: built only for a request that goes to the app
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_headers_complete(self) -> None:
        if not self._serve_fast():
            self.scope = {  # type: ignore[typeddict-item]  # uvicorn's on_message_begin's
                "type": "http",
                "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
                "http_version": "1.1",
                "server": self.server,
                "client": self.client,
                "scheme": self.scheme,  # type: ignore[typeddict-item]
                "root_path": self.root_path,
                "headers": self.headers,
                "state": self.app_state.copy(),
            }
            super().on_headers_complete()

    def _serve_fast(self) -> bool:
        parser = self.parser
        path, _, query = self.url.partition(b"?")
        routes = self.routes
        if path not in ROUTES and (routes.jobs is None or not routes.jobs.serves(path, query)):
            return False
        if parser.get_method() != b"POST" or parser.should_upgrade():
            return False
        if routes.admin_port is not None and (self.server or ("", 0))[1] == routes.admin_port:
            return False  # the admin listener's: ListenerSplit answers it
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return False  # uvicorn's 503
        version = parser.get_http_version()
        cycle = FastCycle(
            self,
            path.decode("ascii"),
            query.partition(b"#")[0],
            version,
            keep_alive=version != "1.0" and parser.should_keep_alive(),
        )
        existing, self.cycle = self.cycle, cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, None)  # type: ignore[arg-type]  # joins server_state.tasks
        else:  # pipelined: answered in order, after the one in flight
            self.pipeline.appendleft((cycle, None))  # type: ignore[arg-type]
            if len(self.pipeline) >= PIPELINE_DEPTH:
                self.flow.pause_reading()  # read ahead no further (resumed by the next answer)
        return True

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if not isinstance(cycle, FastCycle):
            super().on_body(body)
        elif cycle.feed(body) > HIGH_WATER_LIMIT and self.pipeline:
            self.flow.pause_reading()  # a queued request's body: read ahead no further

    # uvicorn arms a timer for timeout_keep_alive at every answer's end and cancels it at the
    # next request's first byte: a uvloop timer made and cancelled per request (~2.7 us). Here
    # the connection notes when it went idle, and one timer, armed when there is none, checks
    # at its due time: a connection idle since then is closed, as uvicorn's would be; one that
    # served a request meanwhile is looked at again when that idle time would end. A connection
    # kept busy has a timer every timeout_keep_alive, not every request.

    def _unset_keepalive_if_required(self) -> None:
        self.idle_since = None  # a request is coming in, or the connection is ending

    def on_response_complete(self) -> None:
        # uvicorn's, but for the keep-alive timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self.idle_since = now = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(
                now + self.timeout_keep_alive, self._keep_alive_due
            )

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        if self.idle_since is None:
            return  # busy: the answer's end arms it again
        due = self.idle_since + self.timeout_keep_alive
        if self.loop.time() >= due:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)
        for gone in (self.running, cycle):  # with pipelining, the one answered is not the last
            if isinstance(gone, FastCycle):
                gone.lost()


class FastCycle:
    """One fast-path request and its response: the :class:`~gpugate.web.exchange.Exchange`
    the data plane serves, written straight to the transport.

    It has the attributes uvicorn's protocol and the connection limits read of a cycle
    (``more_body``, ``message_event``, ``response_started``, ``response_complete``,
    ``disconnected``, ``keep_alive``) and uvicorn's ``run_asgi`` entry point.
    """

    __slots__ = (
        "_body_read",
        "_chunked",
        "_counted",
        "_finished",
        "_held",
        "_limit",
        "_parts",
        "_progress",
        "_size",
        "_task",
        "answered",
        "disconnected",
        "headers",
        "http_version",
        "keep_alive",
        "keyed",
        "message_event",
        "method",
        "more_body",
        "path",
        "protocol",
        "query",
        "response_complete",
        "response_started",
        "server",
        "status",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        protocol: FastPathProtocol,
        path: str,
        query: bytes,
        http_version: str,
        *,
        keep_alive: bool,
    ) -> None:
        self.protocol = protocol
        self.method = "POST"
        self.path = path
        self.query = query
        self.headers: list[tuple[bytes, bytes]] = protocol.headers
        self.server: tuple[str, int] | None = protocol.server  # type: ignore[assignment]
        self.http_version = http_version
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.message_event = _Signal()
        self.disconnected = False
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.status: int | str = "-"  # for the access log: "-" while nothing was answered
        self.answered: list[tuple[bytes, bytes]] = []
        self.keyed: Keyed | None = None  # auth.mode keys: set by ClientKeys.serve
        self._limit = protocol.routes.handler.gateway.config.server.max_body_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._held = False  # the head waits for the body's first piece
        self._chunked = False
        self._progress: Progress | None = None
        self._task: asyncio.Task[object] | None = None
        self._finished = False
        self._body_read = False
        self._counted = False  # in _Unanswered until the response begins or the request ends

    # --- from the protocol ----------------------------------------------------------------

    def feed(self, body: bytes) -> int:
        """A piece of the request body (kept up to the limit; past it, only counted); the
        size received so far."""
        if not self.response_complete:
            self._size += len(body)
            if self._size <= self._limit:
                self._parts.append(body)
            self.message_event.set()
        return self._size

    def lost(self) -> None:
        """The connection is gone: a request still running is cancelled (the upstream request
        closed, the slot freed)."""
        self.disconnected = True
        self.message_event.set()  # a body read waiting sees it too
        task = self._task
        if task is not None and not self._finished and not self.response_complete:
            task.cancel()

    # --- the request's task ---------------------------------------------------------------

    async def run_asgi(self, _app: object) -> None:
        """Serve the request (uvicorn's entry point for a cycle; there is no ASGI app)."""
        if self.disconnected:
            return
        routes = self.protocol.routes
        task = asyncio.current_task(self.protocol.loop)  # the loop given: no getpid()
        assert task is not None
        self._task = task
        self.protocol.running = self
        self._counted = True
        _Unanswered.count += 1
        guard = routes.guard
        if guard is not None:
            self._progress = guard.track(task)
        started = time.perf_counter()
        try:
            await self._serve(routes)
        except asyncio.CancelledError:
            if not await self._cancelled(task, guard):
                self.abort()
                raise
        except ClientGone:
            pass
        except BrokenStream:
            self.abort()  # the client sees the truncation
        except Exception:
            log.exception("the fast path failed on %s", self.path)
            if self.response_started:
                self.abort()
            else:
                self.keep_alive = False
                await self.answer(
                    500, [(b"content-type", b"text/plain; charset=utf-8")], _ERROR_500
                )
        finally:
            self._ended(task, guard, started)

    def _ended(
        self, task: asyncio.Task[object], guard: ShutdownGuard | None, started: float
    ) -> None:
        self._finished = True
        self._begun()
        if self.protocol.running is self:
            self.protocol.running = None
        if guard is not None:
            guard.untrack(task)
        if self.protocol.routes.access_log and access_log.log.isEnabledFor(logging.INFO):
            access_log.write(
                logging.INFO, self.method, self.path, self.status, self.answered, started
            )
        if not self.response_complete and not self.disconnected:
            self.abort()  # a response left unfinished must not look whole

    async def _serve(self, routes: FastRoutes) -> None:
        if routes.jobs is not None and self.path == "/v1/jobs":
            await routes.jobs.serve(self)
            return
        keys = routes.handler.gateway.keys
        if routes.keys is not None and keys is not None and keys.enforced:
            await routes.keys.serve(self, routes.handler)  # the keys' checks, no ASGI
        else:
            await routes.handler.serve(self, openai=True)

    async def _cancelled(self, task: asyncio.Task[object], guard: ShutdownGuard | None) -> bool:
        """Whether a cancellation is ours to absorb: the cut (answered), or the client gone."""
        progress = self._progress
        if guard is not None and progress is not None and guard.was_cut(task):
            if progress.ended:
                return False
            task.uncancel()
            try:
                await answer(self.send, progress)
            except ConnectionAbortedError:
                self.abort()
            return True
        if self.disconnected:
            task.uncancel()
            log.info("client disconnected; upstream request closed")
            return True
        return False

    def abort(self) -> None:
        """Drop the connection (a response cut off must not look whole)."""
        self.keep_alive = False
        self.protocol.transport.close()

    # --- the Exchange ---------------------------------------------------------------------

    def raw_target(self) -> bytes:
        return self.path.encode("ascii")

    async def read_body(self, declared: int | None, limit: int) -> bytes:
        check_length(declared, limit)
        while self.more_body and self._size <= limit and not self.disconnected:
            if self.waiting_for_100_continue:
                self.waiting_for_100_continue = False
                transport = self.protocol.transport
                if not transport.is_closing():
                    transport.write(_CONTINUE)
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected:
            raise ClientGone
        if self._size > limit:
            raise PayloadTooLarge(f"request body exceeds max_body_bytes ({limit})")
        self._body_read = True
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def start(
        self, status: int, headers: list[tuple[bytes, bytes]], *, hold: bool = False
    ) -> None:
        if self.disconnected or self.response_started:
            return
        self.status, self.answered = status, headers
        if hold:
            self._held = True  # not started yet: a cut or a failure may still answer instead
            return
        self._held = False
        flow = self.protocol.flow
        if flow.write_paused:
            await flow.drain()
        self.response_started = True
        self._begun()
        self.protocol.transport.write(self._head(None))

    async def body(self, chunk: bytes, *, more: bool) -> None:
        if self.disconnected or self.response_complete:
            return
        keyed = self.keyed
        if keyed is not None and keyed.stream is not None:  # usage the client did not ask for
            chunk = keyed.stream.hidden(chunk, more=more)
        flow = self.protocol.flow
        if flow.write_paused:
            await flow.drain()
        head = b""
        if self._held:
            self._held = False
            self.response_started = True
            self._begun()
            head = self._head(None if more else len(chunk))
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunk else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            data = chunk
        if head or data:
            self.protocol.transport.write(head + data if head else data)
        if not more:
            self._complete()

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.disconnected or self.response_started:
            return
        self.status, self.answered = status, headers
        self._held = False
        flow = self.protocol.flow
        if flow.write_paused:
            await flow.drain()
        self.response_started = True
        self._begun()
        self.protocol.transport.write(self._head(len(body)) + body)
        self._complete()

    async def while_connected(self, work: Coroutine[Any, Any, None]) -> None:
        await work  # connection_lost cancels this task: no watcher needed

    # --- ASGI's send, for the shutdown guard's answer ----------------------------------------

    async def send(self, message: Message) -> None:
        """ASGI's ``send``, onto :meth:`start` and :meth:`body`."""
        if message["type"] == "http.response.start":
            await self.start(message["status"], list(message.get("headers", ())))
        elif message["type"] == "http.response.body":
            await self.body(message.get("body", b""), more=message.get("more_body", False))

    # --- the response ---------------------------------------------------------------------

    def _head(self, length: int | None) -> bytes:
        """The status line and headers; ``length``: the whole body's, when it is known."""
        status = self.status
        assert isinstance(status, int)
        protocol = self.protocol
        parts = [STATUS_LINE[status]]
        framed = False
        event_stream = False
        for name, value in (*protocol.server_state.default_headers, *self.answered):
            if name == b"content-length":
                framed = True
            elif name == b"content-type":
                event_stream = value.startswith(b"text/event-stream")
            parts += (name, b": ", value, b"\r\n")
        tls = protocol.routes.behind_tls_proxy or protocol.scheme == "https"
        for name, value in headers_for(self.path, tls=tls):
            parts += (name, b": ", value, b"\r\n")
        if not framed and status not in _NO_BODY:
            if length is None:
                self._chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:
                parts.append(b"content-length: %d\r\n" % length)
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        progress = self._progress
        if progress is not None:
            progress.started = True
            progress.event_stream = event_stream
        return b"".join(parts)

    def _begun(self) -> None:
        if self._counted:
            self._counted = False
            _Unanswered.count -= 1

    def _complete(self) -> None:
        self.response_complete = True
        if self._progress is not None:
            self._progress.ended = True
        self.message_event.set()
        protocol = self.protocol
        if not self.keep_alive:
            protocol.transport.close()
        protocol.on_response_complete()
