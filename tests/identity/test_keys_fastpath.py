"""Keyed requests on the fast path (issue #16, Done-when 5): with ``auth.mode: keys`` the OpenAI
routes are served by :meth:`ClientKeys.serve` over the fast path's exchange, not by the ASGI
middleware — with the same checks, the same hidden usage chunk and the same accounting, and a
client that leaves mid-stream still settles its key's concurrency. ``/u/`` stays on ASGI.

Real parts on loopback: ``gpugate serve``'s protocol, the fake model server, aiohttp as the
client, SQLite as the store.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import aiohttp
import pytest
from keyed import ENVIRON, bearer, chat, create_key, keyed_config, recording_upstream

from gpugate.core.usage import StreamUsage
from gpugate.fleet import ServerBehaviour
from gpugate.web.auth import ClientKeys, Keyed
from harness import eventually, model_servers, serving

CHAT = "/v1/chat/completions"


@pytest.fixture
def asgi_keyed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the client-key ASGI middleware saw (the slow path)."""
    seen: list[str] = []
    call = ClientKeys.__call__

    async def counted(self: ClientKeys, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append(scope["path"])
        await call(self, scope, receive, send)

    monkeypatch.setattr(ClientKeys, "__call__", counted)
    return seen


@pytest.fixture
def fast_served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths :meth:`ClientKeys.serve` (the fast path's entry) let in or refused."""
    served: list[str] = []
    serve = ClientKeys.serve

    async def counted(self: ClientKeys, ex: Any, plane: Any) -> None:
        served.append(ex.path)
        await serve(self, ex, plane)

    monkeypatch.setattr(ClientKeys, "serve", counted)
    return served


async def test_keyed_openai_requests_are_checked_on_the_fast_path_without_the_asgi_middleware(
    sqlite_dsn: str, http: aiohttp.ClientSession, asgi_keyed: list[str], fast_served: list[str]
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m", "n"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, models=["m"]))["key"]
            answers = []
            for body, headers in [
                (chat(), {}),
                (chat(), bearer("gpg_not-a-key")),
                (chat("n"), bearer(secret)),
                (chat(), bearer(secret)),
            ]:
                async with http.post(gw.url + CHAT, json=body, headers=headers) as r:
                    doc = await r.json()
                    answers.append((r.status, doc["error"]["code"] if r.status >= 400 else None))
            async with http.post(
                gw.url + "/v1/embeddings", json={"model": "m", "input": "x"}, headers=bearer(secret)
            ) as r:
                answers.append((r.status, None))
            async with http.post(gw.url + "/u/u/v1/embeddings", json={}, headers=bearer(secret)):
                pass
    assert [
        (401, "UNAUTHORIZED"),
        (401, "UNAUTHORIZED"),
        (403, "MODEL_NOT_ALLOWED"),
        (200, None),
        (200, None),
    ] == answers
    assert [CHAT] * 4 + ["/v1/embeddings"] == fast_served
    assert ["/u/u/v1/embeddings"] == [p for p in asgi_keyed if not p.startswith("/admin")]


async def test_a_cached_key_s_requests_reach_the_upstream_without_the_key_and_at_its_class(
    sqlite_dsn: str, http: aiohttp.ClientSession, fast_served: list[str]
) -> None:
    """After a key's first request its ``Authorization`` value is the key cache's, and a head
    with nothing else to rewrite has only the key taken out, in place (the fast path's common
    request): the upstream still never sees the key, a key below the default class still
    sends its own, and a head that needs more (an ``Idempotency-Key``, a class asked for, a
    second credential header) is rewritten whole as before."""
    async with recording_upstream() as (url, seen):
        config = keyed_config(sqlite_dsn, [url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url, max_class="batch")
            secret = created["key"]
            heads = [
                bearer(secret),  # the first: the store's answer, then remembered
                bearer(secret),  # the cache's: rewritten in place
                bearer(secret),
                {**bearer(secret), "X-Request-Class": "system"},  # clamped down
                {**bearer(secret), "Idempotency-Key": "k-1"},
                {**bearer(secret), "x-api-key": secret},
            ]
            statuses = []
            for headers in heads:
                async with http.post(gw.url + CHAT, json=chat(), headers=headers) as r:
                    statuses.append(r.status)
    assert [200] * len(heads) == statuses
    assert [CHAT] * len(heads) == fast_served
    sent = [{name.lower(): value for name, value in h.items()} for h in seen]
    assert len(heads) == len(sent)
    assert [] == [h for h in sent if secret in str(h) or "authorization" in h or "x-api-key" in h]
    assert ["batch"] * len(heads) == [h.get("x-request-class") for h in sent]
    assert f"{created['tenant']}:k-1" == sent[4]["idempotency-key"]


async def test_a_keyed_stream_cut_off_by_its_client_settles_and_frees_the_key_s_concurrency(
    sqlite_dsn: str, http: aiohttp.ClientSession, fast_served: list[str]
) -> None:
    behaviour = ServerBehaviour(chunk_delay_s=0.2, chunks=50)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url, limits={"concurrency": 1})
            pool = gw.gateway.registry.upstream("u").pool
            headers = bearer(created["key"])
            async with http.post(gw.url + CHAT, json=chat(stream=True), headers=headers) as r:
                assert 200 == r.status
                await r.content.readuntil(b"\n\n")  # the first event; then the client leaves
            await eventually(lambda: pool.inflight == 0, within_s=2.0, what="the slot freed")
            await eventually(lambda: server.stats.open_streams == 0, within_s=2.0, what="closed")
            server.update(chunk_delay_s=0.0, chunks=3)
            statuses = await _until_admitted(http, gw.url, created["key"], within_s=3.0)
    assert 200 == statuses[-1], statuses  # the key's one slot came back
    assert {429, 200} >= set(statuses)
    assert CHAT == fast_served[0]


async def _until_admitted(
    http: aiohttp.ClientSession, url: str, secret: str, *, within_s: float
) -> list[int]:
    """Chat requests until one is let in (bounded in time): the statuses seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    statuses: list[int] = []
    while loop.time() < deadline:
        async with http.post(url + CHAT, json=chat(), headers=bearer(secret)) as r:
            statuses.append(r.status)
        if statuses[-1] != 429:
            break
        await asyncio.sleep(0.02)
    return statuses


async def test_a_keyed_request_leaves_nothing_of_its_own_for_the_cyclic_collector(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Its exchange, its hidden stream and their answer are freed when it ends: a cycle of
    them (a bound method kept on the exchange did that once) would hold each stream's objects
    until the collector runs, and make it run more."""
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            free = (await create_key(http, gw.url))["key"]
            limited = (await create_key(http, gw.url, limits={"requests_per_min": 10**6}))["key"]
            asked = {"stream_options": {"include_usage": True}}
            bodies = [chat(), chat(stream=True), chat(stream=True, **asked)]
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for secret in (free, limited):
                    for body in bodies:
                        async with http.post(gw.url + CHAT, json=body, headers=bearer(secret)) as r:
                            assert 200 == r.status
                            await r.read()
                gc.collect()
                ours = [o for o in gc.garbage if isinstance(o, Keyed | StreamUsage)]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
    assert [] == ours
