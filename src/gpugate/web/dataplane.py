"""The data plane: the OpenAI-compatible routes and ``/u/{upstream}/{path}``.

These are the hot routes, so they bypass the framework: the body is read once, only ``model`` and
``stream`` are looked at, the original bytes are forwarded, and the upstream's response is relayed
chunk by chunk as it arrives (no buffering, no re-serialisation).

:class:`Handler` is the logic, written against an :class:`Exchange` (one request and its
response: read the body, start, body, a whole answer) rather than ASGI messages, so it runs the
same under two servers: :class:`DataPlane`, an ASGI middleware over the Starlette app (``/u/``
always, and the OpenAI routes with ``GPUGATE_FASTPATH=0``), and :mod:`gpugate.web.fastpath`, the
HTTP protocol that serves the OpenAI routes itself, writing to the socket (decisions §11).

When the client goes away while a response is in progress, the upstream connection is closed and
the admission slot freed at once: under ASGI a watcher waits for ``http.disconnect``; the fast
path's protocol cancels the request when its connection is lost. An upstream that breaks off an
SSE stream ends it with a final event (``event: error`` whose data is an OpenAI-shaped error with
code ``UPSTREAM_ERROR`` or ``UPSTREAM_TIMEOUT``), which the ``openai`` client raises as an
``APIError``; any other body is cut off (the connection is closed without the final chunk), so a
truncation is never silent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from gpugate.core import raw_path
from gpugate.core.classes import RequestClass, parse_request_class
from gpugate.errors import (
    BadRequest,
    ExternalUpstreamForbidden,
    GpugateError,
    KeyLimited,
    MethodNotAllowed,
    UpstreamError,
)
from gpugate.logs import request_id
from gpugate.services.azure_di import allow_external
from gpugate.services.continuation import (
    KEEP_LIMIT,
    MAX_CONTINUATIONS,
    Diverged,
    Replay,
    continuable,
    delivered,
)
from gpugate.services.idempotency import StoredResponse, Ticket
from gpugate.services.proxy import Outbound, Reply
from gpugate.telemetry import (
    Generation,
    continuation_ended,
    continuation_span,
    generated_span,
    refused_span,
    request_span,
)
from gpugate.web.bodies import json_document
from gpugate.web.errors import error_body, error_headers, status_of
from gpugate.web.exchange import AsgiExchange, BrokenStream, ClientGone, Exchange
from gpugate.web.requestid import HEADER as REQUEST_ID
from gpugate.web.requestid import RequestIds
from gpugate.wiring import Gateway

log = logging.getLogger("gpugate.proxy")

OPENAI_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
RAW_PREFIX = "/u/"
_JSON = [(b"content-type", b"application/json")]
_ATTEMPTS = [str(n).encode() for n in range(16)]
#: The largest single SSE event relayed (a bigger one is a broken stream, not a memory sink).
EVENT_LIMIT = 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Seen:
    """The request headers the data plane reads, found in one pass."""

    content_length: int | None
    request_class: str | None
    idempotency_key: str | None
    request_id: bytes | None


def _scan(headers: list[tuple[bytes, bytes]]) -> _Seen:
    length = cls = key = rid = None
    for name, value in headers:
        if name == b"content-length":
            length = int(value) if value.isdigit() else None
        elif name == b"x-request-class":
            cls = value.decode("latin-1")
        elif name == b"idempotency-key":
            key = value.decode("latin-1")
        elif name == b"x-request-id":
            rid = value
    return _Seen(length, cls, key, rid)


class Handler:
    """The data plane's logic over an :class:`Exchange` (see the module docstring)."""

    def __init__(self, gateway: Gateway, ids: RequestIds) -> None:
        self.gateway = gateway
        self.ids = ids

    async def serve(self, ex: Exchange, *, openai: bool) -> None:
        """Serve one request to an OpenAI route (``openai``) or to ``/u/``."""
        seen = _scan(ex.headers)
        rid = self.ids.choose(seen.request_id)
        token = request_id.set(rid.decode())
        try:
            await (self._openai if openai else self._raw)(ex, seen, rid)
        except ClientGone:
            return
        finally:
            request_id.reset(token)

    async def refuse_method(self, ex: Exchange) -> None:
        """A method an OpenAI route does not take: 405 ``METHOD_NOT_ALLOWED``, ``Allow: POST``
        (as Starlette answers for its routes), counted like any refusal before routing."""
        received_at = self.gateway.clock.monotonic()
        seen = _scan(ex.headers)
        rid = self.ids.choose(seen.request_id)
        exc = MethodNotAllowed(f"{ex.path} takes POST only, not {ex.method}")
        self.gateway.proxy.refused(_unrouted(ex, seen, received_at), exc)
        headers = [*_JSON, (b"allow", b"POST"), (REQUEST_ID, rid)]
        await ex.answer(status_of(exc), headers, error_body(exc))

    async def _openai(self, ex: Exchange, seen: _Seen, rid: bytes) -> None:
        gw = self.gateway
        received_at = gw.clock.monotonic()
        out: Outbound | None = None
        headers = ex.headers
        span = request_span(gw.tracer, "POST", ex.path, headers, ex.server)
        error: str | None = None
        try:
            body = await ex.read_body(seen.content_length, gw.config.server.max_body_bytes)
            doc = _parse_doc(body)
            model, stream = _routing_fields(doc)
            path = ex.path + "?" + ex.query.decode("latin-1") if ex.query else ex.path
            keyed = ex.keyed
            if keyed is not None:  # a client key's checks of the body, its reservation
                try:
                    body = keyed.admit(doc, body, model, stream=stream)
                    if keyed.waiting:
                        await keyed.reserve(doc, len(body))
                except KeyLimited:  # a kept answer is replayed before admission (§3)
                    key = seen.idempotency_key
                    if key is None or await gw.idempotency.kept(key, "POST", path, body) is None:
                        raise
                    keyed.waiting = False
            span.set("gen_ai.request.model", model[:200])
            cls = parse_request_class(seen.request_class, default=RequestClass.INTERACTIVE)
            out = Outbound(
                "POST",
                path,
                headers,
                body,
                cls,
                received_at,
                model=model,
                doc=doc,
                stream=stream,
                span=span,
            )
            ticket: Ticket | None = None
            if seen.idempotency_key is not None:
                scoped = gw.config.auth.mode == "keys"  # the key is the tenant's own
                begun = await gw.idempotency.begin(
                    seen.idempotency_key, "POST", path, body, tenant_scoped=scoped
                )
                if isinstance(begun, StoredResponse):
                    gw.metrics.idempotent_replays.inc()
                    await _send_stored(ex, begun, rid, gw.clock.monotonic() - received_at)
                    return
                ticket = begun
            await ex.while_connected(self._relay(out, ex, rid, ticket, keep=not stream))
        except GpugateError as exc:
            error = refused_span(span, status_of(exc), exc.code)
            gw.proxy.refused(out or _unrouted(ex, seen, received_at), exc)
            await _send_error(ex, exc, rid)
        finally:
            span.end(error)

    async def _raw(self, ex: Exchange, seen: _Seen, rid: bytes) -> None:
        """``/u/{upstream}/{path}``: the raw path checked (:mod:`gpugate.core.raw_path`), the
        whole body received and bounded *before* admission, so a client that trickles, aborts
        or oversends holds no slot and is never counted against the upstream (#14 defect 1)."""
        gw = self.gateway
        received_at = gw.clock.monotonic()
        out: Outbound | None = None
        try:
            upstream_id, path = raw_path.split(ex.raw_target())
            if not allow_external(_header(ex.headers, b"x-allow-external")):
                _refuse_external(gw, upstream_id)
            cls = parse_request_class(seen.request_class, default=RequestClass.INTERACTIVE)
            body: bytes | None = None
            if _has_body(ex.method, ex.headers):
                body = await ex.read_body(seen.content_length, gw.config.server.max_body_bytes)
            if ex.query:
                path += "?" + ex.query.decode("latin-1")
            out = Outbound(
                ex.method,
                path,
                ex.headers,
                body,
                cls,
                received_at,
                upstream_id=upstream_id,
                raw=True,
            )
            await ex.while_connected(self._relay(out, ex, rid, None, keep=False))
        except GpugateError as exc:
            gw.proxy.refused(out or _unrouted(ex, seen, received_at), exc)
            await _send_error(ex, exc, rid)

    async def _relay(
        self, out: Outbound, ex: Exchange, rid: bytes, ticket: Ticket | None, *, keep: bool
    ) -> None:
        gw = self.gateway
        try:
            reply = await gw.proxy.open(out)
        except GpugateError:
            if ticket is not None:
                await asyncio.shield(gw.idempotency.abandon(ticket))
            raise
        if out.stream and reply.status == 200 and _is_sse(reply):
            await _relay_stream(gw, out, reply, ex, rid, ticket)
            return
        code: str | None = None
        seen = Generation(out.received_at, gw.clock.monotonic, stream=out.stream)
        try:
            await ex.start(reply.status, _head(reply, rid), hold=True)
            try:
                if ticket is None:
                    await _relay_body(reply, ex, seen)
                    return
                cap = gw.idempotency.max_body_bytes if keep else None
                last, kept = await _relay_kept(reply, ex, seen, cap)
            except UpstreamError as exc:
                reply.broke()
                code = exc.code
                await _end_broken_stream(ex, reply, exc)
                return
            await _settle(gw, ticket, reply, kept)  # kept before the client sees the end,
            ticket = None  # so a retry replays
            await ex.body(last, more=False)
        finally:
            if code is None and reply.at_eof() and out.model is not None:
                _generated(gw, out, reply, seen, ex)
            reply.close(code)
            if ticket is not None:
                await asyncio.shield(gw.idempotency.abandon(ticket))


class DataPlane:
    """ASGI middleware that serves the data-plane routes and passes everything else on."""

    def __init__(self, app: ASGIApp, gateway: Gateway, ids: RequestIds) -> None:
        self.app = app
        self.handler = Handler(gateway, ids)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path in OPENAI_ROUTES:
                ex = AsgiExchange(scope, receive, send)
                if scope["method"] == "POST":
                    await self.handler.serve(ex, openai=True)
                else:  # the fast path hands these on too
                    await self.handler.refuse_method(ex)
                return
            if path.startswith(RAW_PREFIX):
                await self.handler.serve(AsgiExchange(scope, receive, send), openai=False)
                return
        await self.app(scope, receive, send)


async def _relay_body(reply: Reply, ex: Exchange, seen: Generation) -> None:
    """A body relayed piece by piece as it arrives, ending with its last piece."""
    while chunk := await reply.read_chunk():
        seen.chunk(chunk)
        last = reply.at_eof()
        await ex.body(chunk, more=not last)
        if last:
            return
    await ex.body(b"", more=False)


async def _relay_kept(
    reply: Reply, ex: Exchange, seen: Generation, cap: int | None
) -> tuple[bytes, list[bytes] | None]:
    """A body under an ``Idempotency-Key``, relayed but for its last piece, which waits for the
    key's settle (a length-framed body ends with its last byte: the client must not see the end
    before the answer is kept); that piece, and the body kept (None: over ``cap``, or no cap)."""
    kept: list[bytes] | None = None if cap is None else []
    size = 0
    held = b""
    try:
        while chunk := await reply.read_chunk():
            seen.chunk(chunk)
            if kept is not None:
                kept.append(chunk)
                size += len(chunk)
                if cap is not None and size > cap:
                    kept = None  # too large to keep: the key is released at the end
            if held:
                await ex.body(held, more=True)
            held = chunk
    except UpstreamError:
        if held:
            await ex.body(held, more=True)
        raise
    return held, kept


def _generated(gw: Gateway, out: Outbound, reply: Reply, seen: Generation, ex: Exchange) -> None:
    """A whole answer went by: its GenAI histograms, the request span's usage, and the
    exchange's client key (:attr:`~Exchange.keyed`) told (its usage)."""
    keyed = ex.keyed
    read = None if keyed is None else keyed.usage_read()  # a hidden stream's: every piece read
    told = seen.finish(model=out.span.recording, usage=read)  # the model is only a span's
    if reply.status < 300:
        gw.proxy.generated(out, reply, told)
    generated_span(out.span, reply.status, told)
    if keyed is not None:
        keyed.generated(reply, told)


async def _relay_stream(
    gw: Gateway, out: Outbound, reply: Reply, ex: Exchange, rid: bytes, ticket: Ticket | None
) -> None:
    """A streamed answer: the headers, then the events (a stream is never kept under a key)."""
    try:
        # the events are re-framed (CRLF as LF, a missing [DONE], a continuation, an error
        # event): the upstream's length does not hold; the head goes out with the first events
        head = [h for h in _head(reply, rid) if h[0] != b"content-length"]
        try:
            await ex.start(reply.status, head, hold=True)
        except BaseException:
            reply.close()
            raise
        await _relay_events(gw, out, reply, ex)
    finally:
        if ticket is not None:
            await asyncio.shield(gw.idempotency.abandon(ticket))


def _is_sse(reply: Reply) -> bool:
    return any(
        k == b"content-type" and v.startswith(b"text/event-stream") for k, v in reply.headers
    )


class _Events:
    """An SSE reply read as whole events; a stream that does not end with ``data: [DONE]``,
    or sends a malformed or an error event, raises :class:`UpstreamError` like a break."""

    __slots__ = ("done", "finished", "pending", "repaired", "reply")

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.pending = b""  # the start of an event whose end has not come yet
        self.done = False
        self.finished = False  # a finish_reason was relayed: the answer is whole
        self.repaired = False  # it ended cleanly without [DONE] after its finish: we wrote it

    async def next(self) -> bytes:
        """The next whole events, ``b""`` at a proper end."""
        while True:
            chunk = await self.reply.read_chunk()
            if not chunk:
                return self._end()
            if self.pending:
                chunk, self.pending = self.pending + chunk, b""
            if b"\r" in chunk:  # CRLF framing (sse-starlette's default): relayed as LF
                chunk = chunk.replace(b"\r\n", b"\n")
                if chunk.endswith(b"\r"):  # a CRLF split between two chunks
                    chunk, self.pending = chunk[:-1], b"\r"
            if not chunk.endswith(b"\n\n"):
                chunk = self._hold_tail(chunk)
                if not chunk:
                    continue
            if not _well_formed(chunk):
                raise UpstreamError("the upstream sent a malformed or an error event")
            self.done = chunk.endswith(b"data: [DONE]\n\n")
            if not self.finished:
                self.finished = b'"finish_reason":"' in chunk or b'"finish_reason": "' in chunk
            return chunk

    def end_now(self) -> bytes | None:
        """When the reply has ended already and ends properly: what closes the stream (``b""``,
        or the ``[DONE]`` it lacked after its finish), so the last events and the end go out
        in one write; None when more may come or the end is a break (:meth:`next` says so)."""
        if not self.reply.at_eof() or self.pending or not (self.done or self.finished):
            return None
        return self._end()

    def _end(self) -> bytes:
        if self.pending or not (self.done or self.finished):
            raise UpstreamError("the upstream's stream ended without data: [DONE]")
        if not self.done:  # the whole answer and its finish came, only [DONE] is missing
            self.done = self.repaired = True
            return b"data: [DONE]\n\n"
        return b""

    def _hold_tail(self, chunk: bytes) -> bytes:
        if len(chunk) > EVENT_LIMIT:
            raise UpstreamError("the upstream sent an event larger than 1 MiB")
        cut = chunk.rfind(b"\n\n")
        if cut < 0:
            self.pending = chunk
            return b""
        self.pending = chunk[cut + 2 :]
        return chunk[: cut + 2]


async def _relay_events(gw: Gateway, out: Outbound, reply: Reply, ex: Exchange) -> None:
    """Relay an SSE answer event by event (:class:`_Events`), and rescue it if it breaks.

    Only whole events are passed on (a piece of one waits for the rest), so a break never
    leaves half an event at the client. A broken stream is continued elsewhere
    (:mod:`gpugate.services.continuation`) when that can be done faithfully, else ended with
    the terminal ``event: error`` naming the *first* break. The current reply is closed at the
    end, whatever happens.
    """
    kept = _Kept(continuable(out.doc, out.path))
    events = _Events(reply)
    replay: Replay | None = None
    continued = 0
    first: UpstreamError | None = None  # the first break: the story if nothing rescues it
    code: str | None = None
    end: bytes | None = None
    seen = Generation(out.received_at, gw.clock.monotonic, stream=True)
    try:
        while True:
            try:
                chunk = await events.next()
                if not chunk:
                    break
                if replay is not None and not (chunk := replay.feed(chunk)):
                    continue
            except (UpstreamError, Diverged) as exc:
                error = exc if isinstance(exc, UpstreamError) else UpstreamError(str(exc))
                if isinstance(exc, UpstreamError):
                    events.reply.broke()
                first = first or error
                code = first.code
                rescue = None
                keep = kept.events
                if keep is not None and continued < MAX_CONTINUATIONS and not events.done:
                    rescue = await _continue(gw, out, keep, error)
                if rescue is None:
                    await _end_broken_stream(ex, events.reply, first)
                    return
                log.info("stream of %s continued after: %s", out.model, error.message)
                continued += 1
                events.reply.discard()  # the request is recorded once, by the reply that ends it
                events, replay, code = _Events(rescue[0]), rescue[1], None
                continue
            if (end := events.end_now()) is not None:  # the last events: sent with the end
                chunk += end
                await ex.body(chunk, more=False)
                seen.chunk(chunk)
                break
            await ex.body(chunk, more=True)
            seen.chunk(chunk)
            kept.add(chunk)
        if events.repaired:
            gw.metrics.continuations.labels(out.model or "", "completed_missing_done").inc()
        if end is None:  # the reply ended after its last events were sent
            await ex.body(b"", more=False)
        _generated(gw, out, events.reply, seen, ex)
    finally:
        events.reply.close(code)


class _Kept:
    """The events delivered so far, for a continuation: ``events`` is None when the request
    cannot be continued, or once they are too long to be (:data:`KEEP_LIMIT`)."""

    __slots__ = ("events", "size")

    def __init__(self, continuable: bool) -> None:
        self.events: list[bytes] | None = [] if continuable else None
        self.size = 0

    def add(self, chunk: bytes) -> None:
        events = self.events
        if events is not None:
            self.size += len(chunk)
            if self.size <= KEEP_LIMIT:
                events.append(chunk)
            else:
                self.events = None  # too long to continue


async def _continue(
    gw: Gateway, out: Outbound, keep: list[bytes], error: UpstreamError
) -> tuple[Reply, Replay | None] | None:
    """:meth:`Proxy.continue_stream` inside a continuation span (its tries are its children)."""
    span = continuation_span(out.span, out.model, error.code)
    target = dataclasses.replace(out, span=span) if span.recording else out
    try:
        rescue = await gw.proxy.continue_stream(target, delivered(keep))
    except BaseException as exc:
        span.end(type(exc).__name__)
        raise
    if rescue is None:
        continuation_ended(span, None, None)
    else:
        continuation_ended(
            span, rescue[0].upstream.id, "prefill" if rescue[1] is None else "replay"
        )
    return rescue


_WS = rb"[ \t\r\x0b\x0c]*+"  # what bytes.strip() strips, within a line
#: A data line that is neither ``[DONE]`` nor a JSON object that is not an error, its ends
#: checked: searched in ``b"\n" + chunk``, so every line starts with ``\n`` and the search
#: scans for that literal in C instead of trying ``^`` at every byte (17 against 6 µs for the
#: bench's 24 events in one piece; the per-line loop it replaces is the spec, pinned in
#: tests/proxy/test_proxy_well_formed.py).
_BAD_DATA_LINE = re.compile(
    rb"\ndata:"
    + _WS
    + rb"(?!\[DONE\]"
    + _WS
    + rb"(?=\n|\Z)|\{(?!\"error\")[^\n]*\}"
    + _WS
    + rb"(?=\n|\Z))"
)


def _well_formed(chunk: bytes) -> bool:
    """Whether every data line of these whole events is ``[DONE]`` or a JSON object that is not
    an error (a cheap check of the ends: a cut-off event fails it)."""
    return _BAD_DATA_LINE.search(b"\n" + chunk) is None


async def _settle(gw: Gateway, ticket: Ticket, reply: Reply, kept: list[bytes] | None) -> None:
    """Keep a complete response under its key, or release the key."""
    if kept is None:
        await gw.idempotency.abandon(ticket)
        return
    headers = [*reply.headers, (b"x-gateway-upstream", reply.upstream.id.encode())]
    if reply.model is not None:
        headers.append((b"x-gateway-model", reply.model.encode()))
    await gw.idempotency.complete(ticket, reply.status, headers, b"".join(kept))


def _head(reply: Reply, rid: bytes) -> list[tuple[bytes, bytes]]:
    """The relayed response's headers: the upstream's and gpugate's own."""
    headers = [
        *reply.headers,
        *_tried_headers(reply.upstream.id, reply.overhead_s, reply.attempts),
        (REQUEST_ID, rid),
    ]
    if reply.model is not None:
        headers.append((b"x-gateway-model", reply.model.encode()))
    return headers


def _tried_headers(upstream: str, overhead_s: float, attempts: int) -> list[tuple[bytes, bytes]]:
    """gpugate's own headers of an answer after upstreams were tried, relayed or our error:
    the upstream that answered (or was tried last), the time in the gateway, the tries."""
    return [
        (b"x-gateway-upstream", upstream.encode()),
        (b"x-gateway-overhead-ms", f"{overhead_s * 1000:.3f}".encode()),
        (b"x-gateway-attempts", _ATTEMPTS[attempts] if attempts < 16 else b"%d" % attempts),
    ]


async def _end_broken_stream(ex: Exchange, reply: Reply, exc: UpstreamError) -> None:
    content_type = next((v for k, v in reply.headers if k == b"content-type"), b"")
    if not content_type.startswith(b"text/event-stream"):
        raise BrokenStream(exc.message) from exc
    event = b"event: error\ndata: " + error_body(exc) + b"\n\n"
    await ex.body(event, more=False)


def _has_body(method: str, headers: list[tuple[bytes, bytes]]) -> bool:
    if method in ("GET", "HEAD", "OPTIONS", "DELETE"):
        return _header(headers, b"content-length") not in (None, "0") or (
            _header(headers, b"transfer-encoding") is not None
        )
    return True


def _refuse_external(gw: Gateway, upstream_id: str) -> None:
    """``X-Allow-External: false`` on ``/u/`` to an external upstream: 403, as the façade."""
    if gw.registry.upstream(upstream_id).config.external:
        raise ExternalUpstreamForbidden(
            f"upstream {upstream_id!r} is external and the request says X-Allow-External: false"
        )


def _parse_doc(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, parsed once for everyone on the path."""
    try:
        doc = json_document(body)
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    return doc


def _unrouted(ex: Exchange, seen: _Seen, received_at: float) -> Outbound:
    """A request refused before it was routed, as its count needs it: no model and no upstream
    (a client's strings never become label values), the class it asked for if that is one."""
    try:
        cls = parse_request_class(seen.request_class, default=RequestClass.INTERACTIVE)
    except BadRequest:
        cls = RequestClass.INTERACTIVE
    return Outbound(ex.method, ex.path, [], None, cls, received_at)


def _routing_fields(doc: dict[str, Any]) -> tuple[str, bool]:
    """``model`` and ``stream`` from the parsed body: all the routing needs."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("the request body needs a `model` (a non-empty string)")
    return model, doc.get("stream") is True


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


async def _send_stored(ex: Exchange, stored: StoredResponse, rid: bytes, spent_s: float) -> None:
    """A replay: the stored answer (its X-Gateway-Upstream and -Model kept with it), and what
    this request did itself: ``spent_s`` in the gateway, no upstream tried."""
    headers = [
        *stored.headers,
        (b"idempotent-replayed", b"true"),
        (b"x-gateway-overhead-ms", f"{spent_s * 1000:.3f}".encode()),
        (b"x-gateway-attempts", _ATTEMPTS[0]),
        (REQUEST_ID, rid),
    ]
    await ex.answer(stored.status, headers, stored.body)


async def _send_error(ex: Exchange, exc: GpugateError, rid: bytes) -> None:
    headers = [*_JSON, (REQUEST_ID, rid)]
    headers += [(k.encode(), v.encode()) for k, v in error_headers(exc).items()]
    tried = exc.tried
    if tried is not None:  # upstreams were tried: the answer says which, as a reply does
        headers += _tried_headers(tried.upstream, tried.overhead_s, tried.attempts)
    await ex.answer(status_of(exc), headers, error_body(exc))
