"""The jobs API over HTTP, with the real dispatcher loop: create, follow, list, cancel, retry."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from gpugate.fleet import ServerBehaviour
from harness import eventually, make_config, model_servers, serving, upstream

CHAT = {"messages": [{"role": "user", "content": "hello jobs"}]}


async def post_job(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Idempotency-Key": key} if key else {}
    async with http.post(url + "/v1/jobs", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as resp:
        assert 200 == resp.status, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def test_a_job_is_created_dispatched_at_once_and_completed_with_the_upstreams_answer(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(dsn, [upstream("q0", [server.url], ["qwen"])])
        async with serving(config) as gw:
            status, job = await post_job(http, gw.url, {"model": "qwen", "input": CHAT})
            slug = job["slug"]

            async def state() -> str:
                return str((await get(http, f"{gw.url}/v1/jobs/{slug}"))["state"])

            async with asyncio.timeout(10):
                while await state() != "completed":
                    await asyncio.sleep(0.02)
            done = await get(http, f"{gw.url}/v1/jobs/{slug}")
            events = await get(http, f"{gw.url}/v1/jobs/{slug}/events")
            listed = await get(http, f"{gw.url}/v1/jobs?state=completed")
    assert (202, "queued", "local", "batch") == (status, job["state"], job["runner"], job["class"])
    assert "q0 answers: hello jobs" == done["result"]["choices"][0]["message"]["content"]
    assert done["leased_by"] is None
    assert 1 == done["submit_count"]
    statuses = [e["status"] for e in events["data"]]
    assert ["queued", "dispatching", "submitted"] == statuses[:3]
    assert "completed" == statuses[-1]
    assert [slug] == [j["slug"] for j in listed["data"]]
    assert {slug: 1} == server.stats.executions


async def test_twenty_concurrent_posts_with_one_idempotency_key_make_exactly_one_job(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(dsn, [upstream("q0", [server.url], ["qwen"])])
        async with serving(config) as gw:
            body = {"model": "qwen", "input": CHAT}
            results = await asyncio.gather(
                *(post_job(http, gw.url, body, key="same-key") for _ in range(20))
            )
            await eventually(lambda: sum(server.stats.executions.values()) >= 1, what="run")
            page = await get(http, f"{gw.url}/v1/jobs")
    slugs = {job["slug"] for _, job in results}
    assert 1 == len(slugs)
    assert 1 == sum(1 for status, _ in results if status == 202)
    assert 1 == len(page["data"])
    assert [1] == list(server.stats.executions.values())


async def test_bad_job_requests_are_refused_with_a_code_and_make_no_job(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    config = make_config(
        dsn, [upstream("q0", ["http://127.0.0.1:9"], ["qwen"])], server={"max_body_bytes": 2000}
    )
    async with serving(config) as gw:
        cases = [
            ({"model": "qwen", "input": {"prompt": "x" * 3000}}, 413, "PAYLOAD_TOO_LARGE"),
            ({"model": "qwen"}, 400, "BAD_REQUEST"),
            ({"model": "qwen", "input": CHAT, "class": "urgent"}, 400, "BAD_REQUEST"),
            ({"model": "qwen", "input": CHAT, "runner": "nope"}, 400, "BAD_REQUEST"),
            ({"model": "qwen", "input": CHAT, "colour": "red"}, 400, "BAD_REQUEST"),
            ({"model": "nope", "input": CHAT}, 404, "UNKNOWN_MODEL"),
        ]
        outcomes = []
        for body, _, _ in cases:
            status, error = await post_job(http, gw.url, body)
            outcomes.append((status, error["error"]["code"]))
        async with http.get(gw.url + "/v1/jobs/job_missing") as missing:
            missing_code = (missing.status, (await missing.json())["error"]["code"])
        listing = []
        for query in ("state=bogus", "limit=0", "cursor=not-a-cursor"):
            async with http.get(f"{gw.url}/v1/jobs?{query}") as resp:
                listing.append((resp.status, (await resp.json())["error"]["code"]))
        page = await get(http, f"{gw.url}/v1/jobs")
    assert [(status, code) for _, status, code in cases] == outcomes
    assert (404, "JOB_NOT_FOUND") == missing_code
    assert [(400, "BAD_REQUEST")] * 3 == listing
    assert [] == page["data"]


async def test_a_running_job_can_be_cancelled_and_a_failed_one_retried(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("q0", ["qwen"]), behaviour=ServerBehaviour(hang=True)) as (server,):
        config = make_config(dsn, [upstream("q0", [server.url], ["qwen"])])
        async with serving(config) as gw:
            await post_job(http, gw.url, {"model": "qwen", "input": CHAT, "slug": "c1"})
            await eventually(lambda: server.stats.open_requests == 1, what="running")
            async with http.post(gw.url + "/v1/jobs/c1/cancel") as resp:
                cancelled = await resp.json()
            await eventually(lambda: server.stats.open_requests == 0, what="upstream released")
            server.update(hang=False, fail_status=400)
            await post_job(http, gw.url, {"model": "qwen", "input": CHAT, "slug": "f1"})

            async def failed() -> bool:
                return (await get(http, gw.url + "/v1/jobs/f1"))["state"] == "failed"

            async with asyncio.timeout(10):
                while not await failed():
                    await asyncio.sleep(0.02)
            server.update(fail_status=None)
            async with http.post(gw.url + "/v1/jobs/f1/retry") as resp:
                retried = await resp.json()
            async with asyncio.timeout(10):
                while (await get(http, gw.url + "/v1/jobs/f1"))["state"] != "completed":
                    await asyncio.sleep(0.02)
    assert "cancelled" == cancelled["state"]
    assert "queued" == retried["state"]
