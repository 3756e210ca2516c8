"""A key's limits hold on the jobs API too (issue #16): creating a job is one request of its key,
charged its estimate (prompt bytes / 4 + max_tokens) when it is made, so a key over its
per-minute or daily limit cannot go on spending through ``POST /v1/jobs``; a repeat of an
``Idempotency-Key`` is a replay and costs nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from keyed import ADMIN, ENVIRON, bearer, create_key, keyed_config

from harness import model_servers, serving

JOBS = "/v1/jobs"
T = TypeVar("T")


async def in_one_minute(gw: Any, act: Callable[[], Awaitable[T]]) -> T:
    """``act()``'s answer from a run that began and ended in one UTC minute (the limits' fixed
    windows): run again, once, if the first straddled a boundary."""
    for _ in range(2):
        minute = gw.gateway.clock.now().minute
        answer = await act()
        if gw.gateway.clock.now().minute == minute:
            break
    return answer


def job(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": {"messages": [{"role": "user", "content": text}], **extra}}


async def _create(
    http: aiohttp.ClientSession, url: str, secret: str, key: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    headers = {**bearer(secret), "Idempotency-Key": key}
    async with http.post(url, json=body or job(), headers=headers) as resp:
        doc = await resp.json()
        return resp.status, doc.get("slug") or doc["error"]["code"]


async def _replay(http: aiohttp.ClientSession, base: str, path: str) -> list[tuple[int, Any]]:
    """A new key of 1 request a minute: a job made, the same Idempotency-Key again, another."""
    secret = (await create_key(http, base, limits={"requests_per_min": 1}))["key"]
    return [await _create(http, base + path, secret, key) for key in ("k1", "k1", "k2")]


async def test_job_creates_over_the_minute_s_request_limit_are_429_and_make_no_job(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:

            async def three() -> tuple[str, list[tuple[int, Any]]]:
                secret = (await create_key(http, gw.url, limits={"requests_per_min": 2}))["key"]
                return secret, [
                    await _create(http, gw.url + JOBS, secret, f"k{i}") for i in range(3)
                ]

            secret, answers = await in_one_minute(gw, three)
            async with http.get(gw.url + JOBS, headers=bearer(secret)) as resp:
                listed = {j["slug"] for j in (await resp.json())["data"]}
    assert [202, 202, 429] == [status for status, _ in answers]
    assert "RATE_LIMITED" == answers[2][1]
    assert {answers[0][1], answers[1][1]} == listed  # the refused create stored nothing


async def test_a_job_is_charged_its_estimate_against_the_daily_budget_it_shares_with_requests(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, limits={"daily_tokens": 100}))["key"]
            # ~15 prompt tokens (bytes / 4) + max_tokens 40: ~55 of the 100, whatever it uses
            first = await _create(http, gw.url + JOBS, secret, "a", job(max_tokens=40))
            second = await _create(http, gw.url + JOBS, secret, "b", job(max_tokens=40))
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}
            async with http.post(
                gw.url + "/v1/chat/completions", json=chat, headers=bearer(secret)
            ) as resp:
                request_after = (resp.status, (await resp.json()).get("error", {}).get("code"))
    assert 202 == first[0]
    assert (429, "BUDGET_EXCEEDED") == second
    assert (429, "BUDGET_EXCEEDED") == request_after  # the job's estimate is the key's spend


async def test_a_repeat_of_a_job_s_idempotency_key_over_the_limit_gets_its_job_back(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            made, again, other = await in_one_minute(gw, lambda: _replay(http, gw.url, JOBS))
    assert 202 == made[0]
    assert (200, made[1]) == again  # a replay, not a new request: not refused, nothing taken
    assert (429, "RATE_LIMITED") == other


async def test_the_synchronous_front_charges_the_job_it_makes_and_not_a_replay(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            made, again, other = await in_one_minute(
                gw, lambda: _replay(http, gw.url, JOBS + "?wait=10")
            )
            async with http.get(gw.url + JOBS, headers=ADMIN) as resp:
                stored = [j["slug"] for j in (await resp.json())["data"]]
    assert (200, 200) == (made[0], again[0])
    assert made[1] == again[1]
    assert (429, "RATE_LIMITED") == other
    assert made[1] in stored
