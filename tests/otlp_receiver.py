"""An OTLP/HTTP trace receiver on a loopback port: what an OpenTelemetry collector listens on.

It accepts ``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (the collector's
own protocol, decoded with ``opentelemetry-proto``) and answers an ``ExportTraceServiceResponse``,
keeping every span it was sent. Tests point ``telemetry.otlp_endpoint`` at it: the gateway's
real exporter speaks to it over a real socket — no part of the SDK is replaced.

Imported by tests as ``from otlp_receiver import ...`` (``tests/`` is on pytest's pythonpath).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

KINDS = {
    Span.SPAN_KIND_SERVER: "server",
    Span.SPAN_KIND_CLIENT: "client",
    Span.SPAN_KIND_INTERNAL: "internal",
}
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class Received:
    """One span as the collector got it (ids in hex, as in a ``traceparent``)."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start_ns: int
    attributes: dict[str, Any]
    failed: bool
    status_message: str
    service: str


@dataclass
class Receiver:
    url: str = ""
    spans: list[Received] = field(default_factory=list)
    refused: int = 0  # posts that were not protobuf trace exports

    def named(self, name: str) -> list[Received]:
        return sorted((s for s in self.spans if s.name == name), key=lambda s: s.start_ns)

    def children(self, parent: Received) -> list[Received]:
        kids = [s for s in self.spans if s.parent_id == parent.span_id]
        return sorted(kids, key=lambda s: s.start_ns)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def _body(request_body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(request_body)
    if encoding == "deflate":
        return zlib.decompress(request_body)
    return request_body


async def _traces(request: web.Request) -> web.Response:
    receiver = request.app[_RECEIVER]
    if request.content_type != PROTOBUF:
        receiver.refused += 1
        return web.Response(status=415, text="expected application/x-protobuf")
    raw = _body(await request.read(), request.headers.get("Content-Encoding", ""))
    export = ExportTraceServiceRequest.FromString(raw)
    for resource_spans in export.resource_spans:
        service = _attributes(resource_spans.resource.attributes).get("service.name", "")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                receiver.spans.append(
                    Received(
                        name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        failed=span.status.code == Status.STATUS_CODE_ERROR,
                        status_message=span.status.message,
                        service=service,
                    )
                )
    answer = ExportTraceServiceResponse().SerializeToString()
    return web.Response(body=answer, content_type=PROTOBUF)


_RECEIVER = web.AppKey("receiver", Receiver)


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    """Listen on 127.0.0.1 (a free port) until the block ends; ``url`` is the OTLP base URL."""
    app = web.Application()
    receiver = Receiver()
    app[_RECEIVER] = receiver
    app.router.add_post("/v1/traces", _traces)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sockets = site._server.sockets  # type: ignore[union-attr]
    receiver.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    try:
        yield receiver
    finally:
        await runner.cleanup()
