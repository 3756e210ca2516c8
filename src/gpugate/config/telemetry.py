"""``telemetry``: OpenTelemetry traces over OTLP/HTTP (the ``gpugate[otel]`` extra; off by
default). docs/observability.md has the span tree."""

from __future__ import annotations

from pydantic import Field

from gpugate.config.fields import ConfigModel, HttpUrl, Name, PositiveSeconds


class TelemetryConfig(ConfigModel):
    """Where spans go. Unset ``otlp_endpoint``: no tracing at all (nothing is imported)."""

    #: An OTLP/HTTP collector's base URL (``http://collector:4318``): spans are POSTed as
    #: protobuf to ``{otlp_endpoint}/v1/traces``. The exporter's other settings (headers,
    #: certificates, compression) come from the standard ``OTEL_EXPORTER_OTLP_*`` variables.
    otlp_endpoint: HttpUrl | None = None
    service_name: Name = "gpugate"
    #: The share of new traces recorded; a client's sampled ``traceparent`` is always followed.
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    export_timeout_s: PositiveSeconds = 10.0
