"""Which tracer a gateway gets: none unless configured, and a clear config error when the
``gpugate[otel]`` extra is missing."""

from __future__ import annotations

import sys

import pytest

from gpugate.config import TelemetryConfig
from gpugate.errors import ConfigError
from gpugate.telemetry import NO_SPAN, NO_TRACER, Kind
from gpugate.wiring import open_tracer


def test_without_an_endpoint_the_gateway_gets_the_no_op_tracer_whose_spans_record_nothing() -> None:
    tracer = open_tracer(TelemetryConfig())
    span = tracer.request("POST /v1/chat/completions", [(b"traceparent", b"x")], {})
    assert (NO_TRACER, NO_SPAN, False, []) == (tracer, span, span.recording, span.traceparent())
    assert NO_SPAN is span.child("chat m", Kind.CLIENT)


def test_an_endpoint_without_the_otel_extra_is_a_config_error_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The extra not installed: its import fails as it would on a machine without it."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "gpugate.adapters.otel", raising=False)
    with pytest.raises(ConfigError) as refused:
        open_tracer(TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318"), line=12)
    (problem,) = refused.value.problems
    assert ("telemetry.otlp_endpoint", 12) == (problem.path, problem.line)
    assert "pip install 'gpugate[otel]'" in problem.message


def test_a_sample_ratio_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="less than or equal to 1"):
        TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318", sample_ratio=1.5)
