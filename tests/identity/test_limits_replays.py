"""A kept answer is replayed before admission (DESIGN §3), so a client key over its limits still
gets the answer its Idempotency-Key stored; a request with no kept answer is refused as before.
On the fast path and on the ASGI path (``GPUGATE_FASTPATH=0``) alike."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import aiohttp
import pytest
from keyed import ENVIRON, bearer, chat, create_key, keyed_config
from multidict import CIMultiDict

from harness import eventually, model_servers, serving

CHAT = "/v1/chat/completions"


@pytest.fixture(params=["fast", "asgi"])
def plane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GPUGATE_FASTPATH", "1" if request.param == "fast" else "0")
    return str(request.param)


def _held_or_done(server: Any, task: asyncio.Task[Any]) -> bool:
    return bool(server.stats.held == 1 or task.done())


async def post(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], body: dict[str, object]
) -> tuple[int, CIMultiDict[str], bytes]:
    async with http.post(url + CHAT, json=body, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


async def test_a_key_over_its_request_limit_still_gets_the_answer_its_idempotency_key_kept(
    plane: str, sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(keyed_config(sqlite_dsn, [server.url], ["m"]), environ=ENVIRON) as gw:
            # a minute's limit of one: the first request uses it, whatever the clock says
            secret = (await create_key(http, gw.url, limits={"requests_per_min": 1}))["key"]
            kept = {**bearer(secret), "Idempotency-Key": "turn-7"}
            first = await post(http, gw.url, kept, chat())
            again = await post(http, gw.url, kept, chat())
            fresh = await post(
                http, gw.url, {**bearer(secret), "Idempotency-Key": "turn-8"}, chat()
            )
            plain = await post(http, gw.url, bearer(secret), chat())
            other_body = await post(http, gw.url, kept, chat(text="another question"))
    assert 200 == first[0]
    assert (200, "true") == (again[0], again[1].get("Idempotent-Replayed"))
    assert first[2] == again[2]  # byte for byte
    assert 1 == server.stats.requests[CHAT]  # the replay reached no upstream
    for status, headers, body in (fresh, plain):
        assert 429 == status
        assert b'"RATE_LIMITED"' in body
        assert "Retry-After" in headers
    # over the limit, the same key with another body is still refused by the limit: no kept
    # answer matches it (the 422 is for a request the key lets in)
    assert 429 == other_body[0]


async def test_a_key_at_its_concurrency_ceiling_gets_its_kept_answer(
    plane: str, sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(keyed_config(sqlite_dsn, [server.url], ["m"]), environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, limits={"concurrency": 1}))["key"]
            kept = {**bearer(secret), "Idempotency-Key": "k-1"}
            first = await post(http, gw.url, kept, chat())
            server.update(hang=True)
            for _ in range(50):  # the first's slot goes back just after its answer
                held = asyncio.create_task(
                    post(http, gw.url, bearer(secret), chat(text="a long one"))
                )
                await eventually(partial(_held_or_done, server, held), what="a slot")
                if not held.done():
                    break
                assert 429 == held.result()[0]
            assert 1 == server.stats.held  # the key's one slot, held
            again = await post(http, gw.url, kept, chat())
            other = await post(http, gw.url, {**bearer(secret), "Idempotency-Key": "k-2"}, chat())
            server.update(hang=False)
            assert 200 == (await asyncio.wait_for(held, timeout=10))[0]
    assert 200 == first[0]
    assert (200, "true") == (again[0], again[1].get("Idempotent-Replayed"))
    assert first[2] == again[2]
    assert 429 == other[0]
    assert b'"CONCURRENCY_LIMITED"' in other[2]
