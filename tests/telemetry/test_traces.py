"""OpenTelemetry traces end to end (issue #19, Done-when 3): the gateway's real exporter posts
OTLP/HTTP protobuf to a receiver on loopback (:mod:`otlp_receiver`), the real ``openai`` client
sends the requests, and ``/metrics`` is read with Prometheus' own parser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from gpugate.telemetry import NO_TRACER
from harness import RunningGateway, make_config, serving, upstream
from otlp_receiver import Received, Receiver, otlp_receiver
from scripted_upstream import OK, WORDS, Scripted, Step, answer_text, scripted

CHAT: list[Any] = [{"role": "user", "content": "hi"}]
FAST = {"attempts": 2, "backoff_s": 0.01, "max_backoff_s": 0.05, "retry_after_max_s": 5}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def fleet(dsn: str, big: str, small: str, **extra: Any) -> Any:
    return make_config(
        dsn,
        [
            upstream("big-u", [big], ["big"], retry=FAST),
            upstream("small-u", [small], ["small"], retry=FAST),
        ],
        models=[{"name": "big", "fallbacks": ["small"]}],
        **extra,
    )


@asynccontextmanager
async def traced_fallback(
    dsn: str,
) -> AsyncIterator[tuple[Receiver, Scripted, Scripted, RunningGateway]]:
    """``big`` answers 503 (twice: a try and its retry), its fallback ``small`` answers; the
    gateway traces to a collector on loopback. The spans are all there once the block ends
    (the gateway's stop flushes them)."""
    async with (
        otlp_receiver() as collector,
        scripted(Step(status=503), name="big") as big,
        scripted(OK, name="small") as small,
    ):
        config = fleet(dsn, big.url, small.url, telemetry={"otlp_endpoint": collector.url})
        async with serving(config) as gw:
            yield collector, big, small, gw


def histograms(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, labels): value}`` of every histogram's ``_count`` and ``_sum``."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_count", "_sum")):
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


async def stream_chat(url: str, model: str, **extra: Any) -> str:
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model=model, messages=CHAT, stream=True, **extra
        )
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    finally:
        await client.close()
    return "".join(parts)


def tree(receiver: Receiver, root: Received) -> list[Any]:
    """``[(name, kind, outcome), [children...]]`` under ``root``, children by start time."""
    return [
        [(s.name, s.kind, s.attributes.get("gpugate.attempt.outcome")), tree(receiver, s)]
        for s in receiver.children(root)
    ]


async def test_a_chat_that_retried_once_and_fell_back_is_one_trace_of_its_attempts_and_hop(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with traced_fallback(sqlite_dsn) as (collector, _, _, gw):
        text = await stream_chat(
            gw.v1,
            "big",
            stream_options={"include_usage": True},
            extra_headers={"traceparent": CLIENT_PARENT},
        )
        metrics = histograms(await (await http.get(gw.url + "/metrics")).text())
    # the gateway has stopped: its tracer flushed every span to the collector on the way out
    assert answer_text(WORDS) == text
    (request,) = collector.named("POST /v1/chat/completions")
    assert ("server", CLIENT_TRACE, CLIENT_SPAN) == (
        request.kind,
        request.trace_id,
        request.parent_id,
    )
    assert [
        [("chat big", "client", "503"), []],
        [("chat big", "client", "503"), []],
        [("fallback small", "internal", None), [[("chat small", "client", "ok"), []]]],
    ] == tree(collector, request)
    assert {CLIENT_TRACE} == {s.trace_id for s in collector.spans}
    assert {"gpugate"} == {s.service for s in collector.spans}
    small_label = (("model", "small"),)
    assert (1, 1) == (
        metrics["gateway_time_to_first_token_seconds_count", small_label],
        metrics["gateway_time_per_output_token_seconds_count", small_label],
    )


async def test_the_spans_carry_the_genai_attributes_and_name_endpoints_by_index_never_url(
    sqlite_dsn: str,
) -> None:
    async with traced_fallback(sqlite_dsn) as (collector, big, small, gw):
        await stream_chat(gw.v1, "big", stream_options={"include_usage": True})
    (request,) = collector.named("POST /v1/chat/completions")
    first, _ = collector.named("chat big")
    (answered,) = collector.named("chat small")
    (hop,) = collector.named("fallback small")
    assert {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "big",
        "gen_ai.response.model": "small",
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": len(WORDS),
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
    }.items() <= request.attributes.items()
    assert {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "small",
        "gpugate.upstream": "small-u",
        "gpugate.endpoint.index": 0,
        "http.response.status_code": 200,
    }.items() <= answered.attributes.items()
    assert ("big", "small", "failed") == (
        hop.attributes["gpugate.fallback.from"],
        hop.attributes["gpugate.fallback.to"],
        hop.attributes["gpugate.fallback.reason"],
    )
    assert (True, "503", False) == (first.failed, first.status_message, answered.failed)
    every_value = repr([s.attributes for s in collector.spans])
    assert big.url not in every_value
    assert small.url not in every_value


async def test_each_upstream_is_sent_its_attempts_span_as_traceparent(sqlite_dsn: str) -> None:
    async with traced_fallback(sqlite_dsn) as (collector, big, small, gw):
        await stream_chat(gw.v1, "big", extra_headers={"traceparent": CLIENT_PARENT})
    tries = [*collector.named("chat big"), *collector.named("chat small")]
    sent = [seen.headers.get("traceparent") for seen in [*big.seen, *small.seen]]
    assert [f"00-{CLIENT_TRACE}-{s.span_id}-01" for s in tries] == sent


async def test_streamed_answers_fill_the_ttft_per_token_and_token_histograms(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Always on (no OpenTelemetry needed), labelled by the model that answered."""
    async with scripted(Step(status=503), name="big") as big, scripted(OK, name="small") as small:
        async with serving(fleet(sqlite_dsn, big.url, small.url)) as gw:
            assert NO_TRACER is gw.gateway.tracer
            await stream_chat(gw.v1, "big", stream_options={"include_usage": True})
            await stream_chat(gw.v1, "small")  # no usage asked: tokens counted from the events
            metrics = histograms(await (await http.get(gw.url + "/metrics")).text())
    small_label = (("model", "small"),)
    assert 2 == metrics["gateway_time_to_first_token_seconds_count", small_label]
    assert 2 == metrics["gateway_time_per_output_token_seconds_count", small_label]
    assert 0 < metrics["gateway_time_to_first_token_seconds_sum", small_label]
    output = (("kind", "output"), ("model", "small"))
    inputs = (("kind", "input"), ("model", "small"))
    # exact from usage (60), then one per data event: 60 words and the finish event
    assert (2, 60 + 61) == (
        metrics["gateway_tokens_per_request_count", output],
        metrics["gateway_tokens_per_request_sum", output],
    )
    assert (1, 7) == (
        metrics["gateway_tokens_per_request_count", inputs],
        metrics["gateway_tokens_per_request_sum", inputs],
    )
    assert not any(dict(labels).get("model") == "big" for _, labels in metrics)


async def test_without_telemetry_a_clients_traceparent_reaches_the_upstream_unchanged(
    sqlite_dsn: str,
) -> None:
    async with scripted(OK, name="small") as small:
        config = make_config(sqlite_dsn, [upstream("small-u", [small.url], ["small"])])
        async with serving(config) as gw:
            await stream_chat(gw.v1, "small", extra_headers={"traceparent": CLIENT_PARENT})
    assert CLIENT_PARENT == small.seen[0].headers["traceparent"]


async def test_a_refused_request_is_a_server_span_with_its_status_and_error_code(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """A 4xx is the client's error: the span says so, its status stays unset (semconv)."""
    async with otlp_receiver() as collector, scripted(OK, name="small") as small:
        config = make_config(
            sqlite_dsn,
            [upstream("small-u", [small.url], ["small"])],
            telemetry={"otlp_endpoint": collector.url},
        )
        async with serving(config) as gw:
            body = {"model": "nope", "messages": CHAT}
            async with http.post(gw.v1 + "/chat/completions", json=body) as resp:
                status = resp.status
    (request,) = collector.spans
    assert (404, "POST /v1/chat/completions", False) == (status, request.name, request.failed)
    assert {
        "http.response.status_code": 404,
        "error.type": "UNKNOWN_MODEL",
        "gen_ai.request.model": "nope",
    }.items() <= request.attributes.items()


async def test_with_sample_ratio_zero_nothing_is_exported_and_no_traceparent_is_invented(
    sqlite_dsn: str,
) -> None:
    async with otlp_receiver() as collector, scripted(OK, name="small") as small:
        config = make_config(
            sqlite_dsn,
            [upstream("small-u", [small.url], ["small"])],
            telemetry={"otlp_endpoint": collector.url, "sample_ratio": 0},
        )
        async with serving(config) as gw:
            await stream_chat(gw.v1, "small")
    assert ([], 0) == (collector.spans, collector.refused)
    assert "traceparent" not in small.seen[0].headers


async def test_a_stream_broken_mid_way_and_replayed_has_a_continuation_span_over_its_try(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The first try answered (and broke after 40 of 60 words); the continuation is its own
    span with the replay's try under it; the histograms count the one answer the client got."""
    async with otlp_receiver() as collector, scripted(Step(events=40, cut=True), OK) as server:
        config = make_config(
            sqlite_dsn,
            [upstream("u", [server.url], ["m"], retry=FAST)],
            telemetry={"otlp_endpoint": collector.url},
        )
        async with serving(config) as gw:
            text = await stream_chat(gw.v1, "m", temperature=0)
            metrics = histograms(await (await http.get(gw.url + "/metrics")).text())
    assert answer_text(WORDS) == text
    (request,) = collector.named("POST /v1/chat/completions")
    assert [
        [("chat m", "client", "ok"), []],
        [("continuation m", "internal", None), [[("chat m", "client", "ok"), []]]],
    ] == tree(collector, request)
    (continuation,) = collector.named("continuation m")
    assert ("replay", "u", "UPSTREAM_ERROR") == (
        continuation.attributes["gpugate.continuation.outcome"],
        continuation.attributes["gpugate.upstream"],
        continuation.attributes["gpugate.continuation.after"],
    )
    assert 1 == metrics["gateway_time_to_first_token_seconds_count", (("model", "m"),)]
