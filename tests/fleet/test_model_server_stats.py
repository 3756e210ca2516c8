"""The fake model server counts what it sees (`/_stats`) and shows vLLM's gauges (`/metrics`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    import aiohttp

    from gpugate.fleet import ModelServer

Until = Callable[[Callable[[], bool]], Awaitable[None]]
MODEL = "alpha-7b"


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


async def post_chat(
    http: aiohttp.ClientSession, server: ModelServer, headers: dict[str, str] | None = None
) -> int:
    url = f"{server.url}/v1/chat/completions"
    async with http.post(url, json=chat_body(), headers=headers) as response:
        await response.read()
        return response.status


async def samples(http: aiohttp.ClientSession, server: ModelServer) -> dict[tuple[str, str], float]:
    """(sample name, model_name or route label) -> value, from a scrape of /metrics."""
    async with http.get(f"{server.url}/metrics") as response:
        text = await response.text()
    return {
        (s.name, s.labels.get("model_name") or s.labels.get("route", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_stats_count_requests_per_route(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    await post_chat(http, server)
    await post_chat(http, server)
    async with http.get(f"{server.url}/v1/models"):
        pass

    async with http.get(f"{server.url}/_stats") as response:
        stats = await response.json()

    assert 2 == stats["requests"]["/v1/chat/completions"]
    assert 1 == stats["requests"]["/v1/models"]
    assert 0 == stats["requests"]["/v1/embeddings"]


async def test_executions_are_counted_per_idempotency_key_or_job_header(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    await post_chat(http, server, {"Idempotency-Key": "k1"})
    await post_chat(http, server, {"Idempotency-Key": "k1"})
    await post_chat(http, server, {"X-Gpugate-Job": "job-7"})
    await post_chat(http, server)

    assert {"k1": 2, "job-7": 1} == server.stats.executions


async def test_open_requests_and_streams_are_counted_while_held(
    server: ModelServer, http: aiohttp.ClientSession, until: Until
) -> None:
    server.update(hang=True)
    url = f"{server.url}/v1/chat/completions"
    plain = asyncio.create_task(post_chat(http, server))
    streamed = asyncio.create_task(http.post(url, json=chat_body(stream=True)))

    await until(lambda: server.stats.open_requests == 2)
    assert 1 == server.stats.open_streams
    server.update(hang=False)
    assert 200 == await plain
    async with await streamed as response:
        await response.read()
    assert (0, 0) == (server.stats.open_requests, server.stats.open_streams)


async def test_a_client_leaving_a_stream_early_is_counted_as_a_disconnect(
    server: ModelServer, http: aiohttp.ClientSession, until: Until
) -> None:
    server.update(chunk_delay_s=0.05, chunks=50)
    url = f"{server.url}/v1/chat/completions"

    async with http.post(url, json=chat_body(stream=True)) as response:
        await response.content.readuntil(b"\n\n")
        response.close()

    await until(lambda: server.stats.disconnects == 1)
    assert 0 == server.stats.open_streams


async def test_vllm_gauges_count_requests_beyond_max_running_as_waiting(
    server: ModelServer, http: aiohttp.ClientSession, until: Until
) -> None:
    server.update(hang=True, max_running=1)
    held = [asyncio.create_task(post_chat(http, server)) for _ in range(3)]
    await until(lambda: server.stats.open_requests == 3)

    seen = await samples(http, server)
    server.update(hang=False)
    await asyncio.gather(*held)

    assert 1.0 == seen["vllm:num_requests_running", MODEL]
    assert 2.0 == seen["vllm:num_requests_waiting", MODEL]
    assert 0.0 == (await samples(http, server))["vllm:num_requests_waiting", MODEL]


async def test_metrics_count_requests_per_route(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    await post_chat(http, server)

    seen = await samples(http, server)

    assert 1.0 == seen["fleet_requests_total", "/v1/chat/completions"]
    assert 0.0 == seen["fleet_requests_total", "/v1/completions"]


async def test_an_unknown_model_is_a_404_in_openai_shape(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    body = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}

    async with http.post(f"{server.url}/v1/chat/completions", json=body) as response:
        error = await response.json()

    assert 404 == response.status
    assert "model_not_found" == error["error"]["code"]
    assert {"message", "type", "param", "code"} == set(error["error"])


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2]", b'{"messages": []}', b'{"model": "alpha-7b", "messages": 3}'],
)
async def test_a_malformed_body_is_a_400_in_openai_shape(
    server: ModelServer, http: aiohttp.ClientSession, body: bytes
) -> None:
    url = f"{server.url}/v1/chat/completions"

    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        error = await r.json()

    assert 400 == r.status
    assert "invalid_request_error" == error["error"]["type"]


async def test_every_answer_names_the_server_in_a_header(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{server.url}/v1/chat/completions", json=chat_body()) as response:
        assert "alpha" == response.headers["X-Fleet-Server"]
