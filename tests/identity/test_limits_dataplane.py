"""A key over a limit gets 429 with Retry-After and the limit's code; the estimate held while a
request runs is replaced by its real usage when it ends."""

from __future__ import annotations

import asyncio

import aiohttp
from keyed import ENVIRON, bearer, chat, create_key, keyed_config

from harness import eventually, model_servers, serving

CHAT = "/v1/chat/completions"


async def test_requests_over_the_minute_s_limit_are_429_rate_limited_with_retry_after(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            for _ in range(2):  # fixed UTC minutes: again if the three straddled a boundary
                minute = gw.gateway.clock.now().minute
                secret = (await create_key(http, gw.url, limits={"requests_per_min": 2}))["key"]
                answers = []
                for _ in range(3):
                    async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as r:
                        answers.append((r.status, (await r.json()).get("error", {}).get("code")))
                        retry_after = r.headers.get("Retry-After")
                if gw.gateway.clock.now().minute == minute:
                    break
            audit = await gw.gateway.store.list_audit(action="key.limited")
    assert [(200, None), (200, None), (429, "RATE_LIMITED")] == answers
    assert retry_after is not None
    assert 1 <= int(retry_after) <= 60
    assert {"RATE_LIMITED"} == {event.detail["code"] for event in audit}


async def test_a_request_over_the_key_s_concurrency_is_429_concurrency_limited(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, limits={"concurrency": 1}))["key"]
            server.update(hang=True)
            pool = gw.gateway.registry.upstream("u").pool

            async def first() -> int:
                async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as r:
                    return r.status

            held = asyncio.create_task(first())
            await eventually(lambda: pool.inflight == 1, what="the first request held")
            async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as r:
                second = (r.status, (await r.json())["error"]["code"])
            server.update(hang=False)
            assert 200 == await asyncio.wait_for(held, timeout=10)
            async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as r:
                third = r.status
    assert (429, "CONCURRENCY_LIMITED") == second
    assert 200 == third  # the slot came back when the first ended


async def test_tokens_beyond_the_minute_s_limit_are_429_token_limited_and_usage_is_reconciled(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    """Each request is estimated at its prompt bytes / 4 + max_tokens (100) and settled at the
    fake server's usage (a few tokens), so a 250 tokens/min key takes far more than 2."""
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url, limits={"tokens_per_min": 250})
            statuses = []
            used = 0
            for _ in range(6):
                body = chat(max_tokens=100)
                async with http.post(gw.url + CHAT, json=body, headers=bearer(created["key"])) as r:
                    statuses.append(r.status)
                    if r.status == 200:
                        used += (await r.json())["usage"]["total_tokens"]
            big = chat(max_tokens=1000)
            async with http.post(gw.url + CHAT, json=big, headers=bearer(created["key"])) as r:
                refused = (r.status, (await r.json())["error"]["code"])
    assert [200] * 6 == statuses
    assert used < 250 < 6 * 100  # settled at the real usage, not the 100+ estimate
    assert (429, "TOKEN_LIMITED") == refused


async def test_a_daily_token_budget_is_429_budget_exceeded_once_used(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, limits={"daily_tokens": 60}))["key"]
            codes = []
            for _ in range(4):
                body = chat(max_tokens=10)
                async with http.post(gw.url + CHAT, json=body, headers=bearer(secret)) as r:
                    codes.append(r.status if r.status == 200 else (await r.json())["error"]["code"])
    # estimated at ~32 tokens (prompt bytes / 4 + max_tokens), settled at the 10 used
    assert [200, 200, 200, "BUDGET_EXCEEDED"] == codes


async def test_an_upstream_failure_gives_the_reservation_back(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, limits={"requests_per_min": 1}))["key"]
            server.update(fail_status=500)
            async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as r:
                failed = r.status
            server.update(fail_status=None)
            async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as r:
                after = r.status
    assert 500 == failed
    assert 200 == after


async def test_a_request_refused_for_its_class_header_takes_nothing_from_the_key_s_limits(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    """The class is read before the reservation: a 400 for it holds no quota afterwards."""
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            for _ in range(2):  # fixed UTC minutes: again if the five straddled a boundary
                minute = gw.gateway.clock.now().minute
                secret = (await create_key(http, gw.url, limits={"requests_per_min": 2}))["key"]
                wrong = {**bearer(secret), "X-Request-Class": "urgent"}
                refused = []
                for _ in range(3):
                    async with http.post(gw.url + CHAT, json=chat(), headers=wrong) as r:
                        refused.append((r.status, (await r.json())["error"]["code"]))
                served = []
                for _ in range(2):
                    async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as r:
                        served.append(r.status)
                if gw.gateway.clock.now().minute == minute:
                    break
    assert [(400, "BAD_REQUEST")] * 3 == refused
    assert [200, 200] == served
