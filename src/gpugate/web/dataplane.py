"""The data plane over raw ASGI: the OpenAI-compatible routes and ``/u/{upstream}/{path}``.

These are the hot routes, so they bypass the framework: the body is read once, only ``model`` and
``stream`` are looked at, the original bytes are forwarded, and the upstream's response is relayed
chunk by chunk as it arrives (no buffering, no re-serialisation). Everything else falls through to
the Starlette app.

While a response is in progress a watcher waits for the client to go away; when it does, the
upstream connection is closed and the admission slot freed at once. An upstream that breaks off an
SSE stream ends it with a final event (``event: error`` whose data is an OpenAI-shaped error with
code ``UPSTREAM_ERROR`` or ``UPSTREAM_TIMEOUT``), which the ``openai`` client raises as an
``APIError``; any other body is cut off (the connection is closed without the final chunk), so a
truncation is never silent.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Receive, Scope, Send

from gpugate.core import raw_path
from gpugate.core.classes import RequestClass, parse_request_class
from gpugate.errors import BadRequest, GpugateError, PayloadTooLarge, UpstreamError
from gpugate.logs import request_id
from gpugate.services.idempotency import StoredResponse, Ticket
from gpugate.services.proxy import Outbound, Reply
from gpugate.telemetry import Generation, generated_span, refused_span, request_span
from gpugate.web.bodies import json_document
from gpugate.web.errors import error_body, error_headers, status_of
from gpugate.web.requestid import HEADER as REQUEST_ID
from gpugate.web.requestid import RequestIds
from gpugate.wiring import Gateway

log = logging.getLogger("gpugate.proxy")

OPENAI_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
RAW_PREFIX = "/u/"
_JSON = [(b"content-type", b"application/json")]
_END = {"type": "http.response.body", "body": b"", "more_body": False}
_ATTEMPTS = [str(n).encode() for n in range(16)]


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


class BrokenStream(Exception):
    """The upstream broke off a non-SSE body: drop the connection so the client sees it."""


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


class DataPlane:
    """ASGI middleware that serves the data-plane routes and passes everything else on."""

    def __init__(self, app: ASGIApp, gateway: Gateway, ids: RequestIds) -> None:
        self.app = app
        self.gateway = gateway
        self.ids = ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path in OPENAI_ROUTES and scope["method"] == "POST":
                handler = self._openai
            elif path.startswith(RAW_PREFIX):
                handler = self._raw
            else:
                await self.app(scope, receive, send)
                return
            seen = _scan(scope["headers"])
            rid = self.ids.choose(seen.request_id)
            token = request_id.set(rid.decode())
            try:
                await handler(scope, receive, send, seen, rid)
            except ClientGone:
                return
            finally:
                request_id.reset(token)
            return
        await self.app(scope, receive, send)

    async def _openai(
        self, scope: Scope, receive: Receive, send: Send, seen: _Seen, rid: bytes
    ) -> None:
        gw = self.gateway
        received_at = gw.clock.monotonic()
        out: Outbound | None = None
        headers = scope["headers"]
        span = request_span(gw.tracer, "POST", scope["path"], headers, scope.get("server"))
        error: str | None = None
        try:
            body = await _read_body(receive, seen.content_length, gw.config.server.max_body_bytes)
            doc = _parse_doc(body)
            model, stream = _routing_fields(doc)
            span.set("gen_ai.request.model", model[:200])
            cls = parse_request_class(seen.request_class, default=RequestClass.INTERACTIVE)
            path = _path_and_query(scope)
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
                begun = await gw.idempotency.begin(seen.idempotency_key, "POST", path, body)
                if isinstance(begun, StoredResponse):
                    gw.metrics.idempotent_replays.inc()
                    await _send_stored(send, begun, rid)
                    return
                ticket = begun
            await self._forward(out, receive, send, rid, ticket, keep=not stream, body_done=None)
        except GpugateError as exc:
            error = refused_span(span, status_of(exc), exc.code)
            if out is not None:
                gw.proxy.refused(out, exc)
            await _send_error(send, exc, rid)
        finally:
            span.end(error)

    async def _raw(
        self, scope: Scope, receive: Receive, send: Send, seen: _Seen, rid: bytes
    ) -> None:
        """``/u/{upstream}/{path}``: the raw path checked (:mod:`gpugate.core.raw_path`), the
        whole body received and bounded *before* admission, so a client that trickles, aborts
        or oversends holds no slot and is never counted against the upstream (#14 defect 1)."""
        gw = self.gateway
        received_at = gw.clock.monotonic()
        out: Outbound | None = None
        try:
            upstream_id, path = raw_path.split(_raw_path_of(scope))
            cls = parse_request_class(seen.request_class, default=RequestClass.INTERACTIVE)
            body: bytes | None = None
            if _has_body(scope["method"], scope["headers"]):
                body = await _read_body(
                    receive, seen.content_length, gw.config.server.max_body_bytes
                )
            query = scope.get("query_string", b"")
            if query:
                path += "?" + query.decode("latin-1")
            out = Outbound(
                scope["method"],
                path,
                scope["headers"],
                body,
                cls,
                received_at,
                upstream_id=upstream_id,
                raw=True,
            )
            await self._forward(out, receive, send, rid, None, keep=False, body_done=None)
        except GpugateError as exc:
            if out is not None:
                gw.proxy.refused(out, exc)
            await _send_error(send, exc, rid)

    async def _forward(
        self,
        out: Outbound,
        receive: Receive,
        send: Send,
        rid: bytes,
        ticket: Ticket | None,
        *,
        keep: bool,
        body_done: asyncio.Event | None,
    ) -> None:
        """Relay the request while a watcher waits for the client to go away; if it does, this
        task is cancelled, which closes the upstream request and frees the slot at once.

        The watcher reads ``receive`` only once the request body has been consumed (at once for
        a body read up front; after the upload for a streamed one), never competing with it.
        """
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive, body_done))

        def client_left(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                task.cancel()

        watcher.add_done_callback(client_left)
        try:
            await self._relay(out, send, rid, ticket, keep=keep)
        except asyncio.CancelledError:
            if not (watcher.done() and not watcher.cancelled()):
                raise
            task.uncancel()
            log.info("client disconnected; upstream request closed")
        finally:
            watcher.remove_done_callback(client_left)
            watcher.cancel()

    async def _relay(
        self, out: Outbound, send: Send, rid: bytes, ticket: Ticket | None, *, keep: bool
    ) -> None:
        gw = self.gateway
        try:
            reply = await gw.proxy.open(out)
        except GpugateError:
            if ticket is not None:
                await asyncio.shield(gw.idempotency.abandon(ticket))
            raise
        code: str | None = None
        kept: list[bytes] | None = [] if ticket is not None and keep else None
        kept_bytes, keep_at_most = 0, gw.idempotency.max_body_bytes
        seen = Generation(out.received_at, stream=out.stream)
        try:
            await send(_start(reply, rid))
            try:
                while chunk := await reply.read_chunk():
                    seen.chunk(chunk, gw.clock.monotonic())
                    if kept is not None:
                        kept.append(chunk)
                        kept_bytes += len(chunk)
                        if kept_bytes > keep_at_most:
                            kept = None  # too large to keep: the key is released at the end
                    last = ticket is None and reply.at_eof()  # end with the last chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                    if last:
                        return
            except UpstreamError as exc:
                reply.broke()
                code = exc.code
                await _end_broken_stream(send, reply, exc)
                return
            if ticket is not None:  # kept before the client sees the end, so a retry replays
                await _settle(gw, ticket, reply, kept)
                ticket = None
            await send(_END)
        finally:
            if code is None and reply.at_eof() and out.model is not None:
                _generated(gw, out, reply, seen)
            reply.close(code)
            if ticket is not None:
                await asyncio.shield(gw.idempotency.abandon(ticket))


def _generated(gw: Gateway, out: Outbound, reply: Reply, seen: Generation) -> None:
    """A whole answer went by: its GenAI histograms and the request span's usage."""
    told = seen.finish(model=out.span.recording)  # the answer's model is only a span's
    if reply.status < 300:
        gw.proxy.generated(out, reply, told)
    generated_span(out.span, reply.status, told)


async def _settle(gw: Gateway, ticket: Ticket, reply: Reply, kept: list[bytes] | None) -> None:
    """Keep a complete response under its key, or release the key."""
    if kept is None:
        await gw.idempotency.abandon(ticket)
        return
    headers = [*reply.headers, (b"x-gateway-upstream", reply.upstream.id.encode())]
    if reply.model is not None:
        headers.append((b"x-gateway-model", reply.model.encode()))
    await gw.idempotency.complete(ticket, reply.status, headers, b"".join(kept))


def _start(reply: Reply, rid: bytes) -> dict[str, Any]:
    headers = [
        *reply.headers,
        (b"x-gateway-upstream", reply.upstream.id.encode()),
        (b"x-gateway-overhead-ms", f"{reply.overhead_s * 1000:.3f}".encode()),
        (b"x-gateway-attempts", _ATTEMPTS[reply.attempts] if reply.attempts < 16 else b"16+"),
        (REQUEST_ID, rid),
    ]
    if reply.model is not None:
        headers.append((b"x-gateway-model", reply.model.encode()))
    return {"type": "http.response.start", "status": reply.status, "headers": headers}


async def _end_broken_stream(send: Send, reply: Reply, exc: UpstreamError) -> None:
    content_type = next((v for k, v in reply.headers if k == b"content-type"), b"")
    if not content_type.startswith(b"text/event-stream"):
        raise BrokenStream(exc.message) from exc
    event = b"event: error\ndata: " + error_body(exc) + b"\n\n"
    await send({"type": "http.response.body", "body": event, "more_body": False})


async def _wait_for_disconnect(receive: Receive, body_done: asyncio.Event | None) -> None:
    if body_done is not None:
        await body_done.wait()
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
    _check_length(declared, limit)
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


def _has_body(method: str, headers: list[tuple[bytes, bytes]]) -> bool:
    if method in ("GET", "HEAD", "OPTIONS", "DELETE"):
        return _header(headers, b"content-length") not in (None, "0") or (
            _header(headers, b"transfer-encoding") is not None
        )
    return True


def _raw_path_of(scope: Scope) -> bytes:
    """The path as the client sent it (percent-encoded), not the decoded ``path``."""
    raw: bytes | None = scope.get("raw_path")
    return raw if raw is not None else quote(scope["path"]).encode("ascii")


def _check_length(declared: int | None, limit: int) -> None:
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds max_body_bytes ({limit})")


def _parse_doc(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, parsed once for everyone on the path."""
    try:
        doc = json_document(body)
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    return doc


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


def _path_and_query(scope: Scope) -> str:
    query: bytes = scope.get("query_string", b"")
    path: str = scope["path"]
    return path + "?" + query.decode("latin-1") if query else path


async def _send_stored(send: Send, stored: StoredResponse, rid: bytes) -> None:
    headers = [*stored.headers, (b"idempotent-replayed", b"true"), (REQUEST_ID, rid)]
    await send({"type": "http.response.start", "status": stored.status, "headers": headers})
    await send({"type": "http.response.body", "body": stored.body, "more_body": False})


async def _send_error(send: Send, exc: GpugateError, rid: bytes) -> None:
    headers = [*_JSON, (REQUEST_ID, rid)]
    headers += [(k.encode(), v.encode()) for k, v in error_headers(exc).items()]
    await send({"type": "http.response.start", "status": status_of(exc), "headers": headers})
    await send({"type": "http.response.body", "body": error_body(exc), "more_body": False})
