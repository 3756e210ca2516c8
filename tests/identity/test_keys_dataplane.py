"""``auth.mode: keys`` on the data plane (issue #16, Done-when 1): no key, a wrong, a revoked (on
another replica) or an expired key is 401; a model the key may not use is 403; a class above the
key's is clamped down, never refused."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import aiohttp
import openai
import pytest
from keyed import ADMIN, ENVIRON, bearer, chat, create_key, keyed_config, recording_upstream

from gpugate.core.classes import RequestClass
from harness import eventually, make_config, model_servers, serving, upstream

CHAT = "/v1/chat/completions"


async def test_the_openai_client_is_served_with_a_key_and_refused_without(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url)
            keyed = openai.AsyncOpenAI(base_url=gw.v1, api_key=created["key"], max_retries=0)
            anonymous = openai.AsyncOpenAI(base_url=gw.v1, api_key="not-a-key", max_retries=0)
            answer = await keyed.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            with pytest.raises(openai.AuthenticationError) as refused:
                await anonymous.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            await keyed.close()
            await anonymous.close()
    assert "u answers: hi" == answer.choices[0].message.content
    assert "UNAUTHORIZED" == refused.value.code


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer gk-not-a-key-at-all-but-long-enough"},
        {"api-key": "wrong"},
        {"Authorization": "Basic Zm9vOmJhcg=="},
    ],
    ids=["none", "wrong-bearer", "wrong-api-key", "not-bearer"],
)
async def test_a_request_without_a_valid_key_is_401_before_the_upstream_sees_it(
    sqlite_dsn: str, http: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            for path in (CHAT, "/v1/embeddings", "/u/u/v1/models"):
                async with http.post(gw.url + path, json=chat(), headers=headers) as resp:
                    body = await resp.json()
                assert (401, "UNAUTHORIZED") == (resp.status, body["error"]["code"]), path
            async with http.get(gw.url + "/v1/models", headers=headers) as resp:
                assert 401 == resp.status
            async with http.get(gw.url + "/v1/jobs", headers=headers) as resp:
                assert 401 == resp.status
    assert 0 == sum(n for route, n in server.stats.requests.items() if route.startswith("/v1/"))


async def test_each_of_the_three_headers_carries_a_key_and_none_reaches_the_upstream(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with recording_upstream() as (url, seen):
        config = keyed_config(sqlite_dsn, [url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url))["key"]
            statuses = []
            for headers in (bearer(secret), {"api-key": secret}, {"x-api-key": secret}):
                async with http.post(gw.url + CHAT, json=chat(), headers=headers) as resp:
                    statuses.append(resp.status)
    assert [200, 200, 200] == statuses
    assert 3 == len(seen)
    assert all(secret not in str(headers) for headers in seen)


async def test_an_expired_key_is_401(sqlite_dsn: str, http: aiohttp.ClientSession) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
            secret = (await create_key(http, gw.url, expires_at=past))["key"]
            async with http.post(gw.url + CHAT, json=chat(), headers=bearer(secret)) as resp:
                body = await resp.json()
    assert (401, "UNAUTHORIZED") == (resp.status, body["error"]["code"])
    assert "expired" in body["error"]["message"]
    assert secret not in body["error"]["message"]


async def test_a_key_revoked_on_one_replica_is_refused_by_the_other_within_the_cache_delay(
    jobs_schema: str, http: aiohttp.ClientSession
) -> None:
    """Two gateways on one PostgreSQL: replica B trusts its cached lookup for at most
    ``auth.key_cache_s`` (1 s here) after A revokes the key."""
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(jobs_schema, [server.url], ["m"], auth={"key_cache_s": 1})
        async with serving(config, environ=ENVIRON) as a, serving(config, environ=ENVIRON) as b:
            created = await create_key(http, a.url)
            headers = bearer(created["key"])
            async with http.post(b.url + CHAT, json=chat(), headers=headers) as resp:
                assert 200 == resp.status  # B has looked the key up and caches it
            async with http.delete(a.url + f"/admin/keys/{created['id']}", headers=ADMIN) as r:
                assert 200 == r.status
            async with http.post(a.url + CHAT, json=chat(), headers=headers) as resp:
                assert 401 == resp.status  # the replica that revoked: at once
            revoked_at = asyncio.get_running_loop().time()
            refused_at: list[float] = []

            async def refused() -> None:
                while not refused_at:
                    async with http.post(b.url + CHAT, json=chat(), headers=headers) as resp:
                        if resp.status == 401:
                            refused_at.append(asyncio.get_running_loop().time())
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(refused(), timeout=10)
    assert refused_at[0] - revoked_at <= 1.0 + 1.0  # the cache's second, and a lookup's margin


async def test_a_model_the_key_may_not_use_is_403_model_not_allowed(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m", "other"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m", "other"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, models=["m"]))["key"]
            async with http.post(gw.url + CHAT, json=chat("other"), headers=bearer(secret)) as resp:
                body = await resp.json()
            async with http.post(gw.url + CHAT, json=chat("m"), headers=bearer(secret)) as ok:
                assert 200 == ok.status
            async with http.post(gw.url + "/u/u/v1/models", headers=bearer(secret)) as raw:
                raw_body = await raw.json()
    assert (403, "MODEL_NOT_ALLOWED") == (resp.status, body["error"]["code"])
    assert (403, "MODEL_NOT_ALLOWED") == (raw.status, raw_body["error"]["code"])


async def test_a_key_without_allow_external_may_not_use_an_external_upstream(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        document = config.gateway_document()
        document["upstreams"][0]["external"] = True
        config = config.with_gateway_document(document)
        async with serving(config, environ=ENVIRON) as gw:
            inside = (await create_key(http, gw.url))["key"]
            outside = (await create_key(http, gw.url, allow_external=True))["key"]
            async with http.post(gw.url + CHAT, json=chat(), headers=bearer(inside)) as resp:
                body = await resp.json()
            async with http.post(gw.url + CHAT, json=chat(), headers=bearer(outside)) as ok:
                assert 200 == ok.status
    assert (403, "EXTERNAL_UPSTREAM_FORBIDDEN") == (resp.status, body["error"]["code"])


async def test_a_key_limited_to_interactive_sending_system_queues_behind_a_real_system_request(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """One admission slot, held: the clamped request waits as `interactive`, so a `system`
    request sent after it is served first."""
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        document = config.gateway_document()
        document["upstreams"][0]["max_inflight"] = 1
        config = config.with_gateway_document(document)
        async with serving(config, environ=ENVIRON) as gw:
            limited = (await create_key(http, gw.url, max_class="interactive"))["key"]
            system = (await create_key(http, gw.url, max_class="system"))["key"]
            pool = gw.gateway.registry.upstream("u").pool
            order: list[str] = []

            async def send(name: str, secret: str) -> None:
                headers = {**bearer(secret), "X-Request-Class": "system"}
                async with http.post(gw.url + CHAT, json=chat(text=name), headers=headers) as r:
                    assert 200 == r.status
                    order.append(name)

            server.update(hang=True)
            holder = asyncio.create_task(send("holder", system))
            await eventually(lambda: pool.inflight == 1, what="the slot held")
            clamped = asyncio.create_task(send("clamped", limited))
            await eventually(lambda: pool.queued_by_class().get(RequestClass.INTERACTIVE) == 1)
            real = asyncio.create_task(send("real", system))
            await eventually(lambda: pool.queued_by_class().get(RequestClass.SYSTEM) == 1)
            queued = {cls.value: n for cls, n in pool.queued_by_class().items() if n}
            server.update(hang=False)
            await asyncio.wait_for(asyncio.gather(holder, clamped, real), timeout=20)
    assert {"interactive": 1, "system": 1} == queued
    assert ["holder", "real", "clamped"] == order


async def test_the_model_list_shows_a_key_only_its_models_and_azure_di_needs_a_key(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m", "other"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m", "other"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, models=["m"]))["key"]
            async with http.get(gw.url + "/v1/models", headers=bearer(secret)) as resp:
                listed = [m["id"] for m in (await resp.json())["data"]]
            path = "/azure-di/documentintelligence/documentModels/prebuilt-read:analyze"
            async with http.post(gw.url + path, data=b"x") as resp:
                anonymous = resp.status
            async with http.post(gw.url + path, data=b"x", headers=bearer(secret)) as resp:
                limited = (resp.status, (await resp.json())["error"]["code"])
    assert ["m"] == listed
    assert 401 == anonymous
    assert (403, "EXTERNAL_UPSTREAM_FORBIDDEN") == limited


async def test_a_key_without_allow_external_is_not_shown_models_only_external_upstreams_serve(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("inside", ["m"]), ("outside", ["m", "cloud"])) as (inside, outside):
        ups = [
            upstream("inside", [inside.url], ["m"]),
            upstream("outside", [outside.url], ["m", "cloud"], external=True),
        ]
        config = make_config(sqlite_dsn, ups, auth={"mode": "keys"})
        async with serving(config, environ=ENVIRON) as gw:
            listed = {}
            for allowed in (False, True):
                secret = (await create_key(http, gw.url, allow_external=allowed))["key"]
                async with http.get(gw.url + "/v1/models", headers=bearer(secret)) as resp:
                    listed[allowed] = [m["id"] for m in (await resp.json())["data"]]
            async with http.post(
                gw.url + "/v1/chat/completions", json=chat("cloud"), headers=bearer(secret)
            ) as resp:
                used = resp.status
    assert {False: [], True: ["cloud", "m"]} == listed  # "m" too is 403 for such a key
    assert 200 == used  # the key that may go outside can use what it is shown
