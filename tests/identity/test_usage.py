"""Usage per key (issue #16, Done-when 4): what the fake model server says it used, for JSON and
streamed answers, also for a stream whose client did not ask for usage — and that client gets
the bytes it would have got without the gateway asking."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from keyed import ADMIN, ENVIRON, bearer, chat, create_key, keyed_config

from harness import RunningGateway, model_servers, serving

CHAT = "/v1/chat/completions"
_VARYING = re.compile(rb'"id":"[^"]*"|"created":\d+')


@asynccontextmanager
async def _keyed_gateway(
    dsn: str, http: aiohttp.ClientSession
) -> AsyncIterator[tuple[RunningGateway, dict[str, Any], openai.AsyncOpenAI]]:
    """A keyed gateway before the fake model server, a new key, and the ``openai`` client
    that sends with it."""
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url)
            yield (
                gw,
                created,
                openai.AsyncOpenAI(base_url=gw.v1, api_key=created["key"], max_retries=0),
            )


def _cents(usage: dict[str, int]) -> float:
    """What an answer's usage costs at the tests' price (1 and 2 cents per 10 tokens)."""
    return (usage["prompt_tokens"] * 100 + usage["completion_tokens"] * 200) / 1000


def _same_shape(raw: bytes) -> bytes:
    """A stream with its per-answer id and second stamped out (nothing else changes)."""
    return _VARYING.sub(b"_", raw)


async def test_usage_per_key_is_the_model_server_s_own_count_for_json_and_streams(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with _keyed_gateway(dsn, http) as (gw, created, client):
        messages = [{"role": "user", "content": "count these five words"}]
        answer = await client.chat.completions.create(model="m", messages=messages)
        expected = [answer.usage]
        stream = await client.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        expected.append(chunks[-1].usage)
        unasked = await client.chat.completions.create(model="m", messages=messages, stream=True)
        plain = [chunk async for chunk in unasked]
        await client.close()
        async with http.get(gw.url + f"/admin/usage?key={created['id']}", headers=ADMIN) as r:
            usage = await r.json()
        metrics = gw.gateway.metrics.tokens
    assert all(u is not None for u in expected)
    assert all(chunk.usage is None for chunk in plain)  # the client did not ask: none shown
    prompt = sum(u.prompt_tokens for u in expected)  # type: ignore[union-attr]
    completion = sum(u.completion_tokens for u in expected)  # type: ignore[union-attr]
    # the unasked stream used what the asked one did (same prompt, same answer)
    prompt += expected[1].prompt_tokens  # type: ignore[union-attr]
    completion += expected[1].completion_tokens  # type: ignore[union-attr]
    total = usage["by_key"][created["id"]]
    assert (3, prompt, completion) == (
        total["requests"],
        total["prompt_tokens"],
        total["completion_tokens"],
    )
    assert [("u", "m", "team-a")] == [
        (r["upstream"], r["model"], r["tenant"]) for r in usage["data"]
    ]
    assert prompt == metrics.labels("team-a", "m", "prompt")._value.get()
    assert completion == metrics.labels("team-a", "m", "completion")._value.get()


async def test_a_stream_without_include_usage_is_byte_for_byte_what_the_server_would_send(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        body = chat(stream=True)
        async with http.post(server.url + CHAT, json=body) as direct:
            expected = await direct.read()
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url)
            async with http.post(gw.url + CHAT, json=body, headers=bearer(created["key"])) as r:
                got = await r.read()
            async with http.get(gw.url + "/admin/usage", headers=ADMIN) as r:
                usage = await r.json()
    assert b"usage" not in got
    assert _same_shape(expected) == _same_shape(got)
    assert 0 < usage["by_key"][created["id"]]["completion_tokens"]


async def test_a_model_s_price_turns_usage_into_cents_and_the_daily_cents_budget_holds(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    price = {"prompt_per_1k_cents": 100.0, "completion_per_1k_cents": 200.0}
    async with model_servers(("u", ["m"])) as (server,):
        policy = [{"name": "m", "price": price}]
        config = keyed_config(dsn, [server.url], ["m"], extra={"models": policy})
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url, limits={"daily_cents": 5.0})
            statuses, spent = [], 0.0
            for _ in range(6):
                body = chat(max_tokens=10)
                async with http.post(gw.url + CHAT, json=body, headers=bearer(created["key"])) as r:
                    statuses.append(r.status)
                    if r.status == 200:
                        spent += _cents((await r.json())["usage"])
            async with http.get(gw.url + "/admin/usage", headers=ADMIN) as r:
                total = (await r.json())["by_key"][created["id"]]
    assert 200 == statuses[0]
    assert 429 == statuses[-1]
    assert spent == pytest.approx(total["cents"])
    assert total["cents"] <= 5.0


async def test_usage_is_priced_for_keys_without_a_cents_budget_too(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    # a key without daily_cents is not priced on the request path (its lease counts no cents):
    # its usage is priced when the meter writes it, at the same price
    price = {"prompt_per_1k_cents": 100.0, "completion_per_1k_cents": 200.0}
    async with model_servers(("u", ["m"])) as (server,):
        policy = [{"name": "m", "price": price}]
        config = keyed_config(sqlite_dsn, [server.url], ["m"], extra={"models": policy})
        async with serving(config, environ=ENVIRON) as gw:
            free = await create_key(http, gw.url)
            rated = await create_key(http, gw.url, limits={"requests_per_min": 100})
            spent = {free["id"]: 0.0, rated["id"]: 0.0}
            for created in (free, rated, free, rated):
                body = chat(max_tokens=10)
                async with http.post(gw.url + CHAT, json=body, headers=bearer(created["key"])) as r:
                    assert 200 == r.status
                    spent[created["id"]] += _cents((await r.json())["usage"])
            async with http.get(gw.url + "/admin/usage", headers=ADMIN) as r:
                by_key = (await r.json())["by_key"]
    for key_id, cents in spent.items():
        assert 0 < cents
        assert cents == pytest.approx(by_key[key_id]["cents"])


async def test_a_stream_whose_usage_the_gateway_hid_still_tells_the_token_histograms_its_usage(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    """The hiding reads every piece of such a stream, so its usage is taken from there rather
    than searched for again in the stream's tail: the GenAI histograms get the server's own
    counts for it, as for a stream whose client asked."""
    async with _keyed_gateway(dsn, http) as (gw, _, client):
        messages = [{"role": "user", "content": "count these five words"}]
        asked = await client.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        usage = [chunk async for chunk in asked][-1].usage
        unasked = await client.chat.completions.create(model="m", messages=messages, stream=True)
        assert all(chunk.usage is None for chunk in [chunk async for chunk in unasked])
        await client.close()
        histogram = gw.gateway.metrics.tokens_per_request
        counts = {
            kind: (
                histogram.labels("m", kind)._sum.get(),
                sum(b.get() for b in histogram.labels("m", kind)._buckets),
            )
            for kind in ("input", "output")
        }
    assert usage is not None
    assert {
        "input": (2 * usage.prompt_tokens, 2),
        "output": (2 * usage.completion_tokens, 2),
    } == counts
