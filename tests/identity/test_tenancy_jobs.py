"""Tenancy of the jobs API (issue #16, Done-when 3): a tenant's jobs are 404 to another tenant on
every route, its Idempotency-Keys are its own, and the same key with another body is 422."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from keyed import ADMIN, ENVIRON, bearer, create_key, keyed_config

from harness import make_config, model_servers, serving, upstream

JOB = {"model": "m", "input": {"messages": [{"role": "user", "content": "hi"}]}}


async def _create(
    http: aiohttp.ClientSession, url: str, secret: str, key: str, body: dict[str, Any] = JOB
) -> tuple[int, dict[str, Any]]:
    headers = {**bearer(secret), "Idempotency-Key": key}
    async with http.post(url + "/v1/jobs", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ""), ("GET", "/events"), ("GET", "/result"), ("POST", "/cancel"), ("POST", "/retry")],
)
async def test_another_tenant_gets_404_for_a_job_on_every_route(
    dsn: str, http: aiohttp.ClientSession, method: str, suffix: str
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            a = (await create_key(http, gw.url, tenant="team-a"))["key"]
            b = (await create_key(http, gw.url, tenant="team-b"))["key"]
            _, job = await _create(http, gw.url, a, "k1")
            url = gw.url + f"/v1/jobs/{job['slug']}{suffix}"
            async with http.request(method, url, headers=bearer(b)) as resp:
                other = (resp.status, (await resp.json())["error"]["code"])
            async with http.get(gw.url + f"/v1/jobs/{job['slug']}", headers=bearer(a)) as resp:
                own = resp.status
            async with http.get(gw.url + f"/v1/jobs/{job['slug']}", headers=ADMIN) as resp:
                operator = resp.status
            stored = await gw.gateway.store.get_job(job["slug"])
    assert (404, "JOB_NOT_FOUND") == other
    assert 200 == own
    assert 200 == operator  # the admin token sees every tenant's jobs
    assert stored is not None
    assert "cancelled" != stored.state


async def test_a_tenant_lists_only_its_own_jobs_and_an_operator_lists_all(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            a = (await create_key(http, gw.url, tenant="team-a"))["key"]
            b = (await create_key(http, gw.url, tenant="team-b"))["key"]
            _, mine = await _create(http, gw.url, a, "k1")
            _, theirs = await _create(http, gw.url, b, "k1")
            listed = {}
            for who, headers in (("a", bearer(a)), ("b", bearer(b)), ("admin", ADMIN)):
                async with http.get(gw.url + "/v1/jobs", headers=headers) as resp:
                    listed[who] = {job["slug"] for job in (await resp.json())["data"]}
    assert mine["slug"] != theirs["slug"]  # one Idempotency-Key, two tenants: two jobs
    assert {"a": {mine["slug"]}, "b": {theirs["slug"]}} == {k: listed[k] for k in ("a", "b")}
    assert {mine["slug"], theirs["slug"]} == listed["admin"]


async def test_the_same_job_key_with_another_body_is_422_and_with_the_same_body_the_same_job(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            a = (await create_key(http, gw.url, tenant="team-a"))["key"]
            first = await _create(http, gw.url, a, "k1")
            again = await _create(http, gw.url, a, "k1")
            other = {**JOB, "input": {"messages": [{"role": "user", "content": "else"}]}}
            reused = await _create(http, gw.url, a, "k1", other)
    assert 202 == first[0]
    assert (200, first[1]["slug"]) == (again[0], again[1]["slug"])
    assert (422, "IDEMPOTENCY_KEY_REUSED") == (reused[0], reused[1]["error"]["code"])


async def test_a_job_key_limited_to_interactive_is_clamped_and_a_forbidden_runner_is_403(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, runners=["nowhere"]))["key"]
            free = (await create_key(http, gw.url, max_class="interactive"))["key"]
            status, refused = await _create(http, gw.url, secret, "k1")
            _, clamped = await _create(http, gw.url, free, "k2", {**JOB, "class": "system"})
    assert (403, "RUNNER_NOT_ALLOWED") == (status, refused["error"]["code"])
    assert "interactive" == clamped["class"]
    assert clamped["allow_external"] is False


async def test_a_sync_idempotency_key_of_one_tenant_never_replays_another_tenant_s_answer(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            a = (await create_key(http, gw.url, tenant="team-a"))["key"]
            b = (await create_key(http, gw.url, tenant="team-b"))["key"]
            answers = []
            for secret, text in ((a, "from a"), (b, "from b"), (a, "from a")):
                body = {"model": "m", "messages": [{"role": "user", "content": text}]}
                headers = {**bearer(secret), "Idempotency-Key": "same"}
                async with http.post(
                    gw.url + "/v1/chat/completions", json=body, headers=headers
                ) as resp:
                    answers.append(
                        (
                            resp.headers.get("Idempotent-Replayed"),
                            (await resp.json())["choices"][0]["message"]["content"],
                        )
                    )
    assert [
        (None, "u answers: from a"),
        (None, "u answers: from b"),
        ("true", "u answers: from a"),
    ] == answers


async def test_the_sync_result_cache_is_per_tenant_a_tenant_never_gets_another_s_cached_job(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    """The same input from two tenants is two jobs: tenant B's first call is a miss (its own
    job, its own slug), never tenant A's cached result; each tenant's repeat is its own hit."""
    async with model_servers(("u", ["m"])) as (server,):
        cached = upstream("u", [server.url], ["m"], cache={"ttl_s": 60})
        config = make_config(dsn, [cached], auth={"mode": "keys"})
        async with serving(config, environ=ENVIRON) as gw:
            a = (await create_key(http, gw.url, tenant="team-a"))["key"]
            b = (await create_key(http, gw.url, tenant="team-b"))["key"]
            seen = []
            for secret in (a, b, a, b):
                async with http.post(
                    gw.url + "/v1/jobs?wait=10", json=JOB, headers=bearer(secret)
                ) as resp:
                    body = await resp.json()
                    seen.append((resp.status, resp.headers.get("x-gateway-cache"), body["slug"]))
    (a1, b1, a2, b2) = seen
    assert [s[:2] for s in seen] == [(200, "miss"), (200, "miss"), (200, "hit"), (200, "hit")]
    assert a1[2] != b1[2]  # B ran a job of its own
    assert (a2[2], b2[2]) == (a1[2], b1[2])  # each hit is the tenant's own job
