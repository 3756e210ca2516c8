"""OpenTelemetry behind :mod:`gpugate.telemetry`'s surface: the only module that imports it.

Built by the composition root when ``telemetry.otlp_endpoint`` is set (the ``gpugate[otel]``
extra). A private :class:`TracerProvider` per gateway (never the global one, so two gateways in
a process do not share spans), a parent-based ratio sampler, and a batch processor that exports
protobuf over HTTP to ``{otlp_endpoint}/v1/traces`` from its own thread — the event loop never
waits for the collector. The W3C trace-context propagator reads a client's ``traceparent`` and
writes ours on the way to an upstream.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gpugate import __version__
from gpugate.config import TelemetryConfig
from gpugate.telemetry import TRACE_HEADERS, AttributeValue, Kind, Span

_KINDS = {
    Kind.SERVER: SpanKind.SERVER,
    Kind.CLIENT: SpanKind.CLIENT,
    Kind.INTERNAL: SpanKind.INTERNAL,
}
_PROPAGATOR = TraceContextTextMapPropagator()


class OtelSpan:
    """A recording (or sampled-out) OpenTelemetry span."""

    __slots__ = ("_span", "_tracer", "recording")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self._span = span
        self.recording = span.is_recording()

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def child(
        self, name: str, kind: Kind, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Span:
        parent = trace.set_span_in_context(self._span)
        span = self._tracer.start_span(name, parent, _KINDS[kind], attributes)
        return OtelSpan(self._tracer, span)

    def traceparent(self) -> list[tuple[bytes, bytes]]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(self._span))
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]

    def end(self, error: str | None = None) -> None:
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()

    def __repr__(self) -> str:
        context = self._span.get_span_context()
        return f"<OtelSpan trace={context.trace_id:032x} span={context.span_id:016x}>"


class OtelTracer:
    """Starts spans on a private provider that exports to one OTLP/HTTP collector."""

    def __init__(self, config: TelemetryConfig) -> None:
        assert config.otlp_endpoint is not None
        self.endpoint = config.otlp_endpoint.rstrip("/") + "/v1/traces"
        resource = Resource.create(
            {"service.name": config.service_name, "service.version": __version__}
        )
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        self._provider = TracerProvider(resource=resource, sampler=sampler)
        exporter = OTLPSpanExporter(endpoint=self.endpoint, timeout=config.export_timeout_s)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("gpugate", __version__)

    def request(
        self,
        name: str,
        headers: list[tuple[bytes, bytes]],
        attributes: Mapping[str, AttributeValue],
    ) -> Span:
        carrier = {
            k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in headers
            if k.lower() in TRACE_HEADERS
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else Context()
        span = self._tracer.start_span(name, parent, SpanKind.SERVER, attributes)
        return OtelSpan(self._tracer, span)

    def start(
        self, name: str, kind: Kind, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Span:
        span = self._tracer.start_span(name, Context(), _KINDS[kind], attributes)
        return OtelSpan(self._tracer, span)

    def shutdown(self) -> None:
        """Export what is buffered (bounded by ``export_timeout_s``) and stop."""
        self._provider.shutdown()

    def __repr__(self) -> str:
        return f"<OtelTracer endpoint={self.endpoint!r}>"
